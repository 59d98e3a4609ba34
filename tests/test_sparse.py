"""``SparseRows``: ``take_rows``'s delta is the looked-up rows, not a dense table.

Gradients equal the dense ones and finite differences; sums of sparse and dense deltas are right;
every optimizer's step on a sparse gradient equals its step on the dense gradient; a table looked up
many times in a step costs memory for the rows, not for a dense table per lookup; the array-API
fallback (no scatter) works."""

from __future__ import annotations

from typing import Any

import array_api_strict as xps
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from op_cases import probe
from peak_memory import gradients_with_peak

import monadl as ml
from monadl import ArrayWeight, FloatLayer
from monadl.dsl.learning.optimizers.adagrad import Adagrad
from monadl.dsl.learning.optimizers.adam import Adam
from monadl.dsl.learning.optimizers.base import Optimizer
from monadl.dsl.learning.optimizers.sgd import SGD, Momentum
from monadl.gradcheck import check_gradients
from monadl.typeclasses.sparse import SparseRows, row_sums
from monadl.typeclasses.sparse import add as _add
from monadl.typeclasses.sparse import add_into as _add_into

INDICES = np.array([[2, 0], [2, 4], [0, 2]])  # repeated: rows 0 and 2 are looked up several times


def _table(seed: int = 0, shape: tuple[int, ...] = (5, 3)) -> np.ndarray[Any, np.dtype[np.float64]]:
    return np.random.default_rng(seed).standard_normal(shape)


def _lookup_loss(table: ArrayWeight) -> FloatLayer:
    rows = ml.take_rows(table, INDICES)  # shape (3, 2, 3)
    return ml.sum(ml.tanh(rows) * probe((3, 2, 3)))


