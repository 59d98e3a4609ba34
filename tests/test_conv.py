"""Convolution and pooling (``monadl.dsl.ops.conv``, ``monadl.nn.conv``): values and gradients against
PyTorch where it is installed, gradients against finite differences, batched equal to unbatched,
and errors that name the op. (Every op also has cases in ``op_cases.CASES``: NumPy gradients,
array-api-strict and CuPy.)"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from batching_check import assert_close, gradients_of
from op_cases import predict, probe

import monadl as ml
from monadl import ArrayLayer, ArrayWeight, ShapeError, nn
from monadl.gradcheck import check_gradients

RNG = np.random.default_rng(7)


def _u(*shape: int) -> Any:
    return RNG.uniform(-1.0, 1.0, shape)


# ----------------------------------------------------------------------------- against PyTorch

CONV_CASES: list[tuple[str, tuple[int, ...], tuple[int, ...], dict[str, Any]]] = [
    ("plain", (2, 3, 8, 7), (4, 3, 3, 3), {}),
    ("padded", (2, 3, 8, 8), (5, 3, 3, 3), {"padding": 1}),
    (
        "strided, dilated",
        (2, 3, 9, 8),
        (4, 3, 3, 2),
        {"stride": (2, 3), "padding": (2, 1), "dilation": (2, 1)},
    ),
    ("groups", (3, 6, 5, 5), (4, 3, 2, 2), {"groups": 2, "stride": 2}),
    ("depthwise", (2, 4, 6, 6), (4, 1, 3, 3), {"groups": 4, "padding": 1}),
    ("same", (2, 3, 6, 5), (2, 3, 4, 3), {"padding": "same", "dilation": 2}),
    ("1d", (2, 3, 11), (4, 3, 3), {"stride": 2, "padding": 2, "dilation": 2}),
    ("1d groups", (2, 4, 7), (6, 2, 2), {"groups": 2}),
    # windows that tile the padded input (stride = kernel): the input's delta is written, not added
    ("tiles the padded input", (2, 3, 4, 7), (4, 3, 3, 3), {"stride": 3, "padding": 1}),
    ("tiles the input, padded", (2, 3, 6, 6), (4, 3, 3, 3), {"stride": 3, "padding": 1}),
    ("1d tiles the padded input", (2, 3, 7), (4, 3, 3), {"stride": 3, "padding": 1}),
]


@pytest.mark.parametrize("case", CONV_CASES, ids=lambda c: c[0])
def test_conv_equals_torch(case: tuple[str, tuple[int, ...], tuple[int, ...], dict[str, Any]]) -> None:
    torch = pytest.importorskip("torch")
    _, x_shape, w_shape, params = case
    x, w, b = _u(*x_shape), _u(*w_shape), _u(w_shape[0])
    conv = ml.conv2d if len(x_shape) == 4 else ml.conv1d
    weights = [ArrayWeight(x), ArrayWeight(w), ArrayWeight(b)]
    out = conv(*weights, **params)
    value = predict(out)
    weighting = probe(value.shape)
    _, grads = ml.compute_gradients(ml.sum(out * weighting))
    tx, tw, tb = (torch.tensor(a, requires_grad=True) for a in (x, w, b))
    t_conv = torch.nn.functional.conv2d if len(x_shape) == 4 else torch.nn.functional.conv1d
    t_out = t_conv(tx, tw, tb, **params)
    (t_out * torch.tensor(weighting)).sum().backward()
    np.testing.assert_allclose(value, t_out.detach().numpy(), rtol=1e-12, atol=1e-12)
    for weight, t in zip(weights, (tx, tw, tb), strict=True):
        assert t.grad is not None
        np.testing.assert_allclose(grads[weight], t.grad.numpy(), rtol=1e-12, atol=1e-12)


POOL_CASES: list[tuple[str, tuple[int, ...], dict[str, Any]]] = [
    ("max_pool2d", (2, 3, 8, 8), {"kernel_size": 2}),
    ("max_pool2d", (2, 3, 7, 6), {"kernel_size": 3, "stride": 2, "padding": 1}),
    ("max_pool2d", (2, 3, 7, 6), {"kernel_size": (3, 2), "stride": 1}),
    ("avg_pool2d", (2, 3, 7, 6), {"kernel_size": (3, 2), "stride": (2, 1), "padding": 1}),
    ("avg_pool2d", (3, 5, 4), {"kernel_size": 2}),
    ("max_pool1d", (2, 3, 9), {"kernel_size": 3, "stride": 2, "padding": 1}),
    ("avg_pool1d", (2, 3, 9), {"kernel_size": 2}),
    # stride = kernel, padded: windows that tile the padded input, or the unpadded one
    ("max_pool2d", (2, 3, 4, 4), {"kernel_size": 3, "padding": 1}),
    ("max_pool2d", (2, 3, 6, 6), {"kernel_size": 3, "padding": 1}),
    ("avg_pool2d", (2, 3, 4, 7), {"kernel_size": 3, "padding": 1}),
    ("avg_pool1d", (1, 1, 9), {"kernel_size": 3, "padding": 1}),
    ("max_pool1d", (2, 3, 7), {"kernel_size": 3, "padding": 1}),
]


@pytest.mark.parametrize("case", POOL_CASES, ids=lambda c: f"{c[0]} {c[2]}")
def test_pool_equals_torch(case: tuple[str, tuple[int, ...], dict[str, Any]]) -> None:
    torch = pytest.importorskip("torch")
    name, shape, params = case
    x = RNG.permutation(int(np.prod(shape))).reshape(shape) / 10.0  # no ties: one maximum a window
    weight = ArrayWeight(x)
    out = getattr(ml, name)(weight, **params)
    value = predict(out)
    weighting = probe(value.shape)
    _, grads = ml.compute_gradients(ml.sum(out * weighting))
    tx = torch.tensor(x, requires_grad=True)
    t_out = getattr(torch.nn.functional, name)(tx, **params)
    (t_out * torch.tensor(weighting)).sum().backward()
    assert tx.grad is not None
    np.testing.assert_allclose(value, t_out.detach().numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(grads[weight], tx.grad.numpy(), rtol=1e-12, atol=1e-12)


def test_max_pool_sends_a_tied_windows_delta_to_its_first_maximum() -> None:
    x = ArrayWeight(np.array([[[1.0, 1.0], [0.0, 1.0]]]))
    _, grads = ml.compute_gradients(ml.sum(ml.max_pool2d(x, 2) * 3.0))
    np.testing.assert_array_equal(grads[x], [[[3.0, 0.0], [0.0, 0.0]]])


# -------------------------------------------------------------------------- finite differences


@pytest.mark.parametrize("case", CONV_CASES, ids=lambda c: c[0])
def test_conv_gradients_equal_finite_differences(
    case: tuple[str, tuple[int, ...], tuple[int, ...], dict[str, Any]],
) -> None:
    _, x_shape, w_shape, params = case
    conv = ml.conv2d if len(x_shape) == 4 else ml.conv1d
    out_shape = predict(conv(_u(*x_shape), _u(*w_shape), **params)).shape
    weighting = probe(out_shape)

    def loss(x: ArrayWeight, w: ArrayWeight, b: ArrayWeight) -> ml.FloatLayer:
        return ml.sum(ml.tanh(conv(x, w, b, **params)) * weighting)

    check_gradients(loss, _u(*x_shape), _u(*w_shape), _u(w_shape[0]))


def _seeded(seed: int, *shape: int) -> Any:
    return np.random.default_rng([seed, *shape]).uniform(-1.0, 1.0, shape)


@pytest.mark.parametrize("spatial", [1, 2])
def test_a_float_bias_is_added_to_every_output(spatial: int) -> None:
    """A float bias (a ``FloatWeight``, a ``FloatLayer``, a float or an int), as the type hints
    allow: the convolution plus that float everywhere, its gradient the sum of the output's delta."""
    conv = ml.conv2d if spatial == 2 else ml.conv1d
    x = _seeded(1, 2, 3, 5, 4) if spatial == 2 else _seeded(1, 2, 3, 6)
    w = _seeded(2, 4, 3, 2, 2) if spatial == 2 else _seeded(2, 4, 3, 2)
    params: dict[str, Any] = {"stride": 2, "padding": 1}
    plain = predict(conv(x, w, **params))
    weighting = probe(plain.shape)
    for b, added in (
        (ml.FloatWeight(0.75), 0.75),
        (ml.FloatWeight(0.25) * 3.0, 0.75),
        (0.75, 0.75),
        (1, 1.0),
    ):
        np.testing.assert_allclose(predict(conv(x, w, b, **params)), plain + added, rtol=1e-12, atol=1e-12)
    _, _, gb = check_gradients(lambda x, w, b: ml.sum(conv(x, w, b, **params) * weighting), x, w, 0.75)
    assert type(gb) is float and gb == pytest.approx(float(np.sum(weighting)), rel=1e-12)
    with pytest.raises(TypeError, match=f"conv{spatial}d: expected an array .* for b, got bool"):
        conv(x, w, True, **params)


