"""Training: all-or-nothing steps, one update per weight per step, optimizers, FutureResult."""

from __future__ import annotations

import asyncio
import gc
import os
import pickle
import sys
import traceback
import warnings
from typing import Any

import numpy as np
import pytest
from cycles import cyclic_garbage
from hypothesis import given, settings
from hypothesis import strategies as st
from returns.io import IOSuccess
from returns.primitives.exceptions import UnwrapFailedError
from returns.result import Failure, Success

import monadl as ml
from monadl.do import steps
from monadl.do.primitive import Batching, Primitive
from monadl.dsl import fused
from monadl.dsl.core.layers import apply_array
from monadl.typeclasses.sparse import SparseRows


def _snapshot(*weights: ml.FloatWeight | ml.ArrayWeight) -> bytes:
    """Every weight's data and optimizer state, byte for byte."""

    def plain(x: Any) -> Any:
        if isinstance(x, np.ndarray):
            return (x.dtype.str, x.shape, x.tobytes())
        if isinstance(x, tuple):
            return tuple(plain(v) for v in x)
        return x

    return pickle.dumps([(plain(w.data), plain(w.optimizer_state)) for w in weights])


def _model() -> tuple[ml.ArrayWeight, ml.ArrayWeight, ml.FloatWeight]:
    rng = np.random.default_rng(0)
    return (
        ml.ArrayWeight(rng.standard_normal((4, 3))),
        ml.ArrayWeight(rng.standard_normal(3)),
        ml.FloatWeight(0.5),
    )


def _loss(w: ml.ArrayWeight, b: ml.ArrayWeight, s: ml.FloatWeight, x: ml.Array) -> ml.FloatLayer:
    return ml.sum(ml.tanh(x @ w + b) * s) ** 2.0


X = np.arange(8.0).reshape(2, 4) / 10.0


@pytest.mark.parametrize("optimizer", [ml.SGD(0.1), ml.Momentum(0.1), ml.Adam(0.01), ml.Adagrad(0.1)])
def test_failing_steps_change_nothing(optimizer: ml.Optimizer) -> None:
    w, b, s = _model()
    assert isinstance(_loss(w, b, s, X).train_blocking(optimizer), Success)  # optimizer state exists now
    before = _snapshot(w, b, s)

    # 1. An exception in the forward pass (a shape mismatch after the weights were used).
    bad_forward = _loss(w, b, s, X) + ml.sum(w @ np.ones((5, 2)))
    result = bad_forward.train_blocking(optimizer)
    assert isinstance(result, Failure)
    assert isinstance(result.failure(), ml.ShapeError)
    assert "matmul" in str(result.failure())
    assert _snapshot(w, b, s) == before

    # 2. An exception in the backward pass (a vjp that raises), after other deltas were computed.
    def broken_vjp(xp: Any, d: Any, o: Any, x: Any) -> Any:
        raise FloatingPointError("vjp exploded")

    broken = Primitive("broken", lambda xp, x: x * 1.0, (broken_vjp,))
    bad_backward = _loss(w, b, s, X) + ml.sum(apply_array(broken, b))
    result = bad_backward.train_blocking(optimizer)
    assert isinstance(result, Failure)
    assert isinstance(result.failure(), FloatingPointError)
    assert _snapshot(w, b, s) == before

    # 3. A non-finite loss.
    nan_loss = _loss(w, b, s, X) + ml.log(s * 0.0)
    result = nan_loss.train_blocking(optimizer)
    assert isinstance(result, Failure)
    assert isinstance(result.failure(), ml.NonFiniteLossError)
    assert "not finite" in str(result.failure())
    assert _snapshot(w, b, s) == before

    # And the model still trains afterwards.
    assert isinstance(_loss(w, b, s, X).train_blocking(optimizer), Success)
    assert _snapshot(w, b, s) != before


def test_a_weight_without_an_optimizer_fails_the_step_and_changes_nothing() -> None:
    w, b, s = _model()
    s.optimizer = ml.SGD(0.1)
    before = _snapshot(w, b, s)
    result = _loss(w, b, s, X).train_blocking()  # no default: w and b have no optimizer
    assert isinstance(result, Failure)
    assert isinstance(result.failure(), ml.NoOptimizerError)
    assert _snapshot(w, b, s) == before


