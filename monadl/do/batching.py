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
from collections.abc import Hashable
from typing import Any

import numpy as np

from monadl.do.do import Apply, Call, Node
from monadl.do.primitive import ROWS_SUM, Primitive, add_n, float_key
from monadl.do.record import Entry, Run, kind_rank
from monadl.do.steps import FanStep, MergedStep, OpStep, RowStep, StackStep, Step

NO_POOL = math.inf
"""The ``min_cost`` of a run without a pool: no kernel is worth it."""


def signature(run: Run, entry: Entry, min_cost: float) -> Hashable | None:
    """An op's signature (see the module): equal ones merge; None runs it alone. ``min_cost``: a
    call worth the pool on its own runs beside the others instead (``NO_POOL``: there is none).
    (A parameter that is unhashable makes the signature so: the caller runs it alone.)"""
    node = entry.node
    assert type(node) is Apply
    prim = node.prim
    spec = prim.batch
    if spec is None:
        return None
    inputs = entry.inputs
    if spec.mergeable is not None and not spec.mergeable(*[run.value(e.slot, e.row) for e in inputs]):
        return None
    key: list[Any] = [prim]
    if node.params:
        key.append(prim.static_items(node.params))
    stacked = bool(spec.row_params)
    shared = spec.shared
    any_input = spec.elementwise
    for i, e in enumerate(inputs):
        slot = e.slot
        if (any_input or i in shared) and e.row < 0:
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
        key.append(run.kind(slot, e.row))
        stacked = True
    if not stacked:
        return None
    if (
        min_cost < NO_POOL
        and cost_of(prim, [run.value(e.slot, e.row) for e in inputs], node.params) >= min_cost
    ):
        return None  # worth the pool on its own: run beside the others, not merged with them
    return tuple(key)


def fan_signature(run: Run, entry: Entry) -> Hashable | None:
    """The signature of an op that merged with nothing: calls that read one value with different
    others merge by fanning out."""
    node = entry.node
    assert type(node) is Apply
    spec = node.prim.batch
    fan = None if spec is None else spec.fan
    if fan is None:
        return None
    key: list[Any] = ["fan", node.prim, node.prim.static_items(node.params)]
    for i, e in enumerate(entry.inputs):
        key.append((e.slot, e.row) if i in fan.shared else run.kind(e.slot, e.row))
    return tuple(key)


def call_signature(run: Run, entry: Entry) -> Hashable | None:
    """A batchable call's signature: its static part and its rows' kinds; None where the rows
    differ in rank (stacked, a float against an array, or a vector against a matrix, would no
    longer broadcast as they did in the call)."""
    node = entry.node
    assert type(node) is Call
    key: list[Any] = [node.static]
    rank = -1
    for e in entry.inputs:
        k = run.kind(e.slot, e.row)
        r = kind_rank(k)
        if rank >= 0 and r != rank:
            return None
        rank = r
        key.append(k)
    return tuple(key)


# ------------------------------------------------------------------------------------------- groups


def merged(run: Run, group: list[Entry], bound: dict[Node, int], min_cost: float) -> MergedStep:
    """Calls of one primitive with equal signatures, as one call on their stacked rows (call k's
    value: row k of the step's slot). ``bound``: the bound nodes' positions (a static graph's);
    ``min_cost``: the cost worth the pool (``NO_POOL``: there is none)."""
    first = group[0].node
    assert type(first) is Apply
    prim = first.prim
    spec = prim.batch
    assert spec is not None
    n = len(group)
    ins0 = group[0].inputs
    datas0 = [run.value(e.slot, e.row) for e in ins0]
    if prim.check is not None:  # equal signatures: the first call's shapes stand for all
        prim.check(*datas0, **first.params)
    calls = []
    members = []
    for entry in group:
        node = entry.node
        assert type(node) is Apply
        calls.append(node.params)
        if bound:
            members.append(bound.get(node, -1))
    params = merge_params(prim, calls, datas0[0])
    rank = 0
    for d in datas0:
        if type(d) is not float and len(d.shape) > rank:
            rank = len(d.shape)
    ins: list[int] = []
    stacked: list[bool] = []
    pads: list[int] = []
    wants = False
    for i, e in enumerate(ins0):
        if e.row < 0 and (i in spec.shared or (spec.elementwise and is_shared(run, e.slot))):
            slot = e.slot
            stacked.append(False)
            pads.append(0)
        else:
            slot = stack_rows(run, [c.inputs[i].slot for c in group], [c.inputs[i].row for c in group])
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
        prim, ins, stacked, pads, params, members, n, scalar_result(prim, datas0, first.params), out, wants
    )
    step.calls = calls
    step.row_shapes = [() if type(d) is float else tuple(d.shape) for d in datas0]
    if min_cost < NO_POOL:
        weigh(run, step, prim, step.args(run), params, ins, min_cost)
    stats = run.stats
    stats.groups += 1
    stats.merged += n
    return step


