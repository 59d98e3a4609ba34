"""Dtypes: builders and weight constructors default to float32, and the promotion rules. A
constant (an array or float that depends on no weight) takes the dtype of the layers it meets; layers
and weights of different dtypes promote as the array namespace does; gradients come in each
weight's dtype."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import array_api_strict as xps
import numpy as np
import pytest

import monadl as ml
from monadl import nn
from monadl.nn import init

F32, F64 = np.dtype(np.float32), np.dtype(np.float64)
EXECUTORS = [ml.Executor(batching=True), ml.Executor(batching=False)]

BUILDERS: list[Callable[[], object]] = [
    lambda: nn.Linear.new(3, 2),
    lambda: nn.MLP.new([3, 4, 2]),
    lambda: nn.Embedding.new(5, 3),
    lambda: nn.LSTMCell.new(3, 2),
    lambda: nn.GRUCell.new(3, 2),
    lambda: nn.TreeLSTMCell.new(3, 2),
    lambda: nn.LSTM.new(3, 2, layers=2, bidirectional=True),
    lambda: nn.GRU.new(3, 2),
    lambda: nn.Conv1d.new(2, 3, 3),
    lambda: nn.Conv2d.new(2, 3, 3),
    lambda: nn.BatchNorm1d.new(3),
    lambda: nn.BatchNorm2d.new(3),
    lambda: nn.LayerNorm.new(4),
    lambda: nn.MultiHeadAttention.new(4, 2),
    lambda: nn.TransformerEncoderLayer.new(4, 2, 8),
]


@pytest.mark.parametrize("build", BUILDERS)
def test_builders_default_to_float32_weights_and_buffers(build: Callable[[], object]) -> None:
    module = build()
    weights = nn.weights_of(module)
    assert weights
    assert {name: np.asarray(w.data).dtype for name, w in weights.items()} == dict.fromkeys(weights, F32)
    for name, buffer in nn.buffers_of(module).items():
        data = getattr(buffer, "data", None)
        if isinstance(data, np.ndarray) and data.dtype.kind == "f":
            assert data.dtype == F32, name


def test_weight_constructors_and_initialisers_default_to_float32() -> None:
    assert ml.ArrayWeight.normal((3, 2)).data.dtype == F32
    assert ml.ArrayWeight.zeros((3,)).data.dtype == F32
    for draw in (
        init.xavier_uniform,
        init.xavier_normal,
        init.kaiming_uniform,
        init.kaiming_normal,
        init.orthogonal,
    ):
        assert draw((4, 3), seed=0).dtype == F32, draw.__name__
    # float64 where asked for; an array given as it is keeps its dtype.
    assert {
        np.asarray(w.data).dtype for w in nn.weights_of(nn.LSTMCell.new(3, 2, dtype=np.float64)).values()
    } == {F64}
    assert ml.ArrayWeight(np.zeros((2,))).data.dtype == F64


def _model(w: ml.ArrayWeight, b: ml.ArrayWeight, x: Any, scale: Any) -> ml.FloatLayer:
    return ml.sum(ml.tanh(x @ w + b) * scale)


@pytest.mark.parametrize("executor", EXECUTORS)
def test_a_float32_model_stays_float32_beside_a_float64_constant(executor: ml.Executor) -> None:
    rng = np.random.default_rng(0)
    x64, scale64 = rng.standard_normal((5, 3)), rng.standard_normal((5, 2))
    w, b = ml.ArrayWeight.normal((3, 2), seed=1), ml.ArrayWeight.normal((2,), seed=2)
    hidden = (ml.lift_array(x64) @ w).predict_blocking(executor=executor).unwrap()
    assert hidden.dtype == F32
    # Bit for bit what the constants cast to float32 by hand give, forward and gradients.
    value, gradients = ml.compute_gradients(_model(w, b, x64, scale64), executor=executor)
    want_value, want = ml.compute_gradients(
        _model(w, b, x64.astype(np.float32), scale64.astype(np.float32)), executor=executor
    )
    assert value == want_value
    assert [g.dtype for g in gradients.values()] == [F32, F32]
    for weight in (w, b):
        np.testing.assert_array_equal(gradients[weight], want[weight])
    # Constants alone, and a float64 model beside a float32 constant, promote as NumPy does.
    c32 = np.ones((2,), dtype=np.float32)
    assert (ml.lift_array(c32) + scale64[0]).predict_blocking(executor=executor).unwrap().dtype == F64
    w64 = ml.ArrayWeight.normal((2,), seed=0, dtype=np.float64)
    assert (w64 * c32).predict_blocking(executor=executor).unwrap().dtype == F64


@pytest.mark.parametrize("executor", EXECUTORS)
def test_a_float32_model_stays_float32_beside_python_floats(executor: ml.Executor) -> None:
    w = ml.ArrayWeight.normal((3, 2), seed=1)
    for scale in (0.5, np.float64(0.5), ml.FloatWeight(0.5)):
        out = (w * scale + 1.0).predict_blocking(executor=executor).unwrap()
        assert out.dtype == F32
    _, gradients = ml.compute_gradients(ml.sum(w * np.float64(3.0) - 2.0), executor=executor)
    assert gradients[w].dtype == F32


@pytest.mark.parametrize("executor", EXECUTORS)
def test_weights_of_different_dtypes_promote(executor: ml.Executor) -> None:
    w32 = ml.ArrayWeight.normal((3, 2), seed=1)
    w64 = ml.ArrayWeight.normal((3, 2), seed=2, dtype=np.float64)
    assert (w32 * w64).predict_blocking(executor=executor).unwrap().dtype == F64
    # A layer counts as its weights do: a float32 layer beside a float64 weight promotes too.
    assert (ml.tanh(w32) + w64).predict_blocking(executor=executor).unwrap().dtype == F64
    _, gradients = ml.compute_gradients(ml.sum(w32 * w64), executor=executor)
    assert gradients[w32].dtype == F32
    assert gradients[w64].dtype == F64


def test_a_float32_model_trains_and_replays_on_float64_data() -> None:
    model = nn.MLP.new([3, 8, 2], seed=0)
    rng = np.random.default_rng(1)
    before = {name: np.array(w.data) for name, w in nn.weights_of(model).items()}
    for _ in range(3):  # the first step records the program, the others replay it
        x = rng.standard_normal((4, 3))
        loss = ml.mean(model(x) ** 2.0)
        assert ml.lift(model(x)).predict_blocking().unwrap().dtype == F32
        loss.train_blocking(ml.SGD(0.1)).unwrap()
    for name, w in nn.weights_of(model).items():
        assert np.asarray(w.data).dtype == F32
        assert not np.array_equal(w.data, before[name]), name


@pytest.mark.parametrize("executor", EXECUTORS)
def test_a_recurrent_cell_stays_float32_on_float64_inputs(executor: ml.Executor) -> None:
    cell = nn.LSTMCell.new(3, 4, seed=0)
    rng = np.random.default_rng(2)
    sequences = [rng.standard_normal((n, 3)) for n in (2, 3, 1)]

    def loss(inputs: list[np.ndarray]) -> ml.FloatLayer:
        total: list[ml.FloatLayer] = []
        for xs in inputs:
            h, c = cell.zeros_state()
            for x in xs:
                h, c = cell(x, h, c)
            total.append(ml.sum(h))
        return ml.add_n(total)

    value, gradients = ml.compute_gradients(loss(sequences), executor=executor)
    want_value, want = ml.compute_gradients(
        loss([s.astype(np.float32) for s in sequences]), executor=executor
    )
    assert value == want_value
    for weight, g in gradients.items():
        assert g.dtype == F32
        np.testing.assert_array_equal(g, want[weight])


def test_where_keeps_a_float32_model_float32() -> None:
    w = ml.ArrayWeight.normal((4,), seed=0)
    out = ml.where(np.array([True, False, True, False]), w, np.zeros(4)).predict_blocking().unwrap()
    assert out.dtype == F32


def test_a_float64_constant_of_another_namespace_is_cast_too() -> None:
    w = ml.ArrayWeight(cast(Any, xps.ones((3,), dtype=xps.float32)))
    c: Any = xps.asarray([1.0, 2.0, 3.0], dtype=xps.float64)
    _, gradients = ml.compute_gradients(ml.sum(w * c))
    assert gradients[w].dtype == xps.float32
    out = (w * c).predict_blocking().unwrap()
    assert out.dtype == xps.float32
