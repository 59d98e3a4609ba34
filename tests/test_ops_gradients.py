"""Every op's forward value (against NumPy) and gradient (against finite differences, through the
library's checker, ``monadl.check_gradients``), on hypothesis-generated shapes and values."""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from op_cases import (
    CASES,
    F64,
    NUMPY,
    Input,
    OpCase,
    Weight,
    check_op,
    predict,
    probe,
    scalar_loss,
)

import monadl
from monadl import ArrayLayer, ArrayWeight, FloatLayer, FloatWeight, ShapeError
from monadl.do.primitive import Primitive
from monadl.dsl.core.layers import apply_array, apply_float
from monadl.dsl.ops.activations import RELU
from monadl.dsl.ops.operators import mm
from monadl.gradcheck import GradientMismatch, check_gradients, gradients_of
from monadl.typeclasses.backend import NUMPY as NUMPY_XP

SETTINGS = settings(max_examples=25, deadline=None)


def floats(lo: float, hi: float) -> st.SearchStrategy[float]:
    return st.floats(lo, hi, allow_nan=False, allow_infinity=False, allow_subnormal=False)


REAL = floats(-2.0, 2.0)
POSITIVE = floats(0.5, 2.0)  # bases of **, denominators
LOG_DOMAIN = floats(0.2, 3.0)  # log, sqrt
NONZERO = st.one_of(floats(0.05, 2.0), floats(-2.0, -0.05))  # abs and relu away from their kink
# maximum and minimum away from ties: the first operand's entries are k/4 + 1/8 + u (|u| <= 0.1),
# the second's k/4, so the two never come closer than 0.025 (>> the finite-difference step).
GRID_A = st.tuples(st.integers(-8, 8), floats(-0.1, 0.1)).map(lambda t: t[0] / 4 + 0.125 + t[1])
GRID_B = st.integers(-8, 8).map(lambda k: k / 4)

SHAPES = hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=4)


def arrays(shape: Sequence[int], elements: st.SearchStrategy[float] = REAL) -> st.SearchStrategy[F64]:
    return hnp.arrays(np.float64, tuple(shape), elements=elements)


# ------------------------------------------------------------------------------ binary operators

Binary = Callable[[Any, Any], Any]
# name -> (monadl spelling, NumPy reference, elements of the first operand, of the second)
BINARY: dict[str, tuple[Binary, Binary, st.SearchStrategy[float], st.SearchStrategy[float]]] = {
    "add": (operator.add, operator.add, REAL, REAL),
    "sub": (operator.sub, operator.sub, REAL, REAL),
    "mul": (operator.mul, operator.mul, REAL, REAL),
    "div": (operator.truediv, operator.truediv, REAL, st.one_of(POSITIVE, POSITIVE.map(operator.neg))),
    "pow": (operator.pow, operator.pow, POSITIVE, REAL),
    "maximum": (monadl.maximum, np.maximum, GRID_A, GRID_B),
    "minimum": (monadl.minimum, np.minimum, GRID_A, GRID_B),
}

# Each operand is a weight ("array", "float": gradients checked), or a literal ("array const" is a
# NumPy array, "float const" a Python float). A constant on the left exercises reflected operators.
KINDS = [
    ("array", "array"),
    ("array", "array const"),
    ("array const", "array"),
    ("array", "float"),
    ("float", "array"),
    ("array", "float const"),
    ("float const", "array"),
    ("float", "float"),
    ("float", "float const"),
    ("float const", "float"),
]


def _operand(
    data: st.DataObject, kind: str, shape: tuple[int, ...], elements: st.SearchStrategy[float]
) -> Any:
    if kind.startswith("float"):
        return data.draw(elements)
    return data.draw(arrays(shape, elements))


