"""Planned batching (as TensorFlow Fold and DyNet do): a recorded graph run level by level.

The executor's dynamic batching (``monadl.do.executor``) finds mergeable calls as it runs: it parks
each batchable call, merges equal ones when nothing else can run, and gives every call back its own
row, with a tape of its own for the backward pass. That is general (it sees through ``flat_map``s
and data-dependent control flow), but every call still costs a fiber, a signature, a row tape and
a share of its group's backward bookkeeping: about 100 us per node of a Tree-LSTM batch.

When the whole graph of a forward pass is visible before it runs (ops, ``@batchable`` operation
calls and their results, weights and constants, and no ``flat_map`` of the user's), this module
runs it as DyNet's autobatching does: it walks the graph once, gives each node its depth (one more
than its deepest input), and runs the nodes of one depth together, one computation per group of
equal signature (the signatures of ``monadl.dsl.batching`` and ``monadl.dsl.operation``). A group's
inputs are gathered rows of earlier groups (``take_rows``, or the earlier group itself when it is
exactly the rows wanted), its result is one stacked array, and a node's value is a row of it.
``add_n`` and ``concatenate`` over many rows (a batch's loss summed over every node; the roots'
scores) become sums and gathers of whole groups.

The groups' computations (a batched op, an operation's body recorded once on stacked rows, the
gathers) are ops on weights and constants only, so they are appended, a depth at a time, to one
straight-line program (``monadl.dsl.straight``) and run there, without tapes: the backward pass is
that program's, through the groups and gathers, with no per-node work at all. Within a depth, the
program runs equal ops as one kernel, as the executor's merging would (a cell's five gate
``linear``s, its sigmoids); on an executor with a pool it runs them one by one, on the pool.

A graph of any other kind returns None (the caller runs it as usual), and so does a narrow one
(fewer than ``MIN_WIDTH`` ops or calls a level on average: a chain, the CIFAR column model). A
planned run that fails (an error of a group; an operation whose body is not a graph of ops, such as
one with a ``flat_map``) is discarded by the caller and run again unplanned, so errors are those of
the unplanned run, naming the call that failed, and nothing of the failed attempt remains.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np

from monadl.do.batching import RunStats
from monadl.do.do import FLAT, MAP, Bind, Delay, Do, Pure
from monadl.do.executor import Executor
from monadl.dsl import primitives as P
from monadl.dsl.apply import _Build, apply_primitive
from monadl.dsl.batching import _is_shared, _scalar, check_calls, merged_params, signature_start
from monadl.dsl.layers import ArrayLayer, FloatLayer
from monadl.dsl.operation import _Call, _item, check_rows, mixed_ranks
from monadl.dsl.primitives import Primitive
from monadl.dsl.straight import _WEIGHT_FORWARD, Program, run_backward
from monadl.tape.batch import float_key, row_at, stack_values, value_key
from monadl.tape.tape import Tape
from monadl.typeclasses.backend import host_in, namespace
from monadl.typeclasses.sparse import scatter_add

_LEAF, _OP, _CALL, _PROJECTION = range(4)
MIN_WIDTH = 8
"""A graph is planned only if its depths hold this many ops or calls on average: a plan's levels
cost a run each, which merging many nodes a level pays for, and merging a few does not (measured:
the CIFAR column model, 2-5 ops a level, ran 1.8x the instructions planned)."""


class Unsupported(Exception):
    """The graph (or a part met while running it) is outside what a plan handles."""


class _Group:
    """One merged computation's result (``node``, its value ``data``): row k is member k's value."""

    __slots__ = ("data", "layer", "row_key", "scalar")

    def __init__(self, node: Do[Any], data: Any, scalar: bool) -> None:
        self.data = data
        self.scalar = scalar  # the members' values are floats (the rows of a vector)
        self.layer = ArrayLayer(node)
        # A row's part of a signature: made once here, read for every use of every row.
        self.row_key: Hashable = float if scalar else (type(data), data.shape[1:], data.dtype)


class _Own:
    """A value of its own, not a row of a group: a leaf (a weight, a constant), or the result of
    an op run alone. ``node`` computes it (node ``k`` of the plan's program)."""

    __slots__ = ("data", "k", "node", "requires_delta", "weight")

    def __init__(self, node: Do[Any], k: int, prog: Program) -> None:
        self.node = node
        self.k = k
        self.data = prog.datas[k]
        self.requires_delta = prog.wants[k]  # it depends on a weight
        self.weight = prog.weights[k]


class _Row:
    """Row ``k`` of a group: a node's value inside a plan."""

    __slots__ = ("group", "k")

    def __init__(self, group: _Group, k: int) -> None:
        self.group = group
        self.k = k


class Planned:
    """A planned run: its program (``monadl.dsl.straight``), run forward, with the root's value at
    node ``root``, and what it launched (``stats``, the executor's ``last_stats``)."""

    __slots__ = ("executor", "prog", "root", "stats")

    def __init__(self, executor: Executor, prog: Program, root: int, stats: RunStats) -> None:
        self.executor = executor
        self.prog = prog
        self.root = root
        self.stats = stats

    @property
    def value(self) -> Any:
        """The root's value."""
        return self.prog.datas[self.root]

    def gradients(self, seed: Any) -> dict[Any, Any]:
        """Backpropagates ``seed``, the root's delta; returns every weight's summed delta (the
        backward's kernels are counted in ``stats`` and the executor's)."""
        prog, before = self.prog, self.prog.kernels
        with self.executor.paused():
            gradients = run_backward(self.executor, prog, seed, self.root)
        launched = prog.kernels - before
        self.stats.kernels += launched
        self.executor.stats.kernels += launched
        return gradients


def run_planned(executor: Executor, root: Do[Tape[Any, Any]]) -> Planned | None:
    """``root``'s graph computed level by level with merged groups, forward; None if it is not
    one a plan handles (see the module), before anything ran."""
    skip = _narrow.get(executor)
    if skip is not None and skip[0]:  # its last graphs were narrow: do not walk this one
        skip[0] -= 1
        return None
    levels = _levels(root)
    if levels is None:  # the next 1, 2, 4, ... up to NARROW_SKIP runs are not walked
        streak = min(2 * skip[1], NARROW_SKIP) if skip is not None else 1
        _narrow[executor] = [streak, streak]
        return None
    _narrow.pop(executor, None)
    with executor.paused():
        return _Plan(executor).run(levels, root)  # counted in the executor's stats if it succeeds


Entry = tuple[Any, int, tuple[Any, ...]]  # a node, its kind, its sources

NARROW_SKIP = 64
"""After graphs that are not planned, at most this many runs of their executor are not walked: a
model's graphs are alike, and a walk of a narrow one (the CIFAR column model's) costs 4% of its
run. The skips double after each graph not planned (1, 2, 4, ...); a planned graph resets them."""
_narrow: weakref.WeakKeyDictionary[Executor, list[int]] = weakref.WeakKeyDictionary()  # skips left, streak


def _levels(root: Do[Any]) -> list[list[Entry]] | None:
    """The nodes reachable from ``root`` by depth (a leaf's is 0, a projection's its call's, any
    other node's one more than its deepest input); None at the first node of a kind a plan does
    not handle, or if its depths hold fewer than ``MIN_WIDTH`` ops or calls on average."""
    # This walk visits every node of a batch (several per tree node), so it is written out.
    depth: dict[Any, int] = {}  # by node; -1 while its inputs are being walked
    levels: list[list[Entry]] = [[]]
    width = [0]
    stack: list[Any] = [root]  # nodes to walk, and entries whose inputs have all been walked
    pop, push = stack.pop, stack.append
    while stack:
        item = pop()
        if type(item) is tuple:
            node, kind, sources = item
            if kind == _PROJECTION:
                d = depth[sources[0]]
            else:
                d = 0  # the deepest input's, by a loop: max(map(...), default=0) costs 4x more
                for source in sources:
                    e = depth[source]
                    if e > d:
                        d = e
                d += 1
                if d == len(levels):
                    levels.append([])
                    width.append(0)
                width[d] += 1
            depth[node] = d
            levels[d].append(item)
            continue
        if item in depth:
            continue
        kind_of = type(item)
        if kind_of is not Bind:
            if not (
                (kind_of is Pure and type(item.value) is Tape)
                or (kind_of is Delay and getattr(item.thunk, "__func__", None) is _WEIGHT_FORWARD)
            ):
                return None  # only constants and weights are leaves of a program
            depth[item] = 0
            levels[0].append((item, _LEAF, ()))
            continue
        f = item.f
        f_type = type(f)
        mode = item.mode
        if mode == FLAT and f_type is _Build:
            kind = _OP
        elif mode == FLAT and f_type is _Call:
            kind = _CALL
        elif mode == MAP and f_type is functools.partial and f.func is _item:
            d = depth.get(item.sources[0], -1)
            if d >= 0:  # a result of a call walked already (a cell's second result): placed at once
                depth[item] = d
                levels[d].append((item, _PROJECTION, item.sources))
                continue
            kind = _PROJECTION
        else:
            return None
        depth[item] = -1
        sources = item.sources
        push((item, kind, sources))
        for source in reversed(sources):  # walked in order: a level's nodes in the order of use
            if source not in depth:
                push(source)
    if sum(width) < MIN_WIDTH * (len(width) - 1):
        return None
    return levels


class _Plan:
    """The values of a planned run's nodes, computed a level at a time into one program."""

    def __init__(self, executor: Executor) -> None:
        self.executor = executor
        self.prog = Program()  # every computation of the plan: its levels' groups, gathers, sums
        self.values: dict[Any, Any] = {}  # node -> _Own, _Row, or a call's tuple of _Rows
        self.stats = RunStats()  # the plan's merges and the program's launches
        self.signatures: set[Hashable] = set()  # of its groups

    def run(self, levels: list[list[Entry]], root: Do[Any]) -> Planned:
        values, prog = self.values, self.prog
        value_of = values.__getitem__
        for level in levels:
            groups: dict[Hashable, list[tuple[Any, list[Any]]]] = {}
            alone: list[tuple[Any, list[Any]]] = []
            projections: list[tuple[Any, Any]] = []
            for node, kind, sources in level:
                if kind == _LEAF:
                    k = prog.add(node)
                    assert k is not None  # _levels let only a program's leaves through
                    values[node] = _Own(node, k, prog)
                    continue
                if kind == _PROJECTION:
                    projections.append((node, sources))
                    continue
                inputs = [*map(value_of, sources)]
                key = self._key(node, kind, inputs)
                if key is None:
                    alone.append((node, inputs))
                else:
                    groups.setdefault(key, []).append((node, inputs))
            self.signatures.update(groups)
            self._compute(list(groups.values()), alone)
            for node, sources in projections:
                outputs = values[sources[0]]
                values[node] = outputs[node.f.args[0]]
        result = values[root]
        if type(result) is _Row:  # the root is one node's value: taken out of its group
            result = self._run([_layer(result).forward])[0]
        stats = self.stats
        stats.planned += 1
        stats.kernels = prog.kernels
        stats.signatures = len(self.signatures)
        self.executor.stats.add(stats)
        self.executor.last_stats = stats
        return Planned(self.executor, prog, result.k, stats)

    # ---------------------------------------------------------------------------- signatures

    def _key(self, node: Any, kind: int, inputs: list[Any]) -> Hashable | None:
        """The node's signature (equal ones merge), or None to run it on its own."""
        # _row_key written out, in loops (not comprehensions, each a call of its own in Python
        # 3.11): this runs for every node of a batch, and most inputs are rows
        if kind == _CALL:
            call: _Call = node.f
            parts = [call.static]
            for v in inputs:
                parts.append(v.group.row_key if type(v) is _Row else value_key(v.data))
            return tuple(parts)
        build: _Build = node.f
        prim = build.prim
        spec = prim.batch
        key = signature_start(prim, build.params)
        if spec is None or key is None or prim.name in _SPECIAL:
            return None
        if spec.mergeable is not None and not spec.mergeable(*[_data(v) for v in inputs]):
            return None
        stacked = bool(spec.rows)  # a call of shared values only runs on its own
        for i, v in enumerate(inputs):
            if type(v) is _Row:
                if i in spec.shared:  # a row where one value must serve all calls (matmul's b)
                    return None
                key.append(v.group.row_key)
                stacked = True
                continue
            if spec.elementwise or i in spec.shared:
                if v.requires_delta:
                    if getattr(v, "weight", None) is not None:
                        key.append(v)
                        continue
                elif type(v.data) is float:
                    key.append(("constant", float_key(v.data)))
                    continue
            if i in spec.shared or v.requires_delta:  # not shareable; or not stackable here
                return None
            key.append(value_key(v.data))
            stacked = True
        return tuple(key) if stacked else None

    # ----------------------------------------------------------------------------- computing

    def _compute(self, groups: list[list[tuple[Any, list[Any]]]], alone: list[Any]) -> None:
        dos: list[Do[Any]] = []
        finish: list[tuple[Any, int]] = []  # a group's (or alone node's) callback, its dos' count
        stats = self.stats
        for members in groups:
            node = members[0][0]
            if type(node.f) is _Call:
                group_dos, done = self._call_group(members)
                name = node.f.op.f.__qualname__
                stats.kinds[name] = stats.kinds.get(name, 0) + 1
            else:
                do, done = self._op_group(members)
                group_dos = [do]
            if len(members) > 1:
                stats.groups += 1
                stats.merged += len(members)
            dos += group_dos
            finish.append((done, len(group_dos)))
        for node, inputs in alone:
            dos.append(self._alone(node, inputs))
            finish.append((functools.partial(self._own, node), 1))
        if dos:
            results = self._run(dos)
            at = 0
            for done, count in finish:
                done(results[at : at + count])
                at += count

    def _run(self, dos: list[Do[Any]]) -> list[_Own]:
        """Adds ``dos`` to the program and computes them (on the executor's pool, if it has one)."""
        prog = self.prog
        start = len(prog.ops)
        owns = []
        for do in dos:
            k = prog.add(do)
            if k is None:  # an operation's body made a node of another kind (a flat_map, say)
                raise Unsupported("a computation that is not a graph of ops")
            owns.append(k)
        pool = self.executor.pool
        if pool is None:
            prog.forward_merging(start)  # a cell's gates, its sigmoids: one kernel each
        else:
            prog.forward_on(pool, self.executor.min_pool_cost, start)
        kinds, merged = self.stats.kinds, prog.merged
        for k in range(start, len(prog.ops)):
            build = prog.ops[k]
            if build is not None and (k not in merged or merged[k].members[0] == k):  # one launch
                name = build.prim.name
                kinds[name] = kinds.get(name, 0) + 1
        return [_Own(do, k, prog) for do, k in zip(dos, owns, strict=True)]

    def _own(self, node: Any, results: list[_Own]) -> None:
        self.values[node] = results[0]

    def _op_group(self, members: list[tuple[Any, list[Any]]]) -> tuple[Do[Any], Any]:
        """One op applied to the stacked rows of its calls (as ``monadl.dsl.batching`` does)."""
        first, inputs = members[0]
        prim: Primitive = first.f.prim
        spec = prim.batch
        assert spec is not None
        n = len(members)
        datas = tuple([_data(v) for v in inputs])
        calls = [node.f.params for node, _ in members]
        params = merged_params(spec, calls, datas[0])
        check = prim.check
        if check is not None:  # every call's own check on its own rows
            check_calls(
                prim,
                datas,
                params,
                calls,
                lambda: [check(*[_data(v) for v in ins], **node.f.params) for node, ins in members],
            )
        arrays = [d for d in datas if type(d) is not float]
        rank = max((len(d.shape) for d in arrays), default=0)
        layers: list[Any] = []
        for i, v in enumerate(inputs):
            if type(v) is not _Row and _is_shared(spec, i, v):
                layers.append(_layer(v))
                continue
            stacked = self._gather([ins[i] for _, ins in members])
            row_rank = 0 if type(datas[i]) is float else len(datas[i].shape)
            if spec.elementwise and row_rank < rank:  # so that rows broadcast as their calls did
                shape = (n,) + (1,) * (rank - row_rank) + tuple(() if row_rank == 0 else datas[i].shape)
                stacked = _apply(P.reshape, [stacked], {"shape": shape})
            layers.append(stacked)
        scalar = _scalar(spec, datas, first.f.params)
        do = apply_primitive(_batched(prim), layers, params)
        return do, functools.partial(self._rows, [node for node, _ in members], scalar)

    def _rows(self, nodes: list[Any], scalar: bool, results: list[_Own]) -> None:
        (result,) = results
        group = _Group(result.node, result.data, scalar)
        for k, node in enumerate(nodes):
            self.values[node] = _Row(group, k)

    def _call_group(self, members: list[tuple[Any, list[Any]]]) -> tuple[list[Do[Any]], Any]:
        """A batchable operation's body, recorded once on the stacked rows of its calls."""
        first: _Call = members[0][0].f
        if mixed_ranks([_row_key(v) for v in members[0][1]]):  # equal signatures: the first says for all
            raise Unsupported("a batchable call whose row arguments differ in rank")
        columns = [self._gather([ins[j] for _, ins in members]) for j in range(len(first.rows))]
        dos = first.forwards(columns)
        structure = first.op.structure
        assert structure is not None
        return dos, functools.partial(self._outputs, [node for node, _ in members], structure)

    def _outputs(self, nodes: list[Any], structure: Sequence[type], results: list[_Own]) -> None:
        op = nodes[0].f.op
        for index, r in enumerate(results):
            check_rows(op, len(nodes), index, r.data)
        groups = [
            _Group(r.node, r.data, kind is FloatLayer) for r, kind in zip(results, structure, strict=True)
        ]
        values = self.values
        for k, node in enumerate(nodes):  # a node's rows, by a loop (once per call of a batch)
            rows = []
            for g in groups:
                rows.append(_Row(g, k))
            values[node] = tuple(rows)

    def _alone(self, node: Any, inputs: list[Any]) -> Do[Any]:
        """A node that merges with nothing: the op on its own values (a row taken out of its
        group), or a sum or concatenation of many rows as sums and gathers of whole groups."""
        if type(node.f) is _Call:  # pragma: no cover - calls always have a signature
            raise Unsupported("a call without a signature")
        build: _Build = node.f
        name = build.prim.name
        if name == "add_n" and any(type(v) is _Row for v in inputs):
            return self._sum(inputs)
        if name == "concatenate" and self._stackable(inputs, build.params):
            stacked = self._gather(list(inputs))
            first = _data(inputs[0])
            shape = (-1, *first.shape[1:])
            return _apply(P.reshape, [stacked], {"shape": shape}).forward
        return apply_primitive(build.prim, [_layer(v) for v in inputs], build.params)

    def _sum(self, inputs: list[Any]) -> Do[Any]:
        rows: dict[_Group, tuple[_Group, list[Any]]] = {}
        parts: list[Any] = []
        for v in inputs:
            if type(v) is _Row:
                rows.setdefault(v.group, (v.group, []))[1].append(v)
            else:
                parts.append(_layer(v))
        for group, members in rows.values():
            gathered = self._gather(members)
            if group.scalar:
                parts.append(_apply(P.sum_, [gathered], {}, scalar=True))
            else:
                parts.append(_apply(P.sum_, [gathered], {"axis": 0, "keepdims": False}))
        if len(parts) == 1:
            return parts[0].forward  # type: ignore[no-any-return]
        kind = FloatLayer if all(isinstance(p, FloatLayer) for p in parts) else ArrayLayer
        return kind(apply_primitive(P.add_n(len(parts)), parts, {})).forward

    def _stackable(self, inputs: list[Any], params: dict[str, Any]) -> bool:
        """Whether a concatenation is of arrays of one shape along their first axis."""
        first = _data(inputs[0])
        if type(first) is float or not first.shape or params.get("axis", 0) not in (0, -len(first.shape)):
            return False
        return all(_row_key(v) == _row_key(inputs[0]) for v in inputs)

    # ------------------------------------------------------------------------------- gathering

    def _gather(self, values: list[Any]) -> Any:
        """The values as the rows of one layer (n, ...): a group itself when the values are exactly
        its rows, else one ``gather`` op taking rows of the groups (and stacking other values)."""
        first = values[0]
        if type(first) is _Row and first.group.data.shape[0] == len(values):
            group = first.group
            for k, v in enumerate(values):  # a loop: all() of a generator costs 2x, on every row
                if type(v) is not _Row or v.group is not group or v.k != k:
                    break
            else:
                return group.layer
        tables: list[Any] = []
        picks: dict[_Group, tuple[list[int], list[int]]] = {}  # group -> (positions, its rows)
        loose: list[tuple[int, Any]] = []  # (position, a value of its own)
        dtype = None  # the rows' float type, for float constants stacked with them
        for position, v in enumerate(values):
            if type(v) is _Row:
                pick = picks.get(v.group)
                if pick is None:
                    pick = picks[v.group] = ([], [])
                    tables.append(v.group.layer)
                    dtype = dtype or v.group.data.dtype
                pick[0].append(position)
                pick[1].append(v.k)
            else:
                loose.append((position, v))
        chosen = list(picks.values())
        constants = [(p, v) for p, v in loose if not v.requires_delta]
        if constants:
            datas = [v.data for _, v in constants]
            xp = np if type(datas[0]) in (float, np.ndarray) else namespace(datas[0])
            stacked = stack_values(xp, datas, dtype or np.float64)
            tables.append(ArrayLayer(Pure(Tape(stacked))))
            chosen.append(([p for p, _ in constants], list(range(len(constants)))))
        for position, v in loose:  # a value of its own with a delta: a table of one row
            if v.requires_delta:
                if type(v.data) is float:
                    tables.append(_apply(_FLOAT_ROW, [_layer(v)], {"dtype": dtype or np.float64}))
                else:
                    tables.append(_apply(P.reshape, [_layer(v)], {"shape": (1, *v.data.shape)}))
                chosen.append(([position], [0]))
        if len(chosen) == 1 and chosen[0][0] == chosen[0][1] == list(range(len(values))):
            table = tables[0]  # stacked constants, in order: no gather
            if type(table.forward) is Pure and table.forward.value.data.shape[0] == len(values):
                return table
        positions = tuple(np.asarray(p, dtype=np.intp) for p, _ in chosen)
        rows = tuple(np.asarray(r, dtype=np.intp) for _, r in chosen)
        unique = tuple(len(set(r)) == len(r) for _, r in chosen)
        params = {"positions": positions, "rows": rows, "unique": unique, "size": len(values)}
        return _apply(_gather_rule(len(tables)), tables, params)


_SPECIAL = ("add_n", "concatenate")
"""The ops a plan runs its own way: sums of rows, and concatenations of stackable rows."""


def _data(v: Any) -> Any:
    """A value's data: its own (``_Own``), or its row of a group (a float for a float row)."""
    if type(v) is _Row:
        row = row_at(v.group.data, v.k)
        return float(row) if v.group.scalar else row
    return v.data


def _row_key(v: Any) -> Hashable:
    return v.group.row_key if type(v) is _Row else value_key(v.data)


def _layer(v: Any) -> Any:
    """A value as a layer: its own node's, or a row of a group (an array row only)."""
    if type(v) is _Row:
        if v.group.scalar:
            raise Unsupported("a float row on its own")
        return _apply(P.take_rows, [v.group.layer], {"indices": np.asarray(v.k, dtype=np.int64)})
    return FloatLayer(v.node) if type(v.data) is float else ArrayLayer(v.node)


def _apply(
    prim: Primitive, operands: list[Any], params: dict[str, Any], scalar: bool = False
) -> FloatLayer | ArrayLayer:
    forward = apply_primitive(prim, operands, params)
    return FloatLayer(forward) if scalar else ArrayLayer(forward)


def _gather_forward(xp: Any, *tables: Any, positions: Any, rows: Any, unique: Any, size: int) -> Any:
    first = tables[0]
    if xp is np:
        out = np.empty((size, *first.shape[1:]), dtype=first.dtype)
        for table, where, which in zip(tables, positions, rows, strict=True):
            out[where] = np.take(table, which, axis=0)
        return out
    # The array API assigns to no index array: the tables' rows one after another, then put in
    # place by one take (the positions are a permutation of the result's rows).
    parts = [xp.take(t, host_in(xp, which), axis=0) for t, which in zip(tables, rows, strict=True)]
    order = np.argsort(np.concatenate(positions), kind="stable")
    return xp.take(xp.concat(parts, axis=0) if len(parts) > 1 else parts[0], xp.asarray(order), axis=0)


def _gather_vjp(j: int) -> Any:
    def vjp(xp: Any, d: Any, o: Any, *tables: Any, positions: Any, rows: Any, unique: Any, size: int) -> Any:
        table = tables[j]
        g = xp.zeros(table.shape, dtype=d.dtype)
        if xp is not np:  # the array API assigns to no index array
            picked = xp.take(d, host_in(xp, positions[j]), axis=0)
            return scatter_add(xp, g, host_in(xp, rows[j]), picked)
        if unique[j]:
            g[rows[j]] = d[positions[j]]
            return g
        return scatter_add(xp, g, rows[j], d[positions[j]])  # a row taken twice: its deltas add

    return vjp


_FLOAT_ROW = Primitive(
    "float_row",
    lambda xp, x, dtype: np.asarray([x], dtype=dtype),
    (lambda xp, d, o, x, dtype: float(d[0]),),
)
"""A float as an array of one row (to stack it with rows of a group); its delta, a float again."""

_gather_rules: dict[int, Primitive] = {}


def _gather_rule(n: int) -> Primitive:
    """``gather``: rows of ``n`` tables into one array (row ``positions[j][i]`` of the result is
    row ``rows[j][i]`` of table j); each table's delta is its rows' deltas, dense."""
    rule = _gather_rules.get(n)
    if rule is None:
        rule = _gather_rules[n] = Primitive(
            "gather", _gather_forward, tuple(_gather_vjp(j) for j in range(n))
        )
    return rule


_batched_rules: dict[Primitive, Primitive] = {}


def _batched(prim: Primitive) -> Primitive:
    """``prim`` on stacked rows: its batched forward and vjps (``Primitive.batch``), no per-call
    check (each call's own check ran on its own rows)."""
    rule = _batched_rules.get(prim)
    if rule is None:
        spec = prim.batch
        assert spec is not None
        rule = Primitive(
            prim.name,
            spec.forward or prim.forward,
            spec.vjps or prim.vjps,
            broadcasts=prim.broadcasts,
            saves=prim.saves,
            cost=prim.cost,
        )
        _batched_rules[prim] = rule
    return rule
