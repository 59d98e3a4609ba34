"""``module.to(xp)`` / ``ml.to_device``: weights, their optimizer state and buffers moved to another
array namespace (array-api-strict stands in for a device), and ``parameter_count``/``summary``."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from returns.pipeline import is_successful

import monadl as ml
from monadl.nn import MLP, BatchNorm1d, Linear

xp: Any = pytest.importorskip("array_api_strict")


class Net(ml.Module):
    def __init__(self) -> None:
        # float64: moved and stayed models are compared to 1e-12, below float32's rounding (the
        # NumPy and generic kernels sum in different orders)
        self.body = MLP.new([4, 5, 3], seed=1, dtype=np.float64)
        self.norm = BatchNorm1d.new(3, dtype=np.float64)
        self.drop = ml.Dropout(0.0)

    def __call__(self, x: Any) -> ml.ArrayLayer:
        return self.norm(self.body(x))


X = np.random.default_rng(0).normal(size=(6, 4))
Y = np.array([0, 1, 2, 0, 1, 2])


def step(net: Net, x: Any) -> float:
    result = ml.cross_entropy(net(x), Y).train_blocking(ml.Adam(0.05))
    assert is_successful(result), result
    value: float = result.unwrap()
    return value


def test_a_model_moved_there_and_back_trains_as_one_that_stayed() -> None:
    stayed, moved = Net(), Net()
    for net in (stayed, moved):
        step(net, X)  # Adam's state exists before the move
    assert moved.to(xp) is moved
    for weight in ml.weights_of(moved).values():
        assert type(weight.data) is not np.ndarray
        state = weight.optimizer_state
        assert state is not None and type(state[1][0]) is type(weight.data) and state[1][2] == 1
    assert type(moved.norm.running_mean.data) is type(moved.body.layers[0].w.data)
    assert step(moved, xp.asarray(X)) == pytest.approx(step(stayed, X), abs=1e-12)
    ml.to_device(moved, np)
    assert step(moved, X) == pytest.approx(step(stayed, X), abs=1e-12)
    for a, b in zip(ml.weights_of(stayed).values(), ml.weights_of(moved).values(), strict=True):
        assert type(b.data) is np.ndarray and not b.data.flags.writeable
        np.testing.assert_allclose(b.data, a.data, rtol=0, atol=1e-12)
    for name, buffer in ml.buffers_of(stayed).items():
        if isinstance(buffer, ml.ArrayBuffer):
            other = ml.buffers_of(moved)[name]
            assert isinstance(other, ml.ArrayBuffer)
            np.testing.assert_allclose(other.data, buffer.data, rtol=0, atol=1e-12)


def test_a_moved_buffer_is_saved_as_numpy(tmp_path: Any) -> None:
    norm = BatchNorm1d.new(2).to(xp)
    assert norm.buffers()["running_var"].state().arrays["data"].tolist() == [1.0, 1.0]


def test_parameter_count_and_summary() -> None:
    net = Net()
    assert ml.parameter_count(net) == 4 * 5 + 5 + 5 * 3 + 3 + 3 + 3
    net.body.layers[0].w.trainable = False
    assert net.parameter_count(trainable_only=True) == ml.parameter_count(net) - 20
    assert ml.parameter_count(Linear.new(2, 3, bias=False)) == 6
    table = ml.summary(net).splitlines()
    assert table[0].split() == ["name", "kind", "shape", "dtype", "count"]
    assert table[1].split() == ["body.layers.0.w", "frozen", "(4,", "5)", "float64", "20"]
    assert table[-4].split() == ["norm.running_mean", "buffer", "(3,)", "float64", "3"]
    assert table[-2].split() == ["drop.generator", "buffer", "-", "-", "-"]
    assert table[-1] == "total: 49 parameters (29 trainable)"
    assert net.summary() == ml.summary(net)
