"""Batchable operations (as TensorFlow Fold does): a differentiable function whose calls merge.

``@batchable`` declares a function of layers a batchable operation. A call records one node (a
``Call``) instead of the function's whole graph. The scheduler merges the calls with equal
signatures that are ready together (the function; the identities of the weights and other
non-layer arguments it is given, or the type and value of a plain int, float, str or bool,
keyword arguments alike; each layer argument's per-row shape, dtype and array type): each layer
argument of the calls is stacked into one array of rows, the function's body runs *once* on those
stacked layers, and row k of each result goes back to call k. The cost of recording and running a
cell of a Tree-LSTM is then independent of the number of nodes it is applied to. Its backward is
merged too: it is the body's backward, on the stacked rows.

The body must treat a leading axis as the rows' axis: ``linear``, elementwise ops and
``concatenate(..., axis=-1)`` do. A call that merges with no other (and every call when batching is
off) runs the body on its own arguments: it computes what the undecorated function computes. Merged
or not, a body is recorded once per signature (per executor) and its program replayed for the later
calls of that signature, so Python code in the body (a branch on outside state, a print, a raise)
runs when the signature is first met, not at every call: keep the body a function of its
arguments, as for ``jax.jit``. The first call
of an operation also builds the body's graph once, and drops it, to learn its result's structure (a
layer, or a tuple of layers), which must be the same for every call; it is then recorded as every
call is, so that a process's first run computes (and rounds) as every later one does. The body must
read only its arguments (and weights): a layer it reads from elsewhere is an error when it runs
merged.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Hashable
from typing import Any, Final, Generic, ParamSpec, TypeVar, cast, final

from mypy_extensions import mypyc_attr

from monadl.do.do import Call, Node, Operation, Pure
from monadl.do.graph import CALL, RESULT, Graph, recording
from monadl.do.primitive import float_key
from monadl.do.tape import Tape
from monadl.dsl.core.apply import forward_of, row_in
from monadl.dsl.core.base import Differentiable
from monadl.dsl.core.deep_learning import DeepLearning
from monadl.dsl.core.layers import ArrayLayer, FloatLayer, array_layer, float_layer
from monadl.dsl.core.weights import ArrayWeight, FloatWeight
from monadl.typeclasses.backend import is_array

P = ParamSpec("P")
R = TypeVar("R")

Layer = ArrayLayer | FloatLayer


def batchable(f: Callable[P, R]) -> Callable[P, R]:
    """Declares ``f``, a function of layers returning a layer or a tuple of layers, a batchable
    operation: its calls of equal signature merge into one call on stacked rows (see the module)."""
    return cast("Callable[P, R]", BatchableOperation(f))


@mypyc_attr(native_class=False)  # a Python class (a method descriptor, wrapped), compiled methods
class BatchableOperation(Operation, Generic[P, R]):
    """A batchable operation: ``f`` and the structure of its results (``plan``, learnt on the first
    call)."""

    def __init__(self, f: Callable[P, R]) -> None:
        super().__init__(f.__qualname__)
        functools.update_wrapper(self, f)
        self.f = f
        # Learnt on the first call: the results' layer types, whether f returns one layer (not a
        # tuple), and the name; one attribute of this Python class (a dictionary lookup) for a call.
        self.plan: tuple[tuple[type[Layer], ...], bool, str] | None = None

    def __get__(self, instance: object, owner: type | None = None) -> Any:
        return self if instance is None else BoundOperation(self, instance)

    def __repr__(self) -> str:
        return f"batchable({self.f.__qualname__})"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return record_call(self, args, kwargs)

    def _learn(self, result: object) -> tuple[tuple[type[Layer], ...], bool, str]:
        results = result if isinstance(result, tuple) else (result,)
        if not results or not all(isinstance(r, (ArrayLayer, FloatLayer)) for r in results):
            raise TypeError(
                f"batchable {self.f.__qualname__}: must return a layer or a tuple of layers, "
                f"got {type(result).__name__}"
            )
        structure = tuple(type(r) for r in results)
        self.scalars = [cls is FloatLayer for cls in structure]
        plan = self.plan = (structure, not isinstance(result, tuple), self.name)
        return plan

    def expand(self, call: Call, inputs: list[Tape[Any, Any]]) -> list[Node]:
        """The forwards of the body's results, the body run on ``inputs`` (a call's own values, or
        the stacked rows of a group's) in place of the call's layer arguments."""
        args = list(call.args)
        for i, tape in zip(call.row_args, inputs, strict=True):
            args[i] = FloatLayer(Pure(tape)) if type(tape.data) is float else ArrayLayer(Pure(tape))
        result = self.f(*args, **call.kwargs)
        results = result if isinstance(result, tuple) else (result,)
        plan = self.plan
        assert plan is not None
        structure = plan[0]
        if len(results) != len(structure):
            raise TypeError(
                f"batchable {self.name}: returned {len(results)} results, where its first call "
                f"returned {len(structure)}"
            )
        return [forward_of(r, self.name) for r in results]


def record_call(op: BatchableOperation[Any, Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Records a call of ``op`` on ``args`` and ``kwargs``: its node, and its results' layers."""
    plan = op.plan
    if plan is None:
        # Building the graph computes nothing: the body's result is only looked at, and the
        # call is recorded below like any other (run directly, it would round differently).
        plan = op._learn(op.f(*args, **kwargs))
    structure, single, name = plan
    # Recording one call: this runs once per node of every tree, so it is written out.
    graph = recording()
    # The static arguments of the operation's last call in this graph: its Call is shared.
    shared: Call | None = None if kwargs else graph.calls.get(op)
    if shared is None or not _same_statics(shared, args):
        shared = _new_call(graph, op, args, kwargs)
    rows: list[int] = []
    for i in shared.row_args:
        rows.append(row_in(graph, args[i], name))
    call = graph.add(CALL, shared, None, rows, None, 0)
    if single:
        return _layer(structure[0], graph, call)
    first = _layer(structure[0], graph, call)
    if len(structure) == 2:  # (a cell's state: no list made to be copied into the tuple)
        return first, _layer(structure[1], graph, graph.add(RESULT, None, 1, [call], None, 0))
    results = [first]
    for j in range(1, len(structure)):  # a loop: a comprehension is a call of its own in 3.11
        results.append(_layer(structure[j], graph, graph.add(RESULT, None, j, [call], None, 0)))
    return tuple(results)


