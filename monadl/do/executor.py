"""The executor: runs ``Do`` computations with the scheduler, a thread pool, and compiled programs.

* One scheduler (``scheduler.py``) interprets every ``Do``: an agenda of ready work whose equal
  calls merge (dynamic batching); what it computes is a step of the run's record (``record.py``),
  which the backward pass reads.
* Compile once, replay: a graph of ops on weights and constants only (no node of the monad's own,
  no batchable call: a feed-forward model, the CIFAR column model) has a *structure* (its ops, their
  static parameters, its leaves' shapes and dtypes). The steps of its first run are kept as a
  :class:`~monadl.do.record.Program`, and a later graph of equal structure replays them on its own
  weights and constants: no walk, grouping or shape checks; only the checks that read values run.
  The same graph run again is not even walked. This module decides when (:meth:`Executor.evaluate`).
* Kernels whose cost reaches ``min_pool_cost`` go to the workers when there are two or more
  (``monadl.runtime.pool``); the rest run inline, because a hand-off costs more than a small NumPy call.
* Failure: the first exception stops new work; kernels already on the pool finish; the original
  exception, with its traceback, is raised to the caller; the pool stays usable.
"""

from __future__ import annotations

import os
import threading
from contextlib import AbstractContextManager, nullcontext
from typing import Any, TypeVar

from monadl.do.batching import slot_of
from monadl.do.context import RunContext
from monadl.do.do import Do, as_node
from monadl.do.graph import CONST, OP, WEIGHT, Graph, recording, row_of, running, swap_recording
from monadl.do.primitive import Primitive, float_key, value_key
from monadl.do.record import Program, Run, RunTape, forward_stats
from monadl.do.scheduler import DONE, Scheduler
from monadl.do.stats import RunStats
from monadl.do.steps import replay_steps
from monadl.runtime.pool import Dispatcher, WorkerPool
from monadl.runtime.process import BlasCap, gc_paused, tune_allocator
from monadl.runtime.recent import Recent
from monadl.runtime.versions import Snapshot, data_of, last_reshape, snapshot

A = TypeVar("A")


class Evaluation:
    """A finished forward run: its record, and its root's value (``slot`` and ``row``: where it is,
    when the root is a node of the differentiable program, slot -1 otherwise)."""

    def __init__(self, run: Run, slot: int, row: int, value: Any) -> None:
        self.run = run
        self.slot = slot
        self.row = row
        self.value = value


class ProgramKey:
    """A program's key: the run's settings and its graph's structure, with its hash worked out
    once. A graph run again is looked up by the same key object on every run, and a tuple's hash
    walks every item of the structure (every op of the graph), each time it is asked for."""

    def __init__(self, items: tuple[Any, ...]) -> None:
        self.items = items
        self.hashed = hash(items)

    def __hash__(self) -> int:
        return self.hashed

    def __eq__(self, other: object) -> bool:
        return self is other or (
            isinstance(other, ProgramKey) and self.hashed == other.hashed and self.items == other.items
        )


class Structure:
    """A static graph's key and its *bound rows*: the rows whose values a replay reads from the
    graph at hand (its weights, constants and ops with per-run parameters: a lookup's indices, a
    loss's labels), in order; ``index``: a bound row's position; ``weights``: each weight's value
    key, in order (a graph run again replays only while they hold); ``number``: the commit as of
    which the weights were last seen to hold (a snapshot's number)."""

    def __init__(
        self,
        key: tuple[Any, ...],
        graph: Graph,
        bound: list[int],
        index: dict[int, int],
        weights: list[Any],
        number: int,
    ) -> None:
        self.key = key
        self.graph = graph
        self.bound = bound
        self.index = index
        self.weights = weights
        self.number = number

    def holds_at(self, taken: Snapshot) -> bool:
        """Whether every weight has, as of ``taken`` (the run's snapshot), the type, shape and dtype
        it had: without a look at them where no commit after the one they were seen to hold at, up
        to ``taken``, changed any weight's kind."""
        number = self.number
        if taken.number >= number and last_reshape() <= number:
            return True
        if not self._weights_hold(taken):
            return False
        if taken.number > number:
            self.number = taken.number
        return True

    def _weights_hold(self, taken: Snapshot) -> bool:
        graph = self.graph
        i = 0
        for row in self.bound:
            if graph.tags[row] == WEIGHT:
                if value_key(data_of(graph.objs[row], taken)) != self.weights[i]:
                    return False
                i += 1
        return True


