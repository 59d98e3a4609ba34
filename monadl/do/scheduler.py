"""The scheduler: one loop that runs a ``Do``, merging the ops that are ready together.

It walks the graph from the root (iteratively: a graph 100,000 nodes deep is a loop, not a
recursion) and places every node of the differentiable program (``Apply``, ``Call``) at its
*depth*: one more than its deepest input's, leaves (weights, constants) at 0. Then it runs the
graph level by level, and within a level, calls of equal *signature* as one merged call: the
nodes of one depth are independent, so a level is an agenda of ready work, and merging its equal
calls is dynamic batching (DyNet's autobatching, TensorFlow Fold's loom): for a batch of trees,
the same op of every node of one height, across all the trees. With batching off, every group is
a group of one: the same loop.

A signature is the primitive, its static parameters, and per input either the value itself (a
weight, a float constant: one value shared by the calls, whose delta is summed once) or the kind
of a row (type, shape, dtype: the calls' values are stacked as rows). Calls left alone that read
one value with different others (``linear`` of one input with several weights, the gates of an LSTM
cell) *fan out* into one kernel instead. A batchable operation's calls of equal signature run its
body once, on their stacked rows (a nested run of the same loop); each call's value is a row.

The monad's own nodes (``map``, ``flat_map``, ``delay``, ``defer``, kernels) run user code, so
the graph behind them is only known once they ran: they are expanded when they are ready, before
the next level, and what they reveal is walked and placed at the levels after the current one.

Every computation is a step appended to the run's record (``program.py``): read backwards, it is
the backward pass (``monadl.tape``); kept, it is replayed by later runs of the same structure.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any, Final, cast

import numpy as np

from monadl.do.dispatch import Dispatcher
from monadl.do.do import (
    APPLY,
    BIND,
    CALL,
    DEFER,
    DELAY,
    FLAT,
    KERNEL,
    MAP,
    PROJECT,
    PURE,
    VARIABLE,
    Apply,
    Bind,
    Call,
    Defer,
    Delay,
    Do,
    Kernel,
    Project,
    Pure,
    Variable,
)
from monadl.do.primitive import Primitive, float_key
from monadl.do.program import (
    CallsStep,
    FanStep,
    ForeignStep,
    GatherStep,
    LeafStep,
    MergedStep,
    OpStep,
    Ref,
    RowStep,
    Run,
    RunTape,
    Step,
    kind_rank,
    merged_params,
)
from monadl.do.values import Tape
from monadl.do.workers import affinity_of
from monadl.typeclasses.backend import ShapeError, shape_of

VISITING: Final = -1  # on the walk's stack: its sources are being walked
WAITING: Final = -2  # walked, but its depth is not known yet: it waits for a dynamic node

_MARK: Final[Do[Any]] = Pure(None)  # on the walk's stack: the node below it has had its sources walked
_LEAF: Final = object()  # a leaf's value before the run reads it (then: its slot's Ref)


class Context:
    """The levels of one loop: the run's, or a batchable body's (a nested run of the loop)."""

    def __init__(self) -> None:
        self.levels: list[list[Do[Any]]] = [[]]
        self.level = 0  # the last level run (leaves are level 0)
        self.ready: list[Do[Any]] = []  # dynamic nodes whose sources are known


class Group:
    """Calls of one signature in a level: their nodes, and the places of each one's inputs."""

    def __init__(self) -> None:
        self.nodes: list[Do[Any]] = []
        self.refs: list[list[Ref]] = []

    def add(self, node: Do[Any], refs: list[Ref]) -> None:
        self.nodes.append(node)
        self.refs.append(refs)


def _join(groups: dict[Hashable, Group], key: Hashable, node: Do[Any], refs: list[Ref]) -> None:
    group = groups.get(key)
    if group is None:
        group = groups[key] = Group()
    group.add(node, refs)


def _rows_of(nodes: list[Do[Any]], slot: int) -> list[Any]:
    """The resolutions of merged calls: call k is row k of ``slot``."""
    resolutions: list[Any] = []
    for k, node in enumerate(nodes):
        resolutions.append(node)
        resolutions.append(Ref(slot, k))
    return resolutions


