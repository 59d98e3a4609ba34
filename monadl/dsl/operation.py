"""Batchable operations (as TensorFlow Fold does): a differentiable function whose calls merge.

``@batchable`` declares a function of layers a batchable operation. A call records one node instead
of the function's whole graph. When the executor runs it with dynamic batching, the calls with
equal signatures (the function; the identities of the weights and other non-layer arguments it is
given, or the type and value of a plain int, float, str or bool, keyword arguments alike; each
layer argument's per-row shape, dtype and array type) merge: each layer argument of the
calls is stacked into one array of rows, the function's body runs *once* on those stacked layers,
and row k of each result goes back to call k. The cost of recording and running a cell of a
Tree-LSTM is then independent of the number of nodes it is applied to. Its backward is merged too:
the rows' deltas are stacked for the body's backward, and the stacked inputs' deltas are split back.

The body must treat a leading axis as the rows' axis: ``linear``, elementwise ops and
``concatenate(..., axis=-1)`` do. A call that merges with no other (and every call when batching is
off) runs the body on its own arguments, exactly as the undecorated function would. The first call
of an operation runs the body directly too, to learn its result's structure (a layer, or a tuple of
layers), which must be the same for every call.
"""

from __future__ import annotations

import functools
import math
import types
from collections.abc import Callable, Hashable, Sequence
from typing import Any, Generic, ParamSpec, TypeVar, cast

import numpy as np

from monadl.do.do import FLAT, MAP, Batch, Bind, Do, Pure, gather_all, run_unit
from monadl.dsl.apply import forward_of
from monadl.dsl.base import Differentiable
from monadl.dsl.layers import ArrayLayer, FloatLayer
from monadl.dsl.weights import ArrayWeight, FloatWeight
from monadl.tape.batch import (
    BatchGroup,
    RowOf,
    RowTape,
    float_key,
    result_row,
    stack_values,
    stacked_delta,
    value_key,
)
from monadl.tape.shared import SharedTape, _current_step
from monadl.tape.tape import Tape
from monadl.typeclasses.backend import ShapeError, is_array, namespace, shape_of
from monadl.typeclasses.deep_learning import DeepLearning
from monadl.typeclasses.monoid import SUM

P = ParamSpec("P")
R = TypeVar("R")

Layer = ArrayLayer | FloatLayer


def batchable(f: Callable[P, R]) -> Callable[P, R]:
    """Declares ``f``, a function of layers returning a layer or a tuple of layers, a batchable
    operation: its calls of equal signature merge into one call on stacked rows (see the module)."""
    return cast("Callable[P, R]", Operation(f))


class Operation(Generic[P, R]):
    """A batchable operation: ``f`` and the structure of its results (learnt on the first call)."""

    def __init__(self, f: Callable[P, R]) -> None:
        functools.update_wrapper(self, f)
        self.f = f
        self.structure: tuple[type[Layer], ...] | None = None  # the results' layer types
        self.single = True  # f returns one layer (not a tuple)
        self.projections: list[tuple[type[Layer], Callable[..., Any]]] | None = None  # learnt with them

    def __get__(self, instance: object, owner: type | None = None) -> Any:
        return self if instance is None else types.MethodType(self, instance)

    def __repr__(self) -> str:
        return f"batchable({self.f.__qualname__})"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        projections = self.projections
        if projections is None:
            result = self.f(*args, **kwargs)
            self._learn(result)
            return result
        # Recording one call: this runs once per node of every tree, so it is written out.
        rows: list[int] = []
        statics: list[Hashable] = []
        sources: list[Do[Any]] = []
        for i, a in enumerate(args):
            kind = type(a)
            row = _row_kinds.get(kind)
            if row is None:
                row = _row_kind(a)
            if row == _LAYER_ROW:
                rows.append(i)
                sources.append(a.forward)
            elif row == _VALUE_ROW:
                rows.append(i)
                sources.append(forward_of(a, self.f.__qualname__))
            else:
                statics.append(_static_key(a))
        kwkey = tuple([(name, _static_key(v)) for name, v in kwargs.items()]) if kwargs else ()
        call = _Call(self, args, kwargs, rows, (self, tuple(statics), kwkey))
        node: Do[Any] = Bind(tuple(sources), call, FLAT)
        if self.single:
            cls, item = projections[0]
            return cls(Bind((node,), item, MAP))
        results = []
        for cls, item in projections:  # a loop: a comprehension is a call of its own in Python 3.11
            results.append(cls(Bind((node,), item, MAP)))
        return tuple(results)

    def _learn(self, result: object) -> None:
        results = result if isinstance(result, tuple) else (result,)
        if not results or not all(isinstance(r, (ArrayLayer, FloatLayer)) for r in results):
            raise TypeError(
                f"batchable {self.f.__qualname__}: must return a layer or a tuple of layers, "
                f"got {type(result).__name__}"
            )
        self.single = not isinstance(result, tuple)
        self.structure = tuple(type(r) for r in results)
        # A call's results are projections of its node: the same functions for every call.
        self.projections = [(cls, functools.partial(_item, j)) for j, cls in enumerate(self.structure)]


