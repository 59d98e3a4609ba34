"""Recurrent cells' gate arithmetic as fused ops: :func:`lstm_c` and :func:`lstm_h` (an LSTM's),
:func:`tree_lstm_c` (a binary Tree-LSTM's, with :func:`lstm_h`), :func:`gru_h` (a GRU's).

From the gates' pre-activations ``i``, ``f``, ``o``, ``u`` (each ``W [x; h] + b``) and the memory
``c``, an LSTM step computes ``c' = sigmoid(i) * tanh(u) + sigmoid(f) * c`` and
``h' = sigmoid(o) * tanh(c')``. Written with the elementwise ops, that is seven kernels forward and
nine vjps backward; a small recurrent step is bound by kernels launched, not by arithmetic, so
these two ops do it in two kernels forward and two backward, as DyNet's ``vanilla_lstm_c`` and
``vanilla_lstm_h`` do: each saves its activations, and one joint vjp gives all its inputs' deltas.
They are elementwise in all their operands (broadcasting as NumPy does), so their calls merge under
dynamic batching as the elementwise ops' do. :class:`monadl.nn.LSTMCell` is built on them.

A binary Tree-LSTM node's memory, from its children's memories ``c_l`` and ``c_r`` and a forget
gate each, is ``c = sigmoid(i) * tanh(u) + sigmoid(f_l) * c_l + sigmoid(f_r) * c_r``: nine
elementwise ops forward and fourteen vjps backward, or one op, :func:`tree_lstm_c`, with one joint
vjp; its output is :func:`lstm_h`'s. :class:`monadl.nn.TreeLSTMCell` is built on them.

A GRU step, from the reset and update gates' pre-activations ``r`` and ``z``, the candidate's
input and hidden parts ``n_x`` (``W_nx x + b_nx``) and ``n_h`` (``W_nh h + b_nh``) and the state
``h``, is ``h' = (1 - sigmoid(z)) * tanh(n_x + sigmoid(r) * n_h) + sigmoid(z) * h``: seven
elementwise kernels forward, one with :func:`gru_h`, and one joint vjp.
:class:`monadl.nn.GRUCell` is built on it.

Each rule is still a dozen ufunc calls on the few rows of a step. Where the engine runs compiled,
the rules on NumPy arrays of one shape and float dtype run as loops of ``monadl/_native.c``
(``monadl.dsl.fused.native_out``): the joint vjps whole, the forwards but NumPy's ``exp`` and
``tanh``; every loop does the NumPy rule's operations in its order, so the results are its bits.
"""

from __future__ import annotations

from typing import Any, Final

import numpy as np

from monadl.do.primitive import ELEMENTWISE
from monadl.dsl.core.arguments import array_operand
from monadl.dsl.core.layers import AnyArray, ArrayLayer, apply_array
from monadl.dsl.fused import NATIVE, native_out
from monadl.dsl.ops.activations import sigmoid_of, sigmoids_of
from monadl.dsl.ops.registry import declare
from monadl.dsl.ops.shape_rules import elementwise

__all__ = ["gru_h", "lstm_c", "lstm_h", "tree_lstm_c"]


def _exps_of_negated(t: Any, *gates: Any) -> None:
    """``exp(-gate)`` of each gate into its block of ``t``: the sigmoids' start, which a native
    forward finishes (``t = 1 / (1 + t)``) as :func:`~monadl.dsl.ops.activations.sigmoid_of` does."""
    if NATIVE.negate(*gates, t):  # some -gate is large enough for exp to overflow
        with np.errstate(over="ignore"):  # (inf where it does: the sigmoid is 0 there)
            np.exp(t, out=t)
    else:  # (an errstate costs more than the kernels of a step's few rows)
        np.exp(t, out=t)


