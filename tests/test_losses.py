"""The losses (``monadl.dsl.ops.losses``, and ``cross_entropy``'s options): values and gradients equal to
PyTorch's, gradients equal to finite differences over randomly drawn inputs and settings, merged
calls equal to calls alone, static shapes, other array namespaces, and clear errors.

PyTorch's class axis is 1 and monadl's the last: a (N, L, C) input is compared with PyTorch's
(N, C, L). Every comparison is in float64, to 1e-12 relative.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from batching_check import gradients_of, merged_and_alone
from hypothesis import example, given, settings
from hypothesis import strategies as st
from op_cases import probe
from returns.result import Failure

import monadl as ml
from monadl import ArrayLayer, ArrayWeight, FloatLayer
from monadl.gradcheck import check_gradients

torch = pytest.importorskip("torch")
F = torch.nn.functional

TOL = 1e-12
REDUCTIONS: list[ml.Reduction] = ["mean", "sum", "none"]
Layer = ArrayLayer | FloatLayer
Array = np.ndarray[Any, Any]


# ------------------------------------------------------------------------------- pointwise losses


@dataclass(frozen=True)
class Pointwise:
    """A pointwise loss: ours(x, t, reduction), theirs(x, t, reduction) on tensors, and how to
    draw its inputs (``rng``, shape)."""

    name: str
    ours: Callable[[Any, Any, Any], Layer]
    theirs: Callable[[Any, Any, str], Any]
    draw: Callable[[np.random.Generator, tuple[int, ...]], tuple[Array, Array]]

    def __str__(self) -> str:
        return self.name


def _normal(rng: np.random.Generator, shape: tuple[int, ...]) -> tuple[Array, Array]:
    return np.asarray(rng.standard_normal(shape) * 1.5), np.asarray(rng.standard_normal(shape))


def _probabilities(rng: np.random.Generator, shape: tuple[int, ...]) -> tuple[Array, Array]:
    return np.asarray(rng.uniform(0.02, 0.98, shape)), np.asarray(rng.uniform(0.0, 1.0, shape))


def _logits(rng: np.random.Generator, shape: tuple[int, ...]) -> tuple[Array, Array]:
    return np.asarray(rng.standard_normal(shape) * 3.0), np.asarray(rng.uniform(0.0, 1.0, shape))


POINTWISE = [
    Pointwise(
        "mse",
        lambda x, t, r: ml.mse_loss(x, t, reduction=r),
        lambda x, t, r: F.mse_loss(x, t, reduction=r),
        _normal,
    ),
    Pointwise(
        "l1",
        lambda x, t, r: ml.l1_loss(x, t, reduction=r),
        lambda x, t, r: F.l1_loss(x, t, reduction=r),
        _normal,
    ),
    Pointwise(
        "huber",
        lambda x, t, r: ml.huber_loss(x, t, reduction=r),
        lambda x, t, r: F.huber_loss(x, t, reduction=r),
        _normal,
    ),
    Pointwise(
        "huber delta 0.3",
        lambda x, t, r: ml.huber_loss(x, t, reduction=r, delta=0.3),
        lambda x, t, r: F.huber_loss(x, t, reduction=r, delta=0.3),
        _normal,
    ),
    Pointwise(
        "smooth_l1",
        lambda x, t, r: ml.smooth_l1_loss(x, t, reduction=r),
        lambda x, t, r: F.smooth_l1_loss(x, t, reduction=r),
        _normal,
    ),
    Pointwise(
        "smooth_l1 beta 0.4",
        lambda x, t, r: ml.smooth_l1_loss(x, t, reduction=r, beta=0.4),
        lambda x, t, r: F.smooth_l1_loss(x, t, reduction=r, beta=0.4),
        _normal,
    ),
    Pointwise(
        "smooth_l1 beta 0",
        lambda x, t, r: ml.smooth_l1_loss(x, t, reduction=r, beta=0.0),
        lambda x, t, r: F.smooth_l1_loss(x, t, reduction=r, beta=0.0),
        _normal,
    ),
    Pointwise(
        "bce",
        lambda x, t, r: ml.binary_cross_entropy(x, t, reduction=r),
        lambda x, t, r: F.binary_cross_entropy(x, t, reduction=r),
        _probabilities,
    ),
    Pointwise(
        "bce with logits",
        lambda x, t, r: ml.binary_cross_entropy_with_logits(x, t, reduction=r),
        lambda x, t, r: F.binary_cross_entropy_with_logits(x, t, reduction=r),
        _logits,
    ),
]


def ours_and_theirs(
    ours: Callable[..., Layer],
    theirs: Callable[..., Any],
    inputs: list[Array],
    wanted: list[bool],
    none: bool,
) -> tuple[tuple[Any, list[Any]], tuple[Any, list[Any]]]:
    """The value of ``ours(*inputs)`` and ``theirs`` (on tensors) and the gradients of the inputs
    ``wanted``, of the loss itself (reduced) or of ``sum(loss * probe)`` (``none``)."""
    weights = [ArrayWeight(a.copy()) if w else a for a, w in zip(inputs, wanted, strict=True)]
    out = ours(*weights)
    value = out.predict_blocking().unwrap()
    if none:
        assert isinstance(out, ArrayLayer)
        loss: FloatLayer = ml.sum(out * probe(np.shape(value)))
    else:
        assert isinstance(out, FloatLayer) and type(value) is float
        loss = out
    _, grads = ml.compute_gradients(loss)
    mine = [np.asarray(grads[w]) for w in weights if isinstance(w, ArrayWeight)]

    tensors = [torch.tensor(a, requires_grad=w) for a, w in zip(inputs, wanted, strict=True)]
    result = theirs(*tensors)
    (result * torch.tensor(probe(tuple(result.shape)))).sum().backward() if none else result.backward()
    expected = [t.grad.numpy() for t, w in zip(tensors, wanted, strict=True) if w]
    return (value, mine), (result.detach().numpy(), expected)


def assert_same(got: tuple[Any, list[Any]], want: tuple[Any, list[Any]]) -> None:
    (value, grads), (expected, expected_grads) = got, want
    assert np.shape(value) == np.shape(expected)
    np.testing.assert_allclose(value, expected, rtol=TOL, atol=TOL, err_msg="value")
    for i, (g, e) in enumerate(zip(grads, expected_grads, strict=True)):
        np.testing.assert_allclose(g, e, rtol=TOL, atol=TOL, err_msg=f"gradient {i}")


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("shape", [(7,), (3, 4), (2, 3, 2), ()], ids=str)
@pytest.mark.parametrize("loss", POINTWISE, ids=str)
def test_pointwise_loss_is_torchs(loss: Pointwise, shape: tuple[int, ...], reduction: ml.Reduction) -> None:
    x, t = loss.draw(np.random.default_rng([len(shape), *shape]), shape)
    got, want = ours_and_theirs(
        lambda a, b: loss.ours(a, b, reduction),
        lambda a, b: loss.theirs(a, b, reduction),
        [x, t],
        [True, True],
        reduction == "none",
    )
    assert_same(got, want)


def test_huber_and_smooth_l1_meet_at_the_boundary_as_torch() -> None:
    """Differences of exactly delta (beta) and of 0: each side's formula as PyTorch takes it."""
    x = np.array([0.0, 0.5, -0.5, 1.0, -1.0, 2.0])
    t = np.zeros(6)
    for ours, theirs in [
        (
            lambda a, b: ml.huber_loss(a, b, reduction="none", delta=0.5),
            lambda a, b: F.huber_loss(a, b, reduction="none", delta=0.5),
        ),
        (
            lambda a, b: ml.smooth_l1_loss(a, b, reduction="none", beta=1.0),
            lambda a, b: F.smooth_l1_loss(a, b, reduction="none", beta=1.0),
        ),
        (lambda a, b: ml.l1_loss(a, b, reduction="none"), lambda a, b: F.l1_loss(a, b, reduction="none")),
    ]:
        got, want = ours_and_theirs(ours, theirs, [x, t], [True, True], True)
        assert_same(got, want)


