"""The backward pass: a run's record read backwards, each slot's delta summed before it is used.

The forward pass left a list of steps, each computing a slot from earlier ones
(``monadl.do.record``). Read from the last to the first, every consumer of a slot comes before the
slot's own step, so when a step is reached its delta is complete: the sum of what its consumers
gave (``give``), summed as they gave it. The step then passes it back once, by its kind's rule
(:func:`run_rule`: the vjps of its op, for the inputs that depend on a weight). That is reference
counting (DeepLearning.scala 2, section 5.4) with the counts settled by the order: a node used k
times runs its backward once, and n nested diamonds cost O(n). A slot whose step has run is
released (its data and what it saved), so memory falls as the pass goes. A weight's slot's delta is
its gradient. A batchable body's frame is swept the same way, inside its step's rule.

On a pool, the vjps of heavy steps run on the workers while this thread goes on with the steps
before them; a slot whose deltas are still on the pool waits for them before it is read. A slot's
deltas are added in the order they were issued, whichever kernel finishes first: floating-point
addition is not associative, and a step's gradients must be the same bits on every run.

Merged groups give their inputs stacked deltas (one vjp for all the calls); a call's row that got
no delta is -0.0 there, the identity of addition, and the presence of each row is tracked
(``present``), so that a call that got no delta gives its own inputs none, as it would alone.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Final

import numpy as np
from mypy_extensions import mypyc_attr

from monadl.do.do import Node, Pure, as_node
from monadl.do.graph import Graph
from monadl.do.primitive import JointDeltas, Primitive, call_vjp
from monadl.do.record import Run, row_value
from monadl.do.scheduler import Scheduler
from monadl.do.stats import WEIGHT, RunStats
from monadl.do.steps import (
    BodyStep,
    CastStep,
    FanStep,
    ForeignStep,
    LeafStep,
    MergedStep,
    OpStep,
    RowStep,
    StackStep,
    Step,
)
from monadl.runtime.pool import Dispatcher, drain_failed
from monadl.runtime.recent import Recent
from monadl.runtime.versions import data_of
from monadl.typeclasses.backend import (
    NDARRAY,
    NUMPY,
    add_into_row,
    add_rows_at,
    any_set,
    concat_arrays,
    matrix_product,
    minus_zeros_like,
    namespace,
    on_device,
    set_flag,
    writable_own,
)
from monadl.typeclasses.sparse import (
    SparseRows,
    add,
    add_into,
    astype,
    move_rows,
    rows_kernel_fits,
    scatter_add,
)

ALL: Final = True
"""A slot's presence when its whole value got a delta (else a bool array of its rows that did)."""


@mypyc_attr(native_class=False)  # a compiled subclass of a builtin exception is not a plain one
class NonFiniteDelta(ArithmeticError):
    """A diagnosing pass's first delta of NaN or infinity: ``origin`` names the step that gave it."""

    def __init__(self, origin: str) -> None:
        super().__init__(f"the first non-finite delta came from {origin}")
        self.origin = origin


