"""Straight-line runs: a static graph run as a list of ops.

The executor interprets a ``Do`` node by node: fibers, lazy deltas, reference-counted tapes. That is
what lets it look through ``flat_map``s and data-dependent control flow and merge equal calls as it
goes. A graph that is visible before it runs needs none of it: ops on weights and constants only
(no ``flat_map`` of the user's, no ``@batchable`` calls, no tapes of the user's own). Such a graph
(the CIFAR column model, most feed-forward models) is run here as a list of ops, forward in the
order of a depth-first walk, then backward in reverse order:

* forward, each op computes exactly what its tape would (``apply.forward_data``: the same checks,
  the same errors naming the op and the shapes);
* backward, a node's delta is the sum of its consumers' deltas, summed as they arrive; its vjps
  (``apply.input_delta``) run only for the inputs on a path to a weight, and a weight's gradient is
  its summed delta;

so the results are the executor's, without its per-node bookkeeping. Planned batching
(``monadl.dsl.fold``) runs its merged groups as such a program too, grown a depth at a time
(:meth:`Program.add`, :meth:`Program.forward_merging`). On an executor with a pool,
the ops are taken by depth instead (independent ones, such as the columns of a model, come
together), and the kernels that cost ``min_pool_cost`` or more run on the pool while this thread
goes on with the rest, as the executor's own runs do; when it has to wait for one, it runs the
kernels no worker has started yet itself. ``Executor(planning=False)`` turns this off,
with planned batching (``monadl.dsl.fold``).
"""

from __future__ import annotations

import queue
from collections.abc import Callable
from typing import Any, NoReturn

from monadl.do.batching import RunStats
from monadl.do.do import FLAT, Bind, Delay, Do, Pure
from monadl.do.executor import Executor
from monadl.do.workers import Done, WorkerPool
from monadl.dsl.apply import _Build, forward_data, input_delta
from monadl.dsl.batching import params_items
from monadl.dsl.weights import _WeightState
from monadl.tape.batch import result_row, row_of, value_key
from monadl.tape.tape import Tape
from monadl.typeclasses.backend import minus_zeros, namespace
from monadl.typeclasses.sparse import SparseRows, add, add_into

_WEIGHT_FORWARD = _WeightState._tape  # a weight's forward: Delay(weight._tape)


