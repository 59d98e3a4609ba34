"""Dynamic batching: when calls merge, and how a group of them becomes one step.

A call's *signature* is its primitive, the static part of its parameters, and per input either the
value itself (a weight, or a float constant: one value for all the calls, whose delta is summed once
per group) or the kind of a row (type, shape, dtype: the calls' values are stacked as rows). Calls
of equal signature that are ready together run as one :class:`~monadl.do.steps.MergedStep` on their
stacked rows, each call's value a row of its result (DyNet's autobatching; a primitive says how its
inputs batch, ``Batching``). Calls left alone that read one value with different others (``linear``
of one input with several weights: the gates of an LSTM cell) *fan out* into one kernel instead. A
batchable operation's calls of equal signature run its body once, on their stacked rows
(``scheduler.py``). Rows of groups are read by the next groups through one gather each.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Final, final

import numpy as np

from monadl.do.do import Call
from monadl.do.kinds import kind_rank
from monadl.do.primitive import ROWS_SUM, Primitive, add_n, float_key
from monadl.do.record import Run
from monadl.do.steps import FanStep, MergedStep, OpStep, RowStep, StackStep, Step
from monadl.typeclasses.backend import index_array

if TYPE_CHECKING:
    from monadl.do.scheduler import Scheduler

NO_POOL: Final = math.inf
"""The ``min_cost`` of a run without a pool: no kernel is worth it."""


def signature(s: Scheduler, r: int) -> list[Any] | None:
    """An op's signature (see the module), as a list of its parts, each hashable: equal ones
    merge; None runs it alone (a parameter that is unhashable too). A call worth the pool on its
    own runs beside the others instead."""
    graph = s.graph
    prim: Primitive = graph.objs[r]
    spec = prim.batch
    if spec is None:
        return None
    run = s.run
    lo, hi = graph.starts[r], graph.starts[r + 1]
    in_slots, in_rows = s.in_slots, s.in_rows
    if spec.mergeable is not None and not spec.mergeable(*_ranks(s, lo, hi)):
        return None
    params = graph.params[r]
    key: list[Any] = [prim]
    if not prim.signature_items(key, params):
        return None
    stacked = bool(spec.row_params)
    shared = spec.shared
    any_input = spec.elementwise
    for k in range(lo, hi):
        i = k - lo
        slot = in_slots[k]
        row = in_rows[k]
        if (any_input or i in shared) and row < 0:
            if run.weights[slot] is not None:
                key.append(-1 - slot)  # one weight for all the calls
                continue
            data = run.datas[slot]
            if type(data) is float and not run.wants[slot]:
                key.append((float_key(data),))  # one float constant for all the calls
                continue
            if i in shared:
                key.append(("value", slot))  # one computed value read whole by all the calls
                continue
        if i in shared:
            return None
        key.append(run.kind(slot, row))
        stacked = True
    if not stacked:
        return None
    if s.min_cost < NO_POOL and cost_of(prim, _values(s, lo, hi), params) >= s.min_cost:
        return None  # worth the pool on its own: run beside the others, not merged with them
    return key


def _ranks(s: Scheduler, lo: int, hi: int) -> list[int]:
    """The ranks of the inputs ``lo`` to ``hi`` of a ready row (a float's, or a row of floats', is
    0), from their value kinds: no row of a merged value is made."""
    run = s.run
    return [kind_rank(run.kind(s.in_slots[k], s.in_rows[k])) for k in range(lo, hi)]


def _values(s: Scheduler, lo: int, hi: int) -> list[Any]:
    """The values of the inputs ``lo`` to ``hi`` (of the graph's ``args``) of a ready row."""
    run = s.run
    values = []
    for k in range(lo, hi):
        values.append(run.value(s.in_slots[k], s.in_rows[k]))
    return values


def fan_signature(s: Scheduler, r: int) -> list[Any] | None:
    """The signature of an op that merged with nothing: calls that read one value with different
    others merge by fanning out."""
    graph = s.graph
    prim: Primitive = graph.objs[r]
    spec = prim.batch
    fan = None if spec is None else spec.fan
    if fan is None:
        return None
    lo, hi = graph.starts[r], graph.starts[r + 1]
    key: list[Any] = ["fan", prim]
    if not prim.signature_items(key, graph.params[r]):
        return None
    for k in range(lo, hi):
        slot, row = s.in_slots[k], s.in_rows[k]
        key.append((slot, row) if k - lo in fan.shared else s.run.kind(slot, row))
    return key


def call_signature(s: Scheduler, r: int) -> list[Any] | None:
    """A batchable call's signature: its static part and its rows' kinds; None where the rows
    differ in rank (stacked, a float against an array, or a vector against a matrix, would no
    longer broadcast as they did in the call)."""
    graph = s.graph
    call: Call = graph.objs[r]
    key: list[Any] = [call.static]
    rank = -1
    for k in range(graph.starts[r], graph.starts[r + 1]):
        kind = s.run.kind(s.in_slots[k], s.in_rows[k])
        rk = kind_rank(kind)
        if rank >= 0 and rk != rank:
            return None
        rank = rk
        key.append(kind)
    return key


# ------------------------------------------------------------------------------------------- groups


SCAN: Final = 8
"""How many groups :class:`Groups` compares a row's signature with, one by one, before it keys them
in a dictionary."""


@final
class Groups:
    """Ready rows grouped by equal signatures, the groups in the order their signatures were first
    met. A bucket's rows (calls of one primitive or operation) mostly share one signature or a
    few: a row's is compared with the group its predecessor joined, then with each group, part by
    part, as a dictionary would compare it on a hit, without the tuple a dictionary needs and the
    hashing of every part. Past ``SCAN`` groups (calls that differ in a constant, say), the groups
    are keyed by their signatures' tuples (the signatures' parts are hashable)."""

    def __init__(self) -> None:
        self.keys: list[list[Any]] = []
        self.rows: list[list[int]] = []
        self.last = -1  # the group the last row joined
        self.index: dict[tuple[Any, ...], int] | None = None  # past SCAN groups: tuple -> group

    def join(self, key: list[Any] | None, r: int) -> bool:
        """Adds row ``r`` to the group of signature ``key``; False if there is no key."""
        if key is None:
            return False
        keys = self.keys
        last = self.last
        if last >= 0 and keys[last] == key:
            self.rows[last].append(r)
            return True
        index = self.index
        if index is None:
            n = len(keys)
            for g in range(n):
                if g != last and keys[g] == key:
                    self.last = g
                    self.rows[g].append(r)
                    return True
            if n < SCAN:
                self._new(key, r)
                return True
            index = self.index = {tuple(k): g for g, k in enumerate(keys)}
        whole = tuple(key)
        g = index.get(whole, -1)
        if g >= 0:
            self.last = g
            self.rows[g].append(r)
            return True
        index[whole] = len(keys)
        self._new(key, r)
        return True

    def _new(self, key: list[Any], r: int) -> None:
        self.last = len(self.keys)
        self.keys.append(key)
        self.rows.append([r])

    def hash_of(self, g: int) -> int:
        """Group ``g``'s signature's hash (the run counts distinct ones)."""
        return hash(tuple(self.keys[g]))


def merged(s: Scheduler, group: list[int]) -> MergedStep:
    """Calls of one primitive with equal signatures, as one call on their stacked rows (call k's
    value: row k of the step's slot)."""
    graph = s.graph
    run = s.run
    first = group[0]
    prim: Primitive = graph.objs[first]
    spec = prim.batch
    assert spec is not None
    n = len(group)
    lo0, hi0 = graph.starts[first], graph.starts[first + 1]
    datas0 = _values(s, lo0, hi0)
    first_params = graph.params[first]
    if prim.check is not None:  # equal signatures: the first call's shapes stand for all
        prim.check(*datas0, **first_params)
    calls = []
    members = []
    bound = s.bound
    for r in group:
        calls.append(graph.params[r])
        if bound:
            members.append(bound.get(r, -1))
    params = merge_params(prim, calls, datas0[0])
    rank = 0
    for d in datas0:
        if type(d) is not float and len(d.shape) > rank:
            rank = len(d.shape)
    ins: list[int] = []
    stacked: list[bool] = []
    pads: list[int] = []
    wants = False
    in_slots, in_rows, starts = s.in_slots, s.in_rows, graph.starts
    for i in range(hi0 - lo0):
        k0 = lo0 + i
        if in_rows[k0] < 0 and (i in spec.shared or (spec.elementwise and is_shared(run, in_slots[k0]))):
            slot = in_slots[k0]
            stacked.append(False)
            pads.append(0)
        else:
            column_slots = [in_slots[starts[c] + i] for c in group]
            column_rows = [in_rows[starts[c] + i] for c in group]
            slot = stack_rows(run, column_slots, column_rows)
            stacked.append(True)
            d = datas0[i]
            row_rank = 0 if type(d) is float else len(d.shape)
            # so that rows broadcast as their calls did
            pads.append(rank - row_rank if spec.elementwise and row_rank < rank else 0)
        ins.append(slot)
        if run.wants[slot]:
            wants = True
    out = run.new_slot(wants)
    step = MergedStep(
        prim, ins, stacked, pads, params, members, n, scalar_result(prim, datas0, first_params), out, wants
    )
    step.calls = calls
    step.row_shapes = [() if type(d) is float else tuple(d.shape) for d in datas0]
    if s.min_cost < NO_POOL:
        weigh(run, step, prim, step.args(run), params, ins, s.min_cost)
    stats = run.stats
    stats.groups += 1
    stats.merged += n
    return step


def fan(s: Scheduler, group: list[int]) -> FanStep:
    """Calls of one primitive reading one value with different others, as one kernel."""
    graph = s.graph
    run = s.run
    first = group[0]
    prim: Primitive = graph.objs[first]
    spec = prim.batch
    assert spec is not None and spec.fan is not None
    fan_out = spec.fan
    starts = graph.starts
    if prim.check is not None:  # every call's own check, so that an error names its shapes
        for r in group:
            prim.check(*_values(s, starts[r], starts[r + 1]), **graph.params[r])
    ins: list[list[int]] = []
    wants = False
    for i in range(starts[first + 1] - starts[first]):
        if i in fan_out.shared:
            k = starts[first] + i
            slots = [slot_of(run, s.in_slots[k], s.in_rows[k])]
        else:
            slots = [slot_of(run, s.in_slots[starts[c] + i], s.in_rows[starts[c] + i]) for c in group]
        for slot in slots:
            if run.wants[slot]:
                wants = True
        ins.append(slots)
    params = graph.params[first]
    step = FanStep(prim, fan_out, ins, params, len(group), run.new_slot(wants), wants)
    if s.min_cost < NO_POOL:
        total = 0.0
        for r in group:
            total += cost_of(prim, _values(s, starts[r], starts[r + 1]), params)
        step.heavy = total >= s.min_cost
    stats = run.stats
    stats.groups += 1
    stats.merged += len(group)
    return step


def alone(s: Scheduler, r: int) -> Step:
    """An op that merges with nothing: its own step (rows of groups taken out first, but for sums
    and concatenations of rows, which take them as gathered arrays). Its value is the returned
    step's slot."""
    graph = s.graph
    run = s.run
    prim: Primitive = graph.objs[r]
    spec = prim.batch
    lo, hi = graph.starts[r], graph.starts[r + 1]
    in_slots, in_rows = s.in_slots, s.in_rows
    if spec is not None and (spec.sums_rows or spec.joins_rows or spec.stacks_rows):
        for k in range(lo, hi):
            if in_rows[k] >= 0:
                slots = [in_slots[j] for j in range(lo, hi)]
                rows = [in_rows[j] for j in range(lo, hi)]
                if spec.sums_rows:
                    return sum_rows(run, slots, rows)
                step = join_rows(run, graph.params[r], slots, rows, spec.stacks_rows)
                if step is not None:
                    return step
                break
    ins = []
    wants = False
    for k in range(lo, hi):
        slot = slot_of(run, in_slots[k], in_rows[k])
        ins.append(slot)
        if run.wants[slot]:
            wants = True
    params = graph.params[r]
    step = OpStep(prim, ins, run.new_slot(wants), params, s.bound.get(r, -1), wants)
    if s.min_cost < NO_POOL:
        weigh(run, step, prim, step.args(run), params, ins, s.min_cost)
    return step


def sum_rows(run: Run, slots: list[int], rows: list[int]) -> Step:
    """An n-ary sum over rows of groups: each group's rows gathered and summed as one array, then
    the parts summed (the sum of a loss over every node of a batch of trees)."""
    parts: list[int] = []
    by_group: dict[int, list[int]] = {}
    for slot, row in zip(slots, rows, strict=True):
        if row >= 0:
            picked = by_group.get(slot)
            if picked is None:
                by_group[slot] = [row]
            else:
                picked.append(row)
        else:
            parts.append(slot)
    for slot, picked in by_group.items():
        gathered = stack_rows(run, [slot] * len(picked), picked)
        wants = run.wants[gathered]
        step = OpStep(
            ROWS_SUM, [gathered], run.new_slot(wants), {"scalar": run.scalar_rows[gathered]}, -1, wants
        )
        if len(parts) == 0 and len(by_group) == 1:
            return step
        run.steps.append(step)
        step.forward(run, True)
        parts.append(step.out)
    wants = False
    for s in parts:
        if run.wants[s]:
            wants = True
    return OpStep(add_n(len(parts)), parts, run.new_slot(wants), {}, -1, wants)


def join_rows(
    run: Run, params: dict[str, Any], slots: list[int], rows: list[int], stacks: bool
) -> Step | None:
    """A concatenation of arrays of one kind along their first axis (``stacks``: a stack along a
    new first axis), as one gather; None if it is not one."""
    kind = run.kind(slots[0], rows[0])
    rank = kind_rank(kind)
    axis = params.get("axis", 0)
    if stacks:
        if axis not in (0, -rank - 1):
            return None
    elif rank == 0 or axis not in (0, -rank):
        return None
    for slot, row in zip(slots, rows, strict=True):
        if run.kind(slot, row) != kind:
            return None
    if stacks:
        return stack_step(run, slots, rows, None)
    first = run.value(slots[0], rows[0])
    return stack_step(run, slots, rows, (-1, *first.shape[1:]))


def stack_rows(run: Run, slots: list[int], rows: list[int]) -> int:
    """A slot of the values at ``slots``/``rows`` as the rows of one array: a group's own slot when
    they are exactly its rows in order, else a gather of rows of groups (and of values of their
    own), run now."""
    n = len(slots)
    if rows[0] == 0:
        source = slots[0]
        if run.datas[source].shape[0] == n:
            whole = True
            for k in range(n):
                if slots[k] != source or rows[k] != k:
                    whole = False
                    break
            if whole:
                return source
    step = stack_step(run, slots, rows, None)
    run.steps.append(step)
    step.forward(run, True)
    return step.out


def stack_step(run: Run, slots: list[int], rows: list[int], shape: tuple[int, ...] | None) -> StackStep:
    """The step that gathers the values at ``slots``/``rows`` as the rows of one array (reshaped to
    ``shape``, if given: rows of rows joined along their first axis)."""
    n = len(slots)
    first = slots[0]
    one = rows[0] >= 0  # rows of one stacked slot (a merged group's): the commonest gather
    increasing = True  # (then its rows are distinct)
    for p in range(1, n):
        if slots[p] != first or rows[p] < 0:
            one = False
            break
        if rows[p] <= rows[p - 1]:
            increasing = False
    if one:
        out = run.new_slot(run.wants[first])
        run.scalar_rows[out] = shape is None and run.scalar_rows[first]
        if increasing and rows[n - 1] - rows[0] == n - 1:  # a run of consecutive rows
            picks = np.arange(rows[0], rows[0] + n, dtype=np.intp)
        else:
            picks = index_array(rows)
        unique = increasing or len(set(rows)) == n
        return StackStep(
            [first], [np.arange(n, dtype=np.intp)], [picks], n, shape, out, run.wants[first], [unique]
        )
    sources: list[int] = []
    positions: list[list[int]] = []
    picked: list[list[int] | None] = []
    index: dict[int, int] = {}
    for p in range(len(slots)):
        slot = slots[p]
        row = rows[p]
        if row >= 0:
            j = index.get(slot, -1)
            if j < 0:
                index[slot] = len(sources)
                sources.append(slot)
                positions.append([p])
                picked.append([row])
            else:
                positions[j].append(p)
                taken = picked[j]
                assert taken is not None
                taken.append(row)
        else:
            sources.append(slot)
            positions.append([p])
            picked.append(None)
    wants = False
    for s in sources:
        if run.wants[s]:
            wants = True
            break
    out = run.new_slot(wants)
    run.scalar_rows[out] = shape is None and (
        run.scalar_rows[slots[0]] if rows[0] >= 0 else type(run.datas[slots[0]]) is float
    )
    return StackStep(
        sources,
        [index_array(p) for p in positions],
        [None if r is None else index_array(r) for r in picked],
        len(slots),
        shape,
        out,
        wants,
        [r is None or len(set(r)) == len(r) for r in picked],
    )


def slot_of(run: Run, slot: int, row: int) -> int:
    """A slot of the value at ``slot``/``row`` of its own (a row taken out of its group, once)."""
    if row < 0:
        return slot
    key = (slot, row)
    taken = run.alone.get(key)
    if taken is None:
        wants = run.wants[slot]
        taken = run.new_slot(wants)
        step = RowStep(slot, row, taken, wants)
        run.steps.append(step)
        step.forward(run, True)
        run.alone[key] = taken
    return taken


# ------------------------------------------------------------------------------------------ helpers


def is_shared(run: Run, slot: int) -> bool:
    """Whether a slot may be one value for merged calls: a weight, or a float constant."""
    return run.weights[slot] is not None or (type(run.datas[slot]) is float and not run.wants[slot])


def merge_params(prim: Primitive, calls: list[dict[str, Any]], first: Any) -> dict[str, Any]:
    """The parameters of merged calls (``calls``: each call's; ``first``: the first call's first
    input): the first call's, with ``axis`` shifted past the rows, the per-row parameters stacked
    and the other per-run ones listed (``Primitive.stack_params``)."""
    spec = prim.batch
    assert spec is not None
    params = calls[0]
    if spec.axis:
        item_rank = 0 if type(first) is float else len(first.shape)
        params = {**params, "axis": shift_axis(params.get("axis", spec.axis_default), item_rank)}
    if spec.row_params or prim.per_run:
        params = prim.stack_params(calls, params)
    return params


def shift_axis(axis: Any, rank: int) -> Any:
    """An item's ``axis`` on stacked rows (the row axis is 0)."""
    if axis is None:
        return tuple(range(1, rank + 1))
    if isinstance(axis, tuple):
        return tuple(shift_axis(a, rank) for a in axis)
    return axis + 1 if axis >= 0 else axis


def scalar_result(prim: Primitive, datas: list[Any], params: dict[str, Any]) -> bool:
    """Whether a call's result is a Python float (as the unbatched op gives it)."""
    spec = prim.batch
    assert spec is not None
    if spec.scalar == "inputs":
        for d in datas:
            if type(d) is not float:
                return False
        return True
    if spec.scalar == "reduce":
        return params.get("axis") is None and not params.get("keepdims", False)
    return spec.scalar == "always"


def cost_of(prim: Primitive, args: list[Any] | tuple[Any, ...], params: dict[str, Any]) -> float:
    """An op's cost (roughly, floating-point operations), 0 for inputs it rejects (then it runs
    inline, and its check says why)."""
    try:
        return float(prim.cost(*args, **params))
    except Exception:  # noqa: BLE001 - inputs the op rejects: its own check reports them
        return 0.0


def weigh(
    run: Run,
    step: Step,
    prim: Primitive,
    args: list[Any] | tuple[Any, ...],
    params: dict[str, Any],
    ins: list[int],
    min_cost: float,
) -> None:
    """Decides whether ``step`` goes to the pool (its cost), and the worker it prefers (its first
    weight's: a weight's kernels run on one core, where its data is in cache)."""
    step.heavy = cost_of(prim, args, params) >= min_cost
    for slot in ins:
        w = run.weights[slot]
        if w is not None:
            step.affinity = id(w)
            break
