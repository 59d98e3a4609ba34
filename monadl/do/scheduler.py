"""The scheduler: one loop that runs a ``Do``, an agenda of ready work whose equal calls merge.

It walks the graph from the root (iteratively: a graph 100,000 nodes deep is a loop, not a
recursion), gives every node an :class:`~monadl.do.record.Entry`, and counts for each the sources
not yet done. A node whose sources are done is *ready*. Ready nodes of the monad's own (``map``,
``flat_map``, kernels, ``delay``, ``defer``) run first, since what they reveal may join the agenda;
ready ops and batchable calls wait on the agenda in *buckets*, one per primitive or batchable
operation, and the loop runs one bucket at a time, its calls of equal signature merged
(``batching.py``). The bucket whose calls lie shallowest on average runs first (DyNet's agenda), so
that a deep kind of call (a classifier over every state of an LSTM) waits until all its calls are
ready, while the ops of the chains that feed it run level by level.

Everything the loop computes is a step appended to the run's record (``record.py``). A group of a
batchable operation's calls runs the operation's body on their stacked rows, in a frame of its own:
the body's program, recorded on the first group of its signature and replayed for the later ones.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any, Final, cast

from monadl.do import batching
from monadl.do.bodies import run_calls
from monadl.do.do import (
    APPLY,
    BIND,
    CALL,
    DEFER,
    DELAY,
    FLAT,
    KERNEL,
    MAP,
    PURE,
    RESULT,
    VARIABLE,
    Apply,
    Bind,
    Call,
    Defer,
    Delay,
    Kernel,
    Node,
    Pure,
    Result,
    Variable,
    postorder,
)
from monadl.do.record import Entry, Recent, Run, RunTape
from monadl.do.stats import tally
from monadl.do.steps import CastStep, ForeignStep, LeafStep, Step
from monadl.do.tape import Tape
from monadl.runtime.pool import Dispatcher, affinity_of, draining
from monadl.typeclasses.backend import namespace

_WALKED: Final = Entry(Pure(None))  # a node walked whose entry is not made yet


class Bucket:
    """Ready calls waiting on the agenda; ``total`` and ``count``: the depths of the calls of its kind
    walked so far (its priority is their mean), ``order``: its place among equals."""

    def __init__(self, order: int) -> None:
        self.ready: list[Entry] = []
        self.total = 0
        self.count = 0
        self.order = order


class Scheduler:
    """One frame's interpretation of a ``Do`` (see the module). ``bound``: the positions of a static
    graph's bound nodes (``executor.structure_of``), which its steps name so that a replay reads its
    own; ``outer``: the scheduler of the run whose batchable body this one records."""

    def __init__(
        self,
        run: Run,
        batching_on: bool,
        bound: dict[Node, int],
        bodies: Recent,
        outer: Scheduler | None = None,
    ) -> None:
        self.run = run
        self.batching = batching_on
        self.bound = bound
        self.bodies = bodies
        self.outer = outer
        self.dispatcher: Dispatcher | None = run.dispatcher
        self.min_cost = batching.NO_POOL if run.dispatcher is None else run.dispatcher.min_cost
        self.ids: dict[Node, Entry] = {}
        self.immediate: list[Entry] = []  # ready nodes of the monad's own
        self.buckets: list[Bucket] = []
        self.bucket_of: dict[object, int] = {}  # a primitive or operation -> its bucket
        self.active: list[Bucket] = []  # the buckets with ready calls
        self.after: dict[Step, list[Entry]] = {}  # a step on the pool -> the entries it computes
        self.signatures: set[int] = set()
        self.body = ""  # the operation whose body this scheduler records (with ``outer``)

    # ------------------------------------------------------------------------------------- walk

    def walk(self, root: Node) -> None:
        """Gives the nodes of ``root``'s graph not walked yet their entries: leaves are done at once,
        the others wait for their sources (``post``)."""
        ids = self.ids
        order = postorder(root, ids, _WALKED)
        assert order is not None
        for node in order:
            tag = node.tag
            if tag >= APPLY or tag == BIND:
                if self.outer is not None and node in self.outer.ids:
                    raise RuntimeError(
                        f"batchable {self.body}: its body reads a layer computed outside it: pass "
                        "that layer to it as an argument"
                    )
                entry = ids[node] = Entry(node)
                self.post(entry)
            elif tag == VARIABLE:
                assert type(node) is Variable
                self.leaf(node, node.weight, None)
            elif tag == PURE:
                assert type(node) is Pure
                value = node.value
                if type(value) is Tape:
                    self.leaf(node, None, value.data)
                else:
                    entry = ids[node] = Entry(node)
                    self.resolve(entry, -1, -1, value)
            else:  # a delay, a defer or a kernel: run by the loop
                entry = ids[node] = Entry(node)
                self.immediate.append(entry)

    def post(self, entry: Entry) -> None:
        """An entry whose sources have been walked: its count of sources not done, its depth, its
        bucket; ready at once if it waits for nothing."""
        node = entry.node
        ids = self.ids
        pending = 0
        depth = 0
        inputs = [ids[s] for s in node.sources]
        for e in inputs:
            if e.slot < 0 and e.node.tag < VARIABLE:
                entry.dynamic = True  # an input of the monad's own: made a slot when it runs
            if not e.done:
                pending += 1
                if e.consumer is None:
                    e.consumer = entry
                elif e.consumers is None:
                    e.consumers = [entry]
                else:
                    e.consumers.append(entry)
            if e.depth > depth:
                depth = e.depth
        entry.inputs = inputs
        entry.pending = pending
        tag = node.tag
        if tag == APPLY or tag == CALL:
            depth += 1
            # a bucket per primitive or operation (their calls' signatures are told apart when they run)
            key: object = node.prim if type(node) is Apply else cast(Call, node).op
            b = self.bucket_of.get(key, -1)
            if b < 0:
                b = self.bucket_of[key] = len(self.buckets)
                self.buckets.append(Bucket(b))
            bucket = self.buckets[b]
            bucket.total += depth
            bucket.count += 1
            entry.bucket = b
        elif tag != RESULT:
            depth += 1
        entry.depth = depth
        if not pending:
            self.ready(entry)

    def leaf(self, node: Node, weight: Any, data: Any) -> None:
        """A weight's or a constant's node: done at once, its slot read now."""
        run = self.run
        slot = run.new_slot(weight is not None)
        step = LeafStep(slot, self.bound.get(node, -1), weight, data)
        run.steps.append(step)
        step.forward(run, True)
        entry = self.ids[node] = Entry(node)
        self.resolve(entry, slot, -1, None)

    def ready(self, entry: Entry) -> None:
        tag = entry.node.tag
        if tag == APPLY or tag == CALL:
            bucket = self.buckets[entry.bucket]
            if not bucket.ready:
                self.active.append(bucket)
            bucket.ready.append(entry)
        elif tag == RESULT:
            call = entry.inputs[0]
            more = call.more
            assert more is not None and type(entry.node) is Result
            self.resolve(entry, more[entry.node.index - 1], call.row, None)
        else:
            self.immediate.append(entry)

    def resolve(self, entry: Entry, slot: int, row: int, value: Any) -> None:
        """Records ``entry``'s value and wakes what waited for it; an entry that follows it (its
        value is this one's) is resolved in a loop (a chain of 100,000 flat_maps is no recursion)."""
        while True:
            entry.slot = slot
            entry.row = row
            entry.value = value
            entry.done = True
            first = entry.consumer
            if first is None:
                return
            entry.consumer = None
            follower = self.wake(first)
            consumers = entry.consumers
            if consumers is not None:
                entry.consumers = None
                for c in consumers:
                    then = self.wake(c)
                    if then is not None:
                        if follower is not None:
                            self.resolve(follower, slot, row, value)
                        follower = then
            if follower is None:
                return
            entry = follower

    def wake(self, consumer: Entry) -> Entry | None:
        """One source of ``consumer`` is done: it is ready if that was the last. Returns it instead
        if it follows that source (its value is the source's: the caller resolves it)."""
        if consumer.pending < 0:
            return consumer
        consumer.pending -= 1
        if not consumer.pending:
            self.ready(consumer)
        return None

    def follow(self, entry: Entry, then: Node) -> None:
        """``entry``'s value is ``then``'s (a defer, a flat_map's result)."""
        if then not in self.ids:
            self.walk(then)
        target = self.ids[then]
        if target.done:
            self.resolve(entry, target.slot, target.row, target.value)
        else:
            entry.pending = -1  # (it follows the one entry it waits for)
            if target.consumer is None:
                target.consumer = entry
            elif target.consumers is None:
                target.consumers = [entry]
            else:
                target.consumers.append(entry)

    # ------------------------------------------------------------------------------------- loop

    def execute(self, roots: list[Node]) -> None:
        """Walks ``roots`` and runs until nothing is left: ready nodes of the monad's own first,
        then (with nothing in flight on the pool) the agenda's next bucket."""
        try:
            with draining(self.dispatcher):
                for root in roots:
                    self.walk(root)
                self.loop()
        except BaseException:
            self.discard()
            raise

    def discard(self) -> None:
        """Drops what a failed run leaves waiting (an entry's consumers hold entries that hold it
        among their inputs: a reference cycle, which a finished run never leaves)."""
        for entry in self.ids.values():
            entry.consumer = None
            entry.consumers = None
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
        """Takes one result from the pool: a step's value, or a kernel node's."""
        dispatcher = self.dispatcher
        assert dispatcher is not None
        token, owner, result = dispatcher.collect()
        if owner is None:
            self.resolve(token, -1, -1, result)
            return
        step: Step = token
        step.store(self.run, result)
        entries = self.after.pop(step)
        self.settle(step, entries)

    def run_dynamic(self, entry: Entry) -> None:
        """Runs a ready node of the monad's own."""
        node = entry.node
        tag = node.tag
        if tag == DELAY:
            assert type(node) is Delay
            self.resolve(entry, -1, -1, node.thunk())
        elif tag == DEFER:
            assert type(node) is Defer
            then = node.thunk()
            if not isinstance(then, Node):
                raise TypeError(f"defer: the thunk returned {type(then).__name__}, not a Do")
            self.follow(entry, then)
        elif tag == KERNEL:
            assert type(node) is Kernel
            self.kernel(entry, node.fn, node.args, node.cost)
        else:
            assert type(node) is Bind
            args = []
            for e in entry.inputs:
                args.append(self.user_value(e))
            mode = node.mode
            if mode == MAP:
                self.resolve(entry, -1, -1, node.f(*args))
            elif mode == FLAT:
                then = node.f(*args)
                if not isinstance(then, Node):
                    name = getattr(node.f, "__qualname__", node.f)
                    raise TypeError(f"flat_map: {name!r} returned {type(then).__name__}, not a Do")
                self.follow(entry, then)
            else:
                self.kernel(entry, node.f, tuple(args), node.cost)

    def kernel(self, entry: Entry, fn: Any, args: tuple[Any, ...], cost: Any) -> None:
        """A kernel of the user's own: inline, or on the pool if its cost is worth it."""
        self.run.stats.kernels += 1
        dispatcher = self.dispatcher
        if dispatcher is not None:
            if type(cost) is not float and type(cost) is not int:
                cost = cost()
            if cost >= dispatcher.min_cost:
                dispatcher.submit(fn, args, entry, None, affinity_of(fn))
                return
        self.resolve(entry, -1, -1, fn(*args))

    def user_value(self, entry: Entry) -> Any:
        """A node's value as user code sees it: a tape for a node of the program (whose value is a
        slot, not a value of the monad's own)."""
        if entry.value is None and entry.slot >= 0:
            return RunTape(self.run, entry.slot, entry.row)
        return entry.value

    # ------------------------------------------------------------------------------------ groups

    def run_ready(self, entries: list[Entry]) -> None:
        """Runs a bucket's ready calls: calls of equal signature as one group each; an op that
        merges with nothing may still fan out with others; the rest alone."""
        run = self.run
        groups: dict[Hashable, list[Entry]] = {}
        fans: dict[Hashable, list[Entry]] = {}
        alone: list[Entry] = []
        for entry in entries:
            if entry.dynamic:
                self.place_inputs(entry)
            if entry.node.tag == APPLY and len(entry.inputs) > 1:
                cast_constants(run, entry)
            if not self.batching:
                alone.append(entry)
                continue
            is_op = entry.node.tag == APPLY
            key = (
                batching.signature(run, entry, self.min_cost)
                if is_op
                else batching.call_signature(run, entry)
            )
            try:
                if key is None:
                    if is_op and _join(fans, batching.fan_signature(run, entry), entry):
                        continue
                    alone.append(entry)
                else:
                    _join(groups, key, entry)
            except TypeError:  # an unhashable parameter: it runs alone
                alone.append(entry)
        for key, group in groups.items():
            if len(group) > 1:
                self.signatures.add(hash(key))
                if group[0].node.tag == APPLY:
                    self.run_ops(group, False)
                else:
                    run_calls(self, group)
                continue
            entry = group[0]
            if entry.node.tag == APPLY and _join(fans, batching.fan_signature(run, entry), entry):
                continue
            self.signatures.add(hash(key))
            alone.append(entry)
        for key, group in fans.items():
            self.signatures.add(hash(key))
            if len(group) > 1:
                self.run_ops(group, True)
            else:
                alone.append(group[0])
        for entry in alone:
            if entry.node.tag == APPLY:
                self.run_ops([entry], False)
            else:
                run_calls(self, [entry])

    def run_ops(self, group: list[Entry], fan: bool) -> None:
        """Runs a group of ops (one alone, merged calls, or a fan), an error noted with where the
        user's code made its first op."""
        run = self.run
        node = group[0].node
        assert type(node) is Apply
        try:
            if fan:
                step: Step = batching.fan(run, group, self.min_cost)
            elif len(group) > 1:
                step = batching.merged(run, group, self.bound, self.min_cost)
            else:
                step = batching.alone(run, group[0], self.bound, self.min_cost)
            tally(self.run.stats.kinds, node.prim.name)
            self.launch(step, group)
        except Exception as error:
            note_where(error, node)
            raise

    def place_inputs(self, entry: Entry) -> None:
        """Gives each of a node's inputs a slot (a dynamic node's tape made one)."""
        for e in entry.inputs:
            if e.slot < 0:
                self.place(e, entry.node)

    def place(self, entry: Entry, consumer: object) -> None:
        """A dynamic node's value as a slot: a tape of this run is its own slot; a literal's a
        constant's; a tape of the user's own a slot whose backward is the tape's own."""
        run = self.run
        value = entry.value
        if type(value) is RunTape and value.run is run:
            entry.slot, entry.row = value.slot, value.row
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
                f"{name_of(consumer)}: expected a layer's value (a tape), got {type(value).__name__}"
            )
        run.steps.append(step)
        step.forward(run, True)
        entry.slot, entry.row = slot, -1

    def launch(self, step: Step, entries: list[Entry]) -> None:
        """Appends ``step`` to the run and runs it (on the pool if it is heavy); then the entries it
        computes are done (one entry: the slot; several: their rows of it)."""
        run = self.run
        run.steps.append(step)
        dispatcher = self.dispatcher
        if step.heavy and dispatcher is not None:
            self.after[step] = entries
            step.submit(run, dispatcher, True)
            return
        step.forward(run, True)
        self.settle(step, entries)

    def settle(self, step: Step, entries: list[Entry]) -> None:
        """The entries a step computed are done: one alone is its slot; a group's, its rows."""
        if len(entries) == 1:
            self.resolve(entries[0], step.out, -1, None)
            return
        for k, entry in enumerate(entries):
            self.resolve(entry, step.out, k, None)

    def nested(self, frame: Run, name: str) -> Scheduler:
        """A scheduler of its own for the body of batchable operation ``name``, run in ``frame``."""
        inner = Scheduler(frame, self.batching, {}, self.bodies, self)
        inner.body = name
        return inner


