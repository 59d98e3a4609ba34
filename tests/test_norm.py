"""Layer, group and RMS normalisation (``ml.layer_norm``, ``ml.group_norm``, ``ml.rms_norm`` and
their modules): values against NumPy (and PyTorch where installed), hand-written vjps against
finite differences, merged calls equal to calls on their own (and single examples to the batch),
layer norm's NumPy path equal to the array API one, and errors that name the op."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from batching_check import merged_and_alone
from op_cases import predict

import monadl as ml
from monadl import ArrayWeight, FloatLayer, nn
from monadl.dsl.ops.norm import _forward, _vjp_x
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


# ------------------------------------------------------------------------ group norm and RMS norm


def group_reference(
    x: Any, groups: int, w: Any = None, b: Any = None, eps: float = 1e-5, axis: int = 1
) -> Any:
    """Group norm in plain NumPy: each group's channels and the axes after them normalised."""
    a = axis % x.ndim
    lead, c, rest = x.shape[:a], x.shape[a], x.shape[a + 1 :]
    g = x.reshape(*lead, groups, -1)
    y = ((g - g.mean(-1, keepdims=True)) / np.sqrt(g.var(-1, keepdims=True) + eps)).reshape(x.shape)
    per_channel = (c, *(1,) * len(rest))
    return y * (1.0 if w is None else w.reshape(per_channel)) + (0.0 if b is None else b.reshape(per_channel))


@pytest.mark.parametrize(
    ("shape", "groups", "axis"),
    [((2, 6, 3, 4), 3, 1), ((2, 6), 2, 1), ((6, 3, 2), 2, 0), ((6, 3, 2), 3, -3), ((2, 3, 4, 5), 2, 2)],
)
def test_group_norm_values_are_numpys(shape: tuple[int, ...], groups: int, axis: int) -> None:
    x = uniform(60, *shape)
    c = shape[axis]
    w, b = uniform(61, c), uniform(62, c)
    np.testing.assert_allclose(
        predict(ml.group_norm(x, groups, w, b, eps=1e-3, axis=axis)),
        group_reference(x, groups, w, b, 1e-3, axis),
        rtol=1e-12,
        atol=1e-12,
    )
    np.testing.assert_allclose(
        predict(ml.group_norm(x, groups, axis=axis)),
        group_reference(x, groups, axis=axis),
        rtol=1e-12,
        atol=1e-12,
    )


