"""Slicing and splitting: ``layer[...]`` (NumPy's basic indexing), ``split`` and ``stack``.

Their values against NumPy's, their gradients against finite differences (the shared checker),
on NumPy and on array-api-strict; their calls merged (batching on, several calls of one op in a
graph, and in a ``@batchable`` LSTM cell that cuts one fused gate matrix into its gates) equal to
their calls alone; their errors name them; and an LSTM of one fused gate weight trains.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from typing import Any

import array_api_strict as xps
import numpy as np
import pytest
from batching_check import Gradients, gradients_of
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from op_cases import F64, NUMPY, Backend, OpCase, check_op, predict, probe, run_case
from returns.pipeline import is_successful

import monadl as ml
from monadl import ArrayLayer, ArrayWeight, FloatLayer, FloatWeight, ShapeError
from monadl.gradcheck import check_gradients
from monadl.typeclasses.sparse import SparseRows

SETTINGS = settings(max_examples=100, deadline=None)
GRADIENT_SETTINGS = settings(max_examples=40, deadline=None)
TOL = 1e-12

SHAPES = hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4)
SMALL_SHAPES = hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=3)


def values(shape: tuple[int, ...], seed: int = 0) -> F64:
    return np.random.default_rng([seed, *shape]).uniform(-2.0, 2.0, shape)


@st.composite
def basic_keys(draw: st.DrawFn, shape: tuple[int, ...]) -> Any:
    """A key of basic indexing that fits ``shape``: per axis (of some leading ones, and after a
    ``...``, of some trailing ones) an int in range or a slice of any bounds (past the ends
    included) and step, new axes (None) anywhere; as a tuple, or a lone slice or ``...`` (None
    alone is no index: rows)."""

    def entry(n: int) -> Any:
        bound = st.one_of(st.none(), st.integers(-n - 2, n + 2))
        one = st.builds(slice, bound, bound, st.sampled_from([None, 1, 2, 3, -1, -2]))
        return draw(st.one_of(one, st.integers(-n, n - 1)) if n else one)

    ndim = len(shape)
    front = draw(st.integers(0, ndim))
    ellipsis = draw(st.booleans())
    back = draw(st.integers(0, ndim - front)) if ellipsis else 0
    entries = [entry(n) for n in shape[:front]]
    if ellipsis:
        entries += [Ellipsis, *[entry(n) for n in shape[ndim - back :]]]
    for _ in range(draw(st.integers(0, 2))):
        entries.insert(draw(st.integers(0, len(entries))), None)
    key = tuple(entries)
    if len(key) == 1 and type(key[0]) in (slice, type(Ellipsis)) and draw(st.booleans()):
        return key[0]  # alone, not in a tuple
    return key


def layer_of(kind: str, x: F64) -> ArrayWeight | ArrayLayer:
    w = ArrayWeight(x)
    return w if kind == "weight" else w * 1.0


KINDS = st.sampled_from(["weight", "layer"])

# ------------------------------------------------------------------------------------ getitem


@SETTINGS
@given(data=st.data(), shape=SHAPES, kind=KINDS)
def test_getitem_values_match_numpy(data: st.DataObject, shape: tuple[int, ...], kind: str) -> None:
    key = data.draw(basic_keys(shape))
    x = values(shape)
    value = predict(layer_of(kind, x)[key])
    expected = x[key]
    assert isinstance(value, np.ndarray) and value.shape == np.shape(expected), (value, expected)
    np.testing.assert_array_equal(value, expected)


@GRADIENT_SETTINGS
@given(data=st.data(), shape=SMALL_SHAPES)
def test_getitem_gradients(data: st.DataObject, shape: tuple[int, ...]) -> None:
    key = data.draw(basic_keys(shape))
    x = values(shape, 1)
    check_op(lambda w: w[key], [x], x[key])


@pytest.mark.parametrize(
    "key",
    [
        (slice(None), slice(1, 3)),  # x[:, 1:3]
        slice(1, 3),  # x[1:3]
        (Ellipsis, 3),  # x[..., 3]
        (Ellipsis, slice(-2, None)),  # x[..., -2:]
        (slice(None, None, -1), slice(None), slice(None, None, 2)),  # x[::-1, :, ::2]
        (1, None, slice(3, 0, -2)),  # x[1, None, 3:0:-2]
        (None, Ellipsis, None),
        (0, 1, 2),  # one element: a 0-d array
        (-1,),
        (slice(5, 9),),  # past the end: empty
    ],
    ids=str,
)
def test_getitem_examples(key: Any) -> None:
    x = values((2, 3, 4), 2)
    check_op(lambda w: w[key], [x], x[key])


def test_a_negative_int_is_a_row_from_the_end() -> None:
    x = values((3, 4), 3)
    check_op(lambda w: w[-1], [x], x[-1])
    check_op(lambda w: w[np.int64(-3)], [x], x[-3])


@pytest.mark.parametrize(
    "rows",
    [1, np.int64(2), [1, 1, 0], (np.array([[0, 2], [2, 2]]))],
    ids=["int", "np.int64", "list", "array"],
)
def test_rows_are_still_taken_by_take_rows(rows: Any) -> None:
    # An int of 0 or more, a list or an integer array takes rows (an embedding lookup), as before:
    # its delta is sparse rows, one kernel ``take_rows``.
    x = values((3, 4), 4)
    w = ArrayWeight(x)
    executor = ml.Executor()
    _, gradients = ml.compute_gradients(ml.sum(w[rows] * probe(np.shape(x[rows]))), executor=executor)
    assert isinstance(gradients[w], SparseRows)
    assert executor.stats.kinds.get("take_rows") == 1 and "getitem" not in executor.stats.kinds
    check_op(lambda w: w[rows], [x], x[rows])


# Basic indexing on array-api-strict: the array API specifies no slice bounds past an axis' ends,
# and multi-axis indices must index every axis or end in ``...``.
STRICT_ARRAY = type(xps.asarray(0.0))


def _strict_to_numpy(x: Any) -> F64:
    assert isinstance(x, STRICT_ARRAY), f"expected an array_api_strict array, got {type(x).__name__}"
    return np.asarray(np.from_dlpack(x))


STRICT = Backend("array_api_strict", xps.asarray, _strict_to_numpy)
X = values((2, 3, 4), 5)
STRICT_CASES = [
    OpCase("x[:, 1:3]", lambda c, a: a[:, 1:3], (X,)),
    OpCase("x[-5:9, ::-2]", lambda c, a: a[-5:9, ::-2], (X,)),
    OpCase("x[..., 3]", lambda c, a: a[..., 3], (X,)),
    OpCase("x[1, None, 3:0:-2]", lambda c, a: a[1, None, 3:0:-2], (X,)),
    OpCase("x[5:9]", lambda c, a: a[5:9], (X,)),
    OpCase("x[-1]", lambda c, a: a[-1], (X,)),
    OpCase("split 4 axis -1", lambda c, a: ml.concatenate(ml.split(a, 4, axis=-1)[::-1], axis=-1), (X,)),
    OpCase("split indices axis 1", lambda c, a: ml.split(a, [-2, 9], axis=1)[0] * 2.0, (X,)),
    OpCase("stack axis -1", lambda c, a, b: ml.stack([a, b * 3.0], axis=-1), (X, values((2, 3, 4), 6))),
]


@pytest.mark.parametrize("case", STRICT_CASES, ids=str)
def test_array_api_strict_matches_numpy(case: OpCase) -> None:
    expected_forward, expected_loss, expected_grads = run_case(case, NUMPY)
    forward, loss, grads = run_case(case, STRICT)
    np.testing.assert_allclose(forward, expected_forward, rtol=TOL, atol=TOL)
    assert np.shape(forward) == np.shape(expected_forward)
    assert loss == pytest.approx(expected_loss, rel=TOL, abs=TOL)
    for g, expected in zip(grads, expected_grads, strict=True):
        np.testing.assert_allclose(g, expected, rtol=TOL, atol=TOL)


# -------------------------------------------------------------------------------- split, stack


@st.composite
def split_cases(draw: st.DrawFn, shapes: st.SearchStrategy[tuple[int, ...]]) -> tuple[Any, ...]:
    """A shape, an axis in range and sections that divide it or indices (any order, past the ends)."""
    shape = draw(shapes.filter(lambda s: len(s) > 0))
    axis = draw(st.integers(-len(shape), len(shape) - 1))
    n = shape[axis]
    divisors = [k for k in range(1, n + 1) if n % k == 0] or [1, 2, 3]
    sections = draw(st.one_of(st.sampled_from(divisors), st.lists(st.integers(-n - 1, n + 1), max_size=3)))
    return shape, sections, axis


@SETTINGS
@given(case=split_cases(SHAPES), kind=KINDS)
def test_split_values_match_numpy(case: tuple[Any, ...], kind: str) -> None:
    shape, sections, axis = case
    x = values(shape, 7)
    pieces = ml.split(layer_of(kind, x), sections, axis=axis)
    expected = np.split(x, sections, axis=axis)
    assert len(pieces) == len(expected)
    for piece, e in zip(pieces, expected, strict=True):
        value = predict(piece)
        assert value.shape == e.shape
        np.testing.assert_array_equal(value, e)


def _weighted_sum(layers: Sequence[ArrayLayer], shapes: Sequence[tuple[int, ...]]) -> FloatLayer:
    """``sum(layer_j * probe_j)`` over the layers: every element of every one weighed differently."""
    return ml.add_n([ml.sum(p * probe(s, j)) for j, (p, s) in enumerate(zip(layers, shapes, strict=True))])


@GRADIENT_SETTINGS
@given(case=split_cases(SMALL_SHAPES))
def test_split_gradients(case: tuple[Any, ...]) -> None:
    shape, sections, axis = case
    x = values(shape, 8)
    shapes = [p.shape for p in np.split(x, sections, axis=axis)]
    check_gradients(lambda w: _weighted_sum(ml.split(w, sections, axis=axis), shapes), x)


def test_split_of_an_integer_array_of_indices_and_of_a_constant() -> None:
    x = values((3, 5), 9)
    got = [predict(p) for p in ml.split(x, np.array([1, 3]), axis=-1)]
    for g, e in zip(got, np.split(x, [1, 3], axis=-1), strict=True):
        np.testing.assert_array_equal(g, e)


@SETTINGS
@given(shape=SHAPES, count=st.integers(1, 3), data=st.data(), kind=KINDS)
def test_stack_values_match_numpy(shape: tuple[int, ...], count: int, data: st.DataObject, kind: str) -> None:
    axis = data.draw(st.integers(-len(shape) - 1, len(shape)))
    xs = [values(shape, 10 + k) for k in range(count)]
    value = predict(ml.stack([layer_of(kind, x) for x in xs], axis=axis))
    expected = np.stack(xs, axis=axis)
    assert value.shape == expected.shape
    np.testing.assert_array_equal(value, expected)


@GRADIENT_SETTINGS
@given(shape=SMALL_SHAPES, count=st.integers(1, 3), data=st.data())
def test_stack_gradients(shape: tuple[int, ...], count: int, data: st.DataObject) -> None:
    axis = data.draw(st.integers(-len(shape) - 1, len(shape)))
    xs = [values(shape, 20 + k) for k in range(count)]
    check_op(lambda *ws: ml.stack(list(ws), axis=axis), xs, np.stack(xs, axis=axis))


def test_split_then_stack_is_a_transposition() -> None:
    x = values((2, 6), 11)
    check_op(lambda w: ml.stack(ml.split(w, 3, axis=1), axis=0), [x], np.stack(np.split(x, 3, axis=1)))


# ------------------------------------------------------------------------------ merged calls


def assert_equal_merged_and_alone(loss: FloatLayer, weights: Sequence[ArrayWeight]) -> Gradients:
    """The loss and its gradients, with batching on and off, equal to 1e-12; the run merged."""
    batched = gradients_of(loss, True)
    alone = gradients_of(loss, False)
    assert batched.value == pytest.approx(alone.value, rel=TOL, abs=TOL)
    assert set(batched.gradients) == set(alone.gradients)
    for i, w in enumerate(weights):
        np.testing.assert_allclose(
            batched.gradients[w], alone.gradients[w], rtol=TOL, atol=TOL, err_msg=f"weight {i}"
        )
    assert batched.stats.groups > 0 and batched.stats.kernels < alone.stats.kernels
    return batched


# (name, the op on one input of shape (3, 8), the number of ops it makes)
MERGING: list[tuple[str, Callable[[ArrayLayer], Sequence[ArrayLayer]], int]] = [
    ("x[:, 2:6]", lambda x: [x[:, 2:6]], 1),
    ("x[1:, ::-3]", lambda x: [x[1:, ::-3]], 1),
    ("x[..., -1]", lambda x: [x[..., -1]], 1),
    ("x[1]", lambda x: [x[-2]], 1),
    ("x[None, 2, 1:7:2]", lambda x: [x[None, 2, 1:7:2]], 1),
    ("x[1, 3]", lambda x: [x[1, 3]], 1),
    ("split 4 axis 1", lambda x: ml.split(x, 4, axis=1), 4),
    ("split 4 axis -1", lambda x: ml.split(x, 4, axis=-1), 4),
    ("split 3 axis 0", lambda x: ml.split(x, 3), 3),
    ("split [1, 5] axis 1", lambda x: ml.split(x, [1, 5], axis=1), 3),
    ("stack axis 0", lambda x: [ml.stack([x, x * 2.0])], 1),
    ("stack axis 1", lambda x: [ml.stack([x, ml.tanh(x)], axis=1)], 1),
    ("stack axis 2", lambda x: [ml.stack([x, x * 2.0, x], axis=2)], 1),
    ("stack axis -3", lambda x: [ml.stack([x, x * 2.0], axis=-3)], 1),
]


@pytest.mark.parametrize(("name", "op", "ops"), MERGING, ids=[m[0] for m in MERGING])
def test_calls_of_one_op_merge_and_equal_their_calls_alone(
    name: str, op: Callable[[ArrayLayer], Sequence[ArrayLayer]], ops: int
) -> None:
    # Five calls of the op, ready together, on inputs of one shape: merged, their rows are stacked
    # on a leading axis, past which the index, the split's axis or the new axis must count.
    weights = [ArrayWeight(values((3, 8), 30 + k)) for k in range(5)]
    terms = []
    for k, w in enumerate(weights):
        outs = op(ml.tanh(w))
        expected = [predict(o) for o in outs]
        terms.append(_weighted_sum(outs, [np.shape(e) for e in expected]) * float(k + 1))
    batched = assert_equal_merged_and_alone(ml.add_n(terms), weights)
    kind = "getitem" if name.startswith("x[") else name.split()[0]
    assert batched.stats.kinds[kind] == ops, batched.stats.kinds  # one launch per op, not per call


def test_merged_calls_match_numpy() -> None:
    xs = [values((3, 8), 40 + k) for k in range(4)]
    layers = [ArrayWeight(x) * 1.0 for x in xs]
    executor = ml.Executor(batching=True)
    outs = [ml.concatenate([*ml.split(y[:, 1:], [2, 5], axis=-1)[::-1], y[:, :1]], axis=-1) for y in layers]
    got = ml.stack(outs, axis=-1).predict_blocking(executor=executor).unwrap()
    expected = np.stack(
        [np.concatenate([*np.split(x[:, 1:], [2, 5], axis=-1)[::-1], x[:, :1]], axis=-1) for x in xs], axis=-1
    )
    np.testing.assert_array_equal(got, expected)
    assert executor.stats.groups > 0


# ----------------------------------------------------------------- an LSTM of one gate weight


def _lstm_step(
    x: ArrayLayer | F64, h: ArrayLayer | F64, c: ArrayLayer | F64, w: ArrayWeight, b: ArrayWeight
) -> tuple[ArrayLayer, ArrayLayer]:
    """One LSTM step, its four gates cut from one fused gate matrix ``w`` by ``split``."""
    z = ml.linear(ml.concatenate([x, h], axis=-1), w, b)
    i, f, o, u = ml.split(z, 4, axis=-1)
    c_next = ml.sigmoid(i) * ml.tanh(u) + ml.sigmoid(f) * c
    return ml.sigmoid(o) * ml.tanh(c_next), c_next


def _lstm_step_sliced(
    x: ArrayLayer | F64, h: ArrayLayer | F64, c: ArrayLayer | F64, w: ArrayWeight, b: ArrayWeight
) -> tuple[ArrayLayer, ArrayLayer]:
    """The same step, its gates cut by slices of the last axis."""
    z = ml.linear(ml.concatenate([x, h], axis=-1), w, b)
    n = HIDDEN
    i, f, o, u = z[..., :n], z[..., n : 2 * n], z[..., 2 * n : 3 * n], z[..., 3 * n :]
    c_next = ml.sigmoid(i) * ml.tanh(u) + ml.sigmoid(f) * c
    return ml.sigmoid(o) * ml.tanh(c_next), c_next


lstm_cell = ml.batchable(_lstm_step)
lstm_cell_sliced = ml.batchable(_lstm_step_sliced)
CELLS = {"split": lstm_cell, "slices": lstm_cell_sliced}
INPUT, HIDDEN = 3, 4


class Lstm:
    """An LSTM over sequences of vectors, one fused gate weight ``(input + hidden, 4 * hidden)``, and
    a linear read-out of its last state to two classes."""

    def __init__(self, cell: Callable[..., tuple[ArrayLayer, ArrayLayer]], seed: int) -> None:
        self.cell = cell
        self.w = ArrayWeight.normal((INPUT + HIDDEN, 4 * HIDDEN), std=0.5, seed=seed, dtype=np.float64)
        self.b = ArrayWeight.zeros((4 * HIDDEN,), dtype=np.float64)
        self.v = ArrayWeight.normal((HIDDEN, 2), std=0.5, seed=seed + 1, dtype=np.float64)

    @property
    def weights(self) -> list[ArrayWeight]:
        return [self.w, self.b, self.v]

    def last_state(self, sequence: Sequence[F64]) -> ArrayLayer:
        h: ArrayLayer | F64 = np.zeros(HIDDEN)
        c: ArrayLayer | F64 = np.zeros(HIDDEN)
        for x in sequence:
            h, c = self.cell(x, h, c, self.w, self.b)
        assert isinstance(h, ArrayLayer)
        return h

    def loss(self, sequences: Sequence[Sequence[F64]], labels: Sequence[int]) -> FloatLayer:
        logits = ml.stack([self.last_state(s) for s in sequences]) @ self.v
        return ml.cross_entropy(logits, np.array(labels, dtype=np.int64))


def _sequences(count: int, seed: int) -> tuple[list[list[F64]], list[int]]:
    """Sequences of 1 to 5 steps; label 1 where the sum of their first inputs is positive."""
    rng = np.random.default_rng(seed)
    sequences = [list(rng.normal(size=(int(rng.integers(1, 6)), INPUT))) for _ in range(count)]
    return sequences, [int(sum(float(x[0]) for x in s) > 0) for s in sequences]


@pytest.fixture(scope="module", autouse=True)
def learn_cells() -> None:
    """A batchable operation's first call ever runs its body directly: each cell called once."""
    for cell in CELLS.values():
        Lstm(cell, 0).last_state([np.zeros(INPUT)])