class Scheduler:
    """One run's interpretation of a ``Do`` (see the module). ``bound``: the positions of a static
    graph's bound nodes (``structure.py``: its weights, constants and ops with per-run parameters),
    which its steps name so that a replay reads its own; empty for a graph that is not static."""

    def __init__(self, run: Run, batching: bool, bound: dict[Do[Any], int]) -> None:
        self.run = run
        self.batching = batching
        self.dispatcher: Dispatcher | None = run.dispatcher
        self.values: dict[Do[Any], Any] = {}  # resolved nodes: a Ref (a node of the program) or a value
        self.depth: dict[Do[Any], int] = {}  # every walked node: its depth, or VISITING, WAITING
        self.waiting: dict[Do[Any], list[Do[Any]]] = {}  # unresolved node -> nodes waiting for it
        self.missing: dict[Do[Any], int] = {}  # blocked node -> its sources still unresolved
        self.homes: dict[Do[Any], Context] = {}  # blocked node -> the loop that walked it
        self.forwards: dict[Do[Any], Do[Any]] = {}  # a node whose value is another's (defer, flat_map)
        self.projected: dict[Do[Any], list[Project]] = {}  # a call not yet run -> its projections walked
        self.converted: dict[Do[Any], Ref] = {}  # a dynamic node's tape, as a slot
        self.taken: dict[tuple[int, int], int] = {}  # (stacked slot, row) -> a slot of that row
        self.after: dict[Step, list[Any]] = {}  # a step on the pool -> (node, value) to resolve then
        self.ctx = Context()
        self.bound = bound
        self.signatures: set[int] = set()
        self.work: list[Any] = []

    # ------------------------------------------------------------------------------------- walk

    def walk(self, root: Do[Any]) -> None:
        """Walks the nodes of ``root``'s graph not walked yet: leaves are resolved, ops and calls
        placed at their depth, dynamic nodes made ready (or left waiting for their sources)."""
        depth = self.depth
        stack: list[Do[Any]] = [root]
        while stack:
            node = stack.pop()
            if node is _MARK:
                self.post(stack.pop())
                continue
            if node in depth:
                continue
            kind = node.kind
            if kind == PROJECT:  # its one source is its call (it keeps no tuple of it)
                depth[node] = VISITING
                call = cast(Project, node).call
                if call in depth:
                    self.post(node)
                else:
                    stack.append(node)
                    stack.append(_MARK)
                    stack.append(call)
            elif kind == APPLY or kind == BIND or kind == CALL:
                depth[node] = VISITING
                sources = node.sources
                base = len(stack)
                for i in range(len(sources) - 1, -1, -1):  # walked in order
                    s = sources[i]
                    if s not in depth:
                        stack.append(s)
                if len(stack) == base:  # its sources were all walked: placed at once
                    self.post(node)
                else:
                    stack.insert(base, node)  # below its sources, with the mark: posted after them
                    stack.insert(base + 1, _MARK)
            elif kind == VARIABLE:
                self.leaf(node)
            elif kind == PURE:
                self.pure(cast(Pure[Any], node))
            elif kind == DELAY:
                self.dynamic()
                depth[node] = WAITING
                self.resolve(node, cast(Delay[Any], node).thunk())
            elif kind == DEFER:
                self.dynamic()
                depth[node] = WAITING
                then = cast(Defer[Any], node).thunk()
                if not isinstance(then, Do):
                    raise TypeError(f"defer: the thunk returned {type(then).__name__}, not a Do")
                self.follow(node, then)
                if then not in depth:
                    stack.append(then)
            elif kind == KERNEL:
                self.dynamic()
                depth[node] = WAITING
                self.ctx.ready.append(node)
            else:  # pragma: no cover - every node class has a kind above
                raise TypeError(f"monadl: not a Do node: {node!r}")

    def post(self, node: Do[Any]) -> None:
        """A node whose sources have been walked: placed, made ready, or left waiting."""
        depth = self.depth
        kind = node.kind
        if kind == PROJECT:
            project = cast(Project, node)
            call = project.call
            e = depth[call]
            if call in self.values:
                depth[node] = e
                self.resolve(node, self.value_of(call)[project.index])
            else:
                depth[node] = e if e >= 0 else WAITING  # resolved with its call
                projected = self.projected.get(call)
                if projected is None:
                    self.projected[call] = [project]
                else:
                    projected.append(project)
            self.dynamic()  # (only calls make projections: a run with a call is not replayed)
            return
        sources = node.sources
        deepest = 0
        blocked = 0
        if kind == BIND:
            self.dynamic()
            values = self.values
            for s in sources:
                if s not in values:
                    blocked += 1
                    self.wait(s, node)
            if blocked:
                self.block(node, blocked)
            else:
                depth[node] = WAITING
                self.ctx.ready.append(node)
            return
        for s in sources:
            e = depth[s]
            if e < 0:
                blocked += 1
                self.wait(s, node)
            elif e > deepest:
                deepest = e
        if kind == CALL:
            self.dynamic()
        if blocked:
            self.block(node, blocked)
        else:
            self.place(node, deepest + 1, self.ctx)

    def pure(self, node: Pure[Any]) -> None:
        """A known value: a constant's leaf if it is a literal's tape."""
        value = node.value
        if type(value) is Tape:
            self.leaf(node)
            return
        self.depth[node] = 0
        self.dynamic()  # a Pure of something else is the monad's, not a constant of the program
        self.resolve(node, value)

    def leaf(self, node: Do[Any]) -> None:
        """A weight's or a constant's node: known, its slot made when the run first reads it."""
        self.depth[node] = 0
        if node in self.waiting:
            self.resolve(node, self.leaf_ref(node))
        else:
            self.values[node] = _LEAF

    def leaf_ref(self, node: Any) -> Ref:
        """The slot of a leaf, made now: its step reads the weight's data, or the constant."""
        run = self.run
        weight = node.weight if type(node) is Variable else None
        slot = run.new_slot(weight is not None)
        step = LeafStep(
            slot, self.bound.get(node, -1), weight, None if weight is not None else node.value.data
        )
        run.steps.append(step)
        step.forward(run, True)
        ref = Ref(slot, -1)
        self.values[node] = ref
        return ref

    def value_of(self, node: Do[Any]) -> Any:
        """A resolved node's value (a leaf's slot made if it had none yet)."""
        value = self.values[node]
        return self.leaf_ref(node) if value is _LEAF else value

    def dynamic(self) -> None:
        """The run met a node whose graph is only known once it ran: it is not replayed."""
        self.run.replayable = False

    def place(self, node: Do[Any], d: int, ctx: Context) -> None:
        """Places a static node at depth ``d`` of loop ``ctx`` (after the level it is at)."""
        if d <= ctx.level:
            d = ctx.level + 1
        self.depth[node] = d
        levels = ctx.levels
        while len(levels) <= d:
            levels.append([])
        levels[d].append(node)

    def wait(self, source: Do[Any], node: Do[Any]) -> None:
        waiters = self.waiting.get(source)
        if waiters is None:
            self.waiting[source] = [node]
        else:
            waiters.append(node)

    def block(self, node: Do[Any], count: int) -> None:
        self.depth[node] = WAITING
        self.missing[node] = count
        self.homes[node] = self.ctx

    def follow(self, node: Do[Any], then: Do[Any]) -> None:
        """``node``'s value is ``then``'s (a defer, a flat_map's result)."""
        if then in self.values:
            self.resolve(node, self.value_of(then))
        else:
            self.forwards[node] = then
            self.wait(then, node)

    # ---------------------------------------------------------------------------------- resolve

    def resolve(self, node: Do[Any], value: Any) -> None:
        """Records ``node``'s value and wakes what waited for it."""
        self.values[node] = value
        depth = self.depth
        if depth[node] < 0:
            depth[node] = self.ctx.level
        # Waiters are rare (dynamic nodes waiting for this one); a call has its projections.
        if (node.kind == CALL and node in self.projected) or (self.waiting and node in self.waiting):
            self.wake(node, value)

    def wake(self, node: Do[Any], value: Any) -> None:
        """Wakes what waited for ``node`` (and, for a call, its projections), iteratively: a chain
        of 100,000 flat_maps resolves in a loop."""
        values, depth, waiting = self.values, self.depth, self.waiting
        if not waiting:  # the common case: a call's projections, and nothing waits for them
            projected = self.projected.get(node)
            if projected is not None:
                del self.projected[node]
                level = self.ctx.level
                for p in projected:
                    values[p] = value[p.index]
                    if depth[p] < 0:
                        depth[p] = level
            return
        work = self.work
        base = len(work)
        work.append(node)
        work.append(value)
        while len(work) > base:
            value = work.pop()
            node = work.pop()
            values[node] = value
            if depth[node] < 0:
                depth[node] = self.ctx.level
            # (``get`` and ``del``, not ``pop``: compiled, ``dict.pop`` is a generic method call)
            projected = self.projected.get(node)
            if projected is not None:  # a call: its projections' values are its results
                del self.projected[node]
                for p in projected:
                    work.append(p)
                    work.append(value[p.index])
            waiters = waiting.get(node)
            if waiters is None:
                continue
            del waiting[node]
            forwards, missing, homes = self.forwards, self.missing, self.homes
            for w in waiters:
                if forwards and w in forwards:
                    del forwards[w]
                    work.append(w)
                    work.append(value)
                    continue
                left = missing[w] - 1
                if left:
                    missing[w] = left
                    continue
                del missing[w]
                home = homes[w]
                del homes[w]
                if w.kind == BIND:
                    home.ready.append(w)
                else:
                    deepest = 0
                    for s in w.sources:
                        e = depth[s]
                        if e > deepest:
                            deepest = e
                    self.place(w, deepest + 1, home)

    # ------------------------------------------------------------------------------------- loop

    def drain(self) -> None:
        """Runs the current loop until nothing is left: ready dynamic nodes first, then the next
        level's groups, then the pool's results."""
        ctx = self.ctx
        dispatcher = self.dispatcher
        while True:
            if ctx.ready:
                self.run_dynamic(ctx.ready.pop())
                continue
            levels = ctx.levels
            d = ctx.level + 1
            while d < len(levels) and not levels[d]:
                d += 1
            if d < len(levels):
                if dispatcher is not None:
                    while self.after:  # a level's signatures read the data of the levels before
                        self.collect()
                ctx.level = d
                nodes = levels[d]
                levels[d] = []
                self.run_level(nodes)
                continue
            if dispatcher is not None and dispatcher.pending:
                self.collect()
                continue
            return

    def collect(self) -> None:
        """Takes one result from the pool: a step's value, or a kernel node's."""
        dispatcher = self.dispatcher
        assert dispatcher is not None
        token, owner, result = dispatcher.collect()
        if owner is None:
            self.resolve(token, result)
            return
        step: Step = token
        step.store(self.run, result)
        resolutions = self.after[step]
        del self.after[step]
        for i in range(0, len(resolutions), 2):
            self.resolve(resolutions[i], resolutions[i + 1])

    def run_dynamic(self, node: Any) -> None:
        """Runs a ready node of the monad's own."""
        if node.kind == KERNEL:
            self.kernel(node, node.fn, node.args, node.cost)
            return
        bind: Bind[Any] = node
        args = []
        for s in bind.sources:
            args.append(self.user_value(s))
        mode = bind.mode
        if mode == MAP:
            self.resolve(node, bind.f(*args))
        elif mode == FLAT:
            then = bind.f(*args)
            if not isinstance(then, Do):
                name = getattr(bind.f, "__qualname__", bind.f)
                raise TypeError(f"flat_map: {name!r} returned {type(then).__name__}, not a Do")
            self.follow(node, then)
            if then not in self.depth:
                self.walk(then)
        else:
            self.kernel(node, bind.f, tuple(args), bind.cost)

    def kernel(self, node: Do[Any], fn: Any, args: tuple[Any, ...], cost: Any) -> None:
        """A kernel of the user's own: inline, or on the pool if its cost is worth it."""
        self.run.stats.kernels += 1
        dispatcher = self.dispatcher
        if dispatcher is not None:
            if type(cost) is not float and type(cost) is not int:
                cost = cost()
            if cost >= dispatcher.min_cost:
                dispatcher.submit(fn, args, node, None, affinity_of(fn))
                return
        self.resolve(node, fn(*args))

    def user_value(self, node: Do[Any]) -> Any:
        """A node's value as user code sees it: a tape for a node of the program."""
        value = self.value_of(node)
        if type(value) is Ref:
            return RunTape(self.run, value)
        return value

    # ------------------------------------------------------------------------------------ levels

    def run_level(self, nodes: list[Do[Any]]) -> None:
        """Runs the nodes of one depth: calls of equal signature as one group each."""
        groups: dict[Hashable, Group] = {}
        fans: dict[Hashable, Group] = {}
        alone = Group()
        batching = self.batching
        for node in nodes:
            refs = self.refs_of(node)
            key: Hashable | None = None
            if batching:
                if node.kind == APPLY:
                    key = self.signature(cast(Apply, node), refs)
                    if key is None:  # it may still fan out with others
                        fan_key = self.fan_signature(cast(Apply, node), refs)
                        if fan_key is not None:
                            _join(fans, fan_key, node, refs)
                            continue
                else:
                    key = self.call_signature(cast(Call, node), refs)
            if key is None:
                alone.add(node, refs)
            else:
                _join(groups, key, node, refs)
        for key, group in groups.items():
            if len(group.nodes) > 1:
                self.signatures.add(hash(key))
                if group.nodes[0].kind == APPLY:
                    try:
                        self.run_merged(group)
                    except Exception as error:
                        _note_where(error, group.nodes[0])
                        raise
                else:
                    self.run_call(group)
                continue
            node = group.nodes[0]
            fan_key = self.fan_signature(cast(Apply, node), group.refs[0]) if node.kind == APPLY else None
            if fan_key is None:
                self.signatures.add(hash(key))
                alone.add(node, group.refs[0])
            else:
                _join(fans, fan_key, node, group.refs[0])
        for key, group in fans.items():
            self.signatures.add(hash(key))
            if len(group.nodes) > 1:
                try:
                    self.run_fan(group)
                except Exception as error:
                    _note_where(error, group.nodes[0])
                    raise
            else:
                alone.add(group.nodes[0], group.refs[0])
        for i, node in enumerate(alone.nodes):
            if node.kind == APPLY:
                try:
                    self.run_alone(cast(Apply, node), alone.refs[i])
                except Exception as error:
                    _note_where(error, node)
                    raise
            else:
                one = Group()
                one.add(node, alone.refs[i])
                self.run_call(one)

    def refs_of(self, node: Do[Any]) -> list[Ref]:
        """Where the values of a node's sources are (a dynamic node's tape made a slot)."""
        values = self.values
        refs = []
        for s in node.sources:
            v = values[s]
            if type(v) is Ref:
                refs.append(v)
            elif v is _LEAF:
                refs.append(self.leaf_ref(s))
            else:
                refs.append(self.ref_of(s, v, node))
        return refs

    def ref_of(self, source: Do[Any], value: Any, consumer: Any) -> Ref:
        """A dynamic node's value as a slot: a tape of this run is its own slot; a literal's a
        constant's; a tape of the user's own a slot whose backward is the tape's own."""
        ref = self.converted.get(source)
        if ref is not None:
            return ref
        run = self.run
        if type(value) is RunTape and value.run is run:
            ref = value.ref
        elif isinstance(value, Tape) and (type(value) is Tape or type(value) is RunTape):
            slot = run.new_slot(False)
            step: Step = LeafStep(slot, -1, None, value.data)
            run.steps.append(step)
            step.forward(run, True)
            ref = Ref(slot, -1)
        elif isinstance(value, Tape):
            value.acquire()
            slot = run.new_slot(bool(value.requires_delta))
            step = ForeignStep(value, slot)
            run.steps.append(step)
            step.forward(run, True)
            ref = Ref(slot, -1)
        else:
            raise TypeError(
                f"{name_of(consumer)}: expected a layer's value (a tape), got {type(value).__name__}"
            )
        self.converted[source] = ref
        return ref

    def own(self, ref: Ref) -> int:
        """A slot of ``ref``'s value of its own (a row taken out of its group)."""
        if ref.row < 0:
            return ref.slot
        key = (ref.slot, ref.row)
        slot = self.taken.get(key)
        if slot is None:
            run = self.run
            wants = run.wants[ref.slot]
            slot = run.new_slot(wants)
            step = RowStep(ref.slot, ref.row, slot, wants)
            run.steps.append(step)
            step.forward(run, True)
            self.taken[key] = slot
        return slot

    # -------------------------------------------------------------------------------- signatures

    def signature(self, node: Apply, refs: list[Ref]) -> Hashable | None:
        """An op's signature (see the module): equal ones merge; None runs it on its own."""
        prim = node.prim
        spec = prim.batch
        if spec is None:
            return None
        pkey = static_key(node)
        if pkey is None:
            return None
        run = self.run
        if spec.mergeable is not None and not spec.mergeable(*[run.value(r) for r in refs]):
            return None
        key: list[Any] = [prim, pkey]
        stacked = bool(spec.rows)
        shared = spec.shared
        any_input = spec.elementwise
        for i, r in enumerate(refs):
            if any_input or i in shared:
                if r.row < 0:
                    slot = r.slot
                    if run.weights[slot] is not None:
                        key.append(-1 - slot)  # one weight for all the calls
                        continue
                    data = run.datas[slot]
                    if type(data) is float and not run.wants[slot]:
                        key.append((float_key(data),))  # one float constant for all the calls
                        continue
                if i in shared:
                    return None
            key.append(run.ref_kind(r))
            stacked = True
        if not stacked:
            return None
        dispatcher = self.dispatcher
        if (
            dispatcher is not None
            and cost_of(prim, [run.value(r) for r in refs], node.params) >= dispatcher.min_cost
        ):
            return None  # worth the pool on its own: run beside the others, not merged with them
        return tuple(key)

    def fan_signature(self, node: Apply, refs: list[Ref]) -> Hashable | None:
        """The signature of an op that merged with nothing under its own: calls that read one value
        with different others merge by fanning out."""
        spec = node.prim.batch
        fan = None if spec is None else spec.fan
        if fan is None:
            return None
        pkey = static_key(node)
        if pkey is None:
            return None
        run = self.run
        key: list[Any] = [node.prim, "fan", pkey]
        for i, r in enumerate(refs):
            key.append((r.slot, r.row) if i in fan.shared else run.ref_kind(r))
        return tuple(key)

    def call_signature(self, node: Call, refs: list[Ref]) -> Hashable | None:
        """A batchable call's signature: its static part and its rows' kinds; None where the rows
        differ in rank (stacked, a float against an array, or a vector against a matrix, would no
        longer broadcast as they did in the call)."""
        run = self.run
        key: list[Any] = [node.static]
        rank = -1
        for r in refs:
            k = run.ref_kind(r)
            r_rank = kind_rank(k)
            if rank >= 0 and r_rank != rank:
                return None
            rank = r_rank
            key.append(k)
        return tuple(key)

    # ------------------------------------------------------------------------------------ groups

    def launch(self, step: Step, resolutions: list[Any]) -> None:
        """Appends ``step`` to the run and runs it (on the pool if it is heavy); then resolves the
        nodes it computes (``resolutions``: node, value, node, value, ...)."""
        run = self.run
        run.steps.append(step)
        dispatcher = self.dispatcher
        if step.heavy and dispatcher is not None:
            self.after[step] = resolutions
            step.submit(run, dispatcher, True)
            return
        step.forward(run, True)
        for i in range(0, len(resolutions), 2):
            self.resolve(resolutions[i], resolutions[i + 1])

    def weigh(
        self,
        step: Step,
        prim: Primitive,
        args: list[Any] | tuple[Any, ...],
        params: dict[str, Any],
        ins: list[int],
    ) -> None:
        """Decides whether ``step`` goes to the pool (its cost), and the worker it prefers (its
        first weight's: a weight's kernels run on one core, where its data is in cache)."""
        dispatcher = self.dispatcher
        if dispatcher is None:
            return
        step.heavy = cost_of(prim, args, params) >= dispatcher.min_cost
        weights = self.run.weights
        for slot in ins:
            w = weights[slot]
            if w is not None:
                step.affinity = id(w)
                break

    def count(self, name: str) -> None:
        kinds = self.run.stats.kinds
        kinds[name] = kinds.get(name, 0) + 1

    def run_alone(self, node: Apply, refs: list[Ref]) -> None:
        """An op that merges with nothing: its own step (rows of groups taken out first, but for
        sums and concatenations of rows, which take them as gathered arrays)."""
        prim = node.prim
        spec = prim.batch
        if spec is not None and (spec.sums_rows or spec.joins_rows):
            for r in refs:
                if r.row >= 0:
                    if spec.sums_rows:
                        self.sum_rows(node, refs)
                        return
                    if self.join_rows(node, refs):
                        return
                    break
        run = self.run
        ins = []
        wants = False
        for r in refs:
            slot = self.own(r)
            ins.append(slot)
            if run.wants[slot]:
                wants = True
        out = run.new_slot(wants)
        step = OpStep(prim, ins, out, node.params, self.bound.get(node, -1), wants)
        if self.dispatcher is not None:
            self.weigh(step, prim, step.args(run), node.params, ins)
        self.count(prim.name)
        self.launch(step, [node, Ref(out, -1)])

    def run_merged(self, group: Group) -> None:
        """Calls of one primitive with equal signatures, as one call on their stacked rows."""
        run = self.run
        first = cast(Apply, group.nodes[0])
        refs0 = group.refs[0]
        n = len(group.nodes)
        prim = first.prim
        spec = prim.batch
        assert spec is not None
        datas0 = [run.value(r) for r in refs0]
        if prim.check is not None:  # equal signatures: the first call's shapes stand for all
            prim.check(*datas0, **first.params)
        calls = []
        members = []
        bound = self.bound  # (empty unless the run may be replayed: then its per-run parameters)
        for member in group.nodes:
            node = cast(Apply, member)
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
        pads: list[tuple[int, ...] | None] = []
        wants = False
        for i, r in enumerate(refs0):
            if (spec.elementwise or i in spec.shared) and r.row < 0 and self.is_shared(r.slot):
                slot = r.slot
                stacked.append(False)
                pads.append(None)
            else:
                column = [refs[i] for refs in group.refs]
                slot = self.gather(column)
                stacked.append(True)
                d = datas0[i]
                row_rank = 0 if type(d) is float else len(d.shape)
                if spec.elementwise and row_rank < rank:  # so that rows broadcast as their calls did
                    row_shape = () if type(d) is float else tuple(d.shape)
                    pads.append((n,) + (1,) * (rank - row_rank) + row_shape)
                else:
                    pads.append(None)
            ins.append(slot)
            if run.wants[slot]:
                wants = True
        scalar = scalar_result(prim, datas0, first.params)
        out = run.new_slot(wants)
        step = MergedStep(prim, ins, stacked, pads, params, members, n, scalar, out, wants)
        step.calls = calls
        step.row_shapes = [() if type(d) is float else tuple(d.shape) for d in datas0]
        if self.dispatcher is not None:
            self.weigh(step, prim, step.args(run), params, ins)
        stats = run.stats
        stats.groups += 1
        stats.merged += n
        self.count(prim.name)
        self.launch(step, _rows_of(group.nodes, out))

    def is_shared(self, slot: int) -> bool:
        """Whether a slot may be one value for merged calls: a weight, or a float constant."""
        run = self.run
        return run.weights[slot] is not None or (type(run.datas[slot]) is float and not run.wants[slot])

    def run_fan(self, group: Group) -> None:
        """Calls of one primitive reading one value with different others, as one kernel."""
        run = self.run
        first = cast(Apply, group.nodes[0])
        prim = first.prim
        spec = prim.batch
        assert spec is not None and spec.fan is not None
        fan = spec.fan
        n = len(group.nodes)
        refs0 = group.refs[0]
        if prim.check is not None:  # every call's own check, so that an error names its shapes
            for k in range(n):
                prim.check(*[run.value(r) for r in group.refs[k]], **cast(Apply, group.nodes[k]).params)
        ins: list[list[int]] = []
        wants = False
        for i in range(len(refs0)):
            if i in fan.shared:
                slots = [self.own(refs0[i])]
            else:
                slots = [self.own(refs[i]) for refs in group.refs]
            for s in slots:
                if run.wants[s]:
                    wants = True
            ins.append(slots)
        out = run.new_slot(wants)
        step = FanStep(prim, fan, ins, first.params, n, out, wants)
        if self.dispatcher is not None:
            total = 0.0
            for refs in group.refs:
                total += cost_of(prim, [run.value(r) for r in refs], first.params)
            step.heavy = total >= self.dispatcher.min_cost
        stats = run.stats
        stats.groups += 1
        stats.merged += n
        self.count(prim.name)
        self.launch(step, _rows_of(group.nodes, out))

    def run_call(self, group: Group) -> None:
        """Calls of a batchable operation: its body run once on their stacked rows (or, for a call
        on its own, on its own arguments, as the plain function)."""
        run = self.run
        first = cast(Call, group.nodes[0])
        op = first.op
        n = len(group.nodes)
        refs0 = group.refs[0]
        self.dynamic()  # the body is user code, recorded now: a run with calls is not replayed
        tapes: list[Tape[Any, Any]] = []
        inputs: list[int] = []
        if n == 1:
            for r in refs0:
                tapes.append(RunTape(run, r))
        else:
            for j in range(len(refs0)):
                slot = self.gather([refs[j] for refs in group.refs])
                inputs.append(slot)
                tapes.append(RunTape(run, Ref(slot, -1)))
        self.count(op.name)
        results = self.nested(op.expand(first, tapes), op.name)
        if n == 1:
            self.resolve(first, tuple(results))
            return
        stats = run.stats
        stats.groups += 1
        stats.merged += n
        slots = []
        for j, r in enumerate(results):
            slot = self.own(r)
            check_rows(op.name, n, j, run.datas[slot])
            run.scalar_rows[slot] = op.scalars[j]
            slots.append(slot)
        run.steps.append(CallsStep(inputs, slots, n, -1))
        for k, node in enumerate(group.nodes):
            self.resolve(node, tuple([Ref(s, k) for s in slots]))

    def nested(self, roots: list[Do[Any]], name: str) -> list[Ref]:
        """The values of ``roots`` (a batchable body's results), computed by a nested loop."""
        outer = self.ctx
        self.ctx = Context()
        try:
            for root in roots:
                self.walk(root)
            self.drain()
        finally:
            self.ctx = outer
        refs = []
        for root in roots:
            if root not in self.values:
                raise RuntimeError(
                    f"batchable {name}: its body reads a layer computed outside it and not yet "
                    "computed here: pass that layer to it as an argument"
                )
            v = self.value_of(root)
            refs.append(v if type(v) is Ref else self.ref_of(root, v, name))
        return refs

    # --------------------------------------------------------------------------- rows as arrays

    def gather(self, refs: list[Ref], shape: tuple[int, ...] | None = None) -> int:
        """A slot of the values at ``refs`` as the rows of one array: a group's own slot when they
        are exactly its rows in order, else a gather of rows of groups (and of values of their own)."""
        run = self.run
        n = len(refs)
        first = refs[0]
        if shape is None and first.row == 0:
            source = first.slot
            data = run.datas[source]
            if data.shape[0] == n:
                whole = True
                for k in range(n):
                    r = refs[k]
                    if r.slot != source or r.row != k:
                        whole = False
                        break
                if whole:
                    return source
        sources: list[int] = []
        positions: list[list[int]] = []
        rows: list[list[int] | None] = []
        index: dict[int, int] = {}
        for p in range(n):
            r = refs[p]
            if r.row >= 0:
                j = index.get(r.slot, -1)
                if j < 0:
                    index[r.slot] = len(sources)
                    sources.append(r.slot)
                    positions.append([p])
                    rows.append([r.row])
                else:
                    positions[j].append(p)
                    picked = rows[j]
                    assert picked is not None
                    picked.append(r.row)
            else:
                sources.append(r.slot)
                positions.append([p])
                rows.append(None)
        wants = False
        for s in sources:
            if run.wants[s]:
                wants = True
                break
        scalar = run.scalar_rows[first.slot] if first.row >= 0 else type(run.datas[first.slot]) is float
        out = run.new_slot(wants)
        step = GatherStep(
            sources,
            [np.asarray(p, dtype=np.intp) for p in positions],
            [None if r is None else np.asarray(r, dtype=np.intp) for r in rows],
            n,
            shape,
            out,
            wants,
        )
        run.steps.append(step)
        step.forward(run, True)
        run.scalar_rows[out] = scalar and shape is None
        return out

    def sum_rows(self, node: Apply, refs: list[Ref]) -> None:
        """An n-ary sum over rows of groups: each group's rows gathered and summed as one array,
        then the parts summed (the sum of a loss over every node of a batch of trees)."""
        run = self.run
        parts: list[int] = []
        by_group: dict[int, list[Ref]] = {}
        for r in refs:
            if r.row >= 0:
                rows = by_group.get(r.slot)
                if rows is None:
                    by_group[r.slot] = [r]
                else:
                    rows.append(r)
            else:
                parts.append(r.slot)
        for rows in by_group.values():
            gathered = self.gather(rows)
            wants = run.wants[gathered]
            out = run.new_slot(wants)
            scalar = {"scalar": run.scalar_rows[gathered]}
            self.launch(OpStep(ROWS_SUM, [gathered], out, scalar, -1, wants), [])
            parts.append(out)
        self.count(node.prim.name)
        if len(parts) == 1:
            self.resolve(node, Ref(parts[0], -1))
            return
        wants = False
        for s in parts:
            if run.wants[s]:
                wants = True
        out = run.new_slot(wants)
        self.launch(OpStep(sum_n(len(parts)), parts, out, {}, -1, wants), [node, Ref(out, -1)])

    def join_rows(self, node: Apply, refs: list[Ref]) -> bool:
        """A concatenation of arrays of one kind along their first axis, as one gather; False if
        it is not one."""
        run = self.run
        kind = run.ref_kind(refs[0])
        rank = kind_rank(kind)
        axis = node.params.get("axis", 0)
        if rank == 0 or axis not in (0, -rank):
            return False
        for r in refs:
            if run.ref_kind(r) != kind:
                return False
        first = run.value(refs[0])
        slot = self.gather(refs, (-1, *first.shape[1:]))
        self.count(node.prim.name)
        self.resolve(node, Ref(slot, -1))
        return True