@pytest.mark.parametrize("kinds", KINDS, ids="-".join)
@pytest.mark.parametrize("name", list(BINARY))
@SETTINGS
@given(data=st.data())
def test_binary(name: str, kinds: tuple[str, str], data: st.DataObject) -> None:
    fn, reference, elements_a, elements_b = BINARY[name]
    if kinds == ("array", "array") or "array const" in kinds:
        shape_a, shape_b = data.draw(
            hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=1, max_dims=3, max_side=3)
        ).input_shapes
    else:
        shape_a = shape_b = data.draw(SHAPES)
    values = [
        _operand(data, kinds[0], shape_a, elements_a),
        _operand(data, kinds[1], shape_b, elements_b),
    ]
    is_weight = [not kind.endswith("const") for kind in kinds]

    def op(*weights: Weight) -> FloatLayer | ArrayLayer:
        given_weights = iter(weights)
        operands = [next(given_weights) if w else v for w, v in zip(is_weight, values, strict=True)]
        out: FloatLayer | ArrayLayer = fn(*operands)
        return out

    inputs = [v for w, v in zip(is_weight, values, strict=True) if w]
    expected = reference(*values)
    out = op(*(FloatWeight(1.0) if isinstance(v, float) else ArrayWeight(v) for v in inputs))
    # the result type follows the operands: float with float gives a FloatLayer
    assert isinstance(out, FloatLayer if all(k.startswith("float") for k in kinds) else ArrayLayer)
    check_op(op, inputs, expected)


@SETTINGS
@given(data=st.data())
def test_integer_power_of_any_sign(data: st.DataObject) -> None:
    x = data.draw(arrays(data.draw(SHAPES)))
    (g,) = check_op(lambda w: w**3, [x], x**3)
    p = probe(x.shape)
    np.testing.assert_allclose(g, 3 * x**2 * p, rtol=1e-12, atol=1e-12)  # d(x^3) = 3x^2


@SETTINGS
@given(data=st.data())
def test_weight_used_twice_accumulates(data: st.DataObject) -> None:
    x = data.draw(arrays(data.draw(SHAPES)))
    p = probe(x.shape)
    (g,) = check_gradients(lambda w: monadl.sum((w * w + w) * p), x)
    np.testing.assert_allclose(g, (2 * x + 1) * p, rtol=1e-12, atol=1e-12)


def test_broadcast_gradients_come_back_in_each_operands_shape() -> None:
    rng = np.random.default_rng(0)
    a = rng.standard_normal((3, 4))
    p = probe((3, 4))
    others: list[F64 | float] = [
        rng.standard_normal(4),
        rng.standard_normal((3, 1)),
        rng.standard_normal((1, 4)),
        0.7,
    ]
    for b in others:
        # d sum(a * b * p) / da = b * p (broadcast), / db = a * p summed over b's broadcast axes
        g_a, g_b = check_gradients(lambda x, y: monadl.sum(x * y * p), a, b)
        assert np.shape(g_a) == (3, 4)
        np.testing.assert_allclose(g_a, np.broadcast_to(b, (3, 4)) * p, rtol=1e-12)
        if isinstance(b, float):
            assert type(g_b) is float  # a FloatWeight's gradient is a float
            np.testing.assert_allclose(g_b, float(np.sum(a * p)), rtol=1e-12)
        else:
            assert np.shape(g_b) == b.shape
            summed = np.sum(a * p, axis=tuple(range(a.ndim - b.ndim)))  # the leading axes b lacks
            axes = tuple(i for i, n in enumerate(b.shape) if n == 1)
            np.testing.assert_allclose(g_b, np.sum(summed, axis=axes, keepdims=True), rtol=1e-12)
        # with b first: the same gradients
        g_b2, g_a2 = check_gradients(lambda y, x: monadl.sum((y + x) * p), b, a)
        assert np.shape(g_a2) == (3, 4) and np.shape(g_b2) == np.shape(b)
        np.testing.assert_allclose(g_a2, p, rtol=1e-12)
    # a Python float literal: only the array weight gets a gradient
    _, grads = gradients_of(lambda x: monadl.sum((2.5 - x) * p), [a])
    np.testing.assert_allclose(grads[0], -p, rtol=1e-12)


def test_float_weight_times_array_weight_gives_a_float_gradient() -> None:
    a = np.random.default_rng(1).standard_normal((2, 3))
    p = probe((2, 3))
    w, x = FloatWeight(1.5), ArrayWeight(a)
    _, grads = monadl.compute_gradients(monadl.sum(w * x * p))
    assert type(grads[w]) is float
    assert grads[w] == pytest.approx(float(np.sum(a * p)), rel=1e-12)
    assert isinstance(grads[x], np.ndarray) and grads[x].shape == (2, 3)
    np.testing.assert_allclose(grads[x], 1.5 * p, rtol=1e-12)


# ------------------------------------------------------------------------------------ unary ops

