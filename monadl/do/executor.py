"""The executor: interprets a ``Do`` iteratively, with a thread pool for the kernels worth it.

Design (see DESIGN.md, "Executor"):

* The interpreter runs on the calling thread. A *fiber* is an explicit stack of continuations,
  so a chain of 100,000 ``flat_map``s or a 10,000-deep recursion never touches the Python stack.
* ``Bind`` with several sources spawns one child fiber per source not yet known; the parent resumes
  when all have reported (a join). Children go on the *agenda* (a deque of ready fibers).
* Every node except ``Pure`` is memoised for the run: a node reached twice is evaluated once, and a
  fiber that reaches a node still being evaluated waits for it.
* Kernels whose ``cost`` reaches ``min_pool_cost`` go to the workers when there are two or more
  (``workers.py``: one queue per thread, and a weight's kernels always on the same thread);
  the rest run inline, because a pool hand-off costs more than a small NumPy call. All bookkeeping
  (memo, agenda, joins, reference counts in ``tape``) stays on the interpreter's thread, so it needs
  no locks; pool threads only run kernels and post their results to a queue.
* Failure: the first exception stops new work; kernels already on the pool finish; the original
  exception, with its traceback, is raised to the caller; the pool stays usable.
* Dynamic batching (``batching.py``): a batchable node is *parked* under its signature instead of
  run. When no fiber can run, each group of parked calls with equal signatures runs as one batched
  computation, whose values go back to the waiting fibers. Work ready at the same time merges: for a
  batch of trees, the same op of every node of one height.
"""

from __future__ import annotations

import os
import queue
import threading
from collections import deque
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any, TypeVar

from monadl.do.batching import Batcher, RunStats
from monadl.do.collector import gc_paused
from monadl.do.do import BATCH, BIND, DEFER, DELAY, FLAT, KERNEL, MAP, PRIVATE, PURE, Do
from monadl.do.memory import tune_allocator
from monadl.do.workers import Done, WorkerPool, affinity_of

A = TypeVar("A")

# Continuation kinds on a fiber's stack: (kind, a, b).
_K_MEMO = 0  # store the value as node a's result, wake its waiters
_K_APPLY = 1  # the value is the only source of Bind a: apply a.f per a.mode
_K_SLOT = 2  # the value is source b of join a
_K_FILL = 3  # the value is the one missing source of Bind a: b = (its other values, the index)
_K_SCATTER = 4  # the value is a merged group's list of values: one to each fiber of a (stacks)

_MISSING = object()
_PENDING = object()  # memo marker: being evaluated by some fiber
_SUSPENDED = object()  # a kernel went to the pool: the fiber waits for its completion

Stack = list[tuple[int, Any, Any]]


class _Join:
    """A parent fiber waiting for the values of a multi-source ``Bind``."""

    __slots__ = ("node", "pending", "stack", "values")

    def __init__(self, node: Any, stack: Stack, values: list[Any], pending: int) -> None:
        self.node = node
        self.stack = stack
        self.values = values
        self.pending = pending


