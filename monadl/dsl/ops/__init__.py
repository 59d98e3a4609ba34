"""Differentiable functions on floats, arrays, weights and layers (the rules are in ``primitives``).

Each accepts any mix of literal, weight and layer. Elementwise functions keep the operand's type:
``exp(float-like) -> FloatLayer``, ``exp(array-like) -> ArrayLayer``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, cast, overload

import numpy as np

from monadl.dsl import primitives as P
from monadl.dsl.apply import forward_of
from monadl.dsl.arguments import (
    array_operand,
    array_operands,
    as_index,
    axis_param,
    described,
    flag_param,
    int_param,
    int_sequence,
    operands_of,
)
from monadl.dsl.indices import integral, row_indices
from monadl.dsl.layers import (
    AnyArray,
    AnyFloat,
    ArrayLayer,
    FloatLayer,
    apply,
    apply_array,
    apply_float,
    is_float_kind,
)
from monadl.dsl.ops.losses import CROSS_ENTROPY, Reduction, class_loss, class_targets, label_range
from monadl.typeclasses.backend import AnyNDArray, Array, IndexArray, RowIndices

__all__ = [
    "abs",
    "add_n",
    "concatenate",
    "cross_entropy",
    "dot",
    "exp",
    "lift",
    "lift_array",
    "lift_float",
    "linear",
    "log",
    "log_softmax",
    "matmul",
    "maximum",
    "mean",
    "minimum",
    "relu",
    "reshape",
    "sigmoid",
    "softmax",
    "split",
    "sqrt",
    "stack",
    "sum",
    "take_rows",
    "tanh",
    "transpose",
]

Axis = int | tuple[int, ...] | None


@overload
def lift(x: AnyFloat) -> FloatLayer: ...
@overload
def lift(x: AnyArray) -> ArrayLayer: ...
def lift(x: AnyFloat | AnyArray) -> FloatLayer | ArrayLayer:
    """``x`` as a layer of its kind: a float-like (a float, a ``FloatWeight``, a ``FloatLayer``)
    gives a ``FloatLayer``, an array-like an ``ArrayLayer`` (a layer is returned as it is). Use it
    on a raw-array operand where mypy cannot pick an operator of a union that includes ``ndarray``
    (``ndarray * ndarray`` is an ndarray, not a layer), and on what :data:`~monadl.AnyLayer` gives
    for a weight, for ``predict`` and ``train``. :func:`lift_float` and :func:`lift_array` take
    one kind only."""
    return _lift(x, "lift")


def _lift(x: object, op: str) -> FloatLayer | ArrayLayer:
    if isinstance(x, (FloatLayer, ArrayLayer)):
        return x
    forward = forward_of(x, op)
    return FloatLayer(forward) if is_float_kind(x) else ArrayLayer(forward)


def lift_float(x: AnyFloat) -> FloatLayer:
    """``x``, a float, a ``FloatWeight`` or a ``FloatLayer``, as a ``FloatLayer``. Anything else is
    a TypeError (an array-like; a user's own ``DeepLearning`` value, whose kind is known only when
    it runs: :func:`lift` takes it)."""
    if type(x) is FloatLayer:
        return x
    if not is_float_kind(x):  # an array; or a user's own value, whose kind is known when it runs
        raise TypeError(f"lift_float: expected a float, float weight or float layer, got {described(x)}")
    return FloatLayer(forward_of(x, "lift_float"))


def lift_array(x: AnyArray) -> ArrayLayer:
    """``x``, an array, an ``ArrayWeight`` or an ``ArrayLayer``, as an ``ArrayLayer``: its type
    takes array-likes only (:func:`lift_float` lifts a float-like, :func:`lift` either kind). At run
    time a float-like gives a ``FloatLayer``, which untyped code may rely on."""
    # (cast: a float-like, which the type rules out, gives a FloatLayer)
    return cast(ArrayLayer, _lift(x, "lift_array"))


@overload
def exp(x: AnyFloat) -> FloatLayer: ...
@overload
def exp(x: AnyArray) -> ArrayLayer: ...
def exp(x: AnyFloat | AnyArray) -> FloatLayer | ArrayLayer:
    """Elementwise ``e ** x``."""
    return apply(P.exp, x)


@overload
def log(x: AnyFloat) -> FloatLayer: ...
@overload
def log(x: AnyArray) -> ArrayLayer: ...
def log(x: AnyFloat | AnyArray) -> FloatLayer | ArrayLayer:
    """Elementwise natural logarithm."""
    return apply(P.log, x)


@overload
def sqrt(x: AnyFloat) -> FloatLayer: ...
@overload
def sqrt(x: AnyArray) -> ArrayLayer: ...
def sqrt(x: AnyFloat | AnyArray) -> FloatLayer | ArrayLayer:
    """Elementwise square root."""
    return apply(P.sqrt, x)


@overload
def abs(x: AnyFloat) -> FloatLayer: ...
@overload
def abs(x: AnyArray) -> ArrayLayer: ...
def abs(x: AnyFloat | AnyArray) -> FloatLayer | ArrayLayer:
    """Elementwise absolute value (its derivative at 0 is taken as 0)."""
    return apply(P.absolute, x)


@overload
def tanh(x: AnyFloat) -> FloatLayer: ...
@overload
def tanh(x: AnyArray) -> ArrayLayer: ...
def tanh(x: AnyFloat | AnyArray) -> FloatLayer | ArrayLayer:
    """Elementwise hyperbolic tangent."""
    return apply(P.tanh, x)


@overload
def sigmoid(x: AnyFloat) -> FloatLayer: ...
@overload
def sigmoid(x: AnyArray) -> ArrayLayer: ...
def sigmoid(x: AnyFloat | AnyArray) -> FloatLayer | ArrayLayer:
    """Elementwise logistic function ``1 / (1 + e ** -x)``, without overflow."""
    return apply(P.sigmoid, x)


@overload
def relu(x: AnyFloat) -> FloatLayer: ...
@overload
def relu(x: AnyArray) -> ArrayLayer: ...
def relu(x: AnyFloat | AnyArray) -> FloatLayer | ArrayLayer:
    """Elementwise ``max(x, 0)`` (derivative 0 at 0)."""
    return apply(P.relu, x)


@overload
def maximum(a: AnyFloat, b: AnyFloat) -> FloatLayer: ...
@overload
def maximum(a: AnyArray, b: AnyFloat | AnyArray) -> ArrayLayer: ...
@overload
def maximum(a: AnyFloat, b: AnyArray) -> ArrayLayer: ...
def maximum(a: AnyFloat | AnyArray, b: AnyFloat | AnyArray) -> FloatLayer | ArrayLayer:
    """Elementwise maximum of two operands (a layer or a constant); ties send the delta to ``a``."""
    return apply(P.maximum, a, b)


@overload
def minimum(a: AnyFloat, b: AnyFloat) -> FloatLayer: ...
@overload
def minimum(a: AnyArray, b: AnyFloat | AnyArray) -> ArrayLayer: ...
@overload
def minimum(a: AnyFloat, b: AnyArray) -> ArrayLayer: ...
def minimum(a: AnyFloat | AnyArray, b: AnyFloat | AnyArray) -> FloatLayer | ArrayLayer:
    """Elementwise minimum of two operands; ties send the delta to ``a``."""
    return apply(P.minimum, a, b)


def matmul(a: AnyArray, b: AnyArray) -> ArrayLayer:
    """Matrix product (``a @ b``), with NumPy's rules for 1-d and stacked operands."""
    array_operand("matmul", a, "a")
    array_operand("matmul", b, "b")
    return apply_array(P.matmul, a, b)


