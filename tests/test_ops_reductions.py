"""The reductions of ``monadl.dsl.ops.reductions``: ``max``, ``min``, ``logsumexp``, ``var``,
``std``, and the index functions ``argmax`` and ``argmin``.

Their values against NumPy's, their gradients against finite differences (the shared checker,
float64) over every axis and ``keepdims``; the documented tie rule of max and min; stable numerics
(logsumexp of large and of infinite values, var of a large mean); their calls merged under
dynamic batching equal to their calls alone; their errors; and the op fuzz. The array-api-strict
runs are the shared cases of ``op_cases.CASES`` (and argmax's own, here).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import array_api_strict as xps
import numpy as np
import pytest
from batching_check import assert_close, assert_merged_like_alone, gradients_of
from hypothesis import given
from hypothesis import strategies as st
from op_cases import F64, check_op, predict, probe
from returns.pipeline import is_successful
from test_op_fuzz import FUZZ_SETTINGS, _reduction, outcome

import monadl as ml
from monadl import ArrayLayer, ArrayWeight, FloatLayer, ShapeError
from monadl.dsl.ops.reductions import expand_to

Reference = Callable[..., Any]


def _logsumexp(x: F64, axis: Any = None, keepdims: bool = False) -> Any:
    m = np.max(x, axis=axis, keepdims=True)
    out = np.log(np.sum(np.exp(x - m), axis=axis, keepdims=True)) + m
    return out if keepdims else np.squeeze(out, axis=axis)


OPS: dict[str, tuple[Callable[..., Any], Reference]] = {
    "max": (ml.max, np.max),
    "min": (ml.min, np.min),
    "logsumexp": (ml.logsumexp, _logsumexp),
    "var": (ml.var, np.var),
    "std": (ml.std, np.std),
}
AXES: list[tuple[Any, bool]] = [(None, False), (0, False), (-1, True), ((0, 2), False), ((1, 2), True)]


def _distinct(shape: tuple[int, ...], seed: int) -> F64:
    """Entries at least 0.05 apart (a permutation, scaled): no ties for max, min and finite differences."""
    rng = np.random.default_rng([seed, *shape])
    return np.asarray(rng.permutation(math.prod(shape)).reshape(shape) * 0.1 - 1.0)


@pytest.mark.parametrize("name", sorted(OPS))
@pytest.mark.parametrize(("axis", "keepdims"), AXES)
def test_values_and_gradients(name: str, axis: Any, keepdims: bool) -> None:
    op, reference = OPS[name]
    x = _distinct((2, 3, 4), 1)
    if axis is None:
        check_op(lambda w: op(w), [x], reference(x))
    else:
        check_op(
            lambda w: op(w, axis=axis, keepdims=keepdims), [x], reference(x, axis=axis, keepdims=keepdims)
        )


@pytest.mark.parametrize("name", ["var", "std"])
@pytest.mark.parametrize("axis", [None, 1])
def test_the_correction_divides_by_n_less_it(name: str, axis: Any) -> None:
    op, reference = OPS[name]
    x = _distinct((3, 5), 2)
    check_op(lambda w: op(w, axis=axis, correction=1.0), [x], reference(x, axis=axis, ddof=1))


def test_results_are_floats_over_all_axes_and_arrays_along_one() -> None:
    w = ArrayWeight(_distinct((3, 4), 3))
    for op in (ml.max, ml.min, ml.logsumexp, ml.var, ml.std):
        assert isinstance(op(w), FloatLayer) and type(predict(op(w))) is float
        assert isinstance(op(w, axis=0), ArrayLayer) and predict(op(w, axis=0)).shape == (4,)


def test_ties_share_the_delta_evenly() -> None:
    x = np.array([[1.0, 3.0, 3.0, -2.0], [0.5, 0.5, 0.5, 0.5], [2.0, -1.0, -1.0, 1.5]])
    w = ArrayWeight(x)
    _, grads = ml.compute_gradients(ml.sum(ml.max(w, axis=1)))
    np.testing.assert_array_equal(grads[w], [[0, 0.5, 0.5, 0], [0.25] * 4, [1, 0, 0, 0]])
    _, grads = ml.compute_gradients(ml.sum(ml.min(w, axis=1)))
    np.testing.assert_array_equal(grads[w], [[0, 0, 0, 1], [0.25] * 4, [0, 0.5, 0.5, 0]])
    _, grads = ml.compute_gradients(ml.max(w))
    np.testing.assert_array_equal(grads[w], np.where(x == 3.0, 0.5, 0.0))


def test_logsumexp_is_stable() -> None:
    x = np.array([[1000.0, 1000.0, -1000.0], [-1000.0, -1001.0, -np.inf], [-np.inf, -np.inf, -np.inf]])
    value = predict(ml.logsumexp(ArrayWeight(x), axis=1))
    np.testing.assert_allclose(value[:2], [1000.0 + math.log(2.0), -1000.0 + math.log1p(math.exp(-1.0))])
    assert value[2] == -np.inf
    assert predict(ml.logsumexp(ArrayWeight(np.array([np.inf, 0.0])))) == np.inf
    w = ArrayWeight(x[:2])  # its gradient is the softmax along the axis
    _, grads = ml.compute_gradients(ml.sum(ml.logsumexp(w, axis=1)))
    np.testing.assert_allclose(grads[w], [[0.5, 0.5, 0.0], [1 / (1 + math.exp(-1)), 1 / (1 + math.e), 0.0]])


def test_var_takes_two_passes() -> None:
    # a large mean and a small spread: E[x**2] - E[x]**2 would lose every digit
    x = 1e9 + np.array([1.0, 2.0, 3.0, 4.0])
    assert predict(ml.var(ArrayWeight(x))) == pytest.approx(1.25, rel=1e-12)
    assert predict(ml.std(ArrayWeight(x), correction=1.0)) == pytest.approx(
        np.std(x - 1e9, ddof=1), rel=1e-12
    )


def test_the_std_of_equal_elements_has_a_zero_delta() -> None:
    w = ArrayWeight(np.array([[2.0, 2.0, 2.0], [1.0, 2.0, 4.0]]))
    _, grads = ml.compute_gradients(ml.sum(ml.std(w, axis=1)))
    assert np.all(np.isfinite(grads[w]))
    np.testing.assert_array_equal(grads[w][0], [0.0, 0.0, 0.0])


@pytest.mark.parametrize("correction", [0.0, 1.0])
@pytest.mark.parametrize("n", [3, 6, 7, 13])
def test_the_std_of_equal_elements_whose_mean_rounds_has_a_zero_delta(n: int, correction: float) -> None:
    """n copies of 0.1 (whose mean rounds: the std computed is ~1e-17, not 0) get a delta of 0,
    not ``+-1/n`` each (the rounding's residue over itself, along a direction that leaves the std
    unchanged), whole or along an axis, merged calls included; other rows keep their delta."""
    equal = np.full(n, 0.1)
    assert float(np.std(equal)) > 0.0  # the case: the mean rounds
    rows = np.stack([equal, np.linspace(-1.0, 1.0, n), equal * 3.0])
    w = ArrayWeight(rows)
    _, grads = ml.compute_gradients(ml.sum(ml.std(w, axis=1, correction=correction)))
    np.testing.assert_array_equal(grads[w][[0, 2]], np.zeros((2, n)))
    centred = rows[1] - rows[1].mean()
    expected = centred / ((n - correction) * np.sqrt(np.sum(centred**2) / (n - correction)))
    np.testing.assert_allclose(grads[w][1], expected, rtol=1e-12)
    v = ArrayWeight(equal)
    _, whole = ml.compute_gradients(ml.std(v, correction=correction))
    np.testing.assert_array_equal(whole[v], np.zeros(n))
    both = ml.std(w * 1.0, axis=1, correction=correction) + ml.std(w * 2.0, axis=1, correction=correction)
    _, merged = ml.compute_gradients(ml.sum(both), executor=ml.Executor(batching=True))
    np.testing.assert_array_equal(merged[w][[0, 2]], np.zeros((2, n)))


# ------------------------------------------------------------------------------------- batching


@pytest.mark.parametrize("name", sorted(OPS))
@pytest.mark.parametrize("axis", [None, 1, (0, 1)])
def test_merged_calls_equal_calls_alone(name: str, axis: Any) -> None:
    op, _ = OPS[name]
    w = ArrayWeight(_distinct((3, 4), 4))
    calls = 6
    terms = []
    for i in range(calls):
        out = op(w * (0.5 + 0.25 * i)) if axis is None else op(w * (0.5 + 0.25 * i), axis=axis)
        terms.append(
            out if isinstance(out, FloatLayer) else ml.sum(out * probe(tuple(predict(out).shape), i))
        )
    assert_merged_like_alone(ml.add_n(terms), w, name, calls)


def test_merged_ties_share_each_calls_delta_in_its_own_row() -> None:
    rows = [np.array([1.0, 1.0, 0.0]), np.array([2.0, 0.0, 2.0]), np.array([5.0, 5.0, 5.0])]
    weights = [ArrayWeight(r) for r in rows]
    loss = ml.add_n([ml.max(w * 1.0) for w in weights])
    on, off = gradients_of(loss, True), gradients_of(loss, False)
    assert on.stats.kinds["max"] == 1
    for w, expected in zip(weights, [[0.5, 0.5, 0], [0.5, 0, 0.5], [1 / 3] * 3], strict=True):
        np.testing.assert_allclose(on.gradients[w], expected, rtol=1e-15)
        assert_close(on.gradients[w], off.gradients[w], "gradient")


# --------------------------------------------------------------------------------------- errors


@pytest.mark.parametrize("name", sorted(OPS))
def test_errors_name_the_op(name: str) -> None:
    op, _ = OPS[name]
    w = ArrayWeight(np.ones((2, 3)))
    with pytest.raises(TypeError, match=rf"^{name}: keepdims=True needs an axis"):
        op(w, keepdims=True)
    with pytest.raises(TypeError, match=rf"^{name}: axis must be an int or a tuple of ints"):
        op(w, axis=1.0)
    result = op(w, axis=2).predict_blocking()
    assert not is_successful(result)
    assert str(result.failure()) == f"{name}: axis 2 is out of range for shape (2, 3)"


@pytest.mark.parametrize("name", ["max", "min", "logsumexp"])
def test_an_empty_axis_is_an_error(name: str) -> None:
    op, _ = OPS[name]
    result = op(ArrayWeight(np.ones((2, 0))), axis=1).predict_blocking()
    assert not is_successful(result)
    assert str(result.failure()) == f"{name}: cannot reduce an empty axis of shape (2, 0) (axis 1)"
    assert predict(op(ArrayWeight(np.ones((0, 2))), axis=1)).shape == (0,)  # nothing to reduce


def test_a_correction_must_leave_degrees_of_freedom() -> None:
    result = ml.var(ArrayWeight(np.ones((2, 3))), axis=0, correction=2.0).predict_blocking()
    assert not is_successful(result)
    assert str(result.failure()) == (
        "var: 2 elements along axis 0 of shape (2, 3) leave no degrees of freedom with correction 2.0"
    )
    with pytest.raises(TypeError, match=r"^std: correction must be a float of at least 0, got -1"):
        ml.std(ArrayWeight(np.ones(3)), correction=-1)


# ------------------------------------------------------------------------------- argmax, argmin


def test_argmax_and_argmin_give_integer_indices_of_values_weights_and_layers() -> None:
    x = np.array([[1.0, 4.0, 4.0], [3.0, -1.0, 0.0]])
    w = ArrayWeight(x)
    for source in (x, w, w * 1.0):
        assert int(ml.argmax(source)) == 1  # the first of ties, in the flattened array
        np.testing.assert_array_equal(ml.argmax(source, axis=1), [1, 0])
        np.testing.assert_array_equal(ml.argmin(source, axis=0, keepdims=True), [[0, 1, 1]])
        assert ml.argmin(source).dtype.kind == "i"
    strict_x: Any = xps.asarray(x)  # (typed as NumPy's arrays, the library's Array)
    strict: Any = ml.argmax(strict_x, axis=-1)
    assert type(strict) is type(strict_x) and xps.isdtype(strict.dtype, "integral")
    np.testing.assert_array_equal(np.asarray(strict), [1, 0])


def test_argmax_errors_name_it() -> None:
    with pytest.raises(ShapeError, match=r"^argmax: axis 2 is out of range for shape \(2, 3\)"):
        ml.argmax(np.ones((2, 3)), axis=2)
    with pytest.raises(ShapeError, match=r"^argmin: cannot take the index of an empty axis"):
        ml.argmin(np.ones((2, 0)), axis=1)
    with pytest.raises(TypeError, match=r"^argmax: expected an array"):
        ml.argmax(1.5)  # type: ignore[arg-type]
    with pytest.raises(ShapeError, match=r"^argmax: expected an array of at least 1 dimension"):
        ml.argmax(np.array(1.0))
    failing = ml.log(ArrayWeight(np.ones(2))) @ ArrayWeight(np.ones(3))  # fails when it runs
    with pytest.raises(ShapeError, match=r"^matmul: shapes"):
        ml.argmax(failing)


# ----------------------------------------------------------------------------------------- fuzz


@pytest.mark.parametrize("name", sorted(OPS))
@FUZZ_SETTINGS
@given(data=st.data(), merged=st.booleans(), train=st.booleans(), batching=st.booleans())
def test_a_reduction_works_or_names_itself(
    name: str, data: st.DataObject, merged: bool, train: bool, batching: bool
) -> None:
    outcome(_reduction(name)(data), merged, train, batching)


@pytest.mark.parametrize("delta", [1.0, -0.0, 0.0, 3.5e-39, -2.5, 1e-50])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_full_reductions_delta_is_the_delta_in_every_element_laid_out_as_its_input(
    delta: float, dtype: Any
) -> None:
    """A float delta broadcast back over a sum's input: ``-0.0 + d`` in the input's dtype, bit for
    bit (a -0.0 and a value that rounds to zero or a subnormal included), with the input's memory
    layout (a transposed view's delta is transposed the same way, so an op that made the view reads
    it without a copy)."""
    x = np.arange(24, dtype=dtype).reshape(4, 6).T  # a transposed view, as a convolution's output
    got = expand_to(np, delta, x, None, False)
    expected = np.full(x.shape, -0.0, dtype=dtype) + delta
    assert got.dtype == dtype and got.tobytes() == np.ascontiguousarray(expected).tobytes()
    assert got.strides == x.strides
