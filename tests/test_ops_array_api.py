"""The op cases of ``op_cases.CASES`` on array-api-strict arrays: forward values and gradients equal
NumPy's. array-api-strict implements the array API standard and nothing more, so an op whose rules
use a NumPy-only call (or a NumPy-only leniency) fails here."""

from __future__ import annotations

from typing import Any

import array_api_strict as xps
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from op_cases import (
    CASES,
    F64,
    NUMPY,
    Backend,
    OpCase,
    check_merged_trees,
    check_replayed_gathers,
    predict,
    run_case,
)

import monadl
from monadl.dsl.ops.linalg import LINEAR
from monadl.typeclasses.backend import minus_zeros, stack_arrays

STRICT_ARRAY = type(xps.asarray(0.0))


def _strict_to_numpy(x: Any) -> F64:
    assert isinstance(x, STRICT_ARRAY), f"expected an array_api_strict array, got {type(x).__name__}: {x!r}"
    return np.asarray(np.from_dlpack(x))


STRICT = Backend("array_api_strict", xps.asarray, _strict_to_numpy)
OTHER_DEVICE = xps.Device("device1")
STRICT_ELSEWHERE = Backend(
    "array_api_strict on device1", lambda a: xps.asarray(a, device=OTHER_DEVICE), _strict_to_numpy
)
"""The same on a device other than the default: an array a kernel makes on the default device (a
padding, a delta's zeros, a one-hot, an index) cannot be combined with its operands there."""


def _on(device: Any, values: list[float]) -> Any:
    return xps.asarray(values, device=device)


TOL = 1e-12


@pytest.mark.parametrize("case", CASES, ids=str)
def test_op_matches_numpy(case: OpCase) -> None:
    _assert_same_as_numpy(case)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_op_matches_numpy_on_another_device(case: OpCase) -> None:
    _assert_same_as_numpy(case, STRICT_ELSEWHERE)


def _assert_same_as_numpy(case: OpCase, backend: Backend = STRICT) -> None:
    expected_forward, expected_loss, expected_grads = run_case(case, NUMPY)
    forward, loss, grads = run_case(case, backend)
    if isinstance(expected_forward, float):
        assert type(forward) is float
    else:
        assert np.shape(forward) == np.shape(expected_forward)
    np.testing.assert_allclose(forward, expected_forward, rtol=TOL, atol=TOL, err_msg="forward")
    assert loss == pytest.approx(expected_loss, rel=TOL, abs=TOL)
    for i, (g, expected) in enumerate(zip(grads, expected_grads, strict=True)):
        assert type(g) is type(expected) and np.shape(g) == np.shape(expected)
        np.testing.assert_allclose(g, expected, rtol=TOL, atol=TOL, err_msg=f"gradient of input {i}")


def test_strict_weights_stay_strict() -> None:
    """Weights copy strict arrays as strict arrays, and the forward of a strict graph is strict."""
    w = monadl.ArrayWeight(STRICT.asarray(np.array([[1.0, 2.0], [3.0, 4.0]])))
    data: Any = w.data
    assert isinstance(data, STRICT_ARRAY)
    out = predict(monadl.tanh(w @ w) + 1.0)
    assert isinstance(out, STRICT_ARRAY)
    expected = np.tanh(np.array([[7.0, 10.0], [15.0, 22.0]])) + 1.0
    np.testing.assert_allclose(np.from_dlpack(out), expected, rtol=TOL)


def test_mixing_devices_is_an_error_naming_both() -> None:
    other = xps.Device("device1")
    a = monadl.ArrayWeight(STRICT.asarray(np.array([1.0, 2.0])))
    b = monadl.ArrayWeight(_on(other, [3.0, 4.0]))
    with pytest.raises(ValueError, match="add") as raised:
        monadl.compute_gradients(monadl.sum(a + b))
    assert str(xps.Device("CPU_DEVICE")) in str(raised.value) and str(other) in str(raised.value)