def linear(x: AnyArray, w: AnyArray, b: AnyFloat | AnyArray) -> ArrayLayer:
    """``x @ w + b`` as one op (a dense layer): ``x`` of shape (..., k), ``w`` (k, n), ``b`` (n,)."""
    array_operand("linear", x, "x")
    array_operand("linear", w, "w")
    return apply_array(P.linear, x, w, b)


def dot(a: AnyArray, b: AnyArray) -> ArrayLayer:
    """Same as :func:`matmul`; for two vectors, a 0-d array (``sum`` it for a FloatLayer)."""
    array_operand("dot", a, "a")
    array_operand("dot", b, "b")
    return apply_array(P.dot, a, b)


@overload
def sum(x: AnyArray, axis: None = None) -> FloatLayer: ...
@overload
def sum(x: AnyArray, axis: int | tuple[int, ...], *, keepdims: bool = False) -> ArrayLayer: ...
def sum(x: AnyArray, axis: Axis = None, *, keepdims: bool = False) -> FloatLayer | ArrayLayer:
    """Sum of all elements (a ``FloatLayer``), or along ``axis`` (an ``ArrayLayer``)."""
    array_operand("sum", x)
    if axis is None:
        if flag_param("sum", "keepdims", keepdims):
            raise TypeError("sum: keepdims=True needs an axis (over all axes, the sum is a float)")
        return apply_float(P.sum_, x)
    return apply_array(
        P.sum_, x, axis=axis_param("sum", axis), keepdims=flag_param("sum", "keepdims", keepdims)
    )


