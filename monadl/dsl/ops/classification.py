"""Class losses: ``cross_entropy`` (of logits) and ``nll_loss`` (of log-probabilities) over a last
axis of classes, with PyTorch's options (``reduction``, ``weight``, ``ignore_index``,
``label_smoothing``); :func:`class_loss` makes either from its arguments.

``cross_entropy``'s common case (the mean over labels or probabilities, no options) is one fused
op of its own (:data:`CROSS_ENTROPY_FUSED`), which picks NumPy's rows by their labels; the other
cases are a class loss's two primitives (one per reduction kind), as ``nll_loss``'s. The
conventions are ``monadl.dsl.ops.losses``': the class axis is last, the targets are constants.
"""

from __future__ import annotations

import math
from typing import Any, Final, Literal, overload

import numpy as np

from monadl.do.primitive import Batching
from monadl.dsl import fused
from monadl.dsl.core.arguments import array_operand, described
from monadl.dsl.core.indices import integral
from monadl.dsl.core.layers import AnyArray, ArrayLayer, FloatLayer, apply_array, apply_float, float_op
from monadl.dsl.ops.activations import LOG_SOFTMAX, log_softmax_of, softmax_terms
from monadl.dsl.ops.losses import (
    LABEL_ARRAYS,
    LABEL_RANGES,
    Reduction,
    class_targets,
    class_weight,
    label_range,
    mean_of,
    merged_weight,
    real_param,
    reduction_param,
    row_deltas,
    row_sums,
)
from monadl.dsl.ops.registry import declare
from monadl.dsl.ops.shape_rules import Info, scalar
from monadl.typeclasses.backend import (
    NUMPY,
    AnyNDArray,
    Array,
    ShapeError,
    host_in,
    is_array,
    is_float_array,
    on_device,
    shape_of,
)

__all__ = ["class_loss", "cross_entropy", "nll_loss"]


# ------------------------------------------------------------------------------------ class losses
#
# ``nll_loss`` (of log-probabilities) and ``cross_entropy`` (of logits) over a last axis of classes.
# The targets are integer labels (of the inputs' shape without the class axis) or probabilities (of
# the inputs' shape), constants. Each element's loss is ``-sum(a * log_p)`` over the classes, where
# ``a`` is the targets made probabilities (a label one-hot), smoothed (``(1 - s) a + s / C``), times
# the class weights, and zero for a label ignored. The mean divides by the summed weights of the
# labels not ignored (their count, without weights), or by the number of elements for
# probabilities, as PyTorch does. The forward saves the delta, so a vjp is one multiplication.


def _class_terms(
    xp: Any,
    x: Any,
    targets: Any,
    labels: Any,
    weight: Any,
    ignore_index: int | None,
    smoothing: float,
    logits: bool,
) -> tuple[Any, Any, Any]:
    """The loss of each element (``x.shape[:-1]``), the delta of ``x`` for their sum, and the
    summed weight of each element's label (its count: 0 ignored, 1 counted; None for probability
    targets, where every element counts 1)."""
    classes = x.shape[-1]
    log_p = LOG_SOFTMAX.forward(xp, x, -1) if logits else x
    if labels is not None and xp is NUMPY and (weight is None or weight.ndim == 1):
        return _picked_terms(x, log_p, targets, weight, ignore_index, smoothing, logits)
    counted = None
    if labels is not None:
        t = host_in(xp, targets, x)
        onehot = xp.astype(xp.expand_dims(t, axis=-1) == xp.arange(classes, **on_device(xp, x)), x.dtype)
        a = onehot * (1.0 - smoothing) + smoothing / classes if smoothing else onehot
        if ignore_index is not None:
            counted = xp.astype(t != ignore_index, x.dtype)
            a = a * xp.expand_dims(counted, axis=-1)
        if weight is not None:
            chosen = xp.sum(onehot * weight, axis=-1)
            counted = chosen if counted is None else chosen * counted
        elif counted is None:
            counted = xp.ones(t.shape, dtype=x.dtype, **on_device(xp, x))
    else:
        a = xp.astype(host_in(xp, targets, x), x.dtype)
        if smoothing:
            a = a * (1.0 - smoothing) + smoothing / classes
    if weight is not None:
        a = a * weight
    if logits:
        terms = a * log_p
    else:  # log-probabilities of -inf where a is 0 (a class masked) add nothing, not NaN
        with np.errstate(invalid="ignore"):
            terms = a * log_p
        terms = xp.where(a == 0.0, xp.zeros_like(terms), terms)
    losses = -xp.sum(terms, axis=-1)
    if logits:
        delta = xp.exp(log_p) * xp.sum(a, axis=-1, keepdims=True) - a
    else:
        delta = -a
    return losses, delta, counted


