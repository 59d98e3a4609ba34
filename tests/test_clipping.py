"""Gradient clipping (by global norm, by value) inside the all-or-nothing training step.

``ml.chain(ml.clip_by_global_norm(c), optimizer)`` is an optimizer: the step hands it the gradients
of all the weights it updates before updating any, so the norm is the global one, and a step that
fails anywhere still changes nothing.
"""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np
import pytest
from returns.result import Failure, Success

import monadl as ml
from monadl.typeclasses.sparse import SparseRows

X = np.array([[0.3, -1.2, 0.5, 2.0], [1.5, 0.1, -0.7, 0.4]])


Weight = ml.ArrayWeight | ml.FloatWeight


def _model() -> tuple[ml.ArrayWeight, ml.ArrayWeight, ml.FloatWeight]:
    rng = np.random.default_rng(0)
    return (
        ml.ArrayWeight(rng.standard_normal((4, 3))),
        ml.ArrayWeight(rng.standard_normal(3)),
        ml.FloatWeight(0.5),
    )


def _loss(w: ml.ArrayWeight, b: ml.ArrayWeight, s: ml.FloatWeight, scale: float = 1.0) -> ml.FloatLayer:
    return ml.sum(ml.tanh(X @ w + b) * s) ** 2.0 * scale


def _snapshot(*weights: ml.FloatWeight | ml.ArrayWeight) -> bytes:
    return pickle.dumps([(np.asarray(w.data).tobytes(), repr(w.optimizer_state)) for w in weights])


@pytest.mark.parametrize("max_norm", [0.05, 1.0, 1e6])
def test_clip_by_global_norm_against_numpy(max_norm: float) -> None:
    weights = _model()
    before = [np.asarray(w.data, dtype=np.float64) for w in weights]
    _, gradients = ml.compute_gradients(_loss(*weights))
    raw = [np.asarray(gradients[w], dtype=np.float64) for w in weights]
    norm = np.sqrt(sum(float(np.sum(g * g)) for g in raw))
    assert ml.global_norm([gradients[w] for w in weights]) == pytest.approx(norm, rel=1e-14)
    factor = min(1.0, max_norm / norm)
    result = _loss(*weights).train_blocking(ml.chain(ml.clip_by_global_norm(max_norm), ml.SGD(0.1)))
    assert isinstance(result, Success)
    for w, x, g in zip(weights, before, raw, strict=True):
        np.testing.assert_allclose(np.asarray(w.data), x - 0.1 * factor * g, rtol=1e-13, atol=1e-15)
    clipped = np.sqrt(
        sum(float(np.sum((x - np.asarray(w.data)) ** 2)) for w, x in zip(weights, before, strict=True))
    )
    assert clipped / 0.1 == pytest.approx(min(norm, max_norm), rel=1e-12)


def test_clip_by_value_against_numpy() -> None:
    w0, b0, s0 = _model()
    weights: list[Weight] = [w0, b0, s0]
    before = [np.asarray(w.data, dtype=np.float64) for w in weights]
    _, gradients = ml.compute_gradients(_loss(w0, b0, s0))
    limit = 0.3
    assert isinstance(
        _loss(w0, b0, s0).train_blocking(ml.chain(ml.clip_by_value(limit), ml.SGD(0.1))), Success
    )
    for w, x in zip(weights, before, strict=True):
        expected = x - 0.1 * np.clip(np.asarray(gradients[w]), -limit, limit)
        np.testing.assert_allclose(np.asarray(w.data), expected, rtol=1e-14)


def test_clipping_then_adam_equals_adam_on_the_clipped_gradients() -> None:
    weights = _model()
    start = [w.data for w in weights]
    _, gradients = ml.compute_gradients(_loss(*weights))
    clipped = ml.clip_by_global_norm(0.5).transform([gradients[w] for w in weights])
    adam = ml.Adam(0.01)
    expected = [adam.update(x, g, adam.init(x))[0] for x, g in zip(start, clipped, strict=True)]
    assert isinstance(_loss(*weights).train_blocking(ml.chain(ml.clip_by_global_norm(0.5), adam)), Success)
    for w, e in zip(weights, expected, strict=True):
        np.testing.assert_array_equal(np.asarray(w.data), np.asarray(e))


