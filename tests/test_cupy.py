"""The op cases of ``op_cases.CASES`` on CuPy arrays: forward values and gradients equal NumPy's.

Skipped, with the reason, where CuPy is not installed or no GPU is present.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
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

cp: Any = pytest.importorskip(
    "cupy", reason="CuPy is not installed (pip install monadl[cuda12] or monadl[cuda13])"
)


def _gpu_count() -> int:
    try:
        return int(cp.cuda.runtime.getDeviceCount())
    except Exception:  # noqa: BLE001 - CUDARuntimeError when there is no driver or no device
        return 0


if _gpu_count() == 0:
    pytest.skip("CuPy is installed but no CUDA GPU is present", allow_module_level=True)


def _cupy_to_numpy(x: Any) -> F64:
    assert isinstance(x, cp.ndarray), f"expected a CuPy array, got {type(x).__name__}: {x!r}"
    return np.asarray(x.get())


CUPY = Backend("cupy", cp.asarray, _cupy_to_numpy)
# GPU kernels (cuBLAS, CUDA's exp/log/tanh) may round differently from NumPy's, and sum in another order.
FORWARD_TOL = 1e-12
GRADIENT_RTOL = 1e-10
GRADIENT_ATOL = 1e-12


@pytest.mark.parametrize("case", CASES, ids=str)
def test_op_matches_numpy(case: OpCase) -> None:
    expected_forward, expected_loss, expected_grads = run_case(case, NUMPY)
    forward, loss, grads = run_case(case, CUPY)
    if isinstance(expected_forward, float):
        assert type(forward) is float
    else:
        assert np.shape(forward) == np.shape(expected_forward)
    np.testing.assert_allclose(forward, expected_forward, rtol=FORWARD_TOL, atol=FORWARD_TOL, err_msg="fwd")
    assert loss == pytest.approx(expected_loss, rel=FORWARD_TOL, abs=FORWARD_TOL)
    for i, (g, expected) in enumerate(zip(grads, expected_grads, strict=True)):
        assert type(g) is type(expected) and np.shape(g) == np.shape(expected)
        np.testing.assert_allclose(
            g, expected, rtol=GRADIENT_RTOL, atol=GRADIENT_ATOL, err_msg=f"gradient of input {i}"
        )


def test_weights_and_results_stay_on_the_gpu() -> None:
    w = monadl.ArrayWeight(cp.asarray([[1.0, 2.0], [3.0, 4.0]]))
    assert isinstance(w.data, cp.ndarray)
    out = predict(monadl.tanh(w @ w) + 1.0)
    assert isinstance(out, cp.ndarray)
    expected = np.tanh(np.array([[7.0, 10.0], [15.0, 22.0]])) + 1.0
    np.testing.assert_allclose(out.get(), expected, rtol=FORWARD_TOL)
    _, grads = monadl.compute_gradients(monadl.sum(monadl.tanh(w @ w)))
    assert isinstance(grads[w], cp.ndarray)


@pytest.mark.parametrize("cupy_first", [True, False])
def test_mixing_numpy_and_cupy_is_an_error_naming_both_devices(cupy_first: bool) -> None:
    on_gpu = monadl.ArrayWeight(cp.asarray([1.0, 2.0]))
    on_cpu = monadl.ArrayWeight(np.array([3.0, 4.0]))
    a, b = (on_gpu, on_cpu) if cupy_first else (on_cpu, on_gpu)
    with pytest.raises(ValueError, match="add") as raised:
        monadl.compute_gradients(monadl.sum(a + b))
    message = str(raised.value)
    assert "cpu" in message.lower() and "cuda" in message.lower(), message


# ------------------------------------------------------------------------ the fused kernels on a GPU
# (tests/test_fused_kernels.py runs the same kernels' text with NumPy, bit for bit against the rules)

FUSED_OPTIMIZERS: list[Any] = [
    monadl.SGD(0.1, weight_decay=0.01),
    monadl.Momentum(0.1, 0.9, weight_decay=0.01),
    monadl.Adam(0.01),
    monadl.Adam(0.01, weight_decay=0.01),
    monadl.AdamW(0.01),
    monadl.Adagrad(0.1),
    monadl.RMSprop(0.01, momentum=0.9),
    monadl.RMSprop(0.01, centered=True, weight_decay=0.01),
]


def _on_gpu(state: Any) -> Any:
    if isinstance(state, tuple):
        return tuple(_on_gpu(s) for s in state)
    return cp.asarray(state) if isinstance(state, np.ndarray) else state


def _parts(state: Any) -> tuple[Any, ...]:
    return state if isinstance(state, tuple) else (state,)  # (SGD's state is its step count)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("optimizer", FUSED_OPTIMIZERS, ids=repr)
def test_a_fused_update_on_the_gpu_is_numpys_to_an_ulp(optimizer: Any, dtype: Any) -> None:
    """Each operation rounds as NumPy's (no FMA contraction; sqrt and division correctly rounded)."""
    from monadl.dsl import fused

    fused._COMPILED.clear()
    rng = np.random.default_rng(0)
    data = rng.normal(size=(257, 33)).astype(dtype)
    state = optimizer.init(data)
    for _ in range(3):
        gradient = rng.normal(size=data.shape).astype(dtype)
        new, new_state = optimizer.update(cp.asarray(data), cp.asarray(gradient), _on_gpu(state))
        data, state = optimizer.update(data, gradient, state)
        assert isinstance(new, cp.ndarray) and new.dtype == dtype
        np.testing.assert_array_max_ulp(new.get(), data, maxulp=1)
        for mine, theirs in zip(_parts(new_state), _parts(state), strict=True):
            if isinstance(theirs, np.ndarray):
                np.testing.assert_array_max_ulp(mine.get(), theirs, maxulp=1)
    assert any(kernel.name.startswith(type(optimizer).__name__.lower()[:4]) for kernel in fused._COMPILED)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", ["sigmoid", "tanh", "gelu"])