def test_a_weight_used_several_times_gets_one_update_with_the_summed_delta() -> None:
    # Adam's first step moves each coordinate by about learning_rate, whatever the gradient's size:
    # one update with the summed delta moves it once; one update per use would move it three times.
    w = ml.FloatWeight(1.0)
    loss = w * 2.0 + w * 3.0 + w * 5.0
    assert loss.train_blocking(ml.Adam(learning_rate=0.1)) == Success(10.0)
    assert w.data == pytest.approx(0.9, abs=1e-6)
    m, v, t = w.optimizer_state[1] if w.optimizer_state else (None, None, None)
    assert t == 1
    assert m == pytest.approx(0.1 * 10.0)  # (1 - beta1) * the summed gradient
    assert v == pytest.approx(0.001 * 10.0**2)  # (1 - beta2) * its square


def test_per_weight_optimizer_overrides_the_default() -> None:
    a = ml.FloatWeight(1.0)
    b = ml.FloatWeight(1.0, optimizer=ml.SGD(0.5))
    assert isinstance((a * 1.0 + b * 1.0).train_blocking(ml.SGD(0.1)), Success)
    assert a.data == pytest.approx(0.9)
    assert b.data == pytest.approx(0.5)


def test_sgd_weight_decay_is_l2() -> None:
    w = ml.FloatWeight(2.0)
    assert isinstance((w * 0.0).train_blocking(ml.SGD(0.1, weight_decay=0.5)), Success)
    assert w.data == pytest.approx(2.0 - 0.1 * 0.5 * 2.0)


def test_momentum_accumulates_velocity() -> None:
    w = ml.FloatWeight(0.0)
    for _ in range(3):
        assert isinstance((w * 1.0).train_blocking(ml.Momentum(0.1, momentum=0.5)), Success)
    # velocities 1, 1.5, 1.75: w = -0.1 * (1 + 1.5 + 1.75)
    assert w.data == pytest.approx(-0.425)


def test_adagrad_divides_by_the_root_of_summed_squares() -> None:
    w = ml.ArrayWeight(np.zeros(2))
    for _ in range(2):
        assert isinstance(ml.sum(w * np.array([1.0, -2.0])).train_blocking(ml.Adagrad(0.1)), Success)
    expected = -0.1 * np.array([1.0, -2.0]) / np.array([1.0, 2.0]) * (1 + 1 / np.sqrt(2))
    np.testing.assert_allclose(w.data, expected, rtol=1e-7)


@settings(max_examples=60, deadline=None)
@given(
    dtype=st.sampled_from([np.float32, np.float64]),
    shape=st.sampled_from([(1,), (5,), (3, 4), (2, 3, 5), (300, 130)]),
    seed=st.integers(0, 2**32 - 1),
    weight_decay=st.sampled_from([0.0, 0.01]),
    rate=st.floats(1e-4, 1.0),
)
def test_adagrads_dense_numpy_update_is_its_rule_bit_for_bit(
    dtype: type[np.floating[Any]], shape: tuple[int, ...], seed: int, weight_decay: float, rate: float
) -> None:
    """NumPy arrays of one kind are updated by a path of fewer arrays: the same bits as the rule as
    written (``total + g * g``, ``data - rate * g / (total ** 0.5 + epsilon)``), zeros and all, and
    its inputs unchanged."""
    rng = np.random.default_rng(seed)
    data, g = (rng.standard_normal(shape).astype(dtype) for _ in range(2))
    total = np.abs(rng.standard_normal(shape)).astype(dtype)
    total.reshape(-1)[::3] = 0.0  # a coordinate never moved before
    g.reshape(-1)[1::4] = 0.0
    held = [x.copy() for x in (data, g, total)]
    optimizer = ml.Adagrad(rate, weight_decay=weight_decay)
    new, (new_total, step) = optimizer.update(data, g, (total, 3))
    decayed = g + weight_decay * data if weight_decay else g
    expected_total = total + decayed * decayed
    expected = data - rate * decayed / (expected_total**0.5 + optimizer.epsilon)
    assert step == 4 and new.dtype == dtype and new_total.dtype == dtype
    np.testing.assert_array_equal(new_total, expected_total, strict=True)
    np.testing.assert_array_equal(new, expected, strict=True)
    for before, now in zip(held, (data, g, total), strict=True):
        np.testing.assert_array_equal(before, now)


@pytest.mark.parametrize("kwargs", [{"learning_rate": 0.0}, {"learning_rate": 0.1, "weight_decay": -1.0}])
def test_optimizers_reject_bad_hyper_parameters(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="must be"):
        ml.SGD(**kwargs)


