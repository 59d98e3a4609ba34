"""Dynamic batching of primitive ops (as DyNet does): calls of one primitive with equal signatures
run as one call on stacked rows, forward and backward.

An op's forward kernel names :data:`OP_BATCHER`. Its signature is the primitive, its parameters
(``Batching.key``), and for each input either the shared value (a weight's tape; a float constant)
or the per-row shape, dtype and array type. The executor parks equal calls and hands the group to
:meth:`OpBatcher.run`: one kernel stacks each stacked input (row k is call k's), applies the
primitive once (``Primitive.batch`` says how: padded ranks for elementwise ops, axes shifted past the
row axis, or a forward of its own), and gives every call's tape its row of the result.

The backward is merged too (``monadl.tape.batch``): when all the calls' tapes have fired, one vjp
kernel per input runs on the stacked deltas; a stacked input's delta is split back into rows, and
a shared weight gets one delta for the whole group (summed by the vjp itself, a matmul for
``linear``'s weight) and releases for the other calls.

Calls that merge with nothing as rows may still *fan out* (``Batching.fan``): ``linear`` calls of
one input with different weights (a Tree-LSTM cell's five gates) run as one kernel, whose weights'
deltas are one batched matmul. Their :meth:`OpBatcher.fan_signature` is the primitive, its
parameters, the shared input's tape itself, and the other inputs' shapes; the shared input gets one
delta, summed over the calls, and every weight its row of the weights' stacked delta.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any

import numpy as np

from monadl.do.do import KERNEL_MAP, UNIT, Bind, Do, PrivateBind, PrivateKernel, run_unit
from monadl.dsl.primitives import Batching, FanOut, Primitive, Rule
from monadl.tape.batch import (
    BatchGroup,
    RowOf,
    float_key,
    result_row,
    stack_arrays,
    stack_values,
    stacked_delta,
    value_key,
)
from monadl.typeclasses.backend import ShapeError, namespace, shape_of, unbroadcast
from monadl.typeclasses.sparse import SparseRows

if TYPE_CHECKING:
    from monadl.dsl.apply import OpTape


class OpBatcher:
    """The :class:`~monadl.do.batching.Batcher` of primitive ops (their forward kernels)."""

    def signature(self, node: Any) -> Hashable | None:
        # Written out rather than with _is_shared and _params_key calls: it runs for every parked op.
        tape: OpTape = node.fn.__self__
        prim = tape.prim
        spec = prim.batch
        key = signature_start(prim, tape.params)
        if spec is None or key is None:
            return None
        if spec.mergeable is not None and not spec.mergeable(*[t.data for t in tape.inputs]):
            return None
        rows = bool(spec.rows)  # whether anything is stacked: calls of shared values only do not merge
        shared = spec.shared
        may_share = spec.elementwise
        for i, t in enumerate(tape.inputs):
            d = t.data
            if may_share or i in shared:
                if t.requires_delta:
                    if getattr(t, "weight", None) is not None:
                        key.append(t)  # a weight's tape is one per run, so it stands for the weight
                        continue
                elif type(d) is float:
                    key.append(("constant", float_key(d)))
                    continue
                if i in shared:
                    return None
            key.append(float if type(d) is float else (type(d), d.shape, d.dtype))  # value_key, inline
            rows = True
        return tuple(key) if rows else None

    def fan_signature(self, node: Any) -> Hashable | None:
        tape: OpTape = node.fn.__self__
        prim = tape.prim
        spec = prim.batch
        fan = None if spec is None else spec.fan
        if fan is None:
            return None
        params = params_items(tape.params)
        if params is None:
            return None
        key: list[Any] = [prim, "fan", params]
        for i, t in enumerate(tape.inputs):
            key.append(t if i in fan.shared else value_key(t.data))  # shared: the very same value
        return tuple(key)

    def name(self, node: Any) -> str:
        tape: OpTape = node.fn.__self__
        return tape.prim.name

    def run(self, nodes: list[Any]) -> Do[list[Any]]:
        tapes: list[OpTape] = [node.fn.__self__ for node in nodes]
        return PrivateKernel(_forward, (tapes, None), functools.partial(_cost, tapes))

    def run_fan(self, nodes: list[Any]) -> Do[list[Any]]:
        tapes: list[OpTape] = [node.fn.__self__ for node in nodes]
        spec = tapes[0].prim.batch
        assert spec is not None and spec.fan is not None
        return PrivateKernel(_forward, (tapes, spec.fan), functools.partial(_cost, tapes))


OP_BATCHER = OpBatcher()


def params_items(params: dict[str, Any]) -> tuple[tuple[str, Any], ...] | None:
    """All of a call's parameters as a signature's part, for merges that take them whole (a fan
    out, equal elementwise ops); None if one is unhashable (then the call runs on its own)."""
    items = tuple(params.items())
    try:
        hash(items)
    except TypeError:
        return None
    return items


def signature_start(prim: Primitive, params: dict[str, Any]) -> list[Any] | None:
    """The first items of a call's signature: the primitive and its parameters' key; None if the
    primitive does not batch or a parameter is unhashable (then the call runs on its own)."""
    spec = prim.batch
    if spec is None:
        return None
    if not params:
        return [prim, None]
    try:
        fixed = _params_key(spec, params)
        hash(fixed)
    except TypeError:
        return None
    return [prim, fixed]


def _params_key(spec: Batching, params: dict[str, Any]) -> Hashable:
    """The parameters' part of a signature; of a stacked parameter, its shape and dtype only."""
    if not params:
        return None
    rows = spec.rows
    key = spec.key
    fixed = key(params) if key is not None else tuple([i for i in params.items() if i[0] not in rows])
    if not rows:
        return fixed
    if len(rows) == 1:  # labels, indices: this runs for every such op of a batch
        v = params[rows[0]]
        return (fixed, (type(v), v.shape, v.dtype))
    return (fixed, *[(type(v), v.shape, v.dtype) for v in map(params.__getitem__, rows)])


