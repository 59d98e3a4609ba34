"""Static shapes and dtypes: what a layer's ``.shape`` and ``.dtype`` know before it runs.

A layer's value is computed only when it runs, but for most ops its shape and dtype follow from
its inputs' and the op's parameters. :func:`static_info` walks a layer's graph (on the first
access of ``.shape`` or ``.dtype``, never while the graph is built) and applies each primitive's
``shape_rule`` (see :class:`~monadl.do.primitive.Primitive`; a library op's is declared with it,
in its family's module under ``monadl.dsl.ops``) to its inputs' static information, a weight's or
a constant's being its data's shape and dtype.

Everything else gives None: ops without a rule (a user's ``custom_op`` made without
``shape_rule=``), ``@batchable`` calls (their body's graph is built only when they run), and
anything built from ``Do`` combinators. A user's rule that fails raises :class:`ShapeRuleError`.

A graph that cannot run has no shape: before a library op's rule, its run's own checks (the
primitive's ``check`` and ``check_values``) run on stand-ins of its inputs (arrays of their shapes
and dtypes, of one element broadcast: no memory), so ``.shape`` raises the error the run would
give, a :class:`~monadl.ShapeError` naming the op and the shapes, where the run would refuse the
operands. Operands that do not broadcast (the elementwise ops, which have no check) raise it too,
as the run words it (``add: operands of shapes (3, 4) and (5,) do not fit: ...``).

The dtype follows the run's rule: a constant operand (one that depends on no weight) wider than
the op's layers and weights reads as their dtype (``scheduler.cast_constants``: a float32 model
stays float32 beside a float64 array); then NumPy 2's promotion (``result_type``) of the array
operands' dtypes, a Python float (a float literal, a ``FloatWeight``, a ``FloatLayer``) keeping an
array's dtype. A rule gives ``(shape, dtype, xp)``: ``xp`` is the array namespace that promotes
dtypes (None for a float, whose ``(shape, dtype)`` is ``((), float)``); it sees its operands
already cast. A graph keeps an op row's ``(info, weighted)`` (``Graph.statics``):
``weighted`` says whether its value depends on a weight (so is no constant for the op that reads
it).
"""

from __future__ import annotations

from typing import Any, Final

from monadl.do.do import PURE
from monadl.do.graph import CONST, NODE, OP, WEIGHT, Graph
from monadl.do.primitive import Primitive
from monadl.dsl.core import layers
from monadl.dsl.ops.shape_rules import FLOAT, Info, Mismatch, ShapeRule, ShapeRuleError
from monadl.typeclasses.backend import NDARRAY, NUMPY, ShapeError, namespace

_NONE: Final[tuple[Info | None, bool]] = (None, False)  # an op's record where its info is not known


def static_info(graph: Graph, row: int) -> Info | None:
    """The static shape, dtype and namespace of row ``row``'s value, or None where they are not
    known before it runs. The graph keeps each op's result, so each row is worked out once; the
    walk is a loop (a graph as deep as a long sequence is no recursion)."""
    statics = graph.statics
    found: tuple[Info | None, bool] | None = statics.get(row)
    if found is not None:
        return found[0]
    tags = graph.tags
    if tags[row] != OP:
        return _leaf(graph, row)[0]
    stack = [row]
    while stack:
        top = stack[-1]
        if top in statics:
            stack.pop()
            continue
        pending = [a for a in graph.inputs(top) if tags[a] == OP and a not in statics]
        if pending:
            stack.extend(pending)
            continue
        stack.pop()
        statics[top] = _apply(graph, top)
    info: Info | None = statics[row][0]
    return info


def _leaf(graph: Graph, row: int) -> tuple[Info | None, bool]:
    """A weight's or a constant's information, and whether it is a weight; None for another row
    that is not an op (a batchable call's, a result's; a node of the monad's, unless its value is
    a tape already)."""
    tag = graph.tags[row]
    obj = graph.objs[row]
    if tag == CONST:
        return _of_data(obj), False
    if tag == WEIGHT:
        return _of_data(obj.data), True
    if tag == NODE and obj.tag == PURE:
        return _of_data(getattr(getattr(obj, "value", None), "data", None)), False
    return _NONE


