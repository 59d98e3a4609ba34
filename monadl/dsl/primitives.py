"""The primitive ops, as data: a forward, one vector-Jacobian product per input, a cost, checks.

The record types are the program's (``monadl.do.primitive``); this is the library's table. Adding
an op touches only this table (and, for a public name, ``ops.py``). Every rule is written
against an array namespace ``xp`` taken from the inputs, so it runs on NumPy, CuPy, array-api-strict
and, for elementwise ops, on Python floats (:data:`~monadl.typeclasses.backend.FLOATS`).

A vjp has the signature ``vjp(xp, delta, out, *inputs, **params)`` and returns the delta for its
input. For ops marked ``broadcasts``, the result is reduced back to the input's shape afterwards.

A few rules take a NumPy path of the same arithmetic where the generic one costs more in Python
than in computing (a batch's softmax): they are tested equal to the generic rule.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from typing import Any, Final

import numpy as np

from monadl.do.primitive import ELEMENTWISE, Batching, FanOut, Primitive, Rule, add_n, elementwise_cost
from monadl.dsl.fused import Kernel, on_cupy
from monadl.typeclasses.backend import (
    FLOATS,
    NDARRAY,
    NUMPY,
    ShapeError,
    host_in,
    minus_zeros,
    namespace_of_type,
    on_device,
    shape_of,
    unbroadcast,
)
from monadl.typeclasses.sparse import SparseRows

__all__ = ["ELEMENTWISE", "Batching", "FanOut", "Primitive", "Rule", "add_n", "elementwise_cost"]


# ---------------------------------------------------------------------------------------- helpers


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


def _log(xp: Any, x: Any) -> Any:
    """``log(x)`` for an operand that may be a Python float while ``xp`` is an array namespace."""
    return FLOATS.log(x) if type(x) is float else xp.log(x)


def _not_a_float(name: str, x: Any) -> None:
    """Raises a ShapeError naming op ``name`` for a float operand where it needs an array. The op
    itself rejects floats when it is made; a user's own differentiable value (a ``DeepLearning``)
    shows its kind only when it runs."""
    if type(x) is float:
        raise ShapeError(f"{name}: expected an array, got a float")


# ----------------------------------------------------------------------------------- elementwise


def _elementwise(name: str, forward: Rule, vjps: tuple[Rule, ...], broadcasts: bool = False) -> Primitive:
    return Primitive(name, forward, vjps, broadcasts, batch=ELEMENTWISE, fresh=True, own=True)


add = Primitive(
    "add",
    lambda xp, a, b: a + b,
    (lambda xp, d, o, a, b: d, lambda xp, d, o, a, b: d),
    True,
    passes=True,
    batch=ELEMENTWISE,
    fresh=True,
    own=True,
)
sub = _elementwise("sub", lambda xp, a, b: a - b, (lambda xp, d, o, a, b: d, lambda xp, d, o, a, b: -d), True)
mul = _elementwise(
    "mul", lambda xp, a, b: a * b, (lambda xp, d, o, a, b: d * b, lambda xp, d, o, a, b: d * a), True
)
div = _elementwise(
    "div",
    lambda xp, a, b: a / b,
    (lambda xp, d, o, a, b: d / b, lambda xp, d, o, a, b: -d * o / b),
    True,
)


def _pow_vjp_base(xp: Any, d: Any, o: Any, a: Any, b: Any) -> Any:
    """The delta of ``a`` in ``a ** b``: ``d * b * a ** (b - 1)``, 0 where ``b`` is 0 (as PyTorch).

    ``a ** 0`` is the constant 1, so its derivative is 0 everywhere; the formula gives
    ``0 * 0 ** -1 = 0 * inf = nan`` at ``a == 0``. A float exponent (``x ** 2``, the common case)
    is tested in Python, so an array's other elements are computed as before, without a select."""
    if type(b) is float:
        if b == 0.0:
            return xp.zeros_like(d) if type(d) is not float else 0.0
        return d * b * a ** (b - 1.0)
    with np.errstate(divide="ignore", invalid="ignore"):  # 0 ** -1 and 0 * inf, selected out
        return xp.where(b == 0.0, 0.0, d * b * a ** (b - 1.0))


def _pow_vjp_exponent(xp: Any, d: Any, o: Any, a: Any, b: Any) -> Any:
    """The delta of ``b`` in ``a ** b``: ``d * log(a) * a ** b``, 0 where ``a == 0`` and ``b >= 0``.

    There ``0 ** b`` is constant (0, or 1 at b == 0) and the formula gives ``-inf * 0 = nan`` (b > 0)
    or ``-inf`` (b == 0, where the power has no derivative: 0, as PyTorch gives). Elsewhere, a
    zero base with a negative exponent included, the result is the formula's, bit for bit."""
    if type(a) is float:  # a float base: one test in Python, no select unless it is 0
        if a != 0.0:
            return d * _log(xp, a) * o
        zero = b >= 0.0
    elif type(b) is float:
        if b < 0.0:
            return d * _log(xp, a) * o
        zero = a == 0.0
    else:
        zero = (a == 0.0) & (b >= 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):  # log(0) and -inf * 0, selected out
        return xp.where(zero, 0.0, d * _log(xp, a) * o)


power = _elementwise("pow", lambda xp, a, b: a**b, (_pow_vjp_base, _pow_vjp_exponent), True)
maximum = _elementwise(
    "maximum",
    lambda xp, a, b: xp.maximum(a, b),
    (lambda xp, d, o, a, b: xp.where(a >= b, d, 0.0), lambda xp, d, o, a, b: xp.where(a >= b, 0.0, d)),
    True,
)
minimum = _elementwise(
    "minimum",
    lambda xp, a, b: xp.minimum(a, b),
    (lambda xp, d, o, a, b: xp.where(a <= b, d, 0.0), lambda xp, d, o, a, b: xp.where(a <= b, 0.0, d)),
    True,
)
neg = _elementwise("neg", lambda xp, x: -x, (lambda xp, d, o, x: -d,))
exp = _elementwise("exp", lambda xp, x: xp.exp(x), (lambda xp, d, o, x: d * o,))
log = _elementwise("log", lambda xp, x: xp.log(x), (lambda xp, d, o, x: d / x,))
sqrt = _elementwise("sqrt", lambda xp, x: xp.sqrt(x), (lambda xp, d, o, x: d * 0.5 / o,))
absolute = _elementwise("abs", lambda xp, x: xp.abs(x), (lambda xp, d, o, x: d * xp.sign(x),))