@overload
def add_n(xs: Sequence[AnyFloat]) -> FloatLayer: ...
@overload
def add_n(xs: Sequence[AnyArray]) -> ArrayLayer: ...
def add_n(xs: Sequence[AnyFloat] | Sequence[AnyArray]) -> FloatLayer | ArrayLayer:
    """The sum of ``xs`` as one op (DyNet's ``esum``): a loss summed over many terms is one kernel,
    not a chain of additions that must run one after another."""
    operands = operands_of("add_n", xs)
    if not operands:
        raise ValueError("add_n: needs at least one operand")
    if len(operands) == 1:
        return _lift(operands[0], "add_n")
    return apply(P.add_n(len(operands)), *operands)


@overload
def mean(x: AnyArray, axis: None = None) -> FloatLayer: ...
@overload
def mean(x: AnyArray, axis: int | tuple[int, ...], *, keepdims: bool = False) -> ArrayLayer: ...
def mean(x: AnyArray, axis: Axis = None, *, keepdims: bool = False) -> FloatLayer | ArrayLayer:
    """Mean of all elements (a ``FloatLayer``), or along ``axis`` (an ``ArrayLayer``). The mean of
    no elements (an empty array, an axis of length 0) is NaN, as NumPy's and PyTorch's: a loss of
    it fails the step with ``NonFiniteLossError``."""
    array_operand("mean", x)
    if axis is None:
        if flag_param("mean", "keepdims", keepdims):
            raise TypeError("mean: keepdims=True needs an axis (over all axes, the mean is a float)")
        return apply_float(P.mean, x)
    return apply_array(
        P.mean, x, axis=axis_param("mean", axis), keepdims=flag_param("mean", "keepdims", keepdims)
    )


def reshape(x: AnyArray, shape: Sequence[int]) -> ArrayLayer:
    """``x`` with a new shape of the same size (one dimension may be -1)."""
    array_operand("reshape", x)
    dims = int_sequence("reshape", "shape", shape)
    # Whether the shape is one at all is known now; whether it fits x's size, when x has run.
    if dims.count(-1) > 1:
        raise ValueError(f"reshape: shape {dims} has more than one -1 (an unknown dimension)")
    if any(n < -1 for n in dims):
        raise ValueError(f"reshape: shape {dims} has a negative dimension (only -1 may be)")
    return apply_array(P.reshape, x, shape=dims)


def transpose(x: AnyArray, axes: Sequence[int] | None = None) -> ArrayLayer:
    """``x`` with its axes permuted (reversed by default)."""
    array_operand("transpose", x)
    return apply_array(P.transpose, x, axes=None if axes is None else int_sequence("transpose", "axes", axes))


def concatenate(xs: Sequence[AnyArray], axis: int = 0) -> ArrayLayer:
    """The arrays joined along an existing ``axis``."""
    operands = array_operands("concatenate", xs)
    return apply_array(P.concatenate(len(operands)), *operands, axis=int_param("concatenate", "axis", axis))


def split(
    x: AnyArray, sections_or_indices: int | Sequence[int] | IndexArray, axis: int = 0
) -> tuple[ArrayLayer, ...]:
    """``x`` cut along ``axis`` into pieces, as ``numpy.split``: an int ``n`` gives ``n`` pieces of
    equal length (``n`` must divide the axis' length), a sequence of indices the pieces between
    them (``[2, 5]``: ``[:2]``, ``[2:5]``, ``[5:]``). Each piece is an op of its own (a slice,
    whose delta is its own in zeros of ``x``'s shape): ``i, f, o, u = split(z, 4, axis=-1)``
    cuts one fused gate matrix of an LSTM into its four gates (in a ``@batchable`` body, whose
    arrays have a leading axis of rows, an axis counted from the end is the same for every call)."""
    array_operand("split", x)
    ax = int_param("split", "axis", axis)
    sections: int | tuple[int, ...]
    try:
        sections = as_index(sections_or_indices)
    except TypeError:
        indices: object = sections_or_indices
        if isinstance(indices, np.ndarray) and indices.ndim == 1 and integral(indices):
            indices = indices.tolist()  # the indices as NumPy computes them (a cumsum)
        if isinstance(indices, (str, bytes)) or not isinstance(indices, Sequence):
            raise TypeError(
                "split: sections_or_indices must be an int or a sequence of ints, "
                f"got {type(indices).__name__} {indices!r}"
            ) from None
        sections = int_sequence("split", "sections_or_indices", indices)
        pieces = len(sections) + 1
    else:
        if sections < 1:
            raise ValueError(f"split: the number of sections must be positive, got {sections}")
        pieces = sections
    layer = _lift(x, "split")  # one node, read by every piece
    return tuple([apply_array(P.split, layer, sections=sections, piece=j, axis=ax) for j in range(pieces)])