def test_bce_with_logits_is_finite_for_large_logits_as_torch() -> None:
    x = np.array([1000.0, -1000.0, 745.0, -745.0, 40.0, -40.0, 0.0])
    t = np.array([0.0, 0.0, 1.0, 1.0, 0.3, 0.7, 0.5])
    for reduction in REDUCTIONS:
        got, want = ours_and_theirs(
            lambda a, b: ml.binary_cross_entropy_with_logits(a, b, reduction=reduction),  # noqa: B023
            lambda a, b: F.binary_cross_entropy_with_logits(a, b, reduction=reduction),  # noqa: B023
            [x, t],
            [True, True],
            reduction == "none",
        )
        assert np.all(np.isfinite(got[0])) and all(np.all(np.isfinite(g)) for g in got[1])
        assert_same(got, want)


def test_bce_of_saturated_probabilities_is_torchs_clamped_log() -> None:
    """A probability of exactly 0 or 1 gives PyTorch's finite loss (each log clamped at -100), and
    the probabilities' delta its (p - t) / max(p (1 - p), 1e-12)."""
    p = np.array([0.0, 1.0, 0.0, 1.0, 1e-50])
    t = np.array([1.0, 0.0, 0.0, 1.0, 0.5])
    got, want = ours_and_theirs(
        lambda a, b: ml.binary_cross_entropy(a, b, reduction="none"),
        lambda a, b: F.binary_cross_entropy(a, b, reduction="none"),
        [p, t],
        [True, False],
        True,
    )
    assert_same(got, want)
    np.testing.assert_array_equal(got[0], [100.0, 100.0, 0.0, 0.0, 50.0])


# ---------------------------------------------------------------------------------- class losses


@dataclass(frozen=True)
class ClassCase:
    """A class loss with its options: ``ours(x, targets, reduction)`` and PyTorch's on its layout."""

    name: str
    ours: Callable[[Any, Any, ml.Reduction], Layer]
    theirs: Callable[[Any, Any, str], Any]
    labels: bool = True
    log_probs: bool = False
    ignore: int | None = None

    def __str__(self) -> str:
        return self.name


WEIGHT = np.array([0.5, 2.0, 1.0, 3.0])


def _w() -> Any:
    return torch.tensor(WEIGHT)