def _picked_terms(
    x: Any, log_p: Any, targets: Any, weight: Any, ignore_index: int | None, smoothing: float, logits: bool
) -> tuple[Any, Any, Any]:
    """:func:`_class_terms` of labels on NumPy, each element's label picked by indexing instead of
    multiplied by a one-hot (a pass over the classes less, and no one-hot made): the label's term
    ``(1 - s) w_y log_p_y``, the smoothing's ``(s / C) sum(w log_p)``, the delta scattered."""
    classes = x.shape[-1]
    lead = x.shape[:-1]
    m = math.prod(lead)
    lp = log_p.reshape(m, classes)
    t = targets.reshape(m)
    keep = None
    if ignore_index is not None:
        keep = t != ignore_index
        t = np.where(keep, t, 0)  # (any label in range: its terms are taken out by ``keep``)
    rows = np.arange(m)
    counted = np.ones(m, dtype=x.dtype) if weight is None else weight[t]
    if keep is not None:
        counted = counted * keep
    coefficient = counted * (1.0 - smoothing) if smoothing else counted  # of the label's term
    with np.errstate(invalid="ignore"):  # (log-probabilities of -inf, where the coefficient is 0)
        picked = coefficient * lp[rows, t]
    if not logits:
        picked = np.where(coefficient == 0.0, 0.0, picked)
    losses = -picked
    total = coefficient  # the sum of each row's coefficients
    if smoothing:
        uniform = np.full(m, smoothing / classes, dtype=x.dtype)
        if keep is not None:
            uniform = uniform * keep
        weighted = lp if weight is None else lp * weight
        losses = losses - uniform * np.add.reduce(weighted, axis=1)
        total = total + uniform * (classes if weight is None else np.add.reduce(weight))
    if logits:
        delta = np.exp(lp) * total[:, None]
        if smoothing:
            delta -= uniform[:, None] if weight is None else uniform[:, None] * weight
    else:
        delta = np.zeros((m, classes), dtype=x.dtype)
    delta[rows, t] -= coefficient
    return losses.reshape(lead), delta.reshape(x.shape), counted.reshape(lead)


