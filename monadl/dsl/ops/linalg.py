"""Linear algebra: ``matmul`` (the ``@`` operator's op, declared with the operators), ``dot`` and
``linear`` (``x @ w + b`` as one op, a dense layer; calls of one ``x`` with several weights merge
into one kernel, the gates of a recurrent cell).
"""

from __future__ import annotations

import math
import threading
from typing import Any, Final

import numpy as np

from monadl.do.primitive import Batching, FanOut
from monadl.dsl.core.arguments import array_operand
from monadl.dsl.core.layers import NO_PARAMS, AnyArray, AnyFloat, ArrayLayer, apply_array, array_op
from monadl.dsl.ops.operators import MATMUL, matmul_op, matrix_rows, mm
from monadl.dsl.ops.registry import declare
from monadl.dsl.ops.shape_rules import Info, promoted
from monadl.typeclasses.backend import (
    NDARRAY,
    NUMPY,
    ShapeError,
    add_to_rows,
    matrix_product,
    on_device,
    shape_of,
    unbroadcast,
)

__all__ = ["dot", "linear", "matmul"]


def matmul(a: AnyArray, b: AnyArray) -> ArrayLayer:
    """Matrix product (``a @ b``), with NumPy's rules for 1-d and stacked operands."""
    array_operand("matmul", a, "a")
    array_operand("matmul", b, "b")
    return apply_array(MATMUL, a, b)


# ``dot`` is matmul under the name its caller used, so that its errors name it. (Its calls and
# matmul's do not merge with each other: a model uses one spelling or the other.)
DOT: Final = matmul_op("dot")


def dot(a: AnyArray, b: AnyArray) -> ArrayLayer:
    """Same as :func:`matmul`; for two vectors, a 0-d array (``sum`` it for a FloatLayer)."""
    array_operand("dot", a, "a")
    array_operand("dot", b, "b")
    return apply_array(DOT, a, b)


# --------------------------------------------------------------------------------------- linear


def _check_linear(x: Any, w: Any, b: Any) -> None:
    if type(x) is float or x.ndim == 0 or type(w) is float or w.ndim != 2:
        raise ShapeError(
            f"linear: needs x of at least 1 dimension and a 2-d w, got {shape_of(x)} and {shape_of(w)}"
        )
    if x.shape[-1] != w.shape[0]:
        raise ShapeError(
            f"linear: shapes {tuple(x.shape)} and {tuple(w.shape)} are not aligned "
            f"({x.shape[-1]} != {w.shape[0]})"
        )
    if type(b) is not float and tuple(b.shape) not in ((), (w.shape[1],)):
        raise ShapeError(f"linear: bias of shape {tuple(b.shape)} does not fit {w.shape[1]} outputs")


_JOINED_MAX_BYTES: Final = 1 << 18
"""The largest weights (together) whose joined copy :func:`_joined` keeps: where a product's fixed
cost matters (a recurrent cell's gates on a few rows), the joined copy is small."""


_JOINED_KEPT: Final = 64
"""How many joined weights :func:`_joined` keeps (the oldest goes first): the fans of one step, of
a 32-layer bidirectional LSTM's cells too (at most 32 MB, with the arrays they were joined from)."""


_joined_weights: Final[dict[int, tuple[tuple[Any, ...], Any, Any]]] = {}
"""Joined weights by their first array's id: the arrays they were joined from, the joined weights
and the joined biases."""


_JOINING: Final = threading.Lock()


def _joined(w: tuple[Any, ...], b: tuple[Any, ...]) -> tuple[Any, Any] | None:
    """The k weights of a fan side by side, (inputs, k * outputs), and their biases as one vector;
    None unless they are small frozen NumPy arrays of one dtype (the biases such arrays or floats).

    A recurrent cell's k gates run once per step of every sequence with the same weights: joining
    them once (a copy of the weights, about as long as a product of a few rows) makes each run one
    product instead of k. Frozen (read-only) arrays never change, and each is kept alive with its
    joined copy, so an array's identity stands for its contents; a weight's next version is a new
    array (an optimizer writes fresh ones). So the first weight's id finds the entry, and the
    arrays' identities (a float bias's value) confirm it: one integer hashed a call."""
    found = _joined_weights.get(id(w[0]))
    if found is not None and _joined_from(found[0], w, b):
        return found[1], found[2]
    first = w[0]
    dtype = first.dtype
    if dtype.itemsize * first.size * len(w) > _JOINED_MAX_BYTES:
        return None
    for a in (*w, *b):
        if type(a) is not float and (type(a) is not NDARRAY or a.flags.writeable or a.dtype != dtype):
            return None
    inputs, outputs = first.shape
    joined = np.empty((inputs, len(w) * outputs), dtype)
    biases = np.empty(len(b) * outputs, dtype)
    for j in range(len(w)):  # (copies into slices: concatenate's bits, without its per-call work)
        joined[:, j * outputs : (j + 1) * outputs] = w[j]
        biases[j * outputs : (j + 1) * outputs] = b[j]
    joined.flags.writeable = biases.flags.writeable = False
    with _JOINING:  # (kernels may run on a pool: one eviction at a time)
        if len(_joined_weights) >= _JOINED_KEPT:
            del _joined_weights[next(iter(_joined_weights))]
        _joined_weights[id(first)] = ((*w, *b), joined, biases)
    return joined, biases