CLASS_CASES = [
    ClassCase(
        "nll",
        lambda x, t, r: ml.nll_loss(x, t, reduction=r),
        lambda x, t, r: F.nll_loss(x, t, reduction=r),
        log_probs=True,
    ),
    ClassCase(
        "nll weight",
        lambda x, t, r: ml.nll_loss(x, t, reduction=r, weight=WEIGHT),
        lambda x, t, r: F.nll_loss(x, t, reduction=r, weight=_w()),
        log_probs=True,
    ),
    ClassCase(
        "nll ignore -100",
        lambda x, t, r: ml.nll_loss(x, t, reduction=r, ignore_index=-100),
        lambda x, t, r: F.nll_loss(x, t, reduction=r, ignore_index=-100),
        log_probs=True,
        ignore=-100,
    ),
    ClassCase(
        "nll weight ignore 2",
        lambda x, t, r: ml.nll_loss(x, t, reduction=r, weight=WEIGHT, ignore_index=2),
        lambda x, t, r: F.nll_loss(x, t, reduction=r, weight=_w(), ignore_index=2),
        log_probs=True,
        ignore=2,
    ),
    ClassCase(
        "ce",
        lambda x, t, r: ml.cross_entropy(x, t, reduction=r),
        lambda x, t, r: F.cross_entropy(x, t, reduction=r),
    ),
    ClassCase(
        "ce smoothing",
        lambda x, t, r: ml.cross_entropy(x, t, reduction=r, label_smoothing=0.15),
        lambda x, t, r: F.cross_entropy(x, t, reduction=r, label_smoothing=0.15),
    ),
    ClassCase(
        "ce weight",
        lambda x, t, r: ml.cross_entropy(x, t, reduction=r, weight=WEIGHT),
        lambda x, t, r: F.cross_entropy(x, t, reduction=r, weight=_w()),
    ),
    ClassCase(
        "ce ignore -100",
        lambda x, t, r: ml.cross_entropy(x, t, reduction=r, ignore_index=-100),
        lambda x, t, r: F.cross_entropy(x, t, reduction=r, ignore_index=-100),
        ignore=-100,
    ),
    ClassCase(
        "ce everything",
        lambda x, t, r: ml.cross_entropy(
            x, t, reduction=r, weight=WEIGHT, ignore_index=0, label_smoothing=0.3
        ),
        lambda x, t, r: F.cross_entropy(x, t, reduction=r, weight=_w(), ignore_index=0, label_smoothing=0.3),
        ignore=0,
    ),
    ClassCase(
        "ce probabilities",
        lambda x, t, r: ml.cross_entropy(x, t, reduction=r),
        lambda x, t, r: F.cross_entropy(x, t, reduction=r),
        labels=False,
    ),
    ClassCase(
        "ce probabilities smoothing weight",
        lambda x, t, r: ml.cross_entropy(x, t, reduction=r, weight=WEIGHT, label_smoothing=0.2),
        lambda x, t, r: F.cross_entropy(x, t, reduction=r, weight=_w(), label_smoothing=0.2),
        labels=False,
    ),
]


def class_inputs(case: ClassCase, shape: tuple[int, ...], seed: int) -> tuple[Array, Array]:
    """Inputs (logits, or log-probabilities) of ``shape`` (classes last) and targets: labels, some
    of them ``case.ignore``, or probabilities."""
    rng = np.random.default_rng([seed, *shape])
    x = rng.standard_normal(shape) * 2.0
    if case.log_probs:
        x = x - np.log(np.sum(np.exp(x), axis=-1, keepdims=True))
    if not case.labels:
        p = rng.uniform(0.0, 1.0, shape)
        return x, p / np.sum(p, axis=-1, keepdims=True)
    labels = rng.integers(0, shape[-1], shape[:-1])
    if case.ignore is not None and labels.ndim:
        labels.reshape(-1)[::3] = case.ignore  # every third element ignored
    elif case.ignore is not None and labels == case.ignore:  # (one label alone: not ignored)
        labels = np.asarray((case.ignore + 1) % shape[-1])
    return x, labels


def _torch_layout(x: Any, t: Any, case: ClassCase) -> tuple[Any, Any]:
    """PyTorch's layout of (N, ..., C) inputs: (N, C, ...)."""
    if x.ndim <= 2:
        return x, t
    order = (0, x.ndim - 1, *range(1, x.ndim - 1))
    # (contiguous: PyTorch's nll_loss refuses the delta of a permuted input of more than 3 axes)
    return x.permute(*order).contiguous(), (t if case.labels else t.permute(*order).contiguous())


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("shape", [(6, 4), (4,), (2, 3, 4), (2, 2, 3, 4)], ids=str)
@pytest.mark.parametrize("case", CLASS_CASES, ids=str)
def test_class_loss_is_torchs(case: ClassCase, shape: tuple[int, ...], reduction: ml.Reduction) -> None:
    x, t = class_inputs(case, shape, 0)

    def theirs(a: Any) -> Any:
        xa, ta = _torch_layout(a, torch.tensor(t), case)
        return case.theirs(xa, ta, reduction)

    got, want = ours_and_theirs(
        lambda a: case.ours(a, t, reduction), theirs, [x], [True], reduction == "none"
    )
    assert_same(got, want)