Unary = Callable[[Any], Any]
UNARY: dict[str, tuple[Unary, Unary, st.SearchStrategy[float]]] = {
    "neg": (operator.neg, np.negative, REAL),
    "exp": (monadl.exp, np.exp, REAL),
    "log": (monadl.log, np.log, LOG_DOMAIN),
    "sqrt": (monadl.sqrt, np.sqrt, LOG_DOMAIN),
    "abs": (monadl.abs, np.abs, NONZERO),
    "tanh": (monadl.tanh, np.tanh, REAL),
    "sigmoid": (monadl.sigmoid, lambda x: 1.0 / (1.0 + np.exp(-x)), floats(-4.0, 4.0)),
    "relu": (monadl.relu, lambda x: np.maximum(x, 0.0), NONZERO),
}


@pytest.mark.parametrize("kind", ["array", "float"])
@pytest.mark.parametrize("name", list(UNARY))
@SETTINGS
@given(data=st.data())
def test_unary(name: str, kind: str, data: st.DataObject) -> None:
    fn, reference, elements = UNARY[name]
    x: Input = data.draw(elements) if kind == "float" else data.draw(arrays(data.draw(SHAPES), elements))
    check_op(fn, [x], reference(x))


@settings(max_examples=30, deadline=None)
@given(
    st.sampled_from([np.float32, np.float64]),
    st.integers(1, 96),
    st.booleans(),
    st.integers(0, 2**32 - 1),
)
def test_relu_vjp_is_the_delta_times_the_mask_of_the_units_on(
    dtype: type[np.floating[Any]], rows: int, transposed: bool, seed: int
) -> None:
    # relu's vjp is one multiplication (activations._relu_vjp): d where x > 0, d * 0 elsewhere, in
    # d's dtype: for finite deltas, where(x > 0, d, 0) up to the sign of the zeros; a non-finite
    # delta of a unit that is off gives NaN, as IEEE's product does. x may hold NaN and 0.0.
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, 64)).astype(dtype)
    d = rng.standard_normal((rows, 64)).astype(dtype)
    spots = rng.integers(0, x.size, 20)
    x.flat[spots] = np.array([np.nan, 0.0, -0.0], dtype=dtype)[rng.integers(0, 3, 20)]
    if transposed:  # a delta that is a view with other strides
        d = np.ascontiguousarray(d.T).T
    got = RELU.vjps[0](np, d, None, x)
    assert got.dtype == dtype and got.shape == d.shape
    on = x > 0.0
    np.testing.assert_array_equal(got[on], d[on])  # the same bits where the unit is on
    assert np.all(got[~on] == 0.0)  # zeros (of either sign) where it is off
    d.flat[0], x.flat[0] = np.nan, -1.0  # a NaN delta of a unit that is off
    assert np.isnan(RELU.vjps[0](np, d, None, x).flat[0])


def test_relu_gradient_of_a_large_weight_equals_a_central_difference() -> None:
    rng = np.random.default_rng(5)
    w = ArrayWeight(rng.uniform(0.1, 1.0, (80, 64)) * rng.choice([-1.0, 1.0], (80, 64)))  # off the kink
    c = rng.standard_normal((80, 64))
    loss = monadl.sum(monadl.relu(w) * c)
    _, gradients = monadl.compute_gradients(loss)
    direction = rng.standard_normal((80, 64))
    eps = 1e-6

    def at(shift: float) -> float:
        return float(np.sum(np.maximum(w.data + shift * direction, 0.0) * c))

    numeric = (at(eps) - at(-eps)) / (2 * eps)  # the derivative along one random direction
    assert float(np.sum(gradients[w] * direction)) == pytest.approx(numeric, rel=1e-7)
    np.testing.assert_array_equal(gradients[w], np.where(w.data > 0.0, c, 0.0))


# ---------------------------------------------------------------------------------------- matmul

# name -> shapes of a and b, given the sizes m, k, n and a batch size s
MATMUL: dict[str, Callable[[int, int, int, int], tuple[tuple[int, ...], tuple[int, ...]]]] = {
    "2d@2d": lambda m, k, n, s: ((m, k), (k, n)),
    "1d@2d": lambda m, k, n, s: ((k,), (k, n)),
    "2d@1d": lambda m, k, n, s: ((m, k), (k,)),
    "1d@1d": lambda m, k, n, s: ((k,), (k,)),
    "3d@3d": lambda m, k, n, s: ((s, m, k), (s, k, n)),
    "3d@2d": lambda m, k, n, s: ((s, m, k), (k, n)),
    "2d@3d": lambda m, k, n, s: ((m, k), (s, k, n)),
    "3d@1d": lambda m, k, n, s: ((s, m, k), (k,)),
    "1d@3d": lambda m, k, n, s: ((k,), (s, k, n)),
    "broadcast batch": lambda m, k, n, s: ((1, m, k), (s, k, n)),
}
SPELLINGS: dict[str, Binary] = {"@": operator.matmul, "matmul": monadl.matmul, "dot": monadl.dot}


