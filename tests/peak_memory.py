"""Peak memory of a computation, for the tests that bound it (NumPy reports to tracemalloc)."""

from __future__ import annotations

import tracemalloc
from typing import Any

import monadl as ml


def gradients_with_peak(loss: ml.FloatLayer) -> tuple[dict[Any, Any], int]:
    """The gradients of ``loss`` and the peak bytes allocated while computing them."""
    tracemalloc.start()
    try:
        _, gradients = ml.compute_gradients(loss)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return gradients, peak
