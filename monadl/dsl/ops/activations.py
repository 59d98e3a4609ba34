"""Elementwise activations: ``softplus``, ``gelu``, ``silu``, ``leaky_relu``, ``elu`` and ``clip``.

Each is one primitive with a hand-written vjp, written against the array namespace ``xp`` (NumPy,
CuPy, array-api-strict) and against :data:`~monadl.typeclasses.backend.FLOATS` for Python floats,
so a float operand gives a ``FloatLayer``. They merge under dynamic batching as every elementwise
op does (``ELEMENTWISE``): calls of equal static parameters (a slope, bounds) stack their rows.
"""

from __future__ import annotations

import math
from typing import Any, overload

import numpy as np

from monadl.dsl import primitives as P
from monadl.dsl.fused import Kernel, on_cupy
from monadl.dsl.layers import AnyArray, AnyFloat, ArrayLayer, FloatLayer, apply
from monadl.dsl.primitives import ELEMENTWISE, Primitive, Rule
from monadl.typeclasses.backend import NUMPY

__all__ = ["clip", "elu", "gelu", "leaky_relu", "silu", "softplus"]


def _elementwise(name: str, forward: Rule, vjp: Rule) -> Primitive:
    return Primitive(name, forward, (vjp,), batch=ELEMENTWISE, fresh=True, own=True)


def _log1p(xp: Any, x: Any) -> Any:
    return math.log1p(x) if type(x) is float else xp.log1p(x)


def _expm1(xp: Any, x: Any) -> Any:
    return math.expm1(x) if type(x) is float else xp.expm1(x)


# ---------------------------------------------------------------------------------------- softplus


def _softplus(xp: Any, x: Any) -> Any:
    """``log(1 + e ** x)`` as ``max(x, 0) + log1p(e ** -|x|)``: the exp never overflows, and for
    large negative x the result keeps its digits (``log(1 + tiny)`` would round to 0)."""
    return xp.maximum(x, 0.0) + _log1p(xp, xp.exp(-xp.abs(x)))


softplus_ = _elementwise("softplus", _softplus, lambda xp, d, o, x: d * P.sigmoid_of(xp, x))

# -------------------------------------------------------------------------------------------- silu


def _silu_vjp(xp: Any, d: Any, o: Any, x: Any) -> Any:
    s = P.sigmoid_of(xp, x)
    return d * (s + o * (1.0 - s))  # d/dx x s(x) = s + x s (1 - s), and x s is the output


silu_ = _elementwise("silu", lambda xp, x: x * P.sigmoid_of(xp, x), _silu_vjp)

# -------------------------------------------------------------------------------------------- gelu

_GELU_C = math.sqrt(2.0 / math.pi)
_GELU_K = 0.044715


# On CuPy arrays, GELU's rules run as one kernel each (``monadl.dsl.fused``): the operations of the
# rules below in their order, the constants as the rules' Python floats round them.
_GELU_INNER = f"t = tanh(T({_GELU_C!r}) * (x + T({_GELU_K!r}) * x * x * x))"
_GELU = Kernel("gelu", ("x",), (), ("y",), (_GELU_INNER, "y = T(0.5) * x * (T(1.0) + t)"))
_GELU_VJP = Kernel(
    "geluvjp",
    ("d", "x"),
    (),
    ("dx",),
    (
        _GELU_INNER,
        f"slope = T(0.5) * (T(1.0) + t) + T(0.5) * x * (T(1.0) - t * t) * T({_GELU_C!r}) * "
        f"(T(1.0) + T({3.0 * _GELU_K!r}) * x * x)",
        "dx = d * slope",
    ),
)


def _gelu_inner(xp: Any, x: Any) -> Any:
    return xp.tanh(_GELU_C * (x + _GELU_K * x * x * x))


def _gelu(xp: Any, x: Any) -> Any:
    if xp is not NUMPY and on_cupy(x):
        return _GELU((x,), ())[0]
    return 0.5 * x * (1.0 + _gelu_inner(xp, x))


def _gelu_vjp(xp: Any, d: Any, o: Any, x: Any) -> Any:
    if xp is not NUMPY and on_cupy(d, x):
        return _GELU_VJP((d, x), ())[0]
    t = _gelu_inner(xp, x)
    slope = 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * _GELU_C * (1.0 + 3.0 * _GELU_K * x * x)
    return d * slope


gelu_ = _elementwise("gelu", _gelu, _gelu_vjp)

# -------------------------------------------------------------------------------------- leaky_relu


def _leaky_relu(xp: Any, x: Any, negative_slope: float) -> Any:
    return xp.where(x > 0.0, x, x * negative_slope)


def _leaky_relu_vjp(xp: Any, d: Any, o: Any, x: Any, negative_slope: float) -> Any:
    return xp.where(x > 0.0, d, d * negative_slope)


leaky_relu_ = _elementwise("leaky_relu", _leaky_relu, _leaky_relu_vjp)

