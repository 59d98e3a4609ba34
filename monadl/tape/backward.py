"""The backward pass: a run's record read backwards, each slot's delta summed before it is used.

The forward pass left a list of steps, each computing one slot from earlier ones
(``monadl.do.program``). Read from the last to the first, every consumer of a slot comes before the
slot's own step, so when a step is reached its delta is complete: the sum of what its consumers
gave (``give``), summed as they gave it. The step then runs its vjps once, for the inputs that
depend on a weight, and gives them their deltas. That is reference counting (DeepLearning.scala 2,
section 5.4) with the counts settled by the order: a node used k times runs its backward once, and
n nested diamonds cost O(n). A slot whose step has run is released (its data and what it saved),
so memory falls as the pass goes. A weight's slot's delta is its gradient.

On a pool, the vjps of heavy steps run on the workers while this thread goes on with the steps
before them; a slot whose deltas are still on the pool (its *pending count*) waits for them
before its own step runs.

Merged groups give their inputs stacked deltas (one vjp for all the calls); a call's row that got
no delta is -0.0 there, the identity of addition, and the presence of each row is tracked
(``rows``), so that a call that got no delta gives its own inputs none, as it would alone.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

import numpy as np
from mypy_extensions import mypyc_attr

from monadl.do.dispatch import Dispatcher
from monadl.do.do import Do, Pure
from monadl.do.primitive import Primitive, call_vjp, check_delta
from monadl.do.program import (
    CALLS,
    FAN,
    FOREIGN,
    GATHER,
    LEAF,
    MERGED,
    OP,
    ROW,
    CallsStep,
    FanStep,
    ForeignStep,
    GatherStep,
    LeafStep,
    MergedStep,
    OpStep,
    RowStep,
    Run,
    row_value,
)
from monadl.do.scheduler import Scheduler
from monadl.do.stats import RunStats
from monadl.typeclasses.backend import NDARRAY, minus_zeros, namespace, unbroadcast
from monadl.typeclasses.sparse import SparseRows, add, add_into, scatter_add

ALL = True
"""A slot's presence when its whole value got a delta (else a bool array of its rows that did)."""


@mypyc_attr(native_class=False)  # a compiled subclass of a builtin exception is not a plain one
class NonFiniteDelta(ArithmeticError):
    """A diagnosing pass's first delta of NaN or infinity: ``origin`` names the step that gave it."""

    def __init__(self, origin: str) -> None:
        super().__init__(f"the first non-finite delta came from {origin}")
        self.origin = origin