# ------------------------------------------------------------------------------------------ helpers


def name_of(consumer: object) -> str:
    """A node's (or an operation's) name for messages."""
    if type(consumer) is str:
        return consumer
    if type(consumer) is Apply:
        return consumer.prim.name
    if type(consumer) is Call:
        return f"batchable {consumer.op.name}"
    return type(consumer).__name__


def note_where(error: Exception, node: Node) -> None:
    """Adds to ``error`` where the user's code made the op that raised it (the first such note
    stands: an error passing through a body's run keeps the innermost op's)."""
    if type(node) is not Apply or getattr(error, "__notes__", None):
        return
    where = node.made_at()
    if where is not None:
        error.add_note(f"{node.prim.name} was made at {where}")


def cast_constants(run: Run, entry: Entry) -> None:
    """Makes an op's constant operands that are wider than its layers (a float64 array where the
    layers are float32) read as the layers' dtype: a model stays in its own dtype when it meets a
    constant, as a Python float already keeps an array's dtype. Layers (and weights) of different
    dtypes promote one another as the array namespace does. Only a step recorded here costs
    anything on later runs of the same structure (a replay runs its ``CastStep``); operands of one
    dtype cost a look at each dtype."""
    datas = run.datas
    first: Any = None
    for e in entry.inputs:
        d = datas[e.slot]
        if type(d) is not float:
            dtype = d.dtype
            if first is None:
                first = dtype
            elif dtype is not first and (type(dtype) is not type(first) or dtype != first):
                # (dtypes of two libraries are not compared: array-api-strict warns)
                _cast_wide(run, entry)
                return