def fan(run: Run, group: list[Entry], min_cost: float) -> FanStep:
    """Calls of one primitive reading one value with different others, as one kernel."""
    first = group[0].node
    assert type(first) is Apply
    prim = first.prim
    spec = prim.batch
    assert spec is not None and spec.fan is not None
    fan_out = spec.fan
    first_inputs = group[0].inputs
    if prim.check is not None:  # every call's own check, so that an error names its shapes
        for entry in group:
            node = entry.node
            assert type(node) is Apply
            prim.check(*[run.value(e.slot, e.row) for e in entry.inputs], **node.params)
    ins: list[list[int]] = []
    wants = False
    for i in range(len(first_inputs)):
        if i in fan_out.shared:
            slots = [slot_of(run, first_inputs[i].slot, first_inputs[i].row)]
        else:
            slots = [slot_of(run, c.inputs[i].slot, c.inputs[i].row) for c in group]
        for s in slots:
            if run.wants[s]:
                wants = True
        ins.append(slots)
    step = FanStep(prim, fan_out, ins, first.params, len(group), run.new_slot(wants), wants)
    if min_cost < NO_POOL:
        total = 0.0
        for entry in group:
            total += cost_of(prim, [run.value(e.slot, e.row) for e in entry.inputs], first.params)
        step.heavy = total >= min_cost
    stats = run.stats
    stats.groups += 1
    stats.merged += len(group)
    return step


def alone(run: Run, entry: Entry, bound: dict[Node, int], min_cost: float) -> Step:
    """An op that merges with nothing: its own step (rows of groups taken out first, but for sums
    and concatenations of rows, which take them as gathered arrays). Its value is the returned
    step's slot."""
    node = entry.node
    assert type(node) is Apply
    prim = node.prim
    spec = prim.batch
    inputs = entry.inputs
    if spec is not None and (spec.sums_rows or spec.joins_rows or spec.stacks_rows):
        for e in inputs:
            if e.row >= 0:
                if spec.sums_rows:
                    return sum_rows(run, inputs)
                step = join_rows(run, node, inputs, spec.stacks_rows)
                if step is not None:
                    return step
                break
    ins = []
    wants = False
    for e in inputs:
        slot = slot_of(run, e.slot, e.row)
        ins.append(slot)
        if run.wants[slot]:
            wants = True
    step = OpStep(prim, ins, run.new_slot(wants), node.params, bound.get(node, -1), wants)
    if min_cost < NO_POOL:
        weigh(run, step, prim, step.args(run), node.params, ins, min_cost)
    return step


def sum_rows(run: Run, inputs: list[Entry]) -> Step:
    """An n-ary sum over rows of groups: each group's rows gathered and summed as one array, then
    the parts summed (the sum of a loss over every node of a batch of trees)."""
    parts: list[int] = []
    by_group: dict[int, list[int]] = {}
    for e in inputs:
        if e.row >= 0:
            rows = by_group.get(e.slot)
            if rows is None:
                by_group[e.slot] = [e.row]
            else:
                rows.append(e.row)
        else:
            parts.append(e.slot)
    for slot, rows in by_group.items():
        gathered = stack_rows(run, [slot] * len(rows), rows)
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


def join_rows(run: Run, node: Apply, inputs: list[Entry], stacks: bool) -> Step | None:
    """A concatenation of arrays of one kind along their first axis (``stacks``: a stack along a
    new first axis), as one gather; None if it is not one."""
    kind = run.kind(inputs[0].slot, inputs[0].row)
    rank = kind_rank(kind)
    axis = node.params.get("axis", 0)
    if stacks:
        if axis not in (0, -rank - 1):
            return None
    elif rank == 0 or axis not in (0, -rank):
        return None
    for e in inputs:
        if run.kind(e.slot, e.row) != kind:
            return None
    slots = [e.slot for e in inputs]
    rows = [e.row for e in inputs]
    if stacks:
        return stack_step(run, slots, rows, None)
    first = run.value(inputs[0].slot, inputs[0].row)
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
        [np.asarray(p, dtype=np.intp) for p in positions],
        [None if r is None else np.asarray(r, dtype=np.intp) for r in picked],
        len(slots),
        shape,
        out,
        wants,
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
