"""The scheduler: one loop that runs rows of a graph, an agenda of ready work whose equal calls merge.

It walks the rows a run needs from its roots (over the graph's columns: integers, no objects), and
keeps for each row, in lists indexed by the row, its state, the inputs not yet done, its value's
place, and its consumers (a linked list of edges in two more lists). A row whose inputs are done is
*ready*. Ready rows of the monad's own (``map``, ``flat_map``, kernels, ``delay``, ``defer``) run
first, since what they reveal may join the graph; ready ops and batchable calls wait on the agenda
in *buckets*, one per primitive or batchable operation, and the loop runs one bucket at a time, its
calls of equal signature merged (``batching.py``). The bucket whose calls lie shallowest on average
runs first (DyNet's agenda), so that a deep kind of call (a classifier over every state of an LSTM)
waits until all its calls are ready, while the ops of the chains that feed it run level by level.

Everything the loop computes is a step appended to the run's record (``record.py``). A group of a
batchable operation's calls runs the operation's body on their stacked rows, in a frame of its own:
the body's program, recorded on the first group of its signature and replayed for the later ones
(``bodies.py``).
"""

from __future__ import annotations

from typing import Any, Final

from librt.vecs import append, extend, vec
from mypy_extensions import i64

from monadl.do import batching, bodies
from monadl.do.do import (
    BIND,
    DEFER,
    DELAY,
    FLAT,
    KERNEL,
    MAP,
    PURE,
    Bind,
    Call,
    Defer,
    Delay,
    Kernel,
    Node,
    Pure,
)
from monadl.do.graph import CALL, CONST, NODE, OP, RESULT, WEIGHT, Graph, enter_run, leave_run, swap_recording
from monadl.do.record import Program, Run, RunTape
from monadl.do.steps import CastStep, ForeignStep, LeafStep, Step
from monadl.do.tape import Tape
from monadl.runtime.pool import Dispatcher, affinity_of, drain_failed
from monadl.runtime.recent import Recent
from monadl.typeclasses.backend import namespace

UNWALKED: Final[i64] = 0
WAITING: Final[i64] = 1
DONE: Final[i64] = 2
FOUND: Final[i64] = 3  # met by a walk, not posted yet


class Bucket:
    """Ready calls waiting on the agenda; ``total`` and ``count``: the depths of the calls of its kind
    walked so far (its priority is their mean), ``order``: its place among equals."""

    def __init__(self, order: int) -> None:
        self.ready: list[int] = []
        self.total = 0
        self.count = 0
        self.order = order