def structure_of(graph: Graph, root: int, taken: Snapshot) -> Structure | None:
    """The structure of the rows ``root`` reads, its weights as of ``taken`` (the run's snapshot),
    or None if they are not static (a row of another kind than an op, a weight or a constant). Its
    key: its ops in order, each with its primitive, the static part of its parameters and the
    places of its inputs; its weights' and constants' value kinds; its float constants' values
    (they decide merges). The key is one flat tuple, each row's entry read from its first item (a
    primitive, or "v", "f" or "c") and each part counted where its length varies, so that equal
    keys are equal structures; flat, a graph run again makes, hashes, compares and frees one tuple
    where nested entries made three a row."""
    rows = graph.postorder(root, static=True)
    if rows is None:
        return None
    order: dict[int, int] = {}  # a row's entry in the key, counted from 0
    key: list[Any] = []
    bound: list[int] = []
    index: dict[int, int] = {}
    weights: list[Any] = []
    tags, objs, starts, args = graph.tags, graph.objs, graph.starts, graph.args
    entries = 0
    for r in rows:
        tag = tags[r]
        if tag == OP:
            prim: Primitive = objs[r]
            key.append(prim)
            if not prim.signature_items(key, graph.params[r]):  # an unhashable parameter: no key
                return None
            start, stop = starts[r], starts[r + 1]
            key.append(stop - start)
            for k in range(start, stop):
                key.append(order[args[k]])
            if not prim.per_run:
                order[r] = entries
                entries += 1
                continue
        elif tag == WEIGHT:
            weight_key = value_key(data_of(objs[r], taken))
            key.append("v")
            key.append(weight_key)
            weights.append(weight_key)
        elif tag == CONST:
            data = objs[r]
            if type(data) is float:
                key.append("f")
                key.append(float_key(data))
            else:
                key.append("c")
                key.append(value_key(data))
        else:
            return None
        order[r] = entries
        entries += 1
        index[r] = len(bound)
        bound.append(r)
    return Structure(tuple(key), graph, bound, index, weights, taken.number)


_REMOVED_PLANNING = (
    "Executor(planning=...) was removed: there is no planner; one scheduler runs every graph, merging "
    "equal calls as they become ready (Executor(batching=...)), and a graph of static structure "
    "replays its compiled program (Executor(replay=...))"
)


