"""``take_along_axis`` and advanced indexing (``layer[rows, cols]``, ``layer[mask]``) of
``monadl.dsl.ops.selection``.

Their values against NumPy's, their gradients against finite differences (the shared checker,
float64), their calls merged under dynamic batching equal to their calls alone, and their errors.
The array-api-strict runs are the shared cases of ``op_cases.CASES``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from batching_check import assert_merged_like_alone
from op_cases import F64, check_op, probe

import monadl as ml
from monadl import ArrayWeight
from monadl.dsl.ops import selection
from monadl.typeclasses.backend import NUMPY


def _values(shape: tuple[int, ...], seed: int) -> F64:
    return np.random.default_rng([seed, *shape]).uniform(-2.0, 2.0, shape)


def _indices(shape: tuple[int, ...], n: int, seed: int) -> Any:
    return np.random.default_rng([seed, n, *shape]).integers(0, n, shape)


ALONG = [  # x's shape, the indices' shape, the axis
    ((3, 5), (3, 4), 1),
    ((3, 5), (3, 1), -1),
    ((4, 3), (6, 3), 0),
    ((2, 3, 4), (2, 5, 4), 1),
    ((3, 1, 5), (3, 4, 2), 2),  # x broadcast along axis 1, the indices along axis 0
    ((2, 3, 4), (1, 3, 6), -1),
]


@pytest.mark.parametrize(("x_shape", "i_shape", "axis"), ALONG)
def test_take_along_axis_values_and_gradients(
    x_shape: tuple[int, ...], i_shape: tuple[int, ...], axis: int
) -> None:
    x, indices = _values(x_shape, 1), _indices(i_shape, x_shape[axis], 2)
    rank = len(x_shape)
    lanes = np.broadcast_shapes(
        tuple(1 if a == axis % rank else n for a, n in enumerate(x_shape)),
        tuple(1 if a == axis % rank else n for a, n in enumerate(i_shape)),
    )
    whole = tuple(x_shape[a] if a == axis % rank else n for a, n in enumerate(lanes))
    expected = np.take_along_axis(np.broadcast_to(x, whole), indices, axis)
    check_op(lambda w: ml.take_along_axis(w, indices, axis), [x], expected)


def test_take_along_axis_adds_the_deltas_of_repeated_indices() -> None:
    w = ArrayWeight(np.zeros((2, 3)))
    _, grads = ml.compute_gradients(ml.sum(ml.take_along_axis(w, [[2, 2, 0, 2], [1, 1, 1, 1]], axis=1)))
    np.testing.assert_array_equal(grads[w], [[1.0, 0.0, 3.0], [0.0, 4.0, 0.0]])


def test_scatter_without_put_or_bincount_is_the_one_hot_product() -> None:
    # The array-API path (no scatter in the standard) against NumPy's bincount, repeats included.
    import array_api_strict as xp

    shape, axis = (3, 6, 2), 1
    indices = _indices((3, 9, 2), 6, 3)
    d = _values((3, 9, 2), 4)
    fast = selection._scatter_along(NUMPY, shape, indices, d, axis)
    strict = selection._scatter_along(xp, shape, xp.asarray(indices), xp.asarray(d), axis)
    np.testing.assert_allclose(np.asarray(strict), fast, rtol=1e-12, atol=1e-12)
    reference = np.zeros(shape)
    grids = list(np.ogrid[tuple(slice(0, n) for n in d.shape)])
    grids[axis] = indices
    np.add.at(reference, tuple(grids), d)
    np.testing.assert_allclose(fast, reference, rtol=1e-12, atol=1e-12)


KEYS: list[Any] = [
    ([0, 2, 2, -1], [1, 1, 4, 0]),
    (slice(None), [0, 2, 2], np.array([[1], [-2]])),
    (np.array([1, 3]),),
    (slice(None), [1, -2], Ellipsis),
    (np.array([[0, 1], [3, 3]]), 2, [0, 2]),
    (_values((4, 5), 9) > 0.0,),
    (slice(None), _values((5, 3), 8) > 0.0),
]


@pytest.mark.parametrize("key", KEYS, ids=range(len(KEYS)))
def test_advanced_indexing_values_and_gradients(key: tuple[Any, ...]) -> None:
    x = _values((4, 5, 3), 5)
    check_op(lambda w: w[key], [x], x[key])


def test_a_mask_alone_and_repeated_rows() -> None:
    x = _values((3, 4), 6)
    mask = x > 0.0
    check_op(lambda w: w[mask], [x], x[mask])
    w = ArrayWeight(np.zeros((2, 2)))
    _, grads = ml.compute_gradients(ml.sum(w[[0, 0, 1, 0], [1, 1, 0, 1]]))
    np.testing.assert_array_equal(grads[w], [[0.0, 3.0], [1.0, 0.0]])


@pytest.mark.parametrize("shared", [True, False])
def test_take_along_axis_merged_calls_equal_calls_alone(shared: bool) -> None:
    w = ArrayWeight(_values((4, 6), 7))
    calls = 5
    terms = []
    for i in range(calls):
        x = w if shared else w * (1.0 + i)  # one weight for all the calls, or stacked rows
        picked = ml.take_along_axis(x, _indices((4, 3), 6, i), axis=1)
        terms.append(ml.sum(picked * probe((4, 3), i)))
    assert_merged_like_alone(ml.add_n(terms), w, "take_along_axis", calls)


@pytest.mark.parametrize("shared", [True, False])
@pytest.mark.parametrize(
    ("x_shape", "i_shape", "axis"),
    [((6, 4), (2, 4), 0), ((2, 7, 3), (2, 5, 3), 1), ((7, 2, 3), (4, 2, 1), 0), ((3, 6, 2), (3, 2, 2), -2)],
)
def test_take_along_axis_merged_calls_of_any_axis_take_every_valid_index(
    shared: bool, x_shape: tuple[int, ...], i_shape: tuple[int, ...], axis: int
) -> None:
    """Merged calls along an axis counted from the start, longer than the last axis, with indices
    up to its end: they merge, and equal the calls alone (not a ShapeError)."""
    w = ArrayWeight(_values(x_shape, 11))
    calls = 3
    terms = []
    for i in range(calls):
        x = w if shared else w * (1.0 + i)
        indices = _indices(i_shape, x_shape[axis], 20 + i)
        indices.reshape(-1)[0] = x_shape[axis] - 1  # the axis' last index, past the last axis' length
        out_shape = np.broadcast_shapes(
            tuple(1 if a == axis % len(x_shape) else n for a, n in enumerate(x_shape)), i_shape
        )
        out_shape = tuple(i_shape[a] if a == axis % len(x_shape) else n for a, n in enumerate(out_shape))
        terms.append(ml.sum(ml.take_along_axis(x, indices, axis) * probe(out_shape, i)))
    assert_merged_like_alone(ml.add_n(terms), w, "take_along_axis", calls)


@pytest.mark.parametrize("shared", [True, False])
def test_take_along_axis_merged_calls_name_an_index_out_of_range_on_their_axis(shared: bool) -> None:
    """An index past axis 0 of x (4, 6), within the last axis' length, in one of merged calls: a
    ShapeError naming axis 0 (each call's own check reads the call's axis), not NumPy's IndexError."""
    w = ArrayWeight(_values((4, 6), 12))
    terms = []
    for i in range(3):
        indices = np.zeros((2, 6), dtype=np.int64)
        indices[0, 0] = 5 if i == 1 else 3
        terms.append(ml.sum(ml.take_along_axis(w if shared else w * (1.0 + i), indices, axis=0)))
    with pytest.raises(ml.ShapeError, match=r"^take_along_axis: index 5 is out of range for axis 0 of x"):
        ml.compute_gradients(ml.add_n(terms), executor=ml.Executor(batching=True))


