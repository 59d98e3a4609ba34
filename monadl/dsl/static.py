"""Static shapes and dtypes: what a layer's ``.shape`` and ``.dtype`` know before it runs.

A layer's value is computed only when it runs, but for most ops its shape and dtype follow from
its inputs' and the op's parameters. :func:`static_info` walks a layer's graph (on the first
access of ``.shape`` or ``.dtype``, never while the graph is built) and applies each primitive's
``shape_rule`` (see :class:`~monadl.do.primitive.Primitive`) to its inputs' static information:

* a weight or a constant: its data's shape and dtype;
* elementwise ops (the operators, activations, ``maximum``, ``clip``, ``where``, ``add_n``,
  ``dropout``): NumPy's broadcasting of the operands' shapes;
* ``matmul``, ``dot``, ``linear``; the reductions (``sum``, ``mean``, ``max``, ``min``,
  ``logsumexp``, ``var``, ``std``, with ``axis`` and ``keepdims``); ``reshape`` (a -1 solved),
  ``transpose``, ``concatenate``, ``stack``, ``split``; ``take_rows``, ``take_along_axis``, basic
  and advanced indexing; ``softmax``, ``log_softmax``, ``batch_norm``, ``layer_norm``,
  ``scaled_dot_product_attention``; ``conv1d``/``conv2d`` and the pools; ``nn.LSTM``'s and
  ``nn.GRU``'s layers.

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

import math
from collections.abc import Callable
from typing import Any, Final

import numpy as np

from monadl.do.do import PURE
from monadl.do.graph import CONST, NODE, OP, WEIGHT, Graph
from monadl.do.primitive import Primitive, add_n
from monadl.dsl import layers
from monadl.dsl import primitives as P
from monadl.typeclasses.backend import NDARRAY, NUMPY, ShapeError, namespace

Info = tuple[tuple[int, ...], Any, Any]
"""A value's static shape, dtype and array namespace (None for a Python float)."""
ShapeRule = Callable[..., "Info | None"]
"""``rule(*inputs, **params)``: the result's :data:`Info` from the inputs' (each an ``Info``),
or None where it is not known."""

FLOAT: Final[Info] = ((), float, None)
"""A Python float's information."""
_NONE: Final[tuple[Info | None, bool]] = (None, False)  # an op's record where its info is not known


class ShapeRuleError(TypeError):
    """A user's shape rule (``custom_op(shape_rule=)``) raised or gave no shape: ``.shape`` and
    ``.dtype`` raise it, naming the op, rather than read the op's shape as unknown."""


class Mismatch(ValueError):
    """Operands whose shapes do not broadcast, found by a rule (:func:`broadcast`): for a library
    op, the run's :class:`~monadl.ShapeError` is raised in its words."""


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
        rule = _per_arity(prim)
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


# ---------------------------------------------------------------------------------- the rules


def promoted(*inputs: Info) -> tuple[Any, Any]:
    """The dtype and namespace of the result of arrays (and floats) combined: NumPy 2's
    ``result_type`` of the arrays' dtypes, a float taking the arrays' (a float alone: float)."""
    dtype: Any = float
    xp: Any = None
    for _, d, x in inputs:
        if x is None:
            continue
        if xp is None:
            dtype, xp = d, x
        elif d != dtype:
            dtype = xp.result_type(dtype, d)
    return dtype, xp


