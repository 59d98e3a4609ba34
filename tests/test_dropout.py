"""Dropout: seeded masks drawn at every training run, never in a prediction.

``ml.Dropout(p, seed=s)(x)``: in a training step (``train``, ``train_blocking``,
``compute_gradients``) each entry is kept with probability ``1 - p`` and scaled by ``1 / (1 - p)``;
in a prediction the input passes unchanged. ``sum(dropout(w))``'s gradient is the mask itself, so
the tests read the masks from gradients.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest
from op_cases import probe
from returns.result import Success

import monadl as ml


def _masks(seed: int, p: float, shape: tuple[int, ...], n: int) -> list[Any]:
    """The first ``n`` masks a ``Dropout(p, seed=seed)`` draws for an input of ``shape``."""
    rng = np.random.default_rng(seed)
    return [(rng.random(shape) >= p) / (1.0 - p) for _ in range(n)]


def _mask_of(loss: ml.FloatLayer, weight: ml.ArrayWeight, executor: ml.Executor | None = None) -> Any:
    _, gradients = ml.compute_gradients(loss, executor=executor)
    return gradients[weight]


def test_a_prediction_never_drops() -> None:
    x = np.random.default_rng(0).standard_normal((50, 20))
    drop = ml.Dropout(0.9, seed=0)
    layer = drop(x)
    for _ in range(3):
        np.testing.assert_array_equal(layer.predict_blocking().unwrap(), x)
    assert ml.predict_blocking(ml.sum(drop(ml.ArrayWeight(x)))).unwrap() == pytest.approx(float(np.sum(x)))
    assert not ml.is_training()


def test_a_training_step_drops_about_p_and_scales_the_rest() -> None:
    w = ml.ArrayWeight(np.ones((200, 100)))
    p = 0.3
    mask = _mask_of(ml.sum(ml.Dropout(p, seed=1)(w)), w)
    dropped = float(np.mean(mask == 0.0))
    assert abs(dropped - p) < 0.02  # 20,000 draws: the standard deviation is 0.003
    np.testing.assert_array_equal(np.unique(mask), [0.0, 1.0 / (1.0 - p)])


def test_the_forward_value_is_the_input_times_the_mask() -> None:
    x = np.random.default_rng(2).standard_normal((4, 5))
    w = ml.ArrayWeight(x)
    loss = ml.sum(ml.Dropout(0.5, seed=7)(w) * probe((4, 5)))
    value, gradients = ml.compute_gradients(loss)
    (mask,) = _masks(7, 0.5, (4, 5), 1)
    assert value == pytest.approx(float(np.sum(x * mask * probe((4, 5)))), rel=1e-14)
    np.testing.assert_array_equal(gradients[w], mask * probe((4, 5)))


@pytest.mark.parametrize("replay", [True, False])
def test_every_run_draws_a_fresh_mask_from_the_generators_state(replay: bool) -> None:
    # The same graph run again (replayed from its compiled program, or walked again): each run's
    # mask is the generator's next draw, as a NumPy generator of the same seed gives them.
    executor = ml.Executor(replay=replay)
    w = ml.ArrayWeight(np.ones((3, 4)))
    loss = ml.sum(ml.Dropout(0.5, seed=11)(w))
    got = [_mask_of(loss, w, executor) for _ in range(4)]
    assert executor.last_stats.replayed == (1 if replay else 0)
    for g, expected in zip(got, _masks(11, 0.5, (3, 4), 4), strict=True):
        np.testing.assert_array_equal(g, expected)
    assert not all(np.array_equal(got[0], g) for g in got[1:])  # fresh masks


def test_a_new_graph_of_the_same_structure_replays_with_fresh_masks() -> None:
    executor = ml.Executor()
    w = ml.ArrayWeight(np.ones(6))
    drop = ml.Dropout(0.5, seed=4)
    got = [_mask_of(ml.sum(drop(w)), w, executor) for _ in range(3)]  # a new graph each time
    assert executor.last_stats.replayed == 1
    for g, expected in zip(got, _masks(4, 0.5, (6,), 3), strict=True):
        np.testing.assert_array_equal(g, expected)


def test_the_same_seed_gives_the_same_masks() -> None:
    def run(seed: int) -> list[Any]:
        w = ml.ArrayWeight(np.ones((5, 5)))
        loss = ml.sum(ml.Dropout(0.5, seed=seed)(w))
        return [_mask_of(loss, w) for _ in range(3)]

    first, again, other = run(3), run(3), run(4)
    for a, b in zip(first, again, strict=True):
        np.testing.assert_array_equal(a, b)
    assert not all(np.array_equal(a, b) for a, b in zip(first, other, strict=True))


def test_two_uses_of_one_layer_draw_two_masks_in_order() -> None:
    a, b = ml.ArrayWeight(np.ones(8)), ml.ArrayWeight(np.ones(8))
    drop = ml.Dropout(0.5, seed=5)
    loss = ml.sum(drop(a)) + ml.sum(drop(b) * 2.0)
    _, gradients = ml.compute_gradients(loss, executor=ml.Executor(batching=False))
    first, second = _masks(5, 0.5, (8,), 2)
    assert {gradients[a].tobytes(), (gradients[b] / 2.0).tobytes()} == {first.tobytes(), second.tobytes()}


def test_train_blocking_and_train_drop() -> None:
    w = ml.ArrayWeight(np.zeros(10))
    loss = ml.sum(ml.Dropout(0.5, seed=6)(w + 1.0))
    assert isinstance(loss.train_blocking(ml.SGD(1.0)), Success)
    (mask,) = _masks(6, 0.5, (10,), 1)
    np.testing.assert_array_equal(w.data, -mask)  # dropped entries got no gradient

    async def step() -> Any:
        return await ml.train(loss, ml.SGD(1.0)).awaitable()

    asyncio.run(step())  # in a worker thread: the step's mode goes with it
    _, second = _masks(6, 0.5, (10,), 2)
    np.testing.assert_array_equal(w.data, -mask - second)


def test_on_a_pool_it_drops_in_training_and_passes_on_in_a_prediction() -> None:
    # Every kernel worth the pool: dropout's may run on a worker, with its run's mode and generator.
    with ml.Executor(2, min_pool_cost=0.0) as executor:
        w = ml.ArrayWeight(np.ones((20, 20)))
        loss = ml.sum(ml.Dropout(0.5, seed=8)(w @ w))
        rng = np.random.default_rng(8)
        for _ in range(2):  # (the second replayed)
            value, _ = ml.compute_gradients(loss, executor=executor)
            assert value == pytest.approx(float(np.sum((rng.random((20, 20)) >= 0.5) * 2.0 * 20.0)))
        value = ml.predict_blocking(ml.Dropout(0.5, seed=8)(w), executor=executor).unwrap()
        np.testing.assert_array_equal(value, w.data)
        _, gradients = ml.compute_gradients(ml.sum(ml.Dropout(0.5, seed=9)(w)), executor=executor)
        (mask,) = _masks(9, 0.5, (20, 20), 1)
        np.testing.assert_array_equal(gradients[w], mask)


def test_gradient_for_a_fixed_mask_against_finite_differences() -> None:
    # A fresh layer of one seed draws the same mask each time: the loss as a function of x, for
    # that mask, differentiated by central differences of training runs' losses.
    x0 = np.random.default_rng(9).standard_normal((3, 4))
    weights = probe((3, 4), 2)

    def loss_at(x: Any) -> tuple[float, Any]:
        w = ml.ArrayWeight(x)
        value, gradients = ml.compute_gradients(ml.sum(ml.tanh(ml.Dropout(0.4, seed=12)(w) * 1.5) * weights))
        return value, gradients[w]

    _, analytic = loss_at(x0)
    numeric = np.empty_like(x0)
    eps = 1e-6
    for index in np.ndindex(x0.shape):
        up, down = x0.copy(), x0.copy()
        up[index] += eps
        down[index] -= eps
        numeric[index] = (loss_at(up)[0] - loss_at(down)[0]) / (up[index] - down[index])
    np.testing.assert_allclose(analytic, numeric, rtol=1e-5, atol=1e-7)
    assert np.any(analytic == 0.0) and np.any(analytic != 0.0)  # some dropped, some kept


def test_float32_stays_float32() -> None:
    w = ml.ArrayWeight(np.ones((4, 4), dtype=np.float32))
    drop = ml.Dropout(0.25, seed=0)
    _, gradients = ml.compute_gradients(ml.sum(drop(w)))
    assert gradients[w].dtype == np.float32
    assert ml.predict_blocking(drop(w)).unwrap().dtype == np.float32


def test_p_zero_never_drops() -> None:
    w = ml.ArrayWeight(np.ones(100))
    np.testing.assert_array_equal(_mask_of(ml.sum(ml.Dropout(0.0)(w)), w), np.ones(100))


def test_bad_arguments() -> None:
    for p in (-0.1, 1.0, True):
        with pytest.raises(ValueError, match="Dropout"):
            ml.Dropout(p)
    with pytest.raises(TypeError, match="Dropout: expected an array"):
        ml.Dropout(0.5)(ml.FloatWeight(1.0))  # type: ignore[arg-type]


def test_on_array_api_strict() -> None:
    xp = pytest.importorskip("array_api_strict")
    w = ml.ArrayWeight(xp.ones((3, 4), dtype=xp.float64))
    _, gradients = ml.compute_gradients(ml.sum(ml.Dropout(0.5, seed=3)(w)))
    (mask,) = _masks(3, 0.5, (3, 4), 1)
    np.testing.assert_array_equal(np.asarray(gradients[w]), mask)
    np.testing.assert_array_equal(np.asarray(ml.Dropout(0.5)(w).predict_blocking().unwrap()), np.ones((3, 4)))