def check_calls(
    prim: Primitive,
    first: tuple[Any, ...],
    merged: dict[str, Any],
    calls: list[dict[str, Any]],
    each: Callable[[], object],
) -> None:
    """The own checks of merged calls of ``prim`` (their first one's inputs ``first``, their
    ``merged`` parameters, each one's parameters ``calls``): one check of them all where the
    primitive has one (``Batching.check_merged``, for stacked parameters such as labels); else,
    or if it fails, ``each`` call's own check in turn, so that an error names that call's values.
    Calls without stacked parameters differ in nothing a check reads: the first one's check
    stands for all."""
    spec = prim.batch
    assert spec is not None and prim.check is not None
    if not spec.rows:
        prim.check(*first, **calls[0])
        return
    if spec.check_merged is not None:
        try:
            spec.check_merged(first, merged, calls)
            return
        except Exception:  # noqa: BLE001 - the calls' own checks say which one failed, and how
            pass
    each()


def _cost(tapes: list[OpTape]) -> float:
    return sum(t.estimate_cost() for t in tapes)


def _is_shared(spec: Batching, i: int, t: Any) -> bool:
    """Whether input ``i`` of a call (its tape ``t``) is shared by the merged calls (a weight, or a
    float constant, where the op allows it) rather than stacked."""
    return (spec.elementwise or i in spec.shared) and (
        getattr(t, "weight", None) is not None or (type(t.data) is float and not t.requires_delta)
    )


def merged_params(spec: Batching, calls: list[dict[str, Any]], first: Any) -> dict[str, Any]:
    """The parameters of merged calls (``calls``: each call's; ``first``: the first call's first
    input): the first call's, with stacked parameters stacked and ``axis`` shifted past the rows."""
    params = calls[0]
    if spec.rows:
        params = {**params}
        for name in spec.rows:
            column = [call[name] for call in calls]
            params[name] = stack_arrays(np if type(column[0]) is np.ndarray else namespace(column[0]), column)
    if spec.axis:
        item_rank = 0 if type(first) is float else len(first.shape)
        params = {**params, "axis": _shift(params.get("axis", spec.axis_default), item_rank)}
    return params


def _shift(axis: Any, rank: int) -> Any:
    """An item's ``axis`` on stacked rows (the row axis is 0)."""
    if axis is None:
        return tuple(range(1, rank + 1))
    if isinstance(axis, tuple):
        return tuple(_shift(a, rank) for a in axis)
    return axis + 1 if axis >= 0 else axis


def _scalar(spec: Batching, datas: tuple[Any, ...], params: dict[str, Any]) -> bool:
    """Whether a call's result is a Python float (as the unbatched op gives it)."""
    if spec.scalar == "inputs":
        return all(type(d) is float for d in datas)
    if spec.scalar == "reduce":
        return params.get("axis") is None and not params.get("keepdims", False)
    return spec.scalar == "always"


