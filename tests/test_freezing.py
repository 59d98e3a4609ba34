"""Frozen weights (``trainable = False``): not trained, still differentiable through.

A training step neither updates a frozen weight nor gives it optimizer state; deltas still flow
through it to the weights it meets, and ``compute_gradients`` still reports its gradient.
"""

from __future__ import annotations

import numpy as np
import pytest
from returns.result import Failure, Success

import monadl as ml

X = np.array([[0.3, -1.2, 0.5], [1.5, 0.1, -0.7]])


def _pair(frozen: bool) -> tuple[ml.ArrayWeight, ml.ArrayWeight]:
    rng = np.random.default_rng(3)
    first = ml.ArrayWeight(rng.standard_normal((3, 4)), trainable=not frozen)
    second = ml.ArrayWeight(rng.standard_normal((4, 2)))
    return first, second


def _loss(first: ml.ArrayWeight, second: ml.ArrayWeight) -> ml.FloatLayer:
    return ml.sum(ml.tanh(ml.tanh(X @ first) @ second) ** 2.0)


@pytest.mark.parametrize("optimizer", [ml.SGD(0.1), ml.Adam(0.01)], ids=repr)
def test_a_frozen_weight_is_not_updated_and_the_others_are_as_before(optimizer: ml.Optimizer) -> None:
    frozen, after_frozen = _pair(frozen=True)
    free, after_free = _pair(frozen=False)
    data = frozen.data
    for _ in range(3):
        assert isinstance(_loss(frozen, after_frozen).train_blocking(optimizer), Success)
        # the reference: the same model with nothing frozen, its first weight put back after each step
        assert isinstance(_loss(free, after_free).train_blocking(optimizer), Success)
        free.data = data
    assert frozen.data is data  # not even committed again
    assert frozen.optimizer_state is None  # no state either
    np.testing.assert_array_equal(after_frozen.data, after_free.data)  # deltas flowed through it
    assert not np.array_equal(after_frozen.data, _pair(frozen=True)[1].data)


def test_a_frozen_weight_is_not_in_the_global_norm() -> None:
    frozen, second = _pair(frozen=True)
    _, gradients = ml.compute_gradients(_loss(frozen, second))
    norm = float(np.linalg.norm(gradients[second]))
    assert float(np.linalg.norm(gradients[frozen])) > 1.0  # counting it would show
    before = second.data
    clip = ml.chain(ml.clip_by_global_norm(norm / 2), ml.SGD(1.0))
    assert isinstance(_loss(frozen, second).train_blocking(clip), Success)
    np.testing.assert_allclose(before - second.data, gradients[second] / 2, rtol=1e-13)


def test_compute_gradients_reports_a_frozen_weights_gradient() -> None:
    frozen, second = _pair(frozen=True)
    free, second_free = _pair(frozen=False)
    _, gradients = ml.compute_gradients(_loss(frozen, second))
    _, reference = ml.compute_gradients(_loss(free, second_free))
    np.testing.assert_array_equal(gradients[frozen], reference[free])
    np.testing.assert_array_equal(gradients[second], reference[second_free])


def test_a_frozen_weight_needs_no_optimizer() -> None:
    frozen = ml.FloatWeight(2.0, trainable=False)
    trained = ml.FloatWeight(1.0, optimizer=ml.SGD(0.5))
    assert isinstance((frozen * trained).train_blocking(), Success)  # no default optimizer
    assert (frozen.data, trained.data) == (2.0, 0.0)  # d/dtrained = frozen = 2
    trained.trainable = False
    assert isinstance((frozen * trained).train_blocking(), Success)  # nothing trained at all
    assert (frozen.data, trained.data) == (2.0, 0.0)
    frozen.trainable = True
    result = (frozen * trained).train_blocking()  # now it wants an optimizer
    assert isinstance(result, Failure) and isinstance(result.failure(), ml.NoOptimizerError)


def test_freezing_keeps_the_state_a_weight_had_and_unfreezing_goes_on_from_it() -> None:
    w = ml.FloatWeight(1.0)
    loss = w * 3.0
    for _ in range(2):
        loss.train_blocking(ml.Adam(0.1))
    held = w.optimizer_state
    value = w.data
    w.trainable = False
    for _ in range(2):
        assert isinstance(loss.train_blocking(ml.Adam(0.1)), Success)
    assert w.optimizer_state is held and w.data == value
    w.trainable = True
    loss.train_blocking(ml.Adam(0.1))
    assert w.optimizer_state is not None and w.optimizer_state[1][2] == 3


def test_a_frozen_weight_with_another_optimizer_does_not_stop_sgd_folding_its_rate() -> None:
    # SGD folds its rate into the backward pass when every trained weight's optimizer folds the
    # same one: a frozen weight's optimizer does not count.
    frozen = ml.ArrayWeight(np.ones(3), optimizer=ml.Adam(0.1), trainable=False)
    w = ml.ArrayWeight(np.array([1.0, 2.0, 3.0]))
    loss = ml.sum(frozen * w * 2.0)
    assert isinstance(loss.train_blocking(ml.SGD(0.25)), Success)
    np.testing.assert_array_equal(w.data, [0.5, 1.5, 2.5])
    np.testing.assert_array_equal(frozen.data, np.ones(3))


def test_trainable_is_a_constructor_keyword_and_true_by_default() -> None:
    assert ml.FloatWeight(1.0).trainable and ml.ArrayWeight(np.ones(2)).trainable
    assert not ml.FloatWeight(1.0, trainable=False).trainable
    assert not ml.ArrayWeight(np.ones(2), trainable=False).trainable


def test_the_class_methods_take_trainable_as_the_constructor_does() -> None:
    zeros = ml.ArrayWeight.zeros((3,), trainable=False)
    normal = ml.ArrayWeight.normal((3,), seed=0, trainable=False)
    assert not zeros.trainable and not normal.trainable
    assert ml.ArrayWeight.zeros((3,)).trainable and ml.ArrayWeight.normal((3,), seed=0).trainable
    loss = ml.sum((zeros + 1.0) * normal)
    assert isinstance(loss.train_blocking(ml.SGD(0.5)), Success)
    np.testing.assert_array_equal(zeros.data, np.zeros(3))
    np.testing.assert_array_equal(normal.data, ml.ArrayWeight.normal((3,), seed=0).data)