class Backward:
    """One backward pass over the frame ``run`` (see the module). ``diagnose``: every delta is
    checked as it is added, and the first that is not finite raises :class:`NonFiniteDelta` naming
    the step that gave it. ``outer``: the pass whose body frame this one sweeps (it shares the
    gradients)."""

    def __init__(
        self, run: Run, dispatcher: Dispatcher | None, diagnose: bool = False, outer: Backward | None = None
    ) -> None:
        n = len(run.datas)
        self.run = run
        self.stats: RunStats = run.stats if outer is None else outer.stats
        self.dispatcher = dispatcher
        self.diagnose = diagnose
        self.top = outer is None  # the pass of the run's own frame, not of a body's
        self.current = "the seed"  # (diagnosing) the step whose deltas are being given
        self.deltas: list[Any] = [None] * n
        self.owned = [False] * n  # the delta is an array of the pass's own, to add into
        self.present: list[Any] = [None] * n  # None, ALL, or a mask of the rows that got a delta
        self.coming = [0] * n  # deltas of a slot computed on the pool and not yet added
        self.issued: dict[int, deque[list[Any]]] = {}  # those, in the order they were issued
        self.inflight = 0
        self.gradients: dict[Any, Any] = {} if outer is None else outer.gradients
        self.owned_gradients: set[Any] = set() if outer is None else outer.owned_gradients
        # The weights whose gradient was first given not as an array of the pass's own (it may be
        # another's too), and those given a delta of another dtype than their data's (its dtype).
        self.shared: list[Any] = [] if outer is None else outer.shared
        self.recast: dict[Any, Any] = {} if outer is None else outer.recast
        self.products: dict[Any, list[tuple[Any, Any]]] = {} if outer is None else outer.products
        """A weight's deltas that are products of rows (``Primitive.products``), to be added up as
        one product when the pass ends: its calls over a whole step (every time step of a sequence,
        every level of a tree) make one matrix product instead of one each, and one sum."""
        self.fans: dict[tuple[Any, ...], list[tuple[Any, Any]]] = {} if outer is None else outer.fans
        """The deltas of the weights of a fan's calls (one input, several weights: an LSTM cell's
        gates), by the weights in the calls' order: the products of one left factor with each
        weight's rows, added up as one product of the left factors with all the weights' rows side
        by side (one join of the left factors and one matrix product for them all)."""
        self.fans_of: dict[Any, list[tuple[Any, ...]]] = {} if outer is None else outer.fans_of
        """The fans (keys of ``fans``) each weight is in."""

    def sweep(self) -> None:
        """Runs every step's rule, from the last step to the first."""
        run = self.run
        run.accept = self.accept
        try:
            steps = run.steps
            firsts: dict[int, list[int]] | None = None  # worked out once a weight's delta is a product
            for i in range(len(steps) - 1, -1, -1):
                step = steps[i]
                if self.diagnose:
                    self.current = (
                        "a weight's uses" if type(step) is LeafStep else f"the vjp of {step.name()}"
                    )
                run_rule(self, step)
                if self.top and (self.products or self.fans):
                    if firsts is None:
                        firsts = run.first_reads()
                    slots = firsts.get(i)
                    if slots is not None:
                        for slot in slots:
                            weight = run.weights[slot]
                            if weight in self.products or weight in self.fans_of:
                                # Its last reader in the frame: its products are all given.
                                # Multiplied now, while its readers' rows are in the cache.
                                self.multiply_weight(weight)
                run.datas[step.out] = None  # its consumers' steps have all run: no longer read
                run.saved[step.out] = None
            while self.inflight:
                self.arrived()
        except Exception:
            drain_failed(self.dispatcher)
            raise
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

    def product(self, slot: int, factors: Any) -> bool:
        """Defers the delta of slot ``slot``, if it is a weight's, given as a product of rows
        (``factors``: ``(left, right)``, from ``Primitive.products``); False where it is not (then
        the caller computes it now)."""
        weight = self.run.weights[slot]
        if weight is None or factors is None or self.diagnose:
            return False
        held = self.products.get(weight)
        if held is None:
            self.products[weight] = [factors]
        else:
            held.append(factors)
        return True

    def fan_product(self, slots: list[int], left: Any, rights: Any) -> bool:
        """Defers the deltas of the weights of slots ``slots``, the weights of a fan's calls (call
        k's delta ``left.T @ rights[k]``; ``left`` None: the rows of ``rights[k]`` summed), as one
        product with the others of the same weights (see ``fans``); False where they are not
        distinct weights (then the caller defers them one by one, or computes them)."""
        if self.diagnose:
            return False
        weights = self.run.weights
        key = tuple([weights[s] for s in slots])
        for j, weight in enumerate(key):  # (a fan's few weights: pairs compared, no set made)
            if weight is None:
                return False
            for k in range(j):
                if key[k] is weight:
                    return False
        held = self.fans.get(key)
        if held is None:
            self.fans[key] = [(left, rights)]
            for weight in key:
                keys = self.fans_of.get(weight)
                if keys is None:
                    self.fans_of[weight] = [key]
                else:
                    keys.append(key)
        else:
            held.append((left, rights))
        return True

    def multiply(self) -> None:
        """Each weight's deferred products of rows not added yet (see :meth:`multiply_weight`)."""
        for key in list(self.fans):
            self.multiply_fan(key)
        self.fans_of.clear()
        for weight in list(self.products):
            self.multiply_weight(weight)

    def multiply_fan(self, key: tuple[Any, ...]) -> None:
        """Adds the deferred products of the fan of weights ``key`` to their gradients: one product
        of the left factors joined with every weight's rows side by side (or one sum of rows)."""
        factors = self.fans.pop(key)
        k = len(key)
        first = factors[0][1]  # (k, rows, outputs), or (k, outputs): one row
        xp = namespace(first)
        outputs = first.shape[-1]
        # Each call's rows side by side, (rows, k * outputs); one row's (k, outputs) already is.
        sides = _joined_rows(xp, [f[1] for f in factors], k * outputs, True)
        if factors[0][0] is None:
            g = xp.reshape(xp.sum(sides, axis=0), (k, outputs))
        else:
            lefts = _joined_rows(xp, [f[0] for f in factors], factors[0][0].shape[-1], False)
            g = xp.matmul(lefts.mT, sides) if xp is not NUMPY else matrix_product(lefts.T, sides)
            g = xp.permute_dims(xp.reshape(g, (g.shape[0], k, outputs)), (1, 0, 2))  # (k, inputs, outputs)
        snapshot = self.run.snapshot
        for j in range(k):
            weight = key[j]
            data = data_of(weight, snapshot)
            # A C-ordered copy, not a view of g: a gradient the optimizer may write into.
            block = g[j, ...].copy() if xp is NUMPY else xp.asarray(g[j, ...], copy=True)
            self.add_product(weight, block, data)

    def multiply_weight(self, weight: Any) -> None:
        """Adds ``weight``'s deferred products of rows to its gradient, as one product (or one sum
        of rows), the fans it is in first."""
        keys = self.fans_of.pop(weight, None)
        if keys is not None:
            for key in keys:
                if key in self.fans:  # (not yet multiplied for another of its weights)
                    self.multiply_fan(key)
        factors = self.products.pop(weight, None)
        if factors is None:
            return
        first = factors[0][1]
        xp = namespace(first)
        right = _joined_rows(xp, [f[1] for f in factors], first.shape[-1], False)
        if factors[0][0] is None:
            g = xp.sum(right, axis=0)
        else:
            lefts = _joined_rows(xp, [f[0] for f in factors], factors[0][0].shape[-1], False)
            g = xp.matmul(lefts.mT, right) if xp is not NUMPY else matrix_product(lefts.T, right)
        self.add_product(weight, g, data_of(weight, self.run.snapshot))

    def add_product(self, weight: Any, g: Any, data: Any) -> None:
        """Adds ``g``, a product for ``weight`` (an array of the pass's own), to its gradient, in
        the shape and dtype of its ``data``."""
        xp = namespace(g)
        if tuple(g.shape) != tuple(data.shape):
            g = xp.reshape(g, data.shape)
        if g.dtype != data.dtype:
            g = xp.astype(g, data.dtype)
        accumulate(self, weight, g, True, data)

    # ------------------------------------------------------------------------------------ deltas

    def take(self, slot: int) -> Any:
        """Slot ``slot``'s summed delta, once complete, if it depends on a weight and any of its
        rows got one (a stacked slot may hold only the -0.0 of rows that got none: then its step
        gives its inputs nothing, as its calls alone would); None otherwise."""
        while self.coming[slot]:
            self.arrived()
        d = self.deltas[slot]
        if d is None or not self.run.wants[slot]:
            return None
        present = self.present[slot]
        if present is not ALL and (present is None or not any_set(present)):
            return None
        self.deltas[slot] = None
        return d

    def give(self, slot: int, g: Any, fresh: bool, given: Any = ALL) -> None:
        """Adds ``g`` to slot ``slot``'s delta, once the deltas issued before it are added. ``fresh``:
        ``g`` is a new array nothing else holds (later deltas may be added into it); ``given``: the
        rows it gives a delta (ALL, or a mask of a stacked slot's rows)."""
        while self.coming[slot]:
            self.arrived()
        self.add(slot, g, fresh, given)

    def add(self, slot: int, g: Any, fresh: bool, given: Any) -> None:
        if self.diagnose and not _finite(g):
            raise NonFiniteDelta(self.current)
        held = self.deltas[slot]
        if held is None:
            self.deltas[slot] = g
            self.owned[slot] = fresh and writable_own(g)
        elif self.owned[slot]:
            self.deltas[slot] = add_into(held, g)
        else:
            self.deltas[slot] = add(held, g)
            self.owned[slot] = writable_own(self.deltas[slot])
        present = self.present[slot]
        if given is ALL or present is ALL:
            self.present[slot] = ALL
        else:
            self.present[slot] = given.copy() if present is None else present | given

    def stacked(self, slot: int) -> Any:
        """Slot ``slot``'s delta as a dense array of the pass's own, to add rows into: -0.0 where no
        row was given one yet (-0.0 is the exact identity of addition)."""
        while self.coming[slot]:
            self.arrived()
        held = self.deltas[slot]
        data = self.run.datas[slot]
        if held is None:
            held = minus_zeros_like(data)
        elif type(held) is SparseRows:
            held = held.to_dense(namespace(data))
        elif not self.owned[slot]:
            held = namespace(held).asarray(held, copy=True)
        self.deltas[slot] = held
        self.owned[slot] = True
        return held

    def give_row(self, slot: int, row: int, g: Any) -> None:
        """Adds ``g`` to row ``row`` of stacked slot ``slot``'s delta."""
        held = self.stacked(slot)
        if type(g) is SparseRows:
            g = g.to_dense(namespace(held))
        if type(held) is NDARRAY:
            if held.ndim > 1:
                add_into_row(held, row, g)
            else:  # rows of floats: an element
                held[row] += g
        else:  # the array API assigns to no index: a scatter
            xp = namespace(held)
            on = on_device(xp, held)
            self.deltas[slot] = scatter_add(
                xp, held, xp.asarray([row], **on), xp.reshape(xp.asarray(g, **on), (1, -1))
            )
        self.mark(slot, row)

    def mark(self, slot: int, rows: Any) -> None:
        """Rows ``rows`` (an index array, or one row) of slot ``slot`` got a delta."""
        present = self.present[slot]
        if present is ALL:
            return
        if present is None:
            present = self.present[slot] = np.zeros(self.run.datas[slot].shape[0], dtype=bool)
        if type(rows) is int:
            set_flag(present, rows)
        else:
            present[rows] = True

    # ------------------------------------------------------------------------------------- pool

    def submit(
        self, fn: Any, args: tuple[Any, ...], slot: int, d: Any, fresh: bool, given: Any = ALL
    ) -> None:
        """Runs a vjp on the pool; its result is added to slot ``slot`` in the order issued."""
        dispatcher = self.dispatcher
        assert dispatcher is not None
        self.coming[slot] += 1
        self.inflight += 1
        entry: list[Any] = [False, None, d, fresh, given]  # arrived, result, and how to add it
        issued = self.issued.get(slot)
        if issued is None:
            issued = self.issued[slot] = deque()
        issued.append(entry)
        dispatcher.submit(fn, args, (self, slot, entry), self.run, None)

    def arrived(self) -> None:
        """Takes one result from the pool (this pass's or another's of the same run); adds its
        slot's results that are next in issue order."""
        dispatcher = self.dispatcher
        assert dispatcher is not None
        token, _, g = dispatcher.collect()
        owner: Backward = token[0]
        owner.landed(token[1], token[2], g)

    def landed(self, slot: int, entry: list[Any], g: Any) -> None:
        self.inflight -= 1
        entry[0] = True
        entry[1] = g
        issued = self.issued[slot]
        while issued and issued[0][0]:
            _, g, d, fresh, given = issued.popleft()
            self.coming[slot] -= 1
            self.add(slot, g, fresh and g is not d, given)


