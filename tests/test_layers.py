"""Layers at run time: operator mixing, deep chains, NumPy interplay, weights."""

from __future__ import annotations

import numpy as np
import pytest
from returns.result import Success

import monadl as ml


def test_ndarray_times_layer_calls_our_reflected_operator() -> None:
    w = ml.ArrayWeight(np.array([1.0, 2.0]))
    product = np.array([3.0, 4.0]) * w  # __array_ufunc__ = None: not an object array
    assert isinstance(product, ml.ArrayLayer)
    np.testing.assert_array_equal(product.predict_blocking().unwrap(), [3.0, 8.0])
    assert isinstance(np.ones((2, 2)) @ w, ml.ArrayLayer)


def test_float_and_array_operands_mix_in_every_order() -> None:
    f = ml.FloatWeight(2.0)
    a = ml.ArrayWeight(np.array([1.0, 3.0]))
    cases: dict[str, tuple[ml.FloatLayer | ml.ArrayLayer, object]] = {
        "f+a": (f + a, [3.0, 5.0]),
        "a-f": (a - f, [-1.0, 1.0]),
        "1/a": (1.0 / a, [1.0, 1.0 / 3.0]),
        "f**a": (f**a, [2.0, 8.0]),
        "a**2": (a**2.0, [1.0, 9.0]),
        "2-f": (2.0 - f, 0.0),
        "-a": (-a, [-1.0, -3.0]),
        "f*f": (f * f, 4.0),
    }
    for name, (layer, expected) in cases.items():
        value: object = layer.predict_blocking().unwrap()
        np.testing.assert_allclose(value, expected, err_msg=name)  # type: ignore[call-overload]
    assert isinstance(f * f, ml.FloatLayer)
    assert isinstance(f * a, ml.ArrayLayer)


def test_builtin_sum_of_float_layers() -> None:
    ws = [ml.FloatWeight(float(i)) for i in range(5)]
    total = sum(w * w for w in ws)
    assert isinstance(total, ml.FloatLayer)
    assert total.predict_blocking() == Success(30.0)


@pytest.mark.parametrize("depth", [2_000, 10_000])
def test_a_chain_of_nested_layers_trains_without_recursion_error(depth: int) -> None:
    w = ml.ArrayWeight(np.full(3, 0.5))
    x: ml.ArrayLayer = w * 1.0
    for _ in range(depth):
        x = ml.tanh(x) * 1.0001 + 0.0
    loss = ml.sum(x)
    # The chain rule by hand: d x_{i+1} / d x_i = 1.0001 * (1 - tanh(x_i)^2).
    value, expected = 0.5, 1.0
    for _ in range(depth):
        expected *= 1.0001 * (1.0 - np.tanh(value) ** 2)
        value = np.tanh(value) * 1.0001
    result = loss.train_blocking(ml.SGD(0.1))
    assert result.unwrap() == pytest.approx(3 * value)
    np.testing.assert_allclose(w.data, 0.5 - 0.1 * expected, rtol=1e-12)


def test_a_deep_tree_of_layers_trains() -> None:
    """A recursion 10,000 deep through binary nodes (a degenerate tree)."""
    w = ml.FloatWeight(0.001)
    node: ml.FloatLayer = w * 1.0
    for i in range(10_000):
        node = node + w * float(i % 3)
    loss, gradients = ml.compute_gradients(node)
    assert gradients[w] == pytest.approx(1.0 + sum(i % 3 for i in range(10_000)))
    assert loss == pytest.approx(0.001 * gradients[w])


def test_array_weight_copies_its_data_and_checks_dtype() -> None:
    data = np.ones(2)
    w = ml.ArrayWeight(data)
    data[0] = 5.0
    assert w.data[0] == 1.0
    with pytest.raises(TypeError, match="floating-point"):
        ml.ArrayWeight(np.arange(3))  # type: ignore[arg-type]  # mypy rejects it too
    with pytest.raises(TypeError, match="expected a float"):
        ml.FloatWeight("1.0")  # type: ignore[arg-type]


def test_normal_initialisation_is_deterministic_under_a_seed() -> None:
    a = ml.ArrayWeight.normal((4, 5), seed=3)
    b = ml.ArrayWeight.normal((4, 5), seed=3)
    c = ml.ArrayWeight.normal((4, 5), seed=4)
    np.testing.assert_array_equal(a.data, b.data)
    assert not np.array_equal(a.data, c.data)
    assert a.data.std() == pytest.approx(np.sqrt(2.0 / 4), rel=0.5)


def test_float32_weights_stay_float32() -> None:
    w = ml.ArrayWeight(np.ones(3, dtype=np.float32))
    assert isinstance(ml.sum(w * np.full(3, 2.0, dtype=np.float32) * w).train_blocking(ml.SGD(0.1)), Success)
    assert w.data.dtype == np.float32
