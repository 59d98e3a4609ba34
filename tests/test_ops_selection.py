"""``where(condition, a, b)`` of ``monadl.dsl.ops.selection``.

Its values against ``numpy.where``, its gradients against finite differences (the shared checker,
float64) for every broadcast of the three operands; its calls merged under dynamic batching equal
to its calls alone, conditions of different shapes included; its errors; and the op fuzz. The
array-api-strict runs are the shared cases of ``op_cases.CASES``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from batching_check import assert_close, gradients_of
from hypothesis import given
from hypothesis import strategies as st
from op_cases import F64, check_op, predict, probe
from test_op_fuzz import FUZZ_SETTINGS, Case, _call, operands, outcome

import monadl as ml
from monadl import ArrayLayer, ArrayWeight, FloatWeight


def _values(shape: tuple[int, ...], seed: int) -> F64:
    return np.random.default_rng([seed, *shape]).uniform(-2.0, 2.0, shape)


def _mask(shape: tuple[int, ...], seed: int) -> Any:
    return np.random.default_rng([seed, 7, *shape]).uniform(size=shape) < 0.5


SHAPES = [((3, 4), (3, 4), (3, 4)), ((3, 4), (4,), (3, 1)), ((3, 1), (3, 4), ()), ((2, 3, 4), (4,), (3, 4))]


@pytest.mark.parametrize(("c_shape", "a_shape", "b_shape"), SHAPES)
def test_values_and_gradients(
    c_shape: tuple[int, ...], a_shape: tuple[int, ...], b_shape: tuple[int, ...]
) -> None:
    condition, a, b = _mask(c_shape, 1), _values(a_shape, 2), _values(b_shape, 3)
    check_op(lambda x, y: ml.where(condition, x, y), [a, b], np.where(condition, a, b))


def test_each_branch_gets_the_delta_where_it_was_chosen() -> None:
    condition = np.array([[True, False, True], [False, False, True]])
    a, b = ArrayWeight(np.ones((2, 3))), ArrayWeight(np.ones(3))
    _, grads = ml.compute_gradients(ml.sum(ml.where(condition, a, b)))
    np.testing.assert_array_equal(grads[a], condition.astype(float))
    np.testing.assert_array_equal(grads[b], [1.0, 2.0, 0.0])  # summed over the broadcast rows
    s = FloatWeight(0.5)
    _, grads = ml.compute_gradients(ml.sum(ml.where(condition, 1.0, s)))
    assert grads[s] == 3.0


def test_float_branches_give_an_array_of_the_conditions_shape() -> None:
    out = ml.where(np.array([True, False]), 1.5, -2.0)
    assert isinstance(out, ArrayLayer)
    np.testing.assert_array_equal(predict(out), [1.5, -2.0])


def test_a_float32_operand_keeps_its_dtype() -> None:
    a = ArrayWeight(np.ones(3, dtype=np.float32))
    assert predict(ml.where(np.array([True, False, True]), a, 0.0)).dtype == np.float32


@pytest.mark.parametrize("shapes", SHAPES)
def test_merged_calls_equal_calls_alone(shapes: tuple[tuple[int, ...], ...]) -> None:
    c_shape, a_shape, b_shape = shapes
    a, b = ArrayWeight(_values(a_shape, 4)), ArrayWeight(_values(b_shape, 5))
    calls = 6
    out_shape = np.broadcast_shapes(*shapes)
    terms = [
        ml.sum(ml.where(_mask(c_shape, i), a * (1.0 + i), b) * probe(out_shape, i)) for i in range(calls)
    ]
    loss = ml.add_n(terms)
    on, off = gradients_of(loss, True), gradients_of(loss, False)
    assert_close(on.value, off.value, "loss")
    for w in (a, b):
        assert_close(on.gradients[w], off.gradients[w], repr(w))
    assert on.stats.kinds["where"] == 1 and on.stats.vjps["where"] == 2, on.stats  # a's and b's
    assert off.stats.kinds["where"] == calls, off.stats


def test_errors_name_the_op() -> None:
    a = ArrayWeight(np.ones(3))
    with pytest.raises(
        TypeError, match=r"^where: condition must be a boolean array, got ndarray of dtype float64"
    ):
        ml.where(np.ones(3), a, a)
    with pytest.raises(TypeError, match=r"^where: condition must be a boolean array, got list"):
        ml.where([True, False, True], a, a)  # type: ignore[arg-type]
    result = ml.where(np.array([True, False]), a, a).predict_blocking()
    assert str(result.failure()).startswith("where: operands of shapes (3,) and (3,) and (2,) do not fit")


# ----------------------------------------------------------------------------------------- fuzz


def _where(data: st.DataObject) -> Case:
    fit = data.draw(st.booleans())
    a, shape = data.draw(operands(fit=fit))
    b, _ = data.draw(operands(like=shape, fit=fit))
    c_shape = shape if fit else data.draw(st.sampled_from([shape, (), (2,), (3, 1)]))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    condition = data.draw(
        st.sampled_from(
            [rng.uniform(size=c_shape) < 0.5]
            if fit
            else [rng.uniform(size=c_shape) < 0.5, rng.uniform(size=c_shape), True, None, [True]]
        )
    )
    return _call("where", ml.where, condition, a, b)


@FUZZ_SETTINGS
@given(data=st.data(), merged=st.booleans(), train=st.booleans(), batching=st.booleans())
def test_where_works_or_names_itself(data: st.DataObject, merged: bool, train: bool, batching: bool) -> None:
    outcome(_where(data), merged, train, batching)