class Program:
    """A walked graph and, once :meth:`forward` ran, its nodes' values.

    Node ``k`` (in the walk's post-order: inputs before their consumers, the root last) is a
    constant (``ops[k]`` None, ``weights[k]`` None), a weight (``weights[k]``), or an op
    (``ops[k]``, a ``_Build``, of ``inputs[k]``, its input nodes)."""

    __slots__ = (
        "args",
        "costs",
        "datas",
        "deltas",
        "depths",
        "index",
        "inputs",
        "kernels",
        "merged",
        "ops",
        "owned",
        "saved",
        "wants",
        "weights",
        "xps",
    )

    def __init__(self) -> None:
        self.index: dict[Do[Any], int] = {}  # node -> its position; -1 while its inputs are walked
        self.ops: list[_Build | None] = []
        self.inputs: list[tuple[int, ...]] = []
        self.weights: list[Any] = []
        self.datas: list[Any] = []
        self.wants: list[bool] = []  # whether a node depends on a weight (its tape would want a delta)
        self.args: list[Any] = []  # an op's inputs' data, as it was given them
        self.saved: list[Any] = []  # what an op saved for its vjps, or its result
        self.xps: list[Any] = []
        self.costs: list[float] = []  # an op's cost, where a pool asked for it
        # During backward: a node's delta so far, summed as its consumers give them (so a weight
        # used many times holds one sum, not all its deltas), and whether that sum is a fresh value
        # of ours (else it may be another node's delta too, and is not added into in place).
        self.deltas: list[Any] = []
        self.owned: list[bool] = []
        self.kernels = 0
        self.depths: list[int] = []  # by node: one more than its deepest input's (a leaf's is 0)
        self.merged: dict[int, Merged] = {}  # ops run as one kernel (forward_merging), by member

    def add(self, root: Do[Any]) -> int | None:
        """Walks the nodes of ``root``'s graph that are not in the program yet and appends them
        (inputs before consumers; an op's value is computed by the next :meth:`forward`); returns
        ``root``'s position, or None at the first node of a kind a program cannot hold (then the
        program is unusable)."""
        index = self.index
        found = index.get(root)
        if found is not None:
            return found
        ops, inputs, weights, datas, wants = self.ops, self.inputs, self.weights, self.datas, self.wants
        position = index.__getitem__
        stack: list[Any] = [root]  # nodes to walk, and (node,) once their inputs are walked
        while stack:
            item = stack.pop()
            kind = type(item)
            if kind is tuple:
                node = item[0]
                index[node] = len(ops)
                ops.append(node.f)
                ins = tuple(map(position, node.sources))
                inputs.append(ins)
                weights.append(None)
                datas.append(None)
                wanted = False  # whether an input wants a delta, by a loop: any() of a map costs more
                for i in ins:
                    if wants[i]:
                        wanted = True
                        break
                wants.append(wanted)
                continue
            if item in index:
                continue
            # Exact types: the forward graph of ops is made of these (apply_primitive, weights,
            # literals); anything else (a user's flat_map, a batchable call, a tape of the user's
            # own) is the executor's to run.
            if kind is Bind:
                if item.mode != FLAT or type(item.f) is not _Build:
                    return None
                index[item] = -1
                stack.append((item,))
                for source in reversed(item.sources):  # walked in order
                    if source not in index:
                        stack.append(source)
                continue
            if kind is Pure:
                tape = item.value
                if type(tape) is not Tape:  # a tape of the user's own, or an executor's
                    return None
                weight = None
                data = tape.data
            elif kind is Delay and getattr(item.thunk, "__func__", None) is _WEIGHT_FORWARD:
                weight = item.thunk.__self__
                data = weight.data
            else:
                return None
            index[item] = len(ops)
            ops.append(None)
            inputs.append(())
            weights.append(weight)
            datas.append(data)
            wants.append(weight is not None)
        n = len(ops) - len(self.saved)
        for column in (self.saved, self.xps, self.args):
            column += [None] * n
        return index[root]

    def forward_merging(self, start: int = 0) -> None:
        """Runs the ops from node ``start`` on, a depth at a time, with equal ops of one depth run as
        one kernel (as the executor's dynamic batching does), forward and then backward:

        * calls that fan out (``Batching.fan``: ``linear`` of one input with different weights, a
          Tree-LSTM cell's gates), whose other inputs are leaves (weights, constants);
        * elementwise ops of one primitive and parameters on arrays of one shape and dtype (a
          cell's sigmoids), their inputs stacked as rows.

        Then :meth:`backward` goes by depth too. For one thread (the pool's versions do not merge)."""
        ops, depths = self.ops, self._depths()
        level: dict[int, list[int]] = {}
        for k in range(start, len(ops)):
            if ops[k] is not None:
                level.setdefault(depths[k], []).append(k)
        for d in sorted(level):
            groups: dict[tuple[Any, ...], list[int]] = {}
            for k in level[d]:
                key = self._merge_key(k)
                if key is None:
                    self._compute_one(k)
                else:
                    groups.setdefault(key, []).append(k)
            for key, members in groups.items():
                if len(members) == 1:
                    self._compute_one(members[0])
                else:
                    self._merged_forward(members, key[0] == "fan")

    def _merge_key(self, k: int) -> tuple[Any, ...] | None:
        """Op ``k``'s signature among the ops of its depth (equal ones run as one kernel), or None."""
        build = self.ops[k]
        assert build is not None
        spec = build.prim.batch
        if spec is None or not (spec.elementwise or spec.fan is not None):
            return None
        params = params_items(build.params)
        if params is None:
            return None
        ins, ops, datas = self.inputs[k], self.ops, self.datas
        fan = spec.fan
        if fan is not None:
            if any(ops[i] is not None for j, i in enumerate(ins) if j not in fan.shared):
                return None  # stacked inputs must be leaves: known before anything runs
            values = [i if j in fan.shared else value_key(datas[i]) for j, i in enumerate(ins)]
            return ("fan", build.prim, params, *values)
        first = datas[ins[0]]
        if type(first) is float or any(type(datas[i]) is not type(first) for i in ins):
            return None
        if any(datas[i].shape != first.shape or datas[i].dtype != first.dtype for i in ins):
            return None  # arrays of one shape only: stacked as rows, they broadcast as they did
        return ("rows", build.prim, params, len(ins), type(first), first.shape, first.dtype)

    def _compute_one(self, k: int) -> None:
        build = self.ops[k]
        assert build is not None
        args = self.args[k] = self._args(k)
        self._computed(k, forward_data(build.prim, build.params, args))

    # --------------------------------------------------------------------------- one thread

    def forward(self, start: int = 0) -> Any:
        """Runs the ops in order (those from node ``start`` on); returns the last node's value."""
        inputs, datas, all_args, saved, xps = self.inputs, self.datas, self.args, self.saved, self.xps
        ops = self.ops
        data_of = datas.__getitem__
        for k in range(start, len(ops)):  # the loop of every op: written out, no helpers
            build = ops[k]
            if build is not None:
                args = all_args[k] = tuple(map(data_of, inputs[k]))
                prim = build.prim
                xps[k], data, s = forward_data(prim, build.params, args)
                datas[k] = data
                saved[k] = s if prim.saves else data
                self.kernels += 1
        return datas[-1]

    def backward(self, seed: Any, root: int = -1) -> dict[Any, Any]:
        """Backpropagates ``seed``, the delta of node ``root`` (by default the last); returns every
        weight's summed delta."""
        root = self._start_backward(seed, root)
        wanted = self.wants
        ops, inputs, datas, deltas = self.ops, self.inputs, self.datas, self.deltas
        gradients: dict[Any, Any] = {}
        merged = self.merged
        # By depth when ops were merged: a group's members are of one depth, so every consumer of
        # every member has given its delta when the group's backward runs (at its member placed
        # first in the program, whichever the depth order meets last), and no input of a member
        # has been passed yet.
        order = reversed(self._by_depth()) if merged else range(root, -1, -1)
        for k in order:
            if merged:
                group = merged.get(k)
                if group is not None:
                    if group.members[0] == k:
                        self._merged_backward(group)
                    continue
            delta = deltas[k]
            if delta is None or not wanted[k]:
                continue
            deltas[k] = None
            build = ops[k]
            if build is None:
                self._gradient(gradients, k, delta)
                continue
            prim, params, xp, args, saved = build.prim, build.params, self.xps[k], self.args[k], self.saved[k]
            passes = prim.passes and type(datas[k]) is float
            for j, i in enumerate(inputs[k]):
                if wanted[i]:
                    if passes and type(args[j]) is float:  # the delta passes through: no kernel
                        self._give(i, delta)
                    else:
                        self._give(i, input_delta(prim, params, xp, args, saved, delta, j, False))
                        self.kernels += 1
        return gradients

    # ------------------------------------------------------------------------------ a pool

    def forward_on(self, pool: WorkerPool, min_cost: float, start: int = 0) -> Any:
        """:meth:`forward`, with the ops that cost ``min_cost`` or more run on ``pool`` and the
        ops taken by depth, so that independent ones (columns of a model) run at the same time."""
        ops = self.ops
        costs = self.costs
        costs += [0.0] * (len(ops) - len(costs))
        running: set[int] = set()  # ops on the pool

        def arrived(k: int, result: Any) -> None:
            running.discard(k)
            self._computed(k, result)

        with _Jobs(pool, arrived) as jobs:
            for k in self._by_depth(start):
                build = ops[k]
                if build is None:
                    continue
                for i in self.inputs[k]:
                    while i in running:
                        jobs.collect()
                args = self.args[k] = self._args(k)
                prim, params = build.prim, build.params
                try:
                    cost = costs[k] = prim.cost(*args, **params)
                except Exception:  # noqa: BLE001 - inputs the op rejects: its own check says how
                    cost = 0.0
                if cost >= min_cost:
                    running.add(k)
                    jobs.submit(forward_data, (prim, params, args), self._affinity(k), k)
                else:
                    self._computed(k, forward_data(prim, params, args))
        return self.datas[-1]

    def backward_on(self, pool: WorkerPool, min_cost: float, seed: Any, root: int = -1) -> dict[Any, Any]:
        """:meth:`backward`, with the vjps of ops that cost ``min_cost`` or more run on ``pool``."""
        root = self._start_backward(seed, root)
        wanted = self.wants
        ops, gradients = self.ops, dict[Any, Any]()
        coming = [0] * len(ops)  # a node's deltas still on the pool

        def arrived(i: int, g: Any) -> None:
            coming[i] -= 1
            self._give(i, g)

        with _Jobs(pool, arrived) as jobs:
            for k in reversed(self._by_depth()):
                while coming[k]:
                    jobs.collect()
                delta = self.deltas[k]
                if delta is None or not wanted[k]:
                    continue
                self.deltas[k] = None
                build = ops[k]
                if build is None:
                    self._gradient(gradients, k, delta)
                    continue
                heavy = self.costs[k] >= min_cost
                for j, i, passes in self._vjps(k, wanted):
                    if passes:
                        self._give(i, delta)
                    elif heavy:
                        coming[i] += 1
                        self.kernels += 1
                        rule = (build.prim, build.params, self.xps[k], self.args[k], self.saved[k])
                        jobs.submit(input_delta, (*rule, delta, j, False), self._affinity(k), i)
                    else:
                        self._give(i, self._vjp(k, j, delta))
        return gradients

    # -------------------------------------------------------------------------- merged ops

    def _merged_forward(self, members: list[int], fan: bool) -> None:
        """The merged kernel of ``members``: each member's value is a row of its result. Every
        member's own check runs first, so that an error names its shapes."""
        build = self.ops[members[0]]
        assert build is not None
        prim, params = build.prim, build.params
        spec = prim.batch
        assert spec is not None
        datas, inputs = self.datas, self.inputs
        calls = [tuple([datas[i] for i in inputs[m]]) for m in members]
        if prim.check is not None:
            for call in calls:
                prim.check(*call, **params)
        shared: tuple[int, ...] = ()
        if fan:
            assert spec.fan is not None
            shared = spec.fan.shared
            xp = namespace(calls[0][shared[0]])
            args = tuple(
                calls[0][j] if j in shared else tuple([c[j] for c in calls]) for j in range(len(calls[0]))
            )
            out = saved = spec.fan.forward(xp, *args, **params)
            vjps = spec.fan.vjps
        else:
            xp = namespace(*calls[0])
            args = tuple([xp.stack([c[j] for c in calls]) for j in range(len(calls[0]))])
            out = (spec.forward or prim.forward)(xp, *args, **params)
            if prim.saves:
                out, saved = out
            else:
                saved = out
            vjps = spec.vjps or prim.vjps
        group = Merged(members, shared, vjps, xp, args, out, saved)
        for row, m in enumerate(members):
            datas[m] = result_row(out, row, False)  # as the call alone gives it (0-d, not a scalar)
            self.merged[m] = group
        self.kernels += 1

    def _merged_backward(self, group: Merged) -> None:
        """The merged vjps: the members' deltas stacked (-0.0 for a member without one, the
        identity of the sums), one kernel per input; a fan's shared input gets one delta, every
        other input its member's row (a member without a delta gives none, as its own vjp)."""
        members = group.members
        deltas, wanted, inputs = self.deltas, self.wants, self.inputs
        given = [deltas[m] for m in members]
        for m in members:
            deltas[m] = None
        if all(d is None for d in given):
            return
        build = self.ops[members[0]]
        assert build is not None
        xp, out, shared, datas = group.xp, group.out, group.shared, self.datas
        rows = [
            minus_zeros(xp, out.shape[1:], out.dtype)
            if d is None
            else (d.to_dense(xp) if type(d) is SparseRows else d)
            for d in given
        ]
        stacked = xp.stack(rows)
        for j in range(len(group.args)):
            targets = [inputs[m][j] for m in members]
            if not any(wanted[i] for i in targets):
                continue
            g = group.vjps[j](xp, stacked, group.saved, *group.args, **build.params)
            self.kernels += 1
            if j in shared:
                self._give(targets[0], g)
                continue
            for row, i in enumerate(targets):
                if wanted[i] and given[row] is not None:
                    self._give(i, row_of(xp, row, datas[i], g))  # typed as the input (a float for a float)

    # ------------------------------------------------------------------------------ helpers

    def _args(self, k: int) -> tuple[Any, ...]:
        datas = self.datas
        return tuple([datas[i] for i in self.inputs[k]])

    def _computed(self, k: int, result: tuple[Any, Any, Any]) -> None:
        build = self.ops[k]
        assert build is not None
        xp, data, saved = result
        self.xps[k], self.datas[k] = xp, data
        self.saved[k] = saved if build.prim.saves else data
        self.kernels += 1

    def _start_backward(self, seed: Any, root: int) -> int:
        """Sets the root's delta; returns the root's position. Only the nodes on a path to a weight
        (``wants``) get deltas; the vjps of the others never run."""
        n = len(self.ops)
        self.deltas = [None] * n
        self.owned = [False] * n
        root %= n
        self.deltas[root] = seed
        return root

    def _vjps(self, k: int, wanted: list[bool]) -> list[tuple[int, int, bool]]:
        """Op ``k``'s inputs that want a delta: (input position, node, whether the delta passes
        through unchanged: a float op's float input, where the primitive says so: no kernel)."""
        build = self.ops[k]
        assert build is not None
        passes = build.prim.passes and type(self.datas[k]) is float
        args = self.args[k]
        return [(j, i, passes and type(args[j]) is float) for j, i in enumerate(self.inputs[k]) if wanted[i]]

    def _vjp(self, k: int, j: int, delta: Any) -> Any:
        build = self.ops[k]
        assert build is not None
        self.kernels += 1
        return input_delta(
            build.prim, build.params, self.xps[k], self.args[k], self.saved[k], delta, j, False
        )

    def _give(self, i: int, g: Any) -> None:
        """Adds ``g`` to node ``i``'s delta."""
        held = self.deltas[i]
        if held is None:
            self.deltas[i] = g
        elif self.owned[i]:
            self.deltas[i] = add_into(held, g)
        else:
            self.deltas[i] = add(held, g)
            self.owned[i] = True

    def _gradient(self, gradients: dict[Any, Any], k: int, delta: Any) -> None:
        weight = self.weights[k]  # used once or more: one node
        held = gradients.get(weight)
        gradients[weight] = delta if held is None else add(held, delta)

    def _depths(self) -> list[int]:
        """Every node's depth (one more than its deepest input's; a leaf's is 0): ``depths``,
        extended to the nodes added since it was last asked for (a node's depth never changes)."""
        depths, inputs = self.depths, self.inputs
        for k in range(len(depths), len(inputs)):  # inputs before consumers
            ins = inputs[k]
            depths.append(1 + max([depths[i] for i in ins]) if ins else 0)
        return depths

    def _by_depth(self, start: int = 0) -> list[int]:
        """The nodes from ``start`` on by depth, in walk order within a depth (a graph's root, the
        only node of the largest depth, stays last)."""
        depths = self._depths()
        return sorted(range(start, len(depths)), key=depths.__getitem__)

    def _affinity(self, k: int) -> object:
        """The worker op ``k``'s kernels prefer: its first weight's (``monadl.do.workers``)."""
        for i in self.inputs[k]:
            weight = self.weights[i]
            if weight is not None:
                return id(weight)
        return None


