"""Reductions along axes: ``sum``, ``mean``, ``max``, ``min``, ``logsumexp``, ``var``, ``std``, and
the index functions ``argmax`` and ``argmin``.

The differentiable ones are primitives with hand-written vjps: over
all axes (``axis=None``) they give a ``FloatLayer``, along ``axis`` an ``ArrayLayer``, and calls
merge under dynamic batching by stacking their rows and reducing past the row axis. ``argmax`` and
``argmin`` give integers, which have no gradient and no place in a layer (a layer's data is
floating-point): they are plain functions of a value, not ops (see :func:`argmax`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Final, overload

import numpy as np
from returns.pipeline import is_successful

from monadl.do.primitive import Batching, Primitive
from monadl.dsl.core.arguments import array_operand, axis_param, flag_param
from monadl.dsl.core.layers import AnyArray, ArrayLayer, ArrayOperators, FloatLayer, apply_array, apply_float
from monadl.dsl.core.weights import ArrayWeight
from monadl.dsl.ops.operators import index_int
from monadl.dsl.ops.registry import declare, not_a_float
from monadl.dsl.ops.shape_rules import reduced
from monadl.typeclasses.backend import (
    NDARRAY,
    IndexArray,
    ShapeError,
    is_array,
    minus_zeros,
    namespace,
    shape_of,
)

__all__ = ["argmax", "argmin", "logsumexp", "max", "mean", "min", "std", "sum", "var"]

Axis = int | tuple[int, ...] | None

_REDUCTION = Batching(axis=True, scalar="reduce")


# --------------------------------------------------------------------------------- sum and mean


def expand_to(xp: Any, delta: Any, x: Any, axis: int | tuple[int, ...] | None, keepdims: bool) -> Any:
    """``delta`` of a reduction of ``x`` over ``axis``, broadcast back to ``x``'s shape."""
    if type(delta) is float and type(x) is NDARRAY:
        # d itself in x's dtype (as -0.0 + d gives it) in one pass, laid out as x is: a
        # convolution's output is a transposed view, and its delta in the same layout is the
        # convolution's own product layout (its vjps then read it without a transposing copy)
        return np.full_like(x, delta)
    if type(delta) is float or getattr(delta, "ndim", 1) == 0:
        return minus_zeros(xp, x.shape, x.dtype, x) + delta  # -0.0 + d is d, a -0.0 included
    if not keepdims and axis is not None:
        axes = (axis,) if isinstance(axis, int) else axis
        kept = list(x.shape)
        for a in axes:
            kept[a % x.ndim] = 1
        delta = xp.reshape(delta, tuple(kept))
    return xp.broadcast_to(delta, x.shape)


def reduced_count(x: Any, axis: int | tuple[int, ...] | None) -> int:
    """How many of ``x``'s elements a reduction over ``axis`` (None: all) takes into each result."""
    if axis is None:
        return int(math.prod(x.shape))
    axes = (axis,) if isinstance(axis, int) else axis
    return int(math.prod(x.shape[a] for a in axes))


def reduce_axes(xp: Any, value: Any, axis: Any, keepdims: bool) -> Any:
    """A reduction's result: a Python float over all axes without ``keepdims``, else the array."""
    return float(value) if axis is None and not keepdims else value


def check_axes(name: str) -> Callable[..., None]:
    """A reduction's check: every axis within the operand's rank, none twice. (Merged calls shift
    their axes past the rows' axis, where an out-of-range negative axis would be the rows'.)"""

    def check(x: Any, axis: Any = None, keepdims: bool = False) -> None:
        not_a_float(name, x)
        if axis is None:
            return
        rank = x.ndim
        axes = axis if type(axis) is tuple else (axis,)
        for a in axes:
            if not -rank <= a < rank:
                raise ShapeError(f"{name}: axis {a} is out of range for shape {shape_of(x)}")
        if len({a % rank for a in axes}) != len(axes):
            raise ShapeError(f"{name}: axes {axis} repeat an axis of shape {shape_of(x)}")

    return check


SUM: Final = declare(
    "sum",
    lambda xp, x, axis=None, keepdims=False: reduce_axes(
        xp, xp.sum(x, axis=axis, keepdims=keepdims), axis, keepdims
    ),
    (lambda xp, d, o, x, axis=None, keepdims=False: expand_to(xp, d, x, axis, keepdims),),
    check=check_axes("sum"),
    batch=Batching(axis=True, scalar="reduce"),
    shape_rule=reduced,
)


