"""``ml.apply_gradients``: gradients from ``compute_gradients``, accumulated, applied in one commit."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from returns.pipeline import is_successful

import monadl as ml


def model(seed: int = 0) -> list[ml.ArrayWeight]:
    rng = np.random.default_rng(seed)
    return [
        ml.ArrayWeight(rng.normal(size=(4, 6))),
        ml.ArrayWeight(rng.normal(size=(6,))),
        ml.ArrayWeight(rng.normal(size=(6, 3))),
    ]


def loss(weights: list[ml.ArrayWeight], x: Any, y: Any) -> ml.FloatLayer:
    w1, b1, w2 = weights
    return ml.cross_entropy(ml.tanh(x @ w1 + b1) @ w2, y)


RNG = np.random.default_rng(7)
X = RNG.normal(size=(8, 4))
Y = RNG.integers(0, 3, size=8)


def datas(weights: list[ml.ArrayWeight]) -> list[Any]:
    return [np.array(w.data) for w in weights]


@pytest.mark.parametrize("make", [lambda: ml.SGD(0.1), lambda: ml.Adam(0.01)], ids=["sgd", "adam"])
def test_four_accumulated_quarter_batches_equal_one_step_on_the_batch(make: Any) -> None:
    whole, accumulated = model(), model()
    for _ in range(3):  # Adam's state carried across steps too
        assert is_successful(loss(whole, X, Y).train_blocking(make()))
        total: dict[Any, Any] = {}
        for k in range(4):
            _, grads = ml.compute_gradients(loss(accumulated, X[2 * k : 2 * k + 2], Y[2 * k : 2 * k + 2]))
            for w, g in grads.items():
                total[w] = total[w] + g if w in total else g
        assert is_successful(ml.apply_gradients({w: g / 4 for w, g in total.items()}, make()))
        for a, b in zip(datas(whole), datas(accumulated), strict=True):
            np.testing.assert_allclose(b, a, rtol=0, atol=1e-12)
    assert not np.array_equal(datas(whole)[0], datas(model())[0])


def test_a_weights_own_optimizer_and_state_are_used() -> None:
    w = ml.ArrayWeight(np.ones(3), optimizer=ml.Adam(0.1))
    assert is_successful(ml.apply_gradients({w: np.array([1.0, -2.0, 0.5])}))
    state = w.optimizer_state
    assert state is not None and isinstance(state[0], ml.Adam)
    np.testing.assert_allclose(w.data, [0.9, 1.1, 0.9])  # Adam's first step: lr * sign(g)


def test_a_non_finite_gradient_fails_and_changes_nothing() -> None:
    a, b = ml.ArrayWeight(np.ones(2)), ml.ArrayWeight(np.ones(2))
    ml.apply_gradients({a: np.ones(2), b: np.ones(2)}, ml.Adam(0.1))
    before = [np.array(a.data), np.array(b.data), a.optimizer_state, b.optimizer_state]
    result = ml.apply_gradients({a: np.ones(2), b: np.array([1.0, np.nan])}, ml.Adam(0.1))
    assert not is_successful(result) and isinstance(result.failure(), ml.NonFiniteGradientError)
    np.testing.assert_array_equal(a.data, before[0])
    np.testing.assert_array_equal(b.data, before[1])
    assert a.optimizer_state is before[2] and b.optimizer_state is before[3]


def test_wrong_gradients_are_failures_naming_the_weight() -> None:
    w, f = ml.ArrayWeight(np.ones((2, 3)), name="w"), ml.FloatWeight(1.0, name="f")
    bad_shape = ml.apply_gradients({w: np.ones(3)}, ml.SGD(0.1))
    assert "gradient of ArrayWeight(shape=(2, 3), dtype=float64, name='w') has shape (3,)" in str(
        bad_shape.failure()
    )
    assert "must be a float" in str(ml.apply_gradients({f: np.ones(1)}, ml.SGD(0.1)).failure())
    assert isinstance(ml.apply_gradients({w: np.ones((2, 3))}).failure(), ml.NoOptimizerError)
    assert is_successful(ml.apply_gradients({f: 2.0}, ml.SGD(0.5)))
    assert f.data == 0.0
    np.testing.assert_array_equal(w.data, np.ones((2, 3)))


def test_a_sparse_gradient_sum_updates_only_its_rows() -> None:
    table = ml.ArrayWeight(np.zeros((5, 2)))
    _, first = ml.compute_gradients(ml.sum(table[[1, 1]]))
    _, second = ml.compute_gradients(ml.sum(table[[3]]))
    assert is_successful(ml.apply_gradients({table: first[table] + second[table]}, ml.SGD(1.0)))
    np.testing.assert_array_equal(table.data, [[0, 0], [-2, -2], [0, 0], [-1, -1], [0, 0]])


@settings(deadline=None, max_examples=40)
@given(
    classes=st.integers(1, 300),
    labels=st.lists(st.integers(-2, 302), min_size=1, max_size=4),
    seed=st.integers(0, 2**32 - 1),
)
def test_a_python_int_label_is_its_0d_arrays(classes: int, labels: list[int], seed: int) -> None:
    """A Python int label (below 256: made once; above: a new array) gives what the same label as a
    0-d integer array gives: the losses of nodes summed, merged or not, their gradients, or the
    same failure for a label out of range."""
    logits = [np.random.default_rng(seed + k).standard_normal(classes) for k in range(len(labels))]
    weights = [ml.ArrayWeight(x) for x in logits]

    def outcome(targets: Sequence[np.ndarray | int], batching: bool) -> tuple[str, Any]:
        loss = ml.add_n([ml.cross_entropy(w, t) for w, t in zip(weights, targets, strict=True)])
        with ml.Executor(batching=batching) as ex:
            try:
                value, grads = ml.compute_gradients(loss, executor=ex)
            except ValueError as error:
                return "failure", str(error)
        return "value", (value, [grads[w].tolist() for w in weights])

    as_arrays = [np.array(label) for label in labels]
    for batching in (False, True):
        assert outcome(list(labels), batching) == outcome(as_arrays, batching)


def test_cross_entropy_takes_a_python_int_label() -> None:
    logits = np.array([0.3, -1.0, 2.0])
    for label in (0, 2):
        got = ml.cross_entropy(logits, label).predict_blocking().unwrap()
        assert got == ml.cross_entropy(logits, np.array(label)).predict_blocking().unwrap()
        assert got == pytest.approx(-(logits[label] - np.log(np.exp(logits).sum())), abs=1e-12)
    w = ml.ArrayWeight(logits)
    _, grads = ml.compute_gradients(ml.cross_entropy(w, 1))
    np.testing.assert_allclose(grads[w], np.exp(logits) / np.exp(logits).sum() - np.eye(3)[1], atol=1e-12)
    assert "out of range" in str(ml.cross_entropy(logits, 3).predict_blocking().failure())
    with pytest.raises(TypeError, match="cross_entropy: expected an array of targets, got bool"):
        ml.cross_entropy(logits, True)
