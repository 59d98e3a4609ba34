"""Batchable bodies: a group of calls of a ``@batchable`` operation runs its body once, on the calls'
stacked rows, as one step with a frame of its own.

The first group of a signature records the body's program: a scheduler of its own runs the body
in a new frame. The program is kept (``Recent``, by the group's signature) and replayed for every
later group of equal signature, whatever its number of rows: the body's graph is built, walked and
grouped once per signature (the vertex function of Cavs). A program is kept only where it holds for
any number of rows and read nothing that only its run has.

The scheduler owns the group (its arguments, its cache of programs, its calls' results); this
module records or replays the body given the group's stacked arguments, and runs the body's graph
only through the function the scheduler gives it (``RunBody``): it reads none of the scheduler.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

from monadl.do.do import Call, Operation
from monadl.do.graph import Graph, swap_recording
from monadl.do.record import Program, Run, RunTape, forward_stats
from monadl.do.stats import RunStats
from monadl.do.steps import BodyStep, MergedStep, OpStep, StackStep
from monadl.do.tape import Tape
from monadl.typeclasses.backend import ShapeError

RunBody = Callable[[Graph, Run, str, list[int]], list[int]]
"""How the scheduler runs a body's graph in a frame of its own: (graph, frame, operation's name,
root rows) to the roots' slots in the frame."""


def body_key(run: Run, call: Call, ins: list[int], n: int, batching: bool, min_cost: float) -> Hashable:
    """The key of a group's program: the operation's static part, its arguments' kinds (of a row,
    where ``n`` calls are stacked) and which take a delta, and the settings that shape a program."""
    kinds = tuple([run.kind(s, 0 if n else -1) for s in ins])
    wants = tuple([run.wants[s] for s in ins])
    return (call.static, kinds, wants, n == 0, batching, min_cost)


def replay(run: Run, op: Operation, program: Program, ins: list[int], n: int) -> BodyStep:
    """A kept program run again on the group's stacked arguments ``ins`` (``n`` calls; 0: one
    alone), as one step of ``run``."""
    outs = [run.new_slot(False) for _ in program.outputs]
    step = BodyStep(op.name, program, ins, outs, op.scalars, n, run.new_slot(False))
    step.forward(run, False)
    _append(run, step, n)
    return step


def record(
    run: Run, op: Operation, call: Call, ins: list[int], n: int, run_body: RunBody
) -> tuple[BodyStep, bool]:
    """The body of ``op`` recorded on the group's arguments ``ins`` (its first call ``call``; ``n``
    calls, 0: one alone) in a new frame, by ``run_body`` over a graph of its own, as one step of
    ``run``; and whether its program may be kept for later groups (it holds for any number of rows
    and read nothing that only this run has). Raises a ShapeError where a merged body mixes its
    calls' rows."""
    frame = Run(run.dispatcher, RunStats(), run.snapshot, context=run.context)
    tapes: list[Tape[Any, Any]] = []
    for source in ins:
        slot = frame.new_slot(run.wants[source])
        frame.datas[slot] = run.datas[source]
        frame.xps[slot] = run.xps[source]
        frame.scalar_rows[slot] = run.scalar_rows[source]
        tapes.append(RunTape(frame, slot, -1))
    body = Graph(op.name)
    previous = swap_recording(body)
    try:
        roots = [body.node(node) for node in op.expand(call, tapes)]
    finally:
        swap_recording(previous)
    outputs = [(slot, -1) for slot in run_body(body, frame, op.name, roots)]
    run.stats.add(frame.stats)
    stats = forward_stats(frame.stats)
    program = Program(frame.steps, len(frame.datas), list(range(len(ins))), outputs, stats)
    outs = [run.new_slot(False) for _ in program.outputs]
    step = BodyStep(op.name, program, ins, outs, op.scalars, n, run.new_slot(False))
    step.finish(run, frame)
    mixing = mixed_rows(frame, len(ins)) if n else None
    if mixing is not None:  # (rows of the right shape, of the wrong values)
        raise ShapeError(
            f"batchable {op.name}: run once on the stacked rows of {n} calls, its body's "
            f"{mixing} mixes them: the body must keep a leading axis of rows (reduce, index and "
            "join along axis=-1 or counted from the end), or it computes something else than "
            "its calls alone"
        )
    keep = frame.replayable and fits_any_rows(program)
    if keep:
        program.anchor = (call.args, call.kwargs)
    _append(run, step, n)
    return step, keep


