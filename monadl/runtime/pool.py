"""The worker threads and the dispatcher that runs one run's kernels on them.

:class:`WorkerPool`: one queue per thread. A kernel may name an *affinity* (any hashable; ops use
their weight's identity): kernels of one affinity run on one worker, the forward product and its
vjps alike, so a weight's data stays in that core's cache; a new affinity gets the next worker,
round-robin. A worker whose own queue is empty takes the kernels queued for a busy one (work
stealing): locality is kept when it costs no waiting. Why not ``concurrent.futures``: its one
shared queue hands each kernel to whichever thread is free, so a weight's data wanders between
cores (``docs/benchmarks.md`` has the measurement).

:class:`Dispatcher`: the kernels of one run. The scheduler and the backward pass keep all their
bookkeeping on the calling thread; a worker only runs a kernel and posts ``(token, result, error)``.
The first error stops nothing that already runs: :meth:`Dispatcher.drain` waits for every kernel in
flight before the error is raised, so nothing of a failed run runs on after it. An interrupt (any
exception that is not an ``Exception``) does not wait: control goes back to the caller at once.
While it waits, a caller takes back the kernels no worker has started and runs them itself (waking
a thread costs about as much as a small kernel), but only while no kernel of the user's own is in
flight (that one may wait for another, a barrier say, which only the caller can start).

The caller's side takes only C-level locks (``threading.Lock``), never a ``Condition``: an
asynchronous exception (Ctrl-C) raised inside a Python-level ``Condition.__exit__`` leaves its
lock held and every worker blocked for ever. A worker sleeps on a lock of its own (``_wakes``,
released to wake it), so waking one is a C call too.
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


class Dispatcher:
    """Kernels of one run on ``pool``: ``min_cost`` is the cost (roughly, floating-point operations)
    from which a kernel is worth a hand-off."""

    def __init__(self, pool: WorkerPool, min_cost: float) -> None:
        self.pool = pool
        self.min_cost = min_cost
        self.done: Done = queue.SimpleQueue()
        self.pending = 0
        self.users = 0  # kernels of the user's own in flight (never run by the caller)
        self.error: BaseException | None = None

    def submit(
        self, fn: Callable[..., Any], args: tuple[Any, ...], token: Any, owner: Any, affinity: object
    ) -> None:
        """Runs ``fn(*args)`` on the pool; :meth:`collect` gives back ``(token, owner, result)``.
        ``owner`` None marks a kernel of the user's own."""
        self.pool.submit(fn, args, affinity, self.done, (token, owner))
        self.pending += 1
        if owner is None:
            self.users += 1

    def collect(self) -> tuple[Any, Any, Any]:
        """The next result: ``(token, owner, result)``. Raises a kernel's error once every kernel in
        flight has finished."""
        (token, owner), result, error = self._next()
        if error is not None:
            if isinstance(error, Exception):
                self.drain()
            try:
                raise error  # the kernel's own exception, with its traceback
            finally:  # which holds this frame: a local naming it would be a cycle
                del error
        return token, owner, result

    def drain(self) -> None:
        """Waits for every kernel in flight, dropping their results (after a failure)."""
        while self.pending:
            self._next()

    def _next(self) -> Any:
        """The next finished kernel's ``((token, owner), result, error)``, counted off. With no user
        of the pool's threads, this thread runs the queued kernels itself."""
        if not self.users:
            self.pool.run_own_jobs(self.done)
        done = self.done.get()
        self.pending -= 1
        if done[0][1] is None:
            self.users -= 1
        try:
            return done
        finally:  # a kernel this thread ran failed with this frame in its traceback: no cycle
            del done


def drain_failed(dispatcher: Dispatcher | None) -> None:
    """Waits for ``dispatcher``'s kernels in flight: called where a run's exception is caught, before
    it propagates, so that nothing of a failed run is left computing. (From an ``except Exception``
    clause: an interrupt propagates at once. Not a generator context manager: every backward pass
    would enter one, each body's too.)"""
    if dispatcher is not None:
        dispatcher.drain()