@pytest.mark.parametrize(
    "kinds", [("weight", "weight"), ("const", "weight"), ("weight", "const")], ids="-".join
)
@pytest.mark.parametrize("pattern", list(MATMUL))
@SETTINGS
@given(data=st.data())
def test_matmul(pattern: str, kinds: tuple[str, str], data: st.DataObject) -> None:
    sizes = data.draw(st.tuples(*[st.integers(1, 4)] * 4))
    shape_a, shape_b = MATMUL[pattern](*sizes)
    a, b = data.draw(arrays(shape_a)), data.draw(arrays(shape_b))
    fn = SPELLINGS[data.draw(st.sampled_from(sorted(SPELLINGS)))]
    if kinds == ("weight", "weight"):
        check_op(fn, [a, b], np.matmul(a, b))
    elif kinds == ("const", "weight"):  # a NumPy array on the left: ndarray @ weight is reflected
        check_op(lambda w: fn(a, w), [b], np.matmul(a, b))
    else:
        check_op(lambda w: fn(w, b), [a], np.matmul(a, b))


# ------------------------------------------------------------------------------------ reductions

REDUCTIONS: dict[str, tuple[Callable[..., Any], Callable[..., Any]]] = {
    "sum": (monadl.sum, np.sum),
    "mean": (monadl.mean, np.mean),
}


@pytest.mark.parametrize("name", list(REDUCTIONS))
@SETTINGS
@given(data=st.data())
def test_reduction_whole(name: str, data: st.DataObject) -> None:
    fn, reference = REDUCTIONS[name]
    x = data.draw(arrays(data.draw(SHAPES)))
    assert isinstance(fn(ArrayWeight(x)), FloatLayer)
    (g,) = check_op(fn, [x], float(reference(x)))
    # d sum(x) = 1, d mean(x) = 1/n everywhere
    np.testing.assert_allclose(g, np.full(x.shape, 1.0 if name == "sum" else 1.0 / x.size), rtol=1e-12)


@pytest.mark.parametrize("name", list(REDUCTIONS))
@SETTINGS
@given(data=st.data())
def test_reduction_along_axis(name: str, data: st.DataObject) -> None:
    fn, reference = REDUCTIONS[name]
    x = data.draw(arrays(data.draw(SHAPES)))
    axis = data.draw(st.integers(-x.ndim, x.ndim - 1))
    keepdims = data.draw(st.booleans())
    check_op(lambda w: fn(w, axis=axis, keepdims=keepdims), [x], reference(x, axis=axis, keepdims=keepdims))


@pytest.mark.parametrize("name", list(REDUCTIONS))
@SETTINGS
@given(data=st.data())
def test_reduction_along_axes(name: str, data: st.DataObject) -> None:
    fn, reference = REDUCTIONS[name]
    x = data.draw(arrays(data.draw(SHAPES)))
    axes = data.draw(hnp.valid_tuple_axes(x.ndim, min_size=1))
    keepdims = data.draw(st.booleans())
    check_op(lambda w: fn(w, axis=axes, keepdims=keepdims), [x], reference(x, axis=axes, keepdims=keepdims))


# ----------------------------------------------------------------------------------------- shape


@SETTINGS
@given(data=st.data())
def test_reshape(data: st.DataObject) -> None:
    x = data.draw(arrays(data.draw(SHAPES)))
    i = data.draw(st.integers(0, x.ndim - 1))
    target = data.draw(
        st.sampled_from(
            [(x.size,), (-1,), x.shape[::-1], (1, x.size, 1), (*x.shape[:i], -1, *x.shape[i + 1 :])]
        )
    )
    check_op(lambda w: monadl.reshape(w, target), [x], np.reshape(x, target))


@SETTINGS
@given(data=st.data())
def test_transpose_default(data: st.DataObject) -> None:
    x = data.draw(arrays(data.draw(SHAPES)))
    check_op(monadl.transpose, [x], np.transpose(x))


