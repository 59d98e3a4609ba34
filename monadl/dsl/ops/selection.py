"""Selection: ``where(condition, a, b)``, elementwise ``a`` where a boolean condition holds, else ``b``.

The condition is data (a mask computed from values, not a structure): it goes into the graph as
a constant operand of 0.0 and 1.0 (a layer's data is floating-point), so the op is elementwise in
all three operands and merges under dynamic batching as ``add`` does, the calls' conditions
stacked with their other operands, whatever the three shapes (NumPy's broadcasting).
"""

from __future__ import annotations

import math
import reprlib
from collections.abc import Sequence
from typing import Any, Final

import numpy as np

from monadl.do.primitive import ELEMENTWISE, Batching
from monadl.dsl.core.arguments import array_operand, int_param
from monadl.dsl.core.indices import integral, row_params
from monadl.dsl.core.layers import ADVANCED_INDEX, AnyArray, AnyFloat, ArrayLayer, apply_array, array_op
from monadl.dsl.ops.operators import TAKE_ROWS
from monadl.dsl.ops.registry import declare
from monadl.dsl.ops.shape_rules import Info, broadcast, promoted
from monadl.typeclasses.backend import (
    NDARRAY,
    NUMPY,
    AnyNDArray,
    IndexArray,
    RowIndices,
    ShapeError,
    host_in,
    is_array,
    namespace,
    namespace_of_type,
    on_device,
    shape_of,
)

__all__ = ["take_along_axis", "take_rows", "where"]


def take_rows(table: AnyArray, indices: RowIndices) -> ArrayLayer:
    """Rows of ``table`` (an embedding lookup): shape ``indices.shape + table.shape[1:]``. The
    delta adds each row's delta into the rows used, repeated indices included. (Its op,
    ``TAKE_ROWS``, is also ``table[indices]``'s, so it is declared with the operators.)"""
    array_operand("take_rows", table)
    return array_op(TAKE_ROWS, (table,), row_params(indices))


def _where(xp: Any, a: Any, b: Any, condition: Any) -> Any:
    if type(a) is float and type(b) is float:  # (the array API selects between arrays: one at least)
        a = xp.asarray(a, dtype=condition.dtype, **on_device(xp, condition))
    return xp.where(condition > 0.5, a, b)


def _where_vjp_a(xp: Any, d: Any, o: Any, a: Any, b: Any, condition: Any) -> Any:
    return xp.where(condition > 0.5, d, 0.0 * d)  # (0 * d: the delta's dtype, and a NaN kept, as relu's)


def _where_vjp_b(xp: Any, d: Any, o: Any, a: Any, b: Any, condition: Any) -> Any:
    return xp.where(condition > 0.5, 0.0 * d, d)


def _no_delta(xp: Any, d: Any, o: Any, a: Any, b: Any, condition: Any) -> Any:
    """The condition is a constant: no delta flows into it (none is asked for; this is its shape)."""
    return xp.zeros_like(condition)


def _where_rule(a: Info, b: Info, condition: Info) -> Info | None:
    if a[2] is None and b[2] is None:
        return None  # two floats take the condition's dtype
    return broadcast(a[0], b[0], condition[0]), *promoted(a, b)


WHERE: Final = declare(
    "where",
    _where,
    (_where_vjp_a, _where_vjp_b, _no_delta),
    broadcasts=True,
    batch=ELEMENTWISE,
    shape_rule=_where_rule,
)


def where(condition: AnyNDArray, a: AnyFloat | AnyArray, b: AnyFloat | AnyArray) -> ArrayLayer:
    """Elementwise ``a`` where ``condition`` is true, else ``b`` (``numpy.where`` of three operands):
    ``condition`` a boolean array of any namespace (a constant: no delta flows into it), ``a`` and
    ``b`` layers, weights or constants; the three broadcast together, and each of ``a`` and ``b``
    gets the result's delta where it was chosen (0 elsewhere), summed back to its shape."""
    if not is_array(condition) or not namespace(condition).isdtype(condition.dtype, "bool"):
        dtype = getattr(condition, "dtype", None)
        what = type(condition).__name__ + ("" if dtype is None else f" of dtype {dtype}")
        raise TypeError(f"where: condition must be a boolean array, got {what}")
    values: Any = condition
    if isinstance(values, np.generic):  # a NumPy bool: a 0-d array (its float would be a float)
        values = np.asarray(values)
    xp = namespace(values)
    mask = xp.astype(values, xp.float64)
    return apply_array(WHERE, a, b, mask)