class Executor(AbstractContextManager["Executor"]):
    """Runs ``Do`` computations.

    ``workers``: pool size; 1 runs everything strictly sequentially on the calling thread.
    ``min_pool_cost``: kernels cheaper than this (roughly, floating-point operations) run inline.
    ``limit_blas``: with several workers, BLAS is capped at one thread (parallelism comes from
    independent sub-graphs; BLAS threads on top of pool threads oversubscribe the cores).
    ``batching``: merge batchable work of equal signature (dynamic batching; ``run`` can override it).
    ``planning``: let training and prediction run a graph that is visible before it runs by a plan:
    with batching, a wide one level by level, merged as a whole (``monadl.dsl.fold``); one of ops
    on weights and constants only as a list of ops (``monadl.dsl.straight``). The executor's own
    ``run`` never plans.
    ``pause_gc``: pause Python's cyclic garbage collector during a run (``collector.py``: a run
    makes no reference cycles, and the collector's passes cost up to a third of a large batch's time).
    """

    def __init__(
        self,
        workers: int = 1,
        *,
        min_pool_cost: float = 1e5,
        limit_blas: bool = True,
        batching: bool = True,
        planning: bool = True,
        pause_gc: bool = True,
    ) -> None:
        if workers < 1:
            raise ValueError(f"Executor: workers must be >= 1, got {workers}")
        tune_allocator()
        self.workers = workers
        self.min_pool_cost = min_pool_cost
        self.batching = batching
        self.planning = planning
        self.pause_gc = pause_gc
        self.last_stats = RunStats()
        """What the last run did (kernel launches, merged groups), for benchmarks and tests."""
        self.stats = RunStats()
        """The same, summed over every run since it was made (assign a fresh ``RunStats`` to reset)."""
        self._pool = WorkerPool(workers) if workers > 1 else None
        self._blas_limit: Any = None
        if self._pool is not None and limit_blas:
            from threadpoolctl import threadpool_limits

            self._blas_limit = threadpool_limits(limits=1, user_api="blas")

    def paused(self) -> AbstractContextManager[None]:
        """The garbage-collector pause of this executor's runs (``pause_gc``), for runs made
        elsewhere too (``monadl.dsl.straight``)."""
        return gc_paused() if self.pause_gc else nullcontext()

    @property
    def pool(self) -> WorkerPool | None:
        """The worker threads (None for a sequential executor, or once closed)."""
        return self._pool

    def run(self, do: Do[A], *, batching: bool | None = None) -> A:
        """Evaluates ``do`` and returns its value, or raises the exception that failed it.
        ``batching``: this run's dynamic batching (default: the executor's)."""
        state = _Run(self._pool, self.min_pool_cost, self.batching if batching is None else batching)
        try:
            with self.paused():
                result: A = state.execute(do)
        finally:
            state.stats.kernels = state.kernels
            state.stats.signatures = len(state.signatures)
            self.last_stats = state.stats
            self.stats.add(state.stats)
        return result

    def close(self) -> None:
        """Shuts the pool down and restores BLAS threading. Idempotent."""
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None
        if self._blas_limit is not None:
            self._blas_limit.restore_original_limits()
            self._blas_limit = None

    def __exit__(self, *exc: object) -> None:
        self.close()


_FAN = object()
"""The first item of a fan signature's key among the parked groups (no signature's)."""