class _ClassLoss:
    """The primitives of a class loss (``logits``: of logits, else of log-probabilities)."""

    def __init__(self, name: str, what: str, logits: bool) -> None:
        self.name, self.what, self.logits = name, what, logits
        common: dict[str, Any] = {
            "saves": True,
            "check_values": self._check_labels,
            "per_run": ("targets", "labels", "weight"),
        }
        self.none = declare(
            name,
            self._none,
            (self._none_vjp,),
            check=self._check,
            batch=Batching(
                forward=self._none_rows,
                vjps=(self._none_vjp,),
                row_params=("targets",),
                check_merged=self._check_labels_merged,
            ),
            shape_rule=self._none_info,
            **common,
        )
        self.reduced = declare(
            name,
            self._reduced,
            (self._reduced_vjp,),
            check=self._check,
            batch=Batching(
                scalar="always",
                forward=self._reduced_rows,
                vjps=(self._reduced_rows_vjp,),
                row_params=("targets",),
                check_merged=self._check_labels_merged,
            ),
            shape_rule=scalar,
            **common,
        )

    # -- checks

    def _check(
        self, x: Any, targets: Any, labels: Any, weight: Any, ignore_index: Any, smoothing: float, **rest: Any
    ) -> None:
        name = self.name
        if type(x) is float or x.ndim == 0:
            raise ShapeError(f"{name}: {self.what} must have a class axis, got shape {shape_of(x)}")
        shape = tuple(x.shape)
        if shape[-1] == 0:
            raise ShapeError(f"{name}: {self.what} of shape {shape} have no classes")
        if rest.get("mean") and not math.prod(shape):
            raise ShapeError(f"{name}: {self.what} of shape {shape} are empty (no rows to take the mean of)")
        wanted = shape[:-1] if labels is not None else shape
        if tuple(targets.shape) != wanted:
            raise ShapeError(
                f"{name}: targets of shape {tuple(targets.shape)} do not fit {self.what} of shape {shape} "
                f"(expected {wanted}: probabilities, or integer labels of shape {shape[:-1]})"
            )
        if weight is not None and tuple(weight.shape) != shape[-1:]:
            raise ShapeError(
                f"{name}: a class weight of shape {tuple(weight.shape)} does not fit {shape[-1]} classes "
                f"({self.what} of shape {shape})"
            )

    def _check_labels(self, x: Any, labels: tuple[int, int] | None, **_: Any) -> None:
        if labels is not None:
            classes = x.shape[-1]
            lo, hi = labels
            if lo < 0 or hi >= classes:
                raise ValueError(
                    f"{self.name}: label {lo if lo < 0 else hi} is out of range for {classes} classes"
                )

    def _check_labels_merged(self, inputs: tuple[Any, ...], merged: dict[str, Any]) -> None:
        ranges: list[tuple[int, int]] | None = merged["labels"]
        if ranges is not None:
            lo = min(r[0] for r in ranges)
            hi = max(r[1] for r in ranges)
            self._check_labels(inputs[0], (lo, hi))

    def _none_info(self, x: Info, **_: Any) -> Info:
        return x[0][:-1], x[1], x[2]

    # -- rules

    def _terms(
        self, xp: Any, x: Any, targets: Any, labels: Any, weight: Any, ignore_index: Any, smoothing: float
    ) -> tuple[Any, Any, Any]:
        return _class_terms(xp, x, targets, labels, weight, ignore_index, smoothing, self.logits)

    def _none(
        self, xp: Any, x: Any, targets: Any, labels: Any, weight: Any, ignore_index: Any, smoothing: float
    ) -> Any:
        losses, delta, _ = self._terms(
            xp, x, targets, labels, class_weight(xp, weight, x), ignore_index, smoothing
        )
        return losses, delta

    def _none_rows(
        self, xp: Any, x: Any, targets: Any, labels: Any, weight: Any, ignore_index: Any, smoothing: float
    ) -> Any:
        losses, delta, _ = self._terms(
            xp, x, targets, labels, merged_weight(xp, weight, x), ignore_index, smoothing
        )
        return losses, delta

    @staticmethod
    def _none_vjp(xp: Any, d: Any, saved: Any, x: Any, **_: Any) -> Any:
        if type(d) is float:  # (the delta of one element's loss)
            return saved * d
        return saved * xp.expand_dims(xp.astype(d, saved.dtype), axis=-1)

    def _reduced(
        self,
        xp: Any,
        x: Any,
        targets: Any,
        labels: Any,
        weight: Any,
        ignore_index: Any,
        smoothing: float,
        mean: bool,
    ) -> tuple[float, tuple[Any, float]]:
        losses, delta, counted = self._terms(
            xp, x, targets, labels, class_weight(xp, weight, x), ignore_index, smoothing
        )
        total = float(xp.sum(losses))
        if not mean:
            return total, (delta, 1.0)
        count = math.prod(x.shape[:-1]) if counted is None else float(xp.sum(counted))
        return mean_of(total, count), (delta, 1.0 / count if count else 0.0)

    @staticmethod
    def _reduced_vjp(xp: Any, d: float, saved: tuple[Any, float], x: Any, **_: Any) -> Any:
        delta, scale = saved
        return delta * (d * scale)

    def _reduced_rows(
        self,
        xp: Any,
        x: Any,
        targets: Any,
        labels: Any,
        weight: Any,
        ignore_index: Any,
        smoothing: float,
        mean: bool,
    ) -> tuple[Any, tuple[Any, Any]]:
        losses, delta, counted = self._terms(
            xp, x, targets, labels, merged_weight(xp, weight, x), ignore_index, smoothing
        )
        totals = row_sums(xp, losses)
        n = x.shape[0]
        if not mean:
            return totals, (delta, xp.ones((n,), dtype=xp.float64, **on_device(xp, x)))
        if counted is None:
            count = math.prod(x.shape[1:-1])
            counts = xp.full((n,), float(count), dtype=xp.float64, **on_device(xp, x))
        else:
            counts = row_sums(xp, counted)
        empty = counts == 0.0
        safe = xp.where(empty, xp.ones_like(counts), counts)
        means = xp.where(empty, xp.full_like(totals, math.nan), totals / safe)
        return means, (delta, xp.where(empty, xp.zeros_like(counts), 1.0 / safe))

    @staticmethod
    def _reduced_rows_vjp(xp: Any, d: Any, saved: tuple[Any, Any], x: Any, **_: Any) -> Any:
        delta, scales = saved
        return delta * row_deltas(xp, d * scales, delta)