@pytest.mark.parametrize("case", [c for c in CLASS_CASES if c.ignore is not None], ids=str)
def test_every_label_ignored_gives_nan_and_a_zero_gradient_as_torch(case: ClassCase) -> None:
    """The mean over no label is NaN, as PyTorch's (so a training step on it fails, as on any NaN
    loss); the losses' delta is zero, which a sum shows."""
    x, _ = class_inputs(case, (3, 4), 1)
    t = np.full(3, case.ignore)
    value = case.ours(x, t, "mean").predict_blocking().unwrap()
    assert np.isnan(value) and np.isnan(case.theirs(torch.tensor(x), torch.tensor(t), "mean").item())
    w = ArrayWeight(x)
    with pytest.raises(ml.NonFiniteLossError):
        ml.compute_gradients(case.ours(w, t, "mean"))
    got, want = ours_and_theirs(
        lambda a: case.ours(a, t, "sum"), lambda a: case.theirs(a, torch.tensor(t), "sum"), [x], [True], False
    )
    assert got[0] == 0.0
    np.testing.assert_array_equal(got[1][0], np.zeros((3, 4)))
    assert_same(got, want)


def test_cross_entropy_takes_a_python_int_label_with_options() -> None:
    x = np.array([0.3, -1.2, 2.0])
    label, weight = torch.tensor(1), np.array([1.0, 2.0, 0.5])
    for got, want in [
        (
            ml.cross_entropy(x, 1, label_smoothing=0.1),
            F.cross_entropy(torch.tensor(x), label, label_smoothing=0.1),
        ),
        (ml.cross_entropy(x, 1, reduction="sum"), F.cross_entropy(torch.tensor(x), label, reduction="sum")),
        (
            ml.cross_entropy(x, 1, weight=weight),
            F.cross_entropy(torch.tensor(x), label, weight=torch.tensor(weight)),
        ),
    ]:
        assert got.predict_blocking().unwrap() == pytest.approx(want.item(), rel=TOL)
    ignored = ml.cross_entropy(x, 1, ignore_index=1, reduction="sum").predict_blocking().unwrap()
    assert ignored == 0.0


def test_nll_loss_of_a_masked_class_is_finite() -> None:
    """A log-probability of -inf in a class no label picks adds nothing (not -inf * 0)."""
    log_p = np.array([[0.0, -np.inf], [-np.inf, 0.0]])
    assert ml.nll_loss(log_p, np.array([0, 1])).predict_blocking().unwrap() == 0.0
    assert F.nll_loss(torch.tensor(log_p), torch.tensor([0, 1])).item() == 0.0


# --------------------------------------------------------------------------- finite differences


LOSSES: dict[str, Callable[..., Layer]] = {
    "mse_loss": ml.mse_loss,
    "l1_loss": ml.l1_loss,
    "huber_loss": ml.huber_loss,
    "smooth_l1_loss": ml.smooth_l1_loss,
    "binary_cross_entropy": ml.binary_cross_entropy,
    "binary_cross_entropy_with_logits": ml.binary_cross_entropy_with_logits,
}


def _away_from_kinks(x: Array, t: Array, width: float) -> Array:
    """``x`` moved so that no ``|x - t|`` lies within 1e-3 of 0 or of ``width`` (l1's and Huber's
    kinks, where a central difference straddles two formulas)."""
    z = x - t
    for kink in (0.0, width, -width):
        close = np.abs(z - kink) < 1e-3
        z = np.where(close, kink + np.where(z >= kink, 2e-3, -2e-3), z)
    return np.asarray(t + z)


@settings(max_examples=30, deadline=None)
@given(
    name=st.sampled_from(sorted(LOSSES)),
    shape=st.sampled_from([(), (3,), (2, 3), (2, 1, 2)]),
    reduction=st.sampled_from(REDUCTIONS),
    width=st.floats(0.1, 2.0),
    seed=st.integers(0, 2**32 - 1),
)
def test_pointwise_gradients_are_finite_differences(
    name: str, shape: tuple[int, ...], reduction: ml.Reduction, width: float, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    if name == "binary_cross_entropy":
        x, t = _probabilities(rng, shape)
        x = np.asarray(np.clip(x, 0.05, 0.95))
    elif name == "binary_cross_entropy_with_logits":
        x, t = _logits(rng, shape)
    else:
        x, t = _normal(rng, shape)
        x = _away_from_kinks(x, t, width)
    options: dict[str, Any] = {"reduction": reduction}
    if name == "huber_loss":
        options["delta"] = width
    elif name == "smooth_l1_loss":
        options["beta"] = width
    loss = LOSSES[name]

    def f(a: ArrayWeight, b: ArrayWeight) -> FloatLayer:
        out = loss(a, b, **options)
        return ml.sum(out * probe(shape)) if isinstance(out, ArrayLayer) else out

    check_gradients(f, x, t)


@settings(max_examples=30, deadline=None)
@example(  # every label the ignored one once the first is set to it
    logits=True, labels=True, shape=(3, 4), reduction="mean", smoothing=0.0, weighted=False, ignore=1, seed=1
)
@given(
    logits=st.booleans(),
    labels=st.booleans(),
    shape=st.sampled_from([(4,), (3, 4), (2, 2, 3)]),
    reduction=st.sampled_from(REDUCTIONS),
    smoothing=st.sampled_from([0.0, 0.25]),
    weighted=st.booleans(),
    ignore=st.sampled_from([None, 1, -100]),
    seed=st.integers(0, 2**32 - 1),
)
def test_class_loss_gradients_are_finite_differences(
    logits: bool,
    labels: bool,
    shape: tuple[int, ...],
    reduction: ml.Reduction,
    smoothing: float,
    weighted: bool,
    ignore: int | None,
    seed: int,
) -> None:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape)
    weight = rng.uniform(0.5, 2.0, shape[-1]) if weighted else None
    if labels or not logits:  # (nll_loss takes labels only)
        t: Any = rng.integers(0, shape[-1], shape[:-1])
        if ignore is not None and t.ndim:
            flat = t.reshape(-1)
            flat[0] = ignore  # one ignored, the rest counted
            if np.all(flat == ignore):  # (all ignored: a mean over none, NaN as PyTorch's)
                flat[-1] = (ignore + 1) % shape[-1]
        elif ignore is not None and t == ignore:  # (one label alone, ignored: a mean over none)
            t = np.asarray((ignore + 1) % shape[-1])
    else:
        ignore = None
        p = rng.uniform(0.0, 1.0, shape)
        t = p / np.sum(p, axis=-1, keepdims=True)

    def f(a: ArrayWeight) -> FloatLayer:
        if logits:
            out: Layer = ml.cross_entropy(
                a,
                t,
                reduction=reduction,
                weight=weight,
                ignore_index=ignore,
                label_smoothing=smoothing,
            )
        else:
            out = ml.nll_loss(ml.log_softmax(a), t, reduction=reduction, weight=weight, ignore_index=ignore)
        return ml.sum(out * probe(shape[:-1])) if isinstance(out, ArrayLayer) else out

    check_gradients(f, x)


