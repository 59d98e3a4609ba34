"""Recurrent cells' gate arithmetic as fused ops: :func:`lstm_c` and :func:`lstm_h` (an LSTM's),
:func:`tree_lstm_c` (a binary Tree-LSTM's, with :func:`lstm_h`), :func:`gru_h` (a GRU's).

From the gates' pre-activations ``i``, ``f``, ``o``, ``u`` (each ``W [x; h] + b``) and the memory
``c``, an LSTM step computes ``c' = sigmoid(i) * tanh(u) + sigmoid(f) * c`` and
``h' = sigmoid(o) * tanh(c')``. Written with the elementwise ops, that is seven kernels forward and
nine vjps backward; a small recurrent step is bound by kernels launched, not by arithmetic, so
these two ops do it in two kernels forward and six vjps, as DyNet's ``vanilla_lstm_c`` and
``vanilla_lstm_h`` do. Each saves its activations for its vjps. They are elementwise in all their
operands (broadcasting as NumPy does), so their calls merge under dynamic batching as the
elementwise ops' do. :class:`monadl.nn.LSTMCell` is built on them.

A binary Tree-LSTM node's memory, from its children's memories ``c_l`` and ``c_r`` and a forget
gate each, is ``c = sigmoid(i) * tanh(u) + sigmoid(f_l) * c_l + sigmoid(f_r) * c_r``: nine
elementwise ops forward and fourteen vjps backward, or one op, :func:`tree_lstm_c`, with six vjps;
its output is :func:`lstm_h`'s. :class:`monadl.nn.TreeLSTMCell` is built on them.

A GRU step, from the reset and update gates' pre-activations ``r`` and ``z``, the candidate's
input and hidden parts ``n_x`` (``W_nx x + b_nx``) and ``n_h`` (``W_nh h + b_nh``) and the state
``h``, is ``h' = (1 - sigmoid(z)) * tanh(n_x + sigmoid(r) * n_h) + sigmoid(z) * h``: seven
elementwise kernels forward, one with :func:`gru_h`, which has five vjps.
:class:`monadl.nn.GRUCell` is built on it.
"""

from __future__ import annotations

from typing import Any, Final

from monadl.do.primitive import ELEMENTWISE
from monadl.dsl.core.arguments import array_operand
from monadl.dsl.core.layers import AnyArray, ArrayLayer, apply_array
from monadl.dsl.ops.activations import sigmoid_of, sigmoids_of
from monadl.dsl.ops.registry import declare
from monadl.dsl.ops.shape_rules import elementwise

__all__ = ["gru_h", "lstm_c", "lstm_h", "tree_lstm_c"]


def _c_forward(xp: Any, i: Any, f: Any, u: Any, c: Any) -> tuple[Any, tuple[Any, Any, Any]]:
    (si, sf), tu = sigmoids_of(xp, i, f), xp.tanh(u)
    return si * tu + sf * c, (si, sf, tu)


def _c_vjp_i(xp: Any, d: Any, saved: tuple[Any, Any, Any], *_: Any) -> Any:
    si, _sf, tu = saved
    return d * tu * si * (1.0 - si)


def _c_vjp_f(xp: Any, d: Any, saved: tuple[Any, Any, Any], i: Any, f: Any, u: Any, c: Any) -> Any:
    sf = saved[1]
    return d * c * sf * (1.0 - sf)


def _c_vjp_u(xp: Any, d: Any, saved: tuple[Any, Any, Any], *_: Any) -> Any:
    si, _sf, tu = saved
    return d * si * (1.0 - tu * tu)


def _c_vjp_c(xp: Any, d: Any, saved: tuple[Any, Any, Any], *_: Any) -> Any:
    return d * saved[1]


def _tree_c_forward(
    xp: Any, i: Any, f_left: Any, f_right: Any, u: Any, c_left: Any, c_right: Any
) -> tuple[Any, tuple[Any, Any, Any, Any]]:
    (si, sfl, sfr), tu = sigmoids_of(xp, i, f_left, f_right), xp.tanh(u)
    return si * tu + sfl * c_left + sfr * c_right, (si, sfl, sfr, tu)


def _tree_c_vjp_i(xp: Any, d: Any, saved: tuple[Any, Any, Any, Any], *_: Any) -> Any:
    si, _sfl, _sfr, tu = saved
    return d * tu * si * (1.0 - si)


def _tree_c_vjp_f_left(
    xp: Any, d: Any, saved: tuple[Any, Any, Any, Any], i: Any, f_l: Any, f_r: Any, u: Any, c_l: Any, c_r: Any
) -> Any:
    sfl = saved[1]
    return d * c_l * sfl * (1.0 - sfl)