# -------------------------------------------------------------------------------------- the rules


def _leaf(b: Backward, step: LeafStep) -> None:
    run = b.run
    weight = run.weights[step.out]
    d = b.take(step.out)
    if weight is None:
        return
    if (weight in b.products or weight in b.fans_of) and weight not in b.gradients:
        b.gradients[weight] = None  # its place among the gradients: its leaf's, as for any delta
    if d is None:
        return
    accumulate(b, weight, d, b.owned[step.out], run.datas[step.out])


def accumulate(b: Backward, weight: Any, d: Any, owned: bool, data: Any) -> None:
    """Adds ``d`` to ``weight``'s gradient (``owned``: an array of the pass's own; ``data``: the
    weight's). A weight read by several frames (batchable bodies') has a slot in each: their deltas
    are summed here, and it counts as one backward, with the summed delta."""
    if type(d) is not float and type(data) is not float:
        dtype = data.dtype
        if d.dtype is not dtype:  # (compared by value at the end: rarely another object)
            b.recast[weight] = dtype
    held = b.gradients.get(weight)
    if held is None:
        b.stats.backward_counts.tally(WEIGHT)
        b.gradients[weight] = d
        if owned:
            b.owned_gradients.add(weight)
        else:
            b.shared.append(weight)
    elif weight in b.owned_gradients:
        b.gradients[weight] = add_into(held, d)
    else:
        b.gradients[weight] = add(held, d)
        b.owned_gradients.add(weight)