def test_training_is_deterministic_with_a_parallel_pool() -> None:
    def run(workers: int) -> bytes:
        weights = [ml.ArrayWeight.normal((16, 16), seed=i) for i in range(4)]
        x = np.random.default_rng(7).standard_normal((8, 16))
        # Four independent columns, summed: their kernels run concurrently on the pool.
        with ml.Executor(workers, min_pool_cost=0) as ex:
            for _ in range(5):
                columns = [ml.tanh(x @ w) for w in weights]
                total = columns[0] + columns[1] + columns[2] + columns[3]
                assert isinstance(ml.mean(total * total).train_blocking(ml.Adam(0.01), executor=ex), Success)
        return _snapshot(*weights)

    assert run(1) == run(2) == run(2)


def test_loss_decreases_on_a_regression() -> None:
    rng = np.random.default_rng(1)
    x = rng.standard_normal((32, 3))
    y = x @ np.array([1.0, -2.0, 0.5]) + 0.3
    w = ml.ArrayWeight(np.zeros(3))
    b = ml.FloatWeight(0.0)
    losses = [ml.mean((x @ w + b - y) ** 2.0).train_blocking(ml.SGD(0.1)).unwrap() for _ in range(200)]
    assert losses[-1] < 1e-3 * losses[0]
    np.testing.assert_allclose(w.data, [1.0, -2.0, 0.5], atol=1e-2)


def test_a_loss_of_many_elements_is_refused_naming_its_shape_and_changes_nothing() -> None:
    w = ml.ArrayWeight(np.array([1.0, 2.0]))
    result = (w * 3.0).train_blocking(ml.SGD(0.1))
    assert isinstance(result, Failure)
    error = result.failure()
    assert isinstance(error, ValueError)
    assert "one number" in str(error) and "(2,)" in str(error)
    np.testing.assert_array_equal(w.data, [1.0, 2.0])
    with pytest.raises(ValueError, match=r"one number.*\(2,\)"):
        ml.compute_gradients(w * 3.0)


def test_a_loss_of_one_element_trains_as_its_number() -> None:
    w = ml.ArrayWeight(np.array([[1.0]]))
    result = (w * 3.0).train_blocking(ml.SGD(0.1))
    np.testing.assert_array_equal(result.unwrap(), [[3.0]])
    np.testing.assert_allclose(w.data, [[0.7]])


def test_compute_gradients_gives_true_gradients_whatever_the_weights_optimizers() -> None:
    w = ml.ArrayWeight(np.array([1.0, 2.0]), optimizer=ml.SGD(0.1))
    v = ml.FloatWeight(3.0, optimizer=ml.SGD(0.1))
    _, grads = ml.compute_gradients(ml.sum(w * w) * v)
    np.testing.assert_allclose(grads[w], [6.0, 12.0])
    assert grads[v] == pytest.approx(5.0)


def test_train_and_predict_are_future_results() -> None:
    w = ml.FloatWeight(1.0)
    loss = w * w

    async def steps() -> tuple[Any, Any, Any]:
        prediction = await loss.predict().awaitable()
        step = loss.train(ml.SGD(0.25))
        first = await step.awaitable()
        again = await step.awaitable()  # awaiting the same step twice does not train twice
        return prediction, first, again

    prediction, first, again = asyncio.run(steps())
    assert prediction == IOSuccess(1.0)
    assert first == again == IOSuccess(1.0)
    assert w.data == pytest.approx(0.5)


def test_a_failed_future_result_holds_the_exception() -> None:
    w = ml.ArrayWeight(np.ones(2))
    bad = ml.sum(w @ np.ones((3, 3)))
    result = asyncio.run(bad.train(ml.SGD(0.1)).awaitable())
    assert "matmul" in str(result.failure()._inner_value)
    np.testing.assert_array_equal(w.data, np.ones(2))


def test_a_step_leaves_no_reference_cycles() -> None:
    """A step's tapes and arrays are freed as soon as it ends, not at the next garbage collection
    (otherwise memory grows between steps and every step page-faults fresh memory)."""
    w = ml.ArrayWeight(np.ones((4, 4)))
    loss = ml.sum(ml.tanh(w @ w) * w)
    assert isinstance(loss.train_blocking(ml.SGD(0.1)), Success)

    def good_and_bad_steps() -> None:
        assert isinstance(loss.train_blocking(ml.SGD(0.1)), Success)
        bad_step = (loss + ml.sum(w @ np.ones((3, 3)))).train_blocking(ml.SGD(0.1))
        assert isinstance(bad_step, Failure)
        del bad_step  # its traceback reaches this frame (f_back): Python's own exception cycle

    assert cyclic_garbage(good_and_bad_steps) == []


def test_the_allocator_is_tuned_on_glibc() -> None:
    from monadl.runtime.process import tune_allocator

    assert tune_allocator() == (
        sys.platform.startswith("linux") and os.environ.get("MONADL_TUNE_MALLOC") != "0"
    )


