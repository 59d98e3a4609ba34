"""Momentum and Adam on a sparse (``SparseRows``) gradient: densified by default, lazy on request.

By default they decay their moments on every row, so the step is bit for bit the dense gradient's
(a sparse gradient is densified first, but for Adam on a large NumPy table, which skips the zero
rows' products a chunk at a time). ``lazy=True`` updates the touched rows only: untouched rows keep
their data and moments; touched rows get lazy Momentum the dense rule's result, lazy Adam PyTorch's
SparseAdam's (``tests/test_optimizer_state.py`` compares it with torch's).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from returns.result import Success

import monadl as ml
from monadl.typeclasses.sparse import SparseRows

SHAPE = (8, 3)
TOUCHED = [1, 2, 6]
UNTOUCHED = [0, 3, 4, 5, 7]


def _gradient(seed: int, dtype: Any = np.float64) -> SparseRows:
    rng = np.random.default_rng(seed)
    values = rng.standard_normal((5, 3)).astype(dtype)
    return SparseRows(np.array([6, 1, 6, 6, 2]), values, SHAPE)  # repeated rows add


def _run(optimizer: Any, data: Any, gradients: list[Any]) -> tuple[Any, Any]:
    state = optimizer.init(data)
    for g in gradients:
        data, state = optimizer.update(data, g, state)
    return data, state


def _parts(state: Any) -> list[Any]:
    return list(state) if isinstance(state, tuple) else [state]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(
    "optimizer",
    [
        ml.Momentum(0.1),
        ml.Momentum(0.1, weight_decay=0.01),
        ml.Adam(0.1),
        ml.Adam(0.1, weight_decay=0.01),
        ml.AdamW(0.1),
        ml.AdamW(0.1, amsgrad=True),
        ml.RMSprop(0.1, momentum=0.5, centered=True, weight_decay=0.01),
    ],
    ids=repr,
)
def test_a_sparse_gradient_gives_the_dense_gradients_step_bit_for_bit(optimizer: Any, dtype: Any) -> None:
    data = np.random.default_rng(0).standard_normal(SHAPE).astype(dtype)
    sparse = [_gradient(1, dtype), _other_rows(2, dtype)]
    got_data, got_state = _run(optimizer, data, sparse)
    expected_data, expected_state = _run(optimizer, data, [g.to_dense() for g in sparse])
    assert got_data.dtype == dtype
    np.testing.assert_array_equal(got_data, expected_data)
    for got, expected in zip(_parts(got_state), _parts(expected_state), strict=True):
        np.testing.assert_array_equal(got, expected)
    after_first, _ = _run(optimizer, data, sparse[:1])
    assert np.all(got_data[[1, 6]] != after_first[[1, 6]])  # rows the second step did not touch move on


@pytest.mark.parametrize("optimizer", [ml.Momentum(0.1), ml.Adam(0.1)], ids=repr)
def test_a_training_step_on_a_lookup_is_the_step_on_its_dense_gradient(optimizer: Any) -> None:
    table = np.random.default_rng(3).standard_normal(SHAPE)
    w = ml.ArrayWeight(table)
    loss = ml.sum(ml.take_rows(w, [6, 1, 6]) * np.array([1.0, -2.0, 0.5]))
    _, gradients = ml.compute_gradients(loss)
    assert isinstance(gradients[w], SparseRows)
    expected, _ = optimizer.update(table, gradients[w].to_dense(), optimizer.init(table))
    assert isinstance(loss.train_blocking(optimizer), Success)
    np.testing.assert_array_equal(w.data, expected)


def _sparse_adam(data: Any, gradients: list[SparseRows], lr: float, wd: float = 0.0) -> tuple[Any, ...]:
    """PyTorch's SparseAdam, written out row by row: a row's moments change only on a step that
    touches it; the bias correction (on the step size) uses the weight's step count."""
    m, v = np.zeros_like(data), np.zeros_like(data)
    data = data.copy()
    for t, g in enumerate(gradients, start=1):
        dense = g.to_dense()
        for r in sorted(set(g.indices.tolist())):
            row = dense[r] + wd * data[r]
            m[r] = 0.9 * m[r] + 0.1 * row
            v[r] = 0.999 * v[r] + 0.001 * row * row
            data[r] = data[r] - lr * (1 - 0.999**t) ** 0.5 / (1 - 0.9**t) * (m[r] / (v[r] ** 0.5 + 1e-8))
    return data, m, v