_STATIC_ROW, _LAYER_ROW, _VALUE_ROW = range(3)
_PLAIN = (int, float, str, bool)


def _row_kind(a: object) -> int:
    """Whether an argument of this type is a static (a weight, an object, a scalar: shared by all
    rows), a layer (stacked; its ``forward``), or another value that is stacked (an array, a user's
    differentiable type); learnt once per type, since a check against the DeepLearning protocol is
    slow."""
    kind = type(a)
    if issubclass(kind, (ArrayWeight, FloatWeight)):
        row = _STATIC_ROW
    elif issubclass(kind, Differentiable):
        row = _LAYER_ROW
    elif is_array(a) or isinstance(a, DeepLearning):
        row = _VALUE_ROW
    else:
        row = _STATIC_ROW
    _row_kinds[kind] = row
    return row


_row_kinds: dict[type, int] = {}


def _static_key(a: object) -> Hashable:
    """A non-layer argument's part of a signature: its value if a plain scalar, else its identity
    (the weights a call is given, the object a method is bound to)."""
    if type(a) is float:
        return ("value", float, float_key(a))
    return ("value", type(a), a) if type(a) in _PLAIN else id(a)


def _item(j: int, tapes: tuple[Tape[Any, Any], ...]) -> Tape[Any, Any]:
    return tapes[j]


