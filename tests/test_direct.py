"""Direct style: @direct async functions, await on layers, parallel awaits, clear errors."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import numpy as np
import pytest
from returns.result import Failure, Success

import monadl as ml
from monadl.do.do import Kernel
from monadl.tape import Tape


def _counted(layer: ml.ArrayLayer, counter: list[int]) -> ml.ArrayLayer:
    def count(tape: Tape[ml.Array, ml.Array]) -> Tape[ml.Array, ml.Array]:
        counter.append(1)
        return tape

    return ml.ArrayLayer(layer.forward.map(count))


def test_await_gives_the_forward_data_shared_with_later_uses() -> None:
    w = ml.ArrayWeight(np.array([1.0, -2.0, 3.0]))
    evaluations: list[int] = []
    hidden = _counted(ml.tanh(w * 0.5), evaluations)

    @ml.direct
    async def network() -> ml.FloatLayer:
        values = await hidden
        assert isinstance(values, np.ndarray)
        # Ordinary control flow on the awaited value, then a differentiable use of the same layer.
        return ml.sum(hidden * 2.0) if float(values.sum()) > 0 else ml.sum(hidden * -1.0)

    loss, gradients = ml.compute_gradients(network())
    assert evaluations == [1]
    expected = np.tanh(w.data * 0.5)
    assert loss == pytest.approx(2.0 * expected.sum())
    np.testing.assert_allclose(gradients[w], 2.0 * 0.5 * (1.0 - expected**2))


def test_awaiting_a_float_layer_gives_a_float() -> None:
    w = ml.FloatWeight(2.0)

    @ml.direct
    async def f() -> ml.FloatLayer:
        value = await (w * 3.0)
        assert type(value) is float
        return w * value

    assert f().predict_blocking() == Success(12.0)


def test_direct_style_gives_the_same_gradients_as_the_plain_expression() -> None:
    w = ml.ArrayWeight(np.array([[0.5, -1.0], [2.0, 0.25]]))
    x = np.array([1.0, 2.0])

    @ml.direct
    async def f() -> ml.FloatLayer:
        h = ml.sigmoid(x @ w)
        await h
        return ml.sum(h * h)

    direct_loss, direct_gradients = ml.compute_gradients(f())
    plain_loss, plain_gradients = ml.compute_gradients(ml.sum(ml.sigmoid(x @ w) * ml.sigmoid(x @ w)))
    assert direct_loss == pytest.approx(plain_loss)
    np.testing.assert_allclose(direct_gradients[w], plain_gradients[w])


def test_awaiting_several_layers_at_once_evaluates_them_concurrently() -> None:
    barrier = threading.Barrier(2, timeout=5)

    def meeting_layer(value: float) -> ml.FloatLayer:
        def compute() -> Tape[float, float]:
            barrier.wait()
            return Tape(value)

        return ml.FloatLayer(Kernel(compute, (), cost=1e12))

    a, b = meeting_layer(1.0), meeting_layer(2.0)

    @ml.direct
    async def both() -> ml.FloatLayer:
        x, y = await ml.parallel(a, b)
        assert (x, y) == (1.0, 2.0)
        return a + b  # the same tapes again: no second evaluation, so no second barrier

    with ml.Executor(2) as ex:
        assert both().predict_blocking(executor=ex) == Success(3.0)
    barrier.reset()
    with ml.Executor(1) as ex:  # sequential: the first kernel waits alone at the barrier
        result = both().predict_blocking(executor=ex)
    assert isinstance(result, Failure)
    assert isinstance(result.failure(), threading.BrokenBarrierError)


def test_the_coroutine_runs_again_in_every_run() -> None:
    runs: list[int] = []
    w = ml.FloatWeight(1.0)

    @ml.direct
    async def f() -> ml.FloatLayer:
        runs.append(1)
        return w * 2.0

    layer = f()
    for _ in range(3):
        assert isinstance(layer.train_blocking(ml.SGD(0.1)), Success)
    assert len(runs) == 3
    assert w.data == pytest.approx(1.0 - 3 * 0.2)


def test_awaiting_a_foreign_awaitable_is_a_clear_error() -> None:
    @ml.direct
    async def f() -> ml.FloatLayer:
        await asyncio.sleep(0)
        return ml.lift(1.0)

    result = f().predict_blocking()
    assert isinstance(result, Failure)
    assert isinstance(result.failure(), TypeError)
    assert "can only await layers, weights and Do values" in str(result.failure())


def test_a_plain_function_under_direct_is_rejected() -> None:
    def plain() -> ml.FloatLayer:
        return ml.lift(1.0)

    with pytest.raises(TypeError, match="must be an 'async def' function"):
        ml.direct(plain)  # type: ignore[arg-type]


def test_the_return_annotation_must_name_a_layer_type() -> None:
    async def untyped() -> Any:
        return 1.0

    with pytest.raises(TypeError, match="annotated to return FloatLayer or ArrayLayer"):
        ml.direct(untyped)


def test_returning_the_wrong_kind_is_a_clear_error() -> None:
    @ml.direct
    async def f() -> ml.FloatLayer:
        return ml.ArrayWeight(np.ones(2)) * 1.0  # type: ignore[return-value]

    result = f().predict_blocking()
    assert isinstance(result, Failure)
    assert "returned ArrayLayer, but is annotated to return FloatLayer" in str(result.failure())


def test_a_layer_has_no_truth_value() -> None:
    with pytest.raises(TypeError, match="await it"):
        bool(ml.FloatWeight(1.0) * 2.0)
