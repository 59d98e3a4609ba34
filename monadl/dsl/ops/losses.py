"""Losses, as PyTorch's functional ones: :func:`mse_loss`, :func:`l1_loss`, :func:`huber_loss`,
:func:`smooth_l1_loss`, :func:`binary_cross_entropy`, :func:`binary_cross_entropy_with_logits` and
:func:`nll_loss` (``cross_entropy``, in ``monadl.dsl.ops``, is built on :func:`class_loss` here).

Every loss takes ``reduction``: ``"mean"`` (the default) or ``"sum"`` gives a ``FloatLayer``,
``"none"`` an ``ArrayLayer`` of the loss of each element (of each row, for the class losses). mypy
reads the result's kind from the literal. Each loss is one primitive per reduction kind, with
hand-written vjps: a loss is one node of the graph whatever its arithmetic, computed stably in
one place (``binary_cross_entropy_with_logits`` by ``softplus``, the class losses by
``log_softmax``).

**Merging.** Per-example losses of a tree or a sequence (one per node or step, each alone a
few elements) merge under dynamic batching as the other ops do: the calls' inputs and targets
are stacked, and a merged call reduces each row on its own (its own mean, its own count of labels
not ignored, its own class weights).

**Conventions.** The class axis is the last (as :func:`~monadl.cross_entropy`'s), not PyTorch's
axis 1: for a batch of rows ``(N, C)`` the two agree; for ``(N, C, L)`` in PyTorch, move the class
axis last. The regression and binary losses take equal shapes for predictions and targets (PyTorch
broadcasts them with a warning that the result is likely wrong); their targets may be layers, and
get deltas. The class losses' targets are constants: labels or probabilities.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Final, Literal, cast, overload

import numpy as np

from monadl.do.primitive import Batching, Primitive
from monadl.dsl import primitives as P
from monadl.dsl.arguments import array_operand, described
from monadl.dsl.indices import integral
from monadl.dsl.layers import AnyArray, ArrayLayer, FloatLayer, apply_array, apply_float
from monadl.dsl.static import FLOAT, Info, promoted
from monadl.typeclasses.backend import (
    NDARRAY,
    NUMPY,
    AnyNDArray,
    Array,
    ShapeError,
    host_in,
    is_array,
    is_float_array,
    namespace,
    on_device,
    shape_of,
)

__all__ = [
    "Reduction",
    "binary_cross_entropy",
    "binary_cross_entropy_with_logits",
    "class_loss",
    "huber_loss",
    "l1_loss",
    "mse_loss",
    "nll_loss",
    "smooth_l1_loss",
]

Reduction = Literal["mean", "sum", "none"]
"""How a loss reduces the losses of its elements: their mean or their sum (a ``FloatLayer``), or
not at all (``"none"``: an ``ArrayLayer``)."""

_REDUCTIONS: Final = ("mean", "sum", "none")


def reduction_param(op: str, reduction: object) -> str:
    """``reduction`` checked: one of ``"mean"``, ``"sum"``, ``"none"``."""
    if type(reduction) is str and reduction in _REDUCTIONS:
        return reduction
    raise ValueError(f"{op}: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")


def _real(op: str, name: str, value: object) -> float:
    """A float parameter: a float or an int (not a bool), as a float."""
    if isinstance(value, (float, int, np.floating, np.integer)) and not isinstance(value, (bool, np.bool_)):
        return float(value)
    raise TypeError(f"{op}: {name} must be a float, got {described(value)}")


def _mean_of(total: float, count: int | float) -> float:
    """``total / count``, NaN for a count of 0 (PyTorch's mean over nothing)."""
    return total / count if count else math.nan


def _row_deltas(xp: Any, d: Any, like: Any) -> Any:
    """A merged call's delta of one value per row, shaped ``(n, 1, ...)`` to scale rows of
    ``like``, in its dtype."""
    return xp.astype(xp.reshape(d, (d.shape[0],) + (1,) * (like.ndim - 1)), like.dtype)


def _row_sums(xp: Any, v: Any) -> Any:
    """The sum of each row of ``v`` (rows of merged calls) as float64 (the loss of a call alone is
    a Python float): each row summed as one flat vector, in the order a call alone sums it."""
    n = v.shape[0]
    return xp.astype(xp.sum(xp.reshape(v, (n, math.prod(v.shape[1:]))), axis=1), xp.float64)


# --------------------------------------------------------------------------------- pointwise losses
#
# A pointwise loss is ``value(x, t)`` of each element and its partial derivatives times a delta,
# ``dx(x, t, scale)`` and ``dt(x, t, scale)`` (``scale``: a float, or an array of deltas; folded into
# the rule, so a constant factor costs no pass of its own). It makes two primitives: ``none`` (the
# losses of the elements; its calls merge as elementwise ops do) and ``reduced`` (their mean or
# sum: a float; merged, one per row).


def _check_pair(name: str, what: str) -> Callable[..., None]:
    """The check of a pointwise loss named ``name`` of ``what`` (predictions, probabilities,
    logits): two arrays of one shape. (A float is refused when the op is made; a user's own
    differentiable value shows its kind only when it runs.)"""

    def check(x: Any, t: Any, *_: Any, **__: Any) -> None:
        for operand, a in ((what, x), ("targets", t)):
            if type(a) is float:
                raise ShapeError(f"{name}: expected an array of {operand}, got a float")
        if tuple(x.shape) != tuple(t.shape):
            raise ShapeError(
                f"{name}: {what} of shape {tuple(x.shape)} and targets of shape {tuple(t.shape)} differ "
                "(they must be equal)"
            )

    return check


def _pair_info(x: Info, t: Info, **_: Any) -> Info:
    if x[0] != t[0]:
        raise ValueError("shapes differ")  # the run says so
    return (x[0], *promoted(x, t))


def _float_info(*_: Any, **__: Any) -> Info:
    return FLOAT


class _Pointwise:
    """A pointwise loss's rules (``value(xp, x, t, **params)``, ``dx`` and ``dt``: ``(xp, x, t,
    scale, **params)``) and its two primitives."""

    def __init__(
        self,
        name: str,
        what: str,
        value: Callable[..., Any],
        dx: Callable[..., Any],
        dt: Callable[..., Any],
        check_values: Callable[..., None] | None = None,
    ) -> None:
        self.what, self.value, self.dx, self.dt = what, value, dx, dt
        check = _check_pair(name, what)
        self.none = Primitive(
            name,
            value,
            (self._none_vjp_x, self._none_vjp_t),
            check=check,
            batch=Batching(elementwise=True),
            check_values=check_values,
            fresh=True,
            own=True,
            shape_rule=_pair_info,
        )
        self.reduced = Primitive(
            name,
            self._reduced,
            (self._reduced_vjp_x, self._reduced_vjp_t),
            check=check,
            batch=Batching(
                scalar="always",
                forward=self._rows,
                vjps=(self._rows_vjp_x, self._rows_vjp_t),
            ),
            check_values=check_values,
            fresh=True,
            own=True,
            shape_rule=_float_info,
        )

    def _none_vjp_x(self, xp: Any, d: Any, o: Any, x: Any, t: Any, **params: Any) -> Any:
        return self.dx(xp, x, t, d, **params)

    def _none_vjp_t(self, xp: Any, d: Any, o: Any, x: Any, t: Any, **params: Any) -> Any:
        return self.dt(xp, x, t, d, **params)

    def _reduced(self, xp: Any, x: Any, t: Any, mean: bool, **params: Any) -> float:
        total = float(xp.sum(self.value(xp, x, t, **params)))
        return _mean_of(total, math.prod(x.shape)) if mean else total

    @staticmethod
    def _scale(d: float, x: Any, mean: bool) -> float:
        n = math.prod(x.shape)
        return (d / n if n else 0.0) if mean else d

    def _reduced_vjp_x(self, xp: Any, d: float, o: Any, x: Any, t: Any, mean: bool, **params: Any) -> Any:
        return self.dx(xp, x, t, self._scale(d, x, mean), **params)

    def _reduced_vjp_t(self, xp: Any, d: float, o: Any, x: Any, t: Any, mean: bool, **params: Any) -> Any:
        return self.dt(xp, x, t, self._scale(d, x, mean), **params)

    def _rows(self, xp: Any, x: Any, t: Any, mean: bool, **params: Any) -> Any:
        totals = _row_sums(xp, self.value(xp, x, t, **params))
        n = math.prod(x.shape[1:])
        return (totals / n if n else totals * math.nan) if mean else totals

    def _row_scale(self, xp: Any, d: Any, x: Any, mean: bool) -> Any:
        scale = _row_deltas(xp, d, x)
        n = math.prod(x.shape[1:])
        return (scale / n if n else scale * 0.0) if mean else scale

    def _rows_vjp_x(self, xp: Any, d: Any, o: Any, x: Any, t: Any, mean: bool, **params: Any) -> Any:
        return self.dx(xp, x, t, self._row_scale(xp, d, x, mean), **params)

    def _rows_vjp_t(self, xp: Any, d: Any, o: Any, x: Any, t: Any, mean: bool, **params: Any) -> Any:
        return self.dt(xp, x, t, self._row_scale(xp, d, x, mean), **params)


def _mse(xp: Any, x: Any, t: Any) -> Any:
    z = x - t
    return z * z


# squared error (x - t)^2, whose derivative is 2 (x - t)
_MSE = _Pointwise(
    "mse_loss",
    "predictions",
    _mse,
    lambda xp, x, t, scale: (x - t) * (2.0 * scale),
    lambda xp, x, t, scale: (t - x) * (2.0 * scale),
)

# absolute error |x - t| (derivative 0 where x == t, as PyTorch's)
_L1 = _Pointwise(
    "l1_loss",
    "predictions",
    lambda xp, x, t: xp.abs(x - t),
    lambda xp, x, t, scale: xp.sign(x - t) * scale,
    lambda xp, x, t, scale: xp.sign(t - x) * scale,
)


def _huber(xp: Any, x: Any, t: Any, delta: float) -> Any:
    z = xp.abs(x - t)
    return xp.where(z < delta, 0.5 * z * z, delta * (z - 0.5 * delta))


_HUBER = _Pointwise(
    "huber_loss",
    "predictions",
    _huber,
    lambda xp, x, t, scale, delta: xp.clip(x - t, -delta, delta) * scale,
    lambda xp, x, t, scale, delta: xp.clip(t - x, -delta, delta) * scale,
)


def _smooth_l1(xp: Any, x: Any, t: Any, beta: float) -> Any:
    z = xp.abs(x - t)
    if beta == 0.0:
        return z
    return xp.where(z < beta, (0.5 / beta) * z * z, z - 0.5 * beta)


def _smooth_l1_d(xp: Any, z: Any, scale: Any, beta: float) -> Any:
    """The derivative of the smooth L1 loss at a difference ``z``, times ``scale``:
    ``clip(z / beta, -1, 1)``, the sign of ``z`` for ``beta`` 0."""
    if beta == 0.0:
        return xp.sign(z) * scale
    return xp.clip(z, -beta, beta) * (scale / beta)


_SMOOTH_L1 = _Pointwise(
    "smooth_l1_loss",
    "predictions",
    _smooth_l1,
    lambda xp, x, t, scale, beta: _smooth_l1_d(xp, x - t, scale, beta),
    lambda xp, x, t, scale, beta: _smooth_l1_d(xp, t - x, scale, beta),
)

# Binary cross entropy of probabilities, as PyTorch computes it: each log clamped at -100 (a
# probability of exactly 0 or 1 gives a finite loss), the delta of the probabilities
# (p - t) / max(p (1 - p), 1e-12); the targets' delta is the derivative of the clamped loss.
_BCE_EPSILON: Final = float(np.float32(1e-12))  # PyTorch's, a float32 constant
_LOG_FLOOR: Final = -100.0


def _clamped_logs(xp: Any, p: Any) -> tuple[Any, Any]:
    """``log(p)`` and ``log(1 - p)``, each at least -100 (a log of 0 is -inf, without NumPy's warning)."""
    with np.errstate(divide="ignore"):
        return xp.maximum(xp.log(p), _LOG_FLOOR), xp.maximum(xp.log1p(-p), _LOG_FLOOR)


def _bce(xp: Any, p: Any, t: Any) -> Any:
    log_p, log_q = _clamped_logs(xp, p)
    return (t - 1.0) * log_q - t * log_p


def _bce_dp(xp: Any, p: Any, t: Any, scale: Any) -> Any:
    return (p - t) / xp.maximum((1.0 - p) * p, _BCE_EPSILON) * scale


def _bce_dt(xp: Any, p: Any, t: Any, scale: Any) -> Any:
    log_p, log_q = _clamped_logs(xp, p)
    return (log_q - log_p) * scale


def _check_bce_values(p: Any, t: Any, *_: Any, **__: Any) -> None:
    """Probabilities and targets in [0, 1] (PyTorch checks both; a NaN is outside), checked at
    every run: they are values. (A merged group checks each call's, so that an error names it.)"""
    for name, a in (("probabilities", p), ("targets", t)):
        if type(a) is float:
            continue
        outside = ~((a >= 0.0) & (a <= 1.0))
        if bool(namespace(a).any(outside)):
            one = f", one is {float(a[outside].reshape(-1)[0])!r}" if type(a) is NDARRAY else ""
            raise ValueError(
                f"binary_cross_entropy: {name} of shape {tuple(a.shape)} must lie in [0, 1]{one}"
            )


_BCE = _Pointwise("binary_cross_entropy", "probabilities", _bce, _bce_dp, _bce_dt, _check_bce_values)


# Binary cross entropy of logits: (1 - t) x + softplus(-x), softplus(-x) = max(-x, 0) + log1p(e^-|x|):
# no exp of a large number, so large logits give finite losses and deltas (sigmoid(x) - t).
def _bce_logits(xp: Any, x: Any, t: Any) -> Any:
    return (1.0 - t) * x + xp.maximum(-x, 0.0) + xp.log1p(xp.exp(-xp.abs(x)))


_BCE_LOGITS = _Pointwise(
    "binary_cross_entropy_with_logits",
    "logits",
    _bce_logits,
    lambda xp, x, t, scale: (P.sigmoid_of(xp, x) - t) * scale,
    lambda xp, x, t, scale: x * -scale,
)


def _pointwise_loss(
    loss: _Pointwise, op: str, x: object, t: object, reduction: object, **params: Any
) -> FloatLayer | ArrayLayer:
    array_operand(op, x, loss.what)
    array_operand(op, t, "targets")
    how = reduction_param(op, reduction)
    if how == "none":
        return apply_array(loss.none, x, t, **params)
    return apply_float(loss.reduced, x, t, mean=how == "mean", **params)


@overload
def mse_loss(
    predictions: AnyArray, targets: AnyArray, *, reduction: Literal["mean", "sum"] = "mean"
) -> FloatLayer: ...
@overload
def mse_loss(predictions: AnyArray, targets: AnyArray, *, reduction: Literal["none"]) -> ArrayLayer: ...
def mse_loss(
    predictions: AnyArray, targets: AnyArray, *, reduction: Reduction = "mean"
) -> FloatLayer | ArrayLayer:
    """The squared error ``(predictions - targets) ** 2`` of each element, reduced (PyTorch's
    ``mse_loss``). ``predictions`` and ``targets`` are of one shape; both get deltas."""
    return _pointwise_loss(_MSE, "mse_loss", predictions, targets, reduction)


@overload
def l1_loss(
    predictions: AnyArray, targets: AnyArray, *, reduction: Literal["mean", "sum"] = "mean"
) -> FloatLayer: ...
@overload
def l1_loss(predictions: AnyArray, targets: AnyArray, *, reduction: Literal["none"]) -> ArrayLayer: ...
def l1_loss(
    predictions: AnyArray, targets: AnyArray, *, reduction: Reduction = "mean"
) -> FloatLayer | ArrayLayer:
    """The absolute error ``|predictions - targets|`` of each element, reduced (PyTorch's
    ``l1_loss``; its derivative is 0 where they are equal)."""
    return _pointwise_loss(_L1, "l1_loss", predictions, targets, reduction)


def _positive(op: str, name: str, value: object, zero: bool) -> float:
    v = _real(op, name, value)
    if not (v >= 0.0 if zero else v > 0.0) or math.isinf(v):
        raise ValueError(f"{op}: {name} must be {'>= 0' if zero else '> 0'} and finite, got {v!r}")
    return v


@overload
def huber_loss(
    predictions: AnyArray,
    targets: AnyArray,
    *,
    reduction: Literal["mean", "sum"] = "mean",
    delta: float = 1.0,
) -> FloatLayer: ...
@overload
def huber_loss(
    predictions: AnyArray, targets: AnyArray, *, reduction: Literal["none"], delta: float = 1.0
) -> ArrayLayer: ...
def huber_loss(
    predictions: AnyArray, targets: AnyArray, *, reduction: Reduction = "mean", delta: float = 1.0
) -> FloatLayer | ArrayLayer:
    """The Huber loss of each element, reduced (PyTorch's ``huber_loss``): with ``z = |predictions -
    targets|``, ``0.5 * z ** 2`` where ``z < delta``, else ``delta * (z - 0.5 * delta)``; quadratic
    near 0, linear (slope ``delta``) beyond. ``delta > 0``."""
    d = _positive("huber_loss", "delta", delta, zero=False)
    return _pointwise_loss(_HUBER, "huber_loss", predictions, targets, reduction, delta=d)


@overload
def smooth_l1_loss(
    predictions: AnyArray,
    targets: AnyArray,
    *,
    reduction: Literal["mean", "sum"] = "mean",
    beta: float = 1.0,
) -> FloatLayer: ...
@overload
def smooth_l1_loss(
    predictions: AnyArray, targets: AnyArray, *, reduction: Literal["none"], beta: float = 1.0
) -> ArrayLayer: ...
def smooth_l1_loss(
    predictions: AnyArray, targets: AnyArray, *, reduction: Reduction = "mean", beta: float = 1.0
) -> FloatLayer | ArrayLayer:
    """The smooth L1 loss of each element, reduced (PyTorch's ``smooth_l1_loss``): with ``z =
    |predictions - targets|``, ``0.5 * z ** 2 / beta`` where ``z < beta``, else ``z - 0.5 * beta``
    (the Huber loss divided by ``beta``; ``beta = 0`` is the L1 loss). ``beta >= 0``."""
    b = _positive("smooth_l1_loss", "beta", beta, zero=True)
    return _pointwise_loss(_SMOOTH_L1, "smooth_l1_loss", predictions, targets, reduction, beta=b)


@overload
def binary_cross_entropy(
    probabilities: AnyArray, targets: AnyArray, *, reduction: Literal["mean", "sum"] = "mean"
) -> FloatLayer: ...
@overload
def binary_cross_entropy(
    probabilities: AnyArray, targets: AnyArray, *, reduction: Literal["none"]
) -> ArrayLayer: ...
def binary_cross_entropy(
    probabilities: AnyArray, targets: AnyArray, *, reduction: Reduction = "mean"
) -> FloatLayer | ArrayLayer:
    """``-(t * log(p) + (1 - t) * log(1 - p))`` of each element, reduced (PyTorch's
    ``binary_cross_entropy``): ``p`` a probability (a sigmoid's output), ``t`` a target in [0, 1];
    a value outside [0, 1] is an error when the op runs. As PyTorch's, each log is clamped at -100,
    so that a probability of exactly 0 or 1 gives a finite loss, and the delta of ``p`` is ``(p -
    t) / max(p (1 - p), 1e-12)``. On logits, :func:`binary_cross_entropy_with_logits` is exact
    where this one saturates."""
    return _pointwise_loss(_BCE, "binary_cross_entropy", probabilities, targets, reduction)


@overload
def binary_cross_entropy_with_logits(
    logits: AnyArray, targets: AnyArray, *, reduction: Literal["mean", "sum"] = "mean"
) -> FloatLayer: ...
@overload
def binary_cross_entropy_with_logits(
    logits: AnyArray, targets: AnyArray, *, reduction: Literal["none"]
) -> ArrayLayer: ...
def binary_cross_entropy_with_logits(
    logits: AnyArray, targets: AnyArray, *, reduction: Reduction = "mean"
) -> FloatLayer | ArrayLayer:
    """:func:`binary_cross_entropy` of ``sigmoid(logits)``, computed stably as PyTorch's
    ``binary_cross_entropy_with_logits``: ``(1 - t) * x + softplus(-x)``, whose delta is
    ``sigmoid(x) - t``. Logits of any size give finite losses and deltas."""
    return _pointwise_loss(_BCE_LOGITS, "binary_cross_entropy_with_logits", logits, targets, reduction)


# ------------------------------------------------------------------------------------ class losses
#
# ``nll_loss`` (of log-probabilities) and ``cross_entropy`` (of logits) over a last axis of classes.
# The targets are integer labels (of the inputs' shape without the class axis) or probabilities (of
# the inputs' shape), constants. Each element's loss is ``-sum(a * log_p)`` over the classes, where
# ``a`` is the targets made probabilities (a label one-hot), smoothed (``(1 - s) a + s / C``), times
# the class weights, and zero for a label ignored. The mean divides by the summed weights of the
# labels not ignored (their count, without weights), or by the number of elements for
# probabilities, as PyTorch does. The forward saves the delta, so a vjp is one multiplication.


def label_range(targets: Any, ignore_index: int | None) -> tuple[int, int]:
    """The smallest and the largest label of ``targets`` not ``ignore_index`` ((0, 0) where there
    is none: every class count has label 0). On NumPy by the ufuncs' reductions: ``np.min`` and
    ``np.max`` add microseconds of Python each, to every training step that makes the op."""
    if not targets.shape:  # one label (a node of a tree): no reduction needed
        label = int(targets)
        if label == ignore_index:
            return LABEL_RANGES[0]
        return LABEL_RANGES[label] if 0 <= label < len(LABEL_RANGES) else (label, label)
    if not math.prod(targets.shape):
        return (0, 0)
    xp = namespace(targets)
    if ignore_index is not None:
        targets = xp.where(targets == ignore_index, xp.zeros_like(targets), targets)
    if xp is NUMPY:
        return int(np.minimum.reduce(targets, axis=None)), int(np.maximum.reduce(targets, axis=None))
    return int(xp.min(targets)), int(xp.max(targets))


def _label_array(label: int) -> AnyNDArray:
    """A Python int label as a 0-d int64 array (read-only: one per label, shared)."""
    array = np.asarray(label, dtype=np.int64)
    array.flags.writeable = False
    return array


LABEL_ARRAYS: Final = [_label_array(label) for label in range(256)]
"""The 0-d arrays of the labels 0 to 255, made once (a loss per node of a tree takes one each)."""
LABEL_RANGES: Final = [(label, label) for label in range(256)]
"""A label's range, made once."""


def class_targets(op: str, targets: object) -> AnyNDArray:
    """The targets of a class loss: an array, or a Python int label as a 0-d array."""
    if type(targets) is int:  # one example's label (``type``: a bool is no label)
        label: int = targets
        return LABEL_ARRAYS[label] if 0 <= label < len(LABEL_ARRAYS) else _label_array(label)
    if type(targets) is not NDARRAY and not is_array(targets):  # NumPy's arrays first: one per node
        raise TypeError(f"{op}: expected an array of targets, got {type(targets).__name__}")
    return cast(AnyNDArray, targets)


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
    log_p = P.log_softmax.forward(xp, x, -1) if logits else x
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


def _class_weight(xp: Any, weight: Any, x: Any) -> Any:
    """A class weight as the rule reads it: on ``x``'s device, in its dtype."""
    return None if weight is None else xp.astype(host_in(xp, weight, x), x.dtype)


def _merged_weight(xp: Any, weights: list[Any] | None, x: Any) -> Any:
    """The class weights of merged calls, to broadcast against their stacked inputs ``x``: one
    weight where every call has the same one (the common case), else one row per call."""
    if weights is None:
        return None
    first = weights[0]
    if all(w is first for w in weights):
        return _class_weight(xp, first, x)
    stacked = xp.stack([_class_weight(xp, w, x) for w in weights])
    return xp.reshape(stacked, (len(weights),) + (1,) * (x.ndim - 2) + (x.shape[-1],))


class _ClassLoss:
    """The primitives of a class loss (``logits``: of logits, else of log-probabilities)."""

    def __init__(self, name: str, what: str, logits: bool) -> None:
        self.name, self.what, self.logits = name, what, logits
        common: dict[str, Any] = {
            "saves": True,
            "check_values": self._check_labels,
            "per_run": ("targets", "labels", "weight"),
            "fresh": True,
            "own": True,
        }
        self.none = Primitive(
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
        self.reduced = Primitive(
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
            shape_rule=_float_info,
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
            xp, x, targets, labels, _class_weight(xp, weight, x), ignore_index, smoothing
        )
        return losses, delta

    def _none_rows(
        self, xp: Any, x: Any, targets: Any, labels: Any, weight: Any, ignore_index: Any, smoothing: float
    ) -> Any:
        losses, delta, _ = self._terms(
            xp, x, targets, labels, _merged_weight(xp, weight, x), ignore_index, smoothing
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
            xp, x, targets, labels, _class_weight(xp, weight, x), ignore_index, smoothing
        )
        total = float(xp.sum(losses))
        if not mean:
            return total, (delta, 1.0)
        count = math.prod(x.shape[:-1]) if counted is None else float(xp.sum(counted))
        return _mean_of(total, count), (delta, 1.0 / count if count else 0.0)

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
            xp, x, targets, labels, _merged_weight(xp, weight, x), ignore_index, smoothing
        )
        totals = _row_sums(xp, losses)
        n = x.shape[0]
        if not mean:
            return totals, (delta, xp.ones((n,), dtype=xp.float64, **on_device(xp, x)))
        if counted is None:
            count = math.prod(x.shape[1:-1])
            counts = xp.full((n,), float(count), dtype=xp.float64, **on_device(xp, x))
        else:
            counts = _row_sums(xp, counted)
        empty = counts == 0.0
        safe = xp.where(empty, xp.ones_like(counts), counts)
        means = xp.where(empty, xp.full_like(totals, math.nan), totals / safe)
        return means, (delta, xp.where(empty, xp.zeros_like(counts), 1.0 / safe))

    @staticmethod
    def _reduced_rows_vjp(xp: Any, d: Any, saved: tuple[Any, Any], x: Any, **_: Any) -> Any:
        delta, scales = saved
        return delta * _row_deltas(xp, d * scales, delta)


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
    smoothing = _real(op, "label_smoothing", label_smoothing)
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
