"""Layer normalisation (``ml.layer_norm``, ``nn.LayerNorm``): its values against NumPy (and PyTorch
where installed), its hand-written vjp against finite differences, merged calls equal to calls on
their own, its NumPy path equal to the array API one, and errors that name it."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from batching_check import merged_and_alone
from op_cases import predict

import monadl as ml
from monadl import ArrayWeight, FloatLayer, nn
from monadl.dsl.norm import _forward, _vjp_x
from monadl.typeclasses.backend import NUMPY


def uniform(seed: int, *shape: int) -> np.ndarray[Any, np.dtype[np.float64]]:
    return np.random.default_rng(seed).uniform(-2.0, 2.0, shape)


def reference(x: Any, w: Any = None, b: Any = None, eps: float = 1e-5) -> Any:
    """Layer norm in plain NumPy, in float64."""
    x = np.asarray(x, dtype=np.float64)
    y = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + eps)
    return y * (1.0 if w is None else w) + (0.0 if b is None else b)


@pytest.mark.parametrize("shape", [(5,), (3, 5), (2, 3, 4)])
@pytest.mark.parametrize("affine", ["none", "both", "weight", "bias"])
def test_the_values_are_numpys(shape: tuple[int, ...], affine: str) -> None:
    x, n = uniform(1, *shape), shape[-1]
    w = uniform(2, n) if affine in ("both", "weight") else None
    b = uniform(3, n) if affine in ("both", "bias") else None
    out = predict(ml.layer_norm(x, w, b, eps=1e-3))
    np.testing.assert_allclose(out, reference(x, w, b, 1e-3), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_dtype_is_kept(dtype: type[np.floating[Any]]) -> None:
    x = uniform(4, 3, 6).astype(dtype)
    w, b = np.ones(6, dtype=dtype), np.zeros(6, dtype=dtype)
    out = predict(ml.layer_norm(x, w, b))
    assert out.dtype == dtype
    np.testing.assert_allclose(out, reference(x), rtol=1e-5 if dtype == np.float32 else 1e-12, atol=1e-5)


def test_the_values_and_gradients_are_pytorchs() -> None:
    torch = pytest.importorskip("torch")
    x, w, b = uniform(5, 2, 3, 7), uniform(6, 7), uniform(7, 7)
    probe = uniform(8, 2, 3, 7)
    weights = [ArrayWeight(a) for a in (x, w, b)]
    value, gradients = ml.compute_gradients(ml.sum(ml.layer_norm(*weights) * probe))
    tx, tw, tb = (torch.tensor(a, requires_grad=True) for a in (x, w, b))
    loss = (torch.nn.functional.layer_norm(tx, (7,), tw, tb, 1e-5) * torch.tensor(probe)).sum()
    loss.backward()
    assert value == pytest.approx(loss.item(), rel=1e-12)
    for weight, t in zip(weights, (tx, tw, tb), strict=True):
        np.testing.assert_allclose(gradients[weight], t.grad.numpy(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize(
    "shape, affine",
    [((6,), "both"), ((3, 4), "both"), ((2, 2, 3), "none"), ((3, 4), "weight"), ((3, 4), "bias")],
)
def test_the_gradients_are_finite_differences(shape: tuple[int, ...], affine: str) -> None:
    n = shape[-1]
    probe = uniform(9, *shape)
    inputs: list[Any] = [uniform(10, *shape)]
    if affine in ("both", "weight"):
        inputs.append(uniform(11, n))
    if affine in ("both", "bias"):
        inputs.append(uniform(12, n))

    def loss(x: ArrayWeight, *p: ArrayWeight) -> FloatLayer:
        w = p[0] if affine in ("both", "weight") else None
        b = p[-1] if affine in ("both", "bias") else None
        return ml.sum(ml.layer_norm(x, w, b, eps=0.1) * probe)

    ml.check_gradients(loss, *inputs)


def test_merged_calls_equal_calls_on_their_own() -> None:
    """Rows of several sequences normalised by one LayerNorm: merged into one call (the weight and
    bias shared, their deltas summed once), the values and gradients equal."""

    def loss() -> FloatLayer:
        norm = nn.LayerNorm.new(4)
        xs = [ArrayWeight(uniform(20 + k, 3, 4)) for k in range(4)]
        return ml.add_n([ml.sum(norm(x * 2.0) * uniform(30 + k, 3, 4)) for k, x in enumerate(xs)])

    merged, alone = merged_and_alone(loss)
    assert merged.stats.merged > 0 and alone.stats.merged == 0
    assert merged.stats.kinds.get("layer_norm", 0) < alone.stats.kinds["layer_norm"]


def test_the_numpy_path_is_the_array_api_ones() -> None:
    import array_api_compat.numpy as compat

    x, w, b = uniform(40, 5, 6), uniform(41, 6), uniform(42, 6)
    fast, (xhat, rstd) = _forward(NUMPY, x, w, b, 1e-5)
    generic, (xhat_g, rstd_g) = _forward(compat, x, w, b, 1e-5)
    for a, g in ((fast, generic), (xhat, xhat_g), (rstd, rstd_g)):
        np.testing.assert_allclose(a, g, rtol=1e-14, atol=1e-14)
    d = uniform(43, 5, 6)
    np.testing.assert_allclose(
        _vjp_x(NUMPY, d, (xhat, rstd), x, w, b, eps=1e-5),
        _vjp_x(compat, d, (xhat, rstd), x, w, b, eps=1e-5),
        rtol=1e-13,
        atol=1e-13,
    )


@pytest.mark.parametrize("affine", ["none", "weight", "both"])
@pytest.mark.parametrize("shape", [(3, 0), (2, 1, 0), (0, 4), (0,)])
def test_empty_axes_give_empty_results(shape: tuple[int, ...], affine: str) -> None:
    """No features (``(3, 0)``) or no rows: an empty result of x's shape and empty gradients of
    each operand's shape, as PyTorch's ``layer_norm`` gives (not a ZeroDivisionError)."""
    n = shape[-1]
    x = uniform(50, *shape)
    w, b = uniform(51, n), uniform(52, n)
    inputs = {"none": [x], "weight": [x, w], "both": [x, w, b]}[affine]

    def op(*ws: Any) -> Any:
        return ml.layer_norm(*ws)

    assert predict(op(*(ArrayWeight(a) for a in inputs))).shape == shape
    gradients = ml.check_gradients(lambda *ws: ml.sum(op(*ws)), *inputs)
    assert [np.shape(g) for g in gradients] == [a.shape for a in inputs]
    torch = pytest.importorskip("torch")
    tensors = [torch.tensor(a, requires_grad=True) for a in inputs]
    out = torch.nn.functional.layer_norm(tensors[0], (n,), *tensors[1:])
    assert tuple(out.shape) == shape
    out.sum().backward()
    for g, t in zip(gradients, tensors, strict=True):
        np.testing.assert_array_equal(g, t.grad.numpy())


def test_errors_name_the_op() -> None:
    with pytest.raises(
        ml.ShapeError, match=r"layer_norm: weight of shape \(3,\) does not fit x of shape \(2, 4\)"
    ):
        predict(ml.layer_norm(uniform(1, 2, 4), uniform(2, 3)))
    with pytest.raises(ml.ShapeError, match="layer_norm: x must have a feature axis"):
        predict(ml.layer_norm(np.asarray(1.0)))
    with pytest.raises(ValueError, match="layer_norm: eps must be a positive float"):
        ml.layer_norm(uniform(1, 2, 4), eps=0.0)
    with pytest.raises(TypeError, match="layer_norm: expected an array"):
        ml.layer_norm(1.5)  # type: ignore[arg-type]


def test_the_module() -> None:
    norm = nn.LayerNorm.new(3, eps=1e-3, dtype=np.float32)
    assert list(norm.weights()) == ["weight", "bias"]
    assert norm.weight is not None and norm.weight.data.dtype == np.float32
    np.testing.assert_array_equal(norm.weight.data, np.ones(3))
    assert list(nn.LayerNorm.new(3, affine=False).weights()) == []
    x = uniform(50, 2, 3)
    np.testing.assert_allclose(
        predict(nn.LayerNorm.new(3, eps=1e-3, dtype=np.float64)(x)), reference(x, eps=1e-3), rtol=1e-12
    )
    with pytest.raises(ValueError, match="LayerNorm: weight and bias"):
        nn.LayerNorm(ArrayWeight(np.ones(3)), ArrayWeight(np.zeros(4)))