def test_weights_and_gradients_are_not_aliased() -> None:
    b1, b2 = ml.ArrayWeight(np.zeros((2, 2))), ml.ArrayWeight(np.zeros((2, 2)))
    _, gradients = ml.compute_gradients(ml.sum((ml.lift_array(np.ones((2, 2))) + b1) + b2))
    np.testing.assert_array_equal(gradients[b1], gradients[b2])
    assert gradients[b1] is not gradients[b2]  # add passed one delta to both: each gets its own
    value = ml.lift_array(b1).predict_blocking().unwrap()
    with pytest.raises(ValueError, match="read-only"):
        value[0, 0] = 5.0  # the prediction is the weight's data: it cannot be changed in place
    assert isinstance(ml.sum(b1 * 2.0).train_blocking(ml.SGD(0.1)), Success)
    assert not b1.data.flags.writeable  # still read-only after an update


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_sgd_update_owned_is_update_bit_for_bit(dtype: type[np.floating[Any]]) -> None:
    rng = np.random.default_rng(1)
    data = rng.standard_normal((7, 5)).astype(dtype)
    gradient = rng.standard_normal((7, 5)).astype(dtype)
    expected, _ = ml.SGD(0.03).update(data, gradient, None)
    got, _ = ml.SGD(0.03).update_owned(data, gradient.copy(), None)
    assert got.dtype == expected.dtype == dtype
    np.testing.assert_array_equal(got, expected)


@pytest.fixture
def handed(monkeypatch: pytest.MonkeyPatch) -> list[np.ndarray]:
    """The gradients SGD is given to write its updates into (a step's own: ``update_owned_checked``,
    its in-place update that says whether the result is finite), in order."""
    given: list[np.ndarray] = []
    update_owned_checked = ml.SGD.update_owned_checked

    def spy_owned(self: ml.SGD, data: Any, gradient: Any, state: None) -> tuple[Any, Any, bool | None]:
        given.append(gradient)
        return update_owned_checked(self, data, gradient, state)

    monkeypatch.setattr(ml.SGD, "update_owned_checked", spy_owned)
    return given


def test_a_step_writes_sgd_updates_into_its_own_gradients(handed: list[np.ndarray]) -> None:
    # SGD declares update_owned: the step hands it the gradient it owns, and the new data is
    # written into the gradient's memory.
    rng = np.random.default_rng(2)
    w = ml.ArrayWeight(rng.standard_normal((4, 3)))
    loss = ml.sum(ml.tanh(X @ w))
    _, gradients = ml.compute_gradients(loss)
    expected = w.data - 0.1 * gradients[w]
    assert isinstance(loss.train_blocking(ml.SGD(0.1)), Success)
    assert len(handed) == 1
    assert w.data is handed[0]  # the new data lives in the gradient's memory: nothing allocated
    np.testing.assert_allclose(w.data, expected, rtol=1e-14)
    assert not w.data.flags.writeable


def test_stacked_weights_and_their_biases_take_updates_in_their_own_gradients(
    handed: list[np.ndarray],
) -> None:
    # Weights stacked as the CIFAR noskip model holds its 20 classifiers: a matmul that broadcasts
    # x against (k, n, m), and a bias (k, 1, m). Their gradients come out of a broadcast matmul's
    # vjp and an unbroadcast sum; both must own their memory, or each step allocates two arrays.
    rng = np.random.default_rng(3)
    w = ml.ArrayWeight(rng.standard_normal((5, 4, 2)))  # X is (2, 4)
    b = ml.ArrayWeight(rng.standard_normal((5, 1, 2)))
    loss = ml.sum(ml.tanh(X @ w + b))
    _, gradients = ml.compute_gradients(loss)
    expected = {weight: weight.data - 0.1 * gradients[weight] for weight in (w, b)}
    assert isinstance(loss.train_blocking(ml.SGD(0.1)), Success)
    assert len(handed) == 2
    assert {id(w.data), id(b.data)} == {id(g) for g in handed}
    for weight in (w, b):
        np.testing.assert_allclose(weight.data, expected[weight], rtol=1e-14)