def _op(b: Backward, step: OpStep) -> None:
    d = b.take(step.out)
    if d is None:
        return
    run = b.run
    prim = step.prim
    out = step.out
    args = step.args(run)
    params = step.params_of(run)
    xp = run.xps[out]
    saved = run.saved[out]
    passes = prim.passes and type(run.datas[out]) is float
    wants = run.wants
    stats = b.stats
    stats.backward_counts.tally(prim.number)
    heavy = step.heavy and b.dispatcher is not None
    exact = step.exact
    if exact is None and prim.broadcasts and prim.own:  # (a user's vjp may give any broadcast shape)
        exact = step.exact = _exact(args, run.datas[out])
    jointly = _joint(stats, prim)
    pooled = JointDeltas(prim) if jointly and heavy else None  # (its inputs' deltas asked on the pool)
    deltas: Sequence[Any] | None = None  # (a joint vjp's, worked out here otherwise)
    products = prim.products  # (most ops have none: no lookup an input then)
    for j, slot in enumerate(step.ins):
        if not wants[slot]:
            continue
        if passes and type(args[j]) is float:  # the delta passes through: no kernel
            b.give(slot, d, False)
            continue
        d = _dense(d)  # the rules want it dense: made so once (kept for the next inputs)
        if not jointly:
            stats.kernels += 1
            stats.vjp_counts.tally(prim.number)
        rule = products.get(j) if products else None
        if rule is not None and b.product(slot, call_vjp(rule, xp, d, saved, args, params)):
            continue
        same = exact is not None and exact[j]
        if heavy:
            delta = prim.delta if pooled is None else pooled.delta
            b.submit(delta, (j, xp, args, saved, d, params, False, same), slot, d, prim.fresh)
            continue
        if not jointly:
            g = prim.delta(j, xp, args, saved, d, params, False, same)
        else:
            if deltas is None:
                deltas = prim.joint_deltas(xp, args, saved, d, params)
            g = prim.finish_delta(j, xp, deltas[j], args, False, same)
        b.give(slot, g, prim.fresh and g is not d)


