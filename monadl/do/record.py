"""A run's record: slots of values and the steps that computed them (a Wengert list).

The scheduler reads a ``Do`` and, for its differentiable part, appends *steps* (``steps.py``) to a
:class:`Run`: each step computes a *slot* (an array or a float) from earlier slots. The steps are
data, so the same list serves three purposes: it is the forward pass as it ran; read backwards, it
is the backward pass (``monadl.tape``); kept as a :class:`Program`, it is replayed for a later run
of the same structure, and a batchable body's program for its later groups of calls.

A merged group's slot holds its calls' results stacked; a call's value is a *row* of it (slot and
row; row -1 is the whole slot). Steps hold no values: they read and write a run's slot lists, so a
program is shared by its replays.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
from mypy_extensions import mypyc_attr

from monadl.do.context import RunContext
from monadl.do.do import Bind, Pure
from monadl.do.kinds import kind_id, row_kind
from monadl.do.stats import RunStats
from monadl.do.tape import Tape
from monadl.runtime.versions import Snapshot
from monadl.typeclasses.backend import NDARRAY

if TYPE_CHECKING:
    from monadl.do.graph import Graph
    from monadl.do.steps import Step
    from monadl.runtime.pool import Dispatcher


class Run:
    """One frame of a run: every slot's value, what its step saved for the vjps, its array
    namespace, whether it depends on a weight (``wants``: it takes a delta), and the steps."""

    def __init__(
        self,
        dispatcher: Dispatcher | None,
        stats: RunStats,
        snapshot: Snapshot,
        graph: Graph | None = None,
        bound: list[int] | None = None,
        context: RunContext | None = None,
        slots: int = 0,
    ) -> None:
        self.graph = graph
        self.bound: list[int] = [] if bound is None else bound
        """The bound rows of ``graph``, a static graph (its leaves and ops with per-run parameters),
        where a replayed step reads its own (``executor.structure_of``)."""
        # ``slots`` for a replayed program (its steps set them); a run that schedules adds its own.
        self.datas: list[Any] = [None] * slots
        self.saved: list[Any] = [None] * slots
        self.xps: list[Any] = [None] * slots
        self.wants: list[bool] = [False] * slots
        self.weights: list[Any] = [None] * slots  # a weight's slot: the weight; others None
        self.scalar_rows: list[bool] = [False] * slots  # a stacked slot's rows are floats (its calls')
        self.params: list[Any] = [None] * slots  # a replayed op's per-run parameters (None: its program's)
        self.kinds: list[int] = [-1] * slots  # a slot's interned value kind, -1 until asked for
        self.row_kinds: list[int] = [-1] * slots  # the kind of a stacked slot's rows, -1 until asked for
        self.steps: list[Step] = []
        self.program: Program | None = None  # the program whose steps the run replays
        self.leaves: list[Any] = []  # the weights the run read
        self.dispatcher = dispatcher
        self.stats = stats
        self.snapshot = snapshot
        """The commit the run reads every weight as of (``monadl.runtime.versions``)."""
        self.context = RunContext() if context is None else context
        """The run's mode, random streams and staged updates, for the ops that declare they need
        them (``monadl.do.context``); a frame of the run shares it."""
        self.replayable = True
        """False once a step read what only this run has (then its program is not kept)."""
        self.alone: dict[tuple[int, int], int] = {}  # (stacked slot, row) -> a slot of that row alone
        self.casts: dict[tuple[int, int, str], int] = {}  # (slot, row, dtype) -> that constant cast
        self.accept: Callable[[int, int, Any], None] | None = None
        """During the backward pass: adds a delta to a slot (or a row of it), for tapes of the
        user's own that give deltas to this run's tapes."""

    def new_slot(self, wants: bool) -> int:
        """A new slot (its value is set by the step that computes it)."""
        k = len(self.datas)
        self.datas.append(None)
        self.saved.append(None)
        self.xps.append(None)
        self.wants.append(wants)
        self.weights.append(None)
        self.scalar_rows.append(False)
        self.params.append(None)
        self.kinds.append(-1)
        self.row_kinds.append(-1)
        return k

    def value(self, slot: int, row: int) -> Any:
        """The value at ``slot``, or its row ``row`` (a float for a row of floats)."""
        data = self.datas[slot]
        return data if row < 0 else row_value(data, row, self.scalar_rows[slot])

    def first_reads(self) -> dict[int, list[int]]:
        """The slots of the frame's weights by the step that reads each first (in the backward
        pass, the last of its readers in the frame); kept with the program a run replays (its steps
        and their slots are the program's)."""
        program = self.program
        if program is not None and program.firsts is not None:
            return program.firsts
        weights = self.weights
        seen: set[int] = set()
        firsts: dict[int, list[int]] = {}
        for i, step in enumerate(self.steps):
            for slot in step.reads():
                if weights[slot] is not None and slot not in seen:
                    seen.add(slot)
                    firsts.setdefault(i, []).append(slot)
        if program is not None:
            program.firsts = firsts
        return firsts

    def kind(self, slot: int, row: int) -> int:
        """The interned value kind (type, shape, dtype) of a slot's value, or of its rows (each
        worked out once per slot: a slot's value is set once in a run)."""
        if row >= 0:
            r = self.row_kinds[slot]
            if r < 0:
                r = self.row_kinds[slot] = self._row_kind(slot)
            return r
        k = self.kinds[slot]
        if k < 0:
            data = self.datas[slot]
            if type(data) is float:
                k = kind_id(float, 0)
            else:
                shape = tuple(data.shape)
                k = kind_id((type(data), shape, data.dtype), len(shape))
            self.kinds[slot] = k
        return k

    def _row_kind(self, slot: int) -> int:
        if self.scalar_rows[slot]:
            return kind_id(float, 0)
        r = row_kind(self.kind(slot, -1))
        if r < 0:  # dropped from the table since: made again from the value
            data = self.datas[slot]
            shape = tuple(data.shape)
            r = kind_id((type(data), shape[1:], data.dtype), len(shape) - 1)
        return r


@mypyc_attr(native_class=False)  # a Tape: a Python class (generic, subclassed by users)
class RunTape(Tape[Any, Any]):
    """A node's value in a run, as user code sees it (in ``map``, ``flat_map``, ``await``, a run's
    result): its data, and, through the run, the way back. Given back to the scheduler (returned by
    a ``flat_map``, say), it stands for its node's value again, not a copy."""

    __slots__ = ("row", "run", "slot")
    requires_delta = True

    def __init__(self, run: Run, slot: int, row: int) -> None:
        self.run = run
        self.slot = slot
        self.row = row
        self.data = run.value(slot, row)

    def backward(self, delta: Any) -> Any:
        """Adds ``delta`` to this value's delta, in the run's backward pass (where a tape of the
        user's own, reading this one, gives its inputs their deltas)."""
        return Bind((delta,), self._accept, 0)

    def _accept(self, delta: Any) -> None:
        accept = self.run.accept
        if accept is None:
            raise RuntimeError("monadl: a tape's backward was run outside the backward pass of its run")
        accept(self.slot, self.row, delta)

    def release(self) -> Any:
        return Pure(None)


class Program:
    """A frame's steps, kept to be replayed by frames of the same structure: the number of slots,
    the slots its caller fills (``inputs``: a batchable body's stacked arguments), where its results
    are (``outputs``: slot and row), and the statistics of its forward pass (a replay counts them
    again)."""

    def __init__(
        self,
        steps: list[Step],
        slots: int,
        inputs: list[int],
        outputs: list[tuple[int, int]],
        stats: RunStats,
    ) -> None:
        self.steps = steps
        self.slots = slots
        self.inputs = inputs
        self.outputs = outputs
        self.stats = stats
        self.firsts: dict[int, list[int]] | None = None
        """Its weights' slots by the step that reads each first, once a backward pass needs them
        (``Run.first_reads``)."""
        self.anchor: Any = None
        """What the program's key names by identity (a batchable call's arguments), kept alive with
        it: no other object can take their identities while the program may be replayed."""


def forward_stats(stats: RunStats) -> RunStats:
    """The counts a replay of a program repeats without computing them: its merges and launches by
    kind (kernels are counted as they run)."""
    counts = RunStats(merged=stats.merged, groups=stats.groups, signatures=stats.signatures)
    counts.kind_counts = stats.kind_counts.copy()
    return counts


def row_value(data: Any, k: int, scalar: bool) -> Any:
    """Row ``k`` of stacked rows, as its call alone gives it: a float if ``scalar``, else an array
    (NumPy's rows of a vector are scalars: made 0-d arrays again)."""
    row = data[k] if type(data) is NDARRAY else data[k, ...]
    if scalar:
        return float(row)
    return np.asarray(row) if isinstance(row, np.generic) else row
