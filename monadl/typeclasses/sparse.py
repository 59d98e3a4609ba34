"""``SparseRows``: a delta that is a set of rows of a dense array (an embedding table's delta).

A lookup of ``k`` rows of an ``n x d`` table (``take_rows``) has a delta that is zero except on
those ``k`` rows. Building it dense costs ``n x d`` per lookup; ``SparseRows`` keeps the ``k``
indices and the ``k x d`` rows only. Repeated indices are allowed: their rows add.

Sums (of a node's deltas in the backward pass, a weight's gradient):

* sparse + sparse is sparse: the indices and rows are concatenated (lazily: a sum of many
  lookups concatenates once, when ``indices`` or ``values`` is first read);
* sparse + dense (either order) is dense: the rows are scattered into a copy of the dense array;
* ``dense += sparse`` (:func:`add_into`) scatters in place; ``sparse += x`` rebinds to ``sparse + x``.

The operands are never changed. ``to_dense`` gives the equivalent dense array.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any, ClassVar, Final

import numpy as np

from monadl.typeclasses.backend import NUMPY, namespace, on_device


def _add_at(xp: Any) -> Any:
    """NumPy's and CuPy's unbuffered scatter-add (``xp.add.at``), or None (array-API fallback)."""
    return getattr(getattr(xp, "add", None), "at", None)


def scatter_add(xp: Any, out: Any, indices: Any, values: Any) -> Any:
    """``out`` with ``values[k]`` added to row ``indices[k]`` for every ``k`` (repeats add).

    In place where the namespace has ``add.at`` (NumPy, CuPy); otherwise, through a one-hot matmul,
    a fresh array (the array API has no scatter)."""
    rows = xp.reshape(values, (indices.shape[0], *out.shape[1:]))
    add_at = _add_at(xp)
    if add_at is not None:
        add_at(out, indices, rows)
        return out
    onehot = xp.astype(indices[:, None] == xp.arange(out.shape[0], **on_device(xp, out))[None, :], rows.dtype)
    summed = xp.matmul(xp.matrix_transpose(onehot), xp.reshape(rows, (indices.shape[0], -1)))
    return out + xp.reshape(summed, out.shape)


def rows_kernel_fits(out: Any, src: Any) -> bool:
    """Whether :func:`move_rows` moves rows between ``out`` and ``src``: CuPy arrays of one float32
    or float64 dtype, C-contiguous, with rows of one size."""
    cupy = sys.modules.get("cupy")
    if cupy is None or type(out) is not cupy.ndarray or type(src) is not cupy.ndarray:
        return False
    if out.dtype != src.dtype or out.dtype.name not in _ROW_DTYPES or not out.ndim or not src.ndim:
        return False
    if not (out.flags.c_contiguous and src.flags.c_contiguous):
        return False
    return bool(out.size * src.shape[0] == src.size * out.shape[0])


def move_rows(kind: str, out: Any, out_rows: Any, src: Any, src_rows: Any) -> None:
    """For every ``k``, ``out[out_rows[k]] = src[src_rows[k]]`` (``kind`` ``"gather"``) or
    ``out[out_rows[k]] += src[src_rows[k]]`` (``"scatter_add"``, atomic: repeated rows add), in one
    CUDA kernel, where a take and a scatter (or a take per part and their concatenation) would be
    several: each launch costs the host tens of microseconds, and a merged group's gathers run
    for every group of a step. ``out`` and ``src`` as :func:`rows_kernel_fits` takes; the row
    indices int64 CuPy arrays of one length."""
    n = int(src_rows.shape[0])
    width = out.size // out.shape[0] if out.shape[0] else 0
    if n and width:
        _row_kernel(kind)(src, src_rows, out_rows, width, out, size=n * width)


_ROW_DTYPES: Final = ("float32", "float64")
_ROW_BODIES: Final = {
    "gather": "out[out_rows[r] * width + c] = src[src_rows[r] * width + c]",
    "scatter_add": "atomicAdd(&out[out_rows[r] * width + c], src[src_rows[r] * width + c])",
}
_row_kernels: Final[dict[str, Any]] = {}


def _row_kernel(kind: str) -> Any:
    """The CuPy kernel of :func:`move_rows`'s ``kind``, made on first use (CuPy compiles it once)."""
    kernel = _row_kernels.get(kind)
    if kernel is None:
        import cupy

        kernel = _row_kernels[kind] = cupy.ElementwiseKernel(
            "raw T src, raw int64 src_rows, raw int64 out_rows, int64 width",
            "raw T out",
            f"const long long r = i / width; const long long c = i - r * width; {_ROW_BODIES[kind]};",
            f"monadl_rows_{kind}",
        )
    return kernel