class Backward:
    """One backward pass over ``run`` (see the module). ``diagnose``: every delta is checked as it
    is added, and the first that is not finite raises :class:`NonFiniteDelta` naming the step that
    gave it (a training step whose gradient was not finite runs its step again so, to say where)."""

    def __init__(self, run: Run, dispatcher: Dispatcher | None, diagnose: bool = False) -> None:
        n = len(run.datas)
        self.diagnose = diagnose
        self.current = "the seed"  # (diagnosing) the step whose deltas are being given
        self.run = run
        self.stats: RunStats = run.stats
        self.dispatcher = dispatcher
        run.deltas = [None] * n
        run.owned = [False] * n
        self.rows: list[Any] = [None] * n  # presence: None, ALL, or the rows that got a delta
        self.limits: dict[int, Any] = {}  # a calls group's stacked input -> the calls that got one
        self.coming = [0] * n  # deltas of a slot computed on the pool and not yet added
        self.issued: dict[int, deque[list[Any]]] = {}  # those, in the order they were issued
        self.gradients: dict[Any, Any] = {}
        self.owned_gradients: set[Any] = set()

    def run_from(self, root: int, seed: Any) -> None:
        """Backpropagates ``seed``, the delta of slot ``root``."""
        run = self.run
        run.accept = self.accept
        try:
            self.sweep(root, seed)
        finally:
            run.accept = None  # (a bound method of this pass: a reference cycle otherwise)

    def accept(self, slot: int, row: int, delta: Any) -> None:
        """A delta given by a tape of the user's own to one of this run's tapes."""
        if not self.run.wants[slot]:
            return
        if row < 0:
            self.give(slot, delta, False)
        else:
            self.give_row(slot, row, delta)

    def sweep(self, root: int, seed: Any) -> None:
        run = self.run
        run.deltas[root] = seed
        self.rows[root] = ALL
        steps = run.steps
        dispatcher = self.dispatcher
        try:
            for i in range(len(steps) - 1, -1, -1):
                step = steps[i]
                kind = step.kind
                if self.diagnose:
                    self.current = f"the vjp of {step.name()}" if kind != LEAF else "a weight's uses"
                if kind == CALLS:
                    assert isinstance(step, CallsStep)
                    self.calls(step)
                    continue
                out = step.out
                while self.coming[out]:
                    self.arrived()
                d = run.deltas[out]
                if d is not None and run.wants[out] and self.given(out):
                    run.deltas[out] = None
                    if kind == OP:
                        assert isinstance(step, OpStep)
                        self.op(step, d)
                    elif kind == MERGED:
                        assert isinstance(step, MergedStep)
                        self.merged(step, d)
                    elif kind == GATHER:
                        assert isinstance(step, GatherStep)
                        self.gather(step, d)
                    elif kind == LEAF:
                        assert isinstance(step, LeafStep)
                        self.leaf(step, d)
                    elif kind == ROW:
                        assert isinstance(step, RowStep)
                        self.give_row(step.source, step.row, d)
                    elif kind == FAN:
                        assert isinstance(step, FanStep)
                        self.fan(step, d)
                    else:
                        assert kind == FOREIGN and isinstance(step, ForeignStep)
                        self.foreign(step, _dense(d))
                elif kind == FOREIGN:
                    assert isinstance(step, ForeignStep)
                    self.run_do(step.tape.release())
                # Its consumers' steps have all run: the slot is no longer read.
                run.datas[out] = None
                run.saved[out] = None
            if dispatcher is not None:
                while dispatcher.pending:
                    self.arrived()
        except Exception:  # (an interrupt returns at once: dispatch.py)
            if dispatcher is not None:
                dispatcher.drain()
            raise

    # ------------------------------------------------------------------------------------ deltas

    def give(self, slot: int, g: Any, fresh: bool) -> None:
        """Adds ``g`` to slot ``slot``'s delta. ``fresh``: ``g`` is a new array nothing else holds,
        which later deltas may be added into in place."""
        if self.coming[slot]:
            self.settle(slot)
        self.add(slot, g, fresh)

    def add(self, slot: int, g: Any, fresh: bool) -> None:
        """Adds ``g`` to slot ``slot``'s delta now (the deltas issued before it are added)."""
        if self.diagnose and not _finite(g):
            raise NonFiniteDelta(self.current)
        run = self.run
        held = run.deltas[slot]
        if held is None:
            run.deltas[slot] = g
            run.owned[slot] = fresh and _writable(g)
        elif run.owned[slot]:
            run.deltas[slot] = add_into(held, g)
        else:
            run.deltas[slot] = add(held, g)
            run.owned[slot] = _writable(run.deltas[slot])
        self.rows[slot] = ALL

    def give_rows(self, slot: int, g: Any, fresh: bool, rows: Any) -> None:
        """Adds ``g``, a stacked delta of which the rows ``rows`` are given (ALL, or a mask), to
        stacked slot ``slot``'s delta."""
        if self.coming[slot]:
            self.settle(slot)
        self.add_rows(slot, g, fresh, rows)

    def add_rows(self, slot: int, g: Any, fresh: bool, rows: Any) -> None:
        """``give_rows`` now (the deltas issued before it are added)."""
        present = self.rows[slot]
        self.add(slot, g, fresh)
        if rows is not ALL:
            self.rows[slot] = (
                rows.copy() if present is None else (present if present is ALL else present | rows)
            )

    def stacked(self, slot: int) -> Any:
        """Slot ``slot``'s delta as a dense array of the pass's own, to add rows into: -0.0 where no
        row was given one yet (-0.0 is the exact identity of addition: a row given one delta holds
        it as it is, a -0.0 included)."""
        run = self.run
        if self.coming[slot]:
            self.settle(slot)
        held = run.deltas[slot]
        data = run.datas[slot]
        if held is None:
            held = minus_zeros(namespace(data), tuple(data.shape), data.dtype)
        elif type(held) is SparseRows:
            held = held.to_dense(namespace(data))
        elif not run.owned[slot]:
            held = namespace(held).asarray(held, copy=True)
        run.deltas[slot] = held
        run.owned[slot] = True
        return held

    def give_row(self, slot: int, row: int, g: Any) -> None:
        """Adds ``g`` to row ``row`` of stacked slot ``slot``'s delta."""
        run = self.run
        held = self.stacked(slot)
        if type(g) is SparseRows:
            g = g.to_dense(namespace(held))
        if type(held) is NDARRAY:
            held[row] += g
        else:  # the array API assigns to no index: a scatter
            xp = namespace(held)
            run.deltas[slot] = scatter_add(xp, held, xp.asarray([row]), xp.reshape(xp.asarray(g), (1, -1)))
        self.mark(slot, row)

    def given(self, slot: int) -> bool:
        """Whether any of slot ``slot``'s rows got a delta (a stacked slot may hold only the -0.0
        of rows that got none: then its step gives its inputs nothing, as its calls alone would)."""
        present = self.rows[slot]
        return present is ALL or (present is not None and bool(present.any()))

    def mark(self, slot: int, row: int) -> None:
        present = self.rows[slot]
        if present is ALL:
            return
        if present is None:
            present = self.rows[slot] = np.zeros(self.run.datas[slot].shape[0], dtype=bool)
        present[row] = True

    # ------------------------------------------------------------------------------------- steps

    def op(self, step: OpStep, d: Any) -> None:
        run = self.run
        prim = step.prim
        out = step.out
        args = step.args(run)
        params = step.params_of(run)
        xp = run.xps[out]
        saved = run.saved[out]
        passes = prim.passes and type(run.datas[out]) is float
        wants = run.wants
        stats = self.stats
        _count(stats.backwards, prim.name)
        heavy = step.heavy and self.dispatcher is not None
        exact = step.exact
        if exact is None and prim.broadcasts and prim.own:  # (a user's vjp may give any broadcast shape)
            exact = step.exact = _exact(args, run.datas[out])
        for j, slot in enumerate(step.ins):
            if not wants[slot]:
                continue
            if passes and type(args[j]) is float:  # the delta passes through: no kernel
                self.give(slot, d, False)
                continue
            stats.kernels += 1
            _count(stats.vjps, prim.name)
            same = exact is not None and exact[j]
            if heavy:
                self.submit(prim.delta, (j, xp, args, saved, d, params, False, same), slot, d, prim.fresh)
                continue
            g = prim.delta(j, xp, args, saved, d, params, False, same)
            self.give(slot, g, prim.fresh and g is not d)

    def merged(self, step: MergedStep, d: Any) -> None:
        run = self.run
        prim = step.prim
        out = step.out
        rows = self.rows[out]
        d = _dense(d)
        args = step.args(run)
        params = step.params_of(run)
        xp = run.xps[out]
        saved = run.saved[out]
        stats = self.stats
        _count(stats.backwards, prim.name)
        heavy = step.heavy and self.dispatcher is not None
        for i, slot in enumerate(step.ins):
            if not run.wants[slot]:
                continue
            stats.kernels += 1
            _count(stats.vjps, prim.name)
            shape = run.datas[slot].shape if step.pads[i] is not None else None
            # A shared input of an elementwise group was broadcast over the rows: its delta is
            # summed over them (an op that broadcasts sums every broadcast axis anyway).
            over = step.n if not step.stacked[i] and step.elementwise and not prim.broadcasts else 0
            vjp_args = (step.vjps[i], prim, over, i, shape, xp, d, saved, args, params)
            if heavy:
                self.submit(_merged_vjp, vjp_args, slot, d, prim.fresh, rows if step.stacked[i] else ALL)
                continue
            g = _merged_vjp(*vjp_args)
            fresh = prim.fresh and g is not d
            if step.stacked[i]:
                self.give_rows(slot, g, fresh, rows)
            else:
                self.give(slot, g, fresh)

    def fan(self, step: FanStep, d: Any) -> None:
        run = self.run
        prim = step.prim
        fan = step.fan
        out = step.out
        rows = self.rows[out]
        d = _dense(d)
        args = step.args(run)
        xp = run.xps[out]
        stats = self.stats
        _count(stats.backwards, prim.name)
        for i, slots in enumerate(step.ins):
            if i in fan.shared:
                if run.wants[slots[0]]:
                    stats.kernels += 1
                    _count(stats.vjps, prim.name)
                    self.give(slots[0], fan.vjps[i](xp, d, run.saved[out], *args, **step.params), False)
                continue
            wanted = [k for k, s in enumerate(slots) if run.wants[s] and _present(rows, k)]
            if not wanted:
                continue
            stats.kernels += 1
            _count(stats.vjps, prim.name)
            g = fan.vjps[i](xp, d, run.saved[out], *args, **step.params)
            for k in wanted:
                s = slots[k]
                self.give(s, _row_like(g, k, run.datas[s]), False)

    def gather(self, step: GatherStep, d: Any) -> None:
        run = self.run
        d = _dense(d)
        if step.shape is not None:  # rows joined along their first axis: back to rows of rows
            d = namespace(d).reshape(d, (step.n, -1, *tuple(d.shape[1:])))
        present = self.rows[step.out]
        limit = self.limits.get(step.out)
        if limit is not None:
            present = limit if present is ALL else present & limit
        self.stats.kernels += 1
        xp = namespace(d)
        for j, source in enumerate(step.sources):
            positions = step.positions[j]
            rows = step.rows[j]
            if not run.wants[source]:
                continue
            if rows is None:
                p = int(positions[0])
                if _present(present, p):
                    self.give(source, _row_like(d, p, run.datas[source]), False)
                continue
            held = self.stacked(source)
            picked = xp.take(d, xp.asarray(positions), axis=0) if xp is not np else d[positions]
            if xp is np and step.unique[j]:
                held[rows] += picked
            else:
                run.deltas[source] = scatter_add(xp, held, xp.asarray(rows), picked)
            given = self.rows[source]
            if given is not ALL:
                mask = np.zeros(run.datas[source].shape[0], dtype=bool) if given is None else given.copy()
                mask[rows if present is ALL else rows[present[positions]]] = True
                self.rows[source] = mask

    def calls(self, step: CallsStep) -> None:
        """The calls of a group that got a delta: their stacked inputs give only theirs further."""
        present = None
        for slot in step.results:
            rows = self.rows[slot]
            if rows is ALL:
                return  # every call did
            if rows is not None:
                present = rows.copy() if present is None else present | rows
        if present is None:
            present = np.zeros(step.n, dtype=bool)
        for slot in step.inputs:
            self.limits[slot] = present

    def leaf(self, step: LeafStep, d: Any) -> None:
        weight = self.run.weights[step.out]
        if weight is None:
            return
        _count(self.stats.backwards, "weight")
        held = self.gradients.get(weight)
        if held is None:
            self.gradients[weight] = d
            if self.run.owned[step.out]:
                self.owned_gradients.add(weight)
        else:
            self.gradients[weight] = add(held, d)
            self.owned_gradients.add(weight)

    def foreign(self, step: ForeignStep, d: Any) -> None:
        """A tape of the user's own: its backward, given the slot's summed delta, run as a ``Do``."""
        self.run_do(step.tape.backward(Pure(d)))

    def run_do(self, do: Do[Any]) -> None:
        """Runs a ``Do`` of a user's tape's backward (it may give deltas to this run's tapes)."""
        scheduler = Scheduler(Run([], self.dispatcher, self.stats, self.run.snapshot), False, {})
        scheduler.walk(do)
        scheduler.drain()

    # ------------------------------------------------------------------------------------- pool

    # A slot's deltas are added in the order they were issued, as a pass without a pool adds them,
    # whichever kernel finishes first: floating-point addition is not associative, and a step's
    # gradients must be the same bits on every run (and with or without a pool).

    def submit(self, fn: Any, args: tuple[Any, ...], slot: int, d: Any, fresh: bool, rows: Any = ALL) -> None:
        dispatcher = self.dispatcher
        assert dispatcher is not None
        self.coming[slot] += 1
        entry: list[Any] = [False, None, d, fresh, rows]  # arrived, result, and how to add it
        issued = self.issued.get(slot)
        if issued is None:
            issued = self.issued[slot] = deque()
        issued.append(entry)
        dispatcher.submit(fn, args, (slot, entry), self.run, None)

    def arrived(self) -> None:
        """Takes one result from the pool; adds its slot's results that are next in issue order."""
        dispatcher = self.dispatcher
        assert dispatcher is not None
        token, _, g = dispatcher.collect()
        slot, entry = token
        entry[0] = True
        entry[1] = g
        issued = self.issued[slot]
        while issued and issued[0][0]:
            _, g, d, fresh, rows = issued.popleft()
            self.coming[slot] -= 1
            self.add_rows(slot, g, fresh and g is not d, rows)

    def settle(self, slot: int) -> None:
        """Waits for slot ``slot``'s deltas on the pool and adds them (a delta given now comes after
        them)."""
        while self.coming[slot]:
            self.arrived()