@SETTINGS
@given(data=st.data())
def test_transpose_axes(data: st.DataObject) -> None:
    x = data.draw(arrays(data.draw(SHAPES)))
    perm = data.draw(st.permutations(range(x.ndim)))
    negative = data.draw(st.lists(st.booleans(), min_size=x.ndim, max_size=x.ndim))
    axes = tuple(a - x.ndim if neg else a for a, neg in zip(perm, negative, strict=True))
    check_op(lambda w: monadl.transpose(w, axes), [x], np.transpose(x, axes))


@pytest.mark.parametrize("n", [2, 3, 5])
@SETTINGS
@given(data=st.data())
def test_add_n(n: int, data: st.DataObject) -> None:
    """The sum of n operands of broadcastable shapes, each operand's gradient summed back to its shape."""
    shapes = data.draw(hnp.mutually_broadcastable_shapes(num_shapes=n, min_dims=1, max_dims=3, max_side=3))
    xs = [data.draw(arrays(shape)) for shape in shapes.input_shapes]
    expected = xs[0]
    for x in xs[1:]:
        expected = expected + x
    check_op(lambda *ws: monadl.add_n(ws), xs, expected)


@SETTINGS
@given(xs=st.lists(REAL, min_size=2, max_size=6))
def test_add_n_of_floats_is_a_float_layer(xs: list[float]) -> None:
    check_op(lambda *ws: monadl.add_n(ws), xs, sum(xs))


@pytest.mark.parametrize("axis", [0, -1])
@pytest.mark.parametrize("n", [2, 3])
@SETTINGS
@given(data=st.data())
def test_concatenate(n: int, axis: int, data: st.DataObject) -> None:
    shape = data.draw(SHAPES)
    ax = axis % len(shape)
    xs = [data.draw(arrays((*shape[:ax], data.draw(st.integers(1, 3)), *shape[ax + 1 :]))) for _ in range(n)]
    grads = check_op(lambda *ws: monadl.concatenate(ws, axis=axis), xs, np.concatenate(xs, axis=axis))
    # each input gets its own slice of the probe
    p = probe(np.concatenate(xs, axis=axis).shape)
    bounds = np.cumsum([0] + [x.shape[ax] for x in xs])
    for g, lo, hi in zip(grads, bounds[:-1], bounds[1:], strict=True):
        np.testing.assert_array_equal(g, np.take(p, np.arange(lo, hi), axis=ax))


@pytest.mark.parametrize("batching", [True, False])
def test_concatenate_slices_every_inputs_delta_in_one_vjp(batching: bool) -> None:
    """Every input's delta of a concatenation (its slice of the result's delta) comes from one
    vjp run per application or merged group; the slices are the probe's."""
    rng = np.random.default_rng(7)
    xs = [[ArrayWeight(rng.standard_normal(k + 1)) for k in range(3)] for _ in range(4)]
    probes = [rng.standard_normal(6) for _ in range(4)]
    loss = monadl.add_n(
        [monadl.sum(monadl.concatenate(x, axis=-1) * p) for x, p in zip(xs, probes, strict=True)]
    )
    executor = monadl.Executor(batching=batching)
    _, gradients = monadl.compute_gradients(loss, executor=executor)
    stats = executor.stats
    applications = 1 if batching else 4
    assert stats.backwards["concatenate"] == stats.vjps["concatenate"] == applications, stats
    for x, p in zip(xs, probes, strict=True):
        np.testing.assert_array_equal(np.concatenate([gradients[w] for w in x]), p)


@SETTINGS
@given(data=st.data())
def test_take_rows(data: st.DataObject) -> None:
    rows = data.draw(st.integers(1, 5))
    rest = data.draw(hnp.array_shapes(min_dims=0, max_dims=2, min_side=1, max_side=3))
    table = data.draw(arrays((rows, *rest)))
    index_shape = data.draw(hnp.array_shapes(min_dims=1, max_dims=2, min_side=1, max_side=6))
    indices = data.draw(hnp.arrays(np.int64, index_shape, elements=st.integers(0, rows - 1)))
    check_op(lambda w: monadl.take_rows(w, indices), [table], table[indices])