def _joined_from(kept: tuple[Any, ...], w: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    """Whether ``kept`` (an entry's arrays) are the weights ``w`` and the biases ``b``: the same
    arrays, the same float biases."""
    k = len(w)
    if len(kept) != k + len(b):
        return False
    for j in range(k):
        if kept[j] is not w[j]:
            return False
    for j in range(len(b)):
        a, c = kept[k + j], b[j]
        if a is not c and not (type(a) is float and type(c) is float and a == c):
            return False
    return True


def _fan_linear(xp: Any, x: Any, w: tuple[Any, ...], b: tuple[Any, ...]) -> Any:
    """k calls ``x @ w[j] + b[j]`` of one ``x``, as a (k, ..., outputs) array. On NumPy one product
    by the joined weights where they are small (:func:`_joined`), else a matmul per weight into one
    result (a copy of large weights would cost more than the products of a few rows)."""
    k, outputs = len(w), w[0].shape[1]
    joined = _joined(w, b) if xp is NUMPY and type(x) is NDARRAY and x.dtype == w[0].dtype else None
    if joined is not None and x.ndim == 1:  # one call's row (a step of one sequence): its k blocks
        product = np.dot(x, joined[0])  # (the BLAS call of the row as a matrix: the same bits)
        add_to_rows(product, joined[1])
        return product.reshape(k, outputs)
    rows = matrix_rows(xp, x)
    if joined is not None:
        product = matrix_product(rows, joined[0])
        add_to_rows(product, joined[1])
        out = np.ascontiguousarray(product.reshape(rows.shape[0], k, outputs).transpose(1, 0, 2))
    elif xp is NUMPY:
        out = np.empty((k, rows.shape[0], outputs), dtype=np.result_type(rows, w[0], b[0]))
        for j in range(k):
            np.matmul(rows, w[j], out=out[j])
            out[j] += b[j]
    else:  # one batched matmul: on a GPU, one launch for the k products
        ws = xp.stack(w)
        bs = xp.asarray(b, dtype=ws.dtype, **on_device(xp, ws)) if type(b[0]) is float else xp.stack(b)
        out = xp.matmul(rows, ws) + xp.reshape(bs, (k, 1, -1))
    return xp.reshape(out, (k, *x.shape[:-1], outputs))


def _fan_linear_rows(xp: Any, d: Any, w: tuple[Any, ...]) -> Any:
    """The stacked delta as (k, rows, outputs) (the rows counted, as in ``_rows``)."""
    return xp.reshape(d, (len(w), math.prod(d.shape[1:-1]), w[0].shape[1]))


def _fan_linear_vjp_x(xp: Any, d: Any, o: Any, x: Any, w: tuple[Any, ...], b: tuple[Any, ...]) -> Any:
    joined = _joined(w, b) if xp is NUMPY and type(d) is NDARRAY and d.dtype == w[0].dtype else None
    if joined is not None and x.ndim == 1:  # one row: the (k, outputs) deltas are side by side
        return np.dot(d.reshape(-1), joined[0].T)
    d = _fan_linear_rows(xp, d, w)
    if joined is not None:  # one product by the joined weights: the k deltas side by side
        sides = d.transpose(1, 0, 2).reshape(d.shape[1], d.shape[0] * d.shape[2])
        return mm(xp, sides, joined[0].T).reshape(x.shape)
    g = mm(xp, d[0, ...], w[0].mT)
    for j in range(1, len(w)):
        g = g + mm(xp, d[j, ...], w[j].mT)
    return xp.reshape(g, x.shape)


def _fan_linear_vjp_b(xp: Any, d: Any, o: Any, x: Any, w: tuple[Any, ...], b: tuple[Any, ...]) -> Any:
    g = xp.sum(_fan_linear_rows(xp, d, w), axis=1)  # (k, outputs)
    return g if type(b[0]) is not float and b[0].ndim == 1 else xp.sum(g, axis=1)  # scalar biases: (k,)


def _fan_linear_vjp_w(xp: Any, d: Any, o: Any, x: Any, w: tuple[Any, ...], b: tuple[Any, ...]) -> Any:
    """The weights' deltas, (k, in, out): one product of the rows with every call's delta side by
    side, ``x.T @ [d_1 ... d_k]`` (a batched matmul of the k calls falls off BLAS for few rows)."""
    rows = matrix_rows(xp, x)
    k, outputs = len(w), w[0].shape[1]
    sides = xp.reshape(xp.permute_dims(_fan_linear_rows(xp, d, w), (1, 0, 2)), (rows.shape[0], k * outputs))
    g = mm(xp, rows.mT, sides)  # (in, k * out)
    return xp.permute_dims(xp.reshape(g, (rows.shape[1], k, outputs)), (1, 0, 2))


def _fan_weights(xp: Any, d: Any, o: Any, x: Any, w: tuple[Any, ...], b: tuple[Any, ...]) -> Any:
    """The weights' deltas as products of rows: x's rows and each call's delta rows; one vector x
    and its (k, outputs) deltas as they are (one row each: the backward pass joins them)."""
    if x.ndim == 1:
        return x, d
    return matrix_rows(xp, x), _fan_linear_rows(xp, d, w)


def _fan_biases(xp: Any, d: Any, o: Any, x: Any, w: tuple[Any, ...], b: tuple[Any, ...]) -> Any:
    """The biases' deltas as products of rows (sums of each call's delta rows), for vector biases."""
    if type(b[0]) is float or b[0].ndim != 1:
        return None
    return None, d if x.ndim == 1 else _fan_linear_rows(xp, d, w)


_FAN_LINEAR = FanOut(
    shared=(0,),
    forward=_fan_linear,
    vjps=(_fan_linear_vjp_x, _fan_linear_vjp_w, _fan_linear_vjp_b),
    products={1: _fan_weights, 2: _fan_biases},
)


# x @ w + b in one op: every dense layer's forward, one kernel and one tape instead of two.
def _linear(xp: Any, x: Any, w: Any, b: Any) -> Any:
    """``x @ w + b``; on NumPy matrices, the bias added into the product's own array (one array
    and one pass less), where that keeps the sum's dtype."""
    if xp is NUMPY and x.ndim <= 2:
        y = matrix_product(x, w)  # (np.dot's but for large products of matrices)
        if type(b) is NDARRAY and b.ndim == 1 and b.dtype == y.dtype:
            add_to_rows(y, b)
            return y
        if type(b) is float or (type(b) is NDARRAY and b.dtype == y.dtype and b.ndim == 0):
            y += b
            return y
        return y + b
    return xp.matmul(x, w) + b


def _linear_vjp_x(xp: Any, d: Any, o: Any, x: Any, w: Any, b: Any) -> Any:
    return mm(xp, d, w.mT)


def _linear_vjp_w(xp: Any, d: Any, o: Any, x: Any, w: Any, b: Any) -> Any:
    if x.ndim == 1:  # one row: an outer product, which a broadcast multiplication does faster than matmul
        return xp.reshape(x, (-1, 1)) * xp.reshape(d, (1, -1))
    return mm(xp, matrix_rows(xp, x).mT, matrix_rows(xp, d))


def _linear_bias(xp: Any, d: Any, o: Any, x: Any, w: Any, b: Any) -> Any:
    """A vector bias's delta as a sum of rows."""
    return None if type(b) is float or b.ndim != 1 else (None, matrix_rows(xp, d))


def _linear_rule(x: Info, w: Info, b: Info) -> Info:
    return (*x[0][:-1], w[0][1]), *promoted(x, w, b)


LINEAR: Final = declare(
    "linear",
    _linear,
    (_linear_vjp_x, _linear_vjp_w, lambda xp, d, o, x, w, b: unbroadcast(xp, d, b)),
    products={1: lambda xp, d, o, x, w, b: (matrix_rows(xp, x), matrix_rows(xp, d)), 2: _linear_bias},
    cost=lambda x, w, b: float(math.prod(x.shape) * w.shape[1]),
    check=_check_linear,
    # x's rows stacked: the calls' x @ w become one matmul; or, for calls of one x with different
    # weights, one kernel (FanOut)
    batch=Batching(shared=(1, 2), fan=_FAN_LINEAR),
    shape_rule=_linear_rule,
)


def linear(x: AnyArray, w: AnyArray, b: AnyFloat | AnyArray) -> ArrayLayer:
    """``x @ w + b`` as one op (a dense layer): ``x`` of shape (..., k), ``w`` (k, n), ``b`` (n,)."""
    array_operand("linear", x, "x")
    array_operand("linear", w, "w")
    return array_op(LINEAR, (x, w, b), NO_PARAMS)  # (a dense layer per tree node: no dict made per call)
