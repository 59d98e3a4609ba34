"""The executors' cap on BLAS's threads (``monadl.runtime.process.cap_blas``): one thread while any
executor that asked for it is open, whatever its number of workers; the limits as they were once the
last one closes."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from threadpoolctl import threadpool_info, threadpool_limits

import monadl as ml


def _blas_threads() -> list[int]:
    return [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]


@pytest.fixture
def no_default_executor() -> Iterator[None]:
    """No process-wide executor open (an earlier test's would hold the cap for the whole test)."""
    previous = ml.set_default_executor(None)
    if previous is not None:
        previous.close()
    yield


def test_blas_is_capped_while_any_executor_is_open_and_restored_after_the_last(
    no_default_executor: None,
) -> None:
    with threadpool_limits(limits=2, user_api="blas"):  # as a 2-core machine starts
        before = _blas_threads()
        if not before or max(before) < 2:
            pytest.skip("no BLAS library with threads to cap")
        first = ml.Executor()  # one worker: capped too (BLAS's threads spin beside a busy core)
        assert _blas_threads() == [1] * len(before)
        second = ml.Executor(2)
        first.close()
        assert _blas_threads() == [1] * len(before)  # the second still holds the cap
        second.close()
        assert _blas_threads() == before
        with ml.Executor(limit_blas=False):
            assert _blas_threads() == before