def _cast_wide(run: Run, entry: Entry) -> None:
    """``cast_constants`` for an op whose array operands' dtypes differ."""
    datas = run.datas
    wants = run.wants
    inputs = entry.inputs
    xp: Any = None
    for e in inputs:
        d = datas[e.slot]
        if type(d) is not float:
            x = namespace(d)
            if xp is None:
                xp = x
            elif x is not xp:
                return  # arrays of two namespaces: the op itself says they do not mix
    layers: Any = None  # the dtype the layers' operands promote to
    for e in inputs:
        d = datas[e.slot]
        if type(d) is not float and wants[e.slot]:
            layers = d.dtype if layers is None else xp.result_type(layers, d.dtype)
    if layers is None:  # constants alone (or with float layers): the namespace's promotion
        return
    for i, e in enumerate(inputs):
        d = datas[e.slot]
        if type(d) is float or wants[e.slot]:
            continue
        dtype = d.dtype
        if dtype == layers or not xp.isdtype(dtype, "real floating"):
            continue
        if xp.result_type(layers, dtype) == layers:
            continue  # narrower: the op's promotion keeps the layers' dtype anyway
        key = (e.slot, e.row, str(layers))
        slot = run.casts.get(key, -1)
        if slot < 0:
            source = batching.slot_of(run, e.slot, e.row)
            slot = run.casts[key] = run.new_slot(False)
            step = CastStep(source, layers, slot)
            run.steps.append(step)
            step.forward(run, True)
        cast = Entry(e.node)
        cast.slot = slot
        cast.done = True
        inputs[i] = cast


def _join(groups: dict[Hashable, list[Entry]], key: Hashable | None, entry: Entry) -> bool:
    """Adds ``entry`` to the group of ``key``; False if there is no key."""
    if key is None:
        return False
    group = groups.get(key)
    if group is None:
        groups[key] = [entry]
    else:
        group.append(entry)
    return True
