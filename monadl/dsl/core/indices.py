"""Row indices of a lookup (``take_rows``, ``layer[indices]``), checked and made an integer array."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import numpy as np

from monadl.typeclasses.backend import NDARRAY, Array, RowIndices, is_array, namespace


def integral(array: Any) -> bool:
    """Whether an array holds integers (NumPy's own dtype test first: this runs once per op made,
    and the array API's ``isdtype`` costs more than the rest of making a ``take_rows``)."""
    if type(array) is NDARRAY:
        return bool(array.dtype.kind in "iu")
    return bool(namespace(array).isdtype(array.dtype, "integral"))


def row_indices(indices: RowIndices) -> Array:
    """``indices`` as an integer array: an int or NumPy integer (one row, a word of a tree), a
    sequence of them, or an integer array; a TypeError for anything else."""
    if type(indices) is int:  # one row (a word of a tree): once per leaf, so first
        if 0 <= indices < _SMALL_ROWS:
            return _one_row(indices)
        one = np.asarray(indices)
        if one.dtype.kind in "iu":  # else too large for an integer dtype: the error below
            return one
    if is_array(indices):
        array: Array = indices  # type: ignore[assignment]
        if not integral(array):
            raise TypeError(f"take_rows: expected integer indices, got dtype {array.dtype}")
        return array
    if isinstance(indices, bool) or not isinstance(indices, (int, Sequence)):
        raise TypeError(f"take_rows: expected integer indices, got {type(indices).__name__}")
    array = np.asarray(indices)
    if array.dtype.kind not in "iu":
        if array.size == 0 and array.dtype.kind == "f":  # no rows: NumPy makes floats of [] (as of [[]])
            return array.astype(np.intp)
        raise TypeError(f"take_rows: expected integer indices, got {indices!r}")
    return array


_SMALL_ROWS: Final = 1 << 16
"""Rows below this index have one shared lookup's parameters and index array each
(:func:`_one_row_params`)."""

_one_rows: Final[dict[int, dict[str, Any]]] = {}


def row_params(indices: RowIndices) -> dict[str, Any]:
    """A lookup's parameters (``TAKE_ROWS``'s), ``indices`` made an array by :func:`row_indices`:
    for one row below ``_SMALL_ROWS``, a dict shared by every lookup of that row (an op keeps its
    parameters and nothing changes them); else a fresh one."""
    if type(indices) is int and 0 <= indices < _SMALL_ROWS:
        return _one_row_params(indices)
    return {"indices": row_indices(indices)}


def _one_row(index: int) -> Array:
    """Row ``index``'s 0-d index array, made once and shared (read-only)."""
    one: Array = _one_row_params(index)["indices"]
    return one


def _one_row_params(index: int) -> dict[str, Any]:
    """The parameters of a lookup of row ``index``, made once and shared, its 0-d index array
    read-only: a word's lookup is recorded for every word of every sentence, and a fresh array and
    dict made and freed each time cost about a tenth of recording it. At most ``_SMALL_ROWS`` are
    kept."""
    params = _one_rows.get(index)
    if params is None:
        one = np.asarray(index)
        one.flags.writeable = False
        params = _one_rows[index] = {"indices": one}
    return params
