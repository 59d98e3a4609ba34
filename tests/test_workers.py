"""The executor's worker threads: affinity, work stealing, failures, shutdown."""

from __future__ import annotations

import queue
import threading
from typing import Any

import pytest

from monadl.runtime.pool import Done, WorkerPool, affinity_of


def _collect(done: Done, n: int) -> dict[Any, Any]:
    results = {}
    for _ in range(n):
        token, result, error = done.get(timeout=5)
        results[token] = error if error is not None else result
    return results


def test_a_kernel_queued_behind_a_blocked_one_is_stolen_by_an_idle_worker() -> None:
    """Both kernels share an affinity, so both are queued on one worker; the first waits for the
    second. Only an idle worker taking the second (work stealing) lets the first finish."""
    pool = WorkerPool(2)
    released = threading.Event()
    done: Done = queue.SimpleQueue()
    pool.submit(lambda: released.wait(timeout=5), (), "same", done, "blocked")
    pool.submit(released.set, (), "same", done, "releaser")
    try:
        assert _collect(done, 2) == {"blocked": True, "releaser": None}
    finally:
        pool.shutdown()


def test_kernels_of_one_affinity_run_on_one_worker_when_nobody_waits() -> None:
    pool = WorkerPool(2)
    done: Done = queue.SimpleQueue()
    try:
        for i in range(20):
            pool.submit(lambda: threading.current_thread().name, (), "weight", done, i)
            _collect(done, 1)  # one at a time: the home worker is never busy, so never robbed
        names = set()
        for i in range(20):
            pool.submit(lambda: threading.current_thread().name, (), "weight", done, i)
            names.add(_collect(done, 1)[i])
        assert len(names) == 1
    finally:
        pool.shutdown()


def test_a_failing_kernel_reports_its_exception_and_the_pool_goes_on() -> None:
    pool = WorkerPool(2)
    done: Done = queue.SimpleQueue()
    try:
        pool.submit(lambda: 1 / 0, (), None, done, "bad")
        assert isinstance(_collect(done, 1)["bad"], ZeroDivisionError)
        pool.submit(lambda x: x + 1, (41,), None, done, "good")
        assert _collect(done, 1) == {"good": 42}
    finally:
        pool.shutdown()


def test_shutdown_finishes_queued_kernels_and_stops_the_threads() -> None:
    pool = WorkerPool(2)
    done: Done = queue.SimpleQueue()
    for i in range(10):
        pool.submit(lambda i=i: i * i, (), None, done, i)
    pool.shutdown()
    assert _collect(done, 10) == {i: i * i for i in range(10)}
    assert not any(t.is_alive() for t in pool._threads)


class _Owner:
    affinity = "mine"

    def method(self) -> None:
        pass


@pytest.mark.parametrize(
    ("fn", "expected"),
    [(_Owner().method, "mine"), (print, None)],
    ids=["bound method", "builtin"],
)
def test_affinity_of(fn: Any, expected: object) -> None:
    assert affinity_of(fn) == expected


def test_stealing_does_not_depend_on_when_the_owner_wakes() -> None:
    """Both kernels are queued before the owner has started either (the race of the test above,
    forced): the owner takes the first and blocks; an idle worker must still take the second."""
    for _ in range(50):
        pool = WorkerPool(2)
        released = threading.Event()
        done: Done = queue.SimpleQueue()
        with pool._lock:  # the workers cannot take anything until both are queued
            pool._queues[0].append((released.wait, (5,), done, "blocked"))
            pool._queues[0].append((released.set, (), done, "releaser"))
            pool._wake_all()
        try:
            assert _collect(done, 2) == {"blocked": True, "releaser": None}
        finally:
            pool.shutdown()


def test_a_caller_takes_back_only_its_own_unstarted_jobs() -> None:
    pool = WorkerPool(1)
    released = threading.Event()
    others: Done = queue.SimpleQueue()
    mine: Done = queue.SimpleQueue()
    try:
        pool.submit(lambda: released.wait(timeout=5), (), None, others, "busy")  # holds the worker
        pool.submit(lambda: "theirs", (), None, others, "queued, theirs")
        pool.submit(lambda: "first", (), None, mine, "first")
        pool.submit(lambda: "last", (), None, mine, "last")
        job = pool.steal(mine)
        assert job is not None and job[2] is mine and job[3] == "last"  # the last queued first
        job = pool.steal(mine)
        assert job is not None and job[3] == "first"
        assert pool.steal(mine) is None  # the other run's queued job stays where it is
        released.set()
        assert _collect(others, 2) == {"busy": True, "queued, theirs": "theirs"}
        assert mine.empty()  # taken back: no worker ran them
    finally:
        released.set()
        pool.shutdown()
