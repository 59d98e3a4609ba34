"""A run's record: slots of values and the steps that computed them (a Wengert list).

The scheduler (``scheduler.py``) reads a ``Do`` and, for its differentiable part, appends *steps* to
a :class:`Run`: each step computes one *slot* (a value: an array or a float) from earlier slots.
The steps are data (a primitive, its input slots, its parameters), so the same list serves three
purposes:

* it is the forward pass as it ran, step by step (:meth:`Step.forward`);
* read backwards, it is the backward pass (``monadl.tape.backward``): a slot's delta is the sum of
  what the steps that read it gave, and its step's vjps run once, with that sum;
* kept as a :class:`Program`, it is replayed for a later run of the same structure (the same ops,
  parameters, shapes and dtypes): the steps run again on the new leaves, without the scheduler's
  walk, grouping or shape checks.

Slots that a merged group computes hold the group's stacked result; a call of the group is a
*row* of it (:class:`Ref` ``(slot, row)``). Rows are read by the next level's groups through
:class:`GatherStep` (one indexing for many rows), or taken out one by one by :class:`RowStep`.

Steps do not hold a run's values: they read and write the run's slot lists, so a program is shared
by its replays. A step that reads what only this run has (a tape of the user's own, a constant made
inside a ``flat_map``) makes the run's program not replayable.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any, Final, final

import numpy as np

from monadl.do.do import MAP, Apply, Bind, Do, Pure, Variable
from monadl.do.primitive import FanOut, Primitive, Rule, call_forward, value_key
from monadl.do.stats import RunStats
from monadl.do.values import Tape
from monadl.do.versions import Snapshot, data_of
from monadl.typeclasses.backend import NDARRAY, ShapeError, host_in, namespace

if TYPE_CHECKING:
    from monadl.do.dispatch import Dispatcher

# Step kinds, for the backward pass's dispatch.
LEAF: Final = 0
OP: Final = 1
MERGED: Final = 2
FAN: Final = 3
GATHER: Final = 4
ROW: Final = 5
FOREIGN: Final = 6
CALLS: Final = 7


@final
class Ref:
    """Where a node's value is in a run: slot ``slot``, or row ``row`` of it (``row >= 0``: the
    node was one call of a merged group, whose slot holds the stacked rows)."""

    __slots__ = ("row", "slot")

    def __init__(self, slot: int, row: int) -> None:
        self.slot = slot
        self.row = row

    def __repr__(self) -> str:
        return f"Ref({self.slot}, {self.row})"


class Run:
    """One run of a program: every slot's value, what its step saved for the vjps, its array
    namespace, whether it depends on a weight (``wants``: it takes a delta), and the steps."""

    def __init__(
        self, nodes: list[Do[Any]], dispatcher: Dispatcher | None, stats: RunStats, snapshot: Snapshot
    ) -> None:
        self.nodes = nodes
        """The nodes the scheduler walked, in its order: a replayed step reads its leaves and
        per-run parameters from the node at its position."""
        self.datas: list[Any] = []
        self.saved: list[Any] = []
        self.xps: list[Any] = []
        self.wants: list[bool] = []
        self.weights: list[Any] = []  # a weight's slot: the weight; others None
        self.leaves: list[Any] = []  # the weights the run read
        self.kinds: list[int] = []  # a slot's value kind (interned), -1 until asked for
        self.row_kinds: list[int] = []  # the kind of a stacked slot's rows, -1 until asked for
        self.scalar_rows: list[bool] = []  # a stacked slot's rows are floats (a call's result is)
        self.params: list[Any] = []  # a replayed op's per-run parameters (None: its program's)
        self.steps: list[Step] = []
        self.dispatcher = dispatcher
        self.stats = stats
        self.snapshot = snapshot
        """The commit the run reads every weight as of (``monadl.do.versions``)."""
        self.replayable = True
        """False once a step read what only this run has (then its program is not kept)."""
        self.deltas: list[Any] = []  # set by the backward pass
        self.owned: list[bool] = []
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
        self.kinds.append(-1)
        self.row_kinds.append(-1)
        self.scalar_rows.append(False)
        self.params.append(None)
        return k

    def reserve(self, slots: int) -> None:
        """Slots for a replayed program (its steps set them)."""
        self.datas = [None] * slots
        self.saved = [None] * slots
        self.xps = [None] * slots
        self.wants = [False] * slots
        self.weights = [None] * slots
        self.kinds = [-1] * slots
        self.row_kinds = [-1] * slots
        self.scalar_rows = [False] * slots
        self.params = [None] * slots

    def value(self, ref: Ref) -> Any:
        """The value at ``ref``: a slot's, or its row (a float for a row of floats)."""
        data = self.datas[ref.slot]
        if ref.row < 0:
            return data
        return row_value(data, ref.row, self.scalar_rows[ref.slot])

    def kind(self, slot: int) -> int:
        """The interned value kind of slot ``slot`` (its type, shape and dtype)."""
        k = self.kinds[slot]
        if k < 0:
            k = self.kinds[slot] = kind_id(value_key(self.datas[slot]), _rank(self.datas[slot]))
        return k

    def row_kind(self, slot: int) -> int:
        """The interned value kind of a row of stacked slot ``slot``."""
        k = self.row_kinds[slot]
        if k < 0:
            data = self.datas[slot]
            if self.scalar_rows[slot]:
                k = kind_id(float, 0)
            else:
                k = kind_id((type(data), tuple(data.shape[1:]), data.dtype), len(data.shape) - 1)
            self.row_kinds[slot] = k
        return k

    def ref_kind(self, ref: Ref) -> int:
        """The value kind of ``ref``: its slot's, or a row's of it."""
        return self.kind(ref.slot) if ref.row < 0 else self.row_kind(ref.slot)


