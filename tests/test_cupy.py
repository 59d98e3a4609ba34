"""The op cases of ``op_cases.CASES`` on CuPy arrays: forward values and gradients equal NumPy's.

Skipped, with the reason, where CuPy is not installed or no GPU is present.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from op_cases import CASES, F64, NUMPY, Backend, OpCase, predict, run_case

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