# --------------------------------------------------------------------------------------------- elu


def _elu(xp: Any, x: Any, alpha: float) -> Any:
    # expm1 of min(x, 0): the unused branch never overflows (no warning for large x)
    return xp.where(x > 0.0, x, alpha * _expm1(xp, xp.minimum(x, 0.0)))


def _elu_vjp(xp: Any, d: Any, o: Any, x: Any, alpha: float) -> Any:
    return xp.where(x > 0.0, d, d * (o + alpha))  # alpha e ** x = the output + alpha, for x <= 0


elu_ = _elementwise("elu", _elu, _elu_vjp)

# -------------------------------------------------------------------------------------------- clip


def _clip_vjp(xp: Any, d: Any, o: Any, x: Any, lo: float, hi: float) -> Any:
    inside = (x >= lo) & (x <= hi)
    if type(inside) is bool:
        return d if inside else 0.0 * d
    return xp.where(inside, d, 0.0 * d)  # (0 * d: a NaN delta stays NaN, as relu's)


clip_ = _elementwise("clip", lambda xp, x, lo, hi: xp.minimum(xp.maximum(x, lo), hi), _clip_vjp)

# ------------------------------------------------------------------------------- public functions


def _real(op: str, name: str, value: object) -> float:
    """A float parameter: a float or an int (not a bool), as a float."""
    if isinstance(value, (float, int, np.floating, np.integer)) and not isinstance(value, (bool, np.bool_)):
        return float(value)
    raise TypeError(f"{op}: {name} must be a float, got {type(value).__name__} {value!r}")


@overload
def softplus(x: AnyFloat) -> FloatLayer: ...
@overload
def softplus(x: AnyArray) -> ArrayLayer: ...
def softplus(x: AnyFloat | AnyArray) -> FloatLayer | ArrayLayer:
    """Elementwise ``log(1 + e ** x)``, computed without overflow (``max(x, 0) + log1p(e ** -|x|)``).
    Its derivative is ``sigmoid(x)``."""
    return apply(softplus_, x)


@overload
def silu(x: AnyFloat) -> FloatLayer: ...
@overload
def silu(x: AnyArray) -> ArrayLayer: ...
def silu(x: AnyFloat | AnyArray) -> FloatLayer | ArrayLayer:
    """Elementwise ``x * sigmoid(x)`` (SiLU, or swish)."""
    return apply(silu_, x)


@overload
def gelu(x: AnyFloat) -> FloatLayer: ...
@overload
def gelu(x: AnyArray) -> ArrayLayer: ...
def gelu(x: AnyFloat | AnyArray) -> FloatLayer | ArrayLayer:
    """Elementwise GELU by its tanh approximation, ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x**3)))``
    (PyTorch's ``gelu(approximate="tanh")``, GPT-2's). The exact form ``x * Phi(x)`` needs ``erf``,
    which the array API standard does not have; the two differ by less than 1e-3 everywhere."""
    return apply(gelu_, x)


@overload
def leaky_relu(x: AnyFloat, negative_slope: float = 0.01) -> FloatLayer: ...
@overload
def leaky_relu(x: AnyArray, negative_slope: float = 0.01) -> ArrayLayer: ...
def leaky_relu(x: AnyFloat | AnyArray, negative_slope: float = 0.01) -> FloatLayer | ArrayLayer:
    """Elementwise ``x`` where ``x > 0``, else ``negative_slope * x`` (at 0 the derivative is the
    slope's, as relu's is 0 there)."""
    return apply(leaky_relu_, x, negative_slope=_real("leaky_relu", "negative_slope", negative_slope))


@overload
def elu(x: AnyFloat, alpha: float = 1.0) -> FloatLayer: ...
@overload
def elu(x: AnyArray, alpha: float = 1.0) -> ArrayLayer: ...
def elu(x: AnyFloat | AnyArray, alpha: float = 1.0) -> FloatLayer | ArrayLayer:
    """Elementwise ``x`` where ``x > 0``, else ``alpha * (e ** x - 1)`` (by ``expm1``, accurate near 0)."""
    return apply(elu_, x, alpha=_real("elu", "alpha", alpha))


@overload
def clip(x: AnyFloat, lo: float, hi: float) -> FloatLayer: ...
@overload
def clip(x: AnyArray, lo: float, hi: float) -> ArrayLayer: ...
def clip(x: AnyFloat | AnyArray, lo: float, hi: float) -> FloatLayer | ArrayLayer:
    """Elementwise ``min(max(x, lo), hi)``, bounds included (``-inf`` or ``inf`` for one side
    open). The delta passes where ``lo <= x <= hi`` (at a bound too, as PyTorch's) and is 0 outside."""
    low, high = _real("clip", "lo", lo), _real("clip", "hi", hi)
    if not low <= high:
        raise ValueError(f"clip: needs lo <= hi, got lo {low!r} and hi {high!r}")
    return apply(clip_, x, lo=low, hi=high)
