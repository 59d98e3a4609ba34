"""An LSTM cell's gate arithmetic as two fused ops: :func:`lstm_c` and :func:`lstm_h`.

From the gates' pre-activations ``i``, ``f``, ``o``, ``u`` (each ``W [x; h] + b``) and the memory
``c``, an LSTM step computes ``c' = sigmoid(i) * tanh(u) + sigmoid(f) * c`` and
``h' = sigmoid(o) * tanh(c')``. Written with the elementwise ops, that is seven kernels forward and
nine vjps backward; a small recurrent step is bound by kernels launched, not by arithmetic, so
these two ops do it in two kernels forward and six vjps, as DyNet's ``vanilla_lstm_c`` and
``vanilla_lstm_h`` do. Each saves its activations for its vjps. They are elementwise in all their
operands (broadcasting as NumPy does), so their calls merge under dynamic batching as the
elementwise ops' do. :class:`monadl.nn.LSTMCell` is built on them.
"""

from __future__ import annotations

from typing import Any, Final

from monadl.dsl.arguments import array_operand
from monadl.dsl.layers import AnyArray, ArrayLayer, apply_array
from monadl.dsl.primitives import ELEMENTWISE, Primitive, sigmoid_of

__all__ = ["lstm_c", "lstm_h"]


def _c_forward(xp: Any, i: Any, f: Any, u: Any, c: Any) -> tuple[Any, tuple[Any, Any, Any]]:
    si, sf, tu = sigmoid_of(xp, i), sigmoid_of(xp, f), xp.tanh(u)
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


def _h_forward(xp: Any, o: Any, c: Any) -> tuple[Any, tuple[Any, Any]]:
    so, tc = sigmoid_of(xp, o), xp.tanh(c)
    return so * tc, (so, tc)


def _h_vjp_o(xp: Any, d: Any, saved: tuple[Any, Any], *_: Any) -> Any:
    so, tc = saved
    return d * tc * so * (1.0 - so)


def _h_vjp_c(xp: Any, d: Any, saved: tuple[Any, Any], *_: Any) -> Any:
    so, tc = saved
    return d * so * (1.0 - tc * tc)


LSTM_C: Final = Primitive(
    "lstm_c",
    _c_forward,
    (_c_vjp_i, _c_vjp_f, _c_vjp_u, _c_vjp_c),
    True,
    saves=True,
    batch=ELEMENTWISE,
    fresh=True,
    own=True,
)
LSTM_H: Final = Primitive(
    "lstm_h", _h_forward, (_h_vjp_o, _h_vjp_c), True, saves=True, batch=ELEMENTWISE, fresh=True, own=True
)


def lstm_c(i: AnyArray, f: AnyArray, u: AnyArray, c: AnyArray) -> ArrayLayer:
    """An LSTM step's next memory ``sigmoid(i) * tanh(u) + sigmoid(f) * c``, from the input, forget
    and candidate gates' pre-activations and the memory ``c``: one op (see the module)."""
    for name, x in (("i", i), ("f", f), ("u", u), ("c", c)):
        array_operand("lstm_c", x, name)
    return apply_array(LSTM_C, i, f, u, c)


def lstm_h(o: AnyArray, c: AnyArray) -> ArrayLayer:
    """An LSTM step's output ``sigmoid(o) * tanh(c)``, from the output gate's pre-activation and the
    step's new memory ``c``: one op (see the module)."""
    array_operand("lstm_h", o, "o")
    array_operand("lstm_h", c, "c")
    return apply_array(LSTM_H, o, c)
