"""Padding (``ml.pad``): every mode's values and gradients equal to PyTorch's, PyTorch's pad order
(the last axis first), a crop undone by a pad, gradients against finite differences, calls merged
equal to calls alone and to one call on the batch, and errors that name the op."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from batching_check import assert_close, gradients_of
from hypothesis import given, settings
from hypothesis import strategies as st
from op_cases import predict, probe

import monadl as ml
from monadl import ArrayWeight, FloatLayer, ShapeError


def uniform(seed: int, *shape: int) -> Any:
    return np.random.default_rng(seed).uniform(-1.0, 1.0, shape)


CASES: list[tuple[str, tuple[int, ...], tuple[int, ...], dict[str, Any]]] = [
    ("constant, last axis", (2, 3), (1, 2), {}),
    ("constant value, two axes", (2, 3, 4), (1, 0, 2, 1), {"value": -1.5}),
    ("constant crop", (3, 4), (-1, 2, 0, -2), {}),
    ("constant, three axes", (2, 2, 3, 2), (1, 1, 0, 2, 1, 0), {"mode": "constant", "value": 0.5}),
    ("reflect", (1, 2, 3, 4), (3, 1, 2, 0), {"mode": "reflect"}),
    ("reflect 1d", (2, 3, 5), (4, 2), {"mode": "reflect"}),
    ("replicate", (1, 2, 3, 4), (2, 1, 0, 3), {"mode": "replicate"}),
    ("replicate one element", (2, 3, 1), (2, 2), {"mode": "replicate"}),
    ("circular", (1, 2, 3, 4), (4, 1, 1, 3), {"mode": "circular"}),
    ("circular 3d", (1, 1, 2, 3, 2), (1, 0, 2, 1, 1, 2), {"mode": "circular"}),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0])
def test_the_values_and_gradients_are_pytorchs(
    case: tuple[str, tuple[int, ...], tuple[int, ...], dict[str, Any]],
) -> None:
    torch = pytest.importorskip("torch")
    _, shape, widths, params = case
    x = ArrayWeight(uniform(1, *shape))
    out = ml.pad(x, widths, **params)
    value = predict(out)
    weighting = probe(value.shape)
    _, gradients = ml.compute_gradients(ml.sum(out * weighting))
    t = torch.tensor(np.asarray(x.data), requires_grad=True)
    expected = torch.nn.functional.pad(t, widths, **params)
    assert out.shape == tuple(expected.shape) == value.shape
    np.testing.assert_array_equal(value, expected.detach().numpy())
    (expected * torch.tensor(weighting)).sum().backward()
    np.testing.assert_allclose(gradients[x], t.grad.numpy(), rtol=1e-13, atol=1e-13)


def test_the_widths_read_the_last_axis_first() -> None:
    x = np.arange(6.0).reshape(2, 3)
    out = predict(ml.pad(x, (1, 0, 0, 2), value=9.0))  # (left, right) of the columns, then rows
    np.testing.assert_array_equal(out, [[9, 0, 1, 2], [9, 3, 4, 5], [9, 9, 9, 9], [9, 9, 9, 9]])
    np.testing.assert_array_equal(
        predict(ml.pad(x, (2, 1), mode="reflect")), [[2, 1, 0, 1, 2, 1], [5, 4, 3, 4, 5, 4]]
    )
    np.testing.assert_array_equal(
        predict(ml.pad(x, (1, 2), mode="replicate")), [[0, 0, 1, 2, 2, 2], [3, 3, 4, 5, 5, 5]]
    )
    np.testing.assert_array_equal(
        predict(ml.pad(x, (2, 1), mode="circular")), [[1, 2, 0, 1, 2, 0], [4, 5, 3, 4, 5, 3]]
    )


@settings(max_examples=40, deadline=None, derandomize=True, database=None)
@given(
    shape=st.lists(st.integers(0, 3), min_size=1, max_size=3),
    widths=st.lists(st.integers(0, 2), min_size=6, max_size=6),
    value=st.floats(-2.0, 2.0),
)
def test_a_crop_undoes_a_pad(shape: list[int], widths: list[int], value: float) -> None:
    """Constant padding by ``w`` then by ``-w`` gives ``x`` back, whatever ``value`` filled; the
    padding holds ``value`` and nothing else."""
    x = uniform(2, *shape)
    given_widths = widths[: 2 * len(shape)]
    padded = ml.pad(x, given_widths, value=value)
    np.testing.assert_array_equal(predict(ml.pad(padded, [-w for w in given_widths])), x)
    out = predict(padded)
    inside: tuple[Any, ...] = tuple(
        slice(lo, lo + n) for n, lo in zip(shape, reversed(given_widths[::2]), strict=False)
    )
    mask = np.ones(out.shape, dtype=bool)
    mask[(..., *inside)] = False
    assert np.all(out[mask] == value)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0])
def test_the_gradients_are_finite_differences(
    case: tuple[str, tuple[int, ...], tuple[int, ...], dict[str, Any]],
) -> None:
    _, shape, widths, params = case
    weighting = probe(predict(ml.pad(uniform(3, *shape), widths, **params)).shape)

    def loss(x: ArrayWeight) -> FloatLayer:
        return ml.sum(ml.pad(x, widths, **params) * weighting)

    ml.check_gradients(loss, uniform(4, *shape))


@pytest.mark.parametrize("mode", ["constant", "reflect", "replicate", "circular"])
def test_single_examples_merge_and_equal_the_batch(mode: Any) -> None:
    widths = (2, 1, 1, 2)
    xs = [ArrayWeight(uniform(10 + k, 2, 3, 4)) for k in range(3)]
    loss = ml.add_n(
        [ml.sum(ml.pad(x * 2.0, widths, mode) * uniform(20 + k, 2, 6, 7)) for k, x in enumerate(xs)]
    )
    on, off = gradients_of(loss, True), gradients_of(loss, False)
    assert on.stats.kinds["pad"] == 1 and off.stats.kinds["pad"] == 3, (on.stats, off.stats)
    assert_close(on.value, off.value, "loss")
    for x in xs:
        assert_close(on.gradients[x], off.gradients[x], repr(x))
    batch = predict(ml.pad(np.stack([x.data for x in xs]), widths, mode))
    for k, x in enumerate(xs):
        np.testing.assert_array_equal(predict(ml.pad(x, widths, mode)), batch[k])


def test_calls_of_other_widths_or_values_do_not_merge() -> None:
    x = ArrayWeight(uniform(30, 2, 3))
    loss = ml.add_n([ml.sum(ml.pad(x, (1, 1), value=v)) for v in (0.0, 1.0)] + [ml.sum(ml.pad(x, (2, 0)))])
    on = gradients_of(loss, True)
    assert on.stats.kinds["pad"] == 3
    assert on.value == pytest.approx(3 * float(np.sum(x.data)) + 4.0)


def test_the_dtype_is_kept() -> None:
    x = uniform(5, 2, 3).astype(np.float32)
    for mode in ("constant", "reflect", "replicate", "circular"):
        assert predict(ml.pad(x, (1, 2), mode)).dtype == np.float32


@pytest.mark.parametrize(
    ("make", "kind", "message"),
    [
        (lambda: ml.pad(np.ones((2, 3)), (1, 2, 3)), ValueError, r"pad: pad must hold pairs of widths"),
        (lambda: ml.pad(np.ones((2, 3)), 1), TypeError, r"pad: pad must be a sequence of ints"),  # type: ignore[arg-type]
        (lambda: ml.pad(np.ones((2, 3)), (1.5, 1)), TypeError, r"pad: pad must be a sequence of ints"),  # type: ignore[arg-type]
        (lambda: ml.pad(np.ones((2, 3)), (1, 1), "wrap"), ValueError, r"pad: mode must be one of"),  # type: ignore[arg-type]
        (
            lambda: ml.pad(np.ones((2, 3)), (1, 1), "reflect", 1.0),
            ValueError,
            r"pad: mode 'reflect' takes no value",
        ),
        (
            lambda: ml.pad(np.ones((2, 3)), (-1, 1), "circular"),
            ValueError,
            r"pad: mode 'circular' takes no negative",
        ),
        (lambda: ml.pad(np.ones((2, 3)), (1, 1), value="0"), TypeError, r"pad: value must be a float"),  # type: ignore[arg-type]
        (
            lambda: ml.pad(np.ones((2, 3)), (0, 0, 0, 0, 1, 1)),
            ShapeError,
            r"pad: padding 6 numbers \(the last 3 axes\) needs an array of 3 axes at least, got \(2, 3\)",
        ),
        (
            lambda: ml.pad(np.ones((2, 3)), (3, 0), "reflect"),
            ShapeError,
            r"pad: reflect widths \(3, 0\) must be less than the 3 elements of axis 1 of an input of shape",
        ),
        (
            lambda: ml.pad(np.ones((2, 3)), (0, 4), "circular"),
            ShapeError,
            r"pad: circular widths \(0, 4\) exceed the 3 elements of axis 1",
        ),
        (lambda: ml.pad(np.ones((2, 0)), (1, 0), "replicate"), ShapeError, r"pad: replicate has no element"),
        (
            lambda: ml.pad(np.ones((2, 3)), (-2, -2)),
            ShapeError,
            r"pad: widths \(-2, -2\) crop more than the 3",
        ),
        (lambda: ml.pad(1.5, (1, 1)), TypeError, r"pad: expected an array"),  # type: ignore[arg-type]
    ],
)
def test_errors_name_the_op(make: Any, kind: type[Exception], message: str) -> None:
    with pytest.raises(kind, match=message):
        predict(make())
