"""Layer normalisation as one fused op: :func:`layer_norm`.

``layer_norm(x, weight, bias)`` normalises each vector along ``x``'s last axis to mean 0 and
variance 1, then scales and shifts it: ``(x - mean) / sqrt(var + eps) * weight + bias``. One
primitive with a hand-written vjp: its forward saves the normalised ``x`` and the reciprocal
standard deviations, so the backward is a few passes over the delta, not the tape of a dozen
elementwise ops. Under dynamic batching the calls' ``x`` are stacked and ``weight`` and ``bias``
shared (one delta per group).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from monadl.do.primitive import Batching
from monadl.dsl.core.arguments import array_operand, int_param, int_sequence
from monadl.dsl.core.layers import AnyArray, ArrayLayer, apply_array
from monadl.dsl.ops.registry import declare
from monadl.dsl.ops.shape_rules import Info, same
from monadl.typeclasses.backend import NUMPY, ShapeError, shape_of

__all__ = ["group_norm", "layer_norm", "rms_norm"]


def _forward(xp: Any, x: Any, weight: Any, bias: Any, eps: float) -> tuple[Any, tuple[Any, Any]]:
    """The normalised ``x`` scaled and shifted, and what the vjps need: ``(xhat, rstd)``."""
    if x.shape[-1] == 0:  # no features: an empty result, as PyTorch's (no mean to take)
        xhat = x * 1.0
        rstd = xp.ones_like(xp.sum(x, axis=-1, keepdims=True))
        return (xhat if weight is None else xhat * weight + bias), (xhat, rstd)
    if xp is NUMPY:
        return _numpy_forward(x, weight, bias, eps)
    centred = x - xp.mean(x, axis=-1, keepdims=True)
    rstd = 1.0 / xp.sqrt(xp.mean(centred * centred, axis=-1, keepdims=True) + eps)
    xhat = centred * rstd
    if weight is None:
        return xhat, (xhat, rstd)
    return xhat * weight + bias, (xhat, rstd)


def _numpy_forward(x: Any, weight: Any, bias: Any, eps: float) -> tuple[Any, tuple[Any, Any]]:
    """:func:`_forward`'s arithmetic by NumPy's ufuncs, in place on the op's own arrays (``np.mean``
    is a Python wrapper of a few microseconds, on every row of a batch's forward). Rows of no
    features give rows of none (PyTorch's): the factor 1 / n is any number there."""
    inverse_n = 1.0 / max(x.shape[-1], 1)
    centred = x - np.add.reduce(x, axis=-1, keepdims=True) * inverse_n
    var = np.add.reduce(centred * centred, axis=-1, keepdims=True)
    var *= inverse_n
    var += eps
    rstd = np.sqrt(var, out=var)
    np.reciprocal(rstd, out=rstd)
    xhat = centred
    xhat *= rstd
    if weight is None:
        return xhat, (xhat, rstd)
    y = xhat * weight
    y += bias
    return y, (xhat, rstd)


def _rows_sum(xp: Any, g: Any) -> Any:
    """``g`` summed over every axis but the last (the rows counted: an empty ``g`` has any number)."""
    n = g.shape[-1]
    return xp.sum(xp.reshape(g, (math.prod(g.shape[:-1]), n)), axis=0)


def _vjp_x(xp: Any, d: Any, saved: tuple[Any, Any], x: Any, *affine: Any, eps: float) -> Any:
    """``rstd * (g - mean(g) - xhat * mean(g * xhat))`` with ``g = d * weight``: the delta of
    ``xhat`` projected off the two directions the normalisation removes (the mean, the scale)."""
    xhat, rstd = saved
    g = d if not affine else d * affine[0]
    if x.shape[-1] == 0:
        return g * 1.0  # an empty delta
    if xp is NUMPY:  # the same arithmetic by the ufuncs, in place on arrays of its own
        inverse_n = 1.0 / max(x.shape[-1], 1)  # (no features: empty rows, as the forward's)
        out = g - np.add.reduce(g, axis=-1, keepdims=True) * inverse_n
        out -= xhat * (np.add.reduce(g * xhat, axis=-1, keepdims=True) * inverse_n)
        out *= rstd
        return out
    return rstd * (g - xp.mean(g, axis=-1, keepdims=True) - xhat * xp.mean(g * xhat, axis=-1, keepdims=True))


def _vjp_weight(xp: Any, d: Any, saved: tuple[Any, Any], x: Any, weight: Any, bias: Any, eps: float) -> Any:
    g = d * saved[0]
    return float(xp.sum(g)) if type(weight) is float else _rows_sum(xp, g)


def _vjp_bias(xp: Any, d: Any, saved: tuple[Any, Any], x: Any, weight: Any, bias: Any, eps: float) -> Any:
    return float(xp.sum(d)) if type(bias) is float else _rows_sum(xp, d)


def _check(x: Any, *affine: Any, eps: float) -> None:
    if type(x) is float or x.ndim == 0:
        raise ShapeError(f"layer_norm: x must have a feature axis, got shape {shape_of(x)}")
    n = x.shape[-1]
    for name, p in zip(("weight", "bias"), affine, strict=False):
        if type(p) is not float and tuple(p.shape) != (n,):
            raise ShapeError(
                f"layer_norm: {name} of shape {shape_of(p)} does not fit x of shape {shape_of(x)} "
                f"(expected ({n},))"
            )


def _plain_forward(xp: Any, x: Any, eps: float) -> tuple[Any, tuple[Any, Any]]:
    return _forward(xp, x, None, None, eps)


LAYER_NORM = declare(
    "layer_norm",
    _plain_forward,
    (_vjp_x,),
    saves=True,
    check=_check,
    batch=Batching(),
    shape_rule=same,
)
"""Layer norm without an affine transform: ``x``'s rows normalised."""

LAYER_NORM_AFFINE = declare(
    "layer_norm",
    _forward,
    (_vjp_x, _vjp_weight, _vjp_bias),
    saves=True,
    check=_check,
    # the rows stacked, the weight and the bias shared: their deltas summed once per group
    batch=Batching(shared=(1, 2)),
    shape_rule=same,
)
"""Layer norm scaled by ``weight`` and shifted by ``bias`` (a Python float where one is absent)."""


def layer_norm(
    x: AnyArray, weight: AnyArray | None = None, bias: AnyArray | None = None, *, eps: float = 1e-5
) -> ArrayLayer:
    """``(x - mean) / sqrt(var + eps) * weight + bias`` over ``x``'s last axis (the features), as
    PyTorch's ``layer_norm(x, (n,), weight, bias, eps)``: ``x`` of shape (..., n), ``weight`` and
    ``bias`` of shape (n,) or None (no scale, no shift). The variance is the biased one (divided by
    n). The result has ``x``'s shape and dtype; ``x`` of no features (n = 0) gives an empty result
    and empty deltas, as PyTorch's."""
    array_operand("layer_norm", x, "x")
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps > 0.0:
        raise ValueError(f"layer_norm: eps must be a positive float, got {eps!r}")
    if weight is None and bias is None:
        return apply_array(LAYER_NORM, x, eps=float(eps))
    if weight is not None:
        array_operand("layer_norm", weight, "weight")
    if bias is not None:
        array_operand("layer_norm", bias, "bias")
    return apply_array(
        LAYER_NORM_AFFINE, x, 1.0 if weight is None else weight, 0.0 if bias is None else bias, eps=float(eps)
    )


# ----------------------------------------------------------------------------------- group norm


def _channel_axis(ndim: int, axis: int) -> int:
    return axis + ndim if axis < 0 else axis


def _groups_view(xp: Any, x: Any, groups: int, axis: int) -> Any:
    """``x`` (..., C, *rest), its channels on ``axis``, as (lead, groups, C // groups * rest)."""
    a = _channel_axis(x.ndim, axis)
    lead = math.prod(x.shape[:a])
    return xp.reshape(x, (lead, groups, math.prod(x.shape[a:]) // groups))


def _per_channel(xp: Any, p: Any, ndim: int, axis: int) -> Any:
    """A per-channel vector ``p`` (C,) shaped to broadcast along channel ``axis`` of ``ndim`` axes."""
    a = _channel_axis(ndim, axis)
    return xp.reshape(p, (p.shape[0], *(1,) * (ndim - a - 1)))


def _group_forward(
    xp: Any, x: Any, weight: Any, bias: Any, groups: int, eps: float, axis: int
) -> tuple[Any, tuple[Any, Any]]:
    """The normalised ``x``, scaled and shifted per channel, and ``(xhat, rstd)`` in the groups'
    view (lead, groups, n) for the vjps."""
    xg = _groups_view(xp, x, groups, axis)
    if xg.shape[-1] == 0 or xg.shape[0] == 0:  # no elements in a group, or no groups at all
        xhat, rstd = xg * 1.0, xp.ones_like(xp.sum(xg, axis=-1, keepdims=True))
    else:
        centred = xg - xp.mean(xg, axis=-1, keepdims=True)
        rstd = 1.0 / xp.sqrt(xp.mean(centred * centred, axis=-1, keepdims=True) + eps)
        xhat = centred * rstd
    y = xp.reshape(xhat, tuple(x.shape))
    if weight is None:
        return y, (xhat, rstd)
    scale = weight if type(weight) is float else _per_channel(xp, weight, x.ndim, axis)
    shift = bias if type(bias) is float else _per_channel(xp, bias, x.ndim, axis)
    return y * scale + shift, (xhat, rstd)


def _group_plain_forward(xp: Any, x: Any, groups: int, eps: float, axis: int) -> tuple[Any, tuple[Any, Any]]:
    return _group_forward(xp, x, None, None, groups, eps, axis)


def _group_vjp_x(
    xp: Any, d: Any, saved: tuple[Any, Any], x: Any, *affine: Any, groups: int, eps: float, axis: int
) -> Any:
    """:func:`_vjp_x`'s projection, in the groups' view: the delta of ``xhat`` with its mean and
    its component along ``xhat`` removed, times ``rstd``."""
    xhat, rstd = saved
    if affine and type(affine[0]) is not float:
        g = d * _per_channel(xp, affine[0], x.ndim, axis)
    else:
        g = d if not affine else d * affine[0]
    gg = xp.reshape(g, tuple(xhat.shape))
    if xhat.shape[-1] == 0 or xhat.shape[0] == 0:
        return xp.reshape(gg * 1.0, tuple(x.shape))
    out = rstd * (
        gg - xp.mean(gg, axis=-1, keepdims=True) - xhat * xp.mean(gg * xhat, axis=-1, keepdims=True)
    )
    return xp.reshape(out, tuple(x.shape))


def _channel_sums(xp: Any, g: Any, axis: int) -> Any:
    """``g`` summed over every axis but the channel ``axis``: (C,)."""
    a = _channel_axis(g.ndim, axis)
    c = g.shape[a]
    return xp.sum(xp.reshape(g, (math.prod(g.shape[:a]), c, math.prod(g.shape[a + 1 :]))), axis=(0, 2))


def _group_vjp_weight(
    xp: Any,
    d: Any,
    saved: tuple[Any, Any],
    x: Any,
    weight: Any,
    bias: Any,
    groups: int,
    eps: float,
    axis: int,
) -> Any:
    g = d * xp.reshape(saved[0], tuple(x.shape))
    return float(xp.sum(g)) if type(weight) is float else _channel_sums(xp, g, axis)


def _group_vjp_bias(
    xp: Any,
    d: Any,
    saved: tuple[Any, Any],
    x: Any,
    weight: Any,
    bias: Any,
    groups: int,
    eps: float,
    axis: int,
) -> Any:
    return float(xp.sum(d)) if type(bias) is float else _channel_sums(xp, d, axis)


def _group_check(x: Any, *affine: Any, groups: int, eps: float, axis: int) -> None:
    if type(x) is float or not -x.ndim <= axis < x.ndim:
        raise ShapeError(f"group_norm: channel axis {axis} is not an axis of x of shape {shape_of(x)}")
    c = x.shape[axis]
    if c % groups:
        raise ShapeError(
            f"group_norm: {groups} groups do not divide the {c} channels (axis {axis}) of x of shape "
            f"{tuple(x.shape)}"
        )
    for name, p in zip(("weight", "bias"), affine, strict=False):
        if type(p) is not float and tuple(p.shape) != (c,):
            raise ShapeError(
                f"group_norm: {name} of shape {shape_of(p)} does not fit the {c} channels of x of shape "
                f"{tuple(x.shape)} (expected ({c},))"
            )


def _same_info(x: Info, *_: Any, **__: Any) -> Info:
    return x


GROUP_NORM = declare(
    "group_norm",
    _group_plain_forward,
    (_group_vjp_x,),
    saves=True,
    check=_group_check,
    batch=Batching(axis=True),  # the rows stacked, the channel axis shifted past them
    shape_rule=_same_info,
)
"""Group norm without an affine transform."""

GROUP_NORM_AFFINE = declare(
    "group_norm",
    _group_forward,
    (_group_vjp_x, _group_vjp_weight, _group_vjp_bias),
    saves=True,
    check=_group_check,
    batch=Batching(shared=(1, 2), axis=True),
    shape_rule=_same_info,
)
"""Group norm scaled by ``weight`` and shifted by ``bias`` per channel (a float where one is absent)."""


def group_norm(
    x: AnyArray,
    groups: int,
    weight: AnyArray | None = None,
    bias: AnyArray | None = None,
    *,
    eps: float = 1e-5,
    axis: int = 1,
) -> ArrayLayer:
    """Group normalisation, as PyTorch's ``group_norm(x, groups, weight, bias, eps)``: the channels
    (axis ``axis`` of ``x``, PyTorch's 1 of (N, C, *)) split into ``groups`` groups of C // groups
    consecutive channels, and each group's elements (its channels and every axis after them)
    normalised to mean 0 and variance 1 (the biased one) for each index of the axes before; then
    ``* weight + bias`` per channel (shape (C,), or None). For one example without a batch axis
    (per-example code under dynamic batching), give the channel axis from the end: ``axis=-3`` for
    (C, H, W) as for (N, C, H, W)."""
    op = "group_norm"
    array_operand(op, x, "x")
    g = int_param(op, "groups", groups)
    if g < 1:
        raise ValueError(f"{op}: groups must be at least 1, got {g}")
    params = {"groups": g, "eps": _eps(op, eps), "axis": int_param(op, "axis", axis)}
    if weight is None and bias is None:
        return apply_array(GROUP_NORM, x, **params)
    if weight is not None:
        array_operand(op, weight, "weight")
    if bias is not None:
        array_operand(op, bias, "bias")
    return apply_array(
        GROUP_NORM_AFFINE, x, 1.0 if weight is None else weight, 0.0 if bias is None else bias, **params
    )


def _eps(op: str, eps: object) -> float:
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps > 0.0:
        raise ValueError(f"{op}: eps must be a positive float, got {eps!r}")
    return float(eps)


# ------------------------------------------------------------------------------------- RMS norm


def _rms_rows(xp: Any, x: Any, features: int) -> Any:
    """``x`` as (rows, features): its last axes, the normalised ones, flattened."""
    n = math.prod(x.shape[x.ndim - features :])
    return xp.reshape(x, (math.prod(x.shape[: x.ndim - features]), n))


def _rms_forward(
    xp: Any, x: Any, weight: Any, shape: tuple[int, ...], eps: float | None
) -> tuple[Any, tuple[Any, Any]]:
    """``x / sqrt(mean(x ** 2) + eps) * weight`` over the last ``features`` axes, and ``(xhat,
    rstd)`` as rows for the vjps."""
    rows = _rms_rows(xp, x, len(shape))
    if rows.shape[-1] == 0 or rows.shape[0] == 0:
        xhat, rstd = rows * 1.0, xp.ones_like(xp.sum(rows, axis=-1, keepdims=True))
    else:
        e = float(xp.finfo(x.dtype).eps) if eps is None else eps
        rstd = 1.0 / xp.sqrt(xp.mean(rows * rows, axis=-1, keepdims=True) + e)
        xhat = rows * rstd
    y = xp.reshape(xhat, tuple(x.shape))
    return (y if weight is None else y * weight), (xhat, rstd)


def _rms_plain_forward(
    xp: Any, x: Any, shape: tuple[int, ...], eps: float | None
) -> tuple[Any, tuple[Any, Any]]:
    return _rms_forward(xp, x, None, shape, eps)


def _rms_vjp_x(
    xp: Any, d: Any, saved: tuple[Any, Any], x: Any, *affine: Any, shape: tuple[int, ...], eps: float | None
) -> Any:
    """``rstd * (g - xhat * mean(g * xhat))`` with ``g = d * weight``: the delta of ``xhat`` with
    its component along ``xhat`` removed (the scale the normalisation takes out)."""
    xhat, rstd = saved
    g = _rms_rows(xp, d if not affine else d * affine[0], len(shape))
    if xhat.shape[-1] == 0 or xhat.shape[0] == 0:
        return xp.reshape(g * 1.0, tuple(x.shape))
    out = rstd * (g - xhat * xp.mean(g * xhat, axis=-1, keepdims=True))
    return xp.reshape(out, tuple(x.shape))


def _rms_vjp_weight(
    xp: Any, d: Any, saved: tuple[Any, Any], x: Any, weight: Any, shape: tuple[int, ...], eps: float | None
) -> Any:
    g = _rms_rows(xp, d, len(shape)) * saved[0]
    return xp.reshape(xp.sum(g, axis=0), tuple(weight.shape))


def _rms_check(x: Any, *affine: Any, shape: tuple[int, ...], eps: float | None) -> None:
    k = len(shape)
    if type(x) is float or x.ndim < k or tuple(x.shape[x.ndim - k :]) != shape:
        raise ShapeError(f"rms_norm: x of shape {shape_of(x)} does not end in the normalized shape {shape}")
    if affine and (type(affine[0]) is float or tuple(affine[0].shape) != shape):
        raise ShapeError(
            f"rms_norm: weight of shape {shape_of(affine[0])} does not fit the normalized shape {shape}"
        )


RMS_NORM = declare(
    "rms_norm",
    _rms_plain_forward,
    (_rms_vjp_x,),
    saves=True,
    check=_rms_check,
    batch=Batching(),
    shape_rule=_same_info,
)
"""RMS norm without a weight: ``x``'s last axes (of ``shape``) normalised."""

RMS_NORM_AFFINE = declare(
    "rms_norm",
    _rms_forward,
    (_rms_vjp_x, _rms_vjp_weight),
    saves=True,
    check=_rms_check,
    batch=Batching(shared=(1,)),  # the rows stacked, the weight shared: its delta summed once
    shape_rule=_same_info,
)
"""RMS norm scaled by ``weight`` (the shape of the normalised axes)."""


def rms_norm(
    x: AnyArray,
    normalized_shape: int | Sequence[int],
    weight: AnyArray | None = None,
    *,
    eps: float | None = None,
) -> ArrayLayer:
    """Root-mean-square normalisation, as PyTorch's ``rms_norm(x, normalized_shape, weight, eps)``:
    ``x / sqrt(mean(x ** 2) + eps) * weight``, the mean over the last axes of ``x`` (those of
    ``normalized_shape``: an int, one axis, or a shape), no centring and no shift. ``weight`` has
    the shape ``normalized_shape`` (or None: no scale). ``eps`` defaults, as PyTorch's, to the
    machine epsilon of ``x``'s dtype (``finfo(dtype).eps``)."""
    op = "rms_norm"
    array_operand(op, x, "x")
    shape = (
        (int_param(op, "normalized_shape", normalized_shape),)
        if not isinstance(normalized_shape, Sequence)
        else int_sequence(op, "normalized_shape", normalized_shape)
    )
    if not shape or any(n < 0 for n in shape):
        raise ValueError(
            f"{op}: normalized_shape must be one size or more, none negative, got {normalized_shape!r}"
        )
    params: dict[str, Any] = {"shape": shape, "eps": None if eps is None else _eps(op, eps)}
    if weight is None:
        return apply_array(RMS_NORM, x, **params)
    array_operand(op, weight, "weight")
    return apply_array(RMS_NORM_AFFINE, x, weight, **params)