# The activations' rules as one kernel each on CuPy arrays (``monadl.dsl.fused``): the same
# operations in the same order as the rules below, one pass instead of one per operator.
_TANH_VJP = Kernel("tanhvjp", ("d", "y"), (), ("dx",), ("dx = d * (T(1.0) - y * y)",))
_SIGMOID = Kernel("sigmoid", ("x",), (), ("y",), ("y = T(1.0) / (T(1.0) + exp(-x))",))
_SIGMOID_VJP = Kernel("sigmoidvjp", ("d", "y"), (), ("dx",), ("dx = d * y * (T(1.0) - y)",))


def _tanh_vjp(xp: Any, d: Any, o: Any, x: Any) -> Any:
    if xp is not NUMPY and on_cupy(d, o):
        return _TANH_VJP((d, o), ())[0]
    return d * (1.0 - o * o)


tanh = _elementwise("tanh", lambda xp, x: xp.tanh(x), (_tanh_vjp,))


def sigmoid_of(xp: Any, x: Any) -> Any:
    """``1 / (1 + exp(-x))``, accurate to a few ulps wherever the result is a normal number.

    ``exp(-x)`` and the sum keep their relative error of an ulp or so, and a quotient adds half an
    ulp, at every x: no difference of nearly equal values. (``0.5 * (1 + tanh(x / 2))``, as it was,
    cancels for negative x: all its digits were gone below -38 in float64, -18 in float32, so
    ``log(sigmoid(x))`` was infinite.) For x below -log(max float) (-709.8 in float64, -88.7 in
    float32) ``exp(-x)`` overflows to inf and the result is 0 where the exact one is subnormal;
    the overflow is expected there, not warned of. One exp, as fast as this can be in NumPy: an
    ``exp(-|x|)`` form, which cannot overflow, needs a select (``where``), which costs NumPy twice
    as much as the exp itself."""
    with np.errstate(over="ignore"):
        return _sigmoid(xp, x)


def sigmoids_of(xp: Any, a: Any, b: Any) -> tuple[Any, Any]:
    """:func:`sigmoid_of` of two arrays (an LSTM's or a GRU's gates), under one ``errstate``."""
    with np.errstate(over="ignore"):
        return _sigmoid(xp, a), _sigmoid(xp, b)


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
# and the product is good to a few ulps (an accurate s matters there: the old one was 0 below -38).
# For large positive x, 1 - s cancels, but only to an absolute error of about eps * |d| (the
# rounding of s near 1): large relative error only in a gradient below the rounding of whatever it
# is added to. (An exact form, d * s / (1 + exp(x)), would add an exp to every gate's backward:
# 3 times the vjp's time.)
def _sigmoid_vjp(xp: Any, d: Any, o: Any, x: Any) -> Any:
    if xp is not NUMPY and on_cupy(d, o):
        return _SIGMOID_VJP((d, o), ())[0]
    return d * o * (1.0 - o)


sigmoid = _elementwise("sigmoid", sigmoid_of, (_sigmoid_vjp,))


def _relu_vjp(xp: Any, d: Any, o: Any, x: Any) -> Any:
    # d times the mask of the units that are on: one multiplication (``where`` is scalar code in
    # NumPy: twice as slow at every size measured). A unit that is off gives d * 0: a zero (of d's
    # sign), or NaN where d itself is not finite.
    on = x > 0.0
    if xp is NUMPY or xp is FLOATS:
        return d * on
    return d * xp.astype(on, d.dtype)  # the array API multiplies no floats by bools


relu = _elementwise("relu", lambda xp, x: xp.maximum(x, 0.0), (_relu_vjp,))

# ------------------------------------------------------------------------------------ reductions


def check_axes(name: str) -> Callable[..., None]:
    """A reduction's check: every axis within the operand's rank, none twice. (Merged calls shift
    their axes past the rows' axis, where an out-of-range negative axis would be the rows'.)"""

    def check(x: Any, axis: Any = None, keepdims: bool = False) -> None:
        _not_a_float(name, x)
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


sum_ = Primitive(
    "sum",
    lambda xp, x, axis=None, keepdims=False: reduce_axes(
        xp, xp.sum(x, axis=axis, keepdims=keepdims), axis, keepdims
    ),
    (lambda xp, d, o, x, axis=None, keepdims=False: expand_to(xp, d, x, axis, keepdims),),
    check=check_axes("sum"),
    batch=Batching(axis=True, scalar="reduce"),
    fresh=True,
    own=True,
)
mean = Primitive(
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
    fresh=True,
    own=True,
)

# ----------------------------------------------------------------------------------------- shape


def _check_reshape(x: Any, shape: tuple[int, ...]) -> None:
    _not_a_float("reshape", x)
    known = math.prod(n for n in shape if n != -1)
    total = math.prod(x.shape)
    # (A -1 among sides of no elements could be any side: NumPy refuses it.)
    unknown = -1 in shape
    if shape.count(-1) > 1 or (not unknown and known != total) or (unknown and (not known or total % known)):
        raise ShapeError(f"reshape: cannot reshape an array of shape {tuple(x.shape)} to {shape}")


reshape = Primitive(
    "reshape",
    lambda xp, x, shape: xp.reshape(x, shape),
    (lambda xp, d, o, x, shape: xp.reshape(d, x.shape),),
    check=_check_reshape,
    fresh=True,
    own=True,
)


def _axes(x: Any, axes: tuple[int, ...] | None) -> tuple[int, ...]:
    return tuple(reversed(range(x.ndim))) if axes is None else axes


