"""Bad inputs fail at the op, with an error that says what went wrong.

Ops are lazy: a shape error surfaces when the layer is evaluated, as the ``Failure`` of
``predict_blocking()`` and as the exception ``compute_gradients`` raises. An operand of the wrong
type is a ``TypeError`` as soon as the expression is built.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from returns.pipeline import is_successful
from returns.result import Failure

import monadl
from monadl import ArrayLayer, ArrayWeight, FloatLayer, FloatWeight, ShapeError


def _weight(shape: tuple[int, ...] = (3, 4)) -> ArrayWeight:
    return ArrayWeight(np.ones(shape))


def evaluation_error(build: Callable[[], FloatLayer | ArrayLayer]) -> Exception:
    """The exception evaluating ``build()`` fails with: the same from ``predict_blocking()`` and from
    ``compute_gradients`` (of ``sum(layer)`` for an array)."""
    layer = build()  # building alone raises nothing: the op has not run yet
    result = layer.predict_blocking()
    assert not is_successful(result), f"expected a failure, got {result}"
    error = result.failure()
    loss = build()
    with pytest.raises(type(error)) as raised:
        monadl.compute_gradients(loss if isinstance(loss, FloatLayer) else monadl.sum(loss))
    assert str(raised.value) == str(error)
    return error


def _names_shapes(message: str, *shapes: tuple[int, ...]) -> bool:
    return all(str(shape) in message for shape in shapes)


# ----------------------------------------------------------------------------- shape mismatches


@pytest.mark.parametrize(
    ("name", "build", "shapes"),
    [
        ("matmul", lambda: _weight((3, 4)) @ np.ones((5, 2)), ((3, 4), (5, 2))),
        ("matmul", lambda: monadl.matmul(np.ones((2, 3)), _weight((4, 2))), ((2, 3), (4, 2))),
        ("dot", lambda: monadl.dot(_weight((3,)), np.ones((4,))), ((3,), (4,))),  # the name called
        ("matmul", lambda: monadl.matmul(_weight((2, 3, 4)), _weight((2, 3, 4))), ((2, 3, 4), (2, 3, 4))),
    ],
)
def test_matmul_shape_mismatch(
    name: str, build: Callable[[], ArrayLayer], shapes: tuple[tuple[int, ...], ...]
) -> None:
    error = evaluation_error(build)
    assert isinstance(error, ShapeError) and isinstance(error, ValueError)
    message = str(error)
    assert message.startswith(f"{name}:"), message
    assert _names_shapes(message, *shapes), message


@pytest.mark.parametrize(
    ("name", "build", "shapes"),
    [
        ("add", lambda: _weight((3, 4)) + np.ones(5), ((3, 4), (5,))),
        ("add", lambda: np.ones((2, 4)) + _weight((3, 4)), ((2, 4), (3, 4))),
        ("sub", lambda: _weight((3, 4)) - _weight((2, 4)), ((3, 4), (2, 4))),
        ("mul", lambda: _weight((3, 4)) * np.ones((4, 3)), ((3, 4), (4, 3))),
        ("mul", lambda: np.ones((2, 4)) * _weight((3, 4)), ((2, 4), (3, 4))),
        ("div", lambda: _weight((3, 4)) / _weight((3,)), ((3, 4), (3,))),
        ("pow", lambda: _weight((3, 4)) ** np.ones((2, 1, 5)), ((3, 4), (2, 1, 5))),
        ("maximum", lambda: monadl.maximum(_weight((3, 4)), np.ones(5)), ((3, 4), (5,))),
        ("minimum", lambda: monadl.minimum(np.ones(5), _weight((3, 4))), ((5,), (3, 4))),
    ],
)
def test_broadcast_mismatch(
    name: str, build: Callable[[], ArrayLayer], shapes: tuple[tuple[int, ...], ...]
) -> None:
    error = evaluation_error(build)
    assert isinstance(error, ShapeError) and isinstance(error, ValueError)
    message = str(error)
    assert message.startswith(f"{name}: operands of shapes {shapes[0]} and {shapes[1]}"), message


def test_the_failing_op_is_named_deep_in_a_graph() -> None:
    w = _weight((3, 4))
    message = str(evaluation_error(lambda: monadl.tanh(w @ np.ones((4, 2))) + np.ones((3, 3))))
    assert message.startswith("add:") and _names_shapes(message, (3, 2), (3, 3)), message


def test_shape_error_is_a_value_error() -> None:
    assert issubclass(ShapeError, ValueError)


# -------------------------------------------------------------------------------- wrong types


def _bad(x: object) -> Any:
    """``x`` typed ``Any``: mypy rejects these operands statically; the tests check run time."""
    return x


FLOAT_ARRAY = "expected a floating-point array (float32 or float64), got dtype"


@pytest.mark.parametrize(
    ("build", "expected"),
    [
        (lambda: _weight() + _bad(np.ones(4, dtype=np.int64)), f"add: {FLOAT_ARRAY} int64"),
        (lambda: _bad(np.ones((3, 4), dtype=np.int32)) * _weight(), f"mul: {FLOAT_ARRAY} int32"),
        (lambda: monadl.exp(_bad(np.arange(3))), f"exp: {FLOAT_ARRAY} int64"),
        (lambda: monadl.matmul(_weight(), _bad(np.ones((4, 2), dtype=bool))), f"matmul: {FLOAT_ARRAY} bool"),
        (lambda: ArrayWeight(_bad(np.ones(4, dtype=np.int64))), f"ArrayWeight: {FLOAT_ARRAY} int64"),
        (lambda: ArrayWeight(_bad(np.ones(4, dtype=bool))), f"ArrayWeight: {FLOAT_ARRAY} bool"),
    ],
)
def test_wrong_dtype(build: Callable[[], Any], expected: str) -> None:
    with pytest.raises(TypeError) as raised:
        build()  # raised at once, not when evaluated
    assert str(raised.value) == expected


ANY_OPERAND = "expected a float, a floating-point array, a weight or a layer, got"
AN_ARRAY = "expected an array layer, array weight or floating-point array"


@pytest.mark.parametrize(
    ("build", "expected"),
    [
        (lambda: _weight() + _bad("abc"), f"add: {ANY_OPERAND} str"),
        (lambda: _bad("abc") * _weight(), f"mul: {ANY_OPERAND} str"),
        (lambda: _weight() - _bad([1.0, 2.0]), f"sub: {ANY_OPERAND} list"),
        (lambda: _bad([1.0]) / _weight(), f"div: {ANY_OPERAND} list"),
        (lambda: _weight() * _bad(None), f"mul: {ANY_OPERAND} NoneType"),
        (lambda: FloatWeight(1.0) + _bad(None), f"add: {ANY_OPERAND} NoneType"),
        (lambda: _weight() + _bad(True), f"add: {ANY_OPERAND} bool"),
        (lambda: monadl.exp(_bad("abc")), f"exp: {ANY_OPERAND} str"),
        (lambda: monadl.tanh(_bad([0.5])), f"tanh: {ANY_OPERAND} list"),
        (lambda: monadl.matmul(_weight(), _bad(None)), f"matmul: {AN_ARRAY} for b, got NoneType None"),
        (lambda: monadl.sum(_bad([1.0, 2.0])), f"sum: {AN_ARRAY}, got list [1.0, 2.0]"),
        (lambda: monadl.lift_array(_bad("abc")), f"lift_array: {ANY_OPERAND} str"),
        (lambda: monadl.add_n([_weight(), _bad("abc")]), f"add_n: {ANY_OPERAND} str"),
        (lambda: ArrayWeight(_bad("abc")), "ArrayWeight: expected a floating-point array, got str"),
        (lambda: ArrayWeight(_bad([1.0, 2.0])), "ArrayWeight: expected a floating-point array, got list"),
        (lambda: ArrayWeight(_bad(None)), "ArrayWeight: expected a floating-point array, got NoneType"),
        (lambda: FloatWeight(_bad("abc")), "FloatWeight: expected a float, got str"),
        (lambda: FloatWeight(_bad(None)), "FloatWeight: expected a float, got NoneType"),
        (lambda: FloatWeight(_bad(np.ones(2))), "FloatWeight: expected a float, got ndarray"),
        (lambda: FloatWeight(True), "FloatWeight: expected a float, got bool"),
    ],
)
def test_non_array_input(build: Callable[[], Any], expected: str) -> None:
    with pytest.raises(TypeError, match=re.escape(expected)):
        build()  # raised at once, not when evaluated


@pytest.mark.parametrize("scalar", [np.float16(1.5), np.float32(1.5), np.float64(1.5)])
def test_a_float_weight_takes_a_numpy_float_scalar_as_a_python_float(scalar: np.floating[Any]) -> None:
    w = FloatWeight(scalar)
    assert type(w.data) is float and w.data == 1.5
    w.data = type(scalar)(2.5)
    assert type(w.data) is float and w.data == 2.5


# ------------------------------------------------------------------- operands of the wrong kind

# The ops that read an array's axes, shape or rows, each on its array operand ``x`` (and what the
# error calls that operand, for an op of several).
_ARRAY_OPS: list[tuple[str, str, Callable[[Any], Any]]] = [
    ("reshape", "", lambda x: monadl.reshape(x, (1,))),
    ("transpose", "", lambda x: monadl.transpose(x)),
    ("concatenate", " for xs[0]", lambda x: monadl.concatenate([x])),
    ("concatenate", " for xs[1]", lambda x: monadl.concatenate([np.ones(1), x])),
    ("take_rows", "", lambda x: monadl.take_rows(x, [0])),
    ("sum", "", lambda x: monadl.sum(x)),
    ("sum", "", lambda x: monadl.sum(x, axis=0)),
    ("mean", "", lambda x: monadl.mean(x)),
    ("softmax", "", lambda x: monadl.softmax(x)),
    ("log_softmax", "", lambda x: monadl.log_softmax(x, axis=0)),
    ("matmul", " for a", lambda x: monadl.matmul(x, np.ones(1))),
    ("dot", " for b", lambda x: monadl.dot(np.ones(1), x)),
    ("linear", " for x", lambda x: monadl.linear(x, np.ones((1, 2)), 0.0)),
    ("linear", " for w", lambda x: monadl.linear(np.ones(1), x, 0.0)),
    ("cross_entropy", "", lambda x: monadl.cross_entropy(x, np.zeros((), dtype=np.int64))),
]
_FLOATS: list[tuple[Callable[[], Any], str]] = [
    (lambda: 0.5, "float 0.5"),
    (lambda: FloatWeight(0.5), "FloatWeight(0.5)"),
    (lambda: FloatWeight(0.5) * 2.0, "FloatLayer"),
    (lambda: 3, "int 3"),
    (lambda: True, "bool True"),
    (lambda: np.float64(0.5), "float64 np.float64(0.5)"),  # a float (NumPy's subclass of it)
]


@pytest.mark.parametrize(("name", "operand", "op"), _ARRAY_OPS, ids=[f"{n}{o}" for n, o, _ in _ARRAY_OPS])
@pytest.mark.parametrize(("x", "described"), _FLOATS, ids=[d for _, d in _FLOATS])
def test_a_float_where_an_op_needs_an_array_is_reported_where_the_op_is_made(
    name: str, operand: str, op: Callable[[Any], Any], x: Callable[[], Any], described: str
) -> None:
    # Before, the op was made and failed when it ran, in its rule's code: an AttributeError of a
    # float without a shape, a TypeError of FloatNamespace.sum, or a softmax error for log_softmax.
    with pytest.raises(TypeError) as raised:
        op(x())
    assert str(raised.value) == f"{name}: {AN_ARRAY}{operand}, got {described}"


@pytest.mark.parametrize(
    ("build", "expected"),
    [
        (lambda: untyped.concatenate(np.ones(3)), "concatenate: expected a list or a tuple of operands, got"),
        (lambda: untyped.concatenate(_weight()), "concatenate: expected a list or a tuple of operands, got"),
        (lambda: untyped.add_n(np.ones((2, 2))), "add_n: expected a list or a tuple of operands, got"),
        (lambda: untyped.add_n(FloatWeight(1.0)), "add_n: expected a list or a tuple of operands, got"),
        (lambda: untyped.add_n(None), "add_n: expected a list or a tuple of operands, got NoneType None"),
    ],
)
def test_a_single_operand_where_an_op_needs_a_list(build: Callable[[], Any], expected: str) -> None:
    # Before: NumPy's "truth value of an array is ambiguous", a layer's truth value, or len() of a
    # float; add_n(None) said it needs at least one operand.
    with pytest.raises(TypeError) as raised:
        build()
    assert str(raised.value).startswith(expected), str(raised.value)


class _Witness:
    """A user's own differentiable value (a ``DeepLearning``): its data's kind shows when it runs."""

    def __init__(self, weight: FloatWeight) -> None:
        self.forward = weight.forward


@pytest.mark.parametrize(
    ("name", "op"),
    [
        ("reshape", lambda x: monadl.reshape(x, (1,))),
        ("transpose", lambda x: monadl.transpose(x)),
        ("concatenate", lambda x: monadl.concatenate([x, x])),
        ("take_rows", lambda x: monadl.take_rows(x, [0])),
        ("sum", lambda x: monadl.sum(x)),
        ("mean", lambda x: monadl.mean(x, axis=0)),
    ],
)
def test_a_float_found_when_the_op_runs_is_a_shape_error_naming_it(
    name: str, op: Callable[[Any], Any]
) -> None:
    error = evaluation_error(lambda: op(_Witness(FloatWeight(0.5))))
    assert isinstance(error, ShapeError)
    assert str(error) == f"{name}: expected an array, got a float"


@pytest.mark.parametrize("indices", [0.5, FloatWeight(0.5)])
def test_indexing_with_a_float_names_take_rows(indices: Any) -> None:
    expected = f"take_rows: expected integer indices, got {type(indices).__name__}"
    with pytest.raises(TypeError, match=re.escape(expected)):
        _ = _weight((3, 4))[indices]


def test_indexing_a_float_weight_is_python_s_type_error() -> None:
    # Floats have no rows: mypy rejects ``FloatWeight(...)[0]`` (tests/typing: float_layer_indexed),
    # so float weights and layers have no ``__getitem__`` to report it themselves.
    with pytest.raises(TypeError, match="'FloatWeight' object is not subscriptable"):
        _bad(FloatWeight(0.5))[0]


# ------------------------------------------------------------------------------------ take_rows


@pytest.mark.parametrize(
    ("indices", "bad"), [([0, 3], 3), ([2, 7, 1], 7), ([-1, 0], -1), (np.array([[0, 1], [5, 0]]), 5)]
)
def test_take_rows_index_out_of_range(indices: Any, bad: int) -> None:
    error = evaluation_error(lambda: monadl.take_rows(_weight((3, 4)), indices))
    assert isinstance(error, ShapeError)
    assert str(error) == f"take_rows: row index {bad} is out of range for a table of shape (3, 4)"


@pytest.mark.parametrize(
    ("indices", "expected"),
    [
        (np.array([0.0, 1.0]), "take_rows: expected integer indices, got dtype float64"),
        (np.array([True, False]), "take_rows: expected integer indices, got dtype bool"),
        ([0.0, 1.0], "take_rows: expected integer indices, got [0.0, 1.0]"),
        (1.0, "take_rows: expected integer indices, got float"),
        (None, "take_rows: expected integer indices, got NoneType"),
        ("0", "take_rows: expected integer indices, got '0'"),
        (2**70, f"take_rows: expected integer indices, got {2**70}"),  # no integer dtype holds it
    ],
)
def test_take_rows_float_indices(indices: Any, expected: str) -> None:
    with pytest.raises(TypeError, match=re.escape(expected)):
        monadl.take_rows(_weight((3, 4)), indices)
    if isinstance(indices, np.ndarray) and indices.dtype == np.bool_:
        return  # a boolean mask indexes (below)
    with pytest.raises(TypeError, match=re.escape(expected)):
        _ = _weight((3, 4))[indices]


def test_a_boolean_mask_must_fit_the_axes_it_indexes() -> None:
    with pytest.raises(monadl.ShapeError, match=re.escape("getitem: a boolean mask of shape (2,)")):
        _ = _weight((3, 4))[np.array([True, False])]
    with pytest.raises(monadl.ShapeError, match=re.escape("for axes 1.. of shape (3, 4)")):
        _ = _weight((3, 4))[:, np.array([True, False, True])]


# -------------------------------------------------------------------------------- cross_entropy


@pytest.mark.parametrize(
    ("targets", "wanted"),
    [
        (np.zeros((3, 5)), "(3, 4)"),  # probabilities must have the logits' shape
        (np.zeros((4,)), "(3, 4)"),
        (np.zeros((4,), dtype=np.int64), "(3,)"),  # labels: one per row
        (np.zeros((3, 1), dtype=np.int64), "(3,)"),
    ],
)
def test_cross_entropy_targets_of_the_wrong_shape(targets: Any, wanted: str) -> None:
    error = evaluation_error(lambda: monadl.cross_entropy(_weight((3, 4)), targets))
    assert isinstance(error, ShapeError)
    message = str(error)
    assert message.startswith("cross_entropy:"), message
    assert f"targets of shape {tuple(targets.shape)}" in message and "logits of shape (3, 4)" in message
    assert f"expected {wanted}" in message, message


@pytest.mark.parametrize(
    ("labels", "bad"),
    [
        (np.array([[0, 1], [3, 2]], dtype=np.int64), 3),  # the largest of a 2-d array of labels
        (np.array([[0, -1], [2, 2]], dtype=np.int32), -1),  # the smallest
        (np.array(4, dtype=np.int64), 4),  # one label
    ],
)
def test_cross_entropy_labels_out_of_range_name_the_label(labels: Any, bad: int) -> None:
    logits = _weight((*labels.shape, 3))
    error = evaluation_error(lambda: monadl.cross_entropy(logits, labels))
    assert isinstance(error, ValueError)
    assert str(error) == f"cross_entropy: label {bad} is out of range for 3 classes"


@pytest.mark.parametrize(
    ("shape", "targets"),
    [
        ((0, 4), np.zeros(0, dtype=np.int64)),  # an empty batch: a mean over no rows
        ((0, 4), np.zeros((0, 4))),
        ((2, 0, 4), np.zeros((2, 0), dtype=np.int64)),
        ((3, 0), np.zeros((3, 0))),  # no classes
    ],
)
def test_cross_entropy_of_empty_logits(shape: tuple[int, ...], targets: Any) -> None:
    error = evaluation_error(lambda: monadl.cross_entropy(_weight(shape), targets))
    assert isinstance(error, ShapeError)
    assert str(error) == f"cross_entropy: logits of shape {shape} are empty (no rows or no classes)"


def test_cross_entropy_targets_not_an_array() -> None:
    with pytest.raises(TypeError, match=re.escape("cross_entropy: expected an array of targets, got list")):
        monadl.cross_entropy(_weight((3, 4)), [0, 1, 2])  # type: ignore[call-overload]


@pytest.mark.parametrize("labels", [[0, 1, 4], [0, -1, 2]])
def test_cross_entropy_label_out_of_range(labels: list[int]) -> None:
    """A label outside [0, classes) has no class to pick: an error, not a silently wrong loss (its
    one-hot row would be all zeros, so that example would add nothing to the loss)."""
    bad = next(label for label in labels if not 0 <= label < 4)
    layer = monadl.cross_entropy(_weight((3, 4)), np.array(labels))
    result = layer.predict_blocking()
    assert not is_successful(result), f"an out-of-range label gave a loss: {result}"
    error = result.failure()
    assert isinstance(error, ValueError), repr(error)
    assert "cross_entropy" in str(error) and str(bad) in str(error), str(error)


# ---------------------------------------------------------------------- reshape and concatenate


@pytest.mark.parametrize(
    ("shape", "target"),
    [((3, 4), (5, 2)), ((3, 4), (5, -1)), ((2, 3), (7,)), ((0, 3), (-1, 0)), ((0, 3), (0, -1, 0))],
)
def test_reshape_to_an_incompatible_size(shape: tuple[int, ...], target: tuple[int, ...]) -> None:
    error = evaluation_error(lambda: monadl.reshape(_weight(shape), target))
    assert isinstance(error, ShapeError)
    assert str(error) == f"reshape: cannot reshape an array of shape {shape} to {target}"


@pytest.mark.parametrize(
    ("shapes", "axis", "why"),
    [
        ([(3, 4), (3, 5)], 0, "differ off axis 0"),
        ([(3, 4), (2, 4)], -1, "differ off axis -1"),
        ([(3, 4), (3, 4), (3, 2, 1)], 0, "cannot be joined along axis 0"),
        ([(3, 4), (3,)], 0, "cannot be joined along axis 0"),
        ([(3, 4), (3, 4)], 2, "cannot be joined along axis 2"),
    ],
)
def test_concatenate_mismatched_shapes(shapes: list[tuple[int, ...]], axis: int, why: str) -> None:
    error = evaluation_error(lambda: monadl.concatenate([_weight(s) for s in shapes], axis=axis))
    assert isinstance(error, ShapeError)
    assert str(error) == f"concatenate: arrays of shapes {shapes} {why}"


def test_concatenate_nothing() -> None:
    with pytest.raises(ValueError, match="concatenate: needs at least one array"):
        monadl.concatenate([])


def test_add_n_of_nothing() -> None:
    with pytest.raises(ValueError, match="add_n: needs at least one operand"):
        monadl.add_n([])


def test_add_n_mismatched_shapes_name_the_op_and_shapes() -> None:
    error = evaluation_error(lambda: monadl.add_n([_weight((3,)), _weight((3,)), _weight((4,))]))
    assert isinstance(error, ShapeError)
    assert str(error).startswith("add_n: operands of shapes (3,) and (3,) and (4,) do not fit")


def test_linear_shape_mismatches_name_the_op_and_shapes() -> None:
    x = monadl.ArrayWeight(np.ones((2, 3)))
    result = monadl.linear(x, np.ones((4, 5)), np.zeros(5)).predict_blocking()
    assert isinstance(result, Failure)
    assert (
        "linear" in str(result.failure())
        and "(2, 3)" in str(result.failure())
        and "(4, 5)" in str(result.failure())
    )
    result = monadl.linear(x, np.ones((3, 5)), np.zeros(4)).predict_blocking()
    assert isinstance(result, Failure)
    assert "linear: bias of shape (4,) does not fit 5 outputs" in str(result.failure())


# ------------------------------------------------------------------- static parameters of an op

untyped: Any = monadl  # the ops called with arguments their annotations reject


@pytest.mark.parametrize(
    ("build", "expected"),
    [
        (lambda x: untyped.sum(x, axis="a"), "sum: axis must be an int or a tuple of ints, got str 'a'"),
        (lambda x: untyped.sum(x, axis=1.0), "sum: axis must be an int or a tuple of ints, got float 1.0"),
        (lambda x: untyped.sum(x, axis=[0]), "sum: axis must be an int or a tuple of ints, got list [0]"),
        (
            lambda x: untyped.sum(x, axis=(0, True)),
            "sum: axis must be an int or a tuple of ints, got tuple (0, True)",
        ),
        (lambda x: untyped.sum(x, axis=0, keepdims=1), "sum: keepdims must be a bool, got int 1"),
        (lambda x: untyped.mean(x, axis=True), "mean: axis must be an int or a tuple of ints, got bool True"),
        (
            lambda x: untyped.mean(x, axis=0, keepdims=None),
            "mean: keepdims must be a bool, got NoneType None",
        ),
        (lambda x: untyped.softmax(x, axis="a"), "softmax: axis must be an int, got str 'a'"),
        (
            lambda x: untyped.mean(x, keepdims=True),
            "mean: keepdims=True needs an axis (over all axes, the mean is a float)",
        ),
        (lambda x: untyped.log_softmax(x, axis=0.5), "log_softmax: axis must be an int, got float 0.5"),
        (lambda x: untyped.concatenate([x, x], axis="0"), "concatenate: axis must be an int, got str '0'"),
        (lambda x: untyped.reshape(x, "ab"), "reshape: shape must be a sequence of ints, got str 'ab'"),
        (
            lambda x: untyped.reshape(x, (1.5, 8)),
            "reshape: shape must be a sequence of ints, got tuple (1.5, 8)",
        ),
        (lambda x: untyped.reshape(x, 12), "reshape: shape must be a sequence of ints, got int 12"),
        (
            lambda x: untyped.transpose(x, (1, None)),
            "transpose: axes must be a sequence of ints, got tuple (1, None)",
        ),
    ],
)
def test_a_wrong_static_parameter_is_reported_where_the_op_is_made(
    build: Callable[[ArrayWeight], Any], expected: str
) -> None:
    # Raised by the call that made the op (a Python float 1.5 is not silently truncated to 1),
    # before anything runs, whether or not its calls would later be merged.
    with pytest.raises(TypeError) as raised:
        build(_weight())
    assert str(raised.value) == expected


@pytest.mark.parametrize(
    ("shape", "expected"),
    [
        ((-1, -1), "reshape: shape (-1, -1) has more than one -1 (an unknown dimension)"),
        ((2, -1, 3, -1), "reshape: shape (2, -1, 3, -1) has more than one -1 (an unknown dimension)"),
        ((-2, -6), "reshape: shape (-2, -6) has a negative dimension (only -1 may be)"),
        ((12, -3), "reshape: shape (12, -3) has a negative dimension (only -1 may be)"),
    ],
)
def test_a_shape_that_is_no_shape_is_reported_where_reshape_is_made(
    shape: tuple[int, ...], expected: str
) -> None:
    # No array has these shapes, whatever its size: a ValueError at the call, not when it runs.
    # (Before, (-2, -6) passed reshape's check for a (3, 4) array, 12 elements, and NumPy's
    # own error about it came back named by the op's shapes.)
    with pytest.raises(ValueError) as raised:
        monadl.reshape(_weight(), shape)
    assert str(raised.value) == expected


@pytest.mark.parametrize("axes", [(0, 3), (3, 0), (2, 0), (-3, 1), (0, 0)])
def test_transpose_axes_out_of_range_name_the_op(axes: tuple[int, ...]) -> None:
    # (0, 3) and (3, 0) are a permutation of (0, 1) modulo 2: they passed the check, and NumPy's
    # AxisError came back, named by the op's shapes only.
    error = evaluation_error(lambda: monadl.transpose(_weight((3, 4)), axes))
    assert isinstance(error, ShapeError)
    assert str(error) == f"transpose: axes {axes} do not fit an array of shape (3, 4)"


@pytest.mark.parametrize(
    ("x", "w"),
    [
        ((2, 3, 4), (4, 0)),  # no outputs: a delta of rows of nothing
        ((2, 3, 0), (0, 2)),  # no inputs
        ((2, 0, 3), (3, 2)),  # no rows
    ],
)
@pytest.mark.parametrize("fan", [False, True])
def test_linear_of_arrays_without_elements_has_gradients(
    x: tuple[int, ...], w: tuple[int, ...], fan: bool
) -> None:
    # The vjps made x and the delta matrices of rows by a reshape to (-1, n), which NumPy refuses
    # for an array without elements (-1 could be anything): a raw ValueError, naming nothing.
    # ``fan``: one x with two weights, merged into one call (the fan-out of an LSTM's gates).
    xw, ws = ArrayWeight(np.ones(x)), [ArrayWeight(np.ones(w)) for _ in range(2 if fan else 1)]
    outputs = [monadl.linear(xw, wj, 0.5) for wj in ws]
    loss = monadl.add_n([monadl.sum(o) for o in outputs]) + monadl.sum(xw)
    _, gradients = monadl.compute_gradients(loss)
    for weight in (xw, *ws):
        gradient = np.asarray(gradients[weight])
        assert gradient.shape == weight.data.shape
    np.testing.assert_array_equal(np.asarray(gradients[xw]), np.ones(x))  # nothing flows back but sum's


def test_numpy_integers_are_static_parameters_like_ints() -> None:
    x = np.arange(12.0).reshape(3, 4)
    # NumPy's integers are accepted at run time (the annotations say int) and become ints.
    as_numpy = untyped.sum(
        untyped.reshape(x, (np.int64(4), np.int32(3))), axis=(np.int64(0),), keepdims=np.bool_(True)
    )
    as_python = monadl.sum(monadl.reshape(x, (4, 3)), axis=(0,), keepdims=True)
    np.testing.assert_array_equal(as_numpy.predict_blocking().unwrap(), as_python.predict_blocking().unwrap())
    np.testing.assert_array_equal(
        as_python.predict_blocking().unwrap(), x.reshape(4, 3).sum(axis=0, keepdims=True)
    )
    concatenated = untyped.concatenate([x, x], axis=np.int64(1)).predict_blocking().unwrap()
    np.testing.assert_array_equal(concatenated, np.concatenate([x, x], axis=1))


# ------------------------------------------------------------------ float arithmetic is IEEE's

_FLOAT_CASES: list[tuple[str, Callable[[Any], Any], Callable[[Any], Any], float]] = [
    # (name, the expression on a float layer, the same on a NumPy array, the float)
    ("1 / 0", lambda s: 1.0 / s, lambda a: 1.0 / a, 0.0),
    ("-1 / 0", lambda s: -1.0 / s, lambda a: -1.0 / a, 0.0),
    ("0 / 0", lambda s: s / s, lambda a: a / a, 0.0),
    ("negative ** 0.5", lambda s: s**0.5, lambda a: a**0.5, -2.0),
    ("0 ** -1", lambda s: s**-1.0, lambda a: a**-1.0, 0.0),
    ("overflow", lambda s: s**400.0, lambda a: a**400.0, 10.0),
    ("exp overflow", monadl.exp, np.exp, 1000.0),
    ("log 0", monadl.log, np.log, 0.0),
    ("sqrt negative", monadl.sqrt, np.sqrt, -1.0),
]


@pytest.mark.parametrize(
    ("expression", "build", "on_array", "at"), _FLOAT_CASES, ids=[c[0] for c in _FLOAT_CASES]
)
@pytest.mark.parametrize("batching", [False, True])
def test_a_float_layer_computes_as_an_array_of_one_element(
    expression: str, build: Callable[[Any], Any], on_array: Callable[[Any], Any], at: float, batching: bool
) -> None:
    # Python's floats raise ZeroDivisionError or OverflowError, or turn complex, where NumPy gives
    # inf or nan: a FloatLayer gives what the array does, a float, whichever way it runs.
    with np.errstate(all="ignore"):
        expected = float(on_array(np.asarray([at]))[0])
    assert not math.isfinite(expected)  # so that a sum of nine of them is the same
    executor = monadl.Executor(batching=batching)  # merged, or not at all
    weight = FloatWeight(at)
    layer = build(weight)
    if batching:  # nine calls merged: the rows of one array (of nine values computed from the weight)
        layer = monadl.add_n([build(weight * 1.0) for _ in range(9)])
    with np.errstate(all="ignore"):  # merged, the rows are an array: NumPy's warnings
        value = layer.predict_blocking(executor=executor).unwrap()
    assert type(value) is float
    np.testing.assert_equal(value, expected)
    assert (executor.stats.merged > 0) == batching


def test_the_gradient_of_a_float_at_a_pole_is_that_of_the_array() -> None:
    weight = FloatWeight(0.0)
    _, gradients = monadl.compute_gradients(monadl.sqrt(weight) + 1.0)  # d sqrt(x) / dx = 0.5 / sqrt(x)
    assert type(gradients[weight]) is float and gradients[weight] == np.inf


# ------------------------------------------------------------- NumPy's functions on layers, weights

_LAZY = "is lazy and has no array value until it runs"
_NO_ARRAY = "an ArrayWeight is no array"


@pytest.mark.parametrize(
    ("call", "expected"),
    [
        (
            lambda w: np.argmax(_bad(monadl.relu(w))),
            f"numpy.argmax: an ArrayLayer {_LAZY}: use monadl.argmax",
        ),
        (lambda w: np.mean(w * 2.0), f"numpy.mean: an ArrayLayer {_LAZY}: use monadl.mean on it"),
        (lambda w: np.asarray(monadl.relu(w)), f"numpy.asarray: an ArrayLayer {_LAZY}: use monadl's ops"),
        (lambda w: np.array(monadl.sum(w)), f"numpy.asarray: a FloatLayer {_LAZY}: use monadl's ops"),
        (lambda w: np.dot(np.ones(3), w), f"numpy.dot: {_NO_ARRAY}: use monadl.dot on it, or its value"),
        (
            lambda w: np.array(w),
            f"numpy.asarray: {_NO_ARRAY}: use monadl's ops on it, or its value, weight.data",
        ),
        (lambda w: np.asarray(w), f"numpy.asarray: {_NO_ARRAY}"),
        (lambda w: np.concatenate([w, w]), f"numpy.concatenate: {_NO_ARRAY}: use monadl.concatenate"),
        (lambda w: np.sum(_bad(FloatWeight(1.0))), "numpy.sum: a FloatWeight is no array"),
    ],
)
def test_numpy_refuses_layers_and_weights_naming_the_monadl_op(
    call: Callable[[ArrayWeight], Any], expected: str
) -> None:
    # Before, NumPy made a 0-d array of objects of them: np.argmax(layer) was 0, np.dot(x, w) and
    # np.array(w) arrays of layers, np.mean(layer) an error about an object dtype.
    with pytest.raises(TypeError) as raised:
        call(_weight((3, 3)))
    assert str(raised.value).startswith(expected), str(raised.value)


def test_numpy_reads_a_known_shape_of_a_layer_or_a_weight() -> None:
    # np.shape, np.ndim and np.size read no value: they answer from .shape where it is known (a
    # layer's ndim was 0 and its size 1, of a 0-d array of objects). (mypy rejects the calls:
    # NumPy's stubs take no layer.)
    numpy: Any = np
    w = _weight((3, 4))
    for x in (w, monadl.relu(w), w @ np.ones((4, 2))):
        shape = x.shape
        assert shape is not None
        assert (numpy.shape(x), numpy.ndim(x), numpy.size(x)) == (shape, len(shape), math.prod(shape))
        assert numpy.size(x, 0) == shape[0]
    assert (numpy.shape(FloatWeight(1.0)), numpy.ndim(monadl.sum(w)), numpy.size(monadl.sum(w))) == ((), 0, 1)
    with pytest.raises(ShapeError, match=re.escape("matmul: shapes (2,) and (3, 4) are not aligned")):
        numpy.shape(ArrayWeight.zeros((2,)) @ w)  # a graph that cannot run: its error

    @monadl.batchable
    def twice(x: ArrayLayer) -> ArrayLayer:
        return x + x

    with pytest.raises(TypeError, match=f"numpy.shape: an ArrayLayer {_LAZY}"):
        numpy.shape(twice(monadl.lift_array(np.ones(3))))  # (its shape is not known before it runs)


def test_arrays_on_the_left_of_operators_still_give_layers() -> None:
    w = _weight((3, 3))
    for layer in (
        np.ones(3) * w,
        np.ones(3) + monadl.relu(w),
        _bad(np.float32(2.0)) * w,
        np.ones((3, 3)) @ w,
    ):
        assert isinstance(layer, ArrayLayer)
    np.testing.assert_array_equal((np.ones(3) * w).predict_blocking().unwrap(), np.ones((3, 3)))