def _joint(stats: RunStats, prim: Primitive) -> bool:
    """Whether ``prim`` has a joint vjp: then the deltas of one application or group are counted
    here, as one kernel (otherwise each input's vjp counts)."""
    if prim.joint_vjp is None:
        return False
    stats.kernels += 1
    stats.vjp_counts.tally(prim.number)
    return True


def _merged(b: Backward, step: MergedStep) -> None:
    d = b.take(step.out)
    if d is None:
        return
    run = b.run
    prim = step.prim
    out = step.out
    given = b.present[out]
    d = _dense(d)
    args = step.args(run)
    params = step.params_of(run)
    xp = run.xps[out]
    saved = run.saved[out]
    stats = b.stats
    stats.backward_counts.tally(prim.number)
    heavy = step.heavy and b.dispatcher is not None
    jointly = _joint(stats, prim)
    pooled = JointDeltas(prim) if jointly and heavy else None  # (as in _op)
    deltas: Sequence[Any] | None = None
    for i, slot in enumerate(step.ins):
        if not run.wants[slot]:
            continue
        if not jointly:
            stats.kernels += 1
            stats.vjp_counts.tally(prim.number)
        rule = prim.products.get(i)
        if (
            rule is not None
            and not step.stacked[i]
            and step.vjps is prim.vjps
            and b.product(slot, call_vjp(rule, xp, d, saved, args, params))
        ):
            continue
        shape = run.datas[slot].shape if step.pads[i] else None
        # A shared input of an elementwise group was broadcast over the rows: its delta is summed
        # over them (an op that broadcasts sums every broadcast axis anyway).
        over = step.n if not step.stacked[i] and step.elementwise and not prim.broadcasts else 0
        rows = given if step.stacked[i] else ALL
        if heavy:
            delta: Callable[..., Any] = prim.merged_delta if pooled is None else pooled.merged_delta
            vjp = step.vjps[i] if pooled is None else None  # (a joint vjp's part for input i)
            b.submit(delta, (i, vjp, over, shape, xp, d, saved, args, params), slot, d, prim.fresh, rows)
            continue
        if not jointly:
            g = prim.merged_delta(i, step.vjps[i], over, shape, xp, d, saved, args, params)
        else:
            if deltas is None:
                deltas = prim.joint_deltas(xp, args, saved, d, params)
            g = prim.finish_merged(i, deltas[i], over, shape, xp, args)
        b.give(slot, g, prim.fresh and g is not d, rows)


