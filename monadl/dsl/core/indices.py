"""Row indices of a lookup (``take_rows``, ``layer[indices]``), checked and made an integer array."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

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
