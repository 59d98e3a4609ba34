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
the rules on NumPy arrays of one shape and float dtype run as one call of ``monadl/_native.c`` each
(``monadl.dsl.fused.native_forward`` and ``native_deltas``): its loops do the NumPy rule's
operations in its order, its ``exp`` and ``tanh`` NumPy's own loops, so the results are its bits.
A native forward saves its sigmoids and tanh as the blocks of one array, the NumPy rule as a tuple:
either vjp reads either.
"""

from __future__ import annotations

from typing import Any, Final

from monadl.do.primitive import ELEMENTWISE
from monadl.dsl.core.arguments import array_operand
from monadl.dsl.core.layers import AnyArray, ArrayLayer, apply_array
from monadl.dsl.fused import native_deltas, native_forward
from monadl.dsl.ops.activations import sigmoid_of, sigmoids_of
from monadl.dsl.ops.registry import declare
from monadl.dsl.ops.shape_rules import elementwise

__all__ = ["gru_h", "lstm_c", "lstm_h", "tree_lstm_c"]


def _c_forward(xp: Any, i: Any, f: Any, u: Any, c: Any) -> tuple[Any, Any]:
    done = native_forward("lstm_c", i, f, u, c)
    if done is not None:
        return done  # (its saved values: one array of the blocks si, sf, tu)
    (si, sf), tu = sigmoids_of(xp, i, f), xp.tanh(u)
    return si * tu + sf * c, (si, sf, tu)


def _c_deltas(xp: Any, d: Any, saved: Any, i: Any, f: Any, u: Any, c: Any) -> tuple[Any, ...]:
    done = native_deltas("lstm_c", d, saved, i, f, u, c)
    if done is not None:
        return done
    si, sf, tu = saved
    return d * tu * si * (1.0 - si), d * c * sf * (1.0 - sf), d * si * (1.0 - tu * tu), d * sf


def _tree_c_forward(
    xp: Any, i: Any, f_left: Any, f_right: Any, u: Any, c_left: Any, c_right: Any
) -> tuple[Any, Any]:
    done = native_forward("tree_lstm_c", i, f_left, f_right, u, c_left, c_right)
    if done is not None:
        return done
    (si, sfl, sfr), tu = sigmoids_of(xp, i, f_left, f_right), xp.tanh(u)
    return si * tu + sfl * c_left + sfr * c_right, (si, sfl, sfr, tu)


def _tree_c_deltas(
    xp: Any, d: Any, saved: Any, i: Any, f_l: Any, f_r: Any, u: Any, c_l: Any, c_r: Any
) -> tuple[Any, ...]:
    done = native_deltas("tree_lstm_c", d, saved, i, f_l, f_r, u, c_l, c_r)
    if done is not None:
        return done
    si, sfl, sfr, tu = saved
    return (
        d * tu * si * (1.0 - si),
        d * c_l * sfl * (1.0 - sfl),
        d * c_r * sfr * (1.0 - sfr),
        d * si * (1.0 - tu * tu),
        d * sfl,
        d * sfr,
    )


def _h_forward(xp: Any, o: Any, c: Any) -> tuple[Any, Any]:
    done = native_forward("lstm_h", o, c)
    if done is not None:
        return done
    so, tc = sigmoid_of(xp, o), xp.tanh(c)
    return so * tc, (so, tc)


def _h_deltas(xp: Any, d: Any, saved: Any, o: Any, c: Any) -> tuple[Any, ...]:
    done = native_deltas("lstm_h", d, saved, o, c)
    if done is not None:
        return done
    so, tc = saved
    return d * tc * so * (1.0 - so), d * so * (1.0 - tc * tc)


def _gru_forward(xp: Any, r: Any, z: Any, n_x: Any, n_h: Any, h: Any) -> tuple[Any, Any]:
    done = native_forward("gru_h", r, z, n_x, n_h, h)
    if done is not None:
        return done  # (its saved values: one array of the blocks sr, sz, n)
    sr, sz = sigmoids_of(xp, r, z)
    n = xp.tanh(n_x + sr * n_h)
    return (1.0 - sz) * n + sz * h, (sr, sz, n)


def _gru_deltas(xp: Any, d: Any, saved: Any, r: Any, z: Any, n_x: Any, n_h: Any, h: Any) -> tuple[Any, ...]:
    done = native_deltas("gru_h", d, saved, r, z, n_x, n_h, h)
    if done is not None:
        return done
    sr, sz, n = saved
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