@overload
def sum(x: AnyArray, axis: None = None) -> FloatLayer: ...


@overload
def sum(x: AnyArray, axis: int | tuple[int, ...], *, keepdims: bool = False) -> ArrayLayer: ...


def sum(x: AnyArray, axis: Axis = None, *, keepdims: bool = False) -> FloatLayer | ArrayLayer:
    """Sum of all elements (a ``FloatLayer``), or along ``axis`` (an ``ArrayLayer``)."""
    array_operand("sum", x)
    if axis is None:
        if flag_param("sum", "keepdims", keepdims):
            raise TypeError("sum: keepdims=True needs an axis (over all axes, the sum is a float)")
        return apply_float(SUM, x)
    return apply_array(SUM, x, axis=axis_param("sum", axis), keepdims=flag_param("sum", "keepdims", keepdims))


MEAN: Final = declare(
    "mean",
    lambda xp, x, axis=None, keepdims=False: reduce_axes(
        xp, xp.sum(x, axis=axis, keepdims=keepdims) / reduced_count(x, axis), axis, keepdims
    ),
    (
        lambda xp, d, o, x, axis=None, keepdims=False: expand_to(
            xp, d / reduced_count(x, axis), x, axis, keepdims
        ),
    ),
    check=check_axes("mean"),
    batch=Batching(axis=True, scalar="reduce"),
    shape_rule=reduced,
)


@overload
def mean(x: AnyArray, axis: None = None) -> FloatLayer: ...


@overload
def mean(x: AnyArray, axis: int | tuple[int, ...], *, keepdims: bool = False) -> ArrayLayer: ...


def mean(x: AnyArray, axis: Axis = None, *, keepdims: bool = False) -> FloatLayer | ArrayLayer:
    """Mean of all elements (a ``FloatLayer``), or along ``axis`` (an ``ArrayLayer``). The mean of
    no elements (an empty array, an axis of length 0) is NaN, as NumPy's and PyTorch's: a loss of
    it fails the step with ``NonFiniteLossError``."""
    array_operand("mean", x)
    if axis is None:
        if flag_param("mean", "keepdims", keepdims):
            raise TypeError("mean: keepdims=True needs an axis (over all axes, the mean is a float)")
        return apply_float(MEAN, x)
    return apply_array(
        MEAN, x, axis=axis_param("mean", axis), keepdims=flag_param("mean", "keepdims", keepdims)
    )


"""Merged calls stack their rows; an item's axes are shifted past the rows' (``axis=None``: all
of them), and each call gets its row of the result."""


def _axes_of(x: Any, axis: Axis) -> tuple[int, ...]:
    if axis is None:
        return tuple(range(x.ndim))
    return tuple(a % x.ndim for a in ((axis,) if isinstance(axis, int) else axis))


def _kept(x: Any, axis: Axis) -> tuple[int, ...]:
    """The shape of a reduction of ``x`` over ``axis`` with ``keepdims``."""
    axes = _axes_of(x, axis)
    return tuple(1 if i in axes else n for i, n in enumerate(x.shape))


def _drop(xp: Any, value: Any, x: Any, axis: Axis, keepdims: bool) -> Any:
    """A reduction computed with ``keepdims`` as the op gives it: a float over all axes, the
    reduced axes dropped unless ``keepdims``."""
    if keepdims:
        return value
    axes = _axes_of(x, axis)
    value = xp.reshape(value, tuple(n for i, n in enumerate(x.shape) if i not in axes))
    return float(value) if axis is None else value


def _full(xp: Any, value: Any, x: Any, axis: Axis, keepdims: bool) -> Any:
    """A reduction's result (or delta) broadcast back to ``x``'s shape."""
    return expand_to(xp, value, x, axis, keepdims)


def _checks(name: str, empty: bool = False) -> Any:
    """The check of reduction ``name``: its axes (as ``sum``'s); ``empty``: no reduced axis may be
    empty (a maximum of nothing is undefined)."""
    axes_check = check_axes(name)

    def check(x: Any, axis: Axis = None, keepdims: bool = False, **params: Any) -> None:
        axes_check(x, axis, keepdims)
        if empty and any(x.shape[a] == 0 for a in _axes_of(x, axis)):
            raise ShapeError(f"{name}: cannot reduce an empty axis of shape {shape_of(x)} (axis {axis})")
        correction = params.get("correction")
        if correction is not None:
            n = reduced_count(x, axis)
            if n - correction <= 0:
                raise ShapeError(
                    f"{name}: {n} elements along axis {axis} of shape {shape_of(x)} leave no degrees "
                    f"of freedom with correction {correction}"
                )

    return check