class Scheduler:
    """One frame's interpretation of rows of ``graph`` (see the module). ``bound``: a static graph's
    rows that a replay reads, by position (``executor.structure_of``), which its steps name;
    ``outer``: the scheduler of the run whose batchable body this one records."""

    def __init__(
        self,
        graph: Graph,
        run: Run,
        batching_on: bool,
        bound: dict[int, int],
        bodies: Recent,
        outer: Scheduler | None = None,
    ) -> None:
        self.graph = graph
        self.run = run
        self.batching = batching_on
        self.bound = bound
        self.bodies = bodies
        self.outer = outer
        self.dispatcher: Dispatcher | None = run.dispatcher
        self.min_cost = batching.NO_POOL if run.dispatcher is None else run.dispatcher.min_cost
        # By row: its state, its inputs not done (-1: it takes the value of the one it follows),
        # where its value is (a slot and a row of it, or a value of the monad's own), its bucket,
        # whether an input is a node of the monad's own (made a slot when the row runs), and the
        # first and last of its consumers' edges.
        self.state = vec[i64]()
        self.pending = vec[i64]()
        self.slots = vec[i64]()
        self.rows = vec[i64]()
        self.values: list[Any] = []
        self.buckets_of = vec[i64]()
        self.dynamic = vec[bool]()
        self.head = vec[i64]()
        self.tail = vec[i64]()
        # The consumers' edges: its consumer (a follower: -1 - row), the next edge of its row.
        self.edge_to = vec[i64]()
        self.edge_next = vec[i64]()
        # By an input of a row (its index into the graph's ``args``): the slot and row it reads.
        self.in_slots = vec[i64]()
        self.in_rows = vec[i64]()
        self.more: dict[int, list[int]] = {}  # a call's other results' slots (its first is its slot)
        self.immediate: list[int] = []  # ready rows of the monad's own
        self.buckets: list[Bucket] = []
        self.bucket_of: dict[object, int] = {}  # a primitive or operation -> its bucket
        self.active: list[Bucket] = []  # the buckets with ready calls
        self.after: dict[Step, list[int]] = {}  # a step on the pool -> the rows it computes
        self.signatures: set[int] = set()
        self.body = ""  # the operation whose body this scheduler records (with ``outer``)
        self.grow()

    def grow(self) -> None:
        """Room in the per-row lists for every row of the graph (rows appended while it runs)."""
        n: i64 = len(self.graph.tags) - len(self.state)
        if n > 0:
            self.state = extend(self.state, vec[i64]([UNWALKED] * n))
            self.pending = extend(self.pending, vec[i64]([0] * n))
            minus = vec[i64]([-1] * n)
            self.slots = extend(self.slots, minus)
            self.rows = extend(self.rows, minus)
            self.values.extend([None] * n)
            self.buckets_of = extend(self.buckets_of, minus)
            self.dynamic = extend(self.dynamic, vec[bool]([False] * n))
            self.head = extend(self.head, minus)
            self.tail = extend(self.tail, minus)
        m: i64 = len(self.graph.args) - len(self.in_slots)
        if m > 0:
            minus = vec[i64]([-1] * m)
            self.in_slots = extend(self.in_slots, minus)
            self.in_rows = extend(self.in_rows, minus)

    # ------------------------------------------------------------------------------------- walk

    def walk(self, root: i64) -> None:
        """Gives the rows ``root`` reads that are not walked yet their state: leaves are done at
        once, the others wait for their inputs (``post``). Iterative: a graph 100,000 rows deep is
        a loop."""
        self.grow()
        state = self.state
        if state[root] != UNWALKED:
            return
        graph = self.graph
        starts, args = graph.starts, graph.args
        lowest: i64 = root
        count: i64 = 0
        stack = [root]
        while stack:
            r: i64 = stack.pop()
            if state[r] != UNWALKED:
                continue
            state[r] = FOUND
            count += 1
            if r < lowest:
                lowest = r
            for k in range(starts[r], starts[r + 1]):
                a = args[k]
                if state[a] == UNWALKED:
                    stack.append(a)
        # In their order (inputs before their consumers: rows are made after their inputs), by a
        # scan of the rows between: the rows a step's loss reads are most of its graph.
        tags = graph.tags
        r = lowest
        while count:
            if state[r] == FOUND:
                count -= 1
                state[r] = WAITING
                tag = tags[r]
                if tag == WEIGHT:
                    self.leaf(r, graph.objs[r], None)
                elif tag == CONST:
                    self.leaf(r, None, graph.objs[r])
                elif tag == NODE:
                    node = graph.objs[r]
                    ntag = node.tag
                    if ntag == BIND:
                        self.post(r, tag)
                    elif ntag == PURE:
                        assert type(node) is Pure
                        self.resolve(r, -1, -1, node.value)
                    else:  # a delay, a defer or a kernel: run by the loop
                        self.immediate.append(r)
                else:
                    self.post(r, tag)
            r += 1

    def post(self, r: i64, tag: i64) -> None:
        """A row whose inputs have been walked: its count of inputs not done, its bucket; ready at
        once if it waits for nothing."""
        graph = self.graph
        state = self.state
        tags = graph.tags
        args = graph.args
        slots = self.slots
        pending: i64 = 0
        for k in range(graph.starts[r], graph.starts[r + 1]):
            a = args[k]
            if tags[a] == NODE and slots[a] < 0:
                self.dynamic[r] = True  # an input of the monad's own: made a slot when it runs
            if state[a] != DONE:
                pending += 1
                self.edge(a, r)
        self.pending[r] = pending
        if tag == OP or tag == CALL:
            key: object = graph.objs[r] if tag == OP else graph.objs[r].op
            b = self.bucket_of.get(key, -1)
            if b < 0:
                b = self.bucket_of[key] = len(self.buckets)
                self.buckets.append(Bucket(b))
            bucket = self.buckets[b]
            bucket.total += graph.depths[r]
            bucket.count += 1
            self.buckets_of[r] = b
        if not pending:
            self.ready(r)

    def edge(self, source: i64, consumer: i64) -> None:
        """``consumer`` (or, negative, a follower: -1 - row) waits for ``source``."""
        e: i64 = len(self.edge_to)
        self.edge_to = append(self.edge_to, consumer)
        self.edge_next = append(self.edge_next, -1)
        last = self.tail[source]
        if last < 0:
            self.head[source] = e
        else:
            self.edge_next[last] = e
        self.tail[source] = e

    def leaf(self, r: int, weight: Any, data: Any) -> None:
        """A weight's or a constant's row: done at once, its slot read now."""
        run = self.run
        slot = run.new_slot(weight is not None)
        step = LeafStep(slot, self.bound.get(r, -1), weight, data)
        run.steps.append(step)
        step.forward(run, True)
        self.resolve(r, slot, -1, None)

    def ready(self, r: int) -> None:
        tag = self.graph.tags[r]
        if tag == OP or tag == CALL:
            bucket = self.buckets[self.buckets_of[r]]
            if not bucket.ready:
                self.active.append(bucket)
            bucket.ready.append(r)
        elif tag == RESULT:
            call = self.graph.args[self.graph.starts[r]]
            more = self.more[call]
            self.resolve(r, more[self.graph.params[r] - 1], self.rows[call], None)
        else:
            self.immediate.append(r)

    def resolve(self, r: i64, slot: i64, row: i64, value: Any) -> None:
        """Records row ``r``'s value and wakes what waited for it; a row that follows it (its value
        is this one's) is resolved in the same loop (a chain of 100,000 flat_maps is no recursion)."""
        followers: list[i64] | None = None
        while True:
            self.state[r] = DONE
            self.slots[r] = slot
            self.rows[r] = row
            self.values[r] = value
            e = self.head[r]
            if e >= 0:
                self.head[r] = -1
                self.tail[r] = -1
                edge_to, edge_next, pending = self.edge_to, self.edge_next, self.pending
                while e >= 0:
                    c = edge_to[e]
                    e = edge_next[e]
                    if c < 0:  # a follower: the same value
                        if followers is None:
                            followers = [-1 - c]
                        else:
                            followers.append(-1 - c)
                        continue
                    p = pending[c] - 1
                    pending[c] = p
                    if not p:
                        self.ready(c)
            if not followers:
                return
            r = followers.pop()

    def follow(self, r: int, then: object) -> None:
        """Row ``r``'s value is that of the ``Do`` ``then`` (a defer's, a flat_map's result)."""
        if not isinstance(then, Node):
            raise TypeError(f"defer: the thunk returned {type(then).__name__}, not a Do")
        target = self.row_of(then)
        self.walk(target)
        if self.state[target] == DONE:
            self.resolve(r, self.slots[target], self.rows[target], self.values[target])
        else:
            self.pending[r] = -1
            self.edge(target, -1 - r)

    def row_of(self, node: Node) -> int:
        """The row here of a ``Do`` that user code gave back."""
        graph = self.graph
        previous = swap_recording(graph)
        try:
            return graph.node(node)
        finally:
            swap_recording(previous)

    # ------------------------------------------------------------------------------------- loop

    def execute(self, roots: list[int]) -> None:
        """Walks ``roots`` and runs until nothing is left: ready rows of the monad's own first,
        then (with nothing in flight on the pool) the agenda's next bucket. The graph is the
        thread's recording graph meanwhile: the ops user code makes in a ``flat_map`` join it."""
        previous = enter_run(self.graph)
        try:
            for root in roots:
                self.walk(root)
            self.loop()
        except BaseException as error:
            if isinstance(error, Exception):
                drain_failed(self.dispatcher)
            self.discard()
            raise
        finally:
            leave_run(previous)

    def discard(self) -> None:
        """Drops what a failed run leaves waiting."""
        for bucket in self.buckets:
            bucket.ready = []
        self.immediate = []
        self.after = {}

    def loop(self) -> None:
        dispatcher = self.dispatcher
        while True:
            if self.immediate:
                self.run_dynamic(self.immediate.pop())
                continue
            if dispatcher is not None and dispatcher.pending:
                self.collect()  # the next bucket's signatures read what is in flight
                continue
            bucket = self.pick()
            if bucket is None:
                return
            ready = bucket.ready
            bucket.ready = []
            self.run_ready(ready)

    def pick(self) -> Bucket | None:
        """The active bucket that runs next: the lowest mean depth of its kind, the first made among
        equals."""
        active = self.active
        if not active:
            return None
        best = active[0]
        k = 0
        for i in range(1, len(active)):
            b = active[i]
            # best.total / best.count > b.total / b.count, without a division
            left = best.total * b.count
            right = b.total * best.count
            if left > right or (left == right and b.order < best.order):
                best = b
                k = i
        active[k] = active[-1]
        active.pop()
        return best

    def collect(self) -> None:
        """Takes one result from the pool: a step's value, or a kernel row's."""
        dispatcher = self.dispatcher
        assert dispatcher is not None
        token, owner, result = dispatcher.collect()
        if owner is None:
            self.resolve(token, -1, -1, result)
            return
        step: Step = token
        step.store(self.run, result)
        rows = self.after.pop(step)
        self.settle(step, rows)

    def run_dynamic(self, r: int) -> None:
        """Runs a ready row of the monad's own (user code: the ops it makes join the graph)."""
        node = self.graph.objs[r]
        tag = node.tag
        if tag == DELAY:
            assert type(node) is Delay
            value = node.thunk()
            self.grow()
            self.resolve(r, -1, -1, value)
        elif tag == DEFER:
            assert type(node) is Defer
            self.follow(r, node.thunk())
        elif tag == KERNEL:
            assert type(node) is Kernel
            self.kernel(r, node.fn, node.args, node.cost)
        else:
            assert type(node) is Bind
            graph = self.graph
            args = []
            for k in range(graph.starts[r], graph.starts[r + 1]):
                args.append(self.user_value(graph.args[k]))
            mode = node.mode
            if mode == MAP:
                value = node.f(*args)
                self.grow()
                self.resolve(r, -1, -1, value)
            elif mode == FLAT:
                then = node.f(*args)
                if not isinstance(then, Node):
                    name = getattr(node.f, "__qualname__", node.f)
                    raise TypeError(f"flat_map: {name!r} returned {type(then).__name__}, not a Do")
                self.follow(r, then)
            else:
                self.kernel(r, node.f, tuple(args), node.cost)

    def kernel(self, r: int, fn: Any, args: tuple[Any, ...], cost: Any) -> None:
        """A kernel of the user's own: inline, or on the pool if its cost is worth it."""
        self.run.stats.kernels += 1
        dispatcher = self.dispatcher
        if dispatcher is not None:
            if type(cost) is not float and type(cost) is not int:
                cost = cost()
            if cost >= dispatcher.min_cost:
                dispatcher.submit(fn, args, r, None, affinity_of(fn))
                return
        self.resolve(r, -1, -1, fn(*args))

    def user_value(self, r: int) -> Any:
        """A row's value as user code sees it: a tape for a row of the program (whose value is a
        slot, not a value of the monad's own)."""
        if self.values[r] is None and self.slots[r] >= 0:
            return RunTape(self.run, self.slots[r], self.rows[r])
        return self.values[r]

    # ------------------------------------------------------------------------------------ groups

    def inputs(self, r: int) -> None:
        """Row ``r``'s inputs' places, read into ``in_slots`` and ``in_rows`` (a monad's value made
        a slot first; a constant wider than the row's layers cast, see :func:`cast_constants`)."""
        graph = self.graph
        args = graph.args
        slots, rows = self.slots, self.rows
        lo, hi = graph.starts[r], graph.starts[r + 1]
        if self.dynamic[r]:
            for k in range(lo, hi):
                if slots[args[k]] < 0:
                    self.place(args[k], r)
        in_slots, in_rows = self.in_slots, self.in_rows
        for k in range(lo, hi):
            a = args[k]
            in_slots[k] = slots[a]
            in_rows[k] = rows[a]
        if hi - lo > 1 and graph.tags[r] == OP:
            cast_constants(self, lo, hi)

    def run_ready(self, ready: list[int]) -> None:
        """Runs a bucket's ready calls: calls of equal signature as one group each; an op that
        merges with nothing may still fan out with others; the rest alone."""
        graph = self.graph
        tags = graph.tags
        groups = batching.Groups()
        fans = batching.Groups()
        alone: list[int] = []
        for r in ready:
            self.inputs(r)
            if not self.batching:
                alone.append(r)
                continue
            is_op = tags[r] == OP
            key = batching.signature(self, r) if is_op else batching.call_signature(self, r)
            if key is not None:
                groups.join(key, r)
            elif not (is_op and fans.join(batching.fan_signature(self, r), r)):
                alone.append(r)
        for g in range(len(groups.rows)):
            group = groups.rows[g]
            if len(group) > 1:
                self.signatures.add(groups.hash_of(g))
                if tags[group[0]] == OP:
                    self.run_ops(group, False)
                else:
                    self.run_calls(group)
                continue
            r = group[0]
            if tags[r] == OP and fans.join(batching.fan_signature(self, r), r):
                continue
            self.signatures.add(groups.hash_of(g))  # (not for a call that fans out: its fan's counts)
            alone.append(r)
        for g in range(len(fans.rows)):
            group = fans.rows[g]
            self.signatures.add(fans.hash_of(g))
            if len(group) > 1:
                self.run_ops(group, True)
            else:
                alone.append(group[0])
        for r in alone:
            if tags[r] == OP:
                self.run_ops([r], False)
            else:
                self.run_calls([r])

    def run_ops(self, group: list[int], fan: bool) -> None:
        """Runs a group of ops (one alone, merged calls, or a fan), an error noted with where the
        user's code made its first op."""
        graph = self.graph
        first = group[0]
        try:
            if fan:
                step: Step = batching.fan(self, group)
            elif len(group) > 1:
                step = batching.merged(self, group)
            else:
                step = batching.alone(self, first)
            self.run.stats.kind_counts.tally(graph.objs[first].number)
            self.launch(step, group)
        except Exception as error:
            note_where(error, graph, first)
            raise

    def place(self, r: int, consumer: int) -> None:
        """A monad row's value as a slot: a tape of this run is its own slot; a literal's a
        constant's; a tape of the user's own a slot whose backward is the tape's own."""
        run = self.run
        value = self.values[r]
        if type(value) is RunTape and value.run is run:
            self.slots[r], self.rows[r] = value.slot, value.row
            return
        slot = run.new_slot(False)
        step: Step
        if type(value) is Tape or type(value) is RunTape:
            step = LeafStep(slot, -1, None, value.data)
        elif isinstance(value, Tape):
            value.acquire()
            run.wants[slot] = bool(value.requires_delta)
            step = ForeignStep(value, slot)
        else:
            raise TypeError(
                f"{self.name_of(consumer)}: expected a layer's value (a tape), got {type(value).__name__}"
            )
        run.steps.append(step)
        step.forward(run, True)
        self.slots[r], self.rows[r] = slot, -1

    def name_of(self, r: int) -> str:
        """A row's name for messages."""
        if r < 0:
            return "the root"
        tag = self.graph.tags[r]
        obj = self.graph.objs[r]
        if tag == OP:
            return str(obj.name)
        if tag == CALL:
            assert type(obj) is Call
            return f"batchable {obj.op.name}"
        return type(obj).__name__

    def launch(self, step: Step, rows: list[int]) -> None:
        """Appends ``step`` to the run and runs it (on the pool if it is heavy); then the rows it
        computes are done (one row: the slot; several: their rows of it)."""
        run = self.run
        run.steps.append(step)
        dispatcher = self.dispatcher
        if step.heavy and dispatcher is not None:
            self.after[step] = rows
            step.submit(run, dispatcher, True)
            return
        step.forward(run, True)
        self.settle(step, rows)

    def settle(self, step: Step, rows: list[int]) -> None:
        """The rows a step computed are done: one alone is its slot; a group's, its rows."""
        if len(rows) == 1:
            self.resolve(rows[0], step.out, -1, None)
            return
        out = step.out
        for k, r in enumerate(rows):
            self.resolve(r, out, k, None)

    def run_calls(self, group: list[int]) -> None:
        """Runs calls of one batchable operation (one call alone: its body on its own arguments, as
        the plain function) as one step (``bodies.py``); each call's results are rows of the
        step's. A group's program is kept by its signature and replayed for later groups."""
        run = self.run
        graph = self.graph
        starts = graph.starts
        in_slots, in_rows = self.in_slots, self.in_rows
        head = group[0]
        first: Call = graph.objs[head]
        op = first.op
        n = len(group) if len(group) > 1 else 0
        run.stats.kind_counts.tally(op.number)
        ins = []
        for i in range(starts[head + 1] - starts[head]):
            if n:
                slots = [in_slots[starts[c] + i] for c in group]
                ins.append(batching.stack_rows(run, slots, [in_rows[starts[c] + i] for c in group]))
            else:
                k = starts[head] + i
                ins.append(batching.slot_of(run, in_slots[k], in_rows[k]))
        key = bodies.body_key(run, first, ins, n, self.batching, self.min_cost)
        program: Program | None = self.bodies.get(key)
        if program is not None:
            step = bodies.replay(run, op, program, ins, n)
        else:
            dispatcher = self.dispatcher
            if n and dispatcher is not None:
                while dispatcher.pending:  # (a failed recording drains only its own kernels)
                    self.collect()
            try:
                step, keep = bodies.record(run, op, first, ins, n, self.run_body)
            except (ValueError, TypeError):
                if not n or not bodies.shares_arrays(first):
                    raise
                # A weight given as an argument is one value for all the calls: a body that uses
                # it as a row (concatenates it with rows) cannot run on the calls' stacked rows.
                for r in group:
                    self.run_calls([r])
                return
            if keep:
                self.bodies.put(key, step.program)
        more = step.outs[1:]
        out = step.outs[0]
        for k, r in enumerate(group):
            self.more[r] = more
            self.resolve(r, out, k if n else -1, None)

    def run_body(self, graph: Graph, frame: Run, name: str, roots: list[int]) -> list[int]:
        """Runs the body of batchable operation ``name`` (its ``graph``, from ``roots``) in
        ``frame`` by a scheduler of its own; the roots' slots in the frame."""
        inner = Scheduler(graph, frame, self.batching, {}, self.bodies, self)
        inner.body = name
        inner.execute(roots)
        outputs = []
        for root in roots:
            if inner.slots[root] < 0:
                inner.place(root, -1)
            outputs.append(batching.slot_of(frame, inner.slots[root], inner.rows[root]))
        self.signatures.update(inner.signatures)
        return outputs