def _of_data(data: object) -> Info | None:
    if type(data) is float:
        return FLOAT
    if type(data) is NDARRAY:
        return (tuple(data.shape), data.dtype, NUMPY)
    shape = getattr(data, "shape", None)
    if shape is None or any(type(n) is not int for n in shape):  # (a lazy array's unknown sides)
        return None
    return (tuple(shape), getattr(data, "dtype", None), namespace(data))


def _apply(graph: Graph, row: int) -> tuple[Info | None, bool]:
    """Row ``row``'s information (an op's) and whether it depends on a weight."""
    prim: Primitive = graph.objs[row]
    rule: ShapeRule | None = prim.shape_rule
    if rule is None:
        return _NONE
    inputs = []
    weighted = []
    for source in graph.inputs(row):
        if graph.tags[source] == OP:
            info, w = graph.statics[source]
        else:
            info, w = _leaf(graph, source)
        if info is None:
            return _NONE
        inputs.append(info)
        weighted.append(w)
    cast = _cast_constants(inputs, weighted)
    params = graph.params[row]
    if prim.own:
        _run_checks(prim, cast, params)
    try:
        return rule(*cast, **params), any(weighted)
    except ShapeRuleError:  # a wrong rule, not operands that do not fit
        raise
    except Mismatch as e:
        if not prim.own:  # (a user's op reports its operands itself, when it runs)
            return _NONE
        shapes = " and ".join("float" if x is None else str(shape) for shape, _, x in cast)
        raise ShapeError(f"{prim.name}: operands of shapes {shapes} do not fit: {e}") from None
    except (
        ValueError,
        TypeError,
        IndexError,
        ZeroDivisionError,
    ):  # operands that a rule cannot read: the run says what is wrong with them
        return _NONE


def _stand_in(info: Info) -> Any:
    """An array of ``info``'s shape and dtype in its namespace, one element broadcast (no memory);
    a float for a float."""
    shape, dtype, xp = info
    if xp is None:
        return 0.0
    return xp.broadcast_to(xp.zeros((), dtype=dtype), shape)


def _run_checks(prim: Primitive, inputs: list[Info], params: dict[str, Any]) -> None:
    """The checks a run of library op ``prim`` makes before its forward (they read the inputs'
    shapes and dtypes and the parameters, never the inputs' values), on stand-ins of the inputs:
    their error (a ``ShapeError``, or a ``ValueError`` such as a label out of range) is raised as
    the run would raise it."""
    if prim.check is None and prim.check_values is None:
        return
    try:
        datas = [_stand_in(x) for x in inputs]
    except (TypeError, ValueError, AttributeError):  # a namespace without broadcast_to
        return
    try:
        if prim.check is not None:
            prim.check(*datas, **params)
        if prim.check_values is not None:
            prim.check_values(*datas, **params)
    except ValueError:
        raise
    except (TypeError, AttributeError, IndexError):  # (a check met what a stand-in is not)
        return


def _cast_constants(inputs: list[Info], weighted: list[bool]) -> list[Info]:
    """``inputs`` as the op reads them: a constant array wider than the layers' promoted dtype in
    that dtype, as ``scheduler.cast_constants`` makes it in a run."""
    if len({x for _, _, x in inputs if x is not None}) > 1:
        return inputs  # arrays of two namespaces: the run says they do not mix
    layers: Any = None
    xp: Any = None
    for (_, d, x), w in zip(inputs, weighted, strict=True):
        if w and x is not None:
            layers, xp = (d, x) if layers is None else (xp.result_type(layers, d), xp)
    if layers is None:  # constants alone (or with float layers): the namespace's promotion
        return inputs
    out = list(inputs)
    for i, ((shape, d, x), w) in enumerate(zip(inputs, weighted, strict=True)):
        if w or x is None or d == layers or not xp.isdtype(d, "real floating"):
            continue
        if xp.result_type(layers, d) != layers:  # wider than the layers
            out[i] = (shape, layers, x)
    return out


layers.STATIC_INFO.append(static_info)  # what ``.shape`` and ``.dtype`` ask (see monadl.dsl.core.layers)
