"""The executor's worker threads: one queue per thread, and kernels routed by affinity.

Why not ``concurrent.futures.ThreadPoolExecutor``: its one shared queue hands each kernel to
whichever thread is free, so a weight's data wanders between cores. Measured on this project's
2-core machines, four 16x3072 @ 3072x64 float32 matmuls (one 786 KB weight each) took 540 us on a
2-thread ThreadPoolExecutor, 386-521 us on one thread, and 296-325 us on two threads when each
weight's matmuls always ran on the same thread: the weight stays in that core's L2 cache.

So a kernel may name an *affinity* (any hashable; ops use their weight's identity): kernels of the
same affinity always run on the same worker, the forward matmul and its vjps alike: each new
affinity is given the next worker, round-robin. Kernels without one go round-robin too. A worker
whose own queue is empty takes the kernels queued for a busy worker (work stealing): locality is
kept when it costs no waiting. A worker posts ``(token, result, error)`` to the caller's queue.

A caller waiting for its kernels may take back the ones that no worker has started and run them
itself (``run_own_jobs``): waking a thread costs ~50 us on this project's VMs (a queue round trip
between two threads takes 100 us), as long as a kernel worth a worker, so a caller that only slept
would leave a core idle. Only a caller whose kernels never wait for one another may do so: the
dispatcher (``dispatch.py``) does it while only primitives' arithmetic is in flight, never while a
kernel of the user's own is (it may wait for another one, a barrier say, that only the caller can
start).

The caller's side takes only C-level locks (``threading.Lock``), never a ``Condition``: an
asynchronous exception (Ctrl-C, a signal handler's) is raised in the caller between bytecodes, and
one raised inside a Python-level ``Condition.__exit__`` leaves its lock held, every worker blocked
on it for ever. A ``Lock``'s ``with`` has no such window. A worker sleeps on a lock of its own
(``_wakes``: released to wake it, a binary semaphore), so waking one is a C call too.
"""

from __future__ import annotations

import queue
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

Done = queue.SimpleQueue[tuple[Any, Any, BaseException | None]]


class WorkerPool:
    """``size`` daemon threads, each with its own queue of kernels; an idle worker steals from the
    queue of a busy one, so affinity is a preference, never a wait (a kernel that blocks, or a long
    one, cannot hold up the kernels queued behind it while another worker is idle)."""

    def __init__(self, size: int, name: str = "monadl") -> None:
        self.size = size
        self._lock = threading.Lock()  # the queues and flags below
        self._wakes = [threading.Lock() for _ in range(size)]  # held while its worker has no news
        for wake in self._wakes:
            wake.acquire()
        self._queues: list[deque[Any]] = [deque() for _ in range(size)]
        self._busy = [False] * size
        self._closed = False
        self._next = 0
        self._next_home = 0
        self._homes: dict[object, int] = {}  # affinity -> its worker
        self._threads = [
            threading.Thread(target=self._work, args=(i,), name=f"{name}-{i}", daemon=True)
            for i in range(size)
        ]
        for t in self._threads:
            t.start()

    def submit(
        self, fn: Callable[..., Any], args: tuple[Any, ...], affinity: object, done: Done, token: Any
    ) -> None:
        """Runs ``fn(*args)`` on the worker of ``affinity`` (round-robin if None) or on an idle one;
        then puts ``(token, result, None)`` or ``(token, None, error)`` on ``done``."""
        with self._lock:
            if affinity is None:
                index = self._next
                self._next = (index + 1) % self.size
            else:
                # A new affinity gets the next worker as its home, round-robin: balanced by
                # construction (hashing would not be: ops use id()s, aligned addresses, all even).
                index = self._homes.get(affinity, -1)
                if index < 0:
                    index = self._homes[affinity] = self._next_home
                    self._next_home = (index + 1) % self.size
            self._queues[index].append((fn, args, done, token))
            self._wake_all()

    def steal(self, done: Done) -> tuple[Callable[..., Any], tuple[Any, ...], Done, Any] | None:
        """A job posted to ``done`` that no worker has started, taken back for the caller to run
        itself (the last queued of the longest queue: the one the workers would reach last);
        None if there is none."""
        with self._lock:
            for jobs in sorted(self._queues, key=len, reverse=True):
                for k in range(len(jobs) - 1, -1, -1):
                    if jobs[k][2] is done:
                        job = jobs[k]
                        del jobs[k]
                        return job  # type: ignore[no-any-return]
        return None

    def run_own_jobs(self, done: Done) -> None:
        """While ``done`` holds no result, takes back the caller's jobs (those posting to ``done``)
        that no worker has started, and runs them on the calling thread, posting their results to
        ``done`` as a worker would. Called by a caller about to wait on ``done``."""
        while done.empty():
            job = self.steal(done)
            if job is None:
                return
            _run(job)

    def _wake_all(self) -> None:
        """Wakes every sleeping worker (one already woken stays so). Called with the lock held."""
        for wake in self._wakes:
            if wake.locked():  # (only holders of the lock release a wake; its worker only takes it)
                wake.release()

    def _take(self, me: int) -> Any:
        """The next job for worker ``me``: its own, else one queued for a busy worker; None if
        there is none. Called with the lock held."""
        if self._queues[me]:
            return self._queues[me].popleft()
        for other, jobs in enumerate(self._queues):
            if jobs and self._busy[other]:  # its owner is busy: take it rather than wait
                return jobs.popleft()
        return None

    def _work(self, me: int) -> None:
        wake = self._wakes[me]
        while True:
            with self._lock:
                job = self._take(me)
                if job is None:
                    if self._closed and not any(self._queues):
                        return
                else:
                    self._busy[me] = True
                    if self._queues[me]:  # what is left behind may now be taken by an idle worker
                        self._wake_all()
            if job is None:
                wake.acquire()  # until a submit, or a worker that leaves jobs behind, releases it
                continue
            _run(job)
            del job  # hold nothing between jobs
            with self._lock:
                self._busy[me] = False
                if any(self._queues):  # others may be waiting for this worker's queue
                    self._wake_all()

    def shutdown(self) -> None:
        """Lets the queued kernels finish, then stops the threads."""
        with self._lock:
            self._closed = True
            self._wake_all()
        for t in self._threads:
            t.join()


def _run(job: tuple[Callable[..., Any], tuple[Any, ...], Done, Any]) -> None:
    """Runs a job, on a worker or on its caller, and posts ``(token, result, None)`` or
    ``(token, None, error)`` to its queue: every failure goes back to the run."""
    fn, args, done, token = job
    try:
        result = fn(*args)
    except BaseException as error:  # noqa: BLE001 - handed on to the run, which raises it
        done.put((token, None, error))
    else:
        done.put((token, result, None))


def affinity_of(fn: Callable[..., Any]) -> object:
    """The affinity a kernel function declares: ``fn.affinity``, or that of the object a bound
    method or a ``functools.partial`` of one belongs to (an op's tape); None if it has none."""
    owner = getattr(fn, "__self__", None)
    if owner is None:
        inner = getattr(fn, "func", None)
        owner = getattr(inner, "__self__", None)
    return getattr(owner if owner is not None else fn, "affinity", None)