def _c_forward(xp: Any, i: Any, f: Any, u: Any, c: Any) -> tuple[Any, tuple[Any, Any, Any]]:
    t = native_out(2, i, f, u, c)
    if t is not None:
        _exps_of_negated(t, i, f)
        tu, out = np.tanh(u), np.empty_like(c)
        NATIVE.lstm_c_forward(t, tu, c, out)
        return out, (t[0], t[1], tu)
    (si, sf), tu = sigmoids_of(xp, i, f), xp.tanh(u)
    return si * tu + sf * c, (si, sf, tu)


def _c_deltas(
    xp: Any, d: Any, saved: tuple[Any, Any, Any], i: Any, f: Any, u: Any, c: Any
) -> tuple[Any, Any, Any, Any]:
    si, sf, tu = saved
    out = native_out(4, d, si, sf, tu, c)
    if out is not None:
        NATIVE.lstm_c_deltas(d, si, sf, tu, c, out)
        return out[0], out[1], out[2], out[3]
    return d * tu * si * (1.0 - si), d * c * sf * (1.0 - sf), d * si * (1.0 - tu * tu), d * sf


def _tree_c_forward(
    xp: Any, i: Any, f_left: Any, f_right: Any, u: Any, c_left: Any, c_right: Any
) -> tuple[Any, tuple[Any, Any, Any, Any]]:
    t = native_out(3, i, f_left, f_right, u, c_left, c_right)
    if t is not None:
        _exps_of_negated(t, i, f_left, f_right)
        tu, out = np.tanh(u), np.empty_like(c_left)
        NATIVE.tree_c_forward(t, tu, c_left, c_right, out)
        return out, (t[0], t[1], t[2], tu)
    (si, sfl, sfr), tu = sigmoids_of(xp, i, f_left, f_right), xp.tanh(u)
    return si * tu + sfl * c_left + sfr * c_right, (si, sfl, sfr, tu)


def _tree_c_deltas(
    xp: Any, d: Any, saved: tuple[Any, Any, Any, Any], i: Any, f_l: Any, f_r: Any, u: Any, c_l: Any, c_r: Any
) -> tuple[Any, Any, Any, Any, Any, Any]:
    si, sfl, sfr, tu = saved
    out = native_out(6, d, si, sfl, sfr, tu, c_l, c_r)
    if out is not None:
        NATIVE.tree_c_deltas(d, si, sfl, sfr, tu, c_l, c_r, out)
        return out[0], out[1], out[2], out[3], out[4], out[5]
    return (
        d * tu * si * (1.0 - si),
        d * c_l * sfl * (1.0 - sfl),
        d * c_r * sfr * (1.0 - sfr),
        d * si * (1.0 - tu * tu),
        d * sfl,
        d * sfr,
    )


def _h_forward(xp: Any, o: Any, c: Any) -> tuple[Any, tuple[Any, Any]]:
    t = native_out(1, o, c)
    if t is not None:
        _exps_of_negated(t, o)
        tc, out = np.tanh(c), np.empty_like(c)
        NATIVE.lstm_h_forward(t, tc, out)
        return out, (t[0], tc)
    so, tc = sigmoid_of(xp, o), xp.tanh(c)
    return so * tc, (so, tc)


def _h_deltas(xp: Any, d: Any, saved: tuple[Any, Any], o: Any, c: Any) -> tuple[Any, Any]:
    so, tc = saved
    out = native_out(2, d, so, tc)
    if out is not None:
        NATIVE.lstm_h_deltas(d, so, tc, out)
        return out[0], out[1]
    return d * tc * so * (1.0 - so), d * so * (1.0 - tc * tc)


def _gru_forward(xp: Any, r: Any, z: Any, n_x: Any, n_h: Any, h: Any) -> tuple[Any, tuple[Any, Any, Any]]:
    sr, sz = sigmoids_of(xp, r, z)
    n = xp.tanh(n_x + sr * n_h)
    return (1.0 - sz) * n + sz * h, (sr, sz, n)