class _Call:
    """One call of an operation: its arguments, and (once its layer arguments ran) their tapes."""

    __slots__ = ("args", "kwargs", "op", "rows", "static", "tapes")

    def __init__(
        self,
        op: Operation[Any, Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        rows: list[int],
        static: Hashable,
    ) -> None:
        self.op = op
        self.args = args
        self.kwargs = kwargs
        self.rows = rows
        self.static = static  # the signature's part that is known when the call is made
        self.tapes: tuple[Tape[Any, Any], ...] = ()

    def __call__(self, *tapes: Tape[Any, Any]) -> Do[tuple[Tape[Any, Any], ...]]:
        self.tapes = tapes
        return Batch(_alone, (self,), OPERATION_BATCHER)

    def arguments(self, layers: Sequence[object]) -> list[Any]:
        """The arguments, with ``layers`` in place of the layer (row) arguments."""
        args = list(self.args)
        for i, layer in zip(self.rows, layers, strict=True):
            args[i] = layer
        return args

    def results(self, layers: Sequence[object]) -> Do[tuple[Tape[Any, Any], ...]]:
        """The tapes of the body's results, run on ``layers`` in place of the layer arguments."""
        return gather_all(self.forwards(layers))

    def forwards(self, layers: Sequence[object]) -> list[Do[Tape[Any, Any]]]:
        """The forward of each of the body's results, recorded on ``layers`` in place of the layer
        arguments."""
        result = self.op.f(*self.arguments(layers), **self.kwargs)
        results = result if isinstance(result, tuple) else (result,)
        return [forward_of(r, self.op.f.__qualname__) for r in results]


def _layer(tape: Tape[Any, Any]) -> Layer:
    return FloatLayer(Pure(tape)) if type(tape.data) is float else ArrayLayer(Pure(tape))


def _alone(call: _Call) -> Do[tuple[Tape[Any, Any], ...]]:
    """A call on its own: the body on the call's own arguments, as the plain function."""
    return call.results([_layer(t) for t in call.tapes])


class OperationBatcher:
    """The :class:`~monadl.do.batching.Batcher` of batchable operations."""

    def signature(self, node: Any) -> Hashable | None:
        call: _Call = node.args[0]
        rows = [value_key(t.data) for t in call.tapes]
        return None if mixed_ranks(rows) else (call.static, *rows)

    def name(self, node: Any) -> str:
        call: _Call = node.args[0]
        return call.op.f.__qualname__

    def fan_signature(self, node: Any) -> Hashable | None:
        return None  # an operation's calls merge only as rows

    def run_fan(self, nodes: list[Any]) -> Do[list[Any]]:  # pragma: no cover - no fan signatures
        raise NotImplementedError("batchable operations do not fan out")

    def run(self, nodes: list[Any]) -> Do[list[Any]]:
        calls: list[_Call] = [node.args[0] for node in nodes]
        first = calls[0]
        step = _current_step.get()
        stacked = [_stack([c.tapes[j] for c in calls], step) for j in range(len(first.rows))]
        body = first.results([_layer(t) for t in stacked])
        structure = first.op.structure
        assert structure is not None  # learnt by the operation's first call
        return Bind((body,), functools.partial(_scatter, first.op, len(calls), step, structure), MAP)


OPERATION_BATCHER = OperationBatcher()


def _stack(tapes: list[Tape[Any, Any]], step: Any) -> Tape[Any, Any]:
    """The calls' values of one layer argument as the rows of one tape."""
    datas = [t.data for t in tapes]
    xp = np if type(datas[0]) in (float, np.ndarray) else namespace(datas[0])
    data = stack_values(xp, datas, np.float64)
    wanting = [(k, t) for k, t in enumerate(tapes) if t.requires_delta]
    if not wanting:
        return Tape(data)
    for _, t in wanting:
        t.acquire()
    tape = StackTape(data, wanting)
    if step is not None:
        step.register(tape)
    return tape


class StackTape(SharedTape[Any, Any]):
    """Tapes stacked as rows: its delta is split back into the rows' tapes."""

    __slots__ = ("rows",)

    def __init__(self, data: Any, rows: list[tuple[int, Tape[Any, Any]]]) -> None:
        super().__init__(data, tuple(t for _, t in rows))
        self.rows = [k for k, _ in rows]
        self.fanout = len(rows)

    def _sum(self, deltas: Sequence[Do[Any]]) -> Do[Any]:
        return SUM.sum_lazy(deltas, float(math.prod(self.data.shape)))

    def _backward(self, delta: Do[Any]) -> Do[None]:
        xp = namespace(self.data)
        parts = [t.backward(RowOf(delta, k, t.data, xp)) for k, t in zip(self.rows, self.inputs, strict=True)]
        return run_unit(parts, private=True)


def mixed_ranks(rows: Sequence[Hashable]) -> bool:
    """Whether a call's row arguments (their ``value_key``s) differ in rank: stacked on a new first
    axis, a float row against an array row, or a vector against a matrix, would no longer
    broadcast as they did in the call, so such calls do not merge."""
    ranks = {0 if r is float else len(r[1]) for r in rows}  # type: ignore[index]
    return len(ranks) > 1


def check_rows(op: Operation[Any, Any], n: int, index: int, data: Any) -> None:
    """Raises if result ``index`` of ``op``'s body, run on ``n`` calls' stacked rows, is not ``n``
    rows (a body that reduces over the rows' axis, or reshapes it away)."""
    if type(data) is float or not data.shape or data.shape[0] != n:
        raise ShapeError(
            f"batchable {op.f.__qualname__}: run once on the stacked rows of {n} calls, its body gave "
            f"result {index} of shape {shape_of(data)}, not {n} rows: the body must keep a leading axis "
            "of rows (reduce and concatenate along axis=-1, not over every axis)"
        )


def _scatter(
    op: Operation[Any, Any],
    n: int,
    step: Any,
    structure: tuple[type[Layer], ...],
    results: tuple[Tape[Any, Any], ...],
) -> list[tuple[Tape[Any, Any], ...]]:
    """Row k of each of the body's results, as call k's results."""
    columns: list[list[Tape[Any, Any]]] = []
    for index, (out, kind) in enumerate(zip(results, structure, strict=True)):
        data = out.data
        check_rows(op, n, index, data)
        scalar = kind is FloatLayer
        rows_of = [result_row(data, k, scalar) for k in range(n)]
        if not out.requires_delta:
            columns.append([Tape(r) for r in rows_of])
            continue
        source = cast("SharedTape[Any, Any]", out)
        source.acquire()
        group = BatchGroup(n, functools.partial(_rows_backward, source))
        members: list[Tape[Any, Any]] = []
        for k, r in enumerate(rows_of):
            member = RowTape(r, source, group, k)
            if step is not None:
                step.register(member)
            members.append(member)
        columns.append(members)
    return [tuple(column[k] for column in columns) for k in range(n)]


def _rows_backward(source: SharedTape[Any, Any], deltas: list[list[Do[Any]] | None]) -> Do[None]:
    like = source.data
    delta = stacked_delta(namespace(like), deltas, like, float(math.prod(like.shape)), shared=False)
    return source.release() if delta is None else source.backward(delta)