def _inverse(axes: tuple[int, ...]) -> tuple[int, ...]:
    inverse = [0] * len(axes)
    for i, a in enumerate(axes):
        inverse[a] = i
    return tuple(inverse)


def _check_transpose(x: Any, axes: tuple[int, ...] | None) -> None:
    _not_a_float("transpose", x)
    n = x.ndim
    if axes is not None and (
        any(not -n <= a < n for a in axes) or sorted(a % n for a in axes) != list(range(n))
    ):
        raise ShapeError(f"transpose: axes {axes} do not fit an array of shape {tuple(x.shape)}")


transpose = Primitive(
    "transpose",
    lambda xp, x, axes=None: xp.permute_dims(x, _axes(x, axes)),
    (lambda xp, d, o, x, axes=None: xp.permute_dims(d, _inverse(_axes(x, axes))),),
    check=_check_transpose,
    fresh=True,
    own=True,
)


def _concat_vjp(i: int) -> Rule:
    def vjp(xp: Any, d: Any, o: Any, *xs: Any, axis: int = 0) -> Any:
        ax = axis % d.ndim
        start = sum(x.shape[ax] for x in xs[:i])
        index = (*(slice(None),) * ax, slice(start, start + xs[i].shape[ax]), ...)
        return d[index]

    return vjp


def _check_concat(*xs: Any, axis: int = 0) -> None:
    for x in xs:
        _not_a_float("concatenate", x)
    shapes = [tuple(x.shape) for x in xs]
    ndim = len(shapes[0])
    if any(len(s) != ndim for s in shapes) or not -ndim <= axis < ndim:
        raise ShapeError(f"concatenate: arrays of shapes {shapes} cannot be joined along axis {axis}")
    ax = axis % ndim
    if any(s[:ax] + s[ax + 1 :] != shapes[0][:ax] + shapes[0][ax + 1 :] for s in shapes):
        raise ShapeError(f"concatenate: arrays of shapes {shapes} differ off axis {axis}")


_concat_rules: dict[int, Primitive] = {}


def concatenate(n: int) -> Primitive:
    """The concatenation of ``n`` arrays (one primitive per arity: each input has its own vjp)."""
    prim = _concat_rules.get(n)
    if prim is None:
        prim = Primitive(
            "concatenate",
            lambda xp, *xs, axis=0: xp.concat(xs, axis=axis),
            tuple(_concat_vjp(i) for i in range(n)),
            check=_check_concat,
            batch=Batching(axis=True, axis_default=0, joins_rows=True),
            fresh=True,
            own=True,
        )
        _concat_rules[n] = prim
    return prim


def _scatter_rows(xp: Any, table: Any, indices: Any, d: Any) -> SparseRows:
    """The delta of ``take(table, indices, axis=0)``: the rows of ``d`` at ``indices``, as a
    :class:`~monadl.typeclasses.sparse.SparseRows` (no dense table: repeated indices add when it
    is summed or densified)."""
    flat = xp.reshape(host_in(xp, indices, d), (-1,))
    rows = xp.reshape(d, (flat.shape[0], *table.shape[1:]))
    return SparseRows(flat, rows, table.shape)


def _check_take(table: Any, indices: Any) -> None:
    _not_a_float("take_rows", table)
    if table.ndim == 0:
        raise ShapeError("take_rows: cannot index rows of a 0-d array")


def _check_take_range(table: Any, indices: Any, **_: Any) -> None:
    n = table.shape[0]
    if not indices.shape:  # one row (a word)
        lo = hi = int(indices)
    elif math.prod(indices.shape):
        xp = namespace_of_type(type(indices), indices)  # (CuPy's arrays have no __array_namespace__)
        lo, hi = int(xp.min(indices)), int(xp.max(indices))
    else:
        return
    if lo < 0 or hi >= n:
        raise ShapeError(
            f"take_rows: row index {lo if lo < 0 else hi} is out of range for a table of shape "
            f"{tuple(table.shape)}"
        )


def _check_take_merged(inputs: tuple[Any, ...], merged: dict[str, Any]) -> None:
    # The calls share the table and their indices have one shape: the stacked indices' range is
    # theirs together.
    _check_take_range(inputs[0], merged["indices"])


take_rows = Primitive(
    "take_rows",
    lambda xp, table, indices: xp.reshape(
        xp.take(table, xp.reshape(host_in(xp, indices, table), (-1,)), axis=0),
        tuple(indices.shape) + tuple(table.shape[1:]),
    ),
    (lambda xp, d, o, table, indices: _scatter_rows(xp, table, indices, d),),
    cost=lambda table, indices: float(math.prod(indices.shape) * math.prod(table.shape[1:])),
    check=_check_take,
    # one table, the indices stacked: one sparse delta
    batch=Batching(shared=(0,), row_params=("indices",), check_merged=_check_take_merged),
    check_values=_check_take_range,
    per_run=("indices",),
    fresh=True,
    own=True,
)

# --------------------------------------------------------------------------------------- slicing

# An index of ``getitem`` (NumPy's basic indexing: ``x[:, 1:3]``, ``x[..., 0]``, ``x[None]``) is a
# tuple of entries: an int, None, the Ellipsis (one, always: put last when the key has none, as the
# array API wants it) and slices as ``(start, stop, step)`` tuples (a slice is no dictionary key
# before Python 3.12, and a primitive's parameters are hashed to merge and replay its calls). The
# parameter ``axis`` is the first axis the index applies to: the axes before it are taken whole.
# It is 0 for a call, and 1 for merged calls (``Batching(axis=True)`` shifts it past the rows).

_WHOLE = slice(None)


def index_int(value: object) -> int | None:
    """``value`` as an int if it is an int or a NumPy integer (not a bool), else None."""
    if type(value) is int:
        return value
    if isinstance(value, np.integer):
        return int(value)
    return None


def _slice_bound(s: slice, value: object) -> int | None:
    if value is None:
        return None
    i = index_int(value)
    if i is None:
        raise TypeError(f"getitem: slice bounds must be ints or None, got {s!r}")
    return i