@SETTINGS
@given(data=st.data())
def test_take_rows_accumulates_repeated_indices(data: st.DataObject) -> None:
    rows = data.draw(st.integers(1, 5))
    table = data.draw(arrays((rows, 3)))
    indices = data.draw(st.lists(st.integers(0, rows - 1), min_size=1, max_size=10))
    # d sum(table[indices]) / d table[r] = (how often r is used) in every column
    counts = np.bincount(np.asarray(indices), minlength=rows).astype(np.float64)
    (g,) = check_gradients(lambda w: monadl.sum(monadl.take_rows(w, indices)), table)
    np.testing.assert_array_equal(g, np.broadcast_to(counts[:, None], table.shape))
    # weight[indices] is the same lookup
    (g2,) = check_gradients(lambda w: monadl.sum(w[indices] * 2.0), table)
    np.testing.assert_array_equal(g2, 2.0 * np.broadcast_to(counts[:, None], table.shape))


def test_take_rows_repeated_index_example() -> None:
    table = np.arange(6.0).reshape(3, 2)
    p = np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0], [7.0, 8.0]])
    (g,) = check_gradients(lambda w: monadl.sum(monadl.take_rows(w, [1, 1, 1, 0]) * p), table)
    np.testing.assert_array_equal(g, [[7.0, 8.0], [9.0, 12.0], [0.0, 0.0]])


@pytest.mark.parametrize("index", [np.int64(2), np.uint8(2), np.argmax(np.array([0.0, 1.0, 5.0]))])
def test_take_rows_of_one_numpy_integer(index: np.integer[Any]) -> None:
    """One NumPy integer (an argmax, an element of an id array) takes one row, as the int would."""
    table = np.arange(6.0).reshape(3, 2)
    (g,) = check_gradients(lambda w: monadl.sum(w[index] * np.array([3.0, 4.0])), table)
    np.testing.assert_array_equal(g, [[0.0, 0.0], [0.0, 0.0], [3.0, 4.0]])
    check_op(lambda w: monadl.take_rows(w, index), [table], table[2])


# ------------------------------------------------------------------------------ softmax and loss


def _log_softmax(x: F64, axis: int) -> F64:
    shifted = x - np.max(x, axis=axis, keepdims=True)
    out: F64 = shifted - np.log(np.sum(np.exp(shifted), axis=axis, keepdims=True))
    return out


@SETTINGS
@given(data=st.data())
def test_softmax(data: st.DataObject) -> None:
    x = data.draw(arrays(data.draw(SHAPES), floats(-3.0, 3.0)))
    axis = data.draw(st.integers(-x.ndim, x.ndim - 1))
    check_op(lambda w: monadl.softmax(w, axis=axis), [x], np.exp(_log_softmax(x, axis)))


@SETTINGS
@given(data=st.data())
def test_log_softmax(data: st.DataObject) -> None:
    x = data.draw(arrays(data.draw(SHAPES), floats(-3.0, 3.0)))
    axis = data.draw(st.integers(-x.ndim, x.ndim - 1))
    check_op(lambda w: monadl.log_softmax(w, axis=axis), [x], _log_softmax(x, axis))


