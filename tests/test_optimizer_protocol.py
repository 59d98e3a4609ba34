"""Optimizers of the user's own, written to the documented protocol (``init`` and ``update``, no base
class), and the capabilities a class declares: what a training step requires, what it may use, and
the record a step's two passes give."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
from returns.result import Failure, Success

import monadl as ml
from monadl.dsl.learning.optimizers.base import Capabilities, capabilities
from monadl.dsl.learning.training import StepResult, forward_and_backward

X = np.array([[1.0, -2.0, 0.5], [0.3, 0.7, -1.1]])


class SignDescent:
    """Written as docs/howto/write-an-optimizer.md says: a class with ``init`` and ``update``."""

    def __init__(self, rate: float) -> None:
        self.rate = rate

    def init(self, data: Any) -> int:
        return 0

    def update(self, data: Any, gradient: Any, state: int) -> tuple[Any, int]:
        return data - self.rate * np.sign(gradient), state + 1


class NormsSeen(SignDescent):
    """Declares ``transform_gradients``: sees every gradient of its weights at once, first."""

    def __init__(self, rate: float) -> None:
        super().__init__(rate)
        self.seen: list[int] = []

    def transform_gradients(self, gradients: list[Any]) -> list[Any]:
        self.seen.append(len(gradients))
        return [g * 2.0 for g in gradients]


class NoUpdate:
    def init(self, data: Any) -> None:
        return None


class NoInit:
    def update(self, data: Any, gradient: Any, state: Any) -> tuple[Any, Any]:
        return data, state


def _loss(w: ml.ArrayWeight, b: ml.ArrayWeight) -> ml.FloatLayer:
    return ml.sum(ml.tanh(ml.lift_array(X) @ w + b))


def _weights() -> tuple[ml.ArrayWeight, ml.ArrayWeight]:
    rng = np.random.default_rng(5)
    return ml.ArrayWeight(rng.standard_normal((3, 2))), ml.ArrayWeight(rng.standard_normal(2))


def test_an_optimizer_written_as_the_docs_say_trains() -> None:
    w, b = _weights()
    optimizer = SignDescent(0.01)
    for step in range(3):
        _, grads = ml.compute_gradients(_loss(w, b))
        expected = {weight: weight.data - 0.01 * np.sign(grads[weight]) for weight in (w, b)}
        assert isinstance(_loss(w, b).train_blocking(optimizer), Success)
        for weight in (w, b):
            np.testing.assert_array_equal(weight.data, expected[weight])
            assert weight.optimizer_state == (optimizer, step + 1)
    assert capabilities(optimizer) == Capabilities(updates_in_place=False, transforms_gradients=False)


def test_a_declared_transform_gradients_sees_all_its_weights_gradients_together() -> None:
    w, b = _weights()
    optimizer = NormsSeen(0.01)
    _, grads = ml.compute_gradients(_loss(w, b))
    expected = {weight: weight.data - 0.01 * np.sign(2.0 * grads[weight]) for weight in (w, b)}
    assert isinstance(_loss(w, b).train_blocking(optimizer), Success)
    assert optimizer.seen == [2]
    for weight in (w, b):
        np.testing.assert_array_equal(weight.data, expected[weight])


def test_a_subclass_that_overrides_update_alone_is_updated_by_it() -> None:
    # SGD declares update_owned; a subclass that changes the rule in ``update`` must get its rule,
    # not SGD's inherited in-place one (nor a learning rate folded into its gradients).
    class ClippedSGD(ml.SGD):
        def update(self, data: Any, gradient: Any, state: int | None) -> tuple[Any, Any]:
            return super().update(data, np.clip(gradient, -0.1, 0.1), state)

    w, b = _weights()
    _, grads = ml.compute_gradients(_loss(w, b))
    expected = {weight: weight.data - 0.5 * np.clip(grads[weight], -0.1, 0.1) for weight in (w, b)}
    assert isinstance(_loss(w, b).train_blocking(ClippedSGD(0.5)), Success)
    for weight in (w, b):
        np.testing.assert_allclose(weight.data, expected[weight], rtol=1e-15)
    assert not capabilities(ClippedSGD(0.5)).updates_in_place
    assert not capabilities(ClippedSGD(0.5)).checks_update
    assert capabilities(ml.SGD(0.5)).updates_in_place
    assert capabilities(ml.SGD(0.5)).checks_update


def test_a_subclass_that_overrides_update_owned_alone_is_updated_by_it_and_checked_by_the_step() -> None:
    # SGD declares update_owned_checked (its in-place update, saying whether the result is finite):
    # a subclass that changes the in-place update alone must get its own, whose result the step
    # checks itself.
    seen: list[int] = []

    class HalvedSGD(ml.SGD):
        def update_owned(self, data: Any, gradient: Any, state: int | None) -> tuple[Any, Any]:
            seen.append(1)
            return super().update_owned(data, gradient * 0.5, state)

        def update(self, data: Any, gradient: Any, state: int | None) -> tuple[Any, Any]:
            return super().update(data, gradient * 0.5, state)

    assert capabilities(HalvedSGD(0.5)).updates_in_place
    assert not capabilities(HalvedSGD(0.5)).checks_update
    w, b = _weights()
    _, grads = ml.compute_gradients(_loss(w, b))
    expected = {weight: weight.data - 0.5 * (grads[weight] * 0.5) for weight in (w, b)}
    assert isinstance(_loss(w, b).train_blocking(HalvedSGD(0.5)), Success)
    assert seen  # its own in-place update ran
    for weight in (w, b):
        np.testing.assert_allclose(weight.data, expected[weight], rtol=1e-15)
    v = ml.ArrayWeight(np.full(1, np.finfo(np.float64).max / 2))
    before = v.data
    seen.clear()
    result = ml.sum(v * -2.0).train_blocking(HalvedSGD(1e308))  # a finite loss, an infinite update
    assert seen  # in place, the step's own check found the update infinite
    assert isinstance(result, Failure) and isinstance(result.failure(), ml.NonFiniteGradientError)
    assert v.data is before


@pytest.mark.parametrize(
    ("optimizer", "missing"), [(NoUpdate(), "update"), (NoInit(), "init"), ("sgd", "init and no update")]
)
def test_a_default_without_a_required_method_fails_the_step_naming_it(optimizer: Any, missing: str) -> None:
    w, b = _weights()
    before = w.data
    result = _loss(w, b).train_blocking(optimizer)
    assert isinstance(result, Failure)
    error = result.failure()
    assert type(error) is TypeError
    assert f"no {missing} method" in str(error) and "not an optimizer" in str(error)
    assert w.data is before and w.optimizer_state is None


def test_a_default_is_checked_before_the_forward_pass() -> None:
    # The loss's forward pass would fail (a shape error); the optimizer's error comes first.
    w = ml.ArrayWeight(np.ones((3, 2)))
    loss = ml.sum(ml.lift_array(np.ones((4, 4))) @ w)
    result = loss.train_blocking(NoUpdate())  # type: ignore[arg-type]
    assert isinstance(result, Failure) and type(result.failure()) is TypeError
    assert "no update method" in str(result.failure())


def test_a_weights_own_optimizer_without_a_required_method_fails_the_step_naming_it() -> None:
    w, b = _weights()
    own = ml.ArrayWeight(np.ones(2), optimizer=NoUpdate())  # type: ignore[arg-type]
    before = (w.data, b.data, own.data)
    result = (_loss(w, b) + ml.sum(own)).train_blocking(ml.SGD(0.1))
    assert isinstance(result, Failure) and type(result.failure()) is TypeError
    assert "no update method" in str(result.failure())
    assert (w.data, b.data, own.data) == before  # nothing committed


def test_apply_gradients_names_a_missing_method() -> None:
    w, b = _weights()
    _, grads = ml.compute_gradients(_loss(w, b))
    result = ml.apply_gradients(grads, NoInit())  # type: ignore[arg-type]
    assert isinstance(result, Failure) and type(result.failure()) is TypeError
    assert "no init method" in str(result.failure())


def test_a_chain_of_a_non_optimizer_names_the_missing_method() -> None:
    with pytest.raises(TypeError, match=r"chain: .* no update method"):
        ml.chain(ml.clip_by_value(1.0), NoUpdate())  # type: ignore[call-overload]
    with pytest.raises(TypeError, match=r"chain: .* not a gradient transformation"):
        ml.chain(object(), ml.SGD())  # type: ignore[call-overload]


def test_a_chain_around_a_users_optimizer_clips_then_applies_its_rule() -> None:
    w, b = _weights()
    optimizer = ml.chain(ml.clip_by_value(0.05), NormsSeen(0.01))
    _, grads = ml.compute_gradients(_loss(w, b))
    # The chain's transformations, then its optimizer's own (an inner chain's: last).
    expected = {
        weight: weight.data - 0.01 * np.sign(2.0 * np.clip(grads[weight], -0.05, 0.05)) for weight in (w, b)
    }
    assert isinstance(_loss(w, b).train_blocking(optimizer), Success)
    for weight in (w, b):
        np.testing.assert_array_equal(weight.data, expected[weight])
    assert optimizer.check_state(1, w.data) is None  # a user's optimizer without check_state: unchecked


def test_a_steps_passes_give_a_record_with_named_fields() -> None:
    w, b = _weights()
    passes = forward_and_backward(_loss(w, b), None)
    assert isinstance(passes, StepResult)
    loss, grads = ml.compute_gradients(_loss(w, b))
    assert passes.loss == loss
    assert set(passes.gradients) == {w, b} and passes.staged == {}
    for weight in (w, b):
        np.testing.assert_array_equal(passes.gradients[weight], grads[weight])  # the true gradients
    assert passes.owned <= {w, b}
    with pytest.raises(dataclasses.FrozenInstanceError):
        passes.loss = 0.0  # type: ignore[misc]


def test_sgd_gradients_are_the_true_gradients_in_a_step() -> None:
    # An optimizer of the user's own beside SGD's weights sees the true gradient of its weight,
    # whatever the other weights' optimizer.
    seen: list[Any] = []

    class Recording(SignDescent):
        def update(self, data: Any, gradient: Any, state: int) -> tuple[Any, int]:
            seen.append(np.array(gradient, copy=True))
            return super().update(data, gradient, state)

    w, b = _weights()
    b_own = ml.ArrayWeight(b.data, optimizer=Recording(0.01))
    _, grads = ml.compute_gradients(_loss(w, b_own))
    assert isinstance(_loss(w, b_own).train_blocking(ml.SGD(0.3)), Success)
    np.testing.assert_allclose(seen[0], grads[b_own], rtol=1e-15)