def basic_index(key: object) -> tuple[Any, ...]:
    """``key`` (``layer[key]``: a slice, the Ellipsis, or a tuple of ints, slices, None and ...) as the
    ``index`` parameter of :data:`getitem`; a TypeError or ValueError naming ``getitem`` for
    anything else."""
    entries = key if type(key) is tuple else (key,)
    index: list[Any] = []
    ellipsis = False
    for e in entries:
        if e is None:
            index.append(None)
        elif e is Ellipsis:
            if ellipsis:
                raise ValueError("getitem: an index can have only one ellipsis (...)")
            ellipsis = True
            index.append(Ellipsis)
        elif type(e) is slice:
            step = _slice_bound(e, e.step)
            if step == 0:
                raise ValueError(f"getitem: slice step cannot be zero, got {e!r}")
            index.append((_slice_bound(e, e.start), _slice_bound(e, e.stop), step))
        else:
            i = index_int(e)
            if i is None:
                what = type(e).__name__
                raise TypeError(
                    f"getitem: expected ints, slices, None or ... in an index, got {what} {e!r} (rows "
                    "by an integer array or list are an index of their own: layer[rows], take_rows)"
                )
            index.append(i)
    if not ellipsis:
        index.append(Ellipsis)
    return tuple(index)


def index_key(index: tuple[Any, ...], axis: int) -> tuple[Any, ...]:
    """``index`` as NumPy takes it: its slices made, ``axis`` whole axes before it."""
    key: list[Any] = [_WHOLE] * axis
    for e in index:
        key.append(slice(e[0], e[1], e[2]) if type(e) is tuple else e)
    return tuple(key)


def _standard_slice(s: slice, n: int) -> slice:
    """``s`` on an axis of length ``n``, with bounds within the axis: the array API specifies no
    others (NumPy clips them)."""
    r = range(*s.indices(n))
    if not r:
        return slice(0, 0, 1)
    last = r[-1]
    if r.step > 0:
        return slice(r.start, last + 1, r.step)
    return slice(r.start, last - 1 if last > 0 else None, r.step)


def _standard_key(key: tuple[Any, ...], shape: tuple[int, ...]) -> tuple[Any, ...]:
    """``key`` (of one Ellipsis) with the bounds of its slices within their axes."""
    indexed = 0
    for e in key:
        if e is not None and e is not Ellipsis:
            indexed += 1
    out: list[Any] = []
    dim = 0
    for e in key:
        if e is Ellipsis:
            dim += len(shape) - indexed
        elif e is not None:
            if type(e) is slice:
                e = _standard_slice(e, shape[dim])
            dim += 1
        out.append(e)
    return tuple(out)


def _key_for(xp: Any, key: tuple[Any, ...], x: Any) -> tuple[Any, ...]:
    """``key`` as namespace ``xp`` takes it: NumPy's (and CuPy's) as it is, the array API's with
    the bounds of its slices within their axes."""
    return key if xp is NUMPY else _standard_key(key, tuple(x.shape))


def _scatter(xp: Any, x: Any, key: tuple[Any, ...], d: Any) -> Any:
    """The delta of ``x[key]``: ``d`` in zeros of ``x``'s shape (``key`` of no repeated element:
    a basic index)."""
    if None in key:  # new axes of one element: the delta without them
        key = tuple([e for e in key if e is not None])
        d = xp.reshape(d, tuple(x[key].shape))
    g = xp.zeros_like(x, dtype=d.dtype)
    g[key] = d
    return g


def _check_getitem(x: Any, index: tuple[Any, ...], axis: int = 0) -> None:
    _not_a_float("getitem", x)
    shape = tuple(x.shape)
    indexed = 0
    for e in index:
        if e is not None and e is not Ellipsis:
            indexed += 1
    if indexed > len(shape) - axis:
        raise ShapeError(f"getitem: {indexed} indices are too many for an array of shape {shape}")
    dim = axis
    for e in index:
        if e is Ellipsis:
            dim += len(shape) - axis - indexed
        elif e is not None:
            if type(e) is int and not -shape[dim] <= e < shape[dim]:
                raise ShapeError(f"getitem: index {e} is out of range for axis {dim} of shape {shape}")
            dim += 1


getitem = Primitive(
    "getitem",
    lambda xp, x, index, axis=0: x[_key_for(xp, index_key(index, axis), x)],
    (lambda xp, d, o, x, index, axis=0: _scatter(xp, x, _key_for(xp, index_key(index, axis), x), d),),
    check=_check_getitem,
    # the index applies past the rows' axis: ``axis``, shifted (the rows are taken whole)
    batch=Batching(axis=True, axis_default=0),
    fresh=True,
    own=True,
)


def _split_key(x: Any, sections: int | tuple[int, ...], piece: int, axis: int) -> tuple[Any, ...]:
    """The index of piece ``piece`` of ``x`` split along ``axis`` (as ``numpy.split``)."""
    n = x.shape[axis]
    if isinstance(sections, int):
        size = n // sections
        part = slice(piece * size, (piece + 1) * size)
    else:
        bounds = (0, *sections, n)
        part = slice(bounds[piece], bounds[piece + 1])
    if axis >= 0:
        return (*(_WHOLE,) * axis, part, Ellipsis)
    return (Ellipsis, part, *(_WHOLE,) * (-axis - 1))


def _check_split(x: Any, sections: int | tuple[int, ...], piece: int, axis: int = 0) -> None:
    _not_a_float("split", x)
    if not -x.ndim <= axis < x.ndim:
        raise ShapeError(f"split: axis {axis} is out of range for shape {shape_of(x)}")
    n = x.shape[axis]
    if isinstance(sections, int) and n % sections:
        raise ShapeError(f"split: {sections} sections do not divide axis {axis} of length {n}")