@pytest.mark.filterwarnings(
    "error::UserWarning"
)  # (array-api-strict warns on comparing its dtypes with NumPy's)
@pytest.mark.parametrize("numpy_first", [True, False])
def test_mixing_numpy_and_another_namespace_is_an_error_in_either_order(numpy_first: bool) -> None:
    """A NumPy operand first takes the NumPy fast path: the check must still see the other one."""
    host = monadl.ArrayWeight(np.array([1.0, 2.0]))
    strict = monadl.ArrayWeight(STRICT.asarray(np.array([3.0, 4.0])))
    a, b = (host, strict) if numpy_first else (strict, host)
    with pytest.raises(ValueError, match="add: operands live on different devices") as raised:
        monadl.compute_gradients(monadl.sum(a + b))
    assert "cpu" in str(raised.value) and "CPU_DEVICE" in str(raised.value)


# Shape-dependent rules (indexing in vjps, axes, 1-d promotion) on hypothesis-generated shapes.
SHAPES = hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=4)


def _values(seed: int, shape: tuple[int, ...]) -> F64:
    return np.random.default_rng([seed, *shape]).uniform(-2.0, 2.0, shape)


def _draw_case(family: str, data: st.DataObject) -> OpCase:
    shape = data.draw(SHAPES)
    ndim = len(shape)
    x = _values(0, shape)
    if family == "concatenate":
        axis = data.draw(st.integers(-ndim, ndim - 1))
        ax = axis % ndim
        n = data.draw(st.integers(1, 3))
        xs = tuple(
            _values(i, (*shape[:ax], data.draw(st.integers(1, 3)), *shape[ax + 1 :])) for i in range(n)
        )
        return OpCase(f"concatenate axis {axis}", lambda c, *ws: monadl.concatenate(ws, axis=axis), xs)
    if family == "sum" or family == "mean":
        fn = monadl.sum if family == "sum" else monadl.mean
        axes = data.draw(hnp.valid_tuple_axes(ndim, min_size=1))
        keepdims = data.draw(st.booleans())
        return OpCase(family, lambda c, w: fn(w, axis=axes, keepdims=keepdims), (x,))
    if family == "transpose":
        perm = tuple(data.draw(st.permutations(range(ndim))))
        return OpCase("transpose", lambda c, w: monadl.transpose(w, perm), (x,))
    if family == "softmax":
        axis = data.draw(st.integers(-ndim, ndim - 1))
        return OpCase(
            "softmax", lambda c, w: monadl.log_softmax(monadl.softmax(w, axis=axis), axis=axis), (x,)
        )
    if family == "take_rows":
        rows = shape[0]
        indices = data.draw(hnp.arrays(np.int64, data.draw(SHAPES)[:2], elements=st.integers(0, rows - 1)))
        return OpCase("take_rows", lambda c, w: monadl.take_rows(w, c(indices)), (x,))
    if family == "matmul":
        m, k, n, s = data.draw(st.tuples(*[st.integers(1, 3)] * 4))
        a_shape = data.draw(st.sampled_from([(k,), (m, k), (s, m, k), (1, m, k)]))
        b_shape = data.draw(st.sampled_from([(k,), (k, n), (s, k, n)]))
        return OpCase("matmul", lambda c, a, b: a @ b, (_values(1, a_shape), _values(2, b_shape)))
    assert family == "broadcast"
    a_shape, b_shape = data.draw(
        hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=1, max_dims=3, max_side=3)
    ).input_shapes
    return OpCase(
        "broadcast",
        lambda c, a, b: monadl.maximum(a * b - a / (b * b + 1.0), b + 0.25),
        (_values(3, a_shape), _values(4, b_shape)),
    )


@pytest.mark.parametrize(
    "family", ["concatenate", "sum", "mean", "transpose", "softmax", "take_rows", "matmul", "broadcast"]
)
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_shapes_match_numpy(family: str, data: st.DataObject) -> None:
    _assert_same_as_numpy(_draw_case(family, data))