@final
class RunTape(Tape[Any, Any]):
    """A node's value in a run, as user code sees it (in ``map``, ``flat_map``, ``await``, a run's
    result): its data, and, through the run, the way back. Given back to the scheduler (returned by
    a ``flat_map``, say), it stands for its node's value again, not a copy."""

    __slots__ = ("ref", "run")
    requires_delta = True

    def __init__(self, run: Run, ref: Ref) -> None:
        self.run = run
        self.ref = ref
        self.data = run.value(ref)

    def backward(self, delta: Do[Any]) -> Do[None]:
        """Adds ``delta`` to this value's delta, in the run's backward pass (where a tape of the
        user's own, reading this one, gives its inputs their deltas)."""
        return Bind((delta,), self._accept, MAP)

    def _accept(self, delta: Any) -> None:
        from_user(self.run, self.ref, delta)

    def release(self) -> Do[None]:
        return Pure(None)


def from_user(run: Run, ref: Ref, delta: Any) -> None:
    """Adds a delta given by a tape of the user's own to ``ref``'s delta (backward pass)."""
    accept = run.accept
    if accept is None:
        raise RuntimeError("monadl: a tape's backward was run outside the backward pass of its run")
    accept(ref.slot, ref.row, delta)


# ------------------------------------------------------------------------------------------- steps


class Step:
    """One entry of a run's record: it computes slot ``out`` (``wants``: the slot depends on a
    weight). ``heavy``: worth the pool (decided when the step is made, from its cost)."""

    def __init__(self, kind: int, out: int, wants: bool) -> None:
        self.kind = kind
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
        raise NotImplementedError

    def reads(self) -> list[int]:
        """The slots the step reads."""
        return []

    def name(self) -> str:
        """What the step runs, for statistics and errors."""
        return type(self).__name__