# ----------------------------------------------------------------------------------- merging


def _sequence(make: Callable[[ArrayLayer, int], Layer], steps: int = 6) -> FloatLayer:
    """A recurrent model's per-step losses summed: one loss call per step, all alike (they merge;
    each ``"none"`` loss weighted by a probe)."""
    rng = np.random.default_rng(3)
    w = ArrayWeight(rng.standard_normal((4, 4)) * 0.5)
    h: ArrayLayer = ml.lift_array(rng.standard_normal(4))
    terms: list[FloatLayer] = []
    for k in range(steps):
        h = ml.tanh(h @ w)
        out = make(h, k)
        if isinstance(out, ArrayLayer):
            assert out.shape is not None  # known before it runs
            out = ml.sum(out * probe(out.shape))
        terms.append(out)
    return ml.add_n(terms)


def _targets(k: int) -> Array:
    return np.random.default_rng([9, k]).uniform(0.1, 0.9, 4)


MERGING: list[tuple[str, str, Callable[[ArrayLayer, int, ml.Reduction], Layer]]] = [
    ("mse_loss", "mse_loss", lambda h, k, r: ml.mse_loss(h, _targets(k), reduction=r)),
    ("l1_loss", "l1_loss", lambda h, k, r: ml.l1_loss(h, _targets(k), reduction=r)),
    ("huber_loss", "huber_loss", lambda h, k, r: ml.huber_loss(h * 3.0, _targets(k), reduction=r, delta=0.5)),
    (
        "smooth_l1_loss",
        "smooth_l1_loss",
        lambda h, k, r: ml.smooth_l1_loss(h * 3.0, _targets(k), reduction=r, beta=0.5),
    ),
    (
        "binary_cross_entropy",
        "binary_cross_entropy",
        lambda h, k, r: ml.binary_cross_entropy(ml.sigmoid(h), _targets(k), reduction=r),
    ),
    (
        "binary_cross_entropy_with_logits",
        "binary_cross_entropy_with_logits",
        lambda h, k, r: ml.binary_cross_entropy_with_logits(h * 5.0, _targets(k), reduction=r),
    ),
    (
        "nll_loss",
        "nll_loss",
        lambda h, k, r: ml.nll_loss(ml.log_softmax(h), k % 4, reduction=r, weight=WEIGHT),
    ),
    (
        "cross_entropy labels",
        "cross_entropy",
        lambda h, k, r: ml.cross_entropy(h, k % 3, reduction=r, ignore_index=3, label_smoothing=0.1),
    ),
    (
        "cross_entropy weights per call",
        "cross_entropy",
        lambda h, k, r: ml.cross_entropy(h, np.array(k % 4), reduction=r, weight=WEIGHT * (k + 1)),
    ),
    (
        "cross_entropy probabilities",
        "cross_entropy",
        lambda h, k, r: ml.cross_entropy(h, _targets(k) / 2.0, reduction=r, label_smoothing=0.2),
    ),
]


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize(("case", "kind", "make"), MERGING, ids=[m[0] for m in MERGING])
def test_per_step_losses_merge_and_equal_the_calls_alone(
    case: str, kind: str, make: Callable[[ArrayLayer, int, ml.Reduction], Layer], reduction: ml.Reduction
) -> None:
    merged, alone = merged_and_alone(lambda: _sequence(lambda h, k: make(h, k, reduction)))
    assert alone.stats.kinds[kind] == 6
    assert merged.stats.kinds[kind] == 1, merged.stats.kinds  # the six calls as one


def test_a_label_out_of_range_in_merged_losses_names_its_call() -> None:
    w = ArrayWeight(np.ones((3, 4)))
    labels = [k % 4 for k in range(8)]
    labels[5] = 7
    loss = ml.add_n(
        [ml.nll_loss(ml.log_softmax(ml.linear(np.ones(3), w, 0.0)), k, ignore_index=-100) for k in labels]
    )
    executor = ml.Executor(batching=True)
    with pytest.raises(ValueError, match=r"^nll_loss: label 7 is out of range for 4 classes"):
        ml.compute_gradients(loss, executor=executor)
    assert executor.last_stats.kinds["nll_loss"] == 1