def _primitive(name: str, forward: Any, vjp: Any, empty: bool = False) -> Primitive:
    return declare(name, forward, (vjp,), check=_checks(name, empty), batch=_REDUCTION, shape_rule=reduced)


# ---------------------------------------------------------------------------------------- max, min


def _extremum_vjp(xp: Any, d: Any, o: Any, x: Any, axis: Axis = None, keepdims: bool = False) -> Any:
    """The delta of ``max`` (or ``min``): the result's delta split evenly among the elements equal
    to the result (ties share it, as ``torch.amax``'s; a single extremum gets all of it)."""
    hit = xp.astype(x == _full(xp, o, x, axis, keepdims), x.dtype)
    count = xp.sum(hit, axis=_axes_of(x, axis), keepdims=True)
    return _full(xp, d, x, axis, keepdims) * (hit / count)


MAX: Final = _primitive(
    "max",
    lambda xp, x, axis=None, keepdims=False: reduce_axes(
        xp, xp.max(x, axis=axis, keepdims=keepdims), axis, keepdims
    ),
    _extremum_vjp,
    empty=True,
)
MIN: Final = _primitive(
    "min",
    lambda xp, x, axis=None, keepdims=False: reduce_axes(
        xp, xp.min(x, axis=axis, keepdims=keepdims), axis, keepdims
    ),
    _extremum_vjp,
    empty=True,
)

# --------------------------------------------------------------------------------------- logsumexp


def _logsumexp(xp: Any, x: Any, axis: Axis = None, keepdims: bool = False) -> Any:
    """``log(sum(e ** x))`` shifted by the maximum, ``m + log(sum(e ** (x - m)))``: no term
    overflows, and the largest is exactly 1, so the sum does not underflow. An infinite maximum is
    not subtracted (``inf - inf`` is NaN): all ``-inf`` gives ``-inf``, an ``inf`` gives ``inf``."""
    axes = _axes_of(x, axis)
    m = xp.max(x, axis=axes, keepdims=True)
    m = xp.where(xp.isfinite(m), m, 0.0)
    with np.errstate(divide="ignore"):  # log(0) of all -inf: -inf, as it should be
        out = xp.log(xp.sum(xp.exp(x - m), axis=axes, keepdims=True)) + m
    return _drop(xp, out, x, axis, keepdims)


def _logsumexp_vjp(xp: Any, d: Any, o: Any, x: Any, axis: Axis = None, keepdims: bool = False) -> Any:
    # the softmax of x along the axes, from the result: e ** (x - logsumexp)
    return _full(xp, d, x, axis, keepdims) * xp.exp(x - _full(xp, o, x, axis, keepdims))


LOGSUMEXP: Final = _primitive("logsumexp", _logsumexp, _logsumexp_vjp, empty=True)

# ---------------------------------------------------------------------------------------- var, std


def _centred(xp: Any, x: Any, axis: Axis) -> Any:
    """``x`` less its mean along ``axis`` (the first pass of a two-pass variance)."""
    axes = _axes_of(x, axis)
    return x - xp.sum(x, axis=axes, keepdims=True) / reduced_count(x, axis)


def _var(xp: Any, x: Any, axis: Axis = None, keepdims: bool = False, correction: float = 0.0) -> Any:
    """Two passes: the mean, then the mean square of the centred values (a one-pass
    ``E[x**2] - E[x]**2`` cancels when the mean is large against the spread)."""
    c = _centred(xp, x, axis)
    total = xp.sum(c * c, axis=_axes_of(x, axis), keepdims=keepdims)
    return reduce_axes(xp, total / (reduced_count(x, axis) - correction), axis, keepdims)


def _var_vjp(
    xp: Any, d: Any, o: Any, x: Any, axis: Axis = None, keepdims: bool = False, correction: float = 0.0
) -> Any:
    scale = 2.0 / (reduced_count(x, axis) - correction)
    return _full(xp, d, x, axis, keepdims) * (scale * _centred(xp, x, axis))