@final
class LeafStep(Step):
    """A weight's or a constant's slot. ``node``: the node's position among the run's walked nodes
    (a replay reads the weight, or the constant, of its own run there); -1 for a leaf made while a
    batchable body was recorded, read from ``weight`` or ``data`` (they are its program's)."""

    def __init__(self, out: int, node: int, weight: Any, data: Any) -> None:
        super().__init__(LEAF, out, weight is not None)
        self.node = node
        self.weight = weight
        self.data = data

    def forward(self, run: Run, checked: bool) -> None:
        weight = self.weight
        if self.node >= 0:
            node = run.nodes[self.node]
            if type(node) is Variable:
                weight = node.weight
                data = data_of(weight, run.snapshot)
            else:
                assert type(node) is Pure
                data = node.value.data
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
    """A primitive applied to slots ``ins``. ``node``: its ``Apply`` node's position among the
    walked nodes, where a replay reads its per-run parameters (indices, labels); -1 for an op of a
    batchable body or of the scheduler's own (a sum of rows), whose parameters are ``params``."""

    def __init__(
        self, prim: Primitive, ins: list[int], out: int, params: dict[str, Any], node: int, wants: bool
    ) -> None:
        super().__init__(OP, out, wants)
        self.prim = prim
        self.ins = ins
        self.params = params
        self.node = node if prim.per_run else -1
        self.exact: list[bool] | None = None
        """Per input, whether it is a NumPy array of the result's shape (set by the first backward
        pass through the step: runs replaying it have the same shapes), so that a delta for it from
        one of the library's broadcasting ops (of the result's shape) needs no sum."""

    def params_in(self, run: Run, checked: bool) -> dict[str, Any]:
        """The parameters of this run: a replay's own per-run parameters (indices, labels), read
        from its node and kept for the backward pass; else the program's."""
        if checked or self.node < 0:
            return self.params
        node = run.nodes[self.node]
        assert type(node) is Apply
        run.params[self.out] = node.params
        return node.params

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
        xp, data, saved = self.prim.run(self.args(run), self.params_in(run, checked), checked)
        self.store(run, (xp, data, saved))

    def store(self, run: Run, result: tuple[Any, Any, Any]) -> None:
        out = self.out
        run.xps[out], run.datas[out], run.saved[out] = result
        run.wants[out] = self.wants
        run.stats.kernels += 1

    def submit(self, run: Run, dispatcher: Dispatcher, checked: bool) -> None:
        dispatcher.submit(
            self.prim.run, (self.args(run), self.params_in(run, checked), checked), self, run, self.affinity
        )

    def reads(self) -> list[int]:
        return self.ins

    def name(self) -> str:
        return self.prim.name