def _sorts(indices: Any, values: Any) -> bool:
    """Whether :func:`row_sums` sums these rows by sorting them: on NumPy, at any number of rows
    (``unique``, the other way, is NumPy's Python, slower even on a few)."""
    return type(values) is np.ndarray and indices.shape[0] > 0


def sorted_layout(indices: Any) -> tuple[Any, Any, Any]:
    """How :func:`row_sums` sums rows at NumPy ``indices``: the stable order that sorts them, the
    distinct indices, sorted, and where each one's run starts in that order."""
    order = np.argsort(indices, kind="stable")
    ordered = indices[order]
    starts = np.flatnonzero(np.concatenate((np.ones(1, dtype=bool), ordered[1:] != ordered[:-1])))
    return order, ordered[starts], starts


def row_sums(
    xp: Any, indices: Any, values: Any, layout: tuple[Any, Any, Any] | None = None
) -> tuple[Any, Any] | None:
    """The distinct ``indices``, sorted, and for each the sum of ``values``' rows there; None where
    the namespace has no scatter (the array API). On NumPy one stable sort (``layout``:
    :func:`sorted_layout`'s, if already known) and one ``add.reduceat``
    (``add.at`` adds rows of a table element by element, slower), which may sum a row's terms in
    another order than ``add.at`` (the last bits); :meth:`SparseRows.to_dense` sums from here too,
    so a dense gradient's rows equal these bit for bit. Elsewhere ``unique`` and ``add.at``."""
    if _sorts(indices, values):
        order, rows, starts = sorted_layout(indices) if layout is None else layout
        summed = np.add.reduceat(values[order], starts, axis=0)
        summed += 0.0  # as a sum into zeros would: a row of -0.0s gives +0.0
        return rows, summed
    add_at = _add_at(xp)
    if add_at is None:
        return None
    rows, inverse = xp.unique(indices, return_inverse=True)
    summed = xp.zeros((rows.shape[0], *values.shape[1:]), dtype=values.dtype)
    add_at(summed, xp.reshape(inverse, (-1,)), values)
    return rows, summed