def _other_rows(seed: int, dtype: Any = np.float64) -> SparseRows:
    values = np.random.default_rng(seed).standard_normal((2, 3)).astype(dtype)
    return SparseRows(np.array([0, 2]), values, SHAPE)


@pytest.mark.parametrize("wd", [0.0, 0.01])
def test_lazy_adam_updates_the_touched_rows_only(wd: float) -> None:
    data = np.random.default_rng(4).standard_normal(SHAPE)
    gradients = [_gradient(5), _other_rows(6), _gradient(7)]
    got, (m, v, t) = _run(ml.Adam(0.1, weight_decay=wd, lazy=True), data, gradients)
    expected, expected_m, expected_v = _sparse_adam(data, gradients, 0.1, wd)
    assert t == 3
    np.testing.assert_allclose(got, expected, rtol=1e-14, atol=1e-15)
    np.testing.assert_allclose(m, expected_m, rtol=1e-14, atol=1e-15)
    np.testing.assert_allclose(v, expected_v, rtol=1e-14, atol=1e-15)
    never = [3, 4, 5, 7]
    np.testing.assert_array_equal(got[never], data[never])
    assert not np.any(m[never]) and not np.any(v[never])


def test_lazy_touched_rows_match_the_dense_rule() -> None:
    # One step from a fresh state: a touched row's result is the dense rule's for that row (lazy
    # Momentum; lazy Adam is SparseAdam, whose epsilon is not bias-corrected: about as close).
    data = np.random.default_rng(8).standard_normal(SHAPE)
    g = _gradient(9)
    for lazy, dense in [
        (ml.Adam(0.1, lazy=True), ml.Adam(0.1)),
        (ml.Momentum(0.1, lazy=True), ml.Momentum(0.1)),
    ]:
        got, got_state = _run(lazy, data, [g])
        expected, expected_state = _run(dense, data, [g.to_dense()])
        if isinstance(lazy, ml.Adam):
            np.testing.assert_allclose(got[TOUCHED], expected[TOUCHED], rtol=1e-5)
        else:
            np.testing.assert_array_equal(got[TOUCHED], expected[TOUCHED])
        np.testing.assert_array_equal(got[UNTOUCHED], data[UNTOUCHED])
        np.testing.assert_array_equal(got_state[0][TOUCHED], expected_state[0][TOUCHED])


def test_lazy_momentum_keeps_untouched_velocities() -> None:
    data = np.zeros(SHAPE)
    first, second = _gradient(10), _other_rows(11)
    got, (velocity, step) = _run(ml.Momentum(0.1, momentum=0.5, lazy=True), data, [first, second])
    assert step == 2
    dense1, dense2 = first.to_dense(), second.to_dense()
    expected_velocity = dense1.copy()
    expected_velocity[[0, 2]] = 0.5 * dense1[[0, 2]] + dense2[[0, 2]]  # rows 1, 6 not decayed
    np.testing.assert_allclose(velocity, expected_velocity, rtol=1e-15)
    np.testing.assert_allclose(
        got, -0.1 * dense1 - 0.1 * (expected_velocity * (dense2 != 0).any(axis=1)[:, None])
    )