@final
class MergedStep(Step):
    """Calls of one primitive run as one, on stacked rows: input ``i`` is slot ``ins[i]``, stacked
    (the calls' values as rows; padded to ``pads[i]`` so that rows broadcast as their calls did) or
    shared (one value for all, ``stacked[i]`` False). Call k's value is row k of the result.
    ``members``: the calls' positions among the walked nodes, where a replay reads their per-run
    parameters to stack them again (empty when they are the program's)."""

    def __init__(
        self,
        prim: Primitive,
        ins: list[int],
        stacked: list[bool],
        pads: list[tuple[int, ...] | None],
        params: dict[str, Any],
        members: list[int],
        n: int,
        scalar: bool,
        out: int,
        wants: bool,
    ) -> None:
        super().__init__(MERGED, out, wants)
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
            if pad is not None:
                a = namespace(a).reshape(a, pad)
            args.append(a)
        return args

    def params_in(self, run: Run, checked: bool) -> dict[str, Any]:
        """The parameters of this run: a replay's calls' own per-run parameters stacked again (and
        kept for the backward pass); else the program's."""
        if checked or not self.members:
            return self.params
        calls = []
        for k in self.members:
            node = run.nodes[k]
            assert type(node) is Apply
            calls.append(node.params)
        params = run.params[self.out] = merged_params(self.prim, calls, self.params)
        return params

    def params_of(self, run: Run) -> dict[str, Any]:
        """The parameters this run's forward used (for its vjps)."""
        params = run.params[self.out]
        return self.params if params is None else params

    def forward(self, run: Run, checked: bool) -> None:
        self.store(run, self.compute(self.args(run), self.params_in(run, checked)))

    def compute(self, args: list[Any], params: dict[str, Any]) -> tuple[Any, Any, Any]:
        """The merged kernel (worker-safe): the per-run checks of the calls, then the rule once."""
        prim = self.prim
        if prim.check_values is not None:
            check_merged_values(prim, args, self.stacked, params, self.n)
        arrays = [a for a in args if type(a) is not float]
        xp = np if not arrays or type(arrays[0]) is NDARRAY else namespace(*arrays)
        try:
            out = call_forward(self.rule, xp, args, params)
        except ValueError as e:
            self.each(args)  # the call that does not fit raises its own error
            raise ShapeError(f"{prim.name}: merged calls do not fit: {e}") from e
        saved = None
        if prim.saves:
            out, saved = out
        return xp, out, saved if prim.saves else out

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

    def store(self, run: Run, result: tuple[Any, Any, Any]) -> None:
        out = self.out
        run.xps[out], run.datas[out], run.saved[out] = result
        run.wants[out] = self.wants
        run.scalar_rows[out] = self.scalar
        run.stats.kernels += 1

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
        super().__init__(FAN, out, wants)
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
        self.store(run, self.compute(self.args(run), self.params))

    def compute(self, args: list[Any], params: dict[str, Any]) -> tuple[Any, Any, Any]:
        xp = namespace(args[self.fan.shared[0]])
        out = self.fan.forward(xp, *args, **params)
        return xp, out, out

    def store(self, run: Run, result: tuple[Any, Any, Any]) -> None:
        out = self.out
        run.xps[out], run.datas[out], run.saved[out] = result
        run.wants[out] = self.wants
        run.stats.kernels += 1

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
class GatherStep(Step):
    """Values as the rows of one array: row ``positions[j][i]`` of the result is row ``rows[j][i]``
    of slot ``sources[j]`` (a stacked slot), or, where ``rows[j]`` is None, slot ``sources[j]``
    itself is the row at ``positions[j][0]``. ``shape``: the result reshaped (rows of rows joined
    along their first axis, for a concatenation), or None."""

    def __init__(
        self,
        sources: list[int],
        positions: list[Any],
        rows: list[Any],
        n: int,
        shape: tuple[int, ...] | None,
        out: int,
        wants: bool,
    ) -> None:
        super().__init__(GATHER, out, wants)
        self.sources = sources
        self.positions = positions
        self.rows = rows
        self.unique = [r is None or len(set(r.tolist())) == len(r) for r in rows]
        self.n = n
        self.shape = shape

    def forward(self, run: Run, checked: bool) -> None:
        datas = run.datas
        sources = self.sources
        first = datas[sources[0]]
        if type(first) is float:  # floats of their own: a vector of float64
            row_shape: tuple[int, ...] = ()
            dtype: Any = np.float64
            xp: Any = np
        else:
            row_shape = tuple(first.shape[1:]) if self.rows[0] is not None else tuple(first.shape)
            dtype = first.dtype
            xp = np if type(first) is NDARRAY else namespace(first)
        if xp is np:
            out = np.empty((self.n, *row_shape), dtype=dtype)
            for j, source in enumerate(sources):
                rows = self.rows[j]
                data = datas[source]
                if rows is None:
                    out[self.positions[j][0]] = data
                else:
                    out[self.positions[j]] = np.take(data, rows, axis=0)
        else:  # the array API assigns to no index array: the parts in order, then one take
            parts = []
            for j, source in enumerate(sources):
                rows = self.rows[j]
                data = datas[source]
                if rows is None:
                    parts.append(xp.reshape(xp.asarray(data, dtype=dtype), (1, *row_shape)))
                else:
                    parts.append(xp.take(data, host_in(xp, rows), axis=0))
            order = np.argsort(np.concatenate(self.positions), kind="stable")
            joined = xp.concat(parts, axis=0) if len(parts) > 1 else parts[0]
            out = xp.take(joined, xp.asarray(order), axis=0)
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
        return "gather"


@final
class RowStep(Step):
    """Row ``row`` of stacked slot ``source``, as a slot of its own (a call's value read on its own)."""

    def __init__(self, source: int, row: int, out: int, wants: bool) -> None:
        super().__init__(ROW, out, wants)
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
class ForeignStep(Step):
    """A tape of the user's own, read by ops of the run: its data is the slot's value, and its own
    ``backward`` (or ``release``) is given the slot's summed delta. Only this run has it: a run
    with one is not replayed."""

    def __init__(self, tape: Tape[Any, Any], out: int) -> None:
        super().__init__(FOREIGN, out, bool(tape.requires_delta))
        self.tape = tape

    def forward(self, run: Run, checked: bool) -> None:
        out = self.out
        run.datas[out] = self.tape.data
        run.wants[out] = self.wants
        run.replayable = False

    def name(self) -> str:
        return type(self.tape).__name__


@final
class CallsStep(Step):
    """The end of a batchable operation's group of ``n`` calls: its body read the stacked slots
    ``inputs`` and gave the stacked slots ``results``. It computes nothing; in the backward pass it
    tells the inputs which calls got a delta (a call none of whose results did gives its inputs
    none, as it would on its own: merging calls never gives a weight a gradient of zeros)."""

    def __init__(self, inputs: list[int], results: list[int], n: int, out: int) -> None:
        super().__init__(CALLS, out, False)
        self.inputs = inputs
        self.results = results
        self.n = n

    def forward(self, run: Run, checked: bool) -> None:
        pass

    def name(self) -> str:
        return "calls"