def _append(run: Run, step: BodyStep, n: int) -> None:
    run.steps.append(step)
    if n:
        run.stats.groups += 1
        run.stats.merged += n


def fits_any_rows(program: Program) -> bool:
    """Whether a body's program holds for any number of rows: no stack in it joins values that
    depend on the rows with values that do not (equal in shape only for the rows it was recorded
    with)."""
    rowed = rowed_slots(program.steps, program.inputs, program.slots)
    for step in program.steps:
        if type(step) is StackStep and _reads_rows(step, rowed):
            for s in step.reads():
                if not rowed[s]:
                    return False
    return True


def mixed_rows(frame: Run, inputs: int) -> str | None:
    """The first op of a merged body's frame (its first ``inputs`` slots the calls' stacked rows)
    that mixes rows, described; None where none does. An op mixes rows where it reads a value that
    holds rows and its batching declaration says that its calls' stacked rows would not compute
    what the calls compute alone: rows read as an operand the op reads whole (a table looked up,
    a weight); an axis counted from the front (or all axes) of a reduction, an index or a join; an
    elementwise op whose operands' ranks differ from the rows' (its broadcast would reach the rows'
    axis). An op without a batching declaration is not checked."""
    rowed = rowed_slots(frame.steps, list(range(inputs)), len(frame.datas))
    for step in frame.steps:
        if _reads_rows(step, rowed):
            problem = _mixes(step, frame, rowed)
            if problem is not None:
                return problem
    return None


def rowed_slots(steps: list[Any], inputs: list[int], slots: int) -> list[bool]:
    """Which slots of a body's frame hold the calls' rows: its inputs, and what a step computes
    from any of them."""
    rowed = [False] * slots
    for slot in inputs:
        rowed[slot] = True
    for step in steps:
        if step.out < slots and _reads_rows(step, rowed):
            rowed[step.out] = True
    return rowed


def _reads_rows(step: Any, rowed: list[bool]) -> bool:
    for s in step.reads():
        if rowed[s]:
            return True
    return False


def _mixes(step: Any, frame: Run, rowed: list[bool]) -> str | None:
    if type(step) is OpStep:
        params = step.params_of(frame)
    elif type(step) is MergedStep:
        params = step.params
    else:
        return None
    prim = step.prim
    spec = prim.batch
    if spec is None:
        return None
    for i in spec.shared:
        if i < len(step.ins) and rowed[step.ins[i]]:
            return f"{prim.name} (which reads its operand {i} whole)"
    if spec.axis:
        axis = params.get("axis", spec.axis_default)
        index = params.get("index")
        if type(index) is tuple and index and index[0] is Ellipsis:
            return None  # ``x[..., k]``: the rows are taken whole
        axes = axis if type(axis) is tuple else (axis,)
        for a in axes:
            if a is None or a >= 0:
                return f"{prim.name}(axis={axis!r})"
    if spec.elementwise and type(step) is OpStep:
        ranks = [_rank(frame.datas[s]) for s in step.ins]
        rows = [r for s, r in zip(step.ins, ranks, strict=True) if rowed[s]]
        shared = [r for s, r in zip(step.ins, ranks, strict=True) if not rowed[s]]
        if min(rows) != max(rows) or (shared and max(shared) >= rows[0]):
            return f"{prim.name} of operands of ranks {tuple(ranks)}"
    return None


def _rank(data: Any) -> int:
    return 0 if type(data) is float else len(data.shape)


def shares_arrays(call: Call) -> bool:
    """Whether a call was given an array that is not a row (a weight: one value for all its group)."""
    for i, a in enumerate(call.args):
        if (
            i not in call.row_args
            and hasattr(a, "forward")
            and not isinstance(getattr(a, "data", 0.0), float)
        ):
            return True
    return False
