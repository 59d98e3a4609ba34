"""The one pool dispatcher: kernels of a run sent to the worker threads, their results taken back.

The scheduler and the backward pass keep all bookkeeping on the calling thread; a worker only runs a
kernel and posts ``(token, result, error)``. :meth:`Dispatcher.collect` hands the caller one result
at a time. The first error stops nothing that already runs: :meth:`Dispatcher.drain` waits for
every kernel in flight before the error is raised, so nothing of a failed run runs on after it.
An interrupt (``KeyboardInterrupt``, or any exception that is not an ``Exception``) does not wait:
control goes back to the caller at once, and what is in flight finishes on the workers unseen (a
kernel only computes its result: it changes nothing the caller holds).

While it waits, a caller takes back the kernels no worker has started and runs them itself
(``WorkerPool.run_own_jobs``): waking a thread costs about as much as a small kernel on this
project's machines, so a caller that only slept would leave a core idle. It does so only while no
kernel of the user's own is in flight: a user's kernel may wait for another one (a barrier, say),
and the caller must not be the thread that blocks on it.
"""

from __future__ import annotations

import queue
from collections.abc import Callable
from typing import Any

from monadl.do.workers import Done, WorkerPool


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
        if not self.users:
            self.pool.run_own_jobs(self.done)
        (token, owner), result, error = self.done.get()
        self.pending -= 1
        if owner is None:
            self.users -= 1
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
            if not self.users:
                self.pool.run_own_jobs(self.done)
            (_, owner), _, _ = self.done.get()
            self.pending -= 1
            if owner is None:
                self.users -= 1
