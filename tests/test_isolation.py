"""Predictions made while another thread trains see the weights of one committed step (snapshot
isolation): a stress test with two threads, bounded by a deadline, in which every
prediction must equal, bit for bit, the prediction of one committed state."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from returns.result import Success

import monadl as ml
from monadl import ArrayLayer, ArrayWeight

STEPS = 60
PREDICTIONS = 20


def _model(batchable: bool) -> tuple[list[ArrayWeight], ml.FloatLayer, ml.FloatLayer]:
    rng = np.random.default_rng(11)
    w = ArrayWeight(rng.normal(size=(4, 4)))
    v = ArrayWeight(rng.normal(size=(4, 4)))
    b = ArrayWeight(rng.normal(size=(4,)))

    def plain(x: ArrayLayer | np.ndarray) -> ArrayLayer:
        return ml.tanh(ml.linear(ml.tanh(ml.linear(x, w, b)), v, b))

    cell = ml.batchable(plain) if batchable else plain
    xs = [rng.normal(size=(4,)) for _ in range(6)]
    outputs = [cell(x) for x in xs]
    prediction = ml.add_n([ml.sum(out * float(k + 1)) for k, out in enumerate(outputs)])
    loss = ml.add_n([ml.sum(out * out) for out in outputs])
    return [w, v, b], loss, prediction


@pytest.mark.parametrize("batchable", [True, False])
@pytest.mark.parametrize("pool", [False, True])
def test_predictions_beside_training_see_one_committed_step(batchable: bool, pool: bool) -> None:
    weights, loss, prediction = _model(batchable)
    trainer = ml.Executor(2, min_pool_cost=0) if pool else ml.Executor()
    predictor = ml.Executor()
    committed = [[w.data for w in weights]]
    seen: list[float] = []
    failures: list[object] = []
    stop = threading.Event()

    def predict() -> None:
        while not stop.is_set():
            result = prediction.predict_blocking(executor=predictor)
            if isinstance(result, Success):
                seen.append(result.unwrap())
            else:
                failures.append(result)

    thread = threading.Thread(target=predict, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    # At least STEPS steps, and on until as many predictions overlapped them (the threads share
    # the interpreter's lock: how they interleave depends on the machine).
    while len(committed) <= STEPS or len(seen) < PREDICTIONS:
        assert isinstance(loss.train_blocking(ml.SGD(0.01), executor=trainer), Success)
        committed.append([w.data for w in weights])  # only this thread commits
        assert time.monotonic() < deadline, f"{len(seen)} predictions in {len(committed)} steps"
    stop.set()
    thread.join(timeout=30)
    assert not thread.is_alive() and not failures
    expected = set()
    for state in committed:
        for weight, data in zip(weights, state, strict=True):
            weight.data = data
        result = prediction.predict_blocking(executor=predictor)
        assert isinstance(result, Success)
        expected.add(result.unwrap())
    mixed = [value for value in seen if value not in expected]
    assert not mixed, f"{len(mixed)} of {len(seen)} predictions mixed two steps' weights"
    trainer.close()
    predictor.close()
