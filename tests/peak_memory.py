"""Peak memory of a computation, for the tests that bound it (NumPy reports to tracemalloc)."""

from __future__ import annotations

import tracemalloc
from typing import Any

import monadl as ml


def gradients_with_peak(
    loss: ml.FloatLayer, executor: ml.Executor | None = None
) -> tuple[dict[Any, Any], int]:
    """The gradients of ``loss`` (on ``executor``, default the default one) and the peak bytes
    allocated while computing them."""
    tracemalloc.start()
    try:
        _, gradients = ml.compute_gradients(loss, executor=executor)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return gradients, peak


def assert_one_summed_delta(executor: ml.Executor | None = None, uses: int = 40, n: int = 500) -> None:
    """A weight used ``uses`` times: its gradient is right, and the peak memory of computing it stays
    near one delta's size (the deltas are summed as they come, not held all at once)."""
    import numpy as np

    w = ml.ArrayWeight(np.zeros((n, n)))
    x = np.ones(n)
    loss = ml.sum(ml.matmul(x, w))
    for _ in range(uses - 1):
        loss = loss + ml.sum(ml.matmul(x, w))
    gradients, peak = gradients_with_peak(loss, executor)
    np.testing.assert_array_equal(gradients[w], np.full((n, n), float(uses)))
    delta_bytes = n * n * 8
    assert peak < 6 * delta_bytes, f"peak {peak / delta_bytes:.1f} deltas for {uses} uses"