@pytest.mark.parametrize("own", [False, True], ids=["one optimizer", "two optimizers"])
def test_a_gradient_held_elsewhere_is_not_written_into(handed: list[np.ndarray], own: bool) -> None:
    # A primitive of the user's own whose vjp hands out an array its author keeps (scaled by the
    # delta, as a vjp is): the gradient is that array. Only the library's own primitives declare
    # their vjps' arrays fresh, so it is never written into.
    kept = np.full((2, 2), 0.5)
    hold = Primitive(
        "hold", lambda xp, x: x * 1.0, (lambda xp, d, o, x: kept if np.all(d == 1.0) else kept * d,)
    )
    w = ml.ArrayWeight(np.ones((2, 2)))
    other = ml.FloatWeight(1.0, optimizer=ml.SGD(0.2) if own else None)
    loss = ml.sum(apply_array(hold, w)) + other * 0.0
    assert isinstance(loss.train_blocking(ml.SGD(0.1)), Success)
    np.testing.assert_array_equal(kept, np.full((2, 2), 0.5))
    np.testing.assert_allclose(w.data, np.full((2, 2), 0.95), rtol=1e-14)
    assert all(g is not kept for g in handed)


@pytest.mark.parametrize(
    "optimizer", [ml.SGD(0.1), ml.Momentum(0.1), ml.Adagrad(0.1), ml.Adam(0.1)], ids=repr
)
@pytest.mark.parametrize("sparse", [False, True])
def test_a_step_keeps_the_weights_dtype_whatever_the_inputs(optimizer: Any, sparse: bool) -> None:
    # float64 inputs give a float32 weight a float64 gradient: the weight and its optimizer's
    # state stay float32, and the update is the float32 weight's (the gradient rounded first).
    weight = ml.ArrayWeight(np.ones((5, 2), dtype=np.float32))
    used = ml.take_rows(weight, [1, 2]) if sparse else weight
    inputs = np.full((2, 2) if sparse else (5, 2), 0.1)  # float64
    loss = ml.sum(used * inputs)
    for _ in range(2):  # the second step uses the state the first left
        assert isinstance(loss.train_blocking(optimizer), Success)
        assert weight.data.dtype == np.float32
    assert weight.optimizer_state is not None
    state = weight.optimizer_state[1]
    for part in state if isinstance(state, tuple) else (state,):
        if isinstance(part, np.ndarray):
            assert part.dtype == np.float32


class UsersOwnError(ValueError):
    """A user's exception, of a type the library also catches (ValueError)."""


@pytest.mark.parametrize("batching", [True, False])
def test_a_users_value_error_in_a_forward_reaches_the_caller_as_itself(batching: bool) -> None:
    # The library reports NumPy's ValueErrors about its own ops' operands as ShapeErrors naming the
    # op; a primitive of the user's own raises what it raises, its traceback included.
    def picky(xp: Any, x: Any) -> Any:
        if np.any(x > 1.0):
            raise UsersOwnError("picky: values above 1 are not accepted here")
        return x * 1.0

    prim = Primitive("picky", picky, (lambda xp, d, o, x: d,), batch=Batching(elementwise=True))
    w = ml.ArrayWeight(np.full((2, 2), 2.0))
    before = w.data.copy()
    loss = ml.add_n([ml.sum(apply_array(prim, w * float(k))) for k in range(1, 4)])  # merged calls
    result = loss.train_blocking(ml.SGD(0.1), executor=ml.Executor(batching=batching))
    assert isinstance(result, Failure)
    error = result.failure()
    assert type(error) is UsersOwnError and not isinstance(error, ml.ShapeError)
    assert str(error) == "picky: values above 1 are not accepted here"
    assert error.__traceback__ is not None
    frames = [frame.f_code.co_name for frame, _ in traceback.walk_tb(error.__traceback__)]
    assert frames[-1] == "picky"
    np.testing.assert_array_equal(w.data, before)


def test_the_librarys_own_ops_still_name_themselves_when_operands_do_not_fit() -> None:
    a = ml.ArrayWeight(np.ones((2, 3)))
    result = (a + np.ones((4, 5))).predict_blocking(executor=ml.Executor())
    assert isinstance(result, Failure)
    assert isinstance(result.failure(), ml.ShapeError)
    assert str(result.failure()).startswith("add:")


def _scaled_rows(w_vjp: Any) -> Primitive:
    """``x * w`` of a (4, 4) ``x`` and a (4, 1) ``w``, with ``w``'s vjp given (a user's primitive)."""
    return Primitive(
        "scaled_rows",
        lambda xp, x, w: x * w,
        (lambda xp, d, o, x, w: d * w, w_vjp),
        batch=Batching(elementwise=True),
    )