class SparseRows:
    """Rows ``values[k]`` at row ``indices[k]`` of an otherwise zero array of shape ``shape``.

    ``indices``: a 1-d integer array; ``values``: shape ``(len(indices), *shape[1:])``; repeated
    indices add. Immutable: sums make new objects and never change their operands."""

    __slots__ = ("_chunks", "_indices", "_layout", "_summed", "_sums", "_values", "shape")
    __array_ufunc__: ClassVar[None] = None  # ``ndarray + SparseRows`` calls our ``__radd__``, not a ufunc

    def __init__(self, indices: Any, values: Any, shape: Sequence[int]) -> None:
        self.shape: tuple[int, ...] = tuple(int(n) for n in shape)
        expected = (int(indices.shape[0]), *self.shape[1:])
        if len(indices.shape) != 1 or tuple(values.shape) != expected:
            raise ValueError(
                f"SparseRows: indices of shape {tuple(indices.shape)} and values of shape "
                f"{tuple(values.shape)} do not fit a table of shape {self.shape}"
            )
        self._indices: Any = indices
        self._values: Any = values
        self._chunks: tuple[tuple[Any, Any], ...] | None = None
        # worked out once: how the rows are summed (shared by a gradient scaled or cast), the sums
        self._layout: tuple[Any, Any, Any] | None = None
        self._sums: tuple[Any, Any] | None = None
        self._summed = False

    @classmethod
    def _joined(cls, chunks: tuple[tuple[Any, Any], ...], shape: tuple[int, ...]) -> SparseRows:
        new = cls(*chunks[0], shape)  # mypyc cannot compile cls.__new__(cls)
        new._indices = new._values = None
        new._chunks = chunks
        return new

    def _parts(self) -> tuple[tuple[Any, Any], ...]:
        chunks = self._chunks
        return ((self._indices, self._values),) if chunks is None else chunks

    def _materialise(self) -> None:
        chunks = self._chunks
        if chunks is not None:
            xp = namespace(chunks[0][1])
            indices = xp.concat([i for i, _ in chunks], axis=0)
            values = xp.concat([v for _, v in chunks], axis=0)
            self._indices, self._values = indices, values
            self._chunks = None

    @property
    def indices(self) -> Any:
        """The row indices (1-d, integer; repeats allowed)."""
        self._materialise()
        return self._indices

    @property
    def values(self) -> Any:
        """The rows, of shape ``(len(indices), *shape[1:])``."""
        self._materialise()
        return self._values

    @property
    def dtype(self) -> Any:
        return self._parts()[0][1].dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def summed(self) -> tuple[Any, Any] | None:
        """:func:`row_sums` of the rows (worked out once): the distinct indices, sorted, and each
        one's rows summed; None where the namespace has no scatter (the array API)."""
        if not self._summed:
            values = self.values
            indices = self.indices
            layout = self._layout
            if layout is None and _sorts(indices, values):
                layout = self._layout = sorted_layout(indices)
            self._sums = row_sums(namespace(values), indices, values, layout)
            self._summed = True
        return self._sums

    def with_values(self, values: Any) -> SparseRows:
        """The same indices with other rows of the same shape (scaled, cast): the way their rows
        are summed, once worked out, is shared."""
        new = SparseRows(self.indices, values, self.shape)
        new._layout = self._layout
        return new

    def to_dense(self, xp: Any = None) -> Any:
        """The equivalent dense array: the rows scatter-added into zeros."""
        values = self.values
        xp = namespace(values) if xp is None else xp
        if type(values) is np.ndarray and xp is NUMPY:
            sums = self.summed()
            assert sums is not None  # (NumPy has a scatter)
            out = np.zeros(self.shape, dtype=values.dtype)
            out[sums[0]] = sums[1]
            return out
        out = xp.zeros(self.shape, dtype=values.dtype, **on_device(xp, values))
        return scatter_add(xp, out, self.indices, values)

    def add_dense(self, dense: Any) -> Any:
        """``dense + self`` as a fresh dense array (``dense`` is not changed)."""
        if tuple(dense.shape) != self.shape:
            raise ValueError(f"SparseRows: cannot add shapes {self.shape} and {tuple(dense.shape)}")
        xp = namespace(dense)
        copy = xp.asarray(dense, copy=True) if _add_at(xp) is not None else dense
        return scatter_add(xp, copy, self.indices, self.values)

    def copy(self) -> SparseRows:
        """A SparseRows with its own copies of the indices and rows."""
        xp = namespace(self.values)
        return SparseRows(xp.asarray(self.indices, copy=True), xp.asarray(self.values, copy=True), self.shape)

    def __add__(self, other: object) -> Any:
        if isinstance(other, SparseRows):
            if other.shape != self.shape:
                raise ValueError(f"SparseRows: cannot add shapes {self.shape} and {other.shape}")
            return SparseRows._joined(self._parts() + other._parts(), self.shape)
        if hasattr(other, "shape") and hasattr(other, "__array_namespace__"):
            return self.add_dense(other)
        return NotImplemented

    def __radd__(self, other: object) -> Any:
        return self.__add__(other)

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> Any:
        """NumPy's view of it: the dense array (``np.asarray(gradient)``)."""
        dense = np.asarray(self.to_dense())
        return dense if dtype is None else dense.astype(dtype)

    def __repr__(self) -> str:
        return f"SparseRows(rows={self.indices.shape[0]}, shape={self.shape}, dtype={self.dtype})"


def add(a: Any, b: Any) -> Any:
    """``a + b`` as a fresh value, whichever of them is a SparseRows (an array library's own ``+``
    may not defer to ``SparseRows.__radd__``)."""
    if type(b) is SparseRows and type(a) is not SparseRows:
        return b.add_dense(a) if hasattr(a, "shape") else b + a
    return a + b


def add_into(total: Any, d: Any) -> Any:
    """``total += d``, for a running sum of deltas: ``total`` is the sum's own value. A dense array total
    takes a SparseRows in place (a scatter-add where the namespace allows it); a SparseRows total
    (or a float) is rebound to a fresh sum, and so is a total of a narrower dtype than ``d`` (in
    place, ``+=`` would cast ``d`` down: the sum's type must not depend on the order of the terms)."""
    if type(total) is SparseRows or type(total) is float:
        return total + d
    part = d.values if type(d) is SparseRows else d
    if type(part) is not float and part.dtype != total.dtype:
        xp = namespace(total)
        wider = xp.result_type(total.dtype, part.dtype)
        if wider != total.dtype:
            total = xp.astype(total, wider)  # a fresh total of the sum's type
    if type(d) is SparseRows:
        return scatter_add(namespace(total), total, d.indices, d.values)
    total += d
    return total


def dense(gradient: Any) -> Any:
    """``gradient`` as a dense array if it is a SparseRows; otherwise itself."""
    return gradient.to_dense() if type(gradient) is SparseRows else gradient


def astype(gradient: Any, dtype: Any) -> Any:
    """``gradient`` (an array, or sparse rows: their values) cast to ``dtype``, a new array."""
    if type(gradient) is SparseRows:
        values = gradient.values
        return SparseRows(gradient.indices, namespace(values).astype(values, dtype), gradient.shape)
    return namespace(gradient).astype(gradient, dtype)
