"""Learning-rate schedules, and optimizer state kept across changes of hyper-parameters.

A weight's optimizer state (moments, sums, the step count) is kept while its optimizer is of the
same kind: a new ``Adam`` with another rate, or a schedule advancing, never resets it.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np
import pytest
from returns.result import Success

import monadl as ml
from monadl.dsl.learning.optimizers import state_kind

# ------------------------------------------------------------------------------------ the values


def test_constant() -> None:
    assert [ml.Constant(0.1)(s) for s in (0, 1, 1000)] == [0.1, 0.1, 0.1]


def test_step_decay_multiplies_by_the_factor_every_few_steps() -> None:
    schedule = ml.StepDecay(1.0, factor=0.5, every=3)
    assert [schedule(s) for s in range(8)] == [1.0, 1.0, 1.0, 0.5, 0.5, 0.5, 0.25, 0.25]


def test_cosine_decay_goes_from_initial_to_final_along_half_a_cosine() -> None:
    schedule = ml.CosineDecay(1.0, steps=100, final=0.1)
    assert schedule(0) == 1.0
    assert schedule(50) == pytest.approx(0.55)  # halfway: the mean of the two
    assert schedule(25) == pytest.approx(0.1 + 0.9 * (1 + math.cos(math.pi / 4)) / 2)
    assert schedule(100) == pytest.approx(0.1) and schedule(10_000) == pytest.approx(0.1)
    values = [schedule(s) for s in range(101)]
    assert all(a >= b for a, b in itertools.pairwise(values))  # never goes up


def test_linear_warmup_rises_to_its_peak_then_hands_over() -> None:
    warm = ml.LinearWarmup(1.0, steps=4)
    assert [warm(s) for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    then = ml.LinearWarmup(1.0, steps=2, then=ml.StepDecay(1.0, factor=0.5, every=1))
    assert [then(s) for s in range(5)] == [0.5, 1.0, 1.0, 0.5, 0.25]  # then's own step 0, 1, 2


@pytest.mark.parametrize(
    "make",
    [
        lambda: ml.Constant(0.0),
        lambda: ml.StepDecay(1.0, factor=0.0),
        lambda: ml.StepDecay(1.0, factor=1.5),
        lambda: ml.StepDecay(1.0, every=0),
        lambda: ml.CosineDecay(1.0, steps=0),
        lambda: ml.CosineDecay(1.0, steps=10, final=2.0),
        lambda: ml.LinearWarmup(-1.0, steps=10),
        lambda: ml.LinearWarmup(1.0, steps=True),
    ],
)
def test_schedules_reject_bad_settings(make: Any) -> None:
    with pytest.raises(ValueError):
        make()


def test_schedules_are_values() -> None:
    assert ml.CosineDecay(1e-3, 100) == ml.CosineDecay(1e-3, 100)
    assert ml.Adam(ml.CosineDecay(1e-3, 100)) == ml.Adam(ml.CosineDecay(1e-3, 100))
    assert hash(ml.LinearWarmup(1.0, 3, then=ml.Constant(1.0))) == hash(
        ml.LinearWarmup(1.0, 3, then=ml.Constant(1.0))
    )


# ------------------------------------------------------------------ state kept across new values

G = np.array([0.5, -2.0, 1.0])


def _trained(weight: ml.ArrayWeight, optimizers: list[Any]) -> None:
    loss = ml.sum(weight * G)  # the gradient is G at every step
    for optimizer in optimizers:
        assert isinstance(loss.train_blocking(optimizer), Success)


def _reference(optimizers: list[Any], data: Any) -> tuple[Any, Any]:
    """The optimizers' update rules run one after the other on one state (the first's init)."""
    state = optimizers[0].init(data)
    for optimizer in optimizers:
        data, state = optimizer.update(data, G, state)
    return data, state


def test_adam_moments_and_step_count_continue_across_rate_changes() -> None:
    w = ml.ArrayWeight(np.zeros(3))
    rates = [0.1, 0.2, 0.1, 0.3]
    counts = []
    for rate in rates:
        _trained(w, [ml.Adam(rate)])  # a new Adam every step, with another rate
        assert w.optimizer_state is not None
        counts.append(w.optimizer_state[1][2])
    assert counts == [1, 2, 3, 4]  # not 1, 1, 1, 1 (nor 1, 2, 1, 2)
    data, (m, v, t) = _reference([ml.Adam(r) for r in rates], np.zeros(3))
    np.testing.assert_array_equal(w.data, data)
    assert w.optimizer_state is not None
    got_m, got_v, got_t = w.optimizer_state[1]
    np.testing.assert_array_equal(got_m, m)
    np.testing.assert_array_equal(got_v, v)
    assert got_t == t == 4


@pytest.mark.parametrize(
    "kind",
    [
        lambda rate: ml.SGD(rate),
        lambda rate: ml.Momentum(rate, momentum=0.5),
        lambda rate: ml.Adagrad(rate),
        lambda rate: ml.Adam(rate, beta1=0.8),
    ],
)
def test_every_optimizer_keeps_its_state_across_new_hyper_parameters(kind: Any) -> None:
    optimizers = [kind(r) for r in (0.1, 0.05, 0.2)]
    w = ml.ArrayWeight(np.ones(3))
    _trained(w, optimizers)
    data, _ = _reference(optimizers, np.ones(3))
    np.testing.assert_array_equal(w.data, data)
    assert w.optimizer_state is not None and w.optimizer_state[0] is optimizers[-1]
    got = w.optimizer_state[1]
    assert (got if isinstance(got, int) else got[-1]) == 3  # the step count, in the state


def test_a_schedule_advances_with_the_weights_step_count() -> None:
    schedule = ml.StepDecay(0.1, factor=0.5, every=2)
    w = ml.FloatWeight(0.0)
    loss = w * 1.0  # gradient 1: each step moves w by -rate
    moves = []
    for _ in range(6):
        before = w.data
        assert isinstance(loss.train_blocking(ml.SGD(schedule)), Success)
        moves.append(before - w.data)
    assert moves == pytest.approx([0.1, 0.1, 0.05, 0.05, 0.025, 0.025])
    assert w.optimizer_state is not None and w.optimizer_state[1] == 6


def test_a_new_schedule_goes_on_at_the_step_reached() -> None:
    # Switching from a constant rate to a schedule after 3 steps: the schedule starts at step 3.
    w = ml.FloatWeight(0.0)
    loss = w * 1.0
    for _ in range(3):
        loss.train_blocking(ml.SGD(0.1))
    before = w.data
    loss.train_blocking(ml.SGD(ml.StepDecay(1.0, factor=0.5, every=1)))
    assert before - w.data == pytest.approx(0.125)  # 0.5 ** 3


def test_adam_with_a_warmup_schedule_matches_its_update_rule() -> None:
    adam = ml.Adam(ml.LinearWarmup(0.1, steps=3, then=ml.CosineDecay(0.1, steps=5)))
    w = ml.ArrayWeight(np.zeros(3))
    _trained(w, [adam] * 8)
    data, _ = _reference([adam] * 8, np.zeros(3))
    np.testing.assert_array_equal(w.data, data)
    # and by hand: Adam's rule with the rate of each step
    m = v = np.zeros(3)
    x = np.zeros(3)
    for step in range(8):
        rate = (
            0.1 * (step + 1) / 3 if step < 3 else 0.1 * 0.5 * (1 + math.cos(math.pi * min(step - 3, 5) / 5))
        )
        m = 0.9 * m + 0.1 * G
        v = 0.999 * v + 0.001 * G * G
        x = x - rate * (m / (1 - 0.9 ** (step + 1))) / (np.sqrt(v / (1 - 0.999 ** (step + 1))) + 1e-8)
    np.testing.assert_allclose(w.data, x, rtol=1e-12, atol=1e-15)


def test_another_kind_of_optimizer_starts_afresh() -> None:
    w = ml.ArrayWeight(np.zeros(3))
    _trained(w, [ml.Adam(0.1), ml.Adam(0.1)])
    _trained(w, [ml.Momentum(0.1)])
    assert w.optimizer_state is not None
    velocity, step = w.optimizer_state[1]
    assert step == 1
    np.testing.assert_array_equal(velocity, G)  # a fresh velocity: the first step's gradient


def test_a_chain_keeps_its_optimizers_state() -> None:
    # Adding clipping to a weight's Adam mid-training keeps the moments (and taking it off again).
    w = ml.ArrayWeight(np.zeros(3))
    optimizers: list[Any] = [ml.Adam(0.1), ml.chain(ml.clip_by_value(10.0), ml.Adam(0.05)), ml.Adam(0.1)]
    _trained(w, optimizers)
    assert w.optimizer_state is not None and w.optimizer_state[1][2] == 3
    data, _ = _reference([ml.Adam(0.1), ml.Adam(0.05), ml.Adam(0.1)], np.zeros(3))  # nothing clipped
    np.testing.assert_array_equal(w.data, data)
    assert state_kind(optimizers[1]) is ml.Adam


def test_sgd_with_a_constant_schedule_steps_as_with_the_constant() -> None:
    a, b = ml.ArrayWeight(np.ones(3)), ml.ArrayWeight(np.ones(3))
    _trained(a, [ml.SGD(0.1)] * 3)
    _trained(b, [ml.SGD(ml.Constant(0.1))] * 3)
    np.testing.assert_allclose(a.data, b.data, rtol=1e-15)


def test_a_schedule_returning_a_numpy_scalar_keeps_a_float32_weight_float32() -> None:
    w = ml.ArrayWeight(np.ones(3, dtype=np.float32))
    for optimizer in (ml.SGD(lambda step: np.float64(0.1)), ml.Adam(lambda step: np.float64(0.1))):
        assert isinstance(ml.sum(w * G).train_blocking(optimizer), Success)
        assert w.data.dtype == np.float32


def test_a_learning_rate_must_be_positive_or_a_schedule() -> None:
    with pytest.raises(ValueError, match="learning_rate"):
        ml.Adam(0.0)
    assert ml.Adam(lambda step: 0.0).init(1.0) == (0.0, 0.0, 0)  # a schedule checks itself
