"""The steps of a run's record (``record.py``), one class per kind, over one base.

A step computes its slot ``out`` from earlier slots (``forward``), on the scheduler's thread or,
where it is ``heavy``, on the pool (``submit``, then ``store`` on the scheduler's thread). How each
kind of step passes a delta back is the backward pass's table of rules (``monadl.tape.backward``).
"""

from __future__ import annotations

from typing import Any, final

import numpy as np

from monadl.do.graph import WEIGHT
from monadl.do.primitive import FanOut, Primitive, Rule, call_forward
from monadl.do.record import Program, Run, row_value
from monadl.do.tape import Tape
from monadl.runtime.pool import Dispatcher, drain_failed
from monadl.runtime.versions import data_of
from monadl.typeclasses.backend import NDARRAY, NUMPY, ShapeError, namespace, on_device, put_rows, shape_of
from monadl.typeclasses.sparse import move_rows, rows_kernel_fits


class Step:
    """One entry of a run's record: it computes slot ``out`` (``wants``: the slot depends on a
    weight). ``heavy``: worth the pool (decided when the step is made, from its cost)."""

    def __init__(self, out: int, wants: bool) -> None:
        self.out = out
        self.wants = wants
        self.heavy = False
        self.affinity: object = None

    def forward(self, run: Run, checked: bool) -> None:
        """Computes the slot's value (``checked``: run the op's shape checks too)."""
        raise NotImplementedError

    def submit(self, run: Run, dispatcher: Dispatcher, checked: bool) -> None:
        """Computes the slot's value on the pool (only heavy steps are submitted)."""
        self.forward(run, checked)

    def store(self, run: Run, result: Any) -> None:
        """Stores what :meth:`submit`'s kernel computed (on the scheduler's thread)."""
        self.put(run, result[0], result[1], result[2])

    def put(self, run: Run, xp: Any, data: Any, saved: Any) -> None:
        """Stores the step's namespace, value and saved values (a kernel's result, unpacked: a
        typed tuple passed on whole would be boxed)."""
        out = self.out
        run.xps[out] = xp
        run.datas[out] = data
        run.saved[out] = saved
        run.wants[out] = self.wants
        run.stats.kernels += 1

    def reads(self) -> list[int]:
        """The slots the step reads."""
        return []

    def name(self) -> str:
        """What the step runs, for statistics and errors."""
        return type(self).__name__


@final
class LeafStep(Step):
    """A weight's or a constant's slot. ``node``: the node's position among a static graph's bound
    nodes (a replay reads its own weight or constant there); -1 for a leaf read from ``weight`` or
    ``data`` (a batchable body's, or a dynamic graph's)."""

    def __init__(self, out: int, node: int, weight: Any, data: Any) -> None:
        super().__init__(out, weight is not None)
        self.node = node
        self.weight = weight
        self.data = data

    def forward(self, run: Run, checked: bool) -> None:
        weight = self.weight
        if self.node >= 0:
            graph = run.graph
            assert graph is not None
            row = run.bound[self.node]
            if graph.tags[row] == WEIGHT:
                weight = graph.objs[row]
                data = data_of(weight, run.snapshot)
            else:
                data = graph.objs[row]
        elif weight is not None:
            data = data_of(weight, run.snapshot)
        else:
            data = self.data
        out = self.out
        run.datas[out] = data
        run.weights[out] = weight
        run.wants[out] = weight is not None
        if weight is not None:
            run.leaves.append(weight)

    def name(self) -> str:
        return "weight" if self.weight is not None else "constant"