def test_the_norm_of_a_sparse_gradient_is_that_of_its_summed_rows() -> None:
    table = ml.ArrayWeight(np.random.default_rng(1).standard_normal((6, 2)))
    dense = ml.ArrayWeight(np.array([0.5, -0.25]))
    rows = [4, 1, 4, 4]  # repeated: their rows add before squaring
    loss = ml.sum(ml.take_rows(table, rows) * np.array([3.0, -1.0])) + ml.sum(dense * np.array([2.0, 1.0]))
    _, gradients = ml.compute_gradients(loss)
    assert isinstance(gradients[table], SparseRows)
    summed = gradients[table].to_dense()
    norm = np.sqrt(np.sum(summed**2) + 2.0**2 + 1.0**2)
    assert ml.global_norm([gradients[table], gradients[dense]]) == pytest.approx(norm, rel=1e-14)
    assert norm == pytest.approx(np.sqrt(9 * 10 + 1 * 10 + 5))  # row 4: 3 * (3, -1); row 1: (3, -1)
    t0, d0 = table.data, dense.data
    assert isinstance(loss.train_blocking(ml.chain(ml.clip_by_global_norm(1.0), ml.SGD(0.1))), Success)
    np.testing.assert_allclose(table.data, t0 - 0.1 * summed / norm, rtol=1e-13)
    np.testing.assert_allclose(dense.data, d0 - 0.1 * np.array([2.0, 1.0]) / norm, rtol=1e-13)
    untouched = [0, 2, 3, 5]
    np.testing.assert_array_equal(table.data[untouched], t0[untouched])  # still a sparse update


def test_clip_by_value_of_a_sparse_gradient_clips_its_summed_rows() -> None:
    g = SparseRows(np.array([2, 0, 2]), np.array([[0.4, -0.1], [5.0, 0.2], [0.4, 0.3]]), (3, 2))
    (clipped,) = ml.clip_by_value(0.5).transform([g])
    assert isinstance(clipped, SparseRows)
    np.testing.assert_array_equal(clipped.to_dense(), np.clip(g.to_dense(), -0.5, 0.5))  # row 2: 0.8 -> 0.5


def test_clip_by_value_keeps_a_nan_float_gradient() -> None:
    assert ml.clip_by_value(1.0).transform([2.0, -3.0, 0.5]) == [1.0, -1.0, 0.5]
    (nan,) = ml.clip_by_value(1.0).transform([float("nan")])
    assert nan != nan


def test_the_norm_is_over_the_weights_the_chain_updates() -> None:
    # Two weights share the step's default chain (one norm over both); a third has its own SGD and
    # is neither clipped nor counted.
    a, b = ml.FloatWeight(0.0), ml.FloatWeight(0.0)
    c = ml.FloatWeight(0.0, optimizer=ml.SGD(1.0))
    loss = a * 3.0 + b * 4.0 + c * 100.0
    assert isinstance(loss.train_blocking(ml.chain(ml.clip_by_global_norm(1.0), ml.SGD(1.0))), Success)
    assert (a.data, b.data, c.data) == pytest.approx((-0.6, -0.8, -100.0))  # (3, 4) / 5


def test_equal_chains_share_one_norm() -> None:
    a = ml.FloatWeight(0.0, optimizer=ml.chain(ml.clip_by_global_norm(1.0), ml.SGD(1.0)))
    b = ml.FloatWeight(0.0, optimizer=ml.chain(ml.clip_by_global_norm(1.0), ml.SGD(1.0)))  # equal
    assert isinstance((a * 3.0 + b * 4.0).train_blocking(), Success)
    assert (a.data, b.data) == pytest.approx((-0.6, -0.8))