def stack(xs: Sequence[AnyArray], axis: int = 0) -> ArrayLayer:
    """The arrays, all of one shape, joined along a new ``axis`` of the result (as ``numpy.stack``:
    ``stack([a, b], axis=-1)`` has shape ``a.shape + (2,)``)."""
    operands = array_operands("stack", xs)
    return apply_array(P.stack(len(operands)), *operands, axis=int_param("stack", "axis", axis))


def take_rows(table: AnyArray, indices: RowIndices) -> ArrayLayer:
    """Rows of ``table`` (an embedding lookup): shape ``indices.shape + table.shape[1:]``. The
    delta adds each row's delta into the rows used, repeated indices included."""
    array_operand("take_rows", table)
    return apply_array(P.take_rows, table, indices=row_indices(indices))


def softmax(x: AnyArray, axis: int = -1) -> ArrayLayer:
    """Softmax along ``axis``, computed stably."""
    array_operand("softmax", x)
    return apply_array(P.softmax, x, axis=int_param("softmax", "axis", axis))


def log_softmax(x: AnyArray, axis: int = -1) -> ArrayLayer:
    """Log of the softmax along ``axis``, computed stably."""
    array_operand("log_softmax", x)
    return apply_array(P.log_softmax, x, axis=int_param("log_softmax", "axis", axis))


@overload
def cross_entropy(
    logits: AnyArray,
    targets: AnyNDArray | int,
    *,
    reduction: Literal["mean", "sum"] = "mean",
    weight: Array | None = None,
    ignore_index: int | None = None,
    label_smoothing: float = 0.0,
) -> FloatLayer: ...
@overload
def cross_entropy(
    logits: AnyArray,
    targets: AnyNDArray | int,
    *,
    reduction: Literal["none"],
    weight: Array | None = None,
    ignore_index: int | None = None,
    label_smoothing: float = 0.0,
) -> ArrayLayer: ...
def cross_entropy(
    logits: AnyArray,
    targets: AnyNDArray | int,
    *,
    reduction: Reduction = "mean",
    weight: Array | None = None,
    ignore_index: int | None = None,
    label_smoothing: float = 0.0,
) -> FloatLayer | ArrayLayer:
    """``-sum(targets * log_softmax(logits))`` over the last axis (the classes), of each element,
    reduced: by default their mean (PyTorch's ``cross_entropy``, with the class axis last).

    ``targets`` are probabilities (one-hot or soft) of ``logits``' shape, or integer class labels of
    shape ``logits.shape[:-1]``: an integer array, or a Python int for one example's logits of shape
    ``(classes,)``. They are constants: no delta flows into them. A label out of range is an error
    when the op runs.

    ``reduction``: ``"mean"``, ``"sum"`` (a ``FloatLayer``) or ``"none"`` (an ``ArrayLayer`` of
    each element's loss, of shape ``logits.shape[:-1]``). ``label_smoothing``: ``s`` in [0, 1]
    mixes the targets with the uniform distribution, ``(1 - s) * targets + s / classes``.
    ``weight``: a weight per class (a 1-d array, a constant), multiplying each class's term; with
    labels, the mean divides by the summed weights of the elements' labels (PyTorch's weighted
    mean), with probabilities by the number of elements. ``ignore_index``: for labels, a label whose
    elements add nothing (loss 0, not counted by the mean; PyTorch's default is -100, pass it for
    that behaviour). The mean over no counted label is NaN, as PyTorch's. (See
    :func:`~monadl.nll_loss` for log-probabilities.)
    """
    if reduction == "mean" and weight is None and ignore_index is None and label_smoothing == 0.0:
        # the common case: one fused op, NumPy's rows picked by their labels
        array_operand("cross_entropy", logits)
        t = class_targets("cross_entropy", targets)
        labels = None
        if integral(t):  # checked once here, not at every run
            labels = label_range(t, None)
        return apply_float(P.cross_entropy, logits, targets=t, labels=labels)
    return class_loss(CROSS_ENTROPY, logits, targets, reduction, weight, ignore_index, label_smoothing)
