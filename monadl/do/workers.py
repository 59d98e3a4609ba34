"""The executor's worker threads: one queue per thread, and kernels routed by affinity.

Why not ``concurrent.futures.ThreadPoolExecutor``: its one shared queue hands each kernel to
whichever thread is free, so a weight's data wanders between cores. Measured on this project's
2-core machines, four 16x3072 @ 3072x64 float32 matmuls (one 786 KB weight each) took 540 us on a
2-thread ThreadPoolExecutor, 386-521 us on one thread, and 296-325 us on two threads when each
weight's matmuls always ran on the same thread: the weight stays in that core's L2 cache.

So a kernel may name an *affinity* (any hashable; ops use their weight's identity): kernels of the
same affinity always run on the same worker, the forward matmul and its vjps alike: each new
affinity is given the next worker, round-robin. Kernels without one go round-robin too. A worker
posts ``(token, result, error)`` to the caller's queue.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any

Done = queue.SimpleQueue[tuple[Any, Any, BaseException | None]]


class WorkerPool:
    """``size`` daemon threads, each with its own queue of kernels."""

    def __init__(self, size: int, name: str = "monadl") -> None:
        self.size = size
        self._queues: list[queue.SimpleQueue[Any]] = [queue.SimpleQueue() for _ in range(size)]
        self._next = 0
        self._next_home = 0
        self._homes: dict[object, int] = {}  # affinity -> its worker
        self._threads = [
            threading.Thread(target=_work, args=(q,), name=f"{name}-{i}", daemon=True)
            for i, q in enumerate(self._queues)
        ]
        for t in self._threads:
            t.start()

    def submit(
        self, fn: Callable[..., Any], args: tuple[Any, ...], affinity: object, done: Done, token: Any
    ) -> None:
        """Runs ``fn(*args)`` on the worker of ``affinity`` (round-robin if None); then puts
        ``(token, result, None)`` or ``(token, None, error)`` on ``done``."""
        if affinity is None:
            index = self._next
            self._next = (index + 1) % self.size
        else:
            # A new affinity gets the next worker as its home, round-robin: balanced by construction
            # (hashing would not be: ops use id()s, which are aligned addresses, all even).
            index = self._homes.get(affinity, -1)
            if index < 0:
                index = self._homes[affinity] = self._next_home
                self._next_home = (index + 1) % self.size
        self._queues[index].put((fn, args, done, token))

    def shutdown(self) -> None:
        """Lets the queued kernels finish, then stops the threads."""
        for q in self._queues:
            q.put(None)
        for t in self._threads:
            t.join()


def _work(jobs: queue.SimpleQueue[Any]) -> None:
    while True:
        job = jobs.get()
        if job is None:
            return
        fn, args, done, token = job
        try:
            result = fn(*args)
        except BaseException as error:  # noqa: BLE001 - every failure goes back to the run
            done.put((token, None, error))
        else:
            done.put((token, result, None))
        del job, fn, args, done, token  # hold nothing between jobs


def affinity_of(fn: Callable[..., Any]) -> object:
    """The affinity a kernel function declares: ``fn.affinity``, or that of the object a bound
    method or a ``functools.partial`` of one belongs to (an op's tape); None if it has none."""
    owner = getattr(fn, "__self__", None)
    if owner is None:
        inner = getattr(fn, "func", None)
        owner = getattr(inner, "__self__", None)
    return getattr(owner if owner is not None else fn, "affinity", None)