class Executor:
    """Runs ``Do`` computations.

    ``workers``: pool size; 1 runs everything strictly sequentially on the calling thread.
    ``min_pool_cost``: kernels cheaper than this (roughly, floating-point operations) run inline.
    ``limit_blas``: BLAS is capped at one thread while the executor is open (parallelism comes from
    independent sub-graphs; BLAS's own threads oversubscribe the cores, and spin beside a busy one:
    ``monadl.runtime.process.cap_blas``).
    ``batching``: merge the calls of equal signature that are ready together (dynamic batching;
    ``run`` can override it); off, every call runs on its own, in the same loop.
    ``replay``: keep the programs of static graphs and replay them for runs of equal structure.
    ``pause_gc``: pause Python's cyclic garbage collector during a run (``monadl.runtime.process``).
    ``check_finite``: a training step whose new weight values are not all finite (a gradient of
    NaN or infinity) fails and changes nothing; off, it is applied (one pass over each updated
    weight saved). ``planning``: removed (passing it raises a ``TypeError`` naming what replaced it).
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
        planning: object = None,
    ) -> None:
        if planning is not None:
            raise TypeError(_REMOVED_PLANNING)
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
        self._programs = Recent(self.PROGRAMS)
        self._seen = Recent(self.SEEN)  # roots run lately: their keys and structures
        self._bodies = Recent(self.BODIES)
        self._misses = 0  # runs in a row that walked a graph and found no program for it
        self._runs = 0
        self._pool = WorkerPool(workers) if workers > 1 else None
        self._blas: BlasCap | None = BlasCap() if limit_blas else None

    PROGRAMS = 16
    """How many compiled programs an executor keeps (the least recently used is dropped)."""
    SEEN = 8
    """How many roots an executor remembers by identity (holding their graphs)."""
    BODIES = 256
    """How many programs of batchable bodies an executor keeps."""
    MISSES = 8
    """After this many runs in a row whose graphs had no program (a model whose graph changes with
    its data: sentences of other lengths, other trees), an executor stops working out graphs'
    structures, which then cost a walk of every graph and keep programs never replayed; it tries
    again once every :attr:`RETRY` runs, so a graph that stops changing is replayed again."""
    RETRY = 32

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
        if evaluation.slot >= 0:
            return RunTape(evaluation.run, evaluation.slot, evaluation.row)  # type: ignore[return-value]
        return evaluation.value  # type: ignore[no-any-return]

    def evaluate(
        self,
        do: Do[Any],
        stats: RunStats,
        *,
        batching: bool | None = None,
        own_root: bool = False,
        context: RunContext | None = None,
    ) -> Evaluation:
        """The forward run of ``do``, counted in ``stats`` (published by the caller): replayed from a
        compiled program where one fits, else interpreted by the scheduler. ``own_root``: the
        root's value in a slot of its own (a backward pass is seeded there). ``context``: the run's
        context, given to the ops that declare they need it (default: one of the calling thread's
        mode and staging, :meth:`RunContext.of_thread`)."""
        graph, root = row_of(as_node(do))
        if graph is recording() and not running():
            swap_recording(None)  # what the user records next goes to a graph of its own
        ctx = RunContext.of_thread() if context is None else context
        if graph.dynamic:
            with graph.lock:  # (a run of a graph with rows of the monad's own may add rows to it)
                return self._evaluate(graph, root, stats, batching, own_root, ctx)
        return self._evaluate(graph, root, stats, batching, own_root, ctx)

    def _evaluate(
        self,
        graph: Graph,
        root: int,
        stats: RunStats,
        batching: bool | None,
        own_root: bool,
        ctx: RunContext,
    ) -> Evaluation:
        dispatcher = self.dispatcher()
        snap = snapshot()  # every weight as of the newest commit, for the whole run
        batch = self.batching if batching is None else batching
        settings = (batch, own_root)
        seen = self._seen.get((graph, root))
        structure = None
        if seen is not None and seen[0].items[:2] == settings and seen[1].holds_at(snap):
            key, structure = seen  # the same graph again: no walk
        elif self.replay and not graph.dynamic and self._walks():
            structure = structure_of(graph, root, snap)
            key = None if structure is None else ProgramKey((*settings, structure.key))
            self._misses += 1  # until its program is found
        if structure is not None and key is not None:
            program = self._programs.get(key)
            if program is not None:
                self._misses = 0
                run = Run(dispatcher, stats, snap, graph, structure.bound, ctx, program.slots)
                run.steps = program.steps
                run.program = program
                stats.add(program.stats)  # its launches, as they are attempted
                stats.replayed += 1
                replay_steps(run, False)
                self._seen.put((graph, root), (key, structure))
                slot, row = program.outputs[0]
                return Evaluation(run, slot, row, run.value(slot, row))
        run = Run(dispatcher, stats, snap, graph, None if structure is None else structure.bound, ctx)
        scheduler = Scheduler(graph, run, batch, {} if structure is None else structure.index, self._bodies)
        scheduler.execute([root])
        if scheduler.state[root] != DONE:  # pragma: no cover - a scheduler bug, not a user's
            raise RuntimeError("monadl: the computation did not complete (a row was never run)")
        value = scheduler.user_value(root)
        slot, row = -1, -1
        if type(value) is RunTape and value.run is run:  # a tape of the program's, or handed back
            slot, row = value.slot, value.row
        elif own_root:
            scheduler.place(root, -1)
            slot, row = scheduler.slots[root], scheduler.rows[root]
        if slot >= 0:
            if own_root and row >= 0:
                slot, row = slot_of(run, slot, row), -1
            value = run.value(slot, row)
        stats.signatures = len(scheduler.signatures)
        if structure is not None and key is not None and run.replayable and slot >= 0:
            self._programs.put(
                key, Program(run.steps, len(run.datas), [], [(slot, row)], forward_stats(stats))
            )
            self._seen.put((graph, root), (key, structure))
        return Evaluation(run, slot, row, value)

    def _walks(self) -> bool:
        """Whether this run works out its graph's structure (see :attr:`MISSES`)."""
        self._runs += 1
        if self._misses < self.MISSES:
            return True
        if self._runs % self.RETRY:
            return False
        self._misses = self.MISSES - 2  # this run and the next walk: the next finds this one's program
        return True

    def publish(self, stats: RunStats) -> None:
        """Makes ``stats`` the last run's and adds them to the executor's total."""
        self.last_stats = stats
        self.stats.add(stats)

    def close(self) -> None:
        """Shuts the pool down and restores BLAS threading. Idempotent."""
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None
        if self._blas is not None:
            self._blas.release()
            self._blas = None

    def __enter__(self) -> Executor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_default: Executor | None = None
_default_lock = threading.Lock()


def default_executor() -> Executor:
    """The process-wide executor: ``MONADL_WORKERS`` workers (default 1: sequential, which measured
    fastest on this project's 2-core machines: see ``docs/benchmarks.md``)."""
    global _default
    with _default_lock:
        if _default is None:
            _default = Executor(int(os.environ.get("MONADL_WORKERS", "1")))
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