@pytest.mark.parametrize("optimizer", [ml.Adam(0.1, lazy=True), ml.Momentum(0.1, lazy=True)], ids=repr)
def test_lazy_on_a_dense_gradient_is_the_dense_rule(optimizer: Any) -> None:
    data = np.random.default_rng(12).standard_normal(SHAPE)
    g = _gradient(13).to_dense()
    plain = type(optimizer)(0.1)
    got, got_state = _run(optimizer, data, [g, g])
    expected, expected_state = _run(plain, data, [g, g])
    np.testing.assert_array_equal(got, expected)
    for a, b in zip(_parts(got_state), _parts(expected_state), strict=True):
        np.testing.assert_array_equal(a, b)


def test_lazy_adam_in_training_leaves_rows_not_looked_up() -> None:
    table = np.random.default_rng(14).standard_normal(SHAPE)
    w = ml.ArrayWeight(table, optimizer=ml.Adam(0.1, lazy=True))
    for rows in ([1, 6], [2]):
        assert isinstance(ml.train_blocking(ml.sum(ml.take_rows(w, rows))), Success)
    changed = np.any(w.data != table, axis=1)
    assert changed.tolist() == [False, True, True, False, False, False, True, False]
    assert w.optimizer_state is not None and w.optimizer_state[1][2] == 2


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_adam_updates_a_large_table_from_its_sparse_gradient_as_from_the_dense_one(dtype: Any) -> None:
    """A table updated a chunk of rows at a time (more than 32k elements), whose chunks without a
    touched row skip the gradient's products: bit for bit Adam's rule on the dense gradient, written
    out in NumPy, the moments included (their -0.0 of negative data too)."""
    rng = np.random.default_rng(3)
    shape = (5000, 24)
    data = rng.standard_normal(shape).astype(dtype)
    data[:50] = -0.0  # m and v start at data * 0.0: -0.0 for these, and for every negative entry
    adam = ml.Adam(0.01)
    state = adam.init(data)
    m, v, expected = state[0], state[1], data
    got = data
    for t in range(1, 4):
        indices = np.concatenate([rng.integers(0, 5000, 30), [4999, 4999, 0, 1365, 1366]])
        gradient = SparseRows(indices, rng.standard_normal((35, 24)).astype(dtype), shape)
        got, state = adam.update(got, gradient, state)
        g = gradient.to_dense()
        m = 0.9 * m + (1.0 - 0.9) * g
        v = 0.999 * v + (1.0 - 0.999) * (g * g)
        expected = expected - 0.01 * (m / (1.0 - 0.9**t)) / ((v / (1.0 - 0.999**t)) ** 0.5 + 1e-8)
    assert got.dtype == dtype
    for got_array, expected_array in ((got, expected), (state[0], m), (state[1], v)):
        assert got_array.tobytes() == expected_array.tobytes()  # the bits, -0.0 apart from 0.0


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(1,), (48,), (7, 5), (2, 3, 4), (200, 200)])
def test_adams_numpy_paths_are_its_rule_bit_for_bit(shape: tuple[int, ...], dtype: Any) -> None:
    """Adam's update, on small weights and on large ones (in place, a chunk of rows at a time),
    gives the rule as written (``adam_rule``) in every bit, over steps whose moments and gradients
    vary widely."""
    from monadl.dsl.learning.optimizers.adam import adam_rule

    rng = np.random.default_rng(len(shape))
    data = rng.standard_normal(shape).astype(dtype)
    adam = ml.Adam(0.01)
    state = adam.init(data)
    expected, m, v = data, state[0], state[1]
    for t in range(1, 5):
        g = (rng.standard_normal(shape) * 10.0 ** rng.integers(-6, 6, shape)).astype(dtype)
        data, state = adam.update(data, g, state)
        expected, m, v = adam_rule(expected, g, m, v, 0.9, 0.999, t, 0.01, 1e-8)
        for got, want in ((data, expected), (state[0], m), (state[1], v)):
            assert got.dtype == dtype and got.tobytes() == np.asarray(want, dtype=dtype).tobytes()