class _Run:
    """The state of one run: memo, agenda, pool completions."""

    __slots__ = (
        "agenda",
        "batching",
        "done",
        "inflight",
        "kernels",
        "memo",
        "min_pool_cost",
        "parked",
        "pool",
        "signatures",
        "stats",
        "waiters",
    )

    def __init__(self, pool: WorkerPool | None, min_pool_cost: float, batching: bool) -> None:
        self.pool = pool
        self.min_pool_cost = min_pool_cost
        self.batching = batching
        # Parked batchable calls, by signature: (batcher, waiting stacks, nodes).
        self.parked: dict[Any, tuple[Batcher, list[Stack], list[Any]]] = {}
        self.stats = RunStats()
        self.kernels = 0  # kernel launches (a plain int: counted in the hot loop)
        self.signatures: set[int] = set()  # hashes of the signatures launched (not the signatures:
        # they hold tapes, which must not outlive the run)
        self.memo: dict[Do[Any], Any] = {}
        self.waiters: dict[Do[Any], list[Stack]] = {}
        # Ready fibers: (stack, evaluating, node-or-value).
        self.agenda: deque[tuple[Stack, bool, Any]] = deque()
        self.done: Done = queue.SimpleQueue()
        self.inflight = 0

    def execute(self, do: Do[Any]) -> Any:
        root: Stack = []
        result: list[Any] = []
        # The root fiber's last continuation records the result.
        root.append((_K_SLOT, result, None))
        self.agenda.append((root, True, do))
        try:
            self._loop()
        except BaseException:
            self._drain()
            raise
        if not result:  # pragma: no cover - would be an interpreter bug
            raise RuntimeError("monadl: the computation did not complete (a fiber was lost)")
        return result[0]

    def _loop(self) -> None:
        agenda = self.agenda
        while True:
            if agenda:
                stack, evaluating, x = agenda.pop()
                try:
                    self._drive(stack, evaluating, x)
                except BaseException:
                    _break_stacks([stack])  # the failed fiber's: see _drain
                    raise
            elif self.parked:
                parked = self.parked
                try:
                    self._flush()
                except BaseException:  # a call run alone failed: break its group's fibers' cycles
                    _break_stacks([stack for group in parked.values() for stack in group[1]])
                    raise
            elif self.inflight:
                stack, result, error = self.done.get()
                self.inflight -= 1
                if error is not None:
                    _break_stacks([stack])
                    try:
                        raise error  # the kernel's own exception, with its traceback
                    finally:  # which holds this frame: a local naming it would be a cycle
                        del error
                agenda.append((stack, False, result))
            else:
                return

    def _drain(self) -> None:
        """Waits for the kernels already on the pool, so nothing runs after the run has failed."""
        while self.inflight:
            self.done.get()
            self.inflight -= 1
        # A fiber's stack and the join it waits on refer to each other: clear the stacks of the
        # fibers left waiting, so that a failed run leaves no reference cycle behind.
        _break_stacks([stack for stack, _, _ in self.agenda])
        _break_stacks([stack for group in self.parked.values() for stack in group[1]])
        _break_stacks([stack for stacks in self.waiters.values() for stack in stacks])
        self.agenda.clear()
        self.memo.clear()
        self.waiters.clear()
        self.parked.clear()

    def _park(self, stack: Stack, node: Any) -> bool:
        """Parks a batchable node under its signature; False if it runs now instead: when nothing
        else can run (so nothing could merge with it; it is counted here), or it cannot be batched."""
        batcher = node.batch
        if not (self.agenda or self.parked or self.inflight):
            kinds = self.stats.kinds
            name = batcher.name(node)
            kinds[name] = kinds.get(name, 0) + 1
            return False
        signature = batcher.signature(node)
        if signature is None:
            fan = batcher.fan_signature(node)
            if fan is None:
                return False
            signature = (_FAN, fan)  # it can merge only by fanning out: parked as such
        group = self.parked.get(signature)
        if group is None:
            self.parked[signature] = (batcher, [stack], [node])
        else:
            group[1].append(stack)
            group[2].append(node)
        return True

    def _flush(self) -> None:
        """Runs the parked groups: each of two or more calls as one batched computation, whose
        list of values a scatter continuation hands back to the waiting fibers. Calls left alone
        are grouped again by their fan signatures (and join the calls parked by theirs)."""
        parked, self.parked = self.parked, {}
        fans: dict[Any, tuple[Batcher, list[Stack], list[Any]]] = {}
        for signature, (batcher, stacks, nodes) in parked.items():
            if type(signature) is tuple and signature[0] is _FAN:
                fan = signature
            elif len(nodes) > 1:
                self._merge(signature, batcher, stacks, nodes, batcher.run)
                continue
            else:
                key = batcher.fan_signature(nodes[0])
                if key is None:
                    self._alone(signature, batcher, stacks[0], nodes[0])
                    continue
                fan = (_FAN, key)
            group = fans.get(fan)
            if group is None:
                fans[fan] = (batcher, stacks, nodes)  # (parked's lists: parked is dropped)
            else:
                group[1].extend(stacks)
                group[2].extend(nodes)
        for signature, (batcher, stacks, nodes) in fans.items():
            if len(nodes) > 1:
                self._merge(signature, batcher, stacks, nodes, batcher.run_fan)
            else:
                self._alone(signature, batcher, stacks[0], nodes[0])

    def _merge(
        self,
        signature: Any,
        batcher: Batcher,
        stacks: list[Stack],
        nodes: list[Any],
        run: Callable[[list[Any]], Do[list[Any]]],
    ) -> None:
        """Starts one computation (``run``'s) for the nodes of a group."""
        self._count(signature, batcher, nodes[0])
        stats = self.stats
        stats.groups += 1
        stats.merged += len(nodes)
        self.agenda.append(([(_K_SCATTER, stacks, None)], True, run(nodes)))

    def _alone(self, signature: Any, batcher: Batcher, stack: Stack, node: Any) -> None:
        """Runs a parked node that merges with nothing, as if batching were off."""
        self._count(signature, batcher, node)
        if node.tag & ~PRIVATE == KERNEL:
            self.kernels += 1
            value = (
                node.fn(*node.args)
                if self.pool is None
                else self._dispatch(stack, node.fn, node.args, node.cost)
            )
            if value is not _SUSPENDED:
                self.agenda.append((stack, False, value))
        else:
            self.agenda.append((stack, True, node.fn(*node.args)))

    def _count(self, signature: Any, batcher: Batcher, node: Any) -> None:
        """Counts a launch of parked work (a group, or a node alone) by kind and by signature."""
        kinds = self.stats.kinds
        name = batcher.name(node)
        kinds[name] = kinds.get(name, 0) + 1
        self.signatures.add(hash(signature))

    def _dispatch(self, stack: Stack, fn: Callable[..., Any], args: tuple[Any, ...], cost: Any) -> Any:
        """Runs a kernel inline, or sends it to the pool and returns ``_SUSPENDED``.

        ``cost`` is a float, or a function giving it (only asked for when there is a pool)."""
        pool = self.pool
        if pool is None:
            return fn(*args)
        if type(cost) is not float:
            cost = cost()
        if cost < self.min_pool_cost:
            return fn(*args)
        pool.submit(fn, args, affinity_of(fn), self.done, stack)
        self.inflight += 1
        return _SUSPENDED

    def _drive(self, stack: Stack, evaluating: bool, x: Any) -> None:
        """Runs one fiber until it finishes, suspends, or waits on a join or a memo entry.

        One loop with two phases: *evaluating* a node (``node``), or *returning* a value
        (``value``) to the continuation on top of ``stack``."""
        memo = self.memo
        agenda = self.agenda
        pool = self.pool  # None: every kernel runs inline, here
        node: Any = x
        value: Any = x
        while True:
            if evaluating:
                tag = node.tag
                if tag == PURE:
                    value = node.value
                    evaluating = False
                    continue
                if tag & PRIVATE:  # referenced from one place only: no memo entry needed
                    tag ^= PRIVATE
                else:
                    known = memo.get(node, _MISSING)
                    if known is not _MISSING:
                        if known is _PENDING:
                            self.waiters.setdefault(node, []).append(stack)
                            return
                        value = known
                        evaluating = False
                        continue
                    memo[node] = _PENDING
                    stack.append((_K_MEMO, node, None))
                if tag == BIND:
                    sources = node.sources
                    if len(sources) == 1:
                        stack.append((_K_APPLY, node, None))
                        node = sources[0]
                        continue
                    values, missing = self._known(sources)
                    if len(missing) == 1:  # one source to wait for (a chain): no join needed
                        i = missing[0]
                        stack.append((_K_FILL, node, (values, i)))
                        node = sources[i]
                        continue
                    if missing:
                        # The first missing source goes on in this fiber, on this stack (the join
                        # resumes this same stack, whichever source reports last); the others are
                        # new fibers.
                        join = _Join(node, stack, values, len(missing))
                        for i in missing[1:]:
                            self._spawn([(_K_SLOT, join, i)], sources[i])
                        stack.append((_K_SLOT, join, missing[0]))
                        node = sources[missing[0]]
                        continue
                    mode = node.mode
                    if mode == FLAT:
                        node = node.f(*values)
                        continue
                    if mode == MAP:
                        value = node.f(*values)
                    else:
                        self.kernels += 1
                        value = (
                            node.f(*values)
                            if pool is None
                            else self._dispatch(stack, node.f, tuple(values), node.cost)
                        )
                elif tag == DEFER:
                    node = node.thunk()
                    continue
                elif tag == KERNEL:
                    if node.batch is not None and self.batching and self._park(stack, node):
                        return
                    self.kernels += 1
                    value = (
                        node.fn(*node.args)
                        if pool is None
                        else self._dispatch(stack, node.fn, node.args, node.cost)
                    )
                elif tag == DELAY:
                    value = node.thunk()
                elif tag == BATCH:
                    if self.batching and self._park(stack, node):
                        return
                    node = node.fn(*node.args)
                    continue
                else:
                    raise TypeError(f"monadl: not a Do node: {node!r}")
                if value is _SUSPENDED:
                    return
                evaluating = False
            else:
                if not stack:
                    return
                kind, a, b = stack.pop()
                if kind == _K_MEMO:
                    memo[a] = value
                    if self.waiters:
                        waiting = self.waiters.pop(a, None)
                        if waiting:
                            for w in waiting:
                                agenda.append((w, False, value))
                    continue
                if kind == _K_APPLY:
                    mode = a.mode
                    if mode == FLAT:
                        node = a.f(value)
                        evaluating = True
                    elif mode == MAP:
                        value = a.f(value)
                    else:
                        self.kernels += 1
                        value = a.f(value) if pool is None else self._dispatch(stack, a.f, (value,), a.cost)
                        if value is _SUSPENDED:
                            return
                    continue
                if kind == _K_SCATTER:  # a merged group's values: one to each waiting fiber
                    for waiting, v in zip(a, value, strict=True):
                        agenda.append((waiting, False, v))
                    return
                if kind == _K_FILL:  # the one missing source of Bind a has come
                    bind = a
                    values, i = b
                    values[i] = value
                else:  # _K_SLOT: source b of join a has come
                    if type(a) is list:  # the root's result cell
                        a.append(value)
                        return
                    a.values[b] = value
                    a.pending -= 1
                    if a.pending:
                        return
                    stack = a.stack
                    bind = a.node
                    values = a.values
                # All sources known: apply the Bind. (Written out here and above rather than called:
                # this loop runs a few times per op, and a call costs more than the op's bookkeeping.)
                mode = bind.mode
                if mode == FLAT:
                    node = bind.f(*values)
                    evaluating = True
                elif mode == MAP:
                    value = bind.f(*values)
                else:
                    self.kernels += 1
                    value = (
                        bind.f(*values)
                        if pool is None
                        else self._dispatch(stack, bind.f, tuple(values), bind.cost)
                    )
                    if value is _SUSPENDED:
                        return

    def _spawn(self, stack: Stack, node: Any) -> None:
        """A new fiber for ``node``; or, if it would only wait on a node being evaluated (``node``
        itself, or the source of a map of one source, such as an output of a parked call), that
        wait registered now, without running the fiber to find out."""
        memo = self.memo
        known = memo.get(node, _MISSING)
        if known is _PENDING:
            self.waiters.setdefault(node, []).append(stack)
            return
        if known is _MISSING and node.tag == BIND and node.mode == MAP and len(node.sources) == 1:
            source = node.sources[0]
            if memo.get(source, _MISSING) is _PENDING:
                memo[node] = _PENDING
                stack.append((_K_MEMO, node, None))
                stack.append((_K_APPLY, node, None))
                self.waiters.setdefault(source, []).append(stack)
                return
        self.agenda.append((stack, True, node))

    def _known(self, sources: tuple[Do[Any], ...]) -> tuple[list[Any], list[int]]:
        """The values of ``sources`` already known, and the indices of those that are not."""
        memo = self.memo
        values: list[Any] = []
        missing: list[int] = []
        for i, s in enumerate(sources):
            tag = s.tag
            if tag == PURE:
                values.append(s.value)  # type: ignore[attr-defined]
                continue
            v = memo.get(s, _MISSING)
            if v is _MISSING:
                if tag == DELAY:  # cheap and on this thread (a weight's forward): no fiber for it
                    v = memo[s] = s.thunk()  # type: ignore[attr-defined]
                    values.append(v)
                    continue
                if tag & ~PRIVATE == BIND and s.mode == MAP and len(s.sources) == 1:  # type: ignore[attr-defined]
                    # A cheap map of a known value (a row of a merged result): no fiber for it.
                    source = s.sources[0]  # type: ignore[attr-defined]
                    known = source.value if source.tag == PURE else memo.get(source, _MISSING)
                    if known is not _MISSING and known is not _PENDING:
                        v = s.f(known)  # type: ignore[attr-defined]
                        if not tag & PRIVATE:
                            memo[s] = v
                        values.append(v)
                        continue
                missing.append(i)
                values.append(None)
            elif v is _PENDING:
                missing.append(i)
                values.append(None)
            else:
                values.append(v)
        return values, missing