# ------------------------------------------------------------------------------------------ helpers


def note_where(error: Exception, graph: Graph, r: int) -> None:
    """Adds to ``error`` where the user's code made the op of row ``r`` that raised it (the first
    such note stands: an error passing through a body's run keeps the innermost op's)."""
    if graph.tags[r] != OP or getattr(error, "__notes__", None):
        return
    where = graph.made_at(r)
    if where is not None:
        error.add_note(f"{graph.objs[r].name} was made at {where}")


def cast_constants(scheduler: Scheduler, lo: int, hi: int) -> None:
    """Makes an op's constant operands that are wider than its layers (a float64 array where the
    layers are float32) read as the layers' dtype: a model stays in its own dtype when it meets a
    constant, as a Python float already keeps an array's dtype. Layers (and weights) of different
    dtypes promote one another as the array namespace does. Only a step recorded here costs
    anything on later runs of the same structure (a replay runs its ``CastStep``); operands of one
    dtype cost a look at each dtype. (``lo``, ``hi``: the op's inputs in ``in_slots``.)"""
    datas = scheduler.run.datas
    in_slots = scheduler.in_slots
    first: Any = None
    for k in range(lo, hi):
        d = datas[in_slots[k]]
        if type(d) is not float:
            dtype = d.dtype
            if first is None:
                first = dtype
            elif dtype is not first and (type(dtype) is not type(first) or dtype != first):
                # (dtypes of two libraries are not compared: array-api-strict warns)
                _cast_wide(scheduler, lo, hi)
                return