def _forward(tapes: list[OpTape], fan: FanOut | None) -> list[OpTape]:
    """The merged forward kernel: stacks the rows, applies the primitive once, hands out rows.
    ``fan``: the calls share ``fan.shared`` inputs and are merged by ``fan``'s rules."""
    first = tapes[0]
    prim = first.prim
    spec = prim.batch
    assert spec is not None
    n = len(tapes)
    for t in tapes:
        t.args = tuple([x.data for x in t.inputs])
    datas = first.args
    calls = [t.params for t in tapes]
    params = first.params if fan is not None else merged_params(spec, calls, datas[0])
    check = prim.check
    if check is not None:  # every call's own check, so an error names that call's shapes
        check_calls(prim, datas, params, calls, lambda: [check(*t.args, **t.params) for t in tapes])
    arrays = [d for d in datas if type(d) is not float]
    xp = np if not arrays or type(arrays[0]) is np.ndarray else namespace(*arrays)
    float_dtype = next((d.dtype for d in arrays if xp.isdtype(d.dtype, "real floating")), xp.float64)
    if fan is None:
        stacked = [not _is_shared(spec, i, t) for i, t in enumerate(first.inputs)]
    else:
        stacked = [i not in fan.shared for i in range(len(datas))]
    rank = max((len(d.shape) for d in arrays), default=0)
    args: list[Any] = []
    for i, d in enumerate(datas):
        if not stacked[i]:
            args.append(d)
            continue
        if fan is not None:  # the fan rules take the calls' values as they are
            args.append(tuple([t.args[i] for t in tapes]))
            continue
        a = stack_values(xp, [t.args[i] for t in tapes], float_dtype)
        if spec.elementwise and a.ndim - 1 < rank:  # so that rows broadcast as their calls did
            a = xp.reshape(a, (n,) + (1,) * (rank - a.ndim + 1) + tuple(a.shape[1:]))
        args.append(a)
    if fan is None:
        forward = spec.forward or prim.forward
        vjps = spec.vjps or prim.vjps
    else:
        forward, vjps = fan.forward, fan.vjps
    try:
        out = forward(xp, *args, **params)
    except ValueError as e:
        for t in tapes:  # the call that does not fit raises its own error
            t.compute()
        shapes = " and ".join(str(shape_of(d)) for d in datas)  # pragma: no cover - defensive
        raise ShapeError(f"{prim.name}: operands of shapes {shapes} do not fit: {e}") from e
    saved = None
    if prim.saves:
        out, saved = out
    scalar = fan is None and _scalar(spec, datas, first.params)
    group = _OpGroup(prim, tapes, args, stacked, out, saved, params, xp, vjps, fan is not None)
    members = BatchGroup(n, group.backward)
    for k, t in enumerate(tapes):
        t.data = result_row(out, k, scalar)
        t.xp = xp
        t.group = members
        t.index = k
    return tapes


class _OpGroup:
    """A merged op's stacked arguments and result, kept for its one backward. It holds its members'
    inputs, not the members themselves (which point to it): no reference cycle."""

    __slots__ = ("args", "fan", "inputs", "items", "out", "params", "prim", "saved", "stacked", "vjps", "xp")

    def __init__(
        self,
        prim: Primitive,
        tapes: list[OpTape],
        args: list[Any],
        stacked: list[bool],
        out: Any,
        saved: Any,
        params: dict[str, Any],
        xp: Any,
        vjps: tuple[Rule, ...],
        fan: bool,
    ) -> None:
        self.prim = prim
        self.vjps = vjps
        self.fan = fan  # merged by the primitive's FanOut rules (their deltas have exact shapes)
        self.inputs = [t.inputs for t in tapes]
        self.items = [t.args for t in tapes]  # each member's own arguments (the rows' shapes)
        self.args = args
        self.stacked = stacked
        self.out = out
        self.saved = saved
        self.params = params
        self.xp = xp

    def cost(self) -> float:
        """The merged op's cost (asked for only by an executor with a pool): its primitive's cost
        on the stacked arguments, which is the members' total (the members' own, summed, for calls
        merged by fanning out)."""
        if self.fan:
            return sum(self.prim.cost(*items, **self.params) for items in self.items)
        return self.prim.cost(*self.args, **self.params)

    def backward(self, deltas: list[list[Do[Any]] | None]) -> Do[None]:
        """The members' backward, merged: one vjp kernel per input that wants a delta."""
        inputs = self.inputs
        n = len(inputs)
        wanted = [i for i in range(len(self.args)) if any(xs[i].requires_delta for xs in inputs)]
        if not wanted:  # every input is a constant: nothing to give a delta or to release
            return UNIT
        delta = stacked_delta(self.xp, deltas, self.out, self.cost, shared=len(wanted) > 1)
        if delta is None:
            return run_unit((x.release() for xs in inputs for x in xs if x.requires_delta), private=True)
        is_present = [d is not None for d in deltas]
        parts: list[Do[None]] = []
        for i in wanted:
            vjp = functools.partial(self._vjp, i)
            if not self.stacked[i]:  # one weight for all: one delta, and a release per other call
                shared = inputs[0][i]
                parts.append(shared.backward(PrivateBind((delta,), vjp, KERNEL_MAP, self.cost)))
                parts.extend(shared.release() for _ in range(n - 1))
                continue
            rows: Do[Any] = Bind((delta,), vjp, KERNEL_MAP, self.cost)
            for k, xs in enumerate(inputs):
                x = xs[i]
                if not x.requires_delta:
                    continue
                if is_present[k]:
                    parts.append(x.backward(RowOf(rows, k, self.items[k][i], self.xp)))
                else:
                    parts.append(x.release())
        return run_unit(parts, private=True)

    def _vjp(self, i: int, delta: Any) -> Any:
        prim = self.prim
        xp = self.xp
        g = self.vjps[i](xp, delta, self.saved if prim.saves else self.out, *self.args, **self.params)
        if prim.broadcasts and not self.fan:
            g = unbroadcast(xp, g, self.args[i])
        elif type(g) is SparseRows and not getattr(self.inputs[0][i], "sparse_deltas", False):
            g = g.to_dense(xp)
        return g