def _break_stacks(stacks: list[Stack]) -> None:
    """Clears fibers' stacks, with the stacks their continuations hold (a join's parent, a merged
    group's members), so that the fibers of a failed run leave no reference cycle."""
    while stacks:
        stack = stacks.pop()
        entries = list(stack)
        stack.clear()
        for kind, a, _ in entries:
            if kind == _K_SCATTER:
                stacks.extend(a)
            elif kind == _K_SLOT and type(a) is _Join:
                stacks.append(a.stack)


_default: Executor | None = None
_default_lock = threading.Lock()


def default_executor() -> Executor:
    """The process-wide executor: ``MONADL_WORKERS`` workers (default 1: sequential).

    Sequential by default because that measured fastest on this project's 2-core machines: handing
    a ~100 us matmul to another thread costs about what it saves there (the CIFAR column benchmark
    ran ~30% slower on 2 workers). Measure your own machine with ``python -m monadl.bench columns``
    (the model on 1, 2 and 4 workers) and ``python -m monadl.bench threads`` (what two threads gain)."""
    global _default
    with _default_lock:
        if _default is None:
            workers = int(os.environ.get("MONADL_WORKERS", "1"))
            _default = Executor(workers)
        return _default


def set_default_executor(executor: Executor | None) -> Executor | None:
    """Replaces the process-wide executor (None: a fresh one is made when next needed); returns the
    previous one (not closed)."""
    global _default
    with _default_lock:
        previous, _default = _default, executor
        return previous


def run(do: Do[A], executor: Executor | None = None) -> A:
    """Runs ``do`` on ``executor`` (default: :func:`default_executor`)."""
    return (executor or default_executor()).run(do)