@final
class OpStep(Step):
    """A primitive applied to slots ``ins``. ``node``: its ``Apply`` node's position among the bound
    nodes, where a replay reads its per-run parameters (indices, labels); -1 for an op whose
    parameters are the program's (``params``)."""

    def __init__(
        self, prim: Primitive, ins: list[int], out: int, params: dict[str, Any], node: int, wants: bool
    ) -> None:
        super().__init__(out, wants)
        self.prim = prim
        self.ins = ins
        self.params = params
        self.node = node if prim.per_run else -1
        self.exact: list[bool] | None = None
        """Per input, whether it is a NumPy array of the result's shape (set by the first backward
        pass through the step: its replays have the same shapes), so that a delta for it from one
        of the library's broadcasting ops needs no sum."""

    def params_in(self, run: Run, checked: bool) -> dict[str, Any]:
        """This run's parameters: a replay's own per-run ones, read from its node and kept for the
        backward pass; else the program's."""
        if checked or self.node < 0:
            return self.params
        graph = run.graph
        assert graph is not None
        params: dict[str, Any] = graph.params[run.bound[self.node]]
        run.params[self.out] = params
        return params

    def params_of(self, run: Run) -> dict[str, Any]:
        """The parameters this run's forward used (for its vjps)."""
        params = run.params[self.out]
        return self.params if params is None else params

    def args(self, run: Run) -> tuple[Any, ...]:
        datas = run.datas
        ins = self.ins
        n = len(ins)
        if n == 2:  # most ops: the tuple made at once (compiled, no list first)
            return (datas[ins[0]], datas[ins[1]])
        if n == 1:
            return (datas[ins[0]],)
        args = []
        for i in ins:
            args.append(datas[i])
        return tuple(args)

    def forward(self, run: Run, checked: bool) -> None:
        xp, data, saved = self.prim.run(self.args(run), self.params_in(run, checked), checked, run.context)
        self.put(run, xp, data, saved)

    def submit(self, run: Run, dispatcher: Dispatcher, checked: bool) -> None:
        dispatcher.submit(
            self.prim.run,
            (self.args(run), self.params_in(run, checked), checked, run.context),
            self,
            run,
            self.affinity,
        )

    def reads(self) -> list[int]:
        return self.ins

    def name(self) -> str:
        return self.prim.name