def backward(
    run: Run, root: int, seed: Any, dispatcher: Dispatcher | None, diagnose: bool = False
) -> tuple[dict[Any, Any], set[Any]]:
    """Backpropagates ``seed``, the delta of slot ``root`` of ``run``: every weight's gradient (its
    summed delta), and the weights whose gradient is an array of the pass's own (that nothing else
    holds: an optimizer may write into it). ``diagnose``: see :class:`Backward`."""
    pass_ = Backward(run, None if diagnose else dispatcher, diagnose)
    pass_.run_from(root, seed)
    return pass_.gradients, pass_.owned_gradients


def _finite(g: Any) -> bool:
    """Whether every element of a delta is finite (a diagnosing pass's check)."""
    if type(g) is float:
        return math.isfinite(g)
    values = g.values if type(g) is SparseRows else g
    xp = namespace(values)
    return bool(xp.all(xp.isfinite(values)))


def _merged_vjp(
    rule: Any,
    prim: Primitive,
    rows: int,
    i: int,
    shape: Any,
    xp: Any,
    d: Any,
    saved: Any,
    args: list[Any],
    params: dict[str, Any],
) -> Any:
    """Input ``i``'s delta of a merged call (worker-safe): the rule on the stacked delta, summed
    back to the input's (padded) shape (a shared input's over the group's ``rows``, where the op
    does not broadcast), and unpadded (a user's rule's result checked first)."""
    g = call_vjp(rule, xp, d, saved, args, params)
    if not prim.own:
        check_delta(prim.name, i, g, args[i], prim.broadcasts, rows)
    if prim.broadcasts:
        g = unbroadcast(xp, g, args[i])
    elif rows and type(g) is not float and len(g.shape) > len(args[i].shape):
        g = xp.sum(g, axis=0)
    if shape is not None:
        g = xp.reshape(g, shape)
    return g


def _dense(d: Any) -> Any:
    return d.to_dense() if type(d) is SparseRows else d


def _present(rows: Any, k: int) -> bool:
    return rows is ALL or (rows is not None and bool(rows[k]))


def _row_like(g: Any, k: int, like: Any) -> Any:
    """Row ``k`` of ``g``, shaped (and typed: a float or an array) like ``like``."""
    row = row_value(g, k, type(like) is float)
    if type(like) is not float and tuple(row.shape) != tuple(like.shape):
        row = namespace(row).reshape(row, like.shape)
    return row


def _exact(args: tuple[Any, ...], out: Any) -> list[bool]:
    """Per input, whether it is a NumPy array of ``out``'s shape."""
    exact = []
    shape = out.shape if type(out) is NDARRAY else None
    for a in args:
        exact.append(shape is not None and type(a) is NDARRAY and a.shape == shape)
    return exact


def _writable(g: Any) -> bool:
    """Whether a delta is a NumPy array of its own (not a view), that may be added into."""
    return type(g) is NDARRAY and g.base is None and g.flags.writeable


def _count(counts: dict[str, int], name: str) -> None:
    counts[name] = counts.get(name, 0) + 1