NLL: Final = _ClassLoss("nll_loss", "log-probabilities", logits=False)
CROSS_ENTROPY: Final = _ClassLoss("cross_entropy", "logits", logits=True)


def class_loss(
    loss: _ClassLoss,
    x: object,
    targets: object,
    reduction: object,
    weight: object,
    ignore_index: object,
    label_smoothing: object,
) -> FloatLayer | ArrayLayer:
    """A class loss (:data:`NLL`, :data:`CROSS_ENTROPY`) of ``x`` made: its arguments checked."""
    op = loss.name
    array_operand(op, x, loss.what)
    how = reduction_param(op, reduction)
    t = class_targets(op, targets)
    if weight is not None and not (
        is_array(weight) and is_float_array(weight) and len(getattr(weight, "shape", ())) == 1
    ):
        raise TypeError(
            f"{op}: weight must be a 1-d floating-point array (a weight per class), got {described(weight)}"
        )
    ignore: int | None = None
    if ignore_index is not None:
        if type(ignore_index) is bool or not isinstance(ignore_index, (int, np.integer)):
            raise TypeError(f"{op}: ignore_index must be an int or None, got {described(ignore_index)}")
        ignore = int(ignore_index)
    smoothing = real_param(op, "label_smoothing", label_smoothing)
    if not 0.0 <= smoothing <= 1.0:
        raise ValueError(f"{op}: label_smoothing must be in [0, 1], got {smoothing!r}")
    labels = None
    if integral(t):
        labels = label_range(t, ignore)
    elif not loss.logits:
        raise TypeError(f"{op}: expected integer labels, got targets of dtype {t.dtype}")
    elif not is_float_array(t):
        raise TypeError(f"{op}: expected integer labels or floating-point probabilities, got dtype {t.dtype}")
    elif ignore is not None:
        raise ValueError(
            f"{op}: ignore_index applies to integer labels; these targets are probabilities "
            f"(dtype {t.dtype}, shape {tuple(t.shape)})"
        )
    params = {
        "targets": t,
        "labels": labels,
        "weight": weight,
        "ignore_index": ignore,
        "smoothing": smoothing,
    }
    if how == "none":
        return apply_array(loss.none, x, **params)
    return apply_float(loss.reduced, x, mean=how == "mean", **params)


@overload
def nll_loss(
    log_probs: AnyArray,
    targets: AnyNDArray | int,
    *,
    reduction: Literal["mean", "sum"] = "mean",
    weight: Array | None = None,
    ignore_index: int | None = None,
) -> FloatLayer: ...
@overload
def nll_loss(
    log_probs: AnyArray,
    targets: AnyNDArray | int,
    *,
    reduction: Literal["none"],
    weight: Array | None = None,
    ignore_index: int | None = None,
) -> ArrayLayer: ...
def nll_loss(
    log_probs: AnyArray,
    targets: AnyNDArray | int,
    *,
    reduction: Reduction = "mean",
    weight: Array | None = None,
    ignore_index: int | None = None,
) -> FloatLayer | ArrayLayer:
    """The negative log-likelihood of integer labels (PyTorch's ``nll_loss``): ``-log_probs[...,
    label]`` of each element, reduced; ``log_probs`` of shape ``(..., classes)`` (a
    :func:`~monadl.log_softmax`'s output), ``targets`` integer labels of shape
    ``log_probs.shape[:-1]`` (a Python int for one example's ``(classes,)``).

    ``weight``: a weight per class (a 1-d array, a constant), multiplying each element's loss by its
    label's; the mean is then divided by the sum of those weights (PyTorch's weighted mean).
    ``ignore_index``: a label whose elements add nothing (their loss is 0, and the mean does not count
    them; PyTorch's default is -100: pass it for that behaviour). A label out of range (and not
    ignored) is an error when the op runs. The mean over no counted element is NaN, as PyTorch's."""
    return class_loss(NLL, log_probs, targets, reduction, weight, ignore_index, 0.0)