def _gru_deltas(
    xp: Any, d: Any, saved: tuple[Any, Any, Any], r: Any, z: Any, n_x: Any, n_h: Any, h: Any
) -> tuple[Any, Any, Any, Any, Any]:
    sr, sz, n = saved
    out = native_out(5, d, sr, sz, n, n_h, h)
    if out is not None:
        NATIVE.gru_deltas(d, sr, sz, n, n_h, h, out)
        return out[0], out[1], out[2], out[3], out[4]
    candidate = d * (1.0 - sz) * (1.0 - n * n)  # the delta of n's pre-activation n_x + sigmoid(r) * n_h
    return candidate * n_h * sr * (1.0 - sr), d * (h - n) * sz * (1.0 - sz), candidate, candidate * sr, d * sz


GRU_H: Final = declare(
    "gru_h",
    _gru_forward,
    (),
    True,
    saves=True,
    batch=ELEMENTWISE,
    shape_rule=elementwise,
    joint_vjp=_gru_deltas,
)
LSTM_C: Final = declare(
    "lstm_c", _c_forward, (), True, saves=True, batch=ELEMENTWISE, shape_rule=elementwise, joint_vjp=_c_deltas
)
TREE_LSTM_C: Final = declare(
    "tree_lstm_c",
    _tree_c_forward,
    (),
    True,
    saves=True,
    batch=ELEMENTWISE,
    shape_rule=elementwise,
    joint_vjp=_tree_c_deltas,
)
LSTM_H: Final = declare(
    "lstm_h", _h_forward, (), True, saves=True, batch=ELEMENTWISE, shape_rule=elementwise, joint_vjp=_h_deltas
)


def lstm_c(i: AnyArray, f: AnyArray, u: AnyArray, c: AnyArray) -> ArrayLayer:
    """An LSTM step's next memory ``sigmoid(i) * tanh(u) + sigmoid(f) * c``, from the input, forget
    and candidate gates' pre-activations and the memory ``c``: one op (see the module)."""
    for name, x in (("i", i), ("f", f), ("u", u), ("c", c)):
        array_operand("lstm_c", x, name)
    return apply_array(LSTM_C, i, f, u, c)


def tree_lstm_c(
    i: AnyArray, f_left: AnyArray, f_right: AnyArray, u: AnyArray, c_left: AnyArray, c_right: AnyArray
) -> ArrayLayer:
    """A binary Tree-LSTM node's memory ``sigmoid(i) * tanh(u) + sigmoid(f_left) * c_left +
    sigmoid(f_right) * c_right``, from the input gate's, the two forget gates' and the candidate's
    pre-activations and the children's memories: one op (see the module). The node's output is
    ``lstm_h(o, c)``."""
    operands = {"i": i, "f_left": f_left, "f_right": f_right, "u": u, "c_left": c_left, "c_right": c_right}
    for name, x in operands.items():
        array_operand("tree_lstm_c", x, name)
    return apply_array(TREE_LSTM_C, i, f_left, f_right, u, c_left, c_right)


def lstm_h(o: AnyArray, c: AnyArray) -> ArrayLayer:
    """An LSTM step's output ``sigmoid(o) * tanh(c)``, from the output gate's pre-activation and the
    step's new memory ``c``: one op (see the module)."""
    array_operand("lstm_h", o, "o")
    array_operand("lstm_h", c, "c")
    return apply_array(LSTM_H, o, c)


def gru_h(r: AnyArray, z: AnyArray, n_x: AnyArray, n_h: AnyArray, h: AnyArray) -> ArrayLayer:
    """A GRU step's next state ``(1 - sigmoid(z)) * tanh(n_x + sigmoid(r) * n_h) + sigmoid(z) * h``,
    from the reset and update gates' pre-activations, the candidate's input and hidden parts (the
    reset gate scales the hidden part after its product, as PyTorch's) and the state: one op."""
    for name, x in (("r", r), ("z", z), ("n_x", n_x), ("n_h", n_h), ("h", h)):
        array_operand("gru_h", x, name)
    return apply_array(GRU_H, r, z, n_x, n_h, h)
