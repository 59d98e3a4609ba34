"""Custom ops (``ml.custom_op``) and the public gradient checker (``ml.check_gradients``)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from returns.result import Failure, Success

import monadl as ml

softplus = ml.custom_op(
    "softplus",
    forward=lambda xp, x: xp.log1p(xp.exp(x)),
    vjps=(lambda xp, d, out, x: d * (1.0 - xp.exp(-out)),),
    elementwise=True,
)

# Two inputs, one static parameter, an output of another shape: (x * w) summed over an axis.
weighted_sum = ml.custom_op(
    "weighted_sum",
    forward=lambda xp, x, w, axis: xp.sum(x * w, axis=axis),
    vjps=(
        lambda xp, d, out, x, w, axis: xp.expand_dims(d, axis) * w,
        lambda xp, d, out, x, w, axis: xp.sum(xp.expand_dims(d, axis) * x, axis=0),
    ),
)

cube = ml.custom_op(
    "cube",
    forward=lambda xp, s: s * s * s,
    vjps=(lambda xp, d, out, s: 3.0 * s * s * d,),
    result=ml.FloatLayer,
)


def test_a_custom_op_computes_and_its_gradients_pass_the_checker() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(3, 4))
    np.testing.assert_allclose(softplus(x).predict_blocking().unwrap(), np.log1p(np.exp(x)), rtol=1e-15)
    ml.check_gradients(lambda w: ml.sum(softplus(w) * x), x)
    ml.check_gradients(lambda a, w: ml.sum(weighted_sum(a, w, axis=1) ** 2.0), x, rng.normal(size=(4,)))
    ml.check_gradients(lambda s: cube(s) * 2.0, 0.7)


def test_calls_of_an_elementwise_op_merge_and_equal_unmerged_ones() -> None:
    rng = np.random.default_rng(1)
    rows = [rng.normal(size=(5,)) for _ in range(6)]
    w = ml.ArrayWeight(rng.normal(size=(5,)))

    def loss() -> ml.FloatLayer:
        return ml.add_n([ml.sum(softplus(w * r)) for r in rows])

    merged = ml.Executor()
    value, gradients = ml.compute_gradients(loss(), executor=merged)
    assert merged.last_stats.kinds.get("softplus", 0) == 1  # six calls, one kernel
    value1, gradients1 = ml.compute_gradients(loss(), executor=ml.Executor(batching=False))
    assert value == pytest.approx(value1, rel=1e-12)
    np.testing.assert_allclose(gradients[w], gradients1[w], rtol=1e-12)


def test_the_checker_finds_a_wrong_vjp_and_names_the_input() -> None:
    wrong = ml.custom_op("wrong", forward=lambda xp, x: x * x, vjps=(lambda xp, d, out, x: d * x,))  # not 2x
    with pytest.raises(ml.GradientMismatch, match=r"gradient of input 0 \(shape \(3,\)\)"):
        ml.check_gradients(lambda w: ml.sum(wrong(w)), np.array([0.5, 1.0, 2.0]))
    with pytest.raises(ml.GradientMismatch, match="input 1 got no gradient"):
        ml.check_gradients(lambda a, b: ml.sum(softplus(a)), np.ones(2), np.ones(2))


def test_a_wrong_call_or_definition_is_named() -> None:
    with pytest.raises(TypeError, match="softplus: takes 1 operands"):
        softplus(np.ones(2), np.ones(2))
    with pytest.raises(TypeError, match="custom_op bad: vjps must be a non-empty tuple"):
        ml.custom_op("bad", forward=lambda xp, x: x, vjps=())
    bad_shape = ml.custom_op("bad_shape", forward=lambda xp, x: x * 1.0, vjps=(lambda xp, d, out, x: d[:1],))
    w = ml.ArrayWeight(np.ones(3))
    result = ml.sum(bad_shape(w)).train_blocking(ml.SGD(0.1))
    assert isinstance(result, Failure) and isinstance(result.failure(), ml.ShapeError)
    assert "bad_shape" in str(result.failure())
    np.testing.assert_array_equal(w.data, np.ones(3))


def test_a_custom_op_trains() -> None:
    w = ml.ArrayWeight(np.full(3, 2.0))
    for _ in range(50):
        assert isinstance(ml.sum(softplus(w)).train_blocking(ml.SGD(0.5)), Success)
    assert np.all(w.data < 0.0)  # softplus falls toward 0 as w goes negative


def test_a_finite_difference_that_is_not_finite_fails_the_check() -> None:
    # log is not defined a step below 1e-9: the finite difference is NaN, which compared with any
    # gradient (here a wrong 0) must fail, not pass as NaN > 0 (False) would let it.
    bad_log = ml.custom_op("bad_log", lambda xp, x: xp.log(x), (lambda xp, d, o, x: d * 0.0,))
    with pytest.raises(ml.GradientMismatch):
        ml.check_gradients(lambda w: ml.sum(bad_log(w)), np.array([1e-9, 1.0]))


# Static shapes (custom_op(shape_rule=)): an op's .shape and .dtype before it runs.
summed = ml.custom_op(  # weighted_sum with a rule of its parameter: the summed axis dropped
    "summed",
    forward=weighted_sum.primitive.forward,
    vjps=weighted_sum.primitive.vjps,
    shape_rule=lambda x, w, axis: x[:axis] + x[axis + 1 :],
)


def test_a_shape_rule_gives_the_runs_shape_and_dtype_before_it_runs() -> None:
    rng = np.random.default_rng(2)
    x, w = rng.normal(size=(3, 4, 5)), ml.ArrayWeight(rng.normal(size=(5,)).astype(np.float32))
    for axis in (0, 1):
        y = summed(x * w, w, axis=axis)
        z = ml.sum(y * 2.0, axis=0)  # a library op on it knows its shape too
        assert y.shape is not None and z.shape is not None
        value = y.predict_blocking().unwrap()
        assert (y.shape, y.dtype) == (value.shape, value.dtype)
        assert z.shape == z.predict_blocking().unwrap().shape


def test_without_a_rule_the_shape_is_not_known() -> None:
    y = weighted_sum(np.ones((3, 4)), np.ones(4), axis=1)
    assert y.shape is None and y.dtype is None
    assert (y * 2.0).shape is None


def test_a_float_ops_result_is_a_float_for_the_layers_built_on_it() -> None:
    x = np.ones((2, 3), dtype=np.float32)
    y = cube(ml.FloatWeight(0.5)) * x
    assert (y.shape, y.dtype) == ((2, 3), np.float32)


def test_a_wrong_rule_is_named_where_the_shape_is_asked() -> None:
    raises = ml.custom_op(
        "raises", forward=lambda xp, x: x, vjps=(lambda xp, d, out, x: d,), shape_rule=lambda x: (x[3],)
    )

    def as_list(x: tuple[int, ...]) -> Any:  # (mypy rejects a rule typed as giving a list)
        return list(x)

    listed = ml.custom_op(
        "listed", forward=lambda xp, x: x, vjps=(lambda xp, d, out, x: d,), shape_rule=as_list
    )
    x = np.ones((2, 3))
    with pytest.raises(ml.ShapeRuleError, match=r"custom_op raises: shape_rule raised IndexError.*\(2, 3\)"):
        _ = raises(x).shape
    with pytest.raises(TypeError, match=r"custom_op listed: shape_rule must return a tuple .* got \[2, 3\]"):
        _ = (listed(x) + 1.0).dtype  # asked through a layer built on it
    np.testing.assert_array_equal(raises(x).predict_blocking().unwrap(), x)  # the run does not ask it


def test_a_shape_rule_must_be_callable_and_for_an_array_op() -> None:
    with pytest.raises(TypeError, match="custom_op bad: shape_rule must be callable or None, got tuple"):
        ml.custom_op("bad", lambda xp, x: x, (lambda xp, d, out, x: d,), shape_rule=(3,))  # type: ignore[call-overload]
    with pytest.raises(TypeError, match="custom_op bad: shape_rule is for ArrayLayer ops"):
        ml.custom_op(
            "bad",
            lambda xp, s: s,
            (lambda xp, d, out, s: d,),
            result=ml.FloatLayer,  # type: ignore[arg-type]
            shape_rule=lambda s: s,
        )
