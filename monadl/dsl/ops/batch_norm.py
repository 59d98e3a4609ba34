"""Batch normalisation (Ioffe and Szegedy 2015) as one primitive, with a hand-written vjp.

The channel axis is axis 1, as PyTorch's (``(N, C)``, ``(N, C, L)``, ``(N, C, H, W)``: NCHW);
statistics are over every other axis. ``batch_norm(x, gamma, beta)`` normalises by the batch's
own statistics (biased variance); :class:`monadl.nn.BatchNorm1d`/``BatchNorm2d`` apply the same op
with running statistics: in a training step's forward pass the batch's, and the running ones'
update staged for the step's commit; in a prediction the running ones. The op reads the mode and
stages the update through its run's context (``context=True``: see :mod:`monadl.do.context`), never
the calling thread's, so its kernel runs on the executor's workers where its cost says so. A module
used twice in a step composes its two updates as two steps would (in the order its kernels run).

Its calls never merge under dynamic batching: the statistics are each call's own batch's, and a
merged call would mix them.

Data-parallel training (``monadl.distributed``) pools the running statistics' updates of its
replicas: :func:`recording_statistics` collects the batch statistics each update was made from,
and :func:`stage_statistics` stages the update of statistics pooled over every replica's shard.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any, Protocol

from monadl.do.context import RECORDED, RunContext
from monadl.do.primitive import elementwise_cost
from monadl.dsl.core.layers import AnyArray, ArrayLayer, apply_array, is_float_kind
from monadl.dsl.ops.registry import declare
from monadl.dsl.ops.shape_rules import same
from monadl.runtime.staging import current_staging
from monadl.typeclasses.backend import ShapeError, namespace, shape_of

__all__ = ["BATCH_NORM", "RunningStats", "batch_norm", "recording_statistics", "stage_statistics"]


class RunningStats(Protocol):
    """What the op reads of a batch norm module: its running statistics (buffers of shape
    ``(C,)``), the weight of a batch's statistics in their update, and the ranks it takes."""

    running_mean: Any
    running_var: Any
    momentum: float
    ranks: tuple[int, ...]


def batch_norm(x: AnyArray, gamma: AnyArray, beta: AnyArray, *, eps: float = 1e-5) -> ArrayLayer:
    """``(x - mean) / sqrt(var + eps) * gamma + beta``, the mean and (biased) variance of ``x``
    taken per channel over every axis but axis 1 (the channels: ``x`` is ``(N, C, ...)``, NCHW),
    ``gamma`` and ``beta`` of shape ``(C,)``. The batch's statistics always: the modules
    :class:`~monadl.nn.BatchNorm1d` and :class:`~monadl.nn.BatchNorm2d` keep running ones."""
    for name, operand in (("x", x), ("gamma", gamma), ("beta", beta)):
        if is_float_kind(operand):
            raise TypeError(f"batch_norm: {name} must be an array, got {type(operand).__name__}")
    if isinstance(eps, bool) or not isinstance(eps, (int, float)):
        raise TypeError(f"batch_norm: eps must be a float, got {type(eps).__name__} {eps!r}")
    eps = float(eps)
    if not eps > 0.0:
        raise ValueError(f"batch_norm: eps must be positive, got {eps}")
    return apply_array(BATCH_NORM, x, gamma, beta, eps=eps, stats=None)


def _axes(x: Any) -> tuple[int, ...]:
    return (0, *range(2, len(x.shape)))


def _channel_shape(x: Any) -> tuple[int, ...]:
    """The shape that broadcasts a ``(C,)`` vector along axis 1 of ``x``."""
    return (1, x.shape[1], *([1] * (len(x.shape) - 2)))


def _forward(
    xp: Any, x: Any, gamma: Any, beta: Any, *, eps: float, stats: RunningStats | None, ctx: RunContext
) -> Any:
    """The output and what the vjps need: ``(x_hat, 1 / sqrt(var + eps), by the batch's stats)``."""
    shape = _channel_shape(x)
    if stats is None or ctx.training:
        n = 0 if stats is None else _values(x, stats)  # (before a mean of nothing is taken)
        axes = _axes(x)
        mean = xp.mean(x, axis=axes, keepdims=True)
        centred = x - mean
        var = xp.mean(centred * centred, axis=axes, keepdims=True)
        inv = 1.0 / xp.sqrt(var + eps)
        if stats is not None and n:  # (an empty batch has no statistics: the running ones stay)
            _stage(xp, ctx, stats, xp.reshape(mean, (-1,)), xp.reshape(var, (-1,)), n)
        x_hat = centred * inv
        batch = True
    else:
        mean = xp.reshape(_running(xp, stats.running_mean.data, x, stats), shape)
        var = xp.reshape(_running(xp, stats.running_var.data, x, stats), shape)
        inv = 1.0 / xp.sqrt(var + eps)
        x_hat = (x - mean) * inv
        batch = False
    return x_hat * xp.reshape(gamma, shape) + xp.reshape(beta, shape), (x_hat, inv, batch)


def _values(x: Any, stats: RunningStats) -> int:
    """The number of values per channel of a training batch, where its statistics update the
    running ones: none (an empty batch: the running statistics stay as they are, as PyTorch's) or
    2 at least (PyTorch's rule: one has no unbiased variance, and the running variance would shrink
    to 0)."""
    n: int = math.prod((x.shape[0], *x.shape[2:]))
    if n == 1:
        raise ShapeError(
            f"{stats!r}: expected more than 1 value per channel when training, got a batch of shape "
            f"{shape_of(x)}"
        )
    return n