@final
class MergedStep(Step):
    """Calls of one primitive run as one, on stacked rows: input ``i`` is slot ``ins[i]``, stacked
    (the calls' values as rows; ``pads[i]`` axes of one inserted after the rows' axis, so that rows
    of a lower rank broadcast as their calls did) or shared (``stacked[i]`` False: one value for
    all). Call k's value is row k of the result. ``members``: the calls' positions among the bound
    nodes, where a replay reads their per-run parameters to stack them again (empty when they are
    the program's)."""

    def __init__(
        self,
        prim: Primitive,
        ins: list[int],
        stacked: list[bool],
        pads: list[int],
        params: dict[str, Any],
        members: list[int],
        n: int,
        scalar: bool,
        out: int,
        wants: bool,
    ) -> None:
        super().__init__(out, wants)
        spec = prim.batch
        assert spec is not None
        self.prim = prim
        self.rule: Rule = spec.forward or prim.forward
        self.vjps: tuple[Rule, ...] = spec.vjps or prim.vjps
        self.elementwise = spec.elementwise and spec.vjps is None
        """The op's own vjps on the group's rows, which broadcast over the shared inputs: theirs are
        summed back over the rows (an op of its own rows' vjps sums them itself)."""
        self.ins = ins
        self.stacked = stacked
        self.pads = pads
        self.params = params
        self.members = members if prim.per_run and members and min(members) >= 0 else []
        self.n = n
        self.scalar = scalar
        self.calls: list[dict[str, Any]] = []  # the calls' own parameters (for their own errors)
        self.row_shapes: list[tuple[int, ...]] = []  # a call's own inputs' shapes (() for a float)

    def args(self, run: Run) -> list[Any]:
        """The stacked and shared arguments, padded."""
        datas = run.datas
        args = []
        for i, slot in enumerate(self.ins):
            a = datas[slot]
            pad = self.pads[i]
            if pad:
                shape = tuple(a.shape)
                a = namespace(a).reshape(a, shape[:1] + (1,) * pad + shape[1:])
            args.append(a)
        return args

    def params_in(self, run: Run, checked: bool) -> dict[str, Any]:
        """This run's parameters: a replay's calls' own per-run parameters stacked again (and kept
        for the backward pass); else the program's."""
        if checked or not self.members:
            return self.params
        graph = run.graph
        assert graph is not None
        calls = []
        for k in self.members:
            calls.append(graph.params[run.bound[k]])
        params = run.params[self.out] = self.prim.stack_params(calls, self.params)
        return params

    def params_of(self, run: Run) -> dict[str, Any]:
        params = run.params[self.out]
        return self.params if params is None else params

    def forward(self, run: Run, checked: bool) -> None:
        xp, data, saved = self.compute(self.args(run), self.params_in(run, checked))
        self.put(run, xp, data, saved)

    def compute(self, args: list[Any], params: dict[str, Any]) -> tuple[Any, Any, Any]:
        """The merged kernel (worker-safe): the per-run checks of the calls, then the rule once."""
        prim = self.prim
        if prim.check_values is not None:
            check_merged_values(prim, args, self.stacked, params, self.n, self.calls)
        arrays = [a for a in args if type(a) is not float]
        xp = NUMPY if not arrays or type(arrays[0]) is NDARRAY else namespace(*arrays)
        try:
            out = call_forward(self.rule, xp, args, params)
        except ValueError as e:
            self.each(args)  # the call that does not fit raises its own error
            raise ShapeError(f"{prim.name}: merged calls do not fit: {e}") from e
        if prim.saves:
            return xp, out[0], out[1]
        return xp, out, out

    def each(self, args: list[Any]) -> None:
        """Runs the calls one by one on their own rows (after the merged kernel failed): the first
        that fails raises its own error, naming its own shapes."""
        for k, params in enumerate(self.calls):
            own = []
            for i, a in enumerate(args):
                if not self.stacked[i]:
                    own.append(a)
                    continue
                row = row_value(a, k, not self.row_shapes[i] and type(a[0]) is not NDARRAY)
                if type(row) is not float and tuple(row.shape) != self.row_shapes[i]:
                    row = namespace(row).reshape(row, self.row_shapes[i])
                own.append(row)
            self.prim.run(tuple(own), params, True)

    def put(self, run: Run, xp: Any, data: Any, saved: Any) -> None:
        super().put(run, xp, data, saved)
        run.scalar_rows[self.out] = self.scalar

    def submit(self, run: Run, dispatcher: Dispatcher, checked: bool) -> None:
        dispatcher.submit(
            self.compute, (self.args(run), self.params_in(run, checked)), self, run, self.affinity
        )

    def reads(self) -> list[int]:
        return self.ins

    def name(self) -> str:
        return self.prim.name


@final
class FanStep(Step):
    """Calls of one primitive that read one value (``fan.shared`` inputs, slot ``ins[i][0]``) with
    different others (``ins[i]``: each call's slot), run as one kernel: call k's value is row k."""

    def __init__(
        self,
        prim: Primitive,
        fan: FanOut,
        ins: list[list[int]],
        params: dict[str, Any],
        n: int,
        out: int,
        wants: bool,
    ) -> None:
        super().__init__(out, wants)
        self.prim = prim
        self.fan = fan
        self.ins = ins
        self.params = params
        self.n = n

    def args(self, run: Run) -> list[Any]:
        datas = run.datas
        shared = self.fan.shared
        args: list[Any] = []
        for i, slots in enumerate(self.ins):
            if i in shared:
                args.append(datas[slots[0]])
            else:
                column = []
                for s in slots:
                    column.append(datas[s])
                args.append(tuple(column))
        return args

    def forward(self, run: Run, checked: bool) -> None:
        xp, data, saved = self.compute(self.args(run), self.params)
        self.put(run, xp, data, saved)

    def compute(self, args: list[Any], params: dict[str, Any]) -> tuple[Any, Any, Any]:
        xp = namespace(args[self.fan.shared[0]])
        out = call_forward(self.fan.forward, xp, args, params)
        return xp, out, out

    def submit(self, run: Run, dispatcher: Dispatcher, checked: bool) -> None:
        dispatcher.submit(self.compute, (self.args(run), self.params), self, run, self.affinity)

    def reads(self) -> list[int]:
        slots = []
        for column in self.ins:
            slots.extend(column)
        return slots

    def name(self) -> str:
        return self.prim.name