def test_calls_sharing_a_float_weight_bias_merge_and_equal_calls_alone() -> None:
    def loss() -> ml.FloatLayer:
        w, b = ArrayWeight(_seeded(3, 3, 2, 2, 2)), ml.FloatWeight(0.5)
        terms = [
            ml.sum(ml.conv2d(ArrayWeight(_seeded(4 + i, 2, 4, 4)) * 1.0, w, b) * probe((3, 3, 3), i))
            for i in range(3)
        ]
        return ml.add_n(terms)

    on, off = gradients_of(loss(), True), gradients_of(loss(), False)
    assert_close(on.value, off.value, "loss")
    for a, b in zip(on.gradients.values(), off.gradients.values(), strict=True):
        assert_close(a, b, "gradient")
    assert on.stats.kinds["conv"] == 1 and off.stats.kinds["conv"] == 3


@pytest.mark.parametrize("case", POOL_CASES, ids=lambda c: f"{c[0]} {c[1]} {c[2]}")
def test_pool_gradients_equal_finite_differences(case: tuple[str, tuple[int, ...], dict[str, Any]]) -> None:
    name, shape, params = case
    x = RNG.permutation(int(np.prod(shape))).reshape(shape) / 10.0  # ties would have no derivative
    pool = getattr(ml, name)
    weighting = probe(predict(pool(x, **params)).shape)
    check_gradients(lambda w: ml.sum(pool(w, **params) * weighting), x)