def _std_vjp(
    xp: Any, d: Any, o: Any, x: Any, axis: Axis = None, keepdims: bool = False, correction: float = 0.0
) -> Any:
    """``d * (x - mean) / ((n - correction) * std)``; 0 where the reduced elements are all equal
    (the std is a norm there, whose subgradients include 0). There the formula is ``0 / 0``, or,
    where their mean rounds, the rounding's residue over itself: about ``1 / n`` per element, all of
    one sign, along a direction (every element moved alike) that does not change the std."""
    axes = _axes_of(x, axis)
    equal = xp.max(x, axis=axes, keepdims=True) == xp.min(x, axis=axes, keepdims=True)
    s = _full(xp, o, x, axis, keepdims) * (reduced_count(x, axis) - correction)
    with np.errstate(divide="ignore", invalid="ignore"):  # 0 / 0, selected out
        slope = xp.where(equal | (s == 0.0), 0.0 * s, _centred(xp, x, axis) / s)
    return _full(xp, d, x, axis, keepdims) * slope


VAR: Final = _primitive("var", _var, _var_vjp)


def _std(xp: Any, x: Any, axis: Axis = None, keepdims: bool = False, correction: float = 0.0) -> Any:
    return _drop(xp, xp.sqrt(_var(xp, x, axis, True, correction)), x, axis, keepdims)


STD: Final = _primitive("std", _std, _std_vjp)

# ------------------------------------------------------------------------------- public functions


def _reduction(
    name: str, prim: Primitive, x: AnyArray, axis: Axis, keepdims: bool, **params: Any
) -> FloatLayer | ArrayLayer:
    array_operand(name, x)
    keep = flag_param(name, "keepdims", keepdims)
    if axis is None:
        if keep:
            raise TypeError(f"{name}: keepdims=True needs an axis (over all axes, the result is a float)")
        return apply_float(prim, x, **params)
    return apply_array(prim, x, axis=axis_param(name, axis), keepdims=keep, **params)


@overload
def max(x: AnyArray, axis: None = None) -> FloatLayer: ...
@overload
def max(x: AnyArray, axis: int | tuple[int, ...], *, keepdims: bool = False) -> ArrayLayer: ...
def max(x: AnyArray, axis: Axis = None, *, keepdims: bool = False) -> FloatLayer | ArrayLayer:
    """The largest element (a ``FloatLayer``), or the largest along ``axis`` (an ``ArrayLayer``).
    Ties share the delta evenly (as ``torch.amax``): where two elements are the maximum, each gets
    half. A NaN element makes the result NaN. An empty axis is an error."""
    return _reduction("max", MAX, x, axis, keepdims)


@overload
def min(x: AnyArray, axis: None = None) -> FloatLayer: ...
@overload
def min(x: AnyArray, axis: int | tuple[int, ...], *, keepdims: bool = False) -> ArrayLayer: ...
def min(x: AnyArray, axis: Axis = None, *, keepdims: bool = False) -> FloatLayer | ArrayLayer:
    """The smallest element, or the smallest along ``axis``; ties share the delta, as :func:`max`."""
    return _reduction("min", MIN, x, axis, keepdims)


@overload
def logsumexp(x: AnyArray, axis: None = None) -> FloatLayer: ...
@overload
def logsumexp(x: AnyArray, axis: int | tuple[int, ...], *, keepdims: bool = False) -> ArrayLayer: ...
def logsumexp(x: AnyArray, axis: Axis = None, *, keepdims: bool = False) -> FloatLayer | ArrayLayer:
    """``log(sum(exp(x)))`` over all elements or along ``axis``, computed stably (shifted by the
    maximum: no overflow for large ``x``, no ``log(0)`` for very negative ``x``). Its gradient is
    the softmax of ``x`` along the reduced axes."""
    return _reduction("logsumexp", LOGSUMEXP, x, axis, keepdims)


def _correction(name: str, correction: object) -> float:
    if isinstance(correction, (float, int, np.floating, np.integer)) and not isinstance(
        correction, (bool, np.bool_)
    ):
        value = float(correction)
        if value >= 0.0:
            return value
    raise TypeError(f"{name}: correction must be a float of at least 0, got {correction!r}")