# ------------------------------------------------------------------------- cross_entropy, fused


def _targets(
    xp: Any, logits: Any, targets: Any, labels: tuple[int, int] | list[tuple[int, int]] | None
) -> Any:
    """One-hot (or soft) targets of ``logits``' shape, from probabilities or integer labels."""
    targets = host_in(xp, targets, logits)  # labels made NumPy arrays, logits on a GPU
    if labels is not None:
        classes = xp.arange(logits.shape[-1], **on_device(xp, logits))
        return xp.astype(xp.expand_dims(targets, axis=-1) == classes, logits.dtype)
    return targets


def _check_cross_entropy(logits: Any, targets: Any, labels: tuple[int, int] | None) -> None:
    if type(logits) is float or logits.ndim == 0:
        raise ShapeError(f"cross_entropy: logits must have a class axis, got shape {shape_of(logits)}")
    if math.prod(logits.shape) == 0:  # the mean over no rows, or a softmax over no classes
        raise ShapeError(
            f"cross_entropy: logits of shape {tuple(logits.shape)} are empty (no rows or no classes)"
        )
    wanted = tuple(logits.shape[:-1]) if labels is not None else tuple(logits.shape)
    if tuple(targets.shape) != wanted:
        raise ShapeError(
            f"cross_entropy: targets of shape {tuple(targets.shape)} do not fit logits of shape "
            f"{tuple(logits.shape)} (expected {wanted}: probabilities, or integer labels "
            f"of shape {tuple(logits.shape[:-1])})"
        )


def _check_labels(logits: Any, labels: tuple[int, int] | None, **_: Any) -> None:
    if labels is not None:
        classes = logits.shape[-1]
        lo, hi = labels
        if lo < 0 or hi >= classes:
            raise ValueError(
                f"cross_entropy: label {lo if lo < 0 else hi} is out of range for {classes} classes"
            )


def _check_labels_merged(inputs: tuple[Any, ...], merged: dict[str, Any]) -> None:
    # The calls' logits have one shape (the signature): the first call's stand for all, and the
    # labels' range is the union of theirs (None: every call's targets are probabilities).
    ranges: list[tuple[int, int]] | None = merged["labels"]
    if ranges is not None:
        lo, hi = ranges[0]
        for r in ranges:
            if r[0] < lo:
                lo = r[0]
            if r[1] > hi:
                hi = r[1]
        _check_labels(inputs[0], (lo, hi))


def _picked_labels(matrix: Any, labels: Any, batch: int) -> tuple[Any, Any]:
    """Of NumPy logits, a row per label: each row's log-probability of its label, and the gradient
    of their mean over ``batch`` (the softmax less the one-hot, over ``batch``).

    :func:`log_softmax_of`'s arithmetic, in one array of the logits' size: the shifted logits,
    their labels' entries read, become the terms ``exp(shifted)`` in place, and then the softmax
    ``terms / (1 + s)`` (the maximum's term 1). So one exp, not a second of the log-probabilities,
    and one large array made, not three: on a language model's logits (thousands of rows by its
    vocabulary) a fresh large array costs its pages as much again as the pass that fills it. The
    loss's bits are :func:`log_softmax_of`'s; the gradient's differ by rounding (it is as accurate:
    ``exp(log_p)`` carries ``log_p``'s absolute error, a relative one, into a small probability).

    Where the engine is compiled, one native call does these steps (``label_softmax`` of
    ``monadl/_native.c``: the same operations, NumPy's own exp, log1p and sum loops, the same
    bits): on a batch's few rows the dozen NumPy calls here, each indexing by rows, cost more than
    their arithmetic."""
    if fused.NATIVE is not None:
        done: tuple[Any, Any] | None = fused.NATIVE.label_softmax(matrix, labels, batch)
        if done is not None:
            return done
    rows = np.arange(matrix.shape[0])
    top = np.argmax(matrix, axis=1)
    terms = matrix - matrix[rows, top][:, None]
    picked = terms[rows, labels]
    np.exp(terms, out=terms)
    terms[rows, top] = 0.0
    s = np.add.reduce(terms, axis=1, keepdims=True)
    picked -= np.log1p(s)[:, 0]
    terms[rows, top] = 1.0
    s += 1.0
    terms /= s
    terms[rows, labels] -= 1.0
    if batch != 1:  # (a division by 1 changes nothing)
        terms /= batch
    return picked, terms