def test_an_avg_pool_tiling_the_padded_input_sends_each_element_its_windows_delta() -> None:
    w = ArrayWeight(np.zeros((1, 1, 9)))
    _, grads = ml.compute_gradients(ml.sum(ml.avg_pool1d(w, 3, padding=1) * np.array([1.0, 2.0, 3.0])))
    # windows [pad, 0, 1], [2, 3, 4], [5, 6, 7]; element 8 is in none
    np.testing.assert_allclose(grads[w].ravel() * 3.0, [1, 1, 2, 2, 2, 3, 3, 3, 0])


# ------------------------------------------------------------------------------------- batching

Build = Callable[[list[ArrayWeight]], ArrayLayer]


def _merged_calls(build: Callable[[Any], ArrayLayer], inputs: list[Any]) -> ml.FloatLayer:
    """The sum of ``build`` over ``inputs`` (independent calls, ready together: they merge)."""
    return ml.add_n(
        [ml.sum(ml.tanh(build(x)) * probe(predict(build(x)).shape, i)) for i, x in enumerate(inputs)]
    )


@pytest.mark.parametrize(
    ("name", "x_shape", "build"),
    [
        ("conv2d", (2, 4, 6, 5), lambda w, b: lambda x: ml.conv2d(x, w, b, stride=2, padding=1, groups=2)),
        ("conv1d", (2, 4, 9), lambda w, b: lambda x: ml.conv1d(x, w, b, dilation=2, groups=2)),
        (
            "max_pool2d",
            (2, 4, 6, 5),
            lambda w, b: lambda x: ml.max_pool2d(ml.conv2d(x, w, b, groups=2), 2, stride=1),
        ),
        (
            "avg_pool2d",
            (2, 4, 6, 5),
            lambda w, b: lambda x: ml.avg_pool2d(ml.conv2d(x, w, b, groups=2), 2, padding=1),
        ),
        (
            "max_pool1d",
            (2, 4, 9),
            lambda w, b: lambda x: ml.max_pool1d(ml.conv1d(x, w, b, groups=2), 3, stride=2),
        ),
        (
            "avg_pool1d",
            (2, 4, 9),
            lambda w, b: lambda x: ml.avg_pool1d(ml.conv1d(x, w, b, groups=2), 2, padding=1),
        ),
    ],
)
def test_batched_conv_and_pooling_equal_unbatched(
    name: str, x_shape: tuple[int, ...], build: Callable[..., Callable[[Any], ArrayLayer]]
) -> None:
    w, b = ArrayWeight(_u(4, 2, *(3,) * (len(x_shape) - 2))), ArrayWeight(_u(4))
    xs = [ArrayWeight(_u(*x_shape)) for _ in range(3)]
    loss = _merged_calls(build(w, b), xs)
    on, off = gradients_of(loss, True), gradients_of(loss, False)
    assert on.value == pytest.approx(off.value, rel=1e-12)
    op = "conv" if name.startswith("conv") else name[:8]
    assert on.stats.kinds[op] == 1, on.stats.kinds  # the three calls merged into one kernel
    assert off.stats.kinds[op] == 3, off.stats.kinds
    for weight in (w, b, *xs):
        assert_close(on.gradients[weight], off.gradients[weight], repr(weight))