def test_chained_transformations_run_in_order() -> None:
    a, b = ml.FloatWeight(0.0), ml.FloatWeight(0.0)
    loss = a * 30.0 + b * 0.5
    # by value to (1, 0.5), then by norm: |(1, 0.5)| = 1.118 > 1
    both = ml.chain(ml.clip_by_value(1.0), ml.clip_by_global_norm(1.0), ml.SGD(1.0))
    assert isinstance(loss.train_blocking(both), Success)
    norm = np.hypot(1.0, 0.5)
    assert (a.data, b.data) == pytest.approx((-1.0 / norm, -0.5 / norm))
    nested = ml.chain(ml.clip_by_value(1.0), ml.chain(ml.clip_by_global_norm(1.0), ml.SGD(1.0)))
    c, d = ml.FloatWeight(0.0), ml.FloatWeight(0.0)
    assert isinstance((c * 30.0 + d * 0.5).train_blocking(nested), Success)
    assert (c.data, d.data) == pytest.approx((a.data, b.data))


def test_a_failing_clipped_step_changes_nothing() -> None:
    # A non-finite gradient: its norm is not finite, and the step fails before any commit.
    w, b, s = _model()
    u = ml.FloatWeight(0.0)
    chain = ml.chain(ml.clip_by_global_norm(1.0), ml.Adam(0.01))
    assert isinstance(_loss(w, b, s).train_blocking(chain), Success)  # a state to keep
    before = _snapshot(w, b, s, u)
    bad = _loss(w, b, s) + ml.sqrt(u * 0.0) * 1.0  # d sqrt(0) = inf
    result = bad.train_blocking(chain)
    assert isinstance(result, Failure) and isinstance(result.failure(), ml.NonFiniteGradientError)
    assert _snapshot(w, b, s, u) == before


class _Exploding:
    """A gradient transformation that fails after the chain's other weights were transformed."""

    def transform(self, gradients: list[Any]) -> list[Any]:
        raise RuntimeError("boom")


def test_a_transformation_that_raises_changes_nothing() -> None:
    w, b, s = _model()
    s.optimizer = ml.SGD(0.1)  # updated before the chain's weights are transformed
    before = _snapshot(w, b, s)
    result = _loss(w, b, s).train_blocking(ml.chain(_Exploding(), ml.SGD(0.1)))
    assert isinstance(result, Failure) and str(result.failure()) == "boom"
    assert _snapshot(w, b, s) == before


def test_a_step_without_an_optimizer_for_a_weight_changes_the_chained_ones_neither() -> None:
    w, b, s = _model()
    w.optimizer = b.optimizer = ml.chain(ml.clip_by_global_norm(1.0), ml.SGD(0.1))
    before = _snapshot(w, b, s)
    result = _loss(w, b, s).train_blocking()  # s has no optimizer
    assert isinstance(result, Failure) and isinstance(result.failure(), ml.NoOptimizerError)
    assert _snapshot(w, b, s) == before


def test_chain_checks_its_parts() -> None:
    with pytest.raises(TypeError, match="not an optimizer"):
        ml.chain(ml.clip_by_value(1.0), ml.clip_by_value(1.0))  # type: ignore[call-overload]
    with pytest.raises(TypeError, match="not a gradient transformation"):
        ml.chain(ml.SGD(0.1), ml.SGD(0.1))  # type: ignore[call-overload]
    with pytest.raises(ValueError):
        ml.clip_by_global_norm(0.0)
    with pytest.raises(ValueError):
        ml.clip_by_value(-1.0)


def test_a_float32_weight_stays_float32_through_clipping() -> None:
    w = ml.ArrayWeight(np.ones((3, 2), dtype=np.float32))
    loss = ml.sum(w * np.full((3, 2), 5.0))  # float64 inputs: a float64 gradient
    for _ in range(2):
        assert isinstance(loss.train_blocking(ml.chain(ml.clip_by_global_norm(1.0), ml.Adam(0.1))), Success)
    assert w.data.dtype == np.float32
    assert w.optimizer_state is not None and w.optimizer_state[1][0].dtype == np.float32