def _cross_entropy(xp: Any, logits: Any, targets: Any, labels: tuple[int, int] | None) -> tuple[float, Any]:
    """The loss, and (saved for the vjp) its gradient ``(softmax(logits) - targets) / batch``."""
    batch = int(math.prod(logits.shape[:-1]))
    if labels is not None and xp is NUMPY:  # pick each row's label instead of multiplying by a one-hot
        # On a matrix of rows (the arrays' reshape method: np.reshape's dispatch costs more than the
        # arithmetic on a batch of logits), indexed directly, so the gradient is written in place
        # whatever its memory layout.
        matrix = logits if logits.ndim == 2 else logits.reshape(batch, logits.shape[-1])
        flat = targets if targets.ndim == 1 else targets.reshape(batch)
        picked, gradient = _picked_labels(matrix, flat, batch)
        if matrix is not logits:
            gradient = gradient.reshape(logits.shape)
        return -float(np.add.reduce(picked)) / batch, gradient
    log_p, p = _probabilities(xp, logits, labels)
    onehot = _targets(xp, logits, targets, labels)
    return -float(xp.sum(onehot * log_p)) / batch, (p - onehot) / batch


def _cross_entropy_rows(
    xp: Any, logits: Any, targets: Any, labels: list[tuple[int, int]] | None
) -> tuple[Any, Any]:
    """``_cross_entropy`` of each row of stacked calls: one loss per row, as float64 (the unbatched
    loss is a Python float), and the saved gradients."""
    batch = int(math.prod(logits.shape[1:-1]))
    if labels is not None and xp is NUMPY:  # the labels picked, as a call alone picks them
        n, classes = logits.shape[0], logits.shape[-1]
        matrix = logits if logits.ndim == 2 else logits.reshape(n * batch, classes)
        picked, gradient = _picked_labels(matrix, targets.reshape(n * batch), batch)
        summed = np.add.reduce(picked.reshape(n, batch), axis=1)  # each call's, in its own order
        return -summed.astype(np.float64) / batch, gradient.reshape(logits.shape)
    log_p, p = _probabilities(xp, logits, labels)
    onehot = _targets(xp, logits, targets, labels)
    summed = xp.sum(onehot * log_p, axis=tuple(range(1, logits.ndim)))
    return -xp.astype(summed, xp.float64) / batch, (p - onehot) / batch


def _probabilities(xp: Any, logits: Any, labels: Any) -> tuple[Any, Any]:
    """The log-probabilities and the probabilities of logits, off NumPy's path of labels: for
    labels, that path's arithmetic (``terms / (1 + s)``: every namespace's gradient is NumPy's);
    for probability targets, ``exp(log_p)`` (as NumPy's path of probabilities)."""
    if labels is None:
        log_p = log_softmax_of(xp, logits, -1)
        return log_p, xp.exp(log_p)
    shifted, terms, rest = softmax_terms(xp, logits, -1)
    return shifted - xp.log1p(rest), terms / (1.0 + rest)


def _cross_entropy_vjp(xp: Any, d: float, saved: Any, logits: Any, targets: Any, labels: Any) -> Any:
    """The saved gradient times the loss's delta; the gradient itself where the delta is 1 (a loss
    summed into the one trained), without a pass over the logits (the op's vjp may give back what
    it was given: ``fresh=False``)."""
    return saved if d == 1.0 else saved * d


def _cross_entropy_rows_vjp(xp: Any, d: Any, saved: Any, logits: Any, targets: Any, labels: Any) -> Any:
    """:func:`_cross_entropy_vjp` of merged calls: each row's delta scales its rows."""
    if xp is NUMPY and bool(np.all(d == 1.0)):
        return saved
    return saved * row_deltas(xp, d, saved)