@pytest.mark.parametrize("gates", sorted(CELLS))
def test_an_lstm_cell_of_one_fused_gate_weight_merges(gates: str) -> None:
    model = Lstm(CELLS[gates], seed=3)
    sequences, labels = _sequences(6, seed=4)
    batched = assert_equal_merged_and_alone(model.loss(sequences, labels), model.weights)
    cell = f"_lstm_step{'' if gates == 'split' else '_sliced'}"
    # the sequences' steps of one time merge: one launch per time step, not per sequence and step
    assert batched.stats.kinds[cell] == max(len(s) for s in sequences), batched.stats.kinds


@pytest.mark.parametrize("gates", sorted(CELLS))
def test_an_lstm_cell_of_one_fused_gate_weight_has_the_gradients_of_finite_differences(gates: str) -> None:
    sequences, labels = _sequences(3, seed=5)

    def loss(w: ArrayWeight, b: ArrayWeight, v: ArrayWeight) -> FloatLayer:
        model = Lstm(CELLS[gates], seed=0)
        model.w, model.b, model.v = w, b, v
        return model.loss(sequences, labels)

    start = Lstm(CELLS[gates], seed=6)
    check_gradients(loss, *[np.asarray(w.data, dtype=np.float64) for w in start.weights])


def test_an_lstm_of_one_fused_gate_weight_trains() -> None:
    model = Lstm(lstm_cell, seed=7)
    sequences, labels = _sequences(16, seed=8)
    optimizer = ml.Adam(0.05)
    losses = [model.loss(sequences, labels).train_blocking(optimizer).unwrap() for _ in range(40)]
    assert all(math.isfinite(v) for v in losses)
    assert losses[-1] < 0.5 * losses[0], losses