def test_calls_of_different_kernels_do_not_merge() -> None:
    x = _u(1, 2, 5, 5)
    ws = [ArrayWeight(_u(3, 2, 3, 3)) for _ in range(2)]
    loss = ml.add_n([ml.sum(ml.conv2d(x, w)) for w in ws])
    on = gradients_of(loss, True)
    assert on.stats.kinds["conv"] == 2
    for w in ws:
        np.testing.assert_allclose(on.gradients[w], np.broadcast_to(_window_sums(x), w.data.shape))


def _window_sums(x: Any) -> Any:
    """d sum(conv2d(x, w)) / dw for a 3x3 kernel, no padding: each offset's window of x summed."""
    return np.stack([[x[0, :, i : i + 3, j : j + 3].sum(axis=(1, 2))] for i in range(3) for j in range(3)])[
        :, 0
    ].T.reshape(2, 3, 3)


# ---------------------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("make", "kind", "message"),
    [
        (
            lambda: ml.conv2d(np.ones((1, 3, 4, 4)), np.ones((2, 2, 3, 3))),
            ShapeError,
            r"conv2d: x of shape \(1, 3, 4, 4\)",
        ),
        (
            lambda: ml.conv2d(np.ones((1, 3, 2, 2)), np.ones((2, 3, 3, 3))),
            ShapeError,
            r"conv2d: a kernel of shape \(3, 3\)",
        ),
        (lambda: ml.conv2d(np.ones((3, 4)), np.ones((2, 3, 3, 3))), ShapeError, r"conv2d: needs x of shape"),
        (
            lambda: ml.conv2d(np.ones((1, 3, 4, 4)), np.ones((2, 3, 1, 1)), np.ones(3)),
            ShapeError,
            r"conv2d: bias of shape \(3,\)",
        ),
        (
            lambda: ml.conv2d(np.ones((1, 4, 4, 4)), np.ones((3, 2, 1, 1)), groups=2),
            ShapeError,
            r"conv2d: .* 2 group",
        ),
        (lambda: ml.conv1d(np.ones((1, 3, 4)), np.ones((2, 3, 1)), stride=0), ValueError, r"conv1d: stride"),
        (
            lambda: ml.conv2d(np.ones((1, 3, 4, 4)), np.ones((2, 3, 1, 1)), padding="full"),  # type: ignore[arg-type]
            ValueError,
            r"conv2d: padding",
        ),
        (
            lambda: ml.conv2d(np.ones((1, 3, 4, 4)), np.ones((2, 3, 3, 3)), stride=2, padding="same"),
            ValueError,
            "conv2d: padding 'same'",
        ),
        (
            lambda: ml.conv2d(np.ones((1, 3, 4, 4)), np.ones((2, 3, 1, 1)), groups=1.5),  # type: ignore[arg-type]
            TypeError,
            r"conv2d: groups",
        ),
        (lambda: ml.conv2d(np.ones((1, 3, 4, 4)), "w"), TypeError, r"conv2d: .* for w"),  # type: ignore[arg-type]
        (lambda: ml.max_pool2d(np.ones((1, 3, 4, 4)), 2, padding=2), ValueError, r"max_pool2d: padding"),
        (lambda: ml.avg_pool2d(np.ones((1, 3, 1, 4)), 2), ShapeError, r"avg_pool2d: a kernel of \(2, 2\)"),
        (lambda: ml.max_pool1d(np.ones((3, 4)), (2, 2)), ValueError, r"max_pool1d: kernel_size"),
    ],
)
def test_errors_name_the_op_and_the_shapes(
    make: Callable[[], ArrayLayer], kind: type[Exception], message: str
) -> None:
    with pytest.raises(kind, match=message):
        predict(make())