@pytest.mark.parametrize("bias", ["array", "float"])
@pytest.mark.parametrize("lead", [(), (2,), (2, 3)])
def test_the_fan_out_rules_of_linear_match_numpy(bias: str, lead: tuple[int, ...]) -> None:
    """``linear``'s ``FanOut`` rules (three calls of one x with different weights as one): off NumPy
    they take one batched matmul, on NumPy a matmul per weight; the results are NumPy's."""
    rng = np.random.default_rng(5)
    x = rng.normal(size=(*lead, 3))
    ws = tuple(rng.normal(size=(3, 4)) for _ in range(3))
    bs: tuple[Any, ...] = tuple(
        rng.normal(size=4) if bias == "array" else float(rng.normal()) for _ in range(3)
    )
    d = rng.normal(size=(3, *lead, 4))
    fan = LINEAR.batch.fan if LINEAR.batch is not None else None
    assert fan is not None
    expected = [fan.forward(np, x, ws, bs), *(vjp(np, d, None, x, ws, bs) for vjp in fan.vjps)]
    for j in range(3):  # the calls one by one
        np.testing.assert_allclose(expected[0][j], x @ ws[j] + bs[j], rtol=TOL)
    s = STRICT.asarray
    strict_bs = tuple(s(b) for b in bs) if bias == "array" else bs
    args = (s(x), tuple(s(w) for w in ws), strict_bs)
    got = [fan.forward(xps, *args), *(vjp(xps, s(d), None, *args) for vjp in fan.vjps)]
    for g, e in zip(got, expected, strict=True):
        np.testing.assert_allclose(STRICT.to_numpy(g), e, rtol=TOL, atol=TOL)


@settings(max_examples=40, deadline=None)
@given(
    st.sampled_from([np.int64, np.float32, np.float64]),
    hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=3),
    st.integers(1, 6),
    st.data(),
)
def test_stacked_rows_equal_stack_on_numpy_and_strict(
    dtype: Any, shape: tuple[int, ...], n: int, data: st.DataObject
) -> None:
    # Integer values for every dtype: stacking does not look at them, and drawing floats fails where
    # a package imported by other tests set flush-to-zero (no subnormals for hypothesis to draw).
    arrays = [data.draw(hnp.arrays(dtype, shape, elements=st.integers(-1000, 1000))) for _ in range(n)]
    stacked = stack_arrays(arrays)  # np.array of the list, not np.stack: the same array
    expected = np.stack(arrays)
    assert type(stacked) is np.ndarray and stacked.dtype == expected.dtype and stacked.shape == expected.shape
    np.testing.assert_array_equal(stacked, expected)
    assert not any(np.shares_memory(stacked, a) for a in arrays)
    strict = stack_arrays([xps.asarray(a) for a in arrays])
    assert isinstance(strict, STRICT_ARRAY)
    np.testing.assert_array_equal(_strict_to_numpy(strict), expected)


@pytest.mark.parametrize("shape", [(), (0,), (3,), (2, 3)])
def test_minus_zeros_are_negative_zeros_on_numpy_and_strict(shape: tuple[int, ...]) -> None:
    for xp, dtype, to_numpy in ((np, np.float32, np.asarray), (xps, xps.float64, _strict_to_numpy)):
        out = minus_zeros(xp, shape, dtype)
        values = to_numpy(out)
        assert values.shape == shape and out.dtype == dtype
        assert np.all(values == 0.0) and np.all(np.signbit(values))


# ------------------------------------------------------------- merged and unmerged graphs, strict


@pytest.mark.parametrize("uneven", [False, True], ids=["complete", "uneven"])
@pytest.mark.parametrize("batching", [True, False], ids=["merged", "unmerged"])
def test_batched_graphs_on_strict_arrays_match_numpy(batching: bool, uneven: bool) -> None:
    # Merging stacks rows, gathers them and scatters deltas by index arrays, which the array API
    # allows only in a few forms (no assignment to an index array; every axis indexed): this runs
    # every such path under array-api-strict. Word ids are Python ints, kept as NumPy indices.
    check_merged_trees(STRICT, batching, uneven, TOL)


def test_replayed_gathers_on_strict_arrays_match_numpy() -> None:
    check_replayed_gathers(STRICT, TOL)


def test_a_sparse_delta_of_strict_rows_prints() -> None:
    table = monadl.ArrayWeight(STRICT.asarray(np.ones((5, 2))))
    _, gradients = monadl.compute_gradients(monadl.sum(monadl.take_rows(table, [1, 3, 1])))
    assert repr(gradients[table]) == "SparseRows(rows=3, shape=(5, 2), dtype=array_api_strict.float64)"