@pytest.mark.parametrize("targets", ["labels", "one-hot", "soft"])
@SETTINGS
@given(data=st.data())
def test_cross_entropy(targets: str, data: st.DataObject) -> None:
    shape = data.draw(hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=4))
    logits = data.draw(arrays(shape, floats(-3.0, 3.0)))
    classes = shape[-1]
    labels = data.draw(hnp.arrays(np.int64, shape[:-1], elements=st.integers(0, classes - 1)))
    probabilities = np.eye(classes)[labels]
    if targets == "soft":
        raw = data.draw(arrays(shape, floats(0.1, 1.0)))
        probabilities = raw / np.sum(raw, axis=-1, keepdims=True)
    given_targets = labels if targets == "labels" else probabilities
    batch = max(int(np.prod(shape[:-1])), 1)
    expected = -float(np.sum(probabilities * _log_softmax(logits, -1))) / batch
    (g,) = check_op(lambda w: monadl.cross_entropy(w, given_targets), [logits], expected)
    # analytic: (softmax(logits) - targets) / batch
    np.testing.assert_allclose(g, (np.exp(_log_softmax(logits, -1)) - probabilities) / batch, atol=1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@SETTINGS
@given(data=st.data())
def test_numpy_softmax_paths_equal_the_generic_rules(
    dtype: type[np.floating[Any]], data: st.DataObject
) -> None:
    """log_softmax and cross_entropy take a NumPy path of their own; it matches the generic rule (run
    here on array_api_compat's NumPy namespace, which is not ``np``) to rounding."""
    import array_api_compat.numpy as compat

    from monadl.dsl.ops.activations import log_softmax_of
    from monadl.dsl.ops.classification import _cross_entropy

    shape = data.draw(hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=5))
    logits = data.draw(arrays(shape, floats(-30.0, 30.0))).astype(dtype)
    labels = data.draw(hnp.arrays(np.int64, shape[:-1], elements=st.integers(0, shape[-1] - 1)))
    rtol, atol = (1e-5, 1e-6) if dtype == np.float32 else (1e-13, 1e-14)
    fast, generic = log_softmax_of(np, logits, -1), log_softmax_of(compat, logits, -1)
    assert fast.dtype == generic.dtype == dtype
    np.testing.assert_array_equal(fast, generic)  # the same operations, in place
    bounds = (int(labels.min(initial=0)), int(labels.max(initial=0)))
    loss, gradient = _cross_entropy(np, logits, labels, bounds)
    loss_generic, gradient_generic = _cross_entropy(compat, logits, labels, bounds)
    assert gradient.dtype == gradient_generic.dtype == dtype
    np.testing.assert_array_equal(gradient, gradient_generic)
    # the loss sums the labels' terms only, not every term times a one-hot: the rounding differs
    np.testing.assert_allclose(loss, loss_generic, rtol=rtol, atol=atol)


# ----------------------------------------------------------------------- the shared fixed cases


@pytest.mark.parametrize("case", CASES, ids=str)
def test_backend_case_gradients(case: OpCase) -> None:
    """The cases the backend tests compare against NumPy are themselves right on NumPy."""

    def op(*weights: Weight) -> FloatLayer | ArrayLayer:
        return case.op(NUMPY.asarray, *weights)

    out = op(*(FloatWeight(x) if isinstance(x, float) else ArrayWeight(x) for x in case.inputs))
    shape = None if isinstance(out, FloatLayer) else tuple(np.shape(predict(out)))
    check_gradients(scalar_loss(op, shape), *case.inputs)


# --------------------------------------------------------------------- 0-d results are 0-d arrays


def test_zero_dim_results_are_arrays() -> None:
    """An ArrayLayer's value (and an ArrayWeight's gradient) is an array, as its type says, also when
    it has no dimensions; ``dot``'s docstring promises "for two vectors, a 0-d array"."""
    v = np.arange(3.0)
    for name, layer in [
        ("dot(v, v)", monadl.dot(v, v + 1.0)),
        ("sum(v, axis=0)", monadl.sum(ArrayWeight(v), axis=0)),
        ("exp(0-d array)", monadl.exp(np.array(0.5))),
    ]:
        value = predict(layer)
        assert isinstance(value, np.ndarray), f"{name} gave a {type(value).__name__}, not a 0-d array"
        assert value.shape == ()
    w = ArrayWeight(np.array(0.5))
    _, grads = monadl.compute_gradients(monadl.sum(monadl.exp(w)))
    assert isinstance(grads[w], np.ndarray), f"a 0-d weight's gradient is a {type(grads[w]).__name__}"


# ------------------------------------------------------------------ the checker catches bad vjps


def _square(vjp_factor: float, transpose_grad: bool = False, own: bool = False) -> Primitive:
    def vjp(xp: Any, d: Any, o: Any, x: Any) -> Any:
        g = d * 2.0 * x * vjp_factor
        return xp.permute_dims(g, (1, 0)) if transpose_grad else g

    return Primitive("square", lambda xp, x: x * x, (vjp,), own=own)


X = np.random.default_rng(2).uniform(0.5, 1.5, (3, 2))
P = probe((3, 2))


def test_checker_passes_a_right_vjp() -> None:
    (g,) = check_gradients(lambda w: monadl.sum(apply_array(_square(1.0), w) * P), X)
    np.testing.assert_allclose(g, 2 * X * P, rtol=1e-12)


def test_checker_fails_on_a_wrong_vjp() -> None:
    wrong = _square(0.5)  # d(x^2) = x: a factor 2 missing
    with pytest.raises(GradientMismatch, match="monadl vs finite differences"):
        check_gradients(lambda w: monadl.sum(apply_array(wrong, w) * P), X)