# ``labels`` is (min, max) of integer labels, computed once when the op is made, or None for
# probabilities. The forward saves the gradient, so the backward is one multiplication at most.
CROSS_ENTROPY_FUSED: Final = declare(
    "cross_entropy",
    _cross_entropy,
    (_cross_entropy_vjp,),
    check=_check_cross_entropy,
    saves=True,
    fresh=False,
    batch=Batching(
        scalar="always",
        forward=_cross_entropy_rows,
        vjps=(_cross_entropy_rows_vjp,),
        row_params=("targets",),
        check_merged=_check_labels_merged,
    ),
    check_values=_check_labels,
    per_run=("targets", "labels"),
    shape_rule=scalar,
)

LABEL_PARAMS: Final = [
    {"targets": array, "labels": labels} for array, labels in zip(LABEL_ARRAYS, LABEL_RANGES, strict=True)
]
"""The fused op's parameters for a Python int label, one dict per label, shared by every op given
that label and never changed (as an op's parameters are not): a loss per node of a tree makes no
dict of its own, and a run reads a few dicts, not one per node, when it works out signatures."""


@overload
def cross_entropy(
    logits: AnyArray,
    targets: AnyNDArray | int,
    *,
    reduction: Literal["mean", "sum"] = "mean",
    weight: Array | None = None,
    ignore_index: int | None = None,
    label_smoothing: float = 0.0,
) -> FloatLayer: ...


@overload
def cross_entropy(
    logits: AnyArray,
    targets: AnyNDArray | int,
    *,
    reduction: Literal["none"],
    weight: Array | None = None,
    ignore_index: int | None = None,
    label_smoothing: float = 0.0,
) -> ArrayLayer: ...


def cross_entropy(
    logits: AnyArray,
    targets: AnyNDArray | int,
    *,
    reduction: Reduction = "mean",
    weight: Array | None = None,
    ignore_index: int | None = None,
    label_smoothing: float = 0.0,
) -> FloatLayer | ArrayLayer:
    """``-sum(targets * log_softmax(logits))`` over the last axis (the classes), of each element,
    reduced: by default their mean (PyTorch's ``cross_entropy``, with the class axis last).

    ``targets`` are probabilities (one-hot or soft) of ``logits``' shape, or integer class labels of
    shape ``logits.shape[:-1]``: an integer array, or a Python int for one example's logits of shape
    ``(classes,)``. They are constants: no delta flows into them. A label out of range is an error
    when the op runs.

    ``reduction``: ``"mean"``, ``"sum"`` (a ``FloatLayer``) or ``"none"`` (an ``ArrayLayer`` of
    each element's loss, of shape ``logits.shape[:-1]``). ``label_smoothing``: ``s`` in [0, 1]
    mixes the targets with the uniform distribution, ``(1 - s) * targets + s / classes``.
    ``weight``: a weight per class (a 1-d array, a constant), multiplying each class's term; with
    labels, the mean divides by the summed weights of the elements' labels (PyTorch's weighted
    mean), with probabilities by the number of elements. ``ignore_index``: for labels, a label whose
    elements add nothing (loss 0, not counted by the mean; PyTorch's default is -100, pass it for
    that behaviour). The mean over no counted label is NaN, as PyTorch's. (See
    :func:`~monadl.nll_loss` for log-probabilities.)
    """
    if reduction == "mean" and weight is None and ignore_index is None and label_smoothing == 0.0:
        # the common case: one fused op, NumPy's rows picked by their labels
        array_operand("cross_entropy", logits)
        if type(targets) is int and 0 <= targets < len(LABEL_PARAMS):  # a node's label: made once
            return float_op(CROSS_ENTROPY_FUSED, (logits,), LABEL_PARAMS[targets])
        t = class_targets("cross_entropy", targets)
        labels = None
        if integral(t):  # checked once here, not at every run
            labels = label_range(t, None)
        return float_op(CROSS_ENTROPY_FUSED, (logits,), {"targets": t, "labels": labels})
    return class_loss(CROSS_ENTROPY, logits, targets, reduction, weight, ignore_index, label_smoothing)