@pytest.mark.parametrize("batching", [True, False])
@pytest.mark.parametrize(
    ("w_vjp", "gave"),
    [
        (lambda xp, d, o, x, w: d * x, "an array of shape"),  # forgot to sum over the columns
        (lambda xp, d, o, x, w: None, "None"),
        (lambda xp, d, o, x, w: (d * x).sum(axis=-1, keepdims=True).astype(np.int64), "dtype int64"),
    ],
)
def test_a_users_vjp_of_the_wrong_shape_or_kind_is_a_shape_error_and_changes_nothing(
    batching: bool, w_vjp: Any, gave: str
) -> None:
    prim = _scaled_rows(w_vjp)
    w = ml.ArrayWeight(np.ones((4, 1)))
    before = w.data.copy()
    x = np.arange(16.0).reshape(4, 4)
    loss = ml.add_n([ml.sum(apply_array(prim, x * float(k), w)) for k in range(1, 4)])
    result = loss.train_blocking(ml.SGD(0.1), executor=ml.Executor(batching=batching))
    assert isinstance(result, Failure)
    error = result.failure()
    assert isinstance(error, ml.ShapeError), error
    assert str(error).startswith("scaled_rows: the vjp of input 1 gave ") and gave in str(error)
    assert "(4, 1)" in str(error)
    np.testing.assert_array_equal(w.data, before)


@pytest.mark.parametrize("batching", [True, False])
def test_a_users_vjp_of_the_right_shape_trains(batching: bool) -> None:
    prim = _scaled_rows(lambda xp, d, o, x, w: (d * x).sum(axis=-1, keepdims=True))
    w = ml.ArrayWeight(np.ones((4, 1)))
    x = np.arange(16.0).reshape(4, 4)
    loss = ml.add_n([ml.sum(apply_array(prim, x * float(k), w)) for k in range(1, 4)])
    assert isinstance(loss.train_blocking(ml.SGD(0.01), executor=ml.Executor(batching=batching)), Success)
    np.testing.assert_allclose(w.data, 1.0 - 0.01 * 6.0 * x.sum(axis=1, keepdims=True), rtol=1e-12)


@pytest.mark.parametrize("replay", [True, False])
def test_a_users_broadcasting_vjp_is_summed_back_on_every_run(replay: bool) -> None:
    # An op that ``broadcasts`` has its vjps' results summed back to the inputs' shapes, whatever
    # shape they come in; a weight of the result's shape included, on the first run and on replays.
    prim = Primitive(
        "spread",
        lambda xp, x, w: x * w,
        (lambda xp, d, o, x, w: d * w, lambda xp, d, o, x, w: xp.broadcast_to(d * x, (2, *d.shape)) * 0.5),
        True,
    )
    w = ml.ArrayWeight(np.ones((2, 3)))
    x = np.arange(6.0).reshape(2, 3)
    executor = ml.Executor(replay=replay)
    for step in range(3):
        loss = ml.sum(apply_array(prim, x, w))
        assert isinstance(loss.train_blocking(ml.SGD(0.1), executor=executor), Success)
        assert w.data.shape == (2, 3)
        np.testing.assert_allclose(w.data, 1.0 - 0.1 * (step + 1) * x, rtol=1e-12)


# A finite loss with a gradient of NaN or infinity fails and changes nothing.


@pytest.mark.parametrize("optimizer", [ml.SGD(0.1), ml.Adam(0.1), ml.Momentum(0.1, 0.9), ml.Adagrad(0.1)])
def test_a_non_finite_gradient_fails_the_step_and_names_the_weight(optimizer: ml.Optimizer) -> None:
    w = ml.ArrayWeight(np.zeros(3), name="w")
    v = ml.ArrayWeight(np.ones(2), name="v")
    loss = ml.sum(ml.sqrt(w)) + ml.sum(v * v)  # the loss is 2.0; d sqrt(w) / dw at 0 is infinite
    before = (w.data, w.optimizer_state, v.data, v.optimizer_state)
    result = loss.train_blocking(optimizer)
    assert isinstance(result, Failure)
    error = result.failure()
    assert isinstance(error, ml.NonFiniteGradientError) and isinstance(error, ArithmeticError)
    assert "name='w'" in str(error) and "(3,)" in str(error) and "gradient is not finite" in str(error)
    assert (
        error.origin == "the vjp of sqrt"
        and "the first non-finite delta came from the vjp of sqrt" in str(error)
    )
    assert (w.data, w.optimizer_state, v.data, v.optimizer_state) == before  # v untouched too


def test_every_kind_of_step_names_what_it_runs() -> None:
    # The origin of a non-finite delta names the step's kind ("the vjp of stack"), not its class.
    kinds = [c for c in vars(steps).values() if isinstance(c, type) and issubclass(c, steps.Step)]
    assert steps.StackStep in kinds and len(kinds) > 5
    for kind in kinds:
        if kind is not steps.Step:
            assert "name" in vars(kind), f"{kind.__name__} does not name what it runs"