# One piece of ``split``: ``sections`` (their number, or the indices they start at) and the piece
# are parameters, so the four gates of an LSTM are four ops, each merged over the cells.
split = Primitive(
    "split",
    lambda xp, x, sections, piece, axis=0: x[_key_for(xp, _split_key(x, sections, piece, axis), x)],
    (
        lambda xp, d, o, x, sections, piece, axis=0: _scatter(
            xp, x, _key_for(xp, _split_key(x, sections, piece, axis), x), d
        ),
    ),
    check=_check_split,
    batch=Batching(axis=True, axis_default=0),
    fresh=True,
    own=True,
)


def _stack_vjp(i: int) -> Rule:
    def vjp(xp: Any, d: Any, o: Any, *xs: Any, axis: int = 0) -> Any:
        return d[(*(_WHOLE,) * (axis % d.ndim), i, Ellipsis)]

    return vjp


def _check_stack(*xs: Any, axis: int = 0) -> None:
    for x in xs:
        _not_a_float("stack", x)
    shapes = [tuple(x.shape) for x in xs]
    for s in shapes:
        if s != shapes[0]:
            raise ShapeError(f"stack: arrays of shapes {shapes} differ (stacked arrays need one shape)")
    ndim = len(shapes[0]) + 1
    if not -ndim <= axis < ndim:
        raise ShapeError(f"stack: axis {axis} is out of range for stacking arrays of shape {shapes[0]}")


_stack_rules: dict[int, Primitive] = {}


def stack(n: int) -> Primitive:
    """``n`` arrays of one shape stacked along a new ``axis`` (one primitive per arity, as
    :func:`concatenate`)."""
    prim = _stack_rules.get(n)
    if prim is None:
        prim = Primitive(
            "stack",
            lambda xp, *xs, axis=0: xp.stack(xs, axis=axis),
            tuple(_stack_vjp(i) for i in range(n)),
            check=_check_stack,
            # the new axis counts past the rows' axis (a negative one, from the end, is the same);
            # alone, rows of groups are gathered (the steps of a sequence layer)
            batch=Batching(axis=True, axis_default=0, stacks_rows=True),
            fresh=True,
            own=True,
        )
        _stack_rules[n] = prim
    return prim


# ---------------------------------------------------------------------------------------- matmul


def _check_matmul(name: str) -> Callable[..., None]:
    """The check of ``matmul`` or ``dot`` (named ``name``): operands of at least one axis, aligned."""

    def check(a: Any, b: Any) -> None:
        if type(a) is float or type(b) is float or a.ndim == 0 or b.ndim == 0:
            raise ShapeError(
                f"{name}: operands must be arrays of at least 1 dimension, "
                f"got {shape_of(a)} and {shape_of(b)}"
            )
        k_b = b.shape[0] if b.ndim == 1 else b.shape[-2]
        if a.shape[-1] != k_b:
            raise ShapeError(
                f"{name}: shapes {tuple(a.shape)} and {tuple(b.shape)} are not aligned "
                f"({a.shape[-1]} != {k_b})"
            )

    return check


def _as_matrices(xp: Any, d: Any, a: Any, b: Any) -> tuple[Any, Any, Any]:
    """Promotes 1-d operands (and the delta) to matrices, as matmul itself does."""
    if a.ndim == 1:
        a = xp.expand_dims(a, axis=0)
        d = xp.expand_dims(d, axis=-2) if b.ndim > 1 else xp.expand_dims(d, axis=0)
    if b.ndim == 1:
        b = xp.expand_dims(b, axis=-1)
        d = xp.expand_dims(d, axis=-1)
    return d, a, b


def _mm(xp: Any, a: Any, b: Any) -> Any:
    """``a @ b``; on NumPy matrices ``np.dot``, which hands a transposed view to BLAS where
    ``np.matmul`` falls back to its own loop when a side is a single row or column (10x slower)."""
    if xp is NUMPY and a.ndim == 2 and b.ndim == 2:
        return np.dot(a, b)
    return xp.matmul(a, b)


def _matmul_vjp_a(xp: Any, d: Any, o: Any, a: Any, b: Any) -> Any:
    if a.ndim == 2 and b.ndim == 2:  # the common case, without the promotions below
        return _mm(xp, d, b.mT)
    d2, a2, b2 = _as_matrices(xp, d, a, b)
    return _shaped(xp, unbroadcast(xp, xp.matmul(d2, xp.matrix_transpose(b2)), a2), a.shape)


def _matmul_vjp_b(xp: Any, d: Any, o: Any, a: Any, b: Any) -> Any:
    if a.ndim == 2 and b.ndim == 2:
        return _mm(xp, a.mT, d)
    d2, a2, b2 = _as_matrices(xp, d, a, b)
    return _shaped(xp, unbroadcast(xp, xp.matmul(xp.matrix_transpose(a2), d2), b2), b.shape)


def _shaped(xp: Any, g: Any, shape: tuple[int, ...]) -> Any:
    """``g`` in ``shape``; ``g`` itself when it has it (a reshape to its own shape is a view in
    NumPy, and a gradient that is a view cannot take its weight's update in place: see
    ``training._handed_over``; a stacked weight's, (20, 64, 64) in the CIFAR model, came this way)."""
    return g if tuple(g.shape) == tuple(shape) else xp.reshape(g, shape)


def _matmul_weight(xp: Any, d: Any, o: Any, a: Any, b: Any) -> Any:
    """A matrix ``b``'s delta as a product of rows (of ``a`` and of the delta)."""
    if type(a) is float or a.ndim > 2 or type(b) is float or b.ndim != 2:
        return None
    return _rows(xp, a), _rows(xp, d)


def _matmul(name: str) -> Primitive:
    return Primitive(
        name,
        lambda xp, a, b: xp.matmul(a, b),
        (_matmul_vjp_a, _matmul_vjp_b),
        products={1: _matmul_weight},
        cost=lambda a, b: float(math.prod(a.shape) * (b.shape[-1] if b.ndim > 1 else 1)),
        check=_check_matmul(name),
        batch=Batching(shared=(1,), mergeable=lambda a, b: type(b) is float or b.ndim <= 2),
        fresh=True,
        own=True,
    )