def _cast_wide(scheduler: Scheduler, lo: int, hi: int) -> None:
    """``cast_constants`` for an op whose array operands' dtypes differ."""
    run = scheduler.run
    datas = run.datas
    wants = run.wants
    in_slots, in_rows = scheduler.in_slots, scheduler.in_rows
    xp: Any = None
    for k in range(lo, hi):
        d = datas[in_slots[k]]
        if type(d) is not float:
            x = namespace(d)
            if xp is None:
                xp = x
            elif x is not xp:
                return  # arrays of two namespaces: the op itself says they do not mix
    layers: Any = None  # the dtype the layers' operands promote to
    for k in range(lo, hi):
        d = datas[in_slots[k]]
        if type(d) is not float and wants[in_slots[k]]:
            layers = d.dtype if layers is None else xp.result_type(layers, d.dtype)
    if layers is None:  # constants alone (or with float layers): the namespace's promotion
        return
    for k in range(lo, hi):
        s = in_slots[k]
        d = datas[s]
        if type(d) is float or wants[s]:
            continue
        dtype = d.dtype
        if dtype == layers or not xp.isdtype(dtype, "real floating"):
            continue
        if xp.result_type(layers, dtype) == layers:
            continue  # narrower: the op's promotion keeps the layers' dtype anyway
        key = (s, in_rows[k], str(layers))
        slot = run.casts.get(key, -1)
        if slot < 0:
            source = batching.slot_of(run, s, in_rows[k])
            slot = run.casts[key] = run.new_slot(False)
            step = CastStep(source, layers, slot)
            run.steps.append(step)
            step.forward(run, True)
        in_slots[k] = slot
        in_rows[k] = -1
