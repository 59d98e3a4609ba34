"""Optimizer rules in one pass over a NumPy weight: ``monadl._native``'s kernels, where they are
built (with the compiled engine) and apply.

A rule written with NumPy is a dozen ufunc calls: on a small weight the calls cost more than the
arithmetic, and on a large one (an embedding table, updated whole by a dense optimizer) each pass
streams the table through the cache. A kernel here does the same IEEE operations in the same order
in one loop, so its results equal the NumPy rule's bit for bit (the tests compare them), and the
optimizers call it in place of that rule. Each function gives None where its kernel does not apply:
the engine runs from its sources (``MONADL_PURE``, no compiler: the kernels are not loaded then),
or the arrays are not C-contiguous NumPy arrays of one float32 or float64 shape; the caller then
runs the NumPy rule."""

from __future__ import annotations

from typing import Any

import numpy as np

from monadl.dsl import fused
from monadl.dsl.fused import native_takes


def available() -> bool:
    """Whether the kernels are loaded (the engine runs compiled): ``fused.NATIVE``, the one switch
    of the optimizers' kernels and the cells'."""
    return fused.NATIVE is not None


def adam(
    data: Any,
    g: Any,
    m: Any,
    v: Any,
    b1: float,
    b2: float,
    t: int,
    rate: float,
    epsilon: float,
    rows: Any = None,
) -> tuple[Any, Any, Any] | None:
    """Adam's rule (``adam.adam_rule``; with ``rows``, ``adam._adam_in_chunks``'s sparse form: ``g``
    the gradient's rows at ``rows``, sorted and distinct, every other row's gradient +0.0) into
    fresh arrays: ``(new data, m, v)``, or None where the kernel does not apply."""
    if rows is None:
        if not native_takes(data, g, m, v):
            return None
        width = 0
    elif not native_takes(data, m, v):
        return None
    else:
        width = data.size // data.shape[0] if data.shape[0] else 0
        if (
            not width  # no rows, or rows of no elements: nothing the kernel's row walk could read
            or type(g) is not np.ndarray
            or g.dtype != data.dtype
            or not g.flags.c_contiguous
            or g.size != len(rows) * width
            or data.ndim < 2
        ):
            return None
        rows = np.ascontiguousarray(rows, dtype=np.int64)
    new, m_new, v_new = np.empty_like(data), np.empty_like(m), np.empty_like(v)
    scalars = (b1, 1.0 - b1, b2, 1.0 - b2, 1.0 - b1**t, 1.0 - b2**t, rate, epsilon)
    fused.NATIVE.adam(data, g, m, v, new, m_new, v_new, scalars, rows, width)
    return new, m_new, v_new


def sgd(data: Any, g: Any, out: Any, rate: float) -> bool | None:
    """SGD's rule ``data - rate * g`` (``sgd.SGD.update``'s) into ``out``, which may be ``g`` itself:
    whether every element written is finite (read as it is written), or None where the kernel does
    not apply (nothing written)."""
    if not native_takes(data, g, out) or not out.flags.writeable:
        return None
    finite: bool = fused.NATIVE.sgd(data, g, out, rate)
    return finite