matmul = _matmul("matmul")
# ``dot`` is matmul under the name its caller used, so that its errors name it. (Its calls and
# matmul's do not merge with each other: a model uses one spelling or the other.)
dot = _matmul("dot")

# ---------------------------------------------------------------------------------------- linear


def _check_linear(x: Any, w: Any, b: Any) -> None:
    if type(x) is float or x.ndim == 0 or type(w) is float or w.ndim != 2:
        raise ShapeError(
            f"linear: needs x of at least 1 dimension and a 2-d w, got {shape_of(x)} and {shape_of(w)}"
        )
    if x.shape[-1] != w.shape[0]:
        raise ShapeError(
            f"linear: shapes {tuple(x.shape)} and {tuple(w.shape)} are not aligned "
            f"({x.shape[-1]} != {w.shape[0]})"
        )
    if type(b) is not float and tuple(b.shape) not in ((), (w.shape[1],)):
        raise ShapeError(f"linear: bias of shape {tuple(b.shape)} does not fit {w.shape[1]} outputs")


def _rows(xp: Any, a: Any) -> Any:
    """``a`` as a matrix of rows (its last axis kept). The rows are counted, not left to a -1:
    an array with no elements has any number of rows of none (NumPy refuses the -1 there)."""
    return a if a.ndim == 2 else xp.reshape(a, (math.prod(a.shape[:-1]), a.shape[-1]))


_JOINED_MAX_BYTES: Final = 1 << 18
"""The largest weights (together) whose joined copy :func:`_joined` keeps: where a product's fixed
cost matters (a recurrent cell's gates on a few rows), the joined copy is small."""
_JOINED_KEPT: Final = 64
"""How many joined weights :func:`_joined` keeps (the oldest goes first): the fans of one step, of
a 32-layer bidirectional LSTM's cells too (at most 32 MB, with the arrays they were joined from)."""
_joined_weights: dict[tuple[object, ...], tuple[tuple[Any, ...], Any, Any]] = {}
_JOINING: Final = threading.Lock()


def _joined(w: tuple[Any, ...], b: tuple[Any, ...]) -> tuple[Any, Any] | None:
    """The k weights of a fan side by side, (inputs, k * outputs), and their biases as one vector;
    None unless they are small frozen NumPy arrays of one dtype (the biases such arrays or floats).

    A recurrent cell's k gates run once per step of every sequence with the same weights: joining
    them once (a copy of the weights, about as long as a product of a few rows) makes each run one
    product instead of k. Frozen (read-only) arrays never change, and each is kept alive with its
    joined copy, so an array's identity stands for its contents; a weight's next version is a new
    array (an optimizer writes fresh ones). (The key: an array's id, a float bias as a 1-tuple.)"""
    key: list[object] = []
    for a in w:
        key.append(id(a))
    for a in b:
        key.append((a,) if type(a) is float else id(a))
    found = _joined_weights.get(tuple(key))
    if found is not None:  # (its arrays are alive, kept by the entry: the ids are still theirs)
        return found[1], found[2]
    first = w[0]
    dtype = first.dtype
    if dtype.itemsize * first.size * len(w) > _JOINED_MAX_BYTES:
        return None
    for a in (*w, *b):
        if type(a) is not float and (type(a) is not NDARRAY or a.flags.writeable or a.dtype != dtype):
            return None
    outputs = first.shape[1]
    joined = np.concatenate(w, axis=1)
    biases = np.concatenate([np.broadcast_to(np.asarray(v, dtype=dtype), (outputs,)) for v in b])
    joined.flags.writeable = biases.flags.writeable = False
    with _JOINING:  # (kernels may run on a pool: one eviction at a time)
        if len(_joined_weights) >= _JOINED_KEPT:
            del _joined_weights[next(iter(_joined_weights))]
        _joined_weights[tuple(key)] = ((*w, *b), joined, biases)
    return joined, biases


def _fan_linear(xp: Any, x: Any, w: tuple[Any, ...], b: tuple[Any, ...]) -> Any:
    """k calls ``x @ w[j] + b[j]`` of one ``x``, as a (k, ..., outputs) array. On NumPy one product
    by the joined weights where they are small (:func:`_joined`), else a matmul per weight into one
    result (a copy of large weights would cost more than the products of a few rows)."""
    rows = _rows(xp, x)
    k, outputs = len(w), w[0].shape[1]
    joined = _joined(w, b) if xp is NUMPY and type(rows) is NDARRAY and rows.dtype == w[0].dtype else None
    if joined is not None:
        product = np.dot(rows, joined[0])
        product += joined[1]
        out = np.ascontiguousarray(product.reshape(rows.shape[0], k, outputs).transpose(1, 0, 2))
    elif xp is NUMPY:
        out = np.empty((k, rows.shape[0], outputs), dtype=np.result_type(rows, w[0], b[0]))
        for j in range(k):
            np.matmul(rows, w[j], out=out[j])
            out[j] += b[j]
    else:  # one batched matmul: on a GPU, one launch for the k products
        ws = xp.stack(w)
        bs = xp.asarray(b, dtype=ws.dtype, **on_device(xp, ws)) if type(b[0]) is float else xp.stack(b)
        out = xp.matmul(rows, ws) + xp.reshape(bs, (k, 1, -1))
    return xp.reshape(out, (k, *x.shape[:-1], outputs))


def _fan_linear_rows(xp: Any, d: Any, w: tuple[Any, ...]) -> Any:
    """The stacked delta as (k, rows, outputs) (the rows counted, as in ``_rows``)."""
    return xp.reshape(d, (len(w), math.prod(d.shape[1:-1]), w[0].shape[1]))


