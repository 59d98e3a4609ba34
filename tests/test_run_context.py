"""The run context: an op's mode, random streams and staged buffer updates, given as an argument.

Dropout, batch norm and a ``custom_op(context=True)`` read the run's context, never the calling
thread's state: on an executor whose every kernel goes to the pool they run on a worker thread and
still drop (or normalise by the batch) in training only, and a step's staged running statistics are
committed once if it succeeds and not at all if it fails.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from returns.pipeline import is_successful

import monadl as ml
from monadl.do.context import RunContext
from monadl.do.primitive import ELEMENTWISE, Primitive
from monadl.dsl.ops.batch_norm import BATCH_NORM
from monadl.nn import BatchNorm1d
from monadl.nn.dropout import DROPOUT


@pytest.fixture
def pool(monkeypatch: pytest.MonkeyPatch) -> Iterator[ml.Executor]:
    """Two workers, every kernel worth the pool, and the calling thread never running a queued
    kernel itself while it waits (as it may): every kernel runs on a worker."""
    with ml.Executor(2, min_pool_cost=0.0) as executor:
        assert executor.pool is not None
        monkeypatch.setattr(executor.pool, "run_own_jobs", lambda done: None)
        yield executor


class ThreadSpy:
    """Wraps a primitive's forward, noting the thread of each call; and gives it a cost that puts
    it on the pool (whatever its own)."""

    def __init__(self, prim: Primitive, monkeypatch: pytest.MonkeyPatch) -> None:
        self.threads: list[int] = []
        forward = prim.forward
        monkeypatch.setattr(prim, "cost", lambda *_, **__: 1.0)

        def spy(*args: Any, **kwargs: Any) -> Any:
            self.threads.append(threading.get_ident())
            return forward(*args, **kwargs)

        monkeypatch.setattr(prim, "forward", spy)

    def ran_on_workers(self) -> bool:
        return bool(self.threads) and threading.get_ident() not in self.threads


def test_dropout_on_a_worker_drops_in_training_and_not_in_a_prediction(
    pool: ml.Executor, monkeypatch: pytest.MonkeyPatch
) -> None:
    spy = ThreadSpy(DROPOUT, monkeypatch)
    w = ml.ArrayWeight(np.ones((30, 30)))
    drop = ml.Dropout(0.5, seed=3)
    loss = ml.sum(drop(w))
    rng = np.random.default_rng(3)
    for _ in range(2):  # (the second run replayed)
        _, gradients = ml.compute_gradients(loss, executor=pool)
        np.testing.assert_array_equal(gradients[w], (rng.random((30, 30)) >= 0.5) * 2.0)
    assert spy.ran_on_workers()
    spy.threads.clear()
    np.testing.assert_array_equal(ml.predict_blocking(drop(w), executor=pool).unwrap(), w.data)
    assert spy.ran_on_workers()


def test_batch_norm_on_a_worker_uses_batch_statistics_in_training_and_running_ones_in_a_prediction(
    pool: ml.Executor, monkeypatch: pytest.MonkeyPatch
) -> None:
    spy = ThreadSpy(BATCH_NORM, monkeypatch)
    norm = BatchNorm1d.new(3, momentum=0.5, dtype=np.float64)
    x = np.random.default_rng(4).normal(size=(6, 3)) * 3.0 + 2.0
    batch = (x - x.mean(axis=0)) / np.sqrt(x.var(axis=0) + 1e-5)
    probe = np.random.default_rng(5).normal(size=(6, 3))
    value, _ = ml.compute_gradients(ml.sum(norm(x) * probe), executor=pool)
    assert value == pytest.approx(float(np.sum(batch * probe)), rel=1e-12)
    assert spy.ran_on_workers()
    np.testing.assert_array_equal(norm.running_mean.data, np.zeros(3))  # nothing committed
    spy.threads.clear()
    running = ml.predict_blocking(norm(x), executor=pool).unwrap()
    np.testing.assert_allclose(running, x / np.sqrt(1.0 + 1e-5), rtol=1e-12)  # mean 0, variance 1
    assert spy.ran_on_workers()


def test_running_statistics_update_once_per_successful_step_on_a_worker_and_never_on_a_failed_one(
    pool: ml.Executor, monkeypatch: pytest.MonkeyPatch
) -> None:
    spy = ThreadSpy(BATCH_NORM, monkeypatch)
    norm = BatchNorm1d.new(3, momentum=0.5, dtype=np.float64)
    x = np.random.default_rng(6).normal(size=(8, 3)) * 2.0 + 1.0
    mean, unbiased = x.mean(axis=0), x.var(axis=0, ddof=1)
    want_mean, want_var = np.zeros(3), np.ones(3)
    for _ in range(2):
        assert is_successful(ml.sum(norm(x)).train_blocking(ml.SGD(0.1), executor=pool))
        want_mean, want_var = 0.5 * want_mean + 0.5 * mean, 0.5 * want_var + 0.5 * unbiased
        np.testing.assert_allclose(norm.running_mean.data, want_mean, rtol=1e-12)
        np.testing.assert_allclose(norm.running_var.data, want_var, rtol=1e-12)
    assert spy.ran_on_workers()
    before = (norm.running_mean.data, norm.running_var.data)
    failed = (ml.sum(norm(x)) * np.inf).train_blocking(ml.SGD(0.1), executor=pool)
    assert isinstance(failed.failure(), ml.NonFiniteLossError)
    assert norm.running_mean.data is before[0] and norm.running_var.data is before[1]


def test_a_custom_op_with_the_context_adds_noise_in_training_only(pool: ml.Executor) -> None:
    class Noise:
        def __init__(self) -> None:
            self.generator = ml.GeneratorBuffer(7)

    noise = Noise()
    threads: list[int] = []

    def forward(xp: Any, x: Any, *, scale: float, ctx: RunContext) -> Any:
        threads.append(threading.get_ident())
        return x + scale * ctx.generator(noise).standard_normal(x.shape) if ctx.training else x

    add_noise = ml.custom_op("add_noise", forward, (lambda xp, d, out, x, *, scale: d,), context=True)
    w = ml.ArrayWeight(np.zeros(5))
    value, gradients = ml.compute_gradients(ml.sum(add_noise(w, scale=0.5)), executor=pool)
    assert value == pytest.approx(float(np.sum(0.5 * np.random.default_rng(7).standard_normal(5))))
    np.testing.assert_array_equal(gradients[w], np.ones(5))
    predicted = ml.predict_blocking(add_noise(w, scale=0.5), executor=pool).unwrap()
    np.testing.assert_array_equal(predicted, w.data)
    assert threads and threading.get_ident() not in threads


def test_a_custom_op_with_the_context_stages_a_buffer_committed_with_the_step() -> None:
    count = ml.ArrayBuffer(np.zeros(1))

    def forward(xp: Any, x: Any, *, ctx: RunContext) -> Any:
        ctx.update(count, lambda old: old + 1.0)
        return x

    counted = ml.custom_op("counted", forward, (lambda xp, d, out, x: d,), context=True)
    w = ml.ArrayWeight(np.ones(3))
    assert is_successful(ml.sum(counted(w) + counted(w)).train_blocking(ml.SGD(0.1)))
    np.testing.assert_array_equal(count.data, [2.0])  # two uses compose
    assert not is_successful((ml.sum(counted(w)) * np.inf).train_blocking(ml.SGD(0.1)))
    np.testing.assert_array_equal(count.data, [2.0])  # a failed step stages nothing
    assert is_successful(ml.predict_blocking(counted(w)))
    np.testing.assert_array_equal(count.data, [2.0])  # a prediction stages nothing


def test_context_options_are_checked() -> None:
    with pytest.raises(TypeError, match="custom_op noisy: context must be a bool"):
        ml.custom_op("noisy", lambda xp, x: x, (lambda xp, d, o, x: d,), context=1)  # type: ignore[call-overload]
    with pytest.raises(ValueError, match="op: a primitive given the run's context does not merge"):
        Primitive("op", lambda xp, x: x, (lambda xp, d, o, x: d,), batch=ELEMENTWISE, context=True)
    merged = ml.custom_op(
        "noisy", lambda xp, x, *, ctx: x, (lambda xp, d, o, x: d,), elementwise=True, context=True
    )
    assert merged.primitive.batch is None and merged.primitive.broadcasts
