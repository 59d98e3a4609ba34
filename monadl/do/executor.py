"""The executor: runs ``Do`` computations with the scheduler, a thread pool, and compiled programs.

Design (see DESIGN.md, "Execution core"):

* One scheduler (``scheduler.py``) interprets every ``Do``: it walks the graph iteratively, runs
  the differentiable program level by level with equal calls merged (dynamic batching), and expands
  the monad's dynamic nodes (``flat_map``, ``defer``, coroutines) when they are ready. Everything it
  computes is a step of the run's record (``program.py``), which the backward pass reads.
* Compile once, replay: a run whose graph is all ops on weights and constants (no ``flat_map``,
  no batchable calls: a feed-forward model, the CIFAR column model) has a *structure* (the ops,
  their parameters, the leaves' shapes and dtypes), and its steps are kept as a :class:`~monadl.
  do.program.Program`. A later run of equal structure replays them on its own weights and constants:
  no grouping, no shape checks, no per-op decisions; only the checks that read values run again.
* Kernels whose cost reaches ``min_pool_cost`` go to the workers when there are two or more (one
  dispatcher, ``dispatch.py``, for the forward and the backward pass); the rest run inline, because
  a pool hand-off costs more than a small NumPy call. All bookkeeping stays on the calling thread.
* Failure: the first exception stops new work; kernels already on the pool finish; the original
  exception, with its traceback, is raised to the caller; the pool stays usable.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from contextlib import AbstractContextManager, nullcontext
from typing import Any, TypeVar

from monadl.do.collector import gc_paused
from monadl.do.dispatch import Dispatcher
from monadl.do.do import Do, Variable
from monadl.do.memory import tune_allocator
from monadl.do.primitive import value_key
from monadl.do.program import Program, Ref, Run, RunTape, Step
from monadl.do.scheduler import Scheduler
from monadl.do.stats import RunStats
from monadl.do.structure import structure_of
from monadl.do.versions import Snapshot, data_of, snapshot
from monadl.do.workers import WorkerPool

A = TypeVar("A")


class Evaluation:
    """A finished forward run: its record, and its root's value (``root``: where it is, when the
    root is a node of the differentiable program; then ``value`` is its data)."""

    def __init__(self, run: Run, root: Ref | None, value: Any) -> None:
        self.run = run
        self.root = root
        self.value = value


class Seen:
    """A root run before, whose structure has a program: its key and its bound nodes (the leaves
    and per-run parameters a replay reads). The same root run again replays without a walk, if its
    weights still have the shapes and dtypes the key holds."""

    def __init__(self, key: Any, nodes: list[Do[Any]]) -> None:
        self.key = key
        self.nodes = nodes

    def unchanged(self) -> bool:
        """Whether every weight still has the shape and dtype it had. (Read from the key, not kept
        apart: most roots are never run again, and this costs nothing until one is.) The key's
        weight entries, ``("v", kind)``, are in the order of the weights among the bound nodes."""
        entries = self.key[2]
        i = 0
        for node in self.nodes:
            if type(node) is Variable:
                while entries[i][0] != "v":
                    i += 1
                if value_key(data_of(node.weight, None)) != entries[i][1]:
                    return False
                i += 1
        return True


class Executor(AbstractContextManager["Executor"]):
    """Runs ``Do`` computations.

    ``workers``: pool size; 1 runs everything strictly sequentially on the calling thread.
    ``min_pool_cost``: kernels cheaper than this (roughly, floating-point operations) run inline.
    ``limit_blas``: with several workers, BLAS is capped at one thread (parallelism comes from
    independent sub-graphs; BLAS threads on top of pool threads oversubscribe the cores).
    ``batching``: merge the calls of equal signature that are ready together (dynamic batching;
    ``run`` can override it); off, every call runs on its own, in the same loop.
    ``replay``: keep the programs of static graphs and replay them for runs of equal structure.
    ``pause_gc``: pause Python's cyclic garbage collector during a run (``collector.py``: a run
    makes no reference cycles, and the collector's passes cost up to a third of a large batch's time).
    ``check_finite``: a training step whose new weight values are not all finite (a gradient of
    NaN or infinity) fails and changes nothing; off, it is applied (one pass over each updated
    weight saved).
    """

    def __init__(
        self,
        workers: int = 1,
        *,
        min_pool_cost: float = 1e5,
        limit_blas: bool = True,
        batching: bool = True,
        replay: bool = True,
        pause_gc: bool = True,
        check_finite: bool = True,
    ) -> None:
        if isinstance(workers, bool) or not isinstance(workers, int):
            raise TypeError(f"Executor: workers must be an int, got {type(workers).__name__}")
        if workers < 1:
            raise ValueError(f"Executor: workers must be >= 1, got {workers}")
        tune_allocator()
        self.workers = workers
        self.min_pool_cost = float(min_pool_cost)
        self.batching = batching
        self.replay = replay
        self.pause_gc = pause_gc
        self.check_finite = check_finite
        self.last_stats = RunStats()
        """What the last run did (a training step: its forward and backward passes together)."""
        self.stats = RunStats()
        """The same, summed over every run since it was made (assign a fresh ``RunStats`` to reset)."""
        self._programs: OrderedDict[Any, Program] = OrderedDict()
        self._seen: OrderedDict[Do[Any], Seen] = OrderedDict()  # roots run lately, by identity
        self._programs_lock = threading.Lock()
        self._pool = WorkerPool(workers) if workers > 1 else None
        self._blas_limit: Any = None
        if self._pool is not None and limit_blas:
            from threadpoolctl import threadpool_limits

            self._blas_limit = threadpool_limits(limits=1, user_api="blas")

    PROGRAMS = 16
    """How many compiled programs an executor keeps (the least recently used is dropped)."""

    def paused(self) -> AbstractContextManager[None]:
        """The garbage-collector pause of this executor's runs (``pause_gc``)."""
        return gc_paused() if self.pause_gc else nullcontext()

    @property
    def pool(self) -> WorkerPool | None:
        """The worker threads (None for a sequential executor, or once closed)."""
        return self._pool

    def dispatcher(self) -> Dispatcher | None:
        """A dispatcher of kernels to this executor's pool, for one run (None without a pool)."""
        return None if self._pool is None else Dispatcher(self._pool, self.min_pool_cost)

    def run(self, do: Do[A], *, batching: bool | None = None) -> A:
        """Evaluates ``do`` and returns its value, or raises the exception that failed it (a
        layer's forward gives its tape). ``batching``: this run's dynamic batching (default: the
        executor's)."""
        stats = RunStats()
        try:
            with self.paused():
                evaluation = self.evaluate(do, stats, batching=batching)
        finally:
            self.publish(stats)
        if evaluation.root is not None:
            return RunTape(evaluation.run, evaluation.root)  # type: ignore[return-value]
        return evaluation.value  # type: ignore[no-any-return]

    def evaluate(
        self, do: Do[Any], stats: RunStats, *, batching: bool | None = None, own_root: bool = False
    ) -> Evaluation:
        """The forward run of ``do``, counted in ``stats`` (published by the caller): replayed from a
        compiled program where one fits, else interpreted by the scheduler. ``own_root``: the
        root's value in a slot of its own (a backward pass is seeded there)."""
        dispatcher = self.dispatcher()
        taken = snapshot()  # every weight as of the newest commit, for the whole run
        batch = self.batching if batching is None else batching
        seen = self._seen_again(do, batch, own_root)
        if seen is not None:  # the same graph again: no walk
            program = self._program(seen.key)
            if program is not None:
                replayed = replay(program, seen.nodes, dispatcher, stats, taken)
                return Evaluation(replayed, program.root, replayed.value(program.root))
        structure = structure_of(do) if self.replay else None
        key: Any = None
        if structure is not None:
            key = (batch, own_root, structure.key)
            program = self._program(key)
            if program is not None:
                replayed = replay(program, structure.nodes, dispatcher, stats, taken)
                self._remember(do, batch, own_root, Seen(key, structure.nodes))
                return Evaluation(replayed, program.root, replayed.value(program.root))
        run = Run([] if structure is None else structure.nodes, dispatcher, stats, taken)
        scheduler = Scheduler(run, batch, {} if structure is None else structure.index)
        try:
            scheduler.walk(do)
            scheduler.drain()
            if do not in scheduler.values:  # pragma: no cover - a scheduler bug, not a user's
                raise RuntimeError("monadl: the computation did not complete (a node was never run)")
            value = scheduler.value_of(do)
            root: Ref | None = None
            if type(value) is RunTape and value.run is run:  # a tape handed back by user code
                value = value.ref
            if type(value) is not Ref and own_root:
                value = scheduler.ref_of(do, value, "the root")
            if type(value) is Ref:
                root = value
                if own_root and root.row >= 0:
                    root = Ref(scheduler.own(root), -1)
                value = run.value(root)
        except Exception:  # (an interrupt returns at once: dispatch.py)
            if dispatcher is not None:
                dispatcher.drain()
            raise
        stats.signatures = len(scheduler.signatures)
        if key is not None and run.replayable and root is not None:
            self._keep(key, Program(run.steps, len(run.datas), root, _forward_stats(stats)))
            self._remember(do, batch, own_root, Seen(key, run.nodes))
        return Evaluation(run, root, value)

    def publish(self, stats: RunStats) -> None:
        """Makes ``stats`` the last run's and adds them to the executor's total."""
        self.last_stats = stats
        self.stats.add(stats)

    SEEN = 8
    """How many roots an executor remembers by identity (holding their graphs)."""

    def _seen_again(self, do: Do[Any], batch: bool, own_root: bool) -> Seen | None:
        with self._programs_lock:
            seen = self._seen.get(do)
        if seen is None or seen.key[0] != batch or seen.key[1] != own_root or not seen.unchanged():
            return None
        return seen

    def _remember(self, do: Do[Any], batch: bool, own_root: bool, seen: Seen) -> None:
        with self._programs_lock:
            self._seen[do] = seen
            self._seen.move_to_end(do)
            while len(self._seen) > self.SEEN:
                self._seen.popitem(last=False)

    def _program(self, key: Any) -> Program | None:
        with self._programs_lock:
            program = self._programs.get(key)
            if program is not None:
                self._programs.move_to_end(key)
            return program

    def _keep(self, key: Any, program: Program) -> None:
        with self._programs_lock:
            self._programs[key] = program
            while len(self._programs) > self.PROGRAMS:
                self._programs.popitem(last=False)

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