def _fan_linear_vjp_x(xp: Any, d: Any, o: Any, x: Any, w: tuple[Any, ...], b: tuple[Any, ...]) -> Any:
    d = _fan_linear_rows(xp, d, w)
    joined = _joined(w, b) if xp is NUMPY and type(d) is NDARRAY and d.dtype == w[0].dtype else None
    if joined is not None:  # one product by the joined weights: the k deltas side by side
        sides = d.transpose(1, 0, 2).reshape(d.shape[1], d.shape[0] * d.shape[2])
        return np.dot(sides, joined[0].T).reshape(x.shape)
    g = _mm(xp, d[0, ...], w[0].mT)
    for j in range(1, len(w)):
        g = g + _mm(xp, d[j, ...], w[j].mT)
    return xp.reshape(g, x.shape)


def _fan_linear_vjp_b(xp: Any, d: Any, o: Any, x: Any, w: tuple[Any, ...], b: tuple[Any, ...]) -> Any:
    g = xp.sum(_fan_linear_rows(xp, d, w), axis=1)  # (k, outputs)
    return g if type(b[0]) is not float and b[0].ndim == 1 else xp.sum(g, axis=1)  # scalar biases: (k,)


def _fan_linear_vjp_w(xp: Any, d: Any, o: Any, x: Any, w: tuple[Any, ...], b: tuple[Any, ...]) -> Any:
    """The weights' deltas, (k, in, out): one product of the rows with every call's delta side by
    side, ``x.T @ [d_1 ... d_k]`` (a batched matmul of the k calls falls off BLAS for few rows)."""
    rows = _rows(xp, x)
    k, outputs = len(w), w[0].shape[1]
    sides = xp.reshape(xp.permute_dims(_fan_linear_rows(xp, d, w), (1, 0, 2)), (rows.shape[0], k * outputs))
    g = _mm(xp, rows.mT, sides)  # (in, k * out)
    return xp.permute_dims(xp.reshape(g, (rows.shape[1], k, outputs)), (1, 0, 2))


def _fan_biases(xp: Any, d: Any, o: Any, x: Any, w: tuple[Any, ...], b: tuple[Any, ...]) -> Any:
    """The biases' deltas as products of rows (sums of each call's delta rows), for vector biases."""
    if type(b[0]) is float or b[0].ndim != 1:
        return None
    return None, _fan_linear_rows(xp, d, w)


_FAN_LINEAR = FanOut(
    shared=(0,),
    forward=_fan_linear,
    vjps=(_fan_linear_vjp_x, _fan_linear_vjp_w, _fan_linear_vjp_b),
    products={
        1: lambda xp, d, o, x, w, b: (_rows(xp, x), _fan_linear_rows(xp, d, w)),
        2: _fan_biases,
    },
)


# x @ w + b in one op: every dense layer's forward, one kernel and one tape instead of two.
def _linear(xp: Any, x: Any, w: Any, b: Any) -> Any:
    """``x @ w + b``; on NumPy matrices, the bias added into the product's own array (one array
    and one pass less), where that keeps the sum's dtype."""
    if xp is NUMPY and x.ndim <= 2:
        y = np.dot(x, w)
        if type(b) is float or (type(b) is NDARRAY and b.dtype == y.dtype and b.ndim <= 1):
            y += b
            return y
        return y + b
    return xp.matmul(x, w) + b


def _linear_vjp_x(xp: Any, d: Any, o: Any, x: Any, w: Any, b: Any) -> Any:
    return _mm(xp, d, w.mT)


def _linear_vjp_w(xp: Any, d: Any, o: Any, x: Any, w: Any, b: Any) -> Any:
    if x.ndim == 1:  # one row: an outer product, which a broadcast multiplication does faster than matmul
        return xp.reshape(x, (-1, 1)) * xp.reshape(d, (1, -1))
    return _mm(xp, _rows(xp, x).mT, _rows(xp, d))


def _linear_bias(xp: Any, d: Any, o: Any, x: Any, w: Any, b: Any) -> Any:
    """A vector bias's delta as a sum of rows."""
    return None if type(b) is float or b.ndim != 1 else (None, _rows(xp, d))


linear = Primitive(
    "linear",
    _linear,
    (_linear_vjp_x, _linear_vjp_w, lambda xp, d, o, x, w, b: unbroadcast(xp, d, b)),
    products={1: lambda xp, d, o, x, w, b: (_rows(xp, x), _rows(xp, d)), 2: _linear_bias},
    cost=lambda x, w, b: float(math.prod(x.shape) * w.shape[1]),
    check=_check_linear,
    # x's rows stacked: the calls' x @ w become one matmul; or, for calls of one x with different
    # weights, one kernel (FanOut)
    batch=Batching(shared=(1, 2), fan=_FAN_LINEAR),
    fresh=True,
    own=True,
)

# ------------------------------------------------------------------------------ softmax and loss


def _log_softmax(xp: Any, x: Any, axis: int) -> Any:
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
    # The array API has no put_along_axis: the maxima's 1s are taken out by a mask, all of them
    # (their count less one added back).
    shifted = x - xp.max(x, axis=axis, keepdims=True)
    top = xp.astype(shifted == 0.0, shifted.dtype)  # the array API subtracts no bools from floats
    rest = xp.sum(xp.exp(shifted) - top, axis=axis, keepdims=True) + (
        xp.sum(top, axis=axis, keepdims=True) - 1.0
    )
    return shifted - xp.log1p(rest)


def _softmax(xp: Any, x: Any, axis: int = -1) -> Any:
    """``exp(x - max) / sum(exp(x - max))`` along ``axis``. (``exp(log_softmax(x))``, as it was, costs
    a log and a second exp more, and rounds the log-probability ``x - max - logsumexp`` once more
    before its exp: up to |log-probability| / 2 ulps of relative error, 32 ulps for a probability of
    e^-100.) Along an axis of length 0, the result is as empty as ``x`` (PyTorch's)."""
    if x.shape[axis] == 0:
        return xp.zeros_like(x)
    if xp is NUMPY:  # as in _log_softmax: the ufuncs, in place on our own array
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