def _fan(b: Backward, step: FanStep) -> None:
    d = b.take(step.out)
    if d is None:
        return
    run = b.run
    prim = step.prim
    fan = step.fan
    out = step.out
    given = b.present[out]
    marks = given if given is ALL or given is None else given.tolist()  # (NumPy's items: a call each)
    d = _dense(d)
    args = step.args(run)
    xp = run.xps[out]
    stats = b.stats
    stats.backward_counts.tally(prim.number)
    for i, slots in enumerate(step.ins):
        if i in fan.shared:
            if run.wants[slots[0]]:
                stats.kernels += 1
                stats.vjp_counts.tally(prim.number)
                b.give(slots[0], call_vjp(fan.vjps[i], xp, d, run.saved[out], args, step.params), False)
            continue
        wanted = [k for k, s in enumerate(slots) if run.wants[s] and _present(marks, k)]
        if not wanted:
            continue
        stats.kernels += 1
        stats.vjp_counts.tally(prim.number)
        rule = fan.products.get(i)
        factors = None if rule is None else call_vjp(rule, xp, d, run.saved[out], args, step.params)
        if factors is not None:
            left, rights = factors
            if len(wanted) == len(slots) and b.fan_product(slots, left, rights):
                continue
            wanted = [k for k in wanted if not b.product(slots[k], (left, rights[k, ...]))]
            if not wanted:
                continue
        g = call_vjp(fan.vjps[i], xp, d, run.saved[out], args, step.params)
        for k in wanted:
            s = slots[k]
            b.give(s, _row_like(g, k, run.datas[s]), False)


def _stack(b: Backward, step: StackStep) -> None:
    d = b.take(step.out)
    if d is None:
        return
    run = b.run
    d = _dense(d)
    if step.shape is not None:  # rows joined along their first axis: back to rows of rows
        d = namespace(d).reshape(d, (step.n, -1, *tuple(d.shape[1:])))
    present = b.present[step.out]
    b.stats.kernels += 1
    xp = namespace(d)
    # Another namespace's (a GPU's) copies of the index arrays, made once by the forward pass.
    indices = None if xp is NUMPY else step.device_indices(xp, d)
    for j, source in enumerate(step.sources):
        places = step.places[j]
        picks = step.picks[j]
        if not run.wants[source]:
            continue
        if picks is None:
            p = int(places[0])
            if _present(present, p):
                b.give(source, _row_like(d, p, run.datas[source]), False)
            continue
        held = b.stacked(source)
        if indices is None:
            if step.unique[j]:
                add_rows_at(held, picks, d, None if step.single else places)
            else:
                b.deltas[source] = scatter_add(xp, held, picks, d if step.single else d[places])
        elif rows_kernel_fits(held, d):  # CuPy: the rows added where they came from, one kernel
            move_rows("scatter_add", held, indices.picks[j], d, indices.places[j])
        else:
            picked = d if step.single else xp.take(d, indices.places[j], axis=0)
            b.deltas[source] = scatter_add(xp, held, indices.picks[j], picked)
        if b.present[source] is not ALL:
            b.mark(source, picks if present is ALL else picks[present[places]])


def _row(b: Backward, step: RowStep) -> None:
    d = b.take(step.out)
    if d is not None:
        b.give_row(step.source, step.row, d)