@final
class BoundOperation:
    """A batchable operation as a method of ``instance`` (``module.cell``, a cell's operation read
    from the module): calling it records the operation's call with ``instance`` first. (A bound
    method would reach the call through the operation type's generic call slot: a cell is called
    once per node of every tree.)"""

    def __init__(self, op: BatchableOperation[Any, Any], instance: object) -> None:
        self.op = op
        self.instance = instance

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return record_call(self.op, (self.instance, *args), kwargs)

    def __repr__(self) -> str:
        return f"<bound {self.op!r} of {self.instance!r}>"


def _new_call(
    graph: Graph, op: BatchableOperation[Any, Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Call:
    """The Call of ``op`` on ``args`` and ``kwargs``: the operation's call to share in ``graph``
    from now on if it has no keyword arguments."""
    row_args: list[int] = []
    statics: list[Hashable] = []
    for i, a in enumerate(args):
        kind = type(a)
        row = _row_kinds.get(kind)
        if row is None:
            row = _row_kind(a)
        # The signature's static part has an entry per argument, a row's a marker: f(x, w) and
        # f(w, x) (a layer and a weight swapped) do not merge.
        if row == _LAYER_ROW or row == _VALUE_ROW:
            row_args.append(i)
            statics.append(_ROW)
        else:
            statics.append(_static_key(a))
    if kwargs:
        statics.append(tuple([(key, _static_key(v)) for key, v in kwargs.items()]))
    else:
        kwargs = _NO_KWARGS  # (the call's own empty dict is freed now, not with the graph)
    statics.append(op)
    # The call keeps its arguments but its rows (its row's inputs): a layer held by its own
    # graph would be a reference cycle.
    kept = list(args)
    for i in row_args:
        kept[i] = None
    call = Call(op, tuple(kept), kwargs, row_args, tuple(statics))
    if kwargs is _NO_KWARGS:  # (a call with keyword arguments shares none: see _same_statics)
        graph.calls[op] = call
    return call


def _same_statics(call: Call, args: tuple[Any, ...]) -> bool:
    """Whether a call on ``args`` (no keyword arguments) has ``call``'s static part: a row
    argument where it has one, and its other arguments (the same objects, or plain scalars of
    equal static key). Such calls share one Call: a row's Call is only read."""
    static = call.static
    kept = call.args
    n = len(args)
    if len(kept) != n or len(static) != n + 1:  # (a call with keyword arguments has one more)
        return False
    for i in range(n):
        a = args[i]
        s = static[i]
        if s is _ROW:
            row = _row_kinds.get(type(a))
            if row is None or row == _STATIC_ROW:
                return False
        elif a is not kept[i]:
            # (An object's key is its identity, and ``kept[i]`` holds it: another object's differs.)
            row = _row_kinds.get(type(a))
            if row is None or row != _STATIC_ROW or _static_key(a) != s:
                return False
    return True


def _layer(kind: type[Layer], graph: Graph, row: int) -> Layer:
    """A layer of ``kind`` for row ``row`` (made natively: a type called as an object is a generic
    call)."""
    return array_layer(graph, row) if kind is ArrayLayer else float_layer(graph, row)


# How an argument is recorded (see _row_kind); Final, so that compiled code reads them as constants.
_STATIC_ROW: Final = 0
_LAYER_ROW: Final = 1
_VALUE_ROW: Final = 2


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


_row_kinds: Final[dict[type, int]] = {}
_NO_KWARGS: Final[dict[str, Any]] = {}  # shared by the calls without keyword arguments: never changed
_ROW: Final = "row"  # a row argument's entry in a call's static key (a static's is a tuple or an int)


def _static_key(a: object) -> Hashable:
    """A non-layer argument's part of a signature: its value if a plain scalar, else its identity
    (the weights a call is given, the object a method is bound to)."""
    if type(a) is float:
        return ("value", float, float_key(a))
    kind = type(a)
    return ("value", kind, a) if kind is int or kind is str or kind is bool else id(a)
