"""The finite checks of a training step: its loss, every weight's new value and every buffer's,
on NumPy at once (one pass per array: its bits read in C where the engine is compiled, else a BLAS
dot product), off NumPy queued on the device and read together (one wait per device, not one per
weight)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from monadl.dsl.fused import all_true
from monadl.typeclasses.backend import NDARRAY, finite_by_bits, namespace


def is_finite(value: Any) -> bool:
    """Whether a float, or every element of an array, is finite."""
    if type(value) is float:
        return math.isfinite(value)
    xp = namespace(value)
    return bool(xp.all(xp.isfinite(value)))


def all_finite(x: Any) -> bool:
    """Whether every element of ``x`` is finite, in one pass for a NumPy array: its elements' bits
    (``finite_by_bits``), or a dot product with itself, NaN or infinite if an element is (and
    finite otherwise, unless the squares overflow: then the elements are checked one by one).
    ``vdot`` is BLAS's, with the least overhead of NumPy's reductions (a model has many small
    weights: per call, overhead is most of the cost)."""
    if type(x) is float:
        return math.isfinite(x)
    if type(x) is NDARRAY:
        found = finite_by_bits(x)
        if found is not None:
            return found
        if x.dtype.kind == "f":
            if math.isfinite(np.vdot(x, x)):
                return True
            return bool(np.isfinite(x).all())
    xp = namespace(x)
    return bool(xp.all(xp.isfinite(x)))


Pending = list[tuple[Any, Callable[[], Exception]]]
"""Finite checks of arrays off NumPy, not read yet: each array's ``all(isfinite)`` on its device,
and the error to raise if it is false."""


def check_later(pending: Pending, x: Any, error: Callable[[], Exception]) -> None:
    """Queues the finite check of ``x`` (an array off NumPy) on its device: :func:`check_pending`
    reads all a step's checks with one wait for each device, not one per weight."""
    xp = namespace(x)
    pending.append((xp.all(xp.isfinite(x)), error))


def check_pending(pending: Pending) -> None:
    """Raises the error of the first of ``pending`` whose array is not finite, if any."""
    if pending and not all_true([flag for flag, _ in pending]):
        for flag, error in pending:
            if not bool(flag):
                raise error()


def is_float_array(x: Any) -> bool:
    """Whether ``x`` is an array of a real floating dtype (whose entries a finite check reads)."""
    dtype = getattr(x, "dtype", None)
    return dtype is not None and namespace(x).isdtype(dtype, "real floating")