def _foreign(b: Backward, step: ForeignStep) -> None:
    """A tape of the user's own: its backward, given the slot's summed delta, or its release."""
    d = b.take(step.out)
    run_do(b, as_node(step.tape.release() if d is None else step.tape.backward(Pure(_dense(d)))))


def _body(b: Backward, step: BodyStep) -> None:
    """A batchable body's frame swept by a pass of its own, seeded with its results' deltas; its
    arguments' deltas go back for the calls that got one (a call none of whose results got a delta
    gives its inputs none, as it would alone)."""
    run = b.run
    frame: Run = run.datas[step.out]
    program = step.program
    inner = Backward(frame, b.dispatcher, b.diagnose, b)
    inner.current = b.current
    present: Any = None
    for j, slot in enumerate(step.outs):
        d = b.take(slot)
        given = b.present[slot]
        if d is not None:
            inner.give(program.outputs[j][0], d, b.owned[slot], given)
            if given is ALL or present is ALL:
                present = ALL
            else:
                present = given.copy() if present is None else present | given
        run.datas[slot] = None
    inner.sweep()
    if present is None:
        return
    for i, slot in enumerate(program.inputs):
        g = inner.deltas[slot]
        if g is not None and run.wants[step.ins[i]]:
            b.give(step.ins[i], g, inner.owned[slot], present if step.n else ALL)


def run_rule(b: Backward, step: Step) -> None:
    """Runs the rule of ``step``'s kind: how it passes its slot's delta back to the slots it read.
    (A call each, by kind: compiled, a rule looked up in a table is called as a Python object, its
    arguments boxed and parsed on every call.)"""
    if type(step) is OpStep:
        _op(b, step)
    elif type(step) is LeafStep:
        _leaf(b, step)
    elif type(step) is RowStep:
        _row(b, step)
    elif type(step) is MergedStep:
        _merged(b, step)
    elif type(step) is FanStep:
        _fan(b, step)
    elif type(step) is StackStep:
        _stack(b, step)
    elif type(step) is BodyStep:
        _body(b, step)
    elif type(step) is ForeignStep:
        _foreign(b, step)
    elif type(step) is not CastStep:  # (a constant cast to its op's dtype takes no delta)
        raise TypeError(f"no backward rule for a {type(step).__name__}")


def run_do(b: Backward, do: Node) -> None:
    """Runs a ``Do`` of a user's tape's backward (it may give deltas to this run's tapes)."""
    graph = Graph()
    root = graph.node(do)
    run = Run(b.dispatcher, b.stats, b.run.snapshot, context=b.run.context)
    Scheduler(graph, run, False, {}, Recent(0)).execute([root])


def backward(
    run: Run, root: int, seed: Any, dispatcher: Dispatcher | None, diagnose: bool = False
) -> tuple[dict[Any, Any], set[Any]]:
    """Backpropagates ``seed``, the delta of slot ``root`` of ``run``: every weight's gradient (its
    summed delta), and the weights whose gradient is an array of the pass's own (that nothing else
    holds: an optimizer may write into it). ``diagnose``: see :class:`Backward`."""
    pass_ = Backward(run, None if diagnose else dispatcher, diagnose)
    pass_.deltas[root] = seed
    pass_.present[root] = ALL
    pass_.sweep()
    pass_.multiply()
    _recast(pass_)
    _unaliased(pass_)
    return pass_.gradients, pass_.owned_gradients


def _recast(b: Backward) -> None:
    """Casts each gradient given a delta of another dtype than its weight's to the weight's: a
    float32 weight that met a float64 weight in the graph (the op's result is promoted) gets a
    float32 gradient, as its optimizer and ``compute_gradients``' caller expect. A cast is the
    pass's own array."""
    for weight, dtype in b.recast.items():
        gradient = b.gradients[weight]
        if gradient.dtype == dtype:
            continue  # (its deltas were of a narrower dtype, or its dtype another object)
        b.gradients[weight] = astype(gradient, dtype)
        b.owned_gradients.add(weight)