# ------------------------------------------------------------------------------------------ helpers


def static_key(node: Apply) -> Hashable | None:
    """The static part of an op's parameters (``Primitive.static_key``), computed once per node."""
    return node.prim.static_key(node.params)


def merge_params(prim: Primitive, calls: list[dict[str, Any]], first: Any) -> dict[str, Any]:
    """The parameters of merged calls (``calls``: each call's; ``first``: the first call's first
    input): the first call's, with ``axis`` shifted past the rows, the per-row parameters stacked
    and the other per-run ones listed (``program.merged_params``)."""
    spec = prim.batch
    assert spec is not None
    params = calls[0]
    if spec.axis:
        item_rank = 0 if type(first) is float else len(first.shape)
        params = {**params, "axis": shift_axis(params.get("axis", spec.axis_default), item_rank)}
    if spec.rows or prim.per_run:
        params = merged_params(prim, calls, params)
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


def check_rows(name: str, n: int, index: int, data: Any) -> None:
    """Raises if result ``index`` of an operation's body, run on ``n`` calls' stacked rows, is not
    ``n`` rows (a body that reduces over the rows' axis, or reshapes it away)."""
    if type(data) is float or not data.shape or data.shape[0] != n:
        raise ShapeError(
            f"batchable {name}: run once on the stacked rows of {n} calls, its body gave result {index} "
            f"of shape {shape_of(data)}, not {n} rows: the body must keep a leading axis of rows "
            "(reduce and concatenate along axis=-1, not over every axis)"
        )