@overload
def var(x: AnyArray, axis: None = None, *, correction: float = 0.0) -> FloatLayer: ...
@overload
def var(
    x: AnyArray, axis: int | tuple[int, ...], *, keepdims: bool = False, correction: float = 0.0
) -> ArrayLayer: ...
def var(
    x: AnyArray, axis: Axis = None, *, keepdims: bool = False, correction: float = 0.0
) -> FloatLayer | ArrayLayer:
    """Variance over all elements or along ``axis``: ``sum((x - mean) ** 2) / (n - correction)``
    (``correction=1.0``: the unbiased estimate; the array API's and NumPy's ``ddof``). Computed in
    two passes (the mean, then the squares of the centred values), which does not cancel when the
    mean is large against the spread. ``n - correction`` must be positive."""
    return _reduction("var", VAR, x, axis, keepdims, correction=_correction("var", correction))


@overload
def std(x: AnyArray, axis: None = None, *, correction: float = 0.0) -> FloatLayer: ...
@overload
def std(
    x: AnyArray, axis: int | tuple[int, ...], *, keepdims: bool = False, correction: float = 0.0
) -> ArrayLayer: ...
def std(
    x: AnyArray, axis: Axis = None, *, keepdims: bool = False, correction: float = 0.0
) -> FloatLayer | ArrayLayer:
    """Standard deviation, ``sqrt(var(x, axis, correction=correction))``. Where the reduced
    elements are all equal it has no derivative, and the delta given there is 0 (a subgradient),
    also where their mean rounds and the std computed is a few ulps, not 0. (PyTorch's is 0 only
    where the std computed is exactly 0, else about ``1 / n`` per element, of the rounding's sign.)"""
    return _reduction("std", STD, x, axis, keepdims, correction=_correction("std", correction))


# -------------------------------------------------------------------------------- argmax, argmin


def _value(name: str, x: object) -> Any:
    """The array of ``x``: an array as it is, a weight's data, a layer's forward value (computed
    now, its failure raised)."""
    if isinstance(x, ArrayWeight):
        return x.data
    if isinstance(x, ArrayLayer):
        result = x.predict_blocking()
        if not is_successful(result):
            raise result.failure()
        return result.unwrap()
    if is_array(x) and not isinstance(x, ArrayOperators):
        if getattr(getattr(x, "dtype", None), "kind", "f") not in "fiub":  # (NumPy's kinds)
            raise TypeError(f"{name}: expected an array of real numbers, got dtype {x.dtype}")  # type: ignore[attr-defined]
        return x
    raise TypeError(f"{name}: expected an array, array weight or array layer, got {type(x).__name__}")


def _index_of(name: str, x: object, axis: int | None, keepdims: bool, largest: bool) -> IndexArray:
    keep = flag_param(name, "keepdims", keepdims)  # the parameters first: a layer runs only if they are right
    ax = None if axis is None else index_int(axis)
    if axis is not None and ax is None:
        raise TypeError(f"{name}: axis must be an int or None, got {type(axis).__name__} {axis!r}")
    data = _value(name, x)
    if not data.ndim:
        raise ShapeError(f"{name}: expected an array of at least 1 dimension, got shape {shape_of(data)}")
    if ax is not None and not -data.ndim <= ax < data.ndim:
        raise ShapeError(f"{name}: axis {ax} is out of range for shape {shape_of(data)}")
    if (data.shape[ax] if ax is not None else math.prod(data.shape)) == 0:
        raise ShapeError(f"{name}: cannot take the index of an empty axis of shape {shape_of(data)}")
    xp = namespace(data)
    find = xp.argmax if largest else xp.argmin
    indices: IndexArray = xp.asarray(find(data, axis=ax, keepdims=keep))
    return indices


def argmax(x: AnyArray, axis: int | None = None, *, keepdims: bool = False) -> IndexArray:
    """The index of the largest element (of the flattened array, as a 0-d integer array), or the
    indices of the largest along ``axis``; the first one where there are ties (the array API's and
    NumPy's ``argmax``). A NaN counts as the largest (and as the smallest, for :func:`argmin`), as
    in NumPy and PyTorch. An array of integers or booleans has indices too; one of complex numbers
    or objects is a TypeError.

    Not an op: integers have no gradient and a layer's data is floating-point, so the result is a
    plain integer array of ``x``'s namespace. A weight gives its data's indices; a layer is run now
    (its forward value, as ``predict_blocking``; its failure raised). In a ``@batchable`` body,
    ``await`` the layer and take the indices of the array."""
    return _index_of("argmax", x, axis, keepdims, True)


def argmin(x: AnyArray, axis: int | None = None, *, keepdims: bool = False) -> IndexArray:
    """The index of the smallest element, or the indices of the smallest along ``axis`` (see
    :func:`argmax`)."""
    return _index_of("argmin", x, axis, keepdims, False)