@final
class StackStep(Step):
    """Values as the rows of one array: row ``places[j][i]`` of the result is row ``picks[j][i]``
    of slot ``sources[j]`` (a stacked slot), or, where ``picks[j]`` is None, slot ``sources[j]``
    itself is the row at ``places[j][0]``. ``shape``: the result reshaped (rows of rows joined
    along their first axis, for a concatenation), or None."""

    def __init__(
        self,
        sources: list[int],
        places: list[Any],
        picks: list[Any],
        n: int,
        shape: tuple[int, ...] | None,
        out: int,
        wants: bool,
        unique: list[bool],
    ) -> None:
        super().__init__(out, wants)
        self.sources = sources
        self.places = places
        self.picks = picks
        self.unique = unique
        """Per source, whether its picks are distinct rows (its delta's rows then add without a
        scatter)."""
        self.n = n
        self.shape = shape
        self.single = len(sources) == 1 and picks[0] is not None
        """One source, whose rows are the result's in order (no places to put them at)."""
        self.on_device: DeviceIndices | None = None
        """The index arrays as another namespace's arrays (a GPU's), made on first use."""

    def device_indices(self, xp: Any, like: Any) -> DeviceIndices:
        """The step's picks, places and order in ``xp``, on the device of ``like``: copied from the
        host in one transfer when first asked for on that device, then kept for the run's backward
        pass and for replays (each copy to a GPU costs the host tens of microseconds)."""
        device = getattr(like, "device", None)
        held = self.on_device
        if held is not None and held.xp is xp and held.device == device:
            return held
        held = DeviceIndices(xp, device, like, self.picks, self.places)
        self.on_device = held
        return held

    def forward(self, run: Run, checked: bool) -> None:
        datas = run.datas
        sources = self.sources
        first = datas[sources[0]]
        if type(first) is float:  # floats of their own: a vector of float64
            row_shape: tuple[int, ...] = ()
            dtype: Any = np.float64
            xp: Any = NUMPY
        else:
            row_shape = tuple(first.shape[1:]) if self.picks[0] is not None else tuple(first.shape)
            dtype = first.dtype
            xp = NUMPY if type(first) is NDARRAY else namespace(first)
        if self.single and xp is NUMPY:
            out = datas[sources[0]].take(self.picks[0], axis=0)
        elif xp is NUMPY:
            out = np.empty((self.n, *row_shape), dtype=dtype)
            for j, source in enumerate(sources):
                picks = self.picks[j]
                data = datas[source]
                if picks is None:
                    out[self.places[j][0]] = data
                else:
                    put_rows(out, self.places[j], data, picks)
        elif not self.single and rows_kernel_fits(first, first):  # CuPy: each part put in place
            indices = self.device_indices(xp, first)
            out = xp.empty((self.n, *row_shape), dtype=dtype)
            for j, source in enumerate(sources):
                data = datas[source]
                if self.picks[j] is None:
                    out[int(self.places[j][0])] = data
                elif rows_kernel_fits(out, data):
                    move_rows("gather", out, indices.places[j], data, indices.picks[j])
                else:
                    out[indices.places[j]] = xp.take(data, indices.picks[j], axis=0)
        else:  # the array API assigns to no index array: the parts in order, then one take
            indices = self.device_indices(xp, first)
            parts = []
            for j, source in enumerate(sources):
                data = datas[source]
                if self.picks[j] is None:
                    parts.append(
                        xp.reshape(xp.asarray(data, dtype=dtype, **on_device(xp, first)), (1, *row_shape))
                    )
                else:
                    parts.append(xp.take(data, indices.picks[j], axis=0))
            if self.single:
                out = parts[0]
            else:
                joined = xp.concat(parts, axis=0) if len(parts) > 1 else parts[0]
                out = xp.take(joined, indices.order, axis=0)
        if self.shape is not None:
            out = xp.reshape(out, self.shape)
        o = self.out
        run.datas[o] = out
        run.xps[o] = xp
        run.wants[o] = self.wants
        run.stats.kernels += 1

    def reads(self) -> list[int]:
        return self.sources

    def name(self) -> str:
        return "stack"