# ------------------------------------------------------------------ gathers and their scatter-adds


def _index_array(op: str, indices: object) -> Any:
    """``indices`` (an integer array of any namespace, or a nested list of ints) as an integer array;
    a TypeError naming ``op`` for anything else."""
    if is_array(indices):
        if not integral(indices):
            raise TypeError(f"{op}: expected integer indices, got dtype {getattr(indices, 'dtype', '?')}")
        return indices
    if isinstance(indices, bool) or not isinstance(indices, (int, np.integer, Sequence)):
        raise TypeError(f"{op}: expected integer indices, got {type(indices).__name__}")
    array = np.asarray(indices)
    if array.dtype.kind not in "iu" and not (array.size == 0 and array.dtype.kind == "f"):
        raise TypeError(f"{op}: expected integer indices, got {reprlib.repr(indices)}")
    return array.astype(np.intp, copy=False)


def _broadcast_shape(op: str, a: tuple[int, ...], b: tuple[int, ...], what: str) -> tuple[int, ...]:
    out = []
    for m, n in zip(a, b, strict=True):
        if m != n and m != 1 and n != 1:
            raise ShapeError(f"{op}: {what}")
        out.append(max(m, n) if m and n else 0)
    return tuple(out)


def _linear(xp: Any, indices: Any, shape: tuple[int, ...], axis: int) -> Any:
    """The position in a C-ordered array of ``shape`` of each element ``indices`` points to along
    ``axis`` (``indices`` of that rank, broadcasting against it on every other axis)."""
    strides = [math.prod(shape[a + 1 :]) for a in range(len(shape))]
    flat = indices * strides[axis]
    for a, n in enumerate(shape):
        if a != axis and n > 1:
            steps = xp.arange(n, dtype=indices.dtype, **on_device(xp, indices)) * strides[a]
            flat = flat + xp.reshape(steps, tuple(n if b == a else 1 for b in range(len(shape))))
    return flat


def _scatter_along(xp: Any, shape: tuple[int, ...], indices: Any, d: Any, axis: int) -> Any:
    """The zeros of ``shape`` (``d``'s dtype) with ``d`` added at ``indices`` along ``axis``
    (``take_along_axis``'s transpose): ``indices`` of ``d``'s rank, broadcasting against it; repeated
    indices add. On NumPy one ``put_along_axis`` where each lane has a single index (no repeats
    possible), else one ``bincount`` of linear positions (2-4x faster than ``add.at``); on CuPy
    ``add.at``; on another namespace a one-hot product (the array API has no scatter)."""
    n = shape[axis]
    ones = tuple(1 for _ in shape)
    if xp is NUMPY:
        if d.shape[axis] == 1:
            g = np.zeros(shape, dtype=d.dtype)
            np.put_along_axis(g, np.broadcast_to(indices, d.shape), d, axis)
            return g
        lanes = tuple(n if a == axis else m for a, m in enumerate(d.shape))
        lin = _linear(np, np.broadcast_to(indices, d.shape), lanes, axis)
        summed = np.bincount(lin.reshape(-1), weights=d.reshape(-1), minlength=math.prod(lanes))
        return summed.astype(d.dtype, copy=False).reshape(lanes)
    indices = xp.broadcast_to(host_in(xp, indices, d), tuple(d.shape))
    add_at = getattr(getattr(xp, "add", None), "at", None)
    if add_at is not None:  # CuPy
        g = xp.zeros(shape, dtype=d.dtype, **on_device(xp, d))
        grids = []
        for a, m in enumerate(d.shape):
            grids.append(
                indices
                if a == axis
                else xp.reshape(xp.arange(m, **on_device(xp, d)), (*ones[:a], m, *ones[a + 1 :]))
            )
        add_at(g, tuple(grids), d)
        return g
    last_d = xp.moveaxis(d, axis, -1)
    last_i = xp.moveaxis(indices, axis, -1)
    onehot = xp.astype(last_i[..., None] == xp.arange(n, **on_device(xp, last_i)), d.dtype)
    g = xp.matmul(last_d[..., None, :], onehot)[..., 0, :]
    return xp.moveaxis(g, -1, axis)