def _forward_stats(stats: RunStats) -> RunStats:
    """The counts a replay of a program repeats without computing them: its merges and launches by
    kind (kernels are counted as they run)."""
    return RunStats(
        merged=stats.merged, groups=stats.groups, kinds=dict(stats.kinds), signatures=stats.signatures
    )


def replay(
    program: Program, nodes: list[Do[Any]], dispatcher: Dispatcher | None, stats: RunStats, taken: Snapshot
) -> Run:
    """Runs ``program``'s steps on the leaves and per-run parameters of ``nodes`` (a new run of
    its structure): no walk, no grouping, no shape checks. With a pool, a heavy step goes to it
    and a step waits only for the slots it reads."""
    run = Run(nodes, dispatcher, stats, taken)
    run.reserve(program.slots)
    run.steps = program.steps
    stats.add(program.stats)  # its launches, as they are attempted (a failed replay counts them too)
    stats.replayed += 1
    if dispatcher is None:
        for step in program.steps:
            step.forward(run, False)
    else:
        pending: set[int] = set()
        try:
            for step in program.steps:
                for slot in step.reads():
                    while slot in pending:
                        _arrived(run, dispatcher, pending)
                if step.heavy:
                    pending.add(step.out)
                    step.submit(run, dispatcher, False)
                else:
                    step.forward(run, False)
            while pending:
                _arrived(run, dispatcher, pending)
        except Exception:  # (an interrupt returns at once: dispatch.py)
            dispatcher.drain()
            raise
    return run


def _arrived(run: Run, dispatcher: Dispatcher, pending: set[int]) -> None:
    step: Step
    step, _, result = dispatcher.collect()
    step.store(run, result)
    pending.discard(step.out)


_default: Executor | None = None
_default_lock = threading.Lock()


def default_executor() -> Executor:
    """The process-wide executor: ``MONADL_WORKERS`` workers (default 1: sequential).

    Sequential by default because that measured fastest on this project's 2-core machines: handing
    a ~100 us matmul to another thread costs about what it saves there. Measure your own machine
    with ``python -m monadl.bench columns`` (the model on 1, 2 and 4 workers) and
    ``python -m monadl.bench threads`` (what two threads gain)."""
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