def test_merged_bce_checks_each_calls_probabilities() -> None:
    probabilities = [ArrayWeight(np.full(3, 0.5)) for _ in range(4)]
    targets = [np.full(3, 0.5) for _ in range(4)]
    targets[2] = np.array([0.5, 1.5, 0.5])
    loss = ml.add_n([ml.binary_cross_entropy(p, t) for p, t in zip(probabilities, targets, strict=True)])
    with pytest.raises(
        ValueError, match=r"binary_cross_entropy: targets of shape \(3,\) must lie in \[0, 1\], one is 1.5"
    ):
        gradients_of(loss, True)


# ------------------------------------------------------------------------------------ bad input


def _failure(layer: Layer) -> Exception:
    """The exception running ``layer`` fails with."""
    result = layer.predict_blocking()
    assert isinstance(result, Failure), result
    error: Exception = result.failure()
    return error


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_pointwise_shapes_that_differ_name_the_loss_and_both(name: str) -> None:
    error = _failure(LOSSES[name](ArrayWeight(np.full((3, 4), 0.5)), np.full((4,), 0.5)))
    assert isinstance(error, ml.ShapeError)
    assert str(error).startswith(f"{name}: ") and "(3, 4)" in str(error) and "(4,)" in str(error), error


@pytest.mark.parametrize("name", [*sorted(LOSSES), "nll_loss", "cross_entropy"])
def test_an_unknown_reduction_names_the_loss(name: str) -> None:
    losses: dict[str, Callable[..., Layer]] = {
        **LOSSES,
        "nll_loss": ml.nll_loss,
        "cross_entropy": ml.cross_entropy,
    }
    loss = losses[name]
    targets: Any = np.array([0, 1]) if name in ("nll_loss", "cross_entropy") else np.zeros((2, 3))
    with pytest.raises(ValueError, match=rf"^{name}: reduction must be 'mean', 'sum' or 'none', got 'avg'$"):
        loss(np.zeros((2, 3)), targets, reduction="avg")


@pytest.mark.parametrize("loss", [ml.nll_loss, ml.cross_entropy], ids=["nll_loss", "cross_entropy"])
@pytest.mark.parametrize(
    ("options", "labels", "bad"),
    [({}, [0, 4, 1], 4), ({"ignore_index": -100}, [-100, -1, 2], -1), ({"weight": WEIGHT}, [0, 9, 1], 9)],
    ids=["high", "negative, another ignored", "weighted"],
)
def test_a_label_out_of_range_names_the_loss_and_the_label(
    loss: Callable[..., Layer], options: dict[str, Any], labels: list[int], bad: int
) -> None:
    error = _failure(loss(ArrayWeight(np.zeros((3, 4))), np.array(labels), **options))
    assert str(error) == f"{loss.__name__}: label {bad} is out of range for 4 classes"


def test_an_ignored_label_may_lie_outside_the_classes() -> None:
    value = (
        ml.cross_entropy(np.zeros((2, 4)), np.array([-100, 1]), ignore_index=-100).predict_blocking().unwrap()
    )
    assert value == pytest.approx(np.log(4.0))


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (
            lambda: ml.nll_loss(ArrayWeight(np.zeros((3, 4))), np.array([0, 1]), reduction="sum"),
            r"nll_loss: targets of shape \(2,\) do not fit log-probabilities of shape \(3, 4\)",
        ),
        (
            lambda: ml.cross_entropy(ArrayWeight(np.zeros((3, 4))), np.zeros((3, 5)), label_smoothing=0.1),
            r"cross_entropy: targets of shape \(3, 5\) do not fit logits of shape \(3, 4\)",
        ),
        (
            lambda: ml.cross_entropy(ArrayWeight(np.zeros((3, 4))), np.array([0, 1, 2]), weight=np.ones(3)),
            r"cross_entropy: a class weight of shape \(3,\) does not fit 4 classes \(logits of shape \(3, 4",
        ),
        (
            lambda: ml.nll_loss(ArrayWeight(np.zeros((0, 4))), np.zeros(0, dtype=np.int64)),
            r"nll_loss: log-probabilities of shape \(0, 4\) are empty",
        ),
        (
            lambda: ml.cross_entropy(
                ArrayWeight(np.zeros((2, 0))), np.zeros(2, dtype=np.int64), reduction="sum"
            ),
            r"cross_entropy: logits of shape \(2, 0\) have no classes",
        ),
        (
            lambda: ml.binary_cross_entropy(ArrayWeight(np.array([0.5, -0.1])), np.array([0.5, 0.5])),
            r"binary_cross_entropy: probabilities of shape \(2,\) must lie in \[0, 1\], one is -0.1",
        ),
        (
            lambda: ml.binary_cross_entropy(ArrayWeight(np.array([0.5, np.nan])), np.array([0.5, 0.5])),
            r"binary_cross_entropy: probabilities of shape \(2,\) must lie in \[0, 1\], one is nan",
        ),
    ],
    ids=[
        "labels shape",
        "probabilities shape",
        "weight shape",
        "empty mean",
        "no classes",
        "bce range",
        "bce nan",
    ],
)
def test_bad_values_when_the_loss_runs(make: Callable[[], Layer], message: str) -> None:
    error = _failure(make())
    assert re.search(message, str(error)), str(error)