def _unbroadcast_to(xp: Any, g: Any, shape: tuple[int, ...]) -> Any:
    """``g`` summed over the axes that broadcast ``shape`` to it (leading ones included)."""
    lead = len(g.shape) - len(shape)
    axes = tuple(range(lead)) + tuple(
        lead + a for a, n in enumerate(shape) if n == 1 and g.shape[lead + a] != 1
    )
    if axes:
        g = xp.sum(g, axis=axes, keepdims=True)
    return xp.reshape(g, shape) if lead or axes else g


# ---------------------------------------------------------------------------------- take_along_axis


def _lanes(x: Any, indices: Any, axis: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The shapes ``x`` and ``indices`` broadcast to against each other on every axis but ``axis``
    (as ``numpy.take_along_axis``; ``x`` given a leading axis where ``indices`` has one more: the
    rows of merged calls that share ``x``)."""
    rank = len(indices.shape)
    xs = (1,) * (rank - len(x.shape)) + tuple(x.shape)
    a = axis % rank
    both = _broadcast_shape(
        "take_along_axis",
        xs[:a] + xs[a + 1 :],
        tuple(indices.shape[:a]) + tuple(indices.shape[a + 1 :]),
        f"indices of shape {tuple(indices.shape)} do not broadcast against x of shape "
        f"{tuple(x.shape)} along axes other than {axis}",
    )
    return (*both[:a], xs[a], *both[a:]), (*both[:a], indices.shape[a], *both[a:])


def _take_along(xp: Any, x: Any, indices: Any, axis: int = -1) -> Any:
    if xp is NUMPY:
        if len(indices.shape) > len(x.shape):
            x = x.reshape((1,) * (len(indices.shape) - len(x.shape)) + tuple(x.shape))
        return np.take_along_axis(x, indices, axis)
    x_shape, i_shape = _lanes(x, indices, axis)
    x = xp.broadcast_to(xp.reshape(x, (1,) * (len(x_shape) - len(x.shape)) + tuple(x.shape)), x_shape)
    indices = xp.broadcast_to(host_in(xp, indices, x), i_shape)
    take_along = getattr(xp, "take_along_axis", None)
    if take_along is not None:
        return take_along(x, indices, axis=axis)
    lin = _linear(xp, indices, x_shape, axis % len(x_shape))  # (an array API before 2024.12)
    return xp.reshape(xp.take(xp.reshape(x, (-1,)), xp.reshape(lin, (-1,))), i_shape)


def _take_along_vjp(xp: Any, d: Any, o: Any, x: Any, indices: Any, axis: int = -1) -> Any:
    x_shape, _ = _lanes(x, indices, axis)
    g = _scatter_along(xp, x_shape, indices, d, axis % len(x_shape))
    return _unbroadcast_to(xp, g, tuple(x.shape))


def _check_take_along(x: Any, indices: Any, axis: int = -1) -> None:
    if type(x) is float or len(x.shape) == 0:
        raise ShapeError(f"take_along_axis: x must have an axis, got {shape_of(x)}")
    rank = len(x.shape)
    if len(indices.shape) not in (rank, rank + 1):  # (one more: merged calls' rows)
        raise ShapeError(
            f"take_along_axis: indices of shape {tuple(indices.shape)} must have the rank of x of "
            f"shape {tuple(x.shape)}"
        )
    if not -len(indices.shape) <= axis < len(indices.shape):
        raise ShapeError(f"take_along_axis: axis {axis} is out of range for x of shape {tuple(x.shape)}")
    _lanes(x, indices, axis)


def _index_range(xp: Any, indices: Any) -> tuple[int, int] | None:
    if not math.prod(indices.shape):
        return None
    if type(indices) is NDARRAY:
        return int(np.minimum.reduce(indices, axis=None)), int(np.maximum.reduce(indices, axis=None))
    ns = namespace_of_type(type(indices), indices)
    return int(ns.min(indices)), int(ns.max(indices))


def _check_take_along_range(x: Any, indices: Any, axis: int = -1) -> None:
    span = _index_range(None, indices)
    n = x.shape[axis] if len(indices.shape) == len(x.shape) else (1, *x.shape)[axis]
    if span is not None and (span[0] < 0 or span[1] >= n):
        raise ShapeError(
            f"take_along_axis: index {span[0] if span[0] < 0 else span[1]} is out of range for axis "
            f"{axis} of x of shape {tuple(x.shape)}"
        )


def _check_take_along_merged(inputs: tuple[Any, ...], merged: dict[str, Any]) -> None:
    # The stacked indices' range is that of the calls together. They have one axis more than a
    # call's x (the rows'), and the merged axis counts it: _check_take_along_range reads x's side
    # along it as x's with a leading axis of 1.
    _check_take_along_range(inputs[0], merged["indices"], merged["axis"])


def _take_along_rule(x: Info, indices: Any, axis: int = -1) -> Info:
    i_shape = tuple(indices.shape)
    x_shape = (1,) * (len(i_shape) - len(x[0])) + x[0]
    ax = axis % len(x_shape)
    lanes = list(broadcast((*x_shape[:ax], 1, *x_shape[ax + 1 :]), (*i_shape[:ax], 1, *i_shape[ax + 1 :])))
    lanes[ax] = i_shape[ax]
    return tuple(lanes), x[1], x[2]


TAKE_ALONG_AXIS: Final = declare(
    "take_along_axis",
    _take_along,
    (_take_along_vjp,),
    cost=lambda x, indices, axis=-1: float(math.prod(indices.shape)),
    check=_check_take_along,
    # x stacked (or shared: a weight), the indices stacked, the axis shifted past the rows
    batch=Batching(
        elementwise=True,
        axis=True,
        axis_default=-1,
        row_params=("indices",),
        check_merged=_check_take_along_merged,
    ),
    check_values=_check_take_along_range,
    per_run=("indices",),
    shape_rule=_take_along_rule,
)


def take_along_axis(x: AnyArray, indices: IndexArray | Sequence[Any], axis: int = -1) -> ArrayLayer:
    """The elements of ``x`` at ``indices`` along ``axis`` (``numpy.take_along_axis``,
    ``torch.gather``): ``out[..., j, ...] = x[..., indices[..., j, ...], ...]``, ``j`` on ``axis``.
    ``indices``: an integer array (or nested list) of ``x``'s rank, each in ``[0, x.shape[axis])``,
    that broadcasts against ``x`` on every other axis; the result has the broadcast shape with
    ``indices.shape[axis]`` on ``axis``. ``x``'s delta adds the result's delta at the indices
    (repeated indices add). ``logits`` of shape ``(n, c)`` and labels of shape ``(n, 1)`` give each
    row's score of its label."""
    array_operand("take_along_axis", x)
    index = _index_array("take_along_axis", indices)
    return apply_array(TAKE_ALONG_AXIS, x, indices=index, axis=int_param("take_along_axis", "axis", axis))


# -------------------------------------------------------------------- advanced indexing: x[rows, cols]

# ``x[i_0, ..., i_k-1]`` with integer arrays (NumPy's advanced indexing, after ``axis`` whole axes):
# the index arrays, broadcast together to a shape ``B`` and stacked as ``indices`` of shape
# ``(k, *B)``, make one flat index into the ``k`` indexed axes seen as one, so the op is one
# ``take`` along one axis, and its delta one scatter-add along it.


def _flat(xp: Any, indices: Any, dims: tuple[int, ...]) -> Any:
    """The flat position in ``dims`` of each index tuple ``indices[:, ...]`` (negatives from the end)."""
    flat = None
    for j, n in enumerate(dims):
        i = indices[j, ...]
        i = xp.where(i < 0, i + n, i)
        flat = i if flat is None else flat * n + i
    return flat


def _parts(x: Any, indices: Any, axis: int) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """The axes of ``x`` before the indexed ones, the indexed ones, and those after them."""
    xs = tuple(x.shape)
    k = indices.shape[0]
    return xs[:axis], xs[axis : axis + k], xs[axis + k :]


def _index_arrays(xp: Any, x: Any, indices: Any, axis: int = 0) -> Any:
    before, dims, after = _parts(x, indices, axis)
    flat = host_in(xp, _flat(namespace_of_type(type(indices), indices), indices, dims), x)
    rows = xp.reshape(x, (*before, math.prod(dims), *after))
    out = xp.take(rows, xp.reshape(flat, (-1,)), axis=axis)
    return xp.reshape(out, (*before, *flat.shape, *after))


def _index_arrays_vjp(xp: Any, d: Any, o: Any, x: Any, indices: Any, axis: int = 0) -> Any:
    before, dims, after = _parts(x, indices, axis)
    flat = host_in(xp, _flat(namespace_of_type(type(indices), indices), indices, dims), d)
    f = math.prod(flat.shape)
    lanes = xp.reshape(d, (math.prod(before), f, math.prod(after)))
    g = _scatter_along(
        xp, (lanes.shape[0], math.prod(dims), lanes.shape[2]), xp.reshape(flat, (1, f, 1)), lanes, 1
    )
    return xp.reshape(g, tuple(x.shape))


def _calls_as_one(indices: Any) -> Any:
    """Merged calls' stacked indices ``(n, k, *B)`` as one call's ``(k, n, *B)``."""
    xp = namespace_of_type(type(indices), indices)
    return xp.moveaxis(indices, 0, 1)


def _index_arrays_merged(xp: Any, x: Any, indices: Any, axis: int = 0) -> Any:
    out = _index_arrays(xp, x, _calls_as_one(indices), axis)
    return out if axis == 0 else xp.moveaxis(out, axis, 0)


def _index_arrays_merged_vjp(xp: Any, d: Any, o: Any, x: Any, indices: Any, axis: int = 0) -> Any:
    rows = d if axis == 0 else xp.moveaxis(d, 0, axis)
    return _index_arrays_vjp(xp, rows, o, x, _calls_as_one(indices), axis)


def _check_index_arrays(x: Any, indices: Any, axis: int = 0) -> None:
    if type(x) is float or len(x.shape) < axis + indices.shape[0]:
        raise ShapeError(
            f"getitem: {axis + indices.shape[0]} indices are too many for an array of shape {shape_of(x)}"
        )


def _check_index_arrays_range(x: Any, indices: Any, axis: int = 0) -> None:
    _, dims, _ = _parts(x, indices, axis)
    for j, n in enumerate(dims):
        span = _index_range(None, indices[j, ...])
        if span is not None and (span[0] < -n or span[1] >= n):
            raise ShapeError(
                f"getitem: index {span[0] if span[0] < -n else span[1]} is out of range for axis "
                f"{axis + j} of shape {tuple(x.shape)}"
            )


def _check_index_arrays_merged(inputs: tuple[Any, ...], merged: dict[str, Any]) -> None:
    _check_index_arrays_range(inputs[0], _calls_as_one(merged["indices"]), merged.get("axis", 0))


def _index_arrays_rule(x: Info, indices: Any, axis: int = 0) -> Info:
    shape = x[0]
    k = int(indices.shape[0])
    return (*shape[:axis], *tuple(indices.shape[1:]), *shape[axis + k :]), x[1], x[2]


INDEX_ARRAYS: Final = declare(
    "getitem_arrays",
    _index_arrays,
    (_index_arrays_vjp,),
    cost=lambda x, indices, axis=0: float(
        math.prod(indices.shape[1:]) * math.prod(x.shape[axis + indices.shape[0] :])
    ),
    check=_check_index_arrays,
    # calls that index one weight merge: their indices stacked, one gather and one scatter-add
    batch=Batching(
        shared=(0,),
        row_params=("indices",),
        forward=_index_arrays_merged,
        vjps=(_index_arrays_merged_vjp,),
        check_merged=_check_index_arrays_merged,
    ),
    check_values=_check_index_arrays_range,
    per_run=("indices",),
    shape_rule=_index_arrays_rule,
)

_BAD_ENTRY = (
    "getitem: an index of integer arrays takes ints, integer or boolean arrays and lists, after "
    "whole axes (:) and before whole axes or one ... (index a slice first: x[a:b][:, rows, cols])"
)


def _entries(key: tuple[Any, ...], shape: tuple[int, ...] | None) -> tuple[int, list[Any]]:
    """The whole axes before the indexed ones, and the index arrays (a boolean array as the arrays
    of its true elements' positions, as NumPy reads it, after checking that it has the shape of
    the axes it indexes: ``shape``, the indexed value's static shape, where known)."""
    before = 0
    consumed = 0  # the axes the index arrays so far stand for
    arrays: list[Any] = []
    done = False
    for e in key:
        if type(e) is slice or e is Ellipsis:
            if (e is not Ellipsis and e != slice(None)) or (e is Ellipsis and not arrays):
                raise TypeError(f"{_BAD_ENTRY}, got {e!r}")
            if arrays:
                done = True
            else:
                before += 1
            continue
        if done or e is None or isinstance(e, (bool, float, str, np.bool_)):
            raise TypeError(f"{_BAD_ENTRY}, got {type(e).__name__} {e!r}")
        array = np.asarray(e) if type(e) is list or isinstance(e, (int, np.integer)) else e
        if not is_array(array):
            raise TypeError(f"{_BAD_ENTRY}, got {type(e).__name__}")
        xp = namespace_of_type(type(array), array)
        if xp.isdtype(array.dtype, "bool"):
            axes = before + consumed
            if shape is None:
                raise TypeError(
                    "getitem: a boolean mask needs the indexed value's shape, unknown before it runs "
                    "here: index with the mask's positions (xp.nonzero(mask)) instead"
                )
            if tuple(array.shape) != shape[axes : axes + array.ndim]:
                raise ShapeError(
                    f"getitem: a boolean mask of shape {tuple(array.shape)} for axes {axes}.. of shape "
                    f"{shape}: the mask must have the shape of the axes it indexes"
                )
            arrays.extend(xp.nonzero(array))
            consumed += array.ndim
        elif integral(array) or (type(array) is NDARRAY and array.size == 0):
            arrays.append(array)
            consumed += 1
        else:
            raise TypeError(f"getitem: expected integer or boolean index arrays, got dtype {array.dtype}")
    return before, arrays


def index_arrays(x: Any, key: Any) -> ArrayLayer:
    """``x[key]`` for a key of integer (or boolean) arrays and lists: NumPy's advanced indexing,
    after ``before`` whole axes (``x[rows, cols]``, ``x[:, rows]``, ``x[mask]``). The index arrays
    broadcast together to a shape ``B``; the result has shape ``x.shape[:before] + B`` and the axes
    after the indexed ones. Negative indices count from the end. The delta adds the result's delta
    at the indices (repeats add): one scatter-add."""
    shape = tuple(x.shape) if is_array(x) else getattr(x, "shape", None)
    before, arrays = _entries(key if type(key) is tuple else (key,), shape)
    if any(type(a) is not NDARRAY for a in arrays):
        xp = namespace(*[a for a in arrays if type(a) is not NDARRAY])
        arrays = [xp.asarray(a) for a in arrays]
        stacked = xp.stack(xp.broadcast_arrays(*[xp.astype(a, xp.int64) for a in arrays]))
    else:
        stacked = np.stack(np.broadcast_arrays(*[a.astype(np.intp, copy=False) for a in arrays]))
    return apply_array(INDEX_ARRAYS, x, indices=stacked, axis=before)


ADVANCED_INDEX.append(index_arrays)  # what ``layer[rows, cols]`` calls (see monadl.dsl.core.layers)