def _dense_gradient_of_lookup(table: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """The same gradient, by hand: d/drows of sum(tanh(rows) * p) scattered into a zero table."""
    rows = table[INDICES.reshape(-1)]
    d = ((1.0 - np.tanh(rows) ** 2) * probe((3, 2, 3)).reshape(-1, 3)).reshape(-1, 3)
    out = np.zeros_like(table)
    np.add.at(out, INDICES.reshape(-1), d)
    return out


def test_take_rows_gradient_is_sparse_and_equals_the_dense_one_and_finite_differences() -> None:
    table = _table()
    w = ArrayWeight(table)
    _, gradients = ml.compute_gradients(_lookup_loss(w))
    g = gradients[w]
    assert isinstance(g, SparseRows)
    assert g.shape == table.shape and g.indices.shape == (6,) and g.values.shape == (6, 3)
    np.testing.assert_allclose(g.to_dense(), _dense_gradient_of_lookup(table), rtol=1e-12, atol=1e-14)
    np.testing.assert_array_equal(np.asarray(g), g.to_dense())
    (checked,) = check_gradients(_lookup_loss, table)  # the checker densifies with to_dense
    np.testing.assert_allclose(checked, _dense_gradient_of_lookup(table), rtol=1e-12, atol=1e-14)


def test_a_table_looked_up_several_times_sums_sparse_deltas() -> None:
    def loss(table: ArrayWeight) -> FloatLayer:
        a = ml.sum(ml.take_rows(table, [1, 1, 3]) * probe((3, 3), 1))
        b = ml.sum(ml.tanh(ml.take_rows(table, [3, 0])) * probe((2, 3), 2))
        c = ml.sum(ml.take_rows(table, [4]) * ml.take_rows(table, [1]))
        return a + b + c

    table = _table(1)
    w = ArrayWeight(table)
    _, gradients = ml.compute_gradients(loss(w))
    g = gradients[w]
    assert isinstance(g, SparseRows)  # sparse + sparse stays sparse
    assert sorted(g.indices.tolist()) == [0, 1, 1, 1, 3, 3, 4]
    check_gradients(loss, table)


def test_a_table_used_by_a_lookup_and_densely_gets_a_dense_gradient() -> None:
    def loss(table: ArrayWeight) -> FloatLayer:
        looked_up = ml.sum(ml.take_rows(table, [2, 2, 0]) * probe((3, 3), 3))
        return ml.sum(table * 2.0) + looked_up + ml.sum(ml.take_rows(table, [4]))

    table = _table(2)
    w = ArrayWeight(table)
    _, gradients = ml.compute_gradients(loss(w))
    g = gradients[w]
    assert isinstance(g, np.ndarray) and g.shape == table.shape  # sparse + dense is dense
    expected = np.full(table.shape, 2.0)
    np.add.at(expected, [2, 2, 0], probe((3, 3), 3))
    expected[4] += 1.0
    np.testing.assert_allclose(g, expected, rtol=1e-12, atol=1e-14)
    check_gradients(loss, table)


def test_a_looked_up_layer_passes_a_dense_delta_on() -> None:
    """take_rows of a layer (not a weight): the layer's own vjp gets the delta densified."""

    def loss(table: ArrayWeight) -> FloatLayer:
        embedded = ml.take_rows(table, [3, 1, 3, 0])
        return ml.sum(ml.tanh(ml.take_rows(embedded * 1.5, [0, 0, 2])) * probe((3, 3), 4))

    check_gradients(loss, _table(3))


def test_the_fold_adds_sparse_and_dense_in_every_order() -> None:
    shape = (4, 2)
    s1 = SparseRows(np.array([0, 3, 0]), np.arange(6.0).reshape(3, 2), shape)
    s2 = SparseRows(np.array([3]), np.array([[10.0, 20.0]]), shape)
    d = np.ones(shape)
    dense = s1.to_dense() + s2.to_dense() + d
    orders: list[tuple[Any, Any, Any]] = [(s1, s2, d), (s1, d, s2), (d, s1, s2), (d, s1, d)]
    for order in orders:
        total = _add(order[0], order[1])
        total = _add_into(total, order[2])
        expected = np.zeros(shape)
        for x in order:
            expected = expected + (x.to_dense() if isinstance(x, SparseRows) else x)
        got = total.to_dense() if isinstance(total, SparseRows) else total
        np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal((s1 + s2 + d), dense)
    np.testing.assert_array_equal((d + s1 + s2), dense)
    assert np.array_equal(d, np.ones(shape))  # operands unchanged
    total = d.copy()
    assert _add_into(total, s1) is total  # a dense total takes a sparse delta in place
    np.testing.assert_array_equal(total, d + s1.to_dense())
    assert isinstance(_add_into(s1, s2), SparseRows) and s1.indices.shape == (3,)  # rebound


def _step(optimizer: Optimizer, data: Any, gradient: Any, steps: int = 2) -> tuple[Any, Any]:
    state = optimizer.init(data)
    for _ in range(steps):
        data, state = optimizer.update(data, gradient, state)
    return data, state


@pytest.mark.parametrize(
    "optimizer",
    [
        SGD(0.1),
        SGD(0.1, weight_decay=0.01),
        Adagrad(0.1),
        Adagrad(0.1, weight_decay=0.01),
        Momentum(0.1),
        Adam(0.1),
        Adam(0.1, weight_decay=0.01),
    ],
    ids=repr,
)
def test_an_optimizer_step_on_a_sparse_gradient_equals_the_step_on_the_dense_one(
    optimizer: Optimizer,
) -> None:
    rng = np.random.default_rng(5)
    data = rng.standard_normal((8, 3))
    sparse = SparseRows(np.array([6, 1, 6, 6, 2]), rng.standard_normal((5, 3)), data.shape)
    dense = sparse.to_dense()
    expected_data, expected_state = _step(optimizer, data, dense)
    got_data, got_state = _step(optimizer, data, sparse)
    np.testing.assert_allclose(got_data, expected_data, rtol=1e-12, atol=1e-12)
    for got, expected in zip(
        got_state if isinstance(got_state, tuple) else (got_state,),
        expected_state if isinstance(expected_state, tuple) else (expected_state,),
        strict=True,
    ):
        if expected is None:  # SGD has no state
            assert got is None
        else:
            np.testing.assert_allclose(np.asarray(got), np.asarray(expected), rtol=1e-12, atol=1e-12)
    untouched = [0, 3, 4, 5, 7]
    if isinstance(optimizer, (SGD, Adagrad)) and not optimizer.weight_decay:
        np.testing.assert_array_equal(got_data[untouched], data[untouched])  # rows not touched
        np.testing.assert_array_equal(got_data, expected_data)  # and bit for bit the dense step


def test_training_with_a_sparse_gradient_updates_the_looked_up_rows_only() -> None:
    table = _table(6, (6, 2))
    w = ArrayWeight(table, optimizer=Adagrad(0.5))
    loss = ml.sum(ml.take_rows(w, [4, 1, 4]) * probe((3, 2), 7))
    assert ml.train_blocking(loss).unwrap() == pytest.approx(
        float(np.sum(table[[4, 1, 4]] * probe((3, 2), 7)))
    )
    changed = np.any(w.data != table, axis=1)
    assert changed.tolist() == [False, True, False, False, True, False]


def test_many_lookups_of_a_big_table_do_not_allocate_a_dense_table_each() -> None:
    n, dim, lookups = 20_000, 64, 100
    table = np.random.default_rng(8).standard_normal((n, dim))
    w = ArrayWeight(table)
    one_table = table.nbytes
    loss = ml.sum(ml.take_rows(w, [0]))
    for k in range(1, lookups):
        loss = loss + ml.sum(ml.take_rows(w, [(k * 197) % n, k]))
    gradients, peak = gradients_with_peak(loss)
    g = gradients[w]
    assert isinstance(g, SparseRows) and g.indices.shape == (1 + 2 * (lookups - 1),)
    assert peak < 10 * one_table, f"peak {peak / one_table:.1f} tables"
    dense = g.to_dense()
    assert dense[0].tolist() == [1.0] * dim  # row 0: looked up once (k = 0)
    assert dense[197].tolist() == [1.0] * dim and dense[5].tolist() == [1.0] * dim
    assert dense.sum() == pytest.approx(float(dim * (1 + 2 * (lookups - 1))))


def _strict(x: Any) -> Any:
    return xps.asarray(x)


def test_take_rows_gradient_on_array_api_strict_uses_the_fallback() -> None:
    table = _table(9, (5, 3))
    w = ArrayWeight(_strict(table))
    p = _strict(probe((3, 2, 3), 10))
    loss = ml.sum(ml.take_rows(w, _strict(INDICES)) * p) + ml.sum(ml.take_rows(w, _strict([1])))
    _, gradients = ml.compute_gradients(loss)
    g = gradients[w]
    assert isinstance(g, SparseRows)
    dense = g.to_dense()
    assert isinstance(dense, type(xps.asarray(0.0)))
    expected = np.zeros_like(table)
    np.add.at(expected, INDICES.reshape(-1), probe((3, 2, 3), 10).reshape(-1, 3))
    expected[1] += 1.0
    np.testing.assert_allclose(np.from_dlpack(dense), expected, rtol=1e-12, atol=1e-14)
    # sparse + dense on strict arrays (no add.at): a table used densely too
    both = ml.sum(ml.take_rows(w, _strict([2, 2]))) + ml.sum(w * 2.0)
    _, gradients = ml.compute_gradients(both)
    expected = np.full(table.shape, 2.0)
    expected[2] += 2.0
    np.testing.assert_allclose(np.from_dlpack(gradients[w]), expected, rtol=1e-12, atol=1e-14)
    # and an SGD step on it (the optimizer densifies: the array API has no scatter)
    before = np.from_dlpack(w.data).copy()
    ml.train_blocking(ml.sum(ml.take_rows(w, _strict([3]))), SGD(0.5)).unwrap()
    after = np.from_dlpack(w.data)
    expected = before.copy()
    expected[3] -= 0.5
    np.testing.assert_allclose(after, expected, rtol=1e-12, atol=1e-14)


@settings(max_examples=150, deadline=None)
@given(
    st.integers(1, 40),
    st.integers(0, 200),
    st.sampled_from([np.float32, np.float64]),
    st.integers(0, 2**32 - 1),
)
def test_row_sums_are_the_dense_gradients_rows(table: int, n: int, dtype: Any, seed: int) -> None:
    """With none, one or many rows, repeats, -0.0s and values of every magnitude:
    the summed rows are ``np.add.at``'s into zeros to rounding, and ``to_dense`` holds them bit for
    bit (the optimizers' sparse updates rely on it), zeros elsewhere."""
    rng = np.random.default_rng(seed)
    indices = rng.integers(0, table, n)
    values = (rng.standard_normal((n, 3)) * 10.0 ** rng.integers(-8, 8, (n, 1))).astype(dtype)
    values[rng.random((n, 3)) < 0.1] = -0.0
    sums = row_sums(np, indices, values)
    assert sums is not None
    rows, summed = sums
    expected = np.zeros((table, 3), dtype=dtype)
    np.add.at(expected, indices, values)
    np.testing.assert_array_equal(rows, np.unique(indices))
    assert summed.dtype == dtype and summed.shape == (rows.shape[0], 3)
    magnitude = np.zeros((table, 3))
    np.add.at(magnitude, indices, np.abs(values.astype(np.float64)))
    bound = 2 * n * np.finfo(dtype).eps * magnitude[rows]
    assert np.all(np.abs(summed.astype(np.float64) - expected[rows]) <= bound)
    assert not np.any(np.signbit(summed) & (summed == 0.0))  # a sum into zeros: +0.0
    dense = SparseRows(indices, values, (table, 3)).to_dense()
    assert dense[rows].tobytes() == summed.tobytes()
    assert not np.any(np.delete(dense, rows, axis=0))


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 40),
    st.integers(1, 200),
    st.floats(-4.0, 4.0, allow_subnormal=False),
    st.integers(0, 2**32 - 1),
)
def test_sums_worked_out_once_and_shared_by_scaled_rows_are_row_sums_bit_for_bit(
    table: int, n: int, factor: float, seed: int
) -> None:
    """``summed()`` keeps its result, and rows of the same indices made by ``with_values`` (a
    clipped gradient's) sum in the sort already worked out: both give ``row_sums``' bits, as does
    their ``to_dense``. The arrays are not changed."""
    rng = np.random.default_rng(seed)
    indices = rng.integers(0, table, n)
    values = rng.standard_normal((n, 3)).astype(np.float32)
    gradient = SparseRows(indices, values.copy(), (table, 3))
    first = gradient.summed()
    assert first is not None and gradient.summed() is first
    expected = row_sums(np, indices, values)
    assert expected is not None
    for got, want in zip(first, expected, strict=True):
        assert got.tobytes() == want.tobytes()
    scaled = gradient.with_values(values * np.float32(factor))
    sums, again = scaled.summed(), row_sums(np, indices, values * np.float32(factor))
    assert sums is not None and again is not None
    for got, want in zip(sums, again, strict=True):
        assert got.tobytes() == want.tobytes()
    assert scaled.to_dense()[again[0]].tobytes() == again[1].tobytes()
    assert values.tobytes() == gradient.values.tobytes()