def _running(xp: Any, data: Any, x: Any, stats: RunningStats) -> Any:
    """A running statistic, in ``x``'s dtype; an error naming the module if it lives elsewhere."""
    if namespace(data) is not xp:
        raise ValueError(
            f"{stats!r}: its running statistics are not arrays of the input's namespace; move the "
            "module with module.to(xp)"
        )
    return data if data.dtype == x.dtype else xp.astype(data, x.dtype)


Statistics = tuple[RunningStats, Any, Any, int]
"""A running-statistics update's batch statistics: the module, the batch's mean and biased variance
(each of shape ``(C,)``) and the number of values per channel they are taken over."""


@contextmanager
def recording_statistics() -> Iterator[list[Statistics]]:
    """Collects the batch statistics of every running-statistics update staged by the training
    steps the calling thread runs while the block runs (their runs' contexts record them), in the
    order staged (a module used twice in a step: twice)."""
    recorded: list[Statistics] = []
    token = RECORDED.set(recorded)
    try:
        yield recorded
    finally:
        RECORDED.reset(token)


def stage_statistics(stats: RunningStats, mean: Any, var: Any, n: int) -> None:
    """Stages the update of ``stats``' running statistics by a batch's mean and biased variance over
    ``n`` values per channel, as a training step's forward pass does (after any update the step
    staged before it), into the updates the calling thread is staging (``monadl.runtime.staging``)."""
    _stage(namespace(mean), RunContext(True, current_staging(), RECORDED.get()), stats, mean, var, n)


def _stage(xp: Any, ctx: RunContext, stats: RunningStats, mean: Any, var: Any, n: int) -> None:
    """Stages the running statistics' update in ``ctx``, PyTorch's: ``(1 - momentum) * running +
    momentum * batch``, the variance the batch's unbiased one (``var * n / (n - 1)``, ``n`` at
    least 2)."""
    ctx.record((stats, mean, var, n))
    m = float(stats.momentum)
    unbiased = var * (n / (n - 1))
    ctx.update(stats.running_mean, partial(_moved, xp, stats, m, mean))
    ctx.update(stats.running_var, partial(_moved, xp, stats, m, unbiased))


def _moved(xp: Any, stats: RunningStats, m: float, batch: Any, old: Any) -> Any:
    """A running statistic ``old`` moved towards the batch's: in ``old``'s dtype."""
    new = (1.0 - m) * _running(xp, old, batch, stats) + m * batch
    return new if new.dtype == old.dtype else xp.astype(new, old.dtype)


def _vjp_x(xp: Any, d: Any, saved: Any, x: Any, gamma: Any, beta: Any, **_: Any) -> Any:
    x_hat, inv, batch = saved
    g = d * xp.reshape(gamma, _channel_shape(x))
    if not batch:
        return g * inv
    axes = _axes(x)
    return inv * (
        g - xp.mean(g, axis=axes, keepdims=True) - x_hat * xp.mean(g * x_hat, axis=axes, keepdims=True)
    )


def _vjp_gamma(xp: Any, d: Any, saved: Any, x: Any, gamma: Any, beta: Any, **_: Any) -> Any:
    return xp.sum(d * saved[0], axis=_axes(x))


def _vjp_beta(xp: Any, d: Any, saved: Any, x: Any, gamma: Any, beta: Any, **_: Any) -> Any:
    return xp.sum(d, axis=_axes(x))


def _check(x: Any, gamma: Any, beta: Any, *, eps: float, stats: RunningStats | None) -> None:
    ranks = (2, 3, 4, 5) if stats is None else stats.ranks
    name = "batch_norm" if stats is None else repr(stats)
    if type(x) is float or len(x.shape) not in ranks:
        raise ShapeError(
            f"{name}: expected an input of {' or '.join(map(str, ranks))} dimensions (N, C, ...), "
            f"got {shape_of(x)}"
        )
    channels = x.shape[1]
    for what, v in (("gamma", gamma), ("beta", beta)):
        if type(v) is float or tuple(v.shape) != (channels,):
            raise ShapeError(
                f"{name}: {what} must have shape ({channels},) for input {shape_of(x)}, got {shape_of(v)}"
            )
    if stats is not None and tuple(stats.running_mean.data.shape) != (channels,):
        raise ShapeError(
            f"{name}: {channels} channels in input {shape_of(x)}, running statistics of "
            f"{tuple(stats.running_mean.data.shape)}"
        )


def _cost(x: Any, gamma: Any, beta: Any, *, eps: float, stats: RunningStats | None) -> float:
    """About four passes over the input (the mean, the variance, the normalised values, the output)."""
    return 4.0 * elementwise_cost(x)


BATCH_NORM = declare(
    "batch_norm",
    _forward,
    (_vjp_x, _vjp_gamma, _vjp_beta),
    saves=True,
    cost=_cost,
    check=_check,
    fresh=False,
    shape_rule=same,
    context=True,
)
"""Batch normalisation: inputs ``x``, ``gamma``, ``beta``; parameters ``eps`` and ``stats`` (None,
or the module whose running statistics it uses, kept by identity). No batching rule: calls never
merge (see the module)."""
