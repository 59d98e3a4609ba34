"""The executors' cap on BLAS's threads (``monadl.runtime.process.cap_blas``): one thread while any
executor that asked for it is open, whatever its number of workers; the limits as they were once the
last one closes."""

from __future__ import annotations

import gc

import pytest
from child import in_child
from threadpoolctl import threadpool_info, threadpool_limits

import monadl as ml


def _blas_threads() -> list[int]:
    return [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]


def _blas_has_threads() -> bool:
    with threadpool_limits(limits=2, user_api="blas"):
        return max(_blas_threads(), default=1) >= 2


def _capped_while_open_and_restored_after_the_last() -> None:
    """Run in a process of its own: no other executor of the test run holds the cap there."""
    with threadpool_limits(limits=2, user_api="blas"):  # as a 2-core machine starts
        before = _blas_threads()
        first = ml.Executor()  # one worker: capped too (BLAS's threads spin beside a busy core)
        assert _blas_threads() == [1] * len(before)
        second = ml.Executor(2)
        first.close()
        assert _blas_threads() == [1] * len(before)  # the second still holds the cap
        second.close()
        assert _blas_threads() == before
        with ml.Executor(limit_blas=False):
            assert _blas_threads() == before
        dropped = ml.Executor()  # never closed: its hold goes with it
        assert _blas_threads() == [1] * len(before)
        del dropped
        gc.collect()
        assert _blas_threads() == before


@pytest.mark.skipif(not _blas_has_threads(), reason="no BLAS library with threads to cap")
def test_blas_is_capped_while_any_executor_is_open_and_restored_after_the_last() -> None:
    in_child(_capped_while_open_and_restored_after_the_last)


def _a_hold_dropped_at_exit_prints_nothing() -> None:
    """As at interpreter exit: threadpoolctl's globals are torn down (None) before the last hold
    goes. Restoring the limits then would only print an ignored exception; the hold leaves them."""
    import sys

    import threadpoolctl

    from monadl.runtime.process import BlasCap

    unraisable: list[object] = []
    sys.unraisablehook = unraisable.append
    hold = BlasCap()
    threadpoolctl.current_thread = None
    sys.is_finalizing = lambda: True
    del hold
    gc.collect()
    assert unraisable == []


@pytest.mark.skipif(not _blas_has_threads(), reason="no BLAS library with threads to cap")
def test_a_hold_dropped_at_interpreter_exit_prints_no_error() -> None:
    in_child(_a_hold_dropped_at_exit_prints_nothing)
