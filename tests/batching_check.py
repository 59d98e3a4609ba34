"""Comparing a loss's value and gradients with dynamic batching on and off: shared by the tests of
op batching (test_batching) and of batchable operations (test_batchable)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

import monadl as ml
from monadl import ArrayLayer, ArrayWeight, FloatLayer, FloatWeight
from monadl.do.stats import RunStats
from monadl.typeclasses.sparse import SparseRows

Weight = ArrayWeight | FloatWeight
Layer = ArrayLayer | FloatLayer


def dense(gradient: Any) -> Any:
    """A gradient as compared here: an embedding table's SparseRows densified, arrays as arrays."""
    if isinstance(gradient, SparseRows):
        return gradient.to_dense()
    return gradient if type(gradient) is float else np.asarray(gradient)


def assert_close(batched: Any, alone: Any, what: str) -> None:
    """Equal to 1e-10 relative to the larger of 1 and the largest entry: rounding (a stacked matmul
    sums in another order) is ~1e-16 of the values summed; a wrong row or a lost delta is O(1)."""
    assert type(batched) is type(alone), (what, type(batched), type(alone))
    b, a = np.asarray(batched, dtype=np.float64), np.asarray(alone, dtype=np.float64)
    assert b.shape == a.shape, (what, b.shape, a.shape)
    scale = max(1.0, float(np.max(np.abs(a), initial=0.0)))
    error = float(np.max(np.abs(b - a), initial=0.0))
    assert error <= 1e-10 * scale, f"{what}: batched and unbatched differ by {error:.3g} (scale {scale:.3g})"


@dataclass(frozen=True)
class Gradients:
    """A loss's value and its weights' gradients (dense), computed on a fresh executor."""

    value: float
    gradients: dict[Weight, Any]
    stats: RunStats
    """The executor's statistics over the forward and backward runs together."""


def gradients_of(loss: Layer, batching: bool, replay: bool = True) -> Gradients:
    """With ``batching`` (equal calls ready together merged) or not (every call on its own), on a
    fresh executor (``replay``: one that keeps the programs of static graphs)."""
    executor = ml.Executor(batching=batching, replay=replay)
    value, gradients = ml.compute_gradients(loss, executor=executor)
    return Gradients(value, {w: dense(g) for w, g in gradients.items()}, executor.stats)


def merged_and_alone(make_loss: Callable[[], Layer]) -> tuple[Gradients, Gradients]:
    """The value and gradients of ``make_loss()`` with batching on and off, each on a graph of its
    own built the same way (so that the weights pair up in order), asserted equal; both are
    returned, for the caller's checks of what merged."""
    merged, alone = gradients_of(make_loss(), True), gradients_of(make_loss(), False)
    assert_close(merged.value, alone.value, "loss")
    for a, b in zip(merged.gradients.values(), alone.gradients.values(), strict=True):
        assert_close(a, b, "gradient")
    return merged, alone


def assert_merged_like_alone(loss: Layer, w: Weight, name: str, calls: int) -> None:
    """``loss``'s value and ``w``'s gradient are the same with batching on and off, and the op
    ``name`` ran once, forward and backward, for its ``calls`` calls merged, and once per call alone."""
    on, off = gradients_of(loss, True), gradients_of(loss, False)
    assert_close(on.value, off.value, "loss")
    assert_close(on.gradients[w], off.gradients[w], "gradient")
    assert on.stats.kinds[name] == 1 and on.stats.vjps[name] == 1, on.stats
    assert off.stats.kinds[name] == calls and off.stats.vjps[name] == calls, off.stats
