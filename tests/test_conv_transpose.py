"""Transposed convolution (``ml.conv_transpose2d``, ``nn.ConvTranspose2d``): values and gradients
equal to PyTorch's (its weights copied), the adjoint of ``conv2d`` (a law, without PyTorch),
gradients against finite differences, calls on single examples merged equal to the calls alone and
to one call on the batch, and errors that name the op. (The gradient fuzz and ``op_cases.CASES``
draw its parameters and run it on array-api-strict and CuPy.)"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from batching_check import assert_close, gradients_of
from hypothesis import given, settings
from hypothesis import strategies as st
from op_cases import predict, probe

import monadl as ml
from monadl import ArrayWeight, FloatLayer, ShapeError, nn


def uniform(seed: int, *shape: int) -> Any:
    return np.random.default_rng(seed).uniform(-1.0, 1.0, shape)


CASES: list[tuple[str, tuple[int, ...], tuple[int, ...], dict[str, Any]]] = [
    ("plain", (2, 3, 4, 5), (3, 2, 3, 3), {}),
    ("strided, padded", (2, 3, 4, 4), (3, 4, 3, 3), {"stride": 2, "padding": 1}),
    (
        "output padding",
        (2, 3, 4, 3),
        (3, 2, 3, 2),
        {"stride": (2, 3), "padding": (1, 0), "output_padding": (1, 2)},
    ),
    ("dilated", (1, 2, 3, 4), (2, 3, 2, 3), {"dilation": (2, 1), "padding": 1}),
    ("output padding below the dilation", (1, 2, 3, 3), (2, 1, 3, 3), {"dilation": 2, "output_padding": 1}),
    ("groups", (2, 4, 3, 3), (4, 3, 2, 2), {"groups": 2, "stride": 2}),
    ("depthwise", (2, 3, 4, 4), (3, 1, 3, 3), {"groups": 3, "padding": 1}),
    ("tiles the output (stride = kernel)", (2, 3, 3, 2), (3, 2, 2, 2), {"stride": 2}),
    ("unbatched", (3, 4, 4), (3, 2, 3, 3), {"stride": 2, "padding": 1, "output_padding": 1}),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0])
def test_the_values_and_gradients_are_pytorchs(
    case: tuple[str, tuple[int, ...], tuple[int, ...], dict[str, Any]],
) -> None:
    torch = pytest.importorskip("torch")
    _, x_shape, w_shape, params = case
    out_channels = w_shape[1] * params.get("groups", 1)
    x, w, b = uniform(1, *x_shape), uniform(2, *w_shape), uniform(3, out_channels)
    weights = [ArrayWeight(a) for a in (x, w, b)]
    out = ml.conv_transpose2d(*weights, **params)
    value = predict(out)
    weighting = probe(value.shape)
    _, gradients = ml.compute_gradients(ml.sum(out * weighting))
    tensors = [torch.tensor(a, requires_grad=True) for a in (x, w, b)]
    expected = torch.nn.functional.conv_transpose2d(*tensors, **params)
    assert out.shape == tuple(expected.shape) == value.shape
    np.testing.assert_allclose(value, expected.detach().numpy(), rtol=1e-12, atol=1e-12)
    (expected * torch.tensor(weighting)).sum().backward()
    for weight, t in zip(weights, tensors, strict=True):
        np.testing.assert_allclose(gradients[weight], t.grad.numpy(), rtol=1e-10, atol=1e-12)


@settings(max_examples=30, deadline=None, derandomize=True, database=None)
@given(data=st.data())
def test_it_is_the_adjoint_of_conv2d(data: st.DataObject) -> None:
    """``<conv_transpose2d(x, w), y> = <x, conv2d(y, w)>`` for every stride, padding, dilation and
    group count (the transposed convolution is the convolution's transpose), with ``y`` of the
    transposed convolution's output shape."""
    draw = data.draw
    groups = draw(st.integers(1, 2))
    c, o = groups * draw(st.integers(1, 2)), groups * draw(st.integers(1, 2))
    kernel = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    stride = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    dilation = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    padding = (draw(st.integers(0, 1)), draw(st.integers(0, 1)))
    sides = (draw(st.integers(3, 5)), draw(st.integers(3, 5)))  # (an output of 1 element at least)
    x = uniform(draw(st.integers(0, 99)), 2, c, *sides)
    w = uniform(draw(st.integers(0, 99)), c, o // groups, *kernel)
    params: dict[str, Any] = {"stride": stride, "padding": padding, "dilation": dilation, "groups": groups}
    up = predict(ml.conv_transpose2d(x, w, **params))
    y = uniform(draw(st.integers(0, 99)), *up.shape)
    down = predict(ml.conv2d(y, w, **params))
    assert down.shape == x.shape
    assert float(np.sum(up * y)) == pytest.approx(float(np.sum(x * down)), rel=1e-10, abs=1e-10)


@pytest.mark.parametrize("case", CASES[:6], ids=lambda c: c[0])
def test_the_gradients_are_finite_differences(
    case: tuple[str, tuple[int, ...], tuple[int, ...], dict[str, Any]],
) -> None:
    _, x_shape, w_shape, params = case
    out_channels = w_shape[1] * params.get("groups", 1)
    x, w, b = uniform(4, *x_shape), uniform(5, *w_shape), uniform(6, out_channels)
    shape = predict(ml.conv_transpose2d(x, w, b, **params)).shape
    weighting = probe(shape)

    def loss(x: ArrayWeight, w: ArrayWeight, b: ArrayWeight) -> FloatLayer:
        return ml.sum(ml.conv_transpose2d(x, w, b, **params) * weighting)

    ml.check_gradients(loss, x, w, b)


def test_single_examples_merge_and_equal_the_batch() -> None:
    """One ``ConvTranspose2d`` on three examples of (C, H, W): merged into one kernel forward and
    backward, equal to the calls alone, and each result equal to its row of the batch's."""
    layer = nn.ConvTranspose2d.new(
        4, 6, 3, stride=2, padding=1, output_padding=1, groups=2, seed=1, dtype=np.float64
    )
    xs = [ArrayWeight(uniform(10 + k, 4, 3, 5)) for k in range(3)]
    loss = ml.add_n([ml.sum(layer(x) * uniform(20 + k, 6, 6, 10)) for k, x in enumerate(xs)])
    on, off = gradients_of(loss, True), gradients_of(loss, False)
    assert on.stats.kinds["conv_transpose2d"] == 1 and on.stats.vjps["conv_transpose2d"] == 3, on.stats
    assert off.stats.kinds["conv_transpose2d"] == 3 and off.stats.vjps["conv_transpose2d"] == 9, off.stats
    assert_close(on.value, off.value, "loss")
    for weight in (layer.w, layer.b, *xs):
        assert weight is not None
        assert_close(on.gradients[weight], off.gradients[weight], repr(weight))
    batch = predict(layer(np.stack([x.data for x in xs])))
    for k, x in enumerate(xs):
        np.testing.assert_allclose(predict(layer(x)), batch[k], rtol=1e-13, atol=1e-13)


def test_calls_of_different_kernels_do_not_merge() -> None:
    x = uniform(30, 2, 3, 3)
    ws = [ArrayWeight(uniform(31 + k, 2, 3, 2, 2)) for k in range(2)]
    on = gradients_of(ml.add_n([ml.sum(ml.conv_transpose2d(x, w)) for w in ws]), True)
    assert on.stats.kinds["conv_transpose2d"] == 2
    for w in ws:  # d sum(out) / dw[c, o, i, j]: the sum of x's channel c, at every offset
        np.testing.assert_allclose(
            on.gradients[w], np.broadcast_to(x.sum(axis=(1, 2))[:, None, None, None], (2, 3, 2, 2))
        )


@pytest.mark.parametrize(
    ("make", "kind", "message"),
    [
        (
            lambda: ml.conv_transpose2d(np.ones((1, 3, 4, 4)), np.ones((2, 2, 3, 3))),
            ShapeError,
            r"conv_transpose2d: x of shape \(1, 3, 4, 4\) \(3 channels\) and w of shape \(2, 2, 3, 3\)",
        ),
        (
            lambda: ml.conv_transpose2d(np.ones((1, 3, 4, 4)), np.ones((3, 2, 3, 3)), groups=2),
            ShapeError,
            r"conv_transpose2d: .* 2 group",
        ),
        (
            lambda: ml.conv_transpose2d(np.ones((1, 3, 1, 1)), np.ones((3, 2, 1, 1)), padding=1),
            ShapeError,
            r"conv_transpose2d: an input of shape \(1, 3, 1, 1\), a kernel of shape \(1, 1\) and padding",
        ),
        (
            lambda: ml.conv_transpose2d(np.ones((1, 3, 4, 4)), np.ones((3, 2, 1, 1)), np.ones(3)),
            ShapeError,
            r"conv_transpose2d: bias of shape \(3,\) does not fit 2 output channels",
        ),
        (
            lambda: ml.conv_transpose2d(np.ones((3, 4)), np.ones((3, 2, 1, 1))),
            ShapeError,
            r"conv_transpose2d: needs x of shape \(\.\.\., C_in, H, W\)",
        ),
        (
            lambda: ml.conv_transpose2d(
                np.ones((1, 3, 4, 4)), np.ones((3, 2, 1, 1)), stride=2, output_padding=2
            ),
            ValueError,
            r"conv_transpose2d: output_padding \(2, 2\) must be less than the stride \(2, 2\) or the",
        ),
        (
            lambda: ml.conv_transpose2d(np.ones((1, 3, 4, 4)), np.ones((3, 2, 1, 1)), stride=(1, 0)),
            ValueError,
            r"conv_transpose2d: stride",
        ),
        (
            lambda: ml.conv_transpose2d(np.ones((1, 3, 4, 4)), np.ones((3, 2, 1, 1)), groups=0),
            ValueError,
            r"conv_transpose2d: groups must be at least 1",
        ),
        (lambda: ml.conv_transpose2d(np.ones((1, 3, 4, 4)), "w"), TypeError, r"conv_transpose2d: .* for w"),  # type: ignore[arg-type]
    ],
)
def test_errors_name_the_op_and_the_shapes(make: Any, kind: type[Exception], message: str) -> None:
    with pytest.raises(kind, match=message):
        predict(make())


def test_the_module_is_pytorchs() -> None:
    torch = pytest.importorskip("torch")
    layer = nn.ConvTranspose2d.new(
        4, 6, (3, 2), stride=2, padding=(1, 0), output_padding=1, groups=2, seed=3, dtype=np.float64
    )
    assert list(layer.weights()) == ["w", "b"] and layer.w.data.shape == (4, 3, 3, 2)
    theirs = torch.nn.ConvTranspose2d(
        4, 6, (3, 2), stride=2, padding=(1, 0), output_padding=1, groups=2
    ).double()
    with torch.no_grad():  # monadl's weights copied, the bias away from its initial zeros
        layer.b.data = uniform(40, 6)  # type: ignore[union-attr]
        theirs.weight.copy_(torch.tensor(np.asarray(layer.w.data)))
        theirs.bias.copy_(torch.tensor(np.asarray(layer.b.data)))  # type: ignore[union-attr]
        x = uniform(41, 2, 4, 5, 3)
        expected = theirs(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(predict(layer(x)), expected, rtol=1e-12, atol=1e-12)


def test_the_modules_builder() -> None:
    layer = nn.ConvTranspose2d.new(2, 3, 2, bias=False, seed=0)
    assert (
        list(layer.weights()) == ["w"]
        and layer.w.data.dtype == np.float32
        and layer.w.data.shape == (2, 3, 2, 2)
    )
    assert np.std(np.asarray(layer.w.data)) == pytest.approx(12**-0.5, rel=0.5)  # fan_in 3 * 2 * 2
    drawn = nn.ConvTranspose2d.new(2, 3, 2, init=nn.init.xavier_uniform, seed=5)
    np.testing.assert_array_equal(drawn.w.data, nn.init.xavier_uniform((2, 3, 2, 2), seed=5))
    assert predict(layer(uniform(7, 2, 3, 3).astype(np.float32))).shape == (3, 4, 4)
    with pytest.raises(
        ValueError, match=r"ConvTranspose2d.new: 3 inputs and 4 outputs do not divide into 2 groups"
    ):
        nn.ConvTranspose2d.new(3, 4, 3, groups=2)
    with pytest.raises(ValueError, match=r"ConvTranspose2d: b must have shape \(3,\)"):
        nn.ConvTranspose2d(ArrayWeight(uniform(1, 2, 3, 1, 1)), ArrayWeight(uniform(2, 2)))
    with pytest.raises(ValueError, match="ConvTranspose2d: w must have 4 dimensions"):
        nn.ConvTranspose2d(ArrayWeight(uniform(1, 2, 3, 1)))
