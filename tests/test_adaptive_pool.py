"""Adaptive average pooling (``ml.adaptive_avg_pool2d``, ``nn.AdaptiveAvgPool2d``): PyTorch's bins,
values and gradients equal to PyTorch's, gradients against finite differences, calls on single
examples merged equal to the calls alone and to one call on the batch, and errors that name the
op."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from batching_check import assert_close, gradients_of
from op_cases import predict, probe

import monadl as ml
from monadl import ArrayWeight, FloatLayer, ShapeError, nn
from monadl.dsl.ops.adaptive_pool import bins


def uniform(seed: int, *shape: int) -> Any:
    return np.random.default_rng(seed).uniform(-1.0, 1.0, shape)


def test_the_bins_are_pytorchs() -> None:
    """``[floor(i n / out), ceil((i + 1) n / out))``: overlapping where ``out`` does not divide
    ``n``, every element in one bin at least, the first bin starting at 0 and the last ending at n."""
    assert bins(5, 3) == [(0, 2), (1, 4), (3, 5)]
    assert bins(3, 5) == [(0, 1), (0, 2), (1, 2), (1, 3), (2, 3)]
    assert bins(6, 3) == [(0, 2), (2, 4), (4, 6)]
    for n in range(1, 9):
        for out in range(1, 9):
            edges = bins(n, out)
            assert edges[0][0] == 0 and edges[-1][1] == n
            assert all(lo < hi for lo, hi in edges)
            assert set(range(n)) == {r for lo, hi in edges for r in range(lo, hi)}


SIZES: list[tuple[tuple[int, ...], Any]] = [
    ((2, 3, 7, 5), (3, 2)),  # overlapping bins
    ((2, 3, 6, 4), (3, 2)),  # equal windows
    ((3, 5, 5), 1),  # a global pool, unbatched
    ((2, 3, 4, 4), (None, 3)),
    ((1, 2, 5, 7), (7, 3)),  # more rows out than in
    ((2, 1, 3, 3), (5, 4)),
    ((4, 6), 2),  # one map, no leading axes
]


@pytest.mark.parametrize(("shape", "size"), SIZES, ids=str)
def test_the_values_and_gradients_are_pytorchs(shape: tuple[int, ...], size: Any) -> None:
    torch = pytest.importorskip("torch")
    x = ArrayWeight(uniform(1, *shape))
    out = ml.adaptive_avg_pool2d(x, size)
    value = predict(out)
    weighting = probe(value.shape)
    _, gradients = ml.compute_gradients(ml.sum(out * weighting))
    t = torch.tensor(np.asarray(x.data), requires_grad=True)
    expected = torch.nn.functional.adaptive_avg_pool2d(t.reshape(-1, 1, *shape[-2:]), size)
    expected = expected.reshape(*shape[:-2], *expected.shape[-2:])
    assert out.shape == tuple(expected.shape) == value.shape
    np.testing.assert_allclose(value, expected.detach().numpy(), rtol=1e-12, atol=1e-12)
    (expected * torch.tensor(weighting)).sum().backward()
    np.testing.assert_allclose(gradients[x], t.grad.numpy(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(("shape", "size"), SIZES[:5], ids=str)
def test_the_gradients_are_finite_differences(shape: tuple[int, ...], size: Any) -> None:
    weighting = probe(predict(ml.adaptive_avg_pool2d(uniform(2, *shape), size)).shape)

    def loss(x: ArrayWeight) -> FloatLayer:
        return ml.sum(ml.adaptive_avg_pool2d(x, size) * weighting)

    ml.check_gradients(loss, uniform(3, *shape))


@pytest.mark.parametrize("size", [(3, 2), 1], ids=["bins", "global"])
def test_single_examples_merge_and_equal_the_batch(size: Any) -> None:
    pool = nn.AdaptiveAvgPool2d(size)
    xs = [ArrayWeight(uniform(10 + k, 2, 5, 4)) for k in range(3)]
    shape = predict(pool(xs[0])).shape
    loss = ml.add_n([ml.sum(pool(x * 1.5) * uniform(20 + k, *shape)) for k, x in enumerate(xs)])
    on, off = gradients_of(loss, True), gradients_of(loss, False)
    assert on.stats.kinds["adaptive_avg_pool2d"] == 1, on.stats
    assert off.stats.kinds["adaptive_avg_pool2d"] == 3, off.stats
    assert_close(on.value, off.value, "loss")
    for x in xs:
        assert_close(on.gradients[x], off.gradients[x], repr(x))
    batch = predict(pool(np.stack([x.data for x in xs])))
    for k, x in enumerate(xs):
        np.testing.assert_allclose(predict(pool(x)), batch[k], rtol=1e-14, atol=1e-14)


def test_the_dtype_is_kept() -> None:
    x = uniform(4, 2, 5, 5).astype(np.float32)
    for size in ((2, 3), 5):
        out = predict(ml.adaptive_avg_pool2d(x, size))
        assert out.dtype == np.float32


def test_the_module_is_pytorchs() -> None:
    torch = pytest.importorskip("torch")
    x = uniform(5, 2, 3, 9, 7)
    for size in (4, (None, 2), (1, 1)):
        expected = torch.nn.AdaptiveAvgPool2d(size)(torch.from_numpy(x)).numpy()
        np.testing.assert_allclose(predict(nn.AdaptiveAvgPool2d(size)(x)), expected, rtol=1e-12, atol=1e-12)
    assert nn.AdaptiveAvgPool2d(1).weights() == {}


@pytest.mark.parametrize(
    ("make", "kind", "message"),
    [
        (
            lambda: ml.adaptive_avg_pool2d(np.ones(3), 1),
            ShapeError,
            r"adaptive_avg_pool2d: needs an array of 2",
        ),
        (
            lambda: ml.adaptive_avg_pool2d(np.ones((2, 0, 3)), 1),
            ShapeError,
            r"adaptive_avg_pool2d: an input of shape \(2, 0, 3\) has no element",
        ),
        (
            lambda: ml.adaptive_avg_pool2d(np.ones((3, 3)), 0),
            ValueError,
            "adaptive_avg_pool2d: output_size must be at",
        ),
        (
            lambda: ml.adaptive_avg_pool2d(np.ones((3, 3)), (1, 2, 3)),
            ValueError,
            "adaptive_avg_pool2d: output_size",
        ),
        (
            lambda: ml.adaptive_avg_pool2d(np.ones((3, 3)), 1.5),  # type: ignore[arg-type]
            TypeError,
            "adaptive_avg_pool2d: output_size must be ints",
        ),
        (lambda: ml.adaptive_avg_pool2d(2.0, 1), TypeError, "adaptive_avg_pool2d: expected an array"),  # type: ignore[arg-type]
    ],
)
def test_errors_name_the_op(make: Any, kind: type[Exception], message: str) -> None:
    with pytest.raises(kind, match=message):
        predict(make())