@pytest.mark.parametrize(
    ("make", "error", "message"),
    [
        (
            lambda: ml.huber_loss(np.zeros(2), np.zeros(2), delta=0.0),
            ValueError,
            r"huber_loss: delta must be > 0",
        ),
        (
            lambda: ml.smooth_l1_loss(np.zeros(2), np.zeros(2), beta=-1.0),
            ValueError,
            r"smooth_l1_loss: beta must be >= 0",
        ),
        (
            lambda: ml.huber_loss(np.zeros(2), np.zeros(2), delta="1"),  # type: ignore[call-overload]
            TypeError,
            r"huber_loss: delta must be a float",
        ),
        (
            lambda: ml.cross_entropy(np.zeros((2, 3)), np.array([0, 1]), label_smoothing=1.5),
            ValueError,
            r"cross_entropy: label_smoothing must be in \[0, 1\], got 1.5",
        ),
        (
            lambda: ml.cross_entropy(np.zeros((2, 3)), np.full((2, 3), 1 / 3), ignore_index=0),
            ValueError,
            r"cross_entropy: ignore_index applies to integer labels; these targets are probabilities",
        ),
        (
            lambda: ml.nll_loss(np.zeros((2, 3)), np.array([0, 1]), ignore_index=1.0),  # type: ignore[call-overload]
            TypeError,
            r"nll_loss: ignore_index must be an int or None, got float",
        ),
        (
            lambda: ml.nll_loss(np.zeros((2, 3)), np.array([0, 1]), weight=np.ones((3, 1))),
            TypeError,
            r"nll_loss: weight must be a 1-d floating-point array",
        ),
        (
            lambda: ml.nll_loss(np.zeros((2, 3)), [0, 1]),  # type: ignore[call-overload]
            TypeError,
            r"nll_loss: expected an array of targets, got list",
        ),
        (
            lambda: ml.cross_entropy(np.zeros((2, 3)), np.array([True, False]), reduction="sum"),
            TypeError,
            r"cross_entropy: expected integer labels or floating-point probabilities, got dtype bool",
        ),
        (
            lambda: ml.nll_loss(np.zeros((2, 3)), np.full((2, 3), 1 / 3)),
            TypeError,
            r"nll_loss: expected integer labels, got targets of dtype float64",
        ),
        (
            lambda: ml.mse_loss(1.0, np.zeros(2)),  # type: ignore[call-overload]
            TypeError,
            r"mse_loss: expected an array layer, .* for predictions",
        ),
        (
            lambda: ml.mse_loss(np.zeros(2), "x"),  # type: ignore[call-overload]
            TypeError,
            r"mse_loss: expected an array layer, .* for targets",
        ),
    ],
    ids=[
        "delta 0",
        "beta negative",
        "delta str",
        "smoothing",
        "ignore probabilities",
        "ignore float",
        "weight 2-d",
        "targets list",
        "bool targets",
        "nll probabilities",
        "float predictions",
        "str targets",
    ],
)
def test_bad_arguments_when_the_loss_is_made(
    make: Callable[[], Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        make()


# ------------------------------------------------------------------------ shapes, dtypes, backends


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_static_shapes_and_dtypes(reduction: ml.Reduction) -> None:
    x32 = ArrayWeight(np.full((2, 3, 4), 0.5, dtype=np.float32))
    layers: list[Layer] = [
        LOSSES[name](x32, np.full((2, 3, 4), 0.5), reduction=reduction) for name in sorted(LOSSES)
    ]
    layers += [
        ml.nll_loss(x32, np.zeros((2, 3), dtype=np.int64), reduction=reduction),
        ml.cross_entropy(x32, np.full((2, 3, 4), 0.25), reduction=reduction, label_smoothing=0.1),
    ]
    for layer in layers:
        value = layer.predict_blocking().unwrap()
        if reduction == "none":
            assert isinstance(layer, ArrayLayer) and layer.dtype == np.float32
            assert layer.shape == np.shape(value) and np.asarray(value).dtype == np.float32
        else:
            assert isinstance(layer, FloatLayer) and type(value) is float and layer.shape == ()
        _, grads = ml.compute_gradients(ml.sum(layer) if isinstance(layer, ArrayLayer) else layer)
        gradient = grads[x32]
        assert isinstance(gradient, np.ndarray) and gradient.dtype == np.float32


_P = np.random.default_rng(5).dirichlet(np.ones(4), size=3)

STRICT_CASES: list[tuple[str, Callable[..., Layer], int]] = [
    ("mse none", lambda c, x, t: ml.mse_loss(x, t, reduction="none"), 2),
    ("huber mean", lambda c, x, t: ml.huber_loss(x, t, delta=0.5), 2),
    (
        "bce sum",
        lambda c, x, t: ml.binary_cross_entropy(
            ml.sigmoid(ml.lift_array(x)), ml.sigmoid(ml.lift_array(t)), reduction="sum"
        ),
        2,
    ),
    (
        "bce logits none",
        lambda c, x, t: ml.binary_cross_entropy_with_logits(
            x, ml.sigmoid(ml.lift_array(t)), reduction="none"
        ),
        2,
    ),
    (
        "nll weight ignore",
        lambda c, x: ml.nll_loss(ml.log_softmax(x), c(np.array([0, 2, 1])), weight=c(WEIGHT), ignore_index=2),
        1,
    ),
    (
        "ce smoothing none",
        lambda c, x: ml.cross_entropy(x, c(np.array([3, 1, 0])), reduction="none", label_smoothing=0.2),
        1,
    ),
    ("ce probabilities", lambda c, x: ml.cross_entropy(x, c(_P), reduction="sum", weight=c(WEIGHT)), 1),
]


@pytest.mark.parametrize(("name", "make", "inputs"), STRICT_CASES, ids=[c[0] for c in STRICT_CASES])
def test_on_array_api_strict_as_on_numpy(name: str, make: Callable[..., Layer], inputs: int) -> None:
    xps = pytest.importorskip("array_api_strict")
    from op_cases import NUMPY, Backend, OpCase, run_case

    strict = Backend("array_api_strict", xps.asarray, lambda a: np.asarray(np.from_dlpack(a)))
    rng = np.random.default_rng(2)
    case = OpCase(name, make, tuple(rng.standard_normal((3, 4)) for _ in range(inputs)))
    want, want_loss, want_grads = run_case(case, NUMPY)
    got, got_loss, got_grads = run_case(case, strict)
    np.testing.assert_allclose(got, want, rtol=TOL, atol=TOL)
    assert got_loss == pytest.approx(want_loss, rel=TOL, abs=TOL)
    for g, w in zip(got_grads, want_grads, strict=True):
        np.testing.assert_allclose(g, w, rtol=TOL, atol=TOL)


TREE_LOSSES: list[tuple[str, Callable[[ArrayLayer, int], Layer]]] = [
    (
        "cross_entropy",
        lambda h, k: ml.cross_entropy(h, k % 4, reduction="sum", label_smoothing=0.1, ignore_index=3),
    ),
    ("nll_loss", lambda h, k: ml.nll_loss(ml.log_softmax(h), k % 4, reduction="sum", weight=WEIGHT)),
    ("binary_cross_entropy_with_logits", lambda h, k: ml.binary_cross_entropy_with_logits(h, _targets(k))),
    ("smooth_l1_loss", lambda h, k: ml.smooth_l1_loss(h, _targets(k), reduction="none", beta=0.2)),
]


@pytest.mark.parametrize(("kind", "loss"), TREE_LOSSES, ids=[t[0] for t in TREE_LOSSES])
def test_per_node_losses_of_a_tree_merge_and_equal_the_calls_alone(
    kind: str, loss: Callable[[ArrayLayer, int], Layer]
) -> None:
    """A loss at every node of a binary tree of 8 leaves (15 nodes at 4 depths): at most one call
    per depth (as the library's fused cross_entropy of labels merges in this tree)."""

    def tree() -> FloatLayer:
        rng = np.random.default_rng(8)
        table = ArrayWeight(rng.standard_normal((8, 4)))
        w = ArrayWeight(rng.standard_normal((8, 4)) * 0.4)
        nodes: list[ArrayLayer] = [ml.take_rows(table, k) for k in range(8)]
        level = nodes
        while len(level) > 1:
            level = [
                ml.tanh(ml.concatenate([a, b]) @ w) for a, b in zip(level[::2], level[1::2], strict=True)
            ]
            nodes += level
        terms: list[FloatLayer] = []
        for k, h in enumerate(nodes):
            out = loss(h, k)
            terms.append(ml.sum(out * probe((4,))) if isinstance(out, ArrayLayer) else out)
        return ml.add_n(terms)

    merged, alone = merged_and_alone(tree)
    assert alone.stats.kinds[kind] == 15
    assert merged.stats.kinds[kind] <= 4, merged.stats.kinds


@settings(max_examples=40, deadline=None)
@given(
    logits=st.booleans(),
    shape=st.sampled_from([(5,), (4, 5), (2, 3, 5), (0, 5)]),
    smoothing=st.sampled_from([0.0, 0.3]),
    weighted=st.booleans(),
    ignore=st.sampled_from([None, 2, -100]),
    seed=st.integers(0, 2**32 - 1),
)
def test_labels_picked_on_numpy_are_the_generic_rule(
    logits: bool, shape: tuple[int, ...], smoothing: float, weighted: bool, ignore: int | None, seed: int
) -> None:
    """The NumPy path of the class losses' rule (each label picked by indexing) gives what the
    generic one (a one-hot, as on any array namespace) gives: losses, delta and counts."""
    xps = pytest.importorskip("array_api_strict")
    from monadl.dsl.ops.classification import _class_terms
    from monadl.typeclasses.backend import NUMPY

    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape)
    t = rng.integers(0, shape[-1], shape[:-1])
    if ignore is not None and t.size:
        t.reshape(-1)[::2] = ignore
    weight = rng.uniform(0.5, 2.0, shape[-1]) if weighted else None
    s = 0.0 if not logits else smoothing
    picked = _class_terms(NUMPY, x, t, (0, 0), weight, ignore, s, logits)
    x_s, w_s = xps.asarray(x), None if weight is None else xps.asarray(weight)
    generic = _class_terms(xps, x_s, xps.asarray(t), (0, 0), w_s, ignore, s, logits)
    for a, b in zip(picked, generic, strict=True):
        np.testing.assert_allclose(a, np.asarray(np.from_dlpack(b)), rtol=1e-13, atol=1e-15)