# ----------------------------------------------------------------------------------- errors


def failure_of(layer: FloatLayer | ArrayLayer, batching: bool = False) -> Exception:
    """The error ``layer``'s forward fails with (on an executor with or without batching)."""
    result = layer.predict_blocking(executor=ml.Executor(batching=batching))
    assert not is_successful(result), f"expected a failure, got {result}"
    error: Exception = result.failure()
    return error


W = ArrayWeight(values((3, 4), 50))


class _Witness:
    """A user's own differentiable value (a ``DeepLearning``): its data's kind shows when it runs."""

    def __init__(self, weight: FloatWeight) -> None:
        self.forward = weight.forward


UNTYPED: Any = ml  # the ops, called with what mypy would reject
UNTYPED_W: Any = W


def _witness() -> Any:
    return _Witness(FloatWeight(0.5))


@pytest.mark.parametrize(
    ("build", "error", "message"),
    [
        (lambda: UNTYPED.split(W, 0), ValueError, "split: the number of sections must be positive, got 0"),
        (lambda: UNTYPED.split(W, -2), ValueError, "split: the number of sections must be positive, got -2"),
        (
            lambda: UNTYPED.split(W, 2.0),
            TypeError,
            "split: sections_or_indices must be an int or a sequence of ints, got float 2.0",
        ),
        (
            lambda: UNTYPED.split(W, True),
            TypeError,
            "split: sections_or_indices must be an int or a sequence",
        ),
        (lambda: UNTYPED.split(W, [1.0]), TypeError, "split: sections_or_indices must be a sequence of ints"),
        (lambda: UNTYPED.split(W, 2, axis=1.0), TypeError, "split: axis must be an int, got float 1.0"),
        (lambda: UNTYPED.split(2.0, 2), TypeError, "split: expected an array layer, array weight or"),
        (lambda: UNTYPED.split(FloatWeight(1.0), 2), TypeError, "split: expected an array layer"),
        (lambda: UNTYPED.stack([]), ValueError, "stack: needs at least one array"),
        (lambda: UNTYPED.stack(W), TypeError, "stack: expected a list or a tuple of operands"),
        (lambda: UNTYPED.stack([W, 1.0]), TypeError, "stack: expected an array layer, array weight or"),
        (lambda: UNTYPED.stack([W], axis="0"), TypeError, "stack: axis must be an int, got str '0'"),
        (
            lambda: UNTYPED_W[1:2.5],
            TypeError,
            "getitem: slice bounds must be ints or None, got slice(1, 2.5, None)",
        ),
        (lambda: UNTYPED_W[::0], ValueError, "getitem: slice step cannot be zero"),
        (lambda: UNTYPED_W[..., 0, ...], ValueError, "getitem: an index can have only one ellipsis (...)"),
        (
            lambda: UNTYPED_W[:, {0, 1}],
            TypeError,
            "getitem: expected ints, slices, None or ... in an index, got set",
        ),
        (
            lambda: UNTYPED_W[0, 1.0],
            TypeError,
            "getitem: expected ints, slices, None or ... in an index, got float",
        ),
        (
            lambda: UNTYPED_W[True, 0],
            TypeError,
            "getitem: expected ints, slices, None or ... in an index, got bool",
        ),
        (lambda: UNTYPED_W[0.5], TypeError, "take_rows: expected integer indices, got float"),  # as before
    ],
)
def test_bad_parameters_are_errors_naming_the_op_when_it_is_made(
    build: Callable[[], Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=re.escape(message)):
        build()


@pytest.mark.parametrize("batching", [False, True])
@pytest.mark.parametrize(
    ("build", "message"),
    [
        (
            lambda: ml.split(ArrayWeight(np.ones((2, 8))), 3, axis=1)[0],
            "split: 3 sections do not divide axis 1 of length 8",
        ),
        (lambda: ml.split(W, 2, axis=2)[0], "split: axis 2 is out of range for shape (3, 4)"),
        (lambda: ml.split(W, [1], axis=-3)[0], "split: axis -3 is out of range for shape (3, 4)"),
        (
            lambda: ml.stack([W, ArrayWeight(np.ones((4, 3)))]),
            "stack: arrays of shapes [(3, 4), (4, 3)] differ (stacked arrays need one shape)",
        ),
        (
            lambda: ml.stack([W, W], axis=3),
            "stack: axis 3 is out of range for stacking arrays of shape (3, 4)",
        ),
        (
            lambda: ml.stack([W], axis=-4),
            "stack: axis -4 is out of range for stacking arrays of shape (3, 4)",
        ),
        (lambda: W[-4], "getitem: index -4 is out of range for axis 0 of shape (3, 4)"),
        (lambda: W[:, 4], "getitem: index 4 is out of range for axis 1 of shape (3, 4)"),
        (lambda: W[..., -5], "getitem: index -5 is out of range for axis 1 of shape (3, 4)"),
        (lambda: W[0, None, 0, 0], "getitem: 3 indices are too many for an array of shape (3, 4)"),
        (lambda: W[3], "take_rows: row index 3 is out of range for a table of shape (3, 4)"),  # as before
        # a user's own differentiable value, found to be a float when it runs
        (lambda: ml.lift_array(_witness())[1:], "getitem: expected an array, got a float"),
        (lambda: ml.split(_witness(), 1)[0], "split: expected an array, got a float"),
        (lambda: ml.stack([_witness()]), "stack: expected an array, got a float"),
    ],
)
def test_shapes_that_do_not_fit_are_shape_errors_naming_the_op(
    build: Callable[[], ArrayLayer], message: str, batching: bool
) -> None:
    error = failure_of(build() + build(), batching)  # two calls: merged, when batching
    assert isinstance(error, ShapeError) and str(error) == message
