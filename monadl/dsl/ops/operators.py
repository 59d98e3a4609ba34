"""The ops behind the layers' operators: ``+``, ``-``, ``*``, ``/``, ``**``, unary ``-``, ``@`` and
indexing (``x[1:3]``, ``x[indices]``).

Their public form is the operator (``monadl.dsl.core.layers``' ``FloatOperators`` and ``ArrayOperators``),
so these declarations have no wrapper beside them; the function forms (:func:`~monadl.matmul`,
:func:`~monadl.take_rows`) are in their families' modules (``linalg``, ``selection``) and apply the
primitives declared here. This module imports nothing of the layers (the layers import it).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Final

import numpy as np

from monadl.do.primitive import ELEMENTWISE, Batching, Primitive, Rule
from monadl.dsl.ops.registry import declare, not_a_float
from monadl.dsl.ops.shape_rules import Info, broadcast, elementwise, promoted
from monadl.typeclasses.backend import (
    FLOATS,
    NUMPY,
    ShapeError,
    host_in,
    matrix_product,
    namespace_of_type,
    shape_of,
    unbroadcast,
)
from monadl.typeclasses.sparse import SparseRows

# -------------------------------------------------------------------------------------- helpers


def _log(xp: Any, x: Any) -> Any:
    """``log(x)`` for an operand that may be a Python float while ``xp`` is an array namespace."""
    return FLOATS.log(x) if type(x) is float else xp.log(x)


# ----------------------------------------------------------------------------------- arithmetic


def elementwise_op(name: str, forward: Rule, vjps: tuple[Rule, ...], broadcasts: bool = False) -> Primitive:
    """An elementwise op (``broadcasts``: its operands broadcast against each other): its calls
    merge with any operand shared, and its result's shape is its operands' broadcast."""
    return declare(name, forward, vjps, broadcasts, batch=ELEMENTWISE, shape_rule=elementwise)


ADD: Final = declare(
    "add",
    lambda xp, a, b: a + b,
    (lambda xp, d, o, a, b: d, lambda xp, d, o, a, b: d),
    True,
    passes=True,
    batch=ELEMENTWISE,
    shape_rule=elementwise,
)


SUB: Final = elementwise_op(
    "sub", lambda xp, a, b: a - b, (lambda xp, d, o, a, b: d, lambda xp, d, o, a, b: -d), True
)


MUL: Final = elementwise_op(
    "mul", lambda xp, a, b: a * b, (lambda xp, d, o, a, b: d * b, lambda xp, d, o, a, b: d * a), True
)


DIV: Final = elementwise_op(
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


POW: Final = elementwise_op("pow", lambda xp, a, b: a**b, (_pow_vjp_base, _pow_vjp_exponent), True)


NEG: Final = elementwise_op("neg", lambda xp, x: -x, (lambda xp, d, o, x: -d,))


# --------------------------------------------------------------------------------------- matmul


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


def mm(xp: Any, a: Any, b: Any) -> Any:
    """``a @ b``; on NumPy matrices ``np.dot``, which hands a transposed view to BLAS where
    ``np.matmul`` falls back to its own loop when a side is a single row or column (10x slower).
    A few rows by a transposed matrix (a vjp's ``d @ w.T``) are :func:`_rows_by_transposed`'s."""
    if xp is NUMPY and a.ndim == 2 and b.ndim == 2:
        if 2 <= a.shape[0] <= _FEW_ROWS and b.size >= _LARGE and b.flags.f_contiguous:
            return _rows_by_transposed(a, b.T)
        return matrix_product(a, b)
    return xp.matmul(a, b)


_FEW_ROWS: Final = 128
_LARGE: Final = 8192


def _rows_by_transposed(d: Any, w: Any) -> Any:
    """``d @ w.T`` of NumPy matrices, ``w`` C-ordered, as ``(w @ d.T).T`` made C-ordered: with few
    rows in ``d`` (2 to 128) and a large ``w``, OpenBLAS takes 0.5-0.8x the time for that form (the
    larger operand first), and no longer from about 256 rows."""
    return np.ascontiguousarray(np.dot(w, d.T).T)


def _matmul_vjp_a(xp: Any, d: Any, o: Any, a: Any, b: Any) -> Any:
    if a.ndim == 2 and b.ndim == 2:  # the common case, without the promotions below
        return mm(xp, d, b.mT)
    d2, a2, b2 = _as_matrices(xp, d, a, b)
    return _shaped(xp, unbroadcast(xp, xp.matmul(d2, xp.matrix_transpose(b2)), a2), a.shape)


def _matmul_vjp_b(xp: Any, d: Any, o: Any, a: Any, b: Any) -> Any:
    if a.ndim == 2 and b.ndim == 2:
        return mm(xp, a.mT, d)
    d2, a2, b2 = _as_matrices(xp, d, a, b)
    return _shaped(xp, unbroadcast(xp, xp.matmul(xp.matrix_transpose(a2), d2), b2), b.shape)


def _shaped(xp: Any, g: Any, shape: tuple[int, ...]) -> Any:
    """``g`` in ``shape``; ``g`` itself when it has it (a reshape to its own shape is a view in
    NumPy, and a gradient that is a view cannot take its weight's update in place: see
    ``training._handed_over``; a stacked weight's, (20, 64, 64) in the CIFAR model, came this way)."""
    return g if tuple(g.shape) == tuple(shape) else xp.reshape(g, shape)


def matrix_rows(xp: Any, a: Any) -> Any:
    """``a`` as a matrix of rows (its last axis kept). The rows are counted, not left to a -1:
    an array with no elements has any number of rows of none (NumPy refuses the -1 there)."""
    return a if a.ndim == 2 else xp.reshape(a, (math.prod(a.shape[:-1]), a.shape[-1]))


def _matmul_weight(xp: Any, d: Any, o: Any, a: Any, b: Any) -> Any:
    """A matrix ``b``'s delta as a product of rows (of ``a`` and of the delta)."""
    if type(a) is float or a.ndim > 2 or type(b) is float or b.ndim != 2:
        return None
    return matrix_rows(xp, a), matrix_rows(xp, d)


def _matmul_rule(a: Info, b: Info) -> Info:
    sa, sb = a[0], b[0]
    if not sa or not sb:
        raise ValueError("matmul of a 0-d operand")
    lead = broadcast(sa[:-2], sb[:-2])
    rows = sa[-2:-1]  # (none for a vector)
    cols = sb[-1:] if len(sb) > 1 else ()
    return (*lead, *rows, *cols), *promoted(a, b)


def matmul_op(name: str) -> Primitive:
    """The matrix product under the name ``name``, which its errors give (``matmul``, ``dot``)."""
    return declare(
        name,
        lambda xp, a, b: xp.matmul(a, b),
        (_matmul_vjp_a, _matmul_vjp_b),
        products={1: _matmul_weight},
        cost=lambda a, b: float(math.prod(a.shape) * (b.shape[-1] if b.ndim > 1 else 1)),
        check=_check_matmul(name),
        batch=Batching(shared=(1,), mergeable=lambda a, b: b <= 2),
        shape_rule=_matmul_rule,
    )


MATMUL: Final = matmul_op("matmul")


# ------------------------------------------------------------------------------------ take_rows


def _scatter_rows(xp: Any, table: Any, indices: Any, d: Any) -> SparseRows:
    """The delta of ``take(table, indices, axis=0)``: the rows of ``d`` at ``indices``, as a
    :class:`~monadl.typeclasses.sparse.SparseRows` (no dense table: repeated indices add when it
    is summed or densified)."""
    flat = xp.reshape(host_in(xp, indices, d), (-1,))
    rows = xp.reshape(d, (flat.shape[0], *table.shape[1:]))
    return SparseRows(flat, rows, table.shape)


def _check_take(table: Any, indices: Any) -> None:
    not_a_float("take_rows", table)
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


def _take_rows_rule(table: Info, indices: Any) -> Info:
    return (*tuple(indices.shape), *table[0][1:]), table[1], table[2]


TAKE_ROWS: Final = declare(
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
    shape_rule=_take_rows_rule,
)


# ------------------------------------------------------------------------------- basic indexing


# An index of ``getitem`` (NumPy's basic indexing: ``x[:, 1:3]``, ``x[..., 0]``, ``x[None]``) is a
# tuple of entries: an int, None, the Ellipsis (one, always: put last when the key has none, as the
# array API wants it) and slices as ``(start, stop, step)`` tuples (a slice is no dictionary key
# before Python 3.12, and a primitive's parameters are hashed to merge and replay its calls). The
# parameter ``axis`` is the first axis the index applies to: the axes before it are taken whole.
# It is 0 for a call, and 1 for merged calls (``Batching(axis=True)`` shifts it past the rows).


WHOLE: Final = slice(None)
"""An index entry that takes an axis whole."""


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
    key: list[Any] = [WHOLE] * axis
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


def key_for(xp: Any, key: tuple[Any, ...], x: Any) -> tuple[Any, ...]:
    """``key`` as namespace ``xp`` takes it: NumPy's (and CuPy's) as it is, the array API's with
    the bounds of its slices within their axes."""
    return key if xp is NUMPY else _standard_key(key, tuple(x.shape))


def scatter(xp: Any, x: Any, key: tuple[Any, ...], d: Any) -> Any:
    """The delta of ``x[key]``: ``d`` in zeros of ``x``'s shape (``key`` of no repeated element:
    a basic index)."""
    if None in key:  # new axes of one element: the delta without them
        key = tuple([e for e in key if e is not None])
        d = xp.reshape(d, tuple(x[key].shape))
    g = xp.zeros_like(x, dtype=d.dtype)
    g[key] = d
    return g


def _check_getitem(x: Any, index: tuple[Any, ...], axis: int = 0) -> None:
    not_a_float("getitem", x)
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


def _indexed(x: Info, key: tuple[Any, ...]) -> tuple[int, ...]:
    """The shape of ``x[key]`` (a basic index), from NumPy's indexing of an array of ``x``'s shape
    that holds one element (strides of 0: no memory)."""
    return tuple(np.broadcast_to(np.empty((), np.bool_), x[0])[key].shape)


def _getitem_rule(x: Info, index: tuple[Any, ...], axis: int = 0) -> Info:
    return _indexed(x, index_key(index, axis)), x[1], x[2]


GETITEM: Final = declare(
    "getitem",
    lambda xp, x, index, axis=0: x[key_for(xp, index_key(index, axis), x)],
    (lambda xp, d, o, x, index, axis=0: scatter(xp, x, key_for(xp, index_key(index, axis), x), d),),
    check=_check_getitem,
    # the index applies past the rows' axis: ``axis``, shifted (the rows are taken whole)
    batch=Batching(axis=True, axis_default=0),
    shape_rule=_getitem_rule,
)