def test_a_non_finite_float_weight_and_table_rows_fail_the_step() -> None:
    s = ml.FloatWeight(0.0, name="s")
    result = ml.sqrt(s * 1.0).train_blocking(ml.SGD(0.1))
    assert isinstance(result, Failure) and isinstance(result.failure(), ml.NonFiniteGradientError)
    assert s.data == 0.0 and "name='s'" in str(result.failure())
    table = ml.ArrayWeight(np.zeros((5, 2)), name="table")
    rows = ml.take_rows(table, np.array([1, 3]))
    result = ml.sum(ml.sqrt(rows)).train_blocking(ml.SGD(0.1))  # a sparse gradient, its rows infinite
    assert isinstance(result, Failure) and isinstance(result.failure(), ml.NonFiniteGradientError)
    np.testing.assert_array_equal(table.data, np.zeros((5, 2)))


def test_a_finite_update_of_huge_values_passes_the_check() -> None:
    # The check's dot product overflows for values near the float64 limit: it then looks at each.
    w = ml.ArrayWeight(np.full(4, 1e200))
    assert isinstance(ml.sum(w * 1.0).train_blocking(ml.SGD(1.0)), Success)
    np.testing.assert_array_equal(w.data, np.full(4, 1e200) - 1.0)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("kernels", [True, False])
def test_an_update_that_overflows_fails_the_step_and_changes_nothing(
    dtype: Any, kernels: bool, handed: list[np.ndarray], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A finite gradient whose update overflows: SGD writes it into the step's own gradient (the
    # native kernel reads each new value as it writes it, where it is built; the step reads them
    # where it is not), and either way the step fails naming the weight and changes no weight.
    if not kernels:
        monkeypatch.setattr(fused, "NATIVE", None)
    top = float(np.finfo(dtype).max)
    w = ml.ArrayWeight(np.full(1, top / 2, dtype=dtype), name="w")
    v = ml.ArrayWeight(np.ones(3, dtype=dtype), name="v", optimizer=ml.SGD(0.1))
    before = (w.data, v.data, w.optimizer_state, v.optimizer_state)
    loss = ml.sum(w * -2.0) + ml.sum(v * v)  # finite: -top + 3
    with np.errstate(over="ignore"):  # (the NumPy rule's product overflows, as it should)
        result = loss.train_blocking(ml.SGD(top))  # w's update: top / 2 + 2 * top
    assert isinstance(result, Failure)
    error = result.failure()
    assert isinstance(error, ml.NonFiniteGradientError) and "name='w'" in str(error)
    assert any(g.shape == (1,) for g in handed)  # w's update in place: checked by what SGD said
    assert (w.data, v.data, w.optimizer_state, v.optimizer_state) == before


def test_check_finite_off_applies_a_non_finite_step() -> None:
    w = ml.ArrayWeight(np.zeros(3))
    result = ml.sum(ml.sqrt(w)).train_blocking(ml.SGD(0.1), executor=ml.Executor(check_finite=False))
    assert isinstance(result, Success)
    assert np.all(np.isneginf(w.data))


def test_a_float32_weight_gets_a_float32_gradient_from_a_graph_that_promotes_to_float64() -> None:
    w = ml.ArrayWeight(np.ones((2, 3), dtype=np.float32))
    table = ml.ArrayWeight(np.ones((5, 3), dtype=np.float32))
    c = np.linspace(0.1, 0.6, 6).reshape(2, 3)  # float64: the products are float64
    loss = ml.sum(w * c) + ml.sum(table[np.array([1, 3])] * c)
    _, grads = ml.compute_gradients(loss)
    assert grads[w].dtype == np.float32
    np.testing.assert_array_equal(grads[w], c.astype(np.float32))
    rows = grads[table]
    assert isinstance(rows, SparseRows) and rows.values.dtype == np.float32
    expected = np.zeros((5, 3), dtype=np.float32)
    expected[[1, 3]] = c
    np.testing.assert_array_equal(rows.to_dense(), expected)
    assert loss.train_blocking(ml.Adam(0.1)).unwrap() == pytest.approx(2 * c.sum())
    assert w.data.dtype == np.float32 and table.data.dtype == np.float32


TERMS = ("add", "sub", "scale", "matmul", "reshape", "concatenate", "twice")


def _mixed_loss(
    weights: list[ml.ArrayWeight], terms: list[tuple[str, int, int]], c: np.ndarray
) -> ml.FloatLayer:
    """A sum of terms that pass deltas through unchanged (``+``), as views (``reshape``, a
    concatenation's), promoted (a float64 constant against a float32 weight) and as deferred
    products (``c @ w``)."""
    total: ml.FloatLayer | float = 0.0
    for op, i, j in terms:
        a, b = weights[i], weights[j]
        if op == "add":
            term: ml.ArrayLayer = a + b
        elif op == "scale":
            term = a * c
        elif op == "matmul":
            term = ml.lift_array(c) @ a
        elif op == "sub":
            term = a - b
        elif op == "reshape":
            term = ml.reshape(a, (9,)) + ml.reshape(b, (9,))
        elif op == "concatenate":  # its deltas are views of one array
            term = ml.concatenate([a, b])
        else:
            term = a + a
        total = total + ml.sum(term)
    assert isinstance(total, ml.FloatLayer)
    return total


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from(TERMS), st.integers(0, 3), st.integers(0, 3)), min_size=1, max_size=6),
    st.lists(st.sampled_from([np.float32, np.float64]), min_size=4, max_size=4),
    st.integers(0, 2**32 - 1),
)
def test_each_gradient_is_its_weights_own_and_of_its_dtype(
    terms: list[tuple[str, int, int]], dtypes: list[type[np.floating[Any]]], seed: int
) -> None:
    rng = np.random.default_rng(seed)
    datas = [rng.standard_normal((3, 3)).astype(dtype) for dtype in dtypes]
    c = rng.standard_normal((3, 3))  # float64
    weights = [ml.ArrayWeight(d) for d in datas]
    wide = [ml.ArrayWeight(d.astype(np.float64)) for d in datas]  # the same graph, all float64
    _, grads = ml.compute_gradients(_mixed_loss(weights, terms, c))
    _, want = ml.compute_gradients(_mixed_loss(wide, terms, c))
    for w, w64 in zip(weights, wide, strict=True):
        if w64 in want:
            assert grads[w].dtype == w.data.dtype
            np.testing.assert_allclose(grads[w], want[w64], rtol=1e-5, atol=1e-5)
    held = list(grads.values())
    for k, g in enumerate(held):
        for other in held[k + 1 :]:
            assert not np.shares_memory(g, other)
    # An optimizer writes its update into a gradient of the step's own: each weight's is its own.
    assert isinstance(_mixed_loss(weights, terms, c).train_blocking(ml.SGD(0.5)), Success)
    for w, d in zip(weights, datas, strict=True):
        g = grads.get(w)
        np.testing.assert_allclose(w.data, d if g is None else d - 0.5 * g, rtol=1e-5, atol=1e-5)


