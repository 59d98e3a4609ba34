"""Activations: ``tanh``, ``sigmoid``, ``relu``, ``softplus``, ``gelu``, ``silu``, ``leaky_relu``,
``elu`` and ``clip`` (elementwise), and ``softmax`` and ``log_softmax`` (along an axis).

Each is one primitive with a hand-written vjp, written against the array namespace ``xp`` (NumPy,
CuPy, array-api-strict) and, for the elementwise ones, against
:data:`~monadl.typeclasses.backend.FLOATS` for Python floats, so a float operand gives a
``FloatLayer``. The elementwise ones merge under dynamic batching as every elementwise op does
(``ELEMENTWISE``): calls of equal static parameters (a slope, bounds) stack their rows.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Final, overload

import numpy as np

from monadl.do.primitive import Batching
from monadl.dsl.core.arguments import array_operand, int_param
from monadl.dsl.core.layers import AnyArray, AnyFloat, ArrayLayer, FloatLayer, apply, apply_array
from monadl.dsl.fused import Kernel, on_cupy
from monadl.dsl.ops.operators import elementwise_op
from monadl.dsl.ops.registry import declare
from monadl.dsl.ops.shape_rules import same
from monadl.typeclasses.backend import FLOATS, NDARRAY, NUMPY, ShapeError, shape_of

__all__ = [
    "clip",
    "elu",
    "gelu",
    "leaky_relu",
    "log_softmax",
    "relu",
    "sigmoid",
    "silu",
    "softmax",
    "softplus",
    "tanh",
]


def _log1p(xp: Any, x: Any) -> Any:
    return math.log1p(x) if type(x) is float else xp.log1p(x)


def _expm1(xp: Any, x: Any) -> Any:
    return math.expm1(x) if type(x) is float else xp.expm1(x)


# -------------------------------------------------------------------------- tanh, sigmoid, relu


# The activations' rules as one kernel each on CuPy arrays (``monadl.dsl.fused``): the same
# operations in the same order as the rules below, one pass instead of one per operator.
# The activations' rules as one kernel each on CuPy arrays (``monadl.dsl.fused``): the same
# operations in the same order as the rules below, one pass instead of one per operator.
_TANH_VJP = Kernel("tanhvjp", ("d", "y"), (), ("dx",), ("dx = d * (T(1.0) - y * y)",))


_SIGMOID = Kernel("sigmoid", ("x",), (), ("y",), ("y = T(1.0) / (T(1.0) + exp(-x))",))


_SIGMOID_VJP = Kernel("sigmoidvjp", ("d", "y"), (), ("dx",), ("dx = d * y * (T(1.0) - y)",))


def _tanh_vjp(xp: Any, d: Any, o: Any, x: Any) -> Any:
    if xp is not NUMPY and on_cupy(d, o):
        return _TANH_VJP((d, o), ())[0]
    return d * (1.0 - o * o)


TANH: Final = elementwise_op("tanh", lambda xp, x: xp.tanh(x), (_tanh_vjp,))


@overload
def tanh(x: AnyFloat) -> FloatLayer: ...


@overload
def tanh(x: AnyArray) -> ArrayLayer: ...


def tanh(x: AnyFloat | AnyArray) -> FloatLayer | ArrayLayer:
    """Elementwise hyperbolic tangent."""
    return apply(TANH, x)


def sigmoid_of(xp: Any, x: Any) -> Any:
    """``1 / (1 + exp(-x))``, accurate to a few ulps wherever the result is a normal number.

    ``exp(-x)`` and the sum keep their relative error of an ulp or so, and a quotient adds half an
    ulp, at every x: no difference of nearly equal values. (``0.5 * (1 + tanh(x / 2))`` cancels for
    negative x: all its digits are gone below -38 in float64, -18 in float32, and
    ``log(sigmoid(x))`` is infinite there.) For x below -log(max float) (-709.8 in float64, -88.7 in
    float32) ``exp(-x)`` overflows to inf and the result is 0 where the exact one is subnormal;
    the overflow is expected there, not warned of. One exp, as fast as this can be in NumPy: an
    ``exp(-|x|)`` form, which cannot overflow, needs a select (``where``), which costs NumPy twice
    as much as the exp itself."""
    with np.errstate(over="ignore"):
        return _sigmoid(xp, x)


def sigmoids_of(xp: Any, *xs: Any) -> tuple[Any, ...]:
    """:func:`sigmoid_of` of several arrays (a recurrent cell's gates), under one ``errstate``."""
    with np.errstate(over="ignore"):
        return tuple([_sigmoid(xp, x) for x in xs])


def _sigmoid(xp: Any, x: Any) -> Any:
    """``1 / (1 + exp(-x))``; on a NumPy array of its own dimensions the same operations in the same
    order in one new array (the same bits, half the time on a few rows)."""
    if xp is NUMPY and type(x) is NDARRAY and x.ndim:
        t = np.negative(x)
        np.exp(t, out=t)
        t += 1.0
        return np.divide(1.0, t, out=t)
    if xp is not NUMPY and on_cupy(x):
        return _SIGMOID((x,), ())[0]
    return 1.0 / (1.0 + xp.exp(-x))


# d * s * (1 - s), as PyTorch and JAX compute it. Where s <= 1/2 (x <= 0), 1 - s is in [1/2, 1]
# and the product is good to a few ulps (an accurate s matters there: see sigmoid_of).
# For large positive x, 1 - s cancels, but only to an absolute error of about eps * |d| (the
# rounding of s near 1): large relative error only in a gradient below the rounding of whatever it
# is added to. (An exact form, d * s / (1 + exp(x)), would add an exp to every gate's backward:
# 3 times the vjp's time.)
def _sigmoid_vjp(xp: Any, d: Any, o: Any, x: Any) -> Any:
    if xp is not NUMPY and on_cupy(d, o):
        return _SIGMOID_VJP((d, o), ())[0]
    return d * o * (1.0 - o)


SIGMOID: Final = elementwise_op("sigmoid", sigmoid_of, (_sigmoid_vjp,))


@overload
def sigmoid(x: AnyFloat) -> FloatLayer: ...


@overload
def sigmoid(x: AnyArray) -> ArrayLayer: ...


def sigmoid(x: AnyFloat | AnyArray) -> FloatLayer | ArrayLayer:
    """Elementwise logistic function ``1 / (1 + e ** -x)``, without overflow."""
    return apply(SIGMOID, x)


def _relu_vjp(xp: Any, d: Any, o: Any, x: Any) -> Any:
    # d times the mask of the units that are on: one multiplication (``where`` is scalar code in
    # NumPy: twice as slow at every size measured). A unit that is off gives d * 0: a zero (of d's
    # sign), or NaN where d itself is not finite.
    on = x > 0.0
    if xp is NUMPY or xp is FLOATS:
        return d * on
    return d * xp.astype(on, d.dtype)  # the array API multiplies no floats by bools


RELU: Final = elementwise_op("relu", lambda xp, x: xp.maximum(x, 0.0), (_relu_vjp,))


@overload
def relu(x: AnyFloat) -> FloatLayer: ...


@overload
def relu(x: AnyArray) -> ArrayLayer: ...


def relu(x: AnyFloat | AnyArray) -> FloatLayer | ArrayLayer:
    """Elementwise ``max(x, 0)`` (derivative 0 at 0)."""
    return apply(RELU, x)


# -------------------------------------------------------------------------------------- softmax


def log_softmax_of(xp: Any, x: Any, axis: int) -> Any:
    """``x - logsumexp(x)`` along ``axis``, to a few ulps of each result, those near 0 included.

    With ``shifted = x - max``, ``logsumexp - max`` is ``log(1 + s)``, ``s`` the sum of the terms
    ``exp(shifted)`` but one maximum's (exactly 1). ``log`` of the rounded sum ``1 + s`` loses ``s``
    below an ulp of 1, and the log-probability of a confident class came out 0 (relative error 1:
    it is -s): so ``s`` is summed without that 1, and ``log1p(s)`` keeps it. (Other maxima, ties,
    stay in ``s`` as 1s: then ``s >= 1``, with nothing to lose.) Along an axis of length 0, there
    is nothing to normalise: the result is as empty as ``x`` (PyTorch's)."""
    if x.shape[axis] == 0:  # (a maximum of nothing is undefined)
        return xp.zeros_like(x)
    if xp is NUMPY:  # the ufuncs' reductions, and in place on our own array: np.max and np.sum add
        # microseconds of Python each, more than the arithmetic on a batch of logits. One maximum
        # per row by argmax, which costs no more than the max: its term is then set to 0 in place,
        # where a mask of the maxima would cost three passes more (half again the whole op).
        if x.ndim == 2 and axis in (1, -1):  # a batch of logits: plain indexing, no along_axis wrappers
            rows = np.arange(x.shape[0])
            top = np.argmax(x, axis=1)
            shifted = x - x[rows, top][:, None]
            terms = np.exp(shifted)
            terms[rows, top] = 0.0
        else:
            top = np.expand_dims(np.argmax(x, axis=axis), axis)
            shifted = x - np.take_along_axis(x, top, axis)
            terms = np.exp(shifted)
            np.put_along_axis(terms, top, 0.0, axis)
        shifted -= np.log1p(np.add.reduce(terms, axis=axis, keepdims=True))
        return shifted
    shifted, _, rest = softmax_terms(xp, x, axis)
    return shifted - xp.log1p(rest)


def softmax_terms(xp: Any, x: Any, axis: int) -> tuple[Any, Any, Any]:
    """:func:`log_softmax_of`'s parts in any namespace: ``shifted = x - max``, the terms
    ``exp(shifted)``, and ``s``, their sum but one maximum's (the log-probabilities are
    ``shifted - log1p(s)``, the probabilities ``terms / (1 + s)``). The array API has no
    put_along_axis: the maxima's 1s are taken out by a mask, all of them (their count less one
    added back); with one maximum, ``s`` is NumPy's sum of the same values."""
    shifted = x - xp.max(x, axis=axis, keepdims=True)
    top = xp.astype(shifted == 0.0, shifted.dtype)  # the array API subtracts no bools from floats
    terms = xp.exp(shifted)
    rest = xp.sum(terms - top, axis=axis, keepdims=True) + (xp.sum(top, axis=axis, keepdims=True) - 1.0)
    return shifted, terms, rest


def _softmax(xp: Any, x: Any, axis: int = -1) -> Any:
    """``exp(x - max) / sum(exp(x - max))`` along ``axis``. (``exp(log_softmax(x))`` would cost
    a log and a second exp more, and rounds the log-probability ``x - max - logsumexp`` once more
    before its exp: up to |log-probability| / 2 ulps of relative error, 32 ulps for a probability of
    e^-100.) Along an axis of length 0, the result is as empty as ``x`` (PyTorch's)."""
    if x.shape[axis] == 0:
        return xp.zeros_like(x)
    if xp is NUMPY:  # as in log_softmax_of: the ufuncs, in place on our own array
        e = x - np.maximum.reduce(x, axis=axis, keepdims=True)
        np.exp(e, out=e)
        e /= np.add.reduce(e, axis=axis, keepdims=True)
        return e
    e = xp.exp(x - xp.max(x, axis=axis, keepdims=True))
    return e / xp.sum(e, axis=axis, keepdims=True)


def _check_has_axis(name: str) -> Callable[..., None]:
    """The check of ``softmax`` or ``log_softmax`` (named ``name``): ``axis`` within the operand's rank."""

    def check(x: Any, axis: int = -1) -> None:
        if type(x) is float or not -x.ndim <= axis < x.ndim:
            raise ShapeError(f"{name}: axis {axis} is out of range for shape {shape_of(x)}")

    return check


SOFTMAX: Final = declare(
    "softmax",
    _softmax,
    (lambda xp, d, o, x, axis=-1: o * (d - xp.sum(d * o, axis=axis, keepdims=True)),),
    check=_check_has_axis("softmax"),
    batch=Batching(axis=True, axis_default=-1),
    shape_rule=same,
)


def softmax(x: AnyArray, axis: int = -1) -> ArrayLayer:
    """Softmax along ``axis``, computed stably."""
    array_operand("softmax", x)
    return apply_array(SOFTMAX, x, axis=int_param("softmax", "axis", axis))


LOG_SOFTMAX: Final = declare(
    "log_softmax",
    lambda xp, x, axis=-1: log_softmax_of(xp, x, axis),
    (lambda xp, d, o, x, axis=-1: d - xp.exp(o) * xp.sum(d, axis=axis, keepdims=True),),
    check=_check_has_axis("log_softmax"),
    batch=Batching(axis=True, axis_default=-1),
    shape_rule=same,
)


def log_softmax(x: AnyArray, axis: int = -1) -> ArrayLayer:
    """Log of the softmax along ``axis``, computed stably."""
    array_operand("log_softmax", x)
    return apply_array(LOG_SOFTMAX, x, axis=int_param("log_softmax", "axis", axis))


# ---------------------------------------------------------------------------------------- softplus


def _softplus(xp: Any, x: Any) -> Any:
    """``log(1 + e ** x)`` as ``max(x, 0) + log1p(e ** -|x|)``: the exp never overflows, and for
    large negative x the result keeps its digits (``log(1 + tiny)`` would round to 0)."""
    return xp.maximum(x, 0.0) + _log1p(xp, xp.exp(-xp.abs(x)))


SOFTPLUS: Final = elementwise_op("softplus", _softplus, (lambda xp, d, o, x: d * sigmoid_of(xp, x),))

# -------------------------------------------------------------------------------------------- silu


def _silu_vjp(xp: Any, d: Any, o: Any, x: Any) -> Any:
    s = sigmoid_of(xp, x)
    return d * (s + o * (1.0 - s))  # d/dx x s(x) = s + x s (1 - s), and x s is the output


SILU: Final = elementwise_op("silu", lambda xp, x: x * sigmoid_of(xp, x), (_silu_vjp,))

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


GELU: Final = elementwise_op("gelu", _gelu, (_gelu_vjp,))

# -------------------------------------------------------------------------------------- leaky_relu


def _leaky_relu(xp: Any, x: Any, negative_slope: float) -> Any:
    return xp.where(x > 0.0, x, x * negative_slope)


def _leaky_relu_vjp(xp: Any, d: Any, o: Any, x: Any, negative_slope: float) -> Any:
    return xp.where(x > 0.0, d, d * negative_slope)


LEAKY_RELU: Final = elementwise_op("leaky_relu", _leaky_relu, (_leaky_relu_vjp,))

# --------------------------------------------------------------------------------------------- elu


def _elu(xp: Any, x: Any, alpha: float) -> Any:
    # expm1 of min(x, 0): the unused branch never overflows (no warning for large x)
    return xp.where(x > 0.0, x, alpha * _expm1(xp, xp.minimum(x, 0.0)))


def _elu_vjp(xp: Any, d: Any, o: Any, x: Any, alpha: float) -> Any:
    return xp.where(x > 0.0, d, d * (o + alpha))  # alpha e ** x = the output + alpha, for x <= 0


ELU: Final = elementwise_op("elu", _elu, (_elu_vjp,))

# -------------------------------------------------------------------------------------------- clip


def _clip_vjp(xp: Any, d: Any, o: Any, x: Any, lo: float, hi: float) -> Any:
    inside = (x >= lo) & (x <= hi)
    if type(inside) is bool:
        return d if inside else 0.0 * d
    return xp.where(inside, d, 0.0 * d)  # (0 * d: a NaN delta stays NaN, as relu's)


CLIP: Final = elementwise_op("clip", lambda xp, x, lo, hi: xp.minimum(xp.maximum(x, lo), hi), (_clip_vjp,))

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
    return apply(SOFTPLUS, x)


@overload
def silu(x: AnyFloat) -> FloatLayer: ...
@overload
def silu(x: AnyArray) -> ArrayLayer: ...
def silu(x: AnyFloat | AnyArray) -> FloatLayer | ArrayLayer:
    """Elementwise ``x * sigmoid(x)`` (SiLU, or swish)."""
    return apply(SILU, x)


@overload
def gelu(x: AnyFloat) -> FloatLayer: ...
@overload
def gelu(x: AnyArray) -> ArrayLayer: ...
def gelu(x: AnyFloat | AnyArray) -> FloatLayer | ArrayLayer:
    """Elementwise GELU by its tanh approximation, ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x**3)))``
    (PyTorch's ``gelu(approximate="tanh")``, GPT-2's). The exact form ``x * Phi(x)`` needs ``erf``,
    which the array API standard does not have; the two differ by less than 1e-3 everywhere."""
    return apply(GELU, x)


@overload
def leaky_relu(x: AnyFloat, negative_slope: float = 0.01) -> FloatLayer: ...
@overload
def leaky_relu(x: AnyArray, negative_slope: float = 0.01) -> ArrayLayer: ...
def leaky_relu(x: AnyFloat | AnyArray, negative_slope: float = 0.01) -> FloatLayer | ArrayLayer:
    """Elementwise ``x`` where ``x > 0``, else ``negative_slope * x`` (at 0 the derivative is the
    slope's, as relu's is 0 there)."""
    return apply(LEAKY_RELU, x, negative_slope=_real("leaky_relu", "negative_slope", negative_slope))


@overload
def elu(x: AnyFloat, alpha: float = 1.0) -> FloatLayer: ...
@overload
def elu(x: AnyArray, alpha: float = 1.0) -> ArrayLayer: ...
def elu(x: AnyFloat | AnyArray, alpha: float = 1.0) -> FloatLayer | ArrayLayer:
    """Elementwise ``x`` where ``x > 0``, else ``alpha * (e ** x - 1)`` (by ``expm1``, accurate near 0)."""
    return apply(ELU, x, alpha=_real("elu", "alpha", alpha))


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
    return apply(CLIP, x, lo=low, hi=high)
