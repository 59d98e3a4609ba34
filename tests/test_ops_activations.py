"""The activations of ``monadl.dsl.ops.activations``: ``softplus``, ``gelu``, ``silu``,
``leaky_relu``, ``elu`` and ``clip``.

Their values against NumPy references, their gradients against finite differences (the shared
checker, float64), on arrays and on float weights; their numerics where the naive formula fails
(overflow, cancellation); their calls merged under dynamic batching equal to their calls alone;
their parameters' errors; and the op fuzz (operands of every kind work or fail naming the op).
The array-api-strict runs are the shared cases of ``op_cases.CASES``.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from batching_check import assert_close, assert_merged_like_alone, gradients_of
from hypothesis import given
from hypothesis import strategies as st
from op_cases import F64, check_op, predict, probe
from test_op_fuzz import FUZZ_SETTINGS, Case, _call, _unary, operands, outcome

import monadl as ml
from monadl import ArrayLayer, ArrayWeight, FloatLayer, FloatWeight

GELU_C = math.sqrt(2.0 / math.pi)


def _sigmoid(x: F64) -> F64:
    return np.asarray(1.0 / (1.0 + np.exp(-x)))


REFERENCES: dict[str, tuple[Callable[[Any], Any], Callable[[F64], F64]]] = {
    "softplus": (ml.softplus, lambda x: np.logaddexp(0.0, x)),
    "gelu": (ml.gelu, lambda x: 0.5 * x * (1.0 + np.tanh(GELU_C * (x + 0.044715 * x**3)))),
    "silu": (ml.silu, lambda x: x * _sigmoid(x)),
    "leaky_relu": (lambda x: ml.leaky_relu(x, 0.1), lambda x: np.where(x > 0, x, 0.1 * x)),
    "elu": (lambda x: ml.elu(x, 0.7), lambda x: np.where(x > 0, x, 0.7 * np.expm1(np.minimum(x, 0.0)))),
    "clip": (lambda x: ml.clip(x, -0.5, 1.0), lambda x: np.clip(x, -0.5, 1.0)),
}


def _inputs(shape: tuple[int, ...], seed: int) -> F64:
    """Entries in +-[0.05, 3], away from the kinks at 0 and at clip's bounds (-0.5, 1)."""
    rng = np.random.default_rng([seed, *shape])
    x = rng.uniform(0.05, 3.0, shape) * np.where(rng.uniform(size=shape) < 0.5, -1.0, 1.0)
    near_bound = (np.abs(x + 0.5) < 0.05) | (np.abs(x - 1.0) < 0.05)
    return np.where(near_bound, x + 0.2, x)


@pytest.mark.parametrize("name", sorted(REFERENCES))
@pytest.mark.parametrize("shape", [(7,), (3, 4), (2, 3, 2)])
def test_values_and_gradients_on_arrays(name: str, shape: tuple[int, ...]) -> None:
    op, reference = REFERENCES[name]
    x = _inputs(shape, 1)
    check_op(op, [x], reference(x))


@pytest.mark.parametrize("name", sorted(REFERENCES))
@pytest.mark.parametrize("x", [-1.7, -0.3, 0.4, 2.2])
def test_values_and_gradients_on_float_weights(name: str, x: float) -> None:
    op, reference = REFERENCES[name]
    out = op(FloatWeight(x))
    assert isinstance(out, FloatLayer)
    check_op(op, [x], float(reference(np.array(x))))


def test_the_derivatives_are_the_known_closed_forms() -> None:
    # (the checker compares with finite differences; these pin the formulas themselves)
    x = np.linspace(-4.0, 4.0, 17) + 0.01
    w = ArrayWeight(x)
    _, grads = ml.compute_gradients(ml.sum(ml.softplus(w)))
    np.testing.assert_allclose(grads[w], _sigmoid(x), rtol=1e-14)
    _, grads = ml.compute_gradients(ml.sum(ml.silu(w)))
    s = _sigmoid(x)
    np.testing.assert_allclose(grads[w], s * (1 + x * (1 - s)), rtol=1e-13)
    _, grads = ml.compute_gradients(ml.sum(ml.elu(w, 2.0)))
    np.testing.assert_allclose(grads[w], np.where(x > 0, 1.0, 2.0 * np.exp(x)), rtol=1e-14)


def test_kinks_take_the_documented_side() -> None:
    w = ArrayWeight(np.array([-1.0, 0.0, 2.0, 3.0]))
    _, grads = ml.compute_gradients(ml.sum(ml.leaky_relu(w, 0.25)))
    np.testing.assert_array_equal(grads[w], [0.25, 0.25, 1.0, 1.0])  # at 0: the slope's side
    _, grads = ml.compute_gradients(ml.sum(ml.clip(w, 0.0, 2.0)))
    np.testing.assert_array_equal(grads[w], [0.0, 1.0, 1.0, 0.0])  # bounds included


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_large_operands_neither_overflow_nor_warn(dtype: type[Any]) -> None:
    x = np.array([-1e4, -800.0, -40.0, 0.0, 40.0, 800.0, 1e4], dtype=dtype)
    w = ArrayWeight(x)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for op in (ml.softplus, ml.gelu, ml.silu, ml.elu):
            value = predict(op(w))
            assert value.dtype == dtype
            assert np.all(np.isfinite(value)), (op, value)
            _, grads = ml.compute_gradients(ml.sum(op(w)))
            assert np.all(np.isfinite(grads[w])), (op, grads[w])
        softplus = predict(ml.softplus(w))
    assert softplus[-1] == dtype(1e4) and softplus[3] == dtype(math.log(2.0))
    # log(1 + e ** -40) is e ** -40 to within an ulp: no cancellation to 0 (log(1 + tiny) would round)
    assert softplus[2] == pytest.approx(math.exp(-40.0), rel=1e-6)