# -------------------------------------------------------------------------------------- modules


def test_modules_build_and_run() -> None:
    conv = nn.Conv2d.new(3, 8, 3, padding=1, seed=1)
    assert set(conv.weights()) == {"w", "b"} and conv.w.data.shape == (8, 3, 3, 3)
    grouped = nn.Conv2d.new(4, 6, (3, 1), groups=2, bias=False)
    assert grouped.weights().keys() == {"w"} and grouped.w.data.shape == (6, 2, 3, 1)
    x = _u(2, 3, 8, 8)
    y = nn.MaxPool2d(2)(ml.relu(conv(x)))
    z = nn.AvgPool2d(2, stride=1)(y)
    np.testing.assert_allclose(
        predict(y), predict(ml.max_pool2d(ml.relu(ml.conv2d(x, conv.w, conv.b, padding=1)), 2))
    )
    assert predict(z).shape == (2, 8, 3, 3)
    conv1 = nn.Conv1d.new(3, 5, 3, stride=2, seed=2)
    assert predict(conv1(_u(2, 3, 9))).shape == (2, 5, 4)
    with pytest.raises(ValueError, match="Conv2d: 4 inputs and 5 outputs"):
        nn.Conv2d.new(4, 5, 3, groups=2)
    with pytest.raises(ValueError, match="Conv2d: b must have shape"):
        nn.Conv2d(ArrayWeight(_u(2, 3, 1, 1)), ArrayWeight(_u(3)))


def test_a_conv_module_trains() -> None:
    """A conv net's loss falls under SGD: every weight gets its delta through conv and pooling."""
    conv = nn.Conv2d.new(1, 4, 3, padding=1, seed=0)
    head = nn.Linear.new(4 * 2 * 2, 2, seed=1)
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, size=16)
    x = rng.normal(size=(16, 1, 4, 4)) + labels[:, None, None, None] * np.eye(4)  # a diagonal: class 1

    def loss() -> ml.FloatLayer:
        features = ml.reshape(nn.MaxPool2d(2)(ml.relu(conv(x))), (16, -1))
        return ml.cross_entropy(head(features), labels)

    optimizer = ml.SGD(0.5)
    first = predict(loss())
    for _ in range(30):
        ml.train_blocking(loss(), optimizer).unwrap()
    assert predict(loss()) < 0.5 * first