@final
class DeviceIndices:
    """A :class:`StackStep`'s index arrays on a device: ``picks`` and ``places`` per source (None
    where the source is a row of its own) and ``order``, the joined parts' rows in the result's
    order; slices of one array, copied from the host at once. ``device``: where they live."""

    def __init__(self, xp: Any, device: Any, like: Any, picks: list[Any], places: list[Any]) -> None:
        self.xp = xp
        self.device = device
        # The parts are joined in the sources' order, each its picked rows (or its one row).
        order = np.argsort(np.concatenate(places), kind="stable")
        host = [p for p in picks if p is not None] + places + [order]  # intp arrays, all of them
        flat = xp.asarray(np.concatenate(host), **on_device(xp, like))
        start = 0
        self.picks: list[Any] = []
        for p in picks:
            if p is None:
                self.picks.append(None)
            else:
                self.picks.append(flat[start : start + len(p)])
                start += len(p)
        self.places: list[Any] = []
        for p in places:
            self.places.append(flat[start : start + len(p)])
            start += len(p)
        self.order = flat[start:]


@final
class RowStep(Step):
    """Row ``row`` of stacked slot ``source``, as a slot of its own (a call's value read alone)."""

    def __init__(self, source: int, row: int, out: int, wants: bool) -> None:
        super().__init__(out, wants)
        self.source = source
        self.row = row

    def forward(self, run: Run, checked: bool) -> None:
        out = self.out
        source = self.source
        run.datas[out] = row_value(run.datas[source], self.row, run.scalar_rows[source])
        run.wants[out] = self.wants

    def reads(self) -> list[int]:
        return [self.source]

    def name(self) -> str:
        return "row"


@final
class CastStep(Step):
    """Constant slot ``source`` in ``dtype``: what an op reads in place of a constant wider than its
    layers (a float64 array met by a float32 model), so that the model stays in its own dtype (see
    ``scheduler.cast_constants``). A constant takes no delta: the step has no backward."""

    def __init__(self, source: int, dtype: Any, out: int) -> None:
        super().__init__(out, False)
        self.source = source
        self.dtype = dtype

    def forward(self, run: Run, checked: bool) -> None:
        data = run.datas[self.source]
        xp = NUMPY if type(data) is NDARRAY else namespace(data)
        out = self.out
        run.datas[out] = xp.astype(data, self.dtype)
        run.xps[out] = xp
        run.wants[out] = False

    def reads(self) -> list[int]:
        return [self.source]

    def name(self) -> str:
        return "cast"


@final
class ForeignStep(Step):
    """A tape of the user's own, read by ops of the run: its data is the slot's value, and its own
    ``backward`` (or ``release``) is given the slot's summed delta. Only this run has it: a run
    with one is not replayed."""

    def __init__(self, tape: Tape[Any, Any], out: int) -> None:
        super().__init__(out, bool(tape.requires_delta))
        self.tape = tape

    def forward(self, run: Run, checked: bool) -> None:
        out = self.out
        run.datas[out] = self.tape.data
        run.wants[out] = self.wants
        run.replayable = False

    def name(self) -> str:
        return type(self.tape).__name__


