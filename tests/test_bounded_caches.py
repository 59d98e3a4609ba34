"""The engine's process-wide tables stay bounded when a program's input shapes keep changing: each
new shape is a new value kind, and a table that kept every kind forever grew without end."""

from __future__ import annotations

import gc
import sys
import tracemalloc

import numpy as np
import pytest

import monadl as ml
from monadl.do.kinds import MAX_KINDS, interned_kinds


def _input(n: int) -> np.ndarray[tuple[int, int], np.dtype[np.float32]]:
    """An input of a shape of its own, (1, n + 1), that holds one number (a broadcast view), so that
    the arrays the engine's bounded caches keep cost nothing to measure against."""
    return np.broadcast_to(np.float32(0.5), (1, n + 1))


def _step(w: ml.ArrayWeight, n: int) -> float:
    return ml.sum(ml.tanh(_input(n) * w)).train_blocking(ml.SGD(0.01)).unwrap()


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


def test_the_table_of_value_kinds_is_bounded_and_a_dropped_kind_is_made_again() -> None:
    w = ml.ArrayWeight.zeros((1, 1), dtype=np.float32)
    for n in range(MAX_KINDS + 200):
        _step(w, n)
    assert interned_kinds() <= MAX_KINDS
    # Shape (1, 1)'s kind was dropped long ago: a step on it gets a new kind and the loss that a
    # fresh weight of the same value gives.
    fresh = ml.ArrayWeight(np.asarray(w.data).copy())
    want = ml.sum(ml.tanh(_input(0) * fresh)).predict_blocking().unwrap()
    assert _step(w, 0) == want


def test_python_objects_stay_flat_over_10000_steps_of_new_shapes() -> None:
    w = ml.ArrayWeight.zeros((1, 1), dtype=np.float32)
    tracemalloc.start()  # (before the first step: what a table drops later must have been traced)
    try:
        for n in range(5000):  # the kinds' table full, the caches too
            _step(w, n)
        gc.collect()
        before = tracemalloc.take_snapshot()
        for n in range(5000, 10000):  # 5,000 shapes not seen before
            _step(w, n)
        gc.collect()
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    python_objects = [tracemalloc.DomainFilter(inclusive=True, domain=0)]  # (NumPy's data: another)
    diffs = after.filter_traces(python_objects).compare_to(before.filter_traces(python_objects), "filename")
    grown = sum(d.size_diff for d in diffs)
    assert grown < 100_000, f"{grown} bytes of Python objects kept over 5,000 steps"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/statm")
def test_memory_stays_flat_over_10000_steps_of_new_shapes() -> None:
    w = ml.ArrayWeight.zeros((1, 1), dtype=np.float32)
    for n in range(5000):
        _step(w, n)
    gc.collect()
    rss = _rss_mib()
    for n in range(5000, 10000):
        _step(w, n)
    gc.collect()
    assert _rss_mib() - rss < 1.0