@pytest.mark.parametrize("affine", ["both", "none", "weight", "bias"])
def test_group_norm_values_and_gradients_are_pytorchs(affine: str) -> None:
    torch = pytest.importorskip("torch")
    x, w, b = uniform(63, 2, 6, 3, 2), uniform(64, 6), uniform(65, 6)
    probe = uniform(66, 2, 6, 3, 2)
    arrays = {"both": [x, w, b], "none": [x], "weight": [x, w], "bias": [x, b]}[affine]
    weights = [ArrayWeight(a) for a in arrays]
    scale = weights[1] if affine in ("both", "weight") else None
    shift = weights[-1] if affine in ("both", "bias") else None
    value, gradients = ml.compute_gradients(ml.sum(ml.group_norm(weights[0], 3, scale, shift) * probe))
    tensors = [torch.tensor(a, requires_grad=True) for a in arrays]
    # (PyTorch's backward of a bias without a weight fails: a weight of ones is the same function)
    t_scale = tensors[1] if affine in ("both", "weight") else torch.ones(6, dtype=torch.float64)
    t_shift = tensors[-1] if affine in ("both", "bias") else None
    loss = (torch.nn.functional.group_norm(tensors[0], 3, t_scale, t_shift) * torch.tensor(probe)).sum()
    loss.backward()
    assert value == pytest.approx(loss.item(), rel=1e-12)
    for weight, t in zip(weights, tensors, strict=True):
        np.testing.assert_allclose(gradients[weight], t.grad.numpy(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize(("shape", "groups", "axis"), [((2, 4, 3), 2, 1), ((4, 2, 2), 4, -3), ((3, 6), 3, 1)])
def test_group_norm_gradients_are_finite_differences(shape: tuple[int, ...], groups: int, axis: int) -> None:
    c = shape[axis]
    probe = uniform(67, *shape)

    def loss(x: ArrayWeight, w: ArrayWeight, b: ArrayWeight) -> FloatLayer:
        return ml.sum(ml.group_norm(x, groups, w, b, eps=0.1, axis=axis) * probe)

    ml.check_gradients(loss, uniform(68, *shape), uniform(69, c), uniform(70, c))


def test_group_norm_of_single_examples_merges_and_equals_the_batch() -> None:
    """A GroupNorm of channel axis -3 on examples of (C, H, W): merged into one call (the axis
    counted past the rows), equal to the calls alone and to the rows of a call on the batch."""
    norm = nn.GroupNorm.new(2, 4, axis=-3, dtype=np.float64)
    norm.weight.data, norm.bias.data = uniform(71, 4), uniform(72, 4)  # type: ignore[union-attr]

    def loss() -> FloatLayer:
        xs = [ArrayWeight(uniform(73 + k, 4, 3, 2)) for k in range(3)]
        return ml.add_n([ml.sum(norm(x * 2.0) * uniform(80 + k, 4, 3, 2)) for k, x in enumerate(xs)])

    merged, alone = merged_and_alone(loss)
    assert merged.stats.kinds["group_norm"] == 1 and alone.stats.kinds["group_norm"] == 3
    xs = [uniform(73 + k, 4, 3, 2) for k in range(3)]
    batch = predict(nn.GroupNorm(norm.weight, norm.bias, 2, axis=1)(np.stack(xs)))
    for k, x in enumerate(xs):
        np.testing.assert_allclose(predict(norm(x)), batch[k], rtol=1e-13, atol=1e-13)
    positive = nn.GroupNorm(norm.weight, norm.bias, 2, axis=0)  # (counted from the start: also shifted)

    def loss_positive() -> FloatLayer:
        ws = [ArrayWeight(x) for x in xs]
        return ml.add_n([ml.sum(positive(w) * uniform(80 + k, 4, 3, 2)) for k, w in enumerate(ws)])

    merged, _ = merged_and_alone(loss_positive)
    assert merged.stats.kinds["group_norm"] == 1


def rms_reference(x: Any, k: int, w: Any = None, eps: float | None = None) -> Any:
    axes = tuple(range(x.ndim - k, x.ndim))
    e = np.finfo(x.dtype).eps if eps is None else eps
    return x / np.sqrt(np.mean(x * x, axis=axes, keepdims=True) + e) * (1.0 if w is None else w)


@pytest.mark.parametrize(("shape", "normalized"), [((3, 5), 5), ((2, 3, 4), (3, 4)), ((4,), (4,))])
@pytest.mark.parametrize("eps", [None, 1e-3])
def test_rms_norm_values_are_numpys(shape: tuple[int, ...], normalized: Any, eps: float | None) -> None:
    x = uniform(90, *shape)
    k = 1 if isinstance(normalized, int) else len(normalized)
    w = uniform(91, *shape[len(shape) - k :])
    np.testing.assert_allclose(
        predict(ml.rms_norm(x, normalized, w, eps=eps)), rms_reference(x, k, w, eps), rtol=1e-12
    )
    np.testing.assert_allclose(
        predict(ml.rms_norm(x, normalized, eps=eps)), rms_reference(x, k, None, eps), rtol=1e-12
    )


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_rms_norm_eps_is_the_dtypes_machine_epsilon(dtype: type[np.floating[Any]]) -> None:
    """As PyTorch's default: ``finfo(dtype).eps``, which decides the value of a vector near 0."""
    x = np.full((1, 4), 1e-4, dtype=dtype)
    out = predict(ml.rms_norm(x, 4))
    assert out.dtype == dtype
    np.testing.assert_allclose(out, x / np.sqrt(np.float64(1e-8) + np.finfo(dtype).eps), rtol=1e-6)


def test_rms_norm_values_and_gradients_are_pytorchs() -> None:
    torch = pytest.importorskip("torch")
    x, w = uniform(92, 2, 3, 4), uniform(93, 3, 4)
    probe = uniform(94, 2, 3, 4)
    weights = [ArrayWeight(x), ArrayWeight(w)]
    value, gradients = ml.compute_gradients(ml.sum(ml.rms_norm(weights[0], (3, 4), weights[1]) * probe))
    tx, tw = (torch.tensor(a, requires_grad=True) for a in (x, w))
    loss = (torch.nn.functional.rms_norm(tx, (3, 4), tw) * torch.tensor(probe)).sum()
    loss.backward()
    assert value == pytest.approx(loss.item(), rel=1e-12)
    for weight, t in zip(weights, (tx, tw), strict=True):
        np.testing.assert_allclose(gradients[weight], t.grad.numpy(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize(("shape", "normalized"), [((3, 4), 4), ((2, 2, 3), (2, 3))])
def test_rms_norm_gradients_are_finite_differences(shape: tuple[int, ...], normalized: Any) -> None:
    probe = uniform(95, *shape)
    k = 1 if isinstance(normalized, int) else len(normalized)

    def loss(x: ArrayWeight, w: ArrayWeight) -> FloatLayer:
        return ml.sum(ml.rms_norm(x, normalized, w, eps=0.1) * probe)

    ml.check_gradients(loss, uniform(96, *shape), uniform(97, *shape[len(shape) - k :]))


def test_rms_norm_calls_merge() -> None:
    def loss() -> FloatLayer:
        norm = nn.RMSNorm.new(4, dtype=np.float64)
        xs = [ArrayWeight(uniform(100 + k, 3, 4)) for k in range(3)]
        return ml.add_n([ml.sum(norm(x * 2.0) * uniform(110 + k, 3, 4)) for k, x in enumerate(xs)])

    merged, alone = merged_and_alone(loss)
    assert merged.stats.kinds["rms_norm"] == 1 and alone.stats.kinds["rms_norm"] == 3


def test_group_and_rms_norm_errors_name_the_op() -> None:
    with pytest.raises(ml.ShapeError, match=r"group_norm: 4 groups do not divide the 6 channels \(axis 1\)"):
        predict(ml.group_norm(uniform(1, 2, 6, 3), 4))
    with pytest.raises(
        ml.ShapeError, match=r"group_norm: weight of shape \(4,\) does not fit the 6 channels"
    ):
        predict(ml.group_norm(uniform(1, 2, 6, 3), 2, uniform(2, 4)))
    with pytest.raises(
        ml.ShapeError, match=r"group_norm: channel axis 3 is not an axis of x of shape \(2, 6, 3\)"
    ):
        predict(ml.group_norm(uniform(1, 2, 6, 3), 2, axis=3))
    with pytest.raises(ValueError, match="group_norm: groups must be at least 1"):
        ml.group_norm(uniform(1, 2, 6), 0)
    with pytest.raises(ValueError, match="group_norm: eps must be a positive float"):
        ml.group_norm(uniform(1, 2, 6), 2, eps=-1.0)
    with pytest.raises(
        ml.ShapeError, match=r"rms_norm: x of shape \(2, 5\) does not end in the normalized shape \(4,\)"
    ):
        predict(ml.rms_norm(uniform(1, 2, 5), 4))
    with pytest.raises(
        ml.ShapeError, match=r"rms_norm: weight of shape \(3,\) does not fit the normalized shape \(5,\)"
    ):
        predict(ml.rms_norm(uniform(1, 2, 5), 5, uniform(2, 3)))
    with pytest.raises(ValueError, match="rms_norm: normalized_shape must be one size or more"):
        ml.rms_norm(uniform(1, 2, 5), ())
    with pytest.raises(TypeError, match="rms_norm: normalized_shape must be a sequence of ints"):
        ml.rms_norm(uniform(1, 2, 5), (2.5,))  # type: ignore[arg-type]


def test_the_group_and_rms_norm_modules_are_pytorchs() -> None:
    torch = pytest.importorskip("torch")
    x = uniform(120, 2, 6, 3, 4)
    group = nn.GroupNorm.new(3, 6, eps=1e-3, dtype=np.float64)
    assert (
        list(group.weights()) == ["weight", "bias"]
        and list(nn.GroupNorm.new(3, 6, affine=False).weights()) == []
    )
    theirs = torch.nn.GroupNorm(3, 6, eps=1e-3).double()
    rms = nn.RMSNorm.new((3, 4), dtype=np.float64)
    assert list(rms.weights()) == ["weight"] and rms.weight is not None and rms.weight.data.shape == (3, 4)
    theirs_rms = torch.nn.RMSNorm((3, 4)).double()
    group.weight.data, group.bias.data = uniform(121, 6), uniform(122, 6)  # type: ignore[union-attr]
    rms.weight.data = uniform(123, 3, 4)
    with torch.no_grad():
        theirs.weight.copy_(torch.tensor(np.asarray(group.weight.data)))  # type: ignore[union-attr]
        theirs.bias.copy_(torch.tensor(np.asarray(group.bias.data)))  # type: ignore[union-attr]
        theirs_rms.weight.copy_(torch.tensor(np.asarray(rms.weight.data)))
        expected, expected_rms = (m(torch.from_numpy(x)).numpy() for m in (theirs, theirs_rms))
    np.testing.assert_allclose(predict(group(x)), expected, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(predict(rms(x)), expected_rms, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match=r"GroupNorm.new: 4 groups do not divide 6 channels"):
        nn.GroupNorm.new(4, 6)
    with pytest.raises(
        ValueError, match=r"RMSNorm: weight of shape \(3,\) does not fit the normalized shape \(4,\)"
    ):
        nn.RMSNorm(ArrayWeight(np.ones(3)), (4,))