softmax = Primitive(
    "softmax",
    _softmax,
    (lambda xp, d, o, x, axis=-1: o * (d - xp.sum(d * o, axis=axis, keepdims=True)),),
    check=_check_has_axis("softmax"),
    batch=Batching(axis=True, axis_default=-1),
    fresh=True,
    own=True,
)
log_softmax = Primitive(
    "log_softmax",
    lambda xp, x, axis=-1: _log_softmax(xp, x, axis),
    (lambda xp, d, o, x, axis=-1: d - xp.exp(o) * xp.sum(d, axis=axis, keepdims=True),),
    check=_check_has_axis("log_softmax"),
    batch=Batching(axis=True, axis_default=-1),
    fresh=True,
    own=True,
)


def _targets(
    xp: Any, logits: Any, targets: Any, labels: tuple[int, int] | list[tuple[int, int]] | None
) -> Any:
    """One-hot (or soft) targets of ``logits``' shape, from probabilities or integer labels."""
    targets = host_in(xp, targets, logits)  # labels made NumPy arrays, logits on a GPU
    if labels is not None:
        classes = xp.arange(logits.shape[-1], **on_device(xp, logits))
        return xp.astype(xp.expand_dims(targets, axis=-1) == classes, logits.dtype)
    return targets


def _check_cross_entropy(logits: Any, targets: Any, labels: tuple[int, int] | None) -> None:
    if type(logits) is float or logits.ndim == 0:
        raise ShapeError(f"cross_entropy: logits must have a class axis, got shape {shape_of(logits)}")
    if math.prod(logits.shape) == 0:  # the mean over no rows, or a softmax over no classes
        raise ShapeError(
            f"cross_entropy: logits of shape {tuple(logits.shape)} are empty (no rows or no classes)"
        )
    wanted = tuple(logits.shape[:-1]) if labels is not None else tuple(logits.shape)
    if tuple(targets.shape) != wanted:
        raise ShapeError(
            f"cross_entropy: targets of shape {tuple(targets.shape)} do not fit logits of shape "
            f"{tuple(logits.shape)} (expected {wanted}: probabilities, or integer labels "
            f"of shape {tuple(logits.shape[:-1])})"
        )


def _check_labels(logits: Any, labels: tuple[int, int] | None, **_: Any) -> None:
    if labels is not None:
        classes = logits.shape[-1]
        lo, hi = labels
        if lo < 0 or hi >= classes:
            raise ValueError(
                f"cross_entropy: label {lo if lo < 0 else hi} is out of range for {classes} classes"
            )


def _check_labels_merged(inputs: tuple[Any, ...], merged: dict[str, Any]) -> None:
    # The calls' logits have one shape (the signature): the first call's stand for all, and the
    # labels' range is the union of theirs (None: every call's targets are probabilities).
    ranges: list[tuple[int, int]] | None = merged["labels"]
    if ranges is not None:
        lo, hi = ranges[0]
        for r in ranges:
            if r[0] < lo:
                lo = r[0]
            if r[1] > hi:
                hi = r[1]
        _check_labels(inputs[0], (lo, hi))


def _cross_entropy(xp: Any, logits: Any, targets: Any, labels: tuple[int, int] | None) -> tuple[float, Any]:
    """The loss, and (saved for the vjp) its gradient ``(softmax(logits) - targets) / batch``."""
    batch = int(math.prod(logits.shape[:-1]))
    if labels is not None and xp is NUMPY:  # pick each row's label instead of multiplying by a one-hot
        # On a matrix of rows (the arrays' reshape method: np.reshape's dispatch costs more than the
        # arithmetic on a batch of logits), indexed directly, so the gradient is written in place
        # whatever its memory layout.
        matrix = logits if logits.ndim == 2 else logits.reshape(batch, logits.shape[-1])
        labels_flat = targets if targets.ndim == 1 else targets.reshape(batch)
        log_p = _log_softmax(NUMPY, matrix, -1)
        rows = np.arange(batch)
        picked = log_p[rows, labels_flat]
        gradient = np.exp(log_p)
        gradient[rows, labels_flat] -= 1.0
        gradient /= batch
        if matrix is not logits:
            gradient = gradient.reshape(logits.shape)
        return -float(np.add.reduce(picked)) / batch, gradient
    log_p = _log_softmax(xp, logits, -1)
    onehot = _targets(xp, logits, targets, labels)
    return -float(xp.sum(onehot * log_p)) / batch, (xp.exp(log_p) - onehot) / batch


def _cross_entropy_rows(
    xp: Any, logits: Any, targets: Any, labels: list[tuple[int, int]] | None
) -> tuple[Any, Any]:
    """``_cross_entropy`` of each row of stacked calls: one loss per row, as float64 (the unbatched
    loss is a Python float), and the saved gradients."""
    log_p = _log_softmax(xp, logits, -1)
    onehot = _targets(xp, logits, targets, labels)
    batch = int(math.prod(logits.shape[1:-1]))
    summed = xp.sum(onehot * log_p, axis=tuple(range(1, logits.ndim)))
    return -xp.astype(summed, xp.float64) / batch, (xp.exp(log_p) - onehot) / batch


def _as_rows(xp: Any, d: Any, like: Any) -> Any:
    """A delta of one value per row, shaped ``(n, 1, ...)`` to broadcast against ``like``, in its dtype."""
    return xp.astype(xp.reshape(d, (d.shape[0],) + (1,) * (like.ndim - 1)), like.dtype)


# ``labels`` is (min, max) of integer labels, computed once when the op is made, or None for
# probabilities. The forward saves the gradient, so the backward is one multiplication.
cross_entropy = Primitive(
    "cross_entropy",
    _cross_entropy,
    (lambda xp, d, saved, logits, targets, labels: saved * d,),
    check=_check_cross_entropy,
    saves=True,
    batch=Batching(
        scalar="always",
        forward=_cross_entropy_rows,
        vjps=(lambda xp, d, saved, logits, targets, labels: saved * _as_rows(xp, d, saved),),
        row_params=("targets",),
        check_merged=_check_labels_merged,
    ),
    check_values=_check_labels,
    per_run=("targets", "labels"),
    fresh=True,
    own=True,
)