def cost_of(prim: Primitive, args: list[Any] | tuple[Any, ...], params: dict[str, Any]) -> float:
    """An op's cost (roughly, floating-point operations), 0 for inputs it rejects (then it runs
    inline, and its check says why)."""
    try:
        return float(prim.cost(*args, **params))
    except Exception:  # noqa: BLE001 - inputs the op rejects: its own check reports them
        return 0.0


def name_of(consumer: Any) -> str:
    """A node's (or an operation's) name for messages."""
    if type(consumer) is str:
        return consumer
    if type(consumer) is Apply:
        return consumer.prim.name
    if type(consumer) is Call:
        return f"batchable {consumer.op.name}"
    return type(consumer).__name__


def _sum_rows_forward(xp: Any, x: Any, scalar: bool) -> Any:
    return float(xp.sum(x)) if scalar else xp.sum(x, axis=0)


def _sum_rows_vjp(xp: Any, d: Any, o: Any, x: Any, scalar: bool) -> Any:
    return xp.broadcast_to(xp.asarray(d, dtype=x.dtype), x.shape)


ROWS_SUM = Primitive("sum_rows", _sum_rows_forward, (_sum_rows_vjp,), fresh=True, own=True)
"""The scheduler's own op: the sum of a gathered array's rows (a float for a vector of floats)."""


def _sum_forward(xp: Any, *xs: Any) -> Any:
    total = xs[0]
    for x in xs[1:]:
        total = total + x  # left to right
    return total


def _identity_vjp(xp: Any, d: Any, o: Any, *xs: Any) -> Any:
    return d


_sums: dict[int, Primitive] = {}


def sum_n(n: int) -> Primitive:
    """The scheduler's own n-ary sum (of a sum's parts, rows of groups summed first)."""
    prim = _sums.get(n)
    if prim is None:
        prim = _sums[n] = Primitive(
            "sum", _sum_forward, (_identity_vjp,) * n, broadcasts=True, passes=True, own=True
        )
    return prim


__all__ = ["Context", "Kernel", "Project", "Scheduler"]


def _note_where(error: Exception, node: Do[Any]) -> None:
    """Adds to ``error`` where the user's code made the op that raised it (the first such note
    stands: an error passing through a nested run keeps the innermost op's)."""
    if type(node) is not Apply or getattr(error, "__notes__", None):
        return
    where = node.made_at()
    if where is not None:
        error.add_note(f"{node.prim.name} was made at {where}")