@final
class BodyStep(Step):
    """A group of ``n`` calls of a batchable operation (``n`` 0: one call, on its own arguments):
    the body's ``program`` run on the slots ``ins`` (the calls' arguments, stacked) in a frame of
    its own, which slot ``out`` holds for the backward pass. Its results go to slots ``outs``,
    each call's a row of them."""

    def __init__(
        self,
        name: str,
        program: Program,
        ins: list[int],
        outs: list[int],
        scalars: list[bool],
        n: int,
        out: int,
    ) -> None:
        super().__init__(out, False)
        self.op = name
        self.program = program
        self.ins = ins
        self.outs = outs
        self.scalars = scalars
        self.n = n

    def forward(self, run: Run, checked: bool) -> None:
        program = self.program
        frame = Run(run.dispatcher, run.stats, run.snapshot, context=run.context, slots=program.slots)
        frame.steps = program.steps
        for j, slot in enumerate(program.inputs):
            source = self.ins[j]
            frame.datas[slot] = run.datas[source]
            frame.xps[slot] = run.xps[source]
            frame.wants[slot] = run.wants[source]
        run.stats.add(program.stats)
        replay_steps(frame, checked)
        self.finish(run, frame)

    def finish(self, run: Run, frame: Run) -> None:
        """The results, from the body's frame to this run's slots (each ``n`` rows, or a call's own)."""
        for j, (slot, row) in enumerate(self.program.outputs):
            data = frame.value(slot, row)
            out = self.outs[j]
            if self.n and (type(data) is float or not data.shape or data.shape[0] != self.n):
                raise ShapeError(
                    f"batchable {self.op}: run once on the stacked rows of {self.n} calls, its body "
                    f"gave result {j} of shape {shape_of(data)}, not {self.n} rows: the body must keep "
                    "a leading axis of rows (reduce and concatenate along axis=-1, not over every axis)"
                )
            run.datas[out] = data
            run.xps[out] = frame.xps[slot]
            run.wants[out] = frame.wants[slot]
            run.scalar_rows[out] = self.scalars[j] if self.n else frame.scalar_rows[slot]
        run.datas[self.out] = frame
        if frame.leaves:  # the weights the body read are the step's too (its optimizers' rates)
            run.leaves.extend(frame.leaves)
        if not frame.replayable:
            run.replayable = False

    def name(self) -> str:
        return self.op


def replay_steps(run: Run, checked: bool) -> None:
    """Runs ``run.steps`` on its frame: inline, or with a pool, each heavy step on it, a step waiting
    only for the slots it reads."""
    dispatcher = run.dispatcher
    if dispatcher is None:
        for step in run.steps:
            step.forward(run, checked)
        return
    pending: set[int] = set()
    try:
        for step in run.steps:
            for slot in step.reads():
                while slot in pending:
                    _arrived(run, dispatcher, pending)
            if step.heavy:
                pending.add(step.out)
                step.submit(run, dispatcher, checked)
            else:
                step.forward(run, checked)
        while pending:
            _arrived(run, dispatcher, pending)
    except Exception:
        drain_failed(dispatcher)
        raise


def _arrived(run: Run, dispatcher: Dispatcher, pending: set[int]) -> None:
    step: Step
    step, _, result = dispatcher.collect()
    step.store(run, result)
    pending.discard(step.out)


# ------------------------------------------------------------------------------------------ helpers


def check_merged_values(
    prim: Primitive,
    args: list[Any],
    stacked: list[bool],
    params: dict[str, Any],
    n: int,
    calls: list[dict[str, Any]],
) -> None:
    """The per-run checks of merged calls: one of them all where the primitive has one
    (``Batching.check_merged``); else, or if it fails, each call's in turn, so that an error names
    that call's values. ``calls``: the calls' own parameters, whose static ones (an axis, not
    shifted past the rows) each call's check reads with its per-run ones."""
    spec = prim.batch
    check = prim.check_values
    assert spec is not None and check is not None
    if spec.check_merged is not None:
        try:
            spec.check_merged(member_args(args, stacked, 0), params)
            return
        except Exception:  # noqa: BLE001 - the calls' own checks say which one failed, and how
            pass
    static = {name: value for name, value in calls[0].items() if name not in prim.per_run} if calls else {}
    for k in range(n):
        own = dict(static)
        for name in prim.per_run:
            column = params[name]
            own[name] = None if column is None else column[k]
        check(*member_args(args, stacked, k), **own)


def member_args(args: list[Any], stacked: list[bool], k: int) -> tuple[Any, ...]:
    """Call k's own arguments: its row of each stacked argument, the shared ones as they are."""
    own = []
    for a, s in zip(args, stacked, strict=True):
        own.append(row_value(a, k, False) if s else a)
    return tuple(own)
