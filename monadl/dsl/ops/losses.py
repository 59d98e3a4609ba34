"""Losses, as PyTorch's functional ones: :func:`mse_loss`, :func:`l1_loss`, :func:`huber_loss`,
:func:`smooth_l1_loss`, :func:`binary_cross_entropy` and :func:`binary_cross_entropy_with_logits`
(the class losses, ``cross_entropy`` and ``nll_loss``, are in ``monadl.dsl.ops.classification``).

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

from monadl.do.primitive import Batching
from monadl.dsl.core.arguments import array_operand, described
from monadl.dsl.core.layers import AnyArray, ArrayLayer, FloatLayer, apply_array, apply_float
from monadl.dsl.ops.activations import sigmoid_of
from monadl.dsl.ops.registry import declare
from monadl.dsl.ops.shape_rules import Info, promoted, scalar
from monadl.typeclasses.backend import NDARRAY, NUMPY, AnyNDArray, ShapeError, host_in, is_array, namespace

__all__ = [
    "Reduction",
    "binary_cross_entropy",
    "binary_cross_entropy_with_logits",
    "huber_loss",
    "l1_loss",
    "mse_loss",
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


def real_param(op: str, name: str, value: object) -> float:
    """A float parameter: a float or an int (not a bool), as a float."""
    if isinstance(value, (float, int, np.floating, np.integer)) and not isinstance(value, (bool, np.bool_)):
        return float(value)
    raise TypeError(f"{op}: {name} must be a float, got {described(value)}")


def mean_of(total: float, count: int | float) -> float:
    """``total / count``, NaN for a count of 0 (PyTorch's mean over nothing)."""
    return total / count if count else math.nan


def row_deltas(xp: Any, d: Any, like: Any) -> Any:
    """A merged call's delta of one value per row, shaped ``(n, 1, ...)`` to scale rows of
    ``like``, in its dtype."""
    return xp.astype(xp.reshape(d, (d.shape[0],) + (1,) * (like.ndim - 1)), like.dtype)


def row_sums(xp: Any, v: Any) -> Any:
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
        self.none = declare(
            name,
            value,
            (self._none_vjp_x, self._none_vjp_t),
            check=check,
            batch=Batching(elementwise=True),
            check_values=check_values,
            shape_rule=_pair_info,
        )
        self.reduced = declare(
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
            shape_rule=scalar,
        )

    def _none_vjp_x(self, xp: Any, d: Any, o: Any, x: Any, t: Any, **params: Any) -> Any:
        return self.dx(xp, x, t, d, **params)

    def _none_vjp_t(self, xp: Any, d: Any, o: Any, x: Any, t: Any, **params: Any) -> Any:
        return self.dt(xp, x, t, d, **params)

    def _reduced(self, xp: Any, x: Any, t: Any, mean: bool, **params: Any) -> float:
        total = float(xp.sum(self.value(xp, x, t, **params)))
        return mean_of(total, math.prod(x.shape)) if mean else total

    @staticmethod
    def _scale(d: float, x: Any, mean: bool) -> float:
        n = math.prod(x.shape)
        return (d / n if n else 0.0) if mean else d

    def _reduced_vjp_x(self, xp: Any, d: float, o: Any, x: Any, t: Any, mean: bool, **params: Any) -> Any:
        return self.dx(xp, x, t, self._scale(d, x, mean), **params)

    def _reduced_vjp_t(self, xp: Any, d: float, o: Any, x: Any, t: Any, mean: bool, **params: Any) -> Any:
        return self.dt(xp, x, t, self._scale(d, x, mean), **params)

    def _rows(self, xp: Any, x: Any, t: Any, mean: bool, **params: Any) -> Any:
        totals = row_sums(xp, self.value(xp, x, t, **params))
        n = math.prod(x.shape[1:])
        return (totals / n if n else totals * math.nan) if mean else totals

    def _row_scale(self, xp: Any, d: Any, x: Any, mean: bool) -> Any:
        scale = row_deltas(xp, d, x)
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
    lambda xp, x, t, scale: (sigmoid_of(xp, x) - t) * scale,
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
    v = real_param(op, name, value)
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


# --------------------------------------------------------------------- class labels and weights


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


def label_array(label: int) -> AnyNDArray:
    """A Python int label as a 0-d int64 array (read-only: one per label, shared)."""
    array = np.asarray(label, dtype=np.int64)
    array.flags.writeable = False
    return array


LABEL_ARRAYS: Final = [label_array(label) for label in range(256)]
"""The 0-d arrays of the labels 0 to 255, made once (a loss per node of a tree takes one each)."""


LABEL_RANGES: Final = [(label, label) for label in range(256)]
"""A label's range, made once."""


def class_targets(op: str, targets: object) -> AnyNDArray:
    """The targets of a class loss: an array, or a Python int label as a 0-d array."""
    if type(targets) is int:  # one example's label (``type``: a bool is no label)
        label: int = targets
        return LABEL_ARRAYS[label] if 0 <= label < len(LABEL_ARRAYS) else label_array(label)
    if type(targets) is not NDARRAY and not is_array(targets):  # NumPy's arrays first: one per node
        raise TypeError(f"{op}: expected an array of targets, got {type(targets).__name__}")
    return cast(AnyNDArray, targets)


def class_weight(xp: Any, weight: Any, x: Any) -> Any:
    """A class weight as the rule reads it: on ``x``'s device, in its dtype."""
    return None if weight is None else xp.astype(host_in(xp, weight, x), x.dtype)


def merged_weight(xp: Any, weights: list[Any] | None, x: Any) -> Any:
    """The class weights of merged calls, to broadcast against their stacked inputs ``x``: one
    weight where every call has the same one (the common case), else one row per call."""
    if weights is None:
        return None
    first = weights[0]
    if all(w is first for w in weights):
        return class_weight(xp, first, x)
    stacked = xp.stack([class_weight(xp, w, x) for w in weights])
    return xp.reshape(stacked, (len(weights),) + (1,) * (x.ndim - 2) + (x.shape[-1],))