def broadcast(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    """NumPy's broadcast of ``shapes`` (a :class:`Mismatch` where they do not broadcast)."""
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError as e:
        raise Mismatch(str(e)) from None


def elementwise(*inputs: Info, **_: Any) -> Info:
    """The rule of an elementwise op: its operands broadcast and promoted."""
    if len(inputs) == 1:
        return inputs[0]
    dtype, xp = promoted(*inputs)
    return broadcast(*[i[0] for i in inputs]), dtype, xp


def _same(x: Info, *rest: Any, **_: Any) -> Info:
    return x


def _reduced(x: Info, axis: Any = None, keepdims: bool = False, **_: Any) -> Info:
    if axis is None and not keepdims:
        return FLOAT
    shape = x[0]
    n = len(shape)
    axes = range(n) if axis is None else {a % n for a in (axis if type(axis) is tuple else (axis,))}
    kept = tuple(1 if k in axes else s for k, s in enumerate(shape) if keepdims or k not in axes)
    return kept, x[1], x[2]


def _reshape(x: Info, shape: tuple[int, ...]) -> Info:
    if -1 in shape:
        known = math.prod(n for n in shape if n != -1)
        shape = tuple(math.prod(x[0]) // known if n == -1 else n for n in shape)
    return shape, x[1], x[2]


def _transpose(x: Info, axes: tuple[int, ...] | None = None) -> Info:
    shape = x[0]
    order = range(len(shape) - 1, -1, -1) if axes is None else axes
    return tuple(shape[a] for a in order), x[1], x[2]


def _concatenate(*xs: Info, axis: int = 0) -> Info:
    shape = list(xs[0][0])
    ax = axis % len(shape)
    shape[ax] = sum(x[0][ax] for x in xs)
    return (tuple(shape), *promoted(*xs))


def _stack(*xs: Info, axis: int = 0) -> Info:
    shape = list(xs[0][0])
    shape.insert(axis % (len(shape) + 1), len(xs))
    return (tuple(shape), *promoted(*xs))


def _split(x: Info, sections: int | tuple[int, ...], piece: int, axis: int = 0) -> Info:
    shape = list(x[0])
    n = shape[axis]
    if isinstance(sections, int):
        shape[axis] = n // sections
    else:
        bounds = (0, *sections, n)
        shape[axis] = len(range(n)[bounds[piece] : bounds[piece + 1]])
    return tuple(shape), x[1], x[2]


def _indexed(x: Info, key: tuple[Any, ...]) -> tuple[int, ...]:
    """The shape of ``x[key]`` (a basic index), from NumPy's indexing of an array of ``x``'s shape
    that holds one element (strides of 0: no memory)."""
    return tuple(np.broadcast_to(np.empty((), np.bool_), x[0])[key].shape)


def _getitem(x: Info, index: tuple[Any, ...], axis: int = 0) -> Info:
    return _indexed(x, P.index_key(index, axis)), x[1], x[2]


def _take_rows(table: Info, indices: Any) -> Info:
    return (*tuple(indices.shape), *table[0][1:]), table[1], table[2]


def _take_along(x: Info, indices: Any, axis: int = -1) -> Info:
    i_shape = tuple(indices.shape)
    x_shape = (1,) * (len(i_shape) - len(x[0])) + x[0]
    ax = axis % len(x_shape)
    lanes = list(broadcast((*x_shape[:ax], 1, *x_shape[ax + 1 :]), (*i_shape[:ax], 1, *i_shape[ax + 1 :])))
    lanes[ax] = i_shape[ax]
    return tuple(lanes), x[1], x[2]


def _index_arrays(x: Info, indices: Any, axis: int = 0) -> Info:
    shape = x[0]
    k = int(indices.shape[0])
    return (*shape[:axis], *tuple(indices.shape[1:]), *shape[axis + k :]), x[1], x[2]


def _matmul(a: Info, b: Info) -> Info:
    sa, sb = a[0], b[0]
    if not sa or not sb:
        raise ValueError("matmul of a 0-d operand")
    lead = broadcast(sa[:-2], sb[:-2])
    rows = sa[-2:-1]  # (none for a vector)
    cols = sb[-1:] if len(sb) > 1 else ()
    return (*lead, *rows, *cols), *promoted(a, b)


def _linear(x: Info, w: Info, b: Info) -> Info:
    return (*x[0][:-1], w[0][1]), *promoted(x, w, b)


def _where(a: Info, b: Info, condition: Info) -> Info | None:
    if a[2] is None and b[2] is None:
        return None  # two floats take the condition's dtype
    return broadcast(a[0], b[0], condition[0]), *promoted(a, b)


def _float(*_: Any, **__: Any) -> Info:
    return FLOAT


def _out_size(n: int, k: int, stride: int, pad: tuple[int, int], dilation: int) -> int:
    return (n + pad[0] + pad[1] - dilation * (k - 1) - 1) // stride + 1


def _conv(
    x: Info,
    w: Info,
    b: Info,
    stride: tuple[int, ...],
    padding: tuple[tuple[int, int], ...],
    dilation: tuple[int, ...],
    groups: int,
) -> Info:
    spatial = len(stride)
    shape, kernel = x[0], w[0][2:]
    sides = shape[len(shape) - spatial :]
    out = [_out_size(*args) for args in zip(sides, kernel, stride, padding, dilation, strict=True)]
    return (*shape[: len(shape) - spatial - 1], w[0][0], *out), *promoted(x, w, b)


def _pool(
    x: Info, kernel: tuple[int, ...], stride: tuple[int, ...], padding: tuple[tuple[int, int], ...]
) -> Info:
    spatial = len(kernel)
    shape = x[0]
    sides = shape[len(shape) - spatial :]
    out = [_out_size(n, k, s, p, 1) for n, k, s, p in zip(sides, kernel, stride, padding, strict=True)]
    return (*shape[: len(shape) - spatial], *out), x[1], x[2]


def install() -> None:
    """Gives the library's primitives their shape rules (those made on demand, one per arity,
    get theirs from :func:`_per_arity`). A user's primitive may set its own ``shape_rule``."""
    from monadl.dsl.ops import (
        activations,
        attention,
        batch_norm,
        conv,
        norm,
        packed_gru,
        packed_lstm,
        recurrent,
        reductions,
        selection,
    )

    for prim in (
        P.add, P.sub, P.mul, P.div, P.power, P.maximum, P.minimum, P.neg, P.exp, P.log, P.sqrt,
        P.absolute, P.tanh, P.sigmoid, P.relu, activations.softplus_, activations.silu_,
        activations.gelu_, activations.leaky_relu_, activations.elu_, activations.clip_,
        recurrent.LSTM_C, recurrent.LSTM_H, recurrent.GRU_H,
    ):  # fmt: skip
        prim.shape_rule = elementwise
    rules: dict[Primitive, ShapeRule] = {
        P.sum_: _reduced,
        P.mean: _reduced,
        reductions.max_: _reduced,
        reductions.min_: _reduced,
        reductions.logsumexp_: _reduced,
        reductions.var_: _reduced,
        reductions.std_: _reduced,
        P.reshape: _reshape,
        P.transpose: _transpose,
        P.split: _split,
        P.getitem: _getitem,
        P.take_rows: _take_rows,
        selection.take_along_axis_: _take_along,
        selection.index_: _index_arrays,
        selection.where_: _where,
        P.matmul: _matmul,
        P.dot: _matmul,
        P.linear: _linear,
        P.softmax: _same,
        P.log_softmax: _same,
        P.cross_entropy: _float,
        batch_norm.BATCH_NORM: _same,
        conv.conv: _conv,
        conv.max_pool: _pool,
        conv.avg_pool: _pool,
        norm.LAYER_NORM: _same,
        norm.LAYER_NORM_AFFINE: _same,
        attention.ATTENTION: _attention,
        attention.ATTENTION_MASKED: _attention,
        attention.SELF_ATTENTION: _self_attention,
        attention.SELF_ATTENTION_MASKED: _self_attention,
        **dict.fromkeys(packed_lstm.PACKED_LSTM.values(), _packed_lstm),
        **dict.fromkeys(packed_gru.PACKED_GRU.values(), _packed_gru),
    }
    for prim, rule in rules.items():
        prim.shape_rule = rule


def _attention(q: Info, k: Info, v: Info, *_: Any, **__: Any) -> Info:
    """(..., Lq, d), (..., Lk, d), (..., Lk, dv) -> (..., Lq, dv), the leading axes broadcast (a
    mask, if any, gets no say)."""
    lead = broadcast(q[0][:-2], k[0][:-2], v[0][:-2])
    return (*lead, q[0][-2], v[0][-1]), *promoted(q, k, v)


def _self_attention(qkv: Info, *_: Any, **__: Any) -> Info:
    """(..., L, 3n) -> (..., L, n): q, k and v side by side in the last axis."""
    return (*qkv[0][:-1], qkv[0][-1] // 3), qkv[1], qkv[2]


def _packed_lstm(x: Info, *weights: Info, lengths: tuple[int, ...]) -> Info:
    """(N, inputs) and D directions' gates -> (N + S, D hidden) (see ``monadl.dsl.ops.packed_lstm``)."""
    directions = len(weights) // 8
    return (x[0][0] + len(lengths), directions * weights[-1][0][0]), *promoted(x, *weights)


def _packed_gru(x: Info, *weights: Info, lengths: tuple[int, ...]) -> Info:
    """(N, inputs) and D directions' gates -> (N, D hidden) (see ``monadl.dsl.ops.packed_gru``)."""
    directions = len(weights) // 8
    return (x[0][0], directions * weights[-1][0][0]), *promoted(x, *weights)


def _per_arity(prim: Primitive) -> ShapeRule | None:
    """The rule of a primitive made per arity (``add_n``, ``concatenate``, ``stack``), or None. Its
    factory, which keeps one primitive per arity, says whether it is the library's (a user's of the
    same name is not)."""
    n = len(prim.vjps)
    if prim.name == "add_n" and add_n(n) is prim:
        return elementwise
    if prim.name == "concatenate" and P.concatenate(n) is prim:
        return _concatenate
    if prim.name == "stack" and P.stack(n) is prim:
        return _stack
    return None


install()
layers.STATIC_INFO.append(static_info)  # what ``.shape`` and ``.dtype`` ask (see monadl.dsl.layers)