def test_a_training_step_never_awaited_warns_that_it_never_ran() -> None:
    w = ml.FloatWeight(1.0)
    step = (w * w).train(ml.SGD(0.25))
    with pytest.warns(RuntimeWarning, match=r"training step.*never awaited"):
        del step
        gc.collect()
    assert w.data == 1.0


def test_an_awaited_training_step_or_an_unawaited_prediction_does_not_warn() -> None:
    w = ml.FloatWeight(1.0)

    async def step() -> None:
        await (w * w).train(ml.SGD(0.25)).awaitable()

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        asyncio.run(step())
        prediction = (w * w).predict()
        del prediction
        gc.collect()
    assert w.data == pytest.approx(0.5)


def test_unwrapping_a_failed_step_names_the_error_on_the_tracebacks_last_line() -> None:
    a, b = ml.ArrayWeight(np.zeros((3, 4))), ml.ArrayWeight(np.zeros((5, 2)))
    result = ml.sum(ml.matmul(a, b)).train_blocking(ml.SGD(0.1))
    assert isinstance(result, Failure)
    error = result.failure()
    assert isinstance(error, ml.ShapeError)
    assert result == Failure(error) and repr(result).startswith("<Failure: ")
    with pytest.raises(UnwrapFailedError) as raised:
        result.unwrap()
    assert raised.value.__cause__ is error
    last = traceback.format_exception(raised.value)[-1]
    assert "ShapeError" in last and "(3, 4)" in last and "(5, 2)" in last


def test_names_removed_before_the_deprecation_policy_fail_naming_their_replacement() -> None:
    with pytest.raises(TypeError, match=r"planning=.*removed.*replay="):
        ml.Executor(planning=True)
    with pytest.raises(AttributeError, match=r"planned was removed.*replayed"):
        _ = ml.Executor().last_stats.planned
    w = ml.FloatWeight(1.0)
    with pytest.raises(AttributeError, match=r"optimizer_state cannot be assigned.*ml\.load"):
        w.optimizer_state = (ml.SGD(0.1), 0)