@pytest.mark.parametrize("before", [0, 1])
def test_advanced_indexing_merged_calls_equal_calls_alone(before: int) -> None:
    w = ArrayWeight(_values((4, 5, 3), 8))
    calls = 4
    terms = []
    for i in range(calls):
        rows, cols = _indices((2, 3), 4 + before, i), _indices((2, 3), 5 - before * 2, i + 10)
        picked = w[rows, cols] if before == 0 else w[:, rows, cols]
        shape = (2, 3, 3) if before == 0 else (4, 2, 3)
        terms.append(ml.sum(picked * probe(shape, i)))
    assert_merged_like_alone(ml.add_n(terms), w, "getitem_arrays", calls)


def test_mask_indexing_merged_calls_equal_calls_alone() -> None:
    """Boolean masks of one count of True entries (each call its own positions) merge."""
    w = ArrayWeight(_values((4, 5, 3), 9))
    rng = np.random.default_rng(12)
    calls = 4
    terms = []
    for i in range(calls):
        mask = np.zeros((4, 5), dtype=bool)
        mask.reshape(-1)[rng.choice(20, 6, replace=False)] = True
        terms.append(ml.sum(w[mask] * probe((6, 3), i)))
    assert_merged_like_alone(ml.add_n(terms), w, "getitem_arrays", calls)


def test_errors_name_the_op() -> None:
    w = ArrayWeight(np.ones((3, 4)))
    with pytest.raises(TypeError, match=r"^take_along_axis: expected integer indices, got dtype float64"):
        ml.take_along_axis(w, np.ones((3, 1)), axis=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"^take_along_axis: axis must be an int"):
        ml.take_along_axis(w, [[0]], axis=1.0)  # type: ignore[arg-type]
    failures = {
        "take_along_axis: index 4 is out of range for axis 1 of x of shape (3, 4)": ml.take_along_axis(
            w, [[4]], axis=1
        ),
        "take_along_axis: indices of shape (3,) must have the rank of x": ml.take_along_axis(w, [0, 1, 2]),
        "take_along_axis: indices of shape (2, 1) do not broadcast": ml.take_along_axis(w, [[0], [1]]),
        "getitem: index 3 is out of range for axis 0 of shape (3, 4)": w[[0, 3], [1, 1]],
        "getitem: index -5 is out of range for axis 1 of shape (3, 4)": w[[0], [-5]],
        "getitem: 3 indices are too many for an array of shape (3, 4)": w[[0], [0], [0]],
    }
    for message, layer in failures.items():
        failure = layer.predict_blocking().failure()
        assert str(failure).startswith(message), failure
    with pytest.raises(TypeError, match=r"^getitem: an index of integer arrays takes .* got slice\(0, 2"):
        w[0:2, [1, 2]]
    with pytest.raises(
        TypeError, match=r"^getitem: expected integer or boolean index arrays, got dtype float64"
    ):
        w[np.ones(2), [1, 2]]