# ------------------------------------------------------------------------------------------ helpers


def row_value(data: Any, k: int, scalar: bool) -> Any:
    """Row ``k`` of stacked rows, as its call alone gives it: a float if ``scalar``, else an array
    (NumPy's rows of a vector are scalars: made 0-d arrays again)."""
    row = data[k] if type(data) is NDARRAY else data[k, ...]
    if scalar:
        return float(row)
    return np.asarray(row) if isinstance(row, np.generic) else row


def merged_params(prim: Primitive, calls: list[dict[str, Any]], base: dict[str, Any]) -> dict[str, Any]:
    """The parameters of merged calls (``calls``: each call's): ``base`` (the first call's, ``axis``
    shifted past the rows), with the per-row parameters stacked and the other per-run ones listed
    (None where every call's is None)."""
    spec = prim.batch
    assert spec is not None
    params = {**base}
    for name in spec.rows:
        params[name] = stack_column([call[name] for call in calls])
    for name in prim.per_run:
        if name not in spec.rows:
            column = [call[name] for call in calls]
            every_none = True
            for v in column:
                if v is not None:
                    every_none = False
                    break
            params[name] = None if every_none else column
    return params


def stack_column(values: list[Any]) -> Any:
    """Values of one per-row parameter, stacked as rows (NumPy's ``array`` of the list: ``stack``
    spends about a microsecond of Python on each array)."""
    first = values[0]
    if type(first) is NDARRAY:
        return np.array(values)
    return namespace(first).stack(values)


def check_merged_values(
    prim: Primitive, args: list[Any], stacked: list[bool], params: dict[str, Any], n: int
) -> None:
    """The per-run checks of merged calls: one of them all where the primitive has one
    (``Batching.check_merged``); else, or if it fails, each call's in turn, so that an error names
    that call's values."""
    spec = prim.batch
    check = prim.check_values
    assert spec is not None and check is not None
    if spec.check_merged is not None:
        try:
            spec.check_merged(member_args(args, stacked, 0), params)
            return
        except Exception:  # noqa: BLE001 - the calls' own checks say which one failed, and how
            pass
    calls = call_params(prim, params, n)
    for k in range(n):
        check(*member_args(args, stacked, k), **calls[k])


def call_params(prim: Primitive, params: dict[str, Any], n: int) -> list[dict[str, Any]]:
    """Each merged call's own per-run parameters, from the merged ones (rows taken apart again)."""
    calls = []
    for k in range(n):
        own = {}
        for name in prim.per_run:
            column = params[name]
            own[name] = None if column is None else column[k]
        calls.append(own)
    return calls


def member_args(args: list[Any], stacked: list[bool], k: int) -> tuple[Any, ...]:
    """Call k's own arguments: its row of each stacked argument, the shared ones as they are."""
    own = []
    for a, s in zip(args, stacked, strict=True):
        own.append(row_value(a, k, False) if s else a)
    return tuple(own)


def _rank(data: Any) -> int:
    return 0 if type(data) is float else len(getattr(data, "shape", ()))


_kinds: dict[Hashable, int] = {}
_ranks: list[int] = []
_kinds_lock = threading.Lock()


def kind_id(key: Hashable, rank: int) -> int:
    """A small int standing for a value kind (``value_key``), the same in every run: signatures
    hash these instead of the kinds' tuples."""
    k = _kinds.get(key)
    if k is None:
        with _kinds_lock:
            k = _kinds.get(key)
            if k is None:
                k = len(_ranks)
                _ranks.append(rank)
                _kinds[key] = k
    return k


def kind_rank(k: int) -> int:
    """The rank of the values of kind ``k`` (0 for floats)."""
    return _ranks[k]


class Program:
    """A run's steps, kept to be replayed by runs of the same structure: the number of slots, the
    root's place, and the statistics of its forward pass (a replay counts them again)."""

    def __init__(self, steps: list[Step], slots: int, root: Ref, stats: RunStats) -> None:
        self.steps = steps
        self.slots = slots
        self.root = root
        self.stats = stats