def test_a_fused_activation_on_the_gpu_is_numpys(name: str, dtype: Any) -> None:
    """Forward and gradient of each fused activation against NumPy's (CUDA's exp and tanh may
    differ from NumPy's by an ulp or two)."""
    from monadl.dsl import fused

    fused._COMPILED.clear()
    x = np.random.default_rng(1).normal(scale=4.0, size=(64, 48)).astype(dtype)
    op = getattr(monadl, name)
    forward, losses, grads = [], [], []
    for arrays, host in ((np.asarray, np.asarray), (cp.asarray, _cupy_to_numpy)):
        w = monadl.ArrayWeight(arrays(x))
        forward.append(host(predict(op(w))))
        loss, gradients = monadl.compute_gradients(monadl.sum(op(w) * op(w)))
        losses.append(loss)
        grads.append(host(gradients[w]))
    rtol, atol = (1e-5, 1e-6) if dtype == np.float32 else (1e-12, 1e-14)
    np.testing.assert_allclose(forward[1], forward[0], rtol=rtol, atol=atol)
    np.testing.assert_allclose(grads[1], grads[0], rtol=rtol, atol=atol)
    assert any(kernel.name.startswith(name) for kernel in fused._COMPILED)


def test_a_step_on_the_gpu_names_the_weight_that_is_not_finite_and_changes_nothing() -> None:
    """The finite checks are read once a step, and the failing weight is named as on NumPy."""
    rows = [np.ones((2, 3)), np.arange(6.0).reshape(2, 3)]  # sqrt's gradient at 0 is infinite
    weights = [monadl.ArrayWeight(cp.asarray(r), name=f"w{k}") for k, r in enumerate(rows)]
    before = [w.data for w in weights]
    result = (monadl.sum(weights[0] * weights[0]) + monadl.sum(monadl.sqrt(weights[1]))).train_blocking(
        monadl.Adam(0.1)
    )
    error = result.failure()
    assert isinstance(error, monadl.NonFiniteGradientError)
    assert "name='w1'" in str(error) and "1 of 6 entries" in str(error)
    assert all(w.data is b for w, b in zip(weights, before, strict=True))


# ------------------------------------------------------------- merged graphs on the GPU


@pytest.mark.parametrize("uneven", [False, True], ids=["complete", "uneven"])
@pytest.mark.parametrize("batching", [True, False], ids=["merged", "unmerged"])
def test_batched_graphs_on_the_gpu_match_numpy(batching: bool, uneven: bool) -> None:
    # Merged groups gather their inputs and scatter their deltas by index arrays copied to the GPU.
    check_merged_trees(CUPY, batching, uneven, 1e-10)


def test_replayed_gathers_on_the_gpu_match_numpy() -> None:
    check_replayed_gathers(CUPY, 1e-10)