class Merged:
    """Ops of one depth run as one kernel (``Program.forward_merging``): their positions, the
    inputs they share (a fan-out's; none for ops on stacked rows), the rules of their vjps, and
    what the kernel saw and gave."""

    __slots__ = ("args", "members", "out", "saved", "shared", "vjps", "xp")

    def __init__(
        self,
        members: list[int],
        shared: tuple[int, ...],
        vjps: tuple[Any, ...],
        xp: Any,
        args: tuple[Any, ...],
        out: Any,
        saved: Any,
    ) -> None:
        self.members = members
        self.shared = shared
        self.vjps = vjps
        self.xp = xp
        self.args = args
        self.out = out
        self.saved = saved


class _Jobs:
    """Kernels on a pool, their results handed to ``arrived(token, result)`` on this thread.

    Used as ``with _Jobs(...) as jobs:``; leaving the block waits for every kernel on the pool (so
    nothing of a failed run runs on), then raises the first kernel's error, if any; an error of the
    block's own is raised as it is."""

    def __init__(self, pool: WorkerPool, arrived: Callable[[Any, Any], None]) -> None:
        self.pool = pool
        self.arrived = arrived
        self.done: Done = queue.SimpleQueue()
        self.pending = 0
        self.error: BaseException | None = None

    def submit(self, fn: Callable[..., Any], args: tuple[Any, ...], affinity: object, token: Any) -> None:
        self.pool.submit(fn, args, affinity, self.done, token)
        self.pending += 1

    def collect(self) -> None:
        """Waits for one kernel and hands its result on; after an error, raises it once every
        kernel has finished."""
        self._take()
        if self.error is not None:
            self._wait_all()
            self._raise()

    def __enter__(self) -> _Jobs:
        return self

    def __exit__(self, kind: type[BaseException] | None, *rest: object) -> None:
        self._wait_all()
        if kind is None and self.error is not None:
            self._raise()

    def _raise(self) -> NoReturn:
        """Raises the error, holding no reference to it: its traceback holds the frames of this
        object's methods, so a reference kept here would be a reference cycle."""
        error, self.error = self.error, None
        assert error is not None
        try:
            raise error
        finally:
            del error

    def _wait_all(self) -> None:
        while self.pending:
            self._take()

    def _take(self) -> None:
        self.pool.run_own_jobs(self.done)  # rather than sleep while kernels wait for a worker
        token, result, error = self.done.get()
        self.pending -= 1
        if error is not None:
            self.error = self.error or error
            del error  # a job run on this thread (run_own_jobs) has this frame in its traceback
        elif self.error is None:
            try:
                self.arrived(token, result)
            except BaseException as failed:  # noqa: BLE001 - raised once the pool is idle
                self.error = failed  # (not a local: its traceback holds this frame)


def program(root: Do[Any]) -> Program | None:
    """``root``'s graph as a :class:`Program`, or None at the first node of a kind it cannot hold
    (then the executor runs the graph, and nothing has run)."""
    prog = Program()
    return None if prog.add(root) is None else prog


def run_forward(executor: Executor, prog: Program) -> Any:
    """``prog``'s forward pass on ``executor``: on its thread, and on its pool if it has one."""
    pool = executor.pool
    return prog.forward() if pool is None else prog.forward_on(pool, executor.min_pool_cost)


def run_backward(executor: Executor, prog: Program, seed: Any, root: int = -1) -> dict[Any, Any]:
    """``prog``'s backward pass from ``seed``, the delta of node ``root`` (by default the last), on
    ``executor``; every weight's summed delta."""
    pool = executor.pool
    if pool is None:
        return prog.backward(seed, root)
    return prog.backward_on(pool, executor.min_pool_cost, seed, root)


def record_stats(executor: Executor, prog: Program) -> None:
    """Counts a straight-line run in ``executor``'s statistics (its kernels: ops and vjps run)."""
    stats = RunStats(kernels=prog.kernels, straight=1)
    executor.last_stats = stats
    executor.stats.add(stats)