def _unaliased(b: Backward) -> None:
    """Gives each gradient that may be another's too memory of its own. A delta passed through
    unchanged (by ``+``, say), or a view of one (by ``reshape``), can be the gradient of two weights
    at once, and changing one in place must not change the other. Only the gradients first given
    as arrays the pass does not own need a look: an owned array is one nothing else holds."""
    seen: set[int] = set()
    owned = b.owned_gradients
    for weight in b.shared:
        if weight in owned:  # (summed since, or cast: into an array of the pass's own)
            continue
        gradient = b.gradients[weight]
        if type(gradient) is float:
            continue
        memory = _memory(gradient)
        if memory in seen:
            gradient = b.gradients[weight] = (
                gradient.copy()  # its own object, with its own rows
                if type(gradient) is SparseRows
                else namespace(gradient).asarray(gradient, copy=True)
            )
            owned.add(weight)
            memory = _memory(gradient)
        seen.add(memory)


def _memory(gradient: Any) -> int:
    """The identity of the array that owns a gradient's memory (the array, or its rows' for a
    ``SparseRows``; or the base they are a view of)."""
    if type(gradient) is NDARRAY and gradient.base is None:  # the common case, without getattr
        return id(gradient)
    array = gradient.values if type(gradient) is SparseRows else gradient
    while getattr(array, "base", None) is not None and hasattr(array.base, "shape"):
        array = array.base
    return id(array)


# ------------------------------------------------------------------------------------------ helpers


def _finite(g: Any) -> bool:
    """Whether every element of a delta is finite (a diagnosing pass's check)."""
    if type(g) is float:
        return math.isfinite(g)
    values = g.values if type(g) is SparseRows else g
    xp = namespace(values)
    return bool(xp.all(xp.isfinite(values)))


def _dense(d: Any) -> Any:
    return d.to_dense() if type(d) is SparseRows else d


def _joined_rows(xp: Any, parts: list[Any], width: int, fanned: bool) -> Any:
    """The rows of a weight's deferred factors as one matrix (``width`` columns): each part a matrix
    of rows or one row as a vector. ``fanned``: each part is a fan's k calls' rows, (k, rows,
    outputs) or (k, outputs), their rows side by side (k * outputs = ``width`` columns). Parts of
    one row each (steps of one sequence) are one copy of their bytes, reshaped."""
    one_row = 2 if fanned else 1
    if len(parts) == 1 and not fanned and xp is NUMPY and parts[0].flags.c_contiguous:
        p = parts[0]  # one call's rows, read where they are: the joined copy's bytes already
        return np.reshape(p, (1, width)) if p.ndim == 1 else p
    if all([p.ndim == one_row for p in parts]):
        return xp.reshape(concat_arrays(xp, parts, 0), (len(parts), width))
    if xp is NUMPY and all([p.dtype == parts[0].dtype for p in parts]):
        return _joined_numpy(parts, width, one_row)
    rows = []
    for p in parts:  # (the rows counted, not left to a -1: NumPy refuses it without elements)
        if p.ndim == one_row:
            rows.append(xp.reshape(p, (1, width)))
        elif fanned:  # (k, rows, outputs): (rows, k * outputs)
            rows.append(xp.reshape(xp.permute_dims(p, (1, 0, 2)), (p.shape[1], width)))
        else:
            rows.append(p)
    return xp.concat(rows, axis=0) if len(rows) > 1 else rows[0]


def _joined_numpy(parts: list[Any], width: int, one_row: int) -> Any:
    """:func:`_joined_rows` of NumPy arrays of one dtype: each part copied once, into its rows of
    the result (a fan's part through its rows' view as (rows, k, outputs)), where transposing it
    and then joining the parts copied it twice."""
    total = 0
    for p in parts:
        total += 1 if p.ndim == one_row else p.shape[-2]
    out = np.empty((total, width), dtype=parts[0].dtype)
    r = 0
    for p in parts:
        if p.ndim == one_row:
            out[r].reshape(p.shape)[...] = p
            r += 1
        else:
            rows = p.shape[-2]
            if one_row == 2:  # (k, rows, outputs) into (rows, k * outputs)
                out[r : r + rows].reshape(rows, p.shape[0], p.shape[2])[...] = p.transpose(1, 0, 2)
            else:
                out[r : r + rows] = p
            r += rows
    return out


def _present(given: Any, k: int) -> bool:
    return given is ALL or (given is not None and bool(given[k]))


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