def test_checker_fails_on_a_vjp_off_by_a_tenth_of_a_percent() -> None:
    slightly_wrong = _square(1.001)
    with pytest.raises(GradientMismatch, match="monadl vs finite differences"):
        check_gradients(lambda w: monadl.sum(apply_array(slightly_wrong, w) * P), X)


def test_checker_fails_on_a_gradient_of_the_wrong_shape() -> None:
    # A user's vjp of the wrong shape is stopped by the engine; one of the library's own (whose
    # results the engine does not check: the tests do, with this checker) by the checker.
    transposed = _square(1.0, transpose_grad=True, own=True)
    with pytest.raises(GradientMismatch, match=r"its gradient is a ndarray of shape \(2, 3\)"):
        check_gradients(lambda w: monadl.sum(apply_array(transposed, w) * P), X)
    users = _square(1.0, transpose_grad=True)
    with pytest.raises(ShapeError, match=r"square: the vjp of input 0 gave an array of shape \(2, 3\)"):
        check_gradients(lambda w: monadl.sum(apply_array(users, w) * P), X)


def test_checker_fails_on_a_vjp_whose_reruns_differ() -> None:
    runs = [0]

    def drifting(xp: Any, d: Any, o: Any, x: Any) -> Any:
        runs[0] += 1
        return d * 2.0 * x * (1.0 + runs[0] * 1e-12)  # within tolerance, but not the same bits

    with pytest.raises(GradientMismatch, match="input 0: its gradient run again differs"):
        check_gradients(
            lambda w: monadl.sum(apply_array(Primitive("sq", lambda xp, x: x * x, (drifting,)), w)), X
        )


def test_checker_fails_on_a_wrong_float_gradient() -> None:
    wrong = Primitive("cube", lambda xp, x: x * x * x, (lambda xp, d, o, x: d * 3.0 * x,))  # not 3x^2
    with pytest.raises(GradientMismatch, match="monadl vs finite differences"):
        check_gradients(lambda w: apply_float(wrong, w), 1.3)


@settings(max_examples=8, deadline=None)
@given(rows=st.integers(2, 4), fan=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_a_few_rows_by_a_large_weight_have_finite_difference_gradients(
    rows: int, fan: bool, seed: int
) -> None:
    """The delta of a few rows by a large weight, ``d @ w.T``, is worked out as ``(w @ d.T).T``
    (faster in OpenBLAS there): a ``linear`` alone, and (``fan``) two of one input by two weights,
    whose deltas are one product by the weights side by side."""
    rng = np.random.default_rng(seed)
    w, v = rng.standard_normal((128, 64)), rng.standard_normal((128, 64))  # 8,192 entries: the large ones
    r = rng.standard_normal((rows, 64))
    x = rng.standard_normal((rows, 128))

    def loss(x: ArrayLayer) -> FloatLayer:
        y = monadl.linear(x, w, 0.5)
        return monadl.sum((y + monadl.linear(x, v, 0.0) if fan else y) * r)

    executor = monadl.Executor()
    (g,) = check_gradients(loss, x, executor=executor)
    np.testing.assert_allclose(g, r @ (w + v).T if fan else r @ w.T, rtol=1e-12, atol=1e-12)
    assert executor.last_stats.kinds["linear"] == 1  # one kernel: alone, or the two fanned out


@settings(max_examples=40, deadline=None)
@given(
    rows=st.integers(0, 300),
    inner=st.sampled_from([1, 8, 64, 200]),
    outputs=st.sampled_from([1, 40, 128]),
    dtype=st.sampled_from([np.float32, np.float64]),
    seed=st.integers(0, 2**32 - 1),
)
def test_products_by_a_transposed_matrix_equal_numpys(
    rows: int, inner: int, outputs: int, dtype: type[np.floating[Any]], seed: int
) -> None:
    """``mm(d, w.T)`` in whichever form it picks: ``d @ w.T`` to rounding, C-ordered, in d's dtype."""
    rng = np.random.default_rng(seed)
    d = rng.standard_normal((rows, inner)).astype(dtype)
    w = rng.standard_normal((outputs, inner)).astype(dtype)
    got = mm(NUMPY_XP, d, w.mT)
    assert got.dtype == dtype and got.shape == (rows, outputs) and got.flags.c_contiguous
    np.testing.assert_allclose(got, d.astype(np.float64) @ w.T.astype(np.float64), rtol=1e-4, atol=1e-4)