def _tree_c_vjp_f_right(
    xp: Any, d: Any, saved: tuple[Any, Any, Any, Any], i: Any, f_l: Any, f_r: Any, u: Any, c_l: Any, c_r: Any
) -> Any:
    sfr = saved[2]
    return d * c_r * sfr * (1.0 - sfr)


def _tree_c_vjp_u(xp: Any, d: Any, saved: tuple[Any, Any, Any, Any], *_: Any) -> Any:
    si, _sfl, _sfr, tu = saved
    return d * si * (1.0 - tu * tu)


def _tree_c_vjp_c_left(xp: Any, d: Any, saved: tuple[Any, Any, Any, Any], *_: Any) -> Any:
    return d * saved[1]


def _tree_c_vjp_c_right(xp: Any, d: Any, saved: tuple[Any, Any, Any, Any], *_: Any) -> Any:
    return d * saved[2]


def _h_forward(xp: Any, o: Any, c: Any) -> tuple[Any, tuple[Any, Any]]:
    so, tc = sigmoid_of(xp, o), xp.tanh(c)
    return so * tc, (so, tc)


def _h_vjp_o(xp: Any, d: Any, saved: tuple[Any, Any], *_: Any) -> Any:
    so, tc = saved
    return d * tc * so * (1.0 - so)


def _h_vjp_c(xp: Any, d: Any, saved: tuple[Any, Any], *_: Any) -> Any:
    so, tc = saved
    return d * so * (1.0 - tc * tc)


def _gru_forward(xp: Any, r: Any, z: Any, n_x: Any, n_h: Any, h: Any) -> tuple[Any, tuple[Any, Any, Any]]:
    sr, sz = sigmoids_of(xp, r, z)
    n = xp.tanh(n_x + sr * n_h)
    return (1.0 - sz) * n + sz * h, (sr, sz, n)


def _gru_d_candidate(d: Any, saved: tuple[Any, Any, Any]) -> Any:
    """The delta of the candidate's pre-activation ``n_x + sigmoid(r) * n_h``."""
    _sr, sz, n = saved
    return d * (1.0 - sz) * (1.0 - n * n)


def _gru_vjp_r(
    xp: Any, d: Any, saved: tuple[Any, Any, Any], r: Any, z: Any, n_x: Any, n_h: Any, h: Any
) -> Any:
    sr = saved[0]
    return _gru_d_candidate(d, saved) * n_h * sr * (1.0 - sr)


def _gru_vjp_z(
    xp: Any, d: Any, saved: tuple[Any, Any, Any], r: Any, z: Any, n_x: Any, n_h: Any, h: Any
) -> Any:
    _sr, sz, n = saved
    return d * (h - n) * sz * (1.0 - sz)


def _gru_vjp_n_x(xp: Any, d: Any, saved: tuple[Any, Any, Any], *_: Any) -> Any:
    return _gru_d_candidate(d, saved)


def _gru_vjp_n_h(xp: Any, d: Any, saved: tuple[Any, Any, Any], *_: Any) -> Any:
    return _gru_d_candidate(d, saved) * saved[0]


def _gru_vjp_h(xp: Any, d: Any, saved: tuple[Any, Any, Any], *_: Any) -> Any:
    return d * saved[1]


GRU_H: Final = declare(
    "gru_h",
    _gru_forward,
    (_gru_vjp_r, _gru_vjp_z, _gru_vjp_n_x, _gru_vjp_n_h, _gru_vjp_h),
    True,
    saves=True,
    batch=ELEMENTWISE,
    shape_rule=elementwise,
)
LSTM_C: Final = declare(
    "lstm_c",
    _c_forward,
    (_c_vjp_i, _c_vjp_f, _c_vjp_u, _c_vjp_c),
    True,
    saves=True,
    batch=ELEMENTWISE,
    shape_rule=elementwise,
)
TREE_LSTM_C: Final = declare(
    "tree_lstm_c",
    _tree_c_forward,
    (
        _tree_c_vjp_i,
        _tree_c_vjp_f_left,
        _tree_c_vjp_f_right,
        _tree_c_vjp_u,
        _tree_c_vjp_c_left,
        _tree_c_vjp_c_right,
    ),
    True,
    saves=True,
    batch=ELEMENTWISE,
    shape_rule=elementwise,
)
LSTM_H: Final = declare(
    "lstm_h", _h_forward, (_h_vjp_o, _h_vjp_c), True, saves=True, batch=ELEMENTWISE, shape_rule=elementwise
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
