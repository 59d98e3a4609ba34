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
from typing import Any

import numpy as np

from monadl.do.primitive import Batching, Primitive
from monadl.dsl.arguments import array_operand
from monadl.dsl.layers import AnyArray, ArrayLayer, apply_array
from monadl.typeclasses.backend import NUMPY, ShapeError, shape_of

__all__ = ["layer_norm"]


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


LAYER_NORM = Primitive(
    "layer_norm",
    _plain_forward,
    (_vjp_x,),
    saves=True,
    check=_check,
    batch=Batching(),
    fresh=True,
    own=True,
)
"""Layer norm without an affine transform: ``x``'s rows normalised."""

LAYER_NORM_AFFINE = Primitive(
    "layer_norm",
    _forward,
    (_vjp_x, _vjp_weight, _vjp_bias),
    saves=True,
    check=_check,
    # the rows stacked, the weight and the bias shared: their deltas summed once per group
    batch=Batching(shared=(1, 2)),
    fresh=True,
    own=True,
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