def test_gelu_is_within_the_documented_distance_of_the_exact_form() -> None:
    x = np.linspace(-8.0, 8.0, 4001)
    exact = 0.5 * x * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))
    assert np.max(np.abs(predict(ml.gelu(ArrayWeight(x))) - exact)) < 1e-3


# ------------------------------------------------------------------------------------- batching


BATCHED: dict[str, Callable[[Any], Any]] = {
    "softplus": ml.softplus,
    "gelu": ml.gelu,
    "silu": ml.silu,
    "leaky_relu": lambda x: ml.leaky_relu(x, 0.3),
    "elu": lambda x: ml.elu(x, 1.5),
    "clip": lambda x: ml.clip(x, -0.5, 0.8),
}


@pytest.mark.parametrize("name", sorted(BATCHED))
@pytest.mark.parametrize("kind", ["array", "float"])
def test_merged_calls_equal_calls_alone(name: str, kind: str) -> None:
    op = BATCHED[name]
    calls = 8
    if kind == "array":
        w: ArrayWeight | FloatWeight = ArrayWeight(_inputs((3, 4), 2))
        terms = [ml.sum(op(w * (0.5 + 0.25 * i)) * probe((3, 4), i)) for i in range(calls)]
    else:
        w = FloatWeight(0.8)
        terms = [op(w * (0.5 - 0.25 * i)) for i in range(calls)]
    assert_merged_like_alone(ml.add_n(terms), w, name, calls)


def test_calls_with_different_parameters_do_not_merge() -> None:
    w = ArrayWeight(_inputs((3,), 3))
    loss = ml.add_n([ml.sum(ml.leaky_relu(w * 1.0, slope)) for slope in (0.1, 0.2, 0.1)])
    on, off = gradients_of(loss, True), gradients_of(loss, False)
    assert on.stats.kinds["leaky_relu"] == 2  # the two of slope 0.1 merged, the other alone
    assert_close(on.gradients[w], off.gradients[w], "gradient")
    np.testing.assert_allclose(off.gradients[w], np.where(w.data > 0, 3.0, 0.4), rtol=1e-15)


# --------------------------------------------------------------------------------------- errors


def test_parameters_are_checked_when_the_op_is_made() -> None:
    w = ArrayWeight(np.ones(3))
    with pytest.raises(TypeError, match=r"^leaky_relu: negative_slope must be a float, got str"):
        ml.leaky_relu(w, "0.1")  # type: ignore[call-overload]
    with pytest.raises(TypeError, match=r"^elu: alpha must be a float, got bool"):
        ml.elu(w, True)
    with pytest.raises(ValueError, match=r"^clip: needs lo <= hi, got lo 2.0 and hi 1.0"):
        ml.clip(w, 2.0, 1.0)
    with pytest.raises(TypeError, match=r"^softplus: expected a float"):
        ml.softplus("x")  # type: ignore[call-overload]
    assert isinstance(ml.clip(w, -math.inf, 0.5), ArrayLayer)  # one side open


# ----------------------------------------------------------------------------------------- fuzz


def _with_parameter(name: str, draw_parameter: Callable[[st.DataObject], tuple[Any, ...]]) -> Any:
    op = getattr(ml, name)

    def draw(data: st.DataObject) -> Case:
        x, _ = data.draw(operands())
        return _call(name, op, x, *draw_parameter(data))

    return draw


_PARAMETER = st.one_of(
    st.floats(-2.0, 2.0, allow_subnormal=False), st.sampled_from([0, 1, None, "a", True, np.float32(0.5)])
)
FUZZ = {
    "softplus": _unary("softplus"),
    "gelu": _unary("gelu"),
    "silu": _unary("silu"),
    "leaky_relu": _with_parameter("leaky_relu", lambda data: (data.draw(_PARAMETER),)),
    "elu": _with_parameter("elu", lambda data: (data.draw(_PARAMETER),)),
    "clip": _with_parameter("clip", lambda data: (data.draw(_PARAMETER), data.draw(_PARAMETER))),
}


@pytest.mark.parametrize("name", sorted(FUZZ))
@FUZZ_SETTINGS
@given(data=st.data(), merged=st.booleans(), train=st.booleans(), batching=st.booleans())
def test_an_activation_works_or_names_itself(
    name: str, data: st.DataObject, merged: bool, train: bool, batching: bool
) -> None:
    outcome(FUZZ[name](data), merged, train, batching)
