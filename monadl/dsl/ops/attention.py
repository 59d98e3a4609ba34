"""Scaled dot-product attention as one fused op: :func:`scaled_dot_product_attention`.

``softmax(q @ k.T * scale + mask) @ v`` over the last two axes (queries, keys), with any leading
axes (batch, heads) broadcast as ``matmul`` broadcasts them. One primitive with a hand-written vjp:
its forward saves the attention weights ``p``, and the backward is four matrix products (the
score's delta ``p * (dp - sum(dp * p))``, computed once for ``q`` and ``k``): one node of the
graph where the same function composed of ``matmul``, ``softmax`` and arithmetic would be five.

Layout: ``q`` of shape (..., Lq, heads * d), ``k`` (..., Lk, heads * d), ``v`` (..., Lk, heads *
dv), the result (..., Lq, heads * dv). With ``heads`` > 1 the last axis holds the heads side by side
(as a fused projection gives them) and each head attends on its own, so a multi-head layer needs no
reshapes or transposes of its own.

Masks: ``mask`` is a boolean array, True where a query may attend to a key ("keep"), or a
floating-point array added to the scores (0 to keep, ``-inf`` or a large negative number to drop,
or any bias). It broadcasts against the scores' shape (..., Lq, Lk), the same for every head.
``causal=True`` keeps key j for query i only where ``j <= i`` (PyTorch's ``is_causal``: aligned at
the first query and key). A query that keeps no key (every score ``-inf``) gives 0, and its row
passes no delta to ``q``, ``k`` or ``v``, as PyTorch's ``scaled_dot_product_attention`` does (the
softmax of such a row would be ``0 / 0``). The mask is data: no delta flows into it, and calls
with different masks of one shape merge under dynamic batching (the masks stacked with the rows).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from monadl.do.primitive import Batching
from monadl.dsl.core.arguments import array_operand, flag_param, int_param
from monadl.dsl.core.layers import AnyArray, ArrayLayer, apply_array
from monadl.dsl.ops.registry import declare
from monadl.dsl.ops.shape_rules import Info, broadcast, promoted
from monadl.typeclasses.backend import (
    NUMPY,
    AnyNDArray,
    ShapeError,
    host_in,
    is_array,
    namespace,
    on_device,
    shape_of,
)

__all__ = ["scaled_dot_product_attention"]


# ------------------------------------------------------------------------------------ the heads


def _split_heads(xp: Any, x: Any, heads: int) -> Any:
    """(..., L, heads * d) as (..., heads, L, d) (a view where the namespace gives one)."""
    if heads == 1:
        return x
    *lead, length, width = x.shape
    r = len(lead)
    x = xp.reshape(x, (*lead, length, heads, width // heads))
    return xp.permute_dims(x, (*range(r), r + 1, r, r + 2))


def _merge_heads(xp: Any, x: Any, heads: int) -> Any:
    """(..., heads, L, d) as (..., L, heads * d): :func:`_split_heads` undone."""
    if heads == 1:
        return x
    *lead, h, length, width = x.shape
    r = len(lead)
    x = xp.permute_dims(x, (*range(r), r + 1, r, r + 2))
    return xp.reshape(x, (*lead, length, h * width))


# -------------------------------------------------------------------------------------- masking

_CAUSAL: dict[tuple[int, int, Any], Any] = {}
"""NumPy's additive causal masks (0 kept, -inf dropped) by (Lq, Lk, dtype): made once per shape."""


def _causal_bias(lq: int, lk: int, dtype: Any) -> Any:
    key = (lq, lk, dtype)
    bias = _CAUSAL.get(key)
    if bias is None:
        if len(_CAUSAL) > 64:  # a few shapes per model: a bound, not an eviction policy
            _CAUSAL.clear()
        bias = np.zeros((lq, lk), dtype=dtype)
        bias[np.triu_indices(lq, 1, lk)] = -np.inf
        bias.setflags(write=False)
        _CAUSAL[key] = bias
    return bias


def _masked(xp: Any, s: Any, mask: Any, causal: bool, heads: int) -> Any:
    """The scores ``s`` (..., [heads,] Lq, Lk) with the causal mask and ``mask`` applied."""
    lq, lk = s.shape[-2], s.shape[-1]
    if causal:
        if xp is NUMPY:
            s += _causal_bias(lq, lk, s.dtype)
        else:
            on = on_device(xp, s)
            keep = xp.reshape(xp.arange(lq, **on), (lq, 1)) >= xp.reshape(xp.arange(lk, **on), (1, lk))
            s = xp.where(keep, s, xp.asarray(-math.inf, dtype=s.dtype, **on))
    if mask is not None:
        mask = host_in(xp, mask, s)
        if heads > 1 and mask.ndim >= 2:  # the same for every head
            mask = xp.expand_dims(mask, axis=-3)
        if mask.dtype == xp.bool:
            s = xp.where(mask, s, xp.asarray(-math.inf, dtype=s.dtype, **on_device(xp, s)))
        else:
            s = s + xp.astype(mask, s.dtype)
    return s


def _softmax_last(xp: Any, s: Any) -> Any:
    """Softmax along the last axis (in place on NumPy: ``s`` is the op's own array). A row of
    ``-inf`` only (a query that keeps no key) gives weights of 0, not ``0 / 0``: its result is 0
    and no delta flows through it. No keys at all give no weights (and a result of 0)."""
    if s.shape[-1] == 0:
        return s
    if xp is NUMPY:
        top = np.maximum.reduce(s, axis=-1, keepdims=True)
        dropped = top == -np.inf
        masked = bool(dropped.any())  # (the maxima are one per query: a small array)
        if masked:
            top[dropped] = 0.0  # exp(-inf - 0) is 0 for every key of such a row
        s -= top
        np.exp(s, out=s)
        total = np.add.reduce(s, axis=-1, keepdims=True)
        if masked:
            total[dropped] = 1.0  # 0 / 1: the row's weights stay 0
        s /= total
        return s
    top = xp.max(s, axis=-1, keepdims=True)
    dropped = top == -math.inf
    e = xp.exp(s - xp.where(dropped, xp.zeros_like(top), top))
    total = xp.sum(e, axis=-1, keepdims=True)
    return e / xp.where(dropped, xp.ones_like(total), total)


# ------------------------------------------------------------------------------ forward and vjps


def _forward(
    xp: Any, q: Any, k: Any, v: Any, scale: float | None, causal: bool, heads: int, mask: Any = None
) -> tuple[Any, list[Any]]:
    """The attention's result, and what the vjps need: ``[p, q, k, v, scale, ds]`` (heads split;
    ``ds``, the scores' delta, filled by the first vjp that needs it, for the other)."""
    qh, kh, vh = _split_heads(xp, q, heads), _split_heads(xp, k, heads), _split_heads(xp, v, heads)
    d = qh.shape[-1]
    c = (d**-0.5 if d else 1.0) if scale is None else scale  # (no features: every score is 0)
    s = xp.matmul(qh * c, xp.matrix_transpose(kh))
    # No keys: no weights, and a result of zeros (PyTorch's), where a softmax would take the
    # maximum of nothing.
    p = s if s.shape[-1] == 0 else _softmax_last(xp, _masked(xp, s, mask, causal, heads))
    out = _merge_heads(xp, xp.matmul(p, vh), heads)
    return out, [p, qh, kh, vh, c, None]


def _stacked_forward(
    xp: Any, q: Any, k: Any, v: Any, scale: float | None, causal: bool, heads: int, mask: Any = None
) -> tuple[Any, list[Any]]:
    """Merged calls' forward: ``mask`` (the calls' masks stacked, (n, *m)) padded to broadcast
    against the stacked scores as each call's did, then :func:`_forward`."""
    if mask is not None:
        rank = q.ndim - 1  # one call's scores' rank: (..., Lq, Lk)
        m = host_in(xp, mask, q)
        mask = xp.reshape(m, (m.shape[0], *(1,) * (rank - m.ndim + 1), *m.shape[1:]))
    return _forward(xp, q, k, v, scale, causal, heads, mask)


def _score_delta(xp: Any, d: Any, saved: list[Any], heads: int) -> Any:
    """The scores' delta ``p * (dp - sum(dp * p))``, ``dp = d @ v.T``: computed by the first of
    ``q``'s and ``k``'s vjps, kept for the other (for this ``d``)."""
    cached = saved[5]
    if cached is not None and cached[0] is d:
        return cached[1]
    p, vh = saved[0], saved[3]
    dp = xp.matmul(_split_heads(xp, d, heads), xp.matrix_transpose(vh))
    ds = p * (dp - xp.sum(dp * p, axis=-1, keepdims=True))
    saved[5] = (d, ds)  # one assignment: a vjp on another thread sees the pair or nothing
    return ds


def _vjp_q(xp: Any, d: Any, saved: list[Any], *inputs: Any, heads: int, **_: Any) -> Any:
    ds = _score_delta(xp, d, saved, heads)
    return _merge_heads(xp, xp.matmul(ds, saved[2]) * saved[4], heads)


def _vjp_k(xp: Any, d: Any, saved: list[Any], *inputs: Any, heads: int, **_: Any) -> Any:
    ds = _score_delta(xp, d, saved, heads)
    return _merge_heads(xp, xp.matmul(xp.matrix_transpose(ds), saved[1]) * saved[4], heads)


def _vjp_v(xp: Any, d: Any, saved: list[Any], *inputs: Any, heads: int, **_: Any) -> Any:
    p = saved[0]
    return _merge_heads(xp, xp.matmul(xp.matrix_transpose(p), _split_heads(xp, d, heads)), heads)


# ---------------------------------------------------------------------------------------- checks


def _broadcastable(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    return all(x == y or x == 1 or y == 1 for x, y in zip(reversed(a), reversed(b), strict=False))


def _broadcast(shapes: tuple[tuple[int, ...], ...]) -> tuple[int, ...] | None:
    """The shape ``shapes`` broadcast to (NumPy's rule), or None where they do not broadcast."""
    rank = max(len(s) for s in shapes)
    out = []
    for a in range(rank):
        sides = {s[a - rank + len(s)] for s in shapes if a - rank + len(s) >= 0} - {1}
        if len(sides) > 1:
            return None
        out.append(sides.pop() if sides else 1)
    return tuple(out)


def _check(q: Any, k: Any, v: Any, scale: float | None, causal: bool, heads: int, mask: Any = None) -> None:
    name = "scaled_dot_product_attention"
    if any(type(x) is float or x.ndim < 2 for x in (q, k, v)):
        raise ShapeError(
            f"{name}: q, k and v must be arrays of 2 dimensions at least (..., length, features), "
            f"got {shape_of(q)}, {shape_of(k)} and {shape_of(v)}"
        )
    shapes = f"q {shape_of(q)}, k {shape_of(k)}, v {shape_of(v)}"
    if q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2]:
        raise ShapeError(f"{name}: {shapes} do not fit (q and k need one feature size, k and v one length)")
    if q.shape[-1] % heads or v.shape[-1] % heads:
        raise ShapeError(f"{name}: {heads} heads do not divide the features of {shapes}")
    lead = _broadcast((tuple(q.shape[:-2]), tuple(k.shape[:-2]), tuple(v.shape[:-2])))
    if lead is None:
        raise ShapeError(f"{name}: the leading axes of {shapes} do not broadcast")
    if mask is not None:  # to the result's leading axes (q's, k's or v's may broaden them): it may
        # not change the scores' shape
        scores = (*lead, q.shape[-2], k.shape[-2])
        sides = zip(reversed(mask.shape), reversed(scores), strict=False)
        if mask.ndim > len(scores) or any(m not in (1, n) for m, n in sides):
            raise ShapeError(
                f"{name}: mask of shape {tuple(mask.shape)} does not broadcast to the scores' "
                f"shape {scores} ({shapes})"
            )


def _same_rank(q: int, k: int, v: int) -> bool:
    """Stacked rows of calls whose operands differ in rank would no longer broadcast as they did
    (given the ranks of the operands)."""
    return q == k == v


def _cost(q: Any, k: Any, v: Any, **_: Any) -> float:
    return float(math.prod(q.shape[:-1]) * k.shape[-2] * (q.shape[-1] + v.shape[-1]))


def _attention_rule(q: Info, k: Info, v: Info, *_: Any, **__: Any) -> Info:
    """(..., Lq, d), (..., Lk, d), (..., Lk, dv) -> (..., Lq, dv), the leading axes broadcast (a
    mask, if any, gets no say)."""
    lead = broadcast(q[0][:-2], k[0][:-2], v[0][:-2])
    return (*lead, q[0][-2], v[0][-1]), *promoted(q, k, v)


ATTENTION = declare(
    "scaled_dot_product_attention",
    _forward,
    (_vjp_q, _vjp_k, _vjp_v),
    broadcasts=True,
    saves=True,
    cost=_cost,
    check=_check,
    batch=Batching(
        mergeable=_same_rank,
        row_params=("mask",),
        forward=_stacked_forward,
        vjps=(_vjp_q, _vjp_k, _vjp_v),
    ),
    per_run=("mask",),
    shape_rule=_attention_rule,
)
"""Attention (``causal`` is a static parameter). ``mask`` is data, None or an array: a per-run
parameter, whose kind (None, or the array's type, shape and dtype) is part of a call's structure,
so calls without a mask merge only with each other, and masked ones with their masks stacked."""


def _thirds(qkv: Any) -> tuple[Any, Any, Any]:
    """``q``, ``k`` and ``v`` side by side in ``qkv``'s last axis, as views."""
    e = qkv.shape[-1] // 3
    return qkv[..., :e], qkv[..., e : 2 * e], qkv[..., 2 * e :]


def _packed_forward(
    xp: Any, qkv: Any, scale: float | None, causal: bool, heads: int, mask: Any = None
) -> tuple[Any, list[Any]]:
    return _forward(xp, *_thirds(qkv), scale, causal, heads, mask)


def _packed_stacked_forward(
    xp: Any, qkv: Any, scale: float | None, causal: bool, heads: int, mask: Any = None
) -> tuple[Any, list[Any]]:
    return _stacked_forward(xp, *_thirds(qkv), scale, causal, heads, mask)


def _packed_vjp(xp: Any, d: Any, saved: list[Any], qkv: Any, *, heads: int, **_: Any) -> Any:
    """The three deltas side by side: one array, where three slices of ``qkv`` would each give
    one of zeros, to be added up."""
    parts = [vjp(xp, d, saved, heads=heads) for vjp in (_vjp_q, _vjp_k, _vjp_v)]
    return xp.concat(parts, axis=-1)


def _check_packed(qkv: Any, scale: float | None, causal: bool, heads: int, mask: Any = None) -> None:
    if type(qkv) is float or qkv.ndim < 2 or qkv.shape[-1] % 3:
        raise ShapeError(
            f"self_attention: qkv must have 2 dimensions at least and a feature axis of 3 parts, "
            f"got {shape_of(qkv)}"
        )
    _check(*_thirds(qkv), scale, causal, heads, mask)


def _packed_cost(qkv: Any, **_: Any) -> float:
    return float(math.prod(qkv.shape[:-1]) * qkv.shape[-2] * qkv.shape[-1])


def _self_attention_rule(qkv: Info, *_: Any, **__: Any) -> Info:
    """(..., L, 3n) -> (..., L, n): q, k and v side by side in the last axis."""
    return (*qkv[0][:-1], qkv[0][-1] // 3), qkv[1], qkv[2]


SELF_ATTENTION = declare(
    "self_attention",
    _packed_forward,
    (_packed_vjp,),
    saves=True,
    cost=_packed_cost,
    check=_check_packed,
    batch=Batching(row_params=("mask",), forward=_packed_stacked_forward, vjps=(_packed_vjp,)),
    per_run=("mask",),
    shape_rule=_self_attention_rule,
)
"""Attention of ``q``, ``k`` and ``v`` packed in one array's last axis (a fused projection's); its
``mask`` as :data:`ATTENTION`'s."""


def self_attention(
    qkv: AnyArray, mask: AnyNDArray | None = None, *, causal: bool = False, heads: int = 1
) -> ArrayLayer:
    """:func:`scaled_dot_product_attention` of ``q, k, v = split(qkv, 3, axis=-1)`` as one op, for
    :class:`~monadl.nn.MultiHeadAttention`: its delta is one array, where three slices would each
    give an array of ``qkv``'s shape, mostly zeros, to be added."""
    op = "self_attention"
    array_operand(op, qkv, "qkv")
    params: dict[str, Any] = {
        "scale": None,
        "causal": flag_param(op, "causal", causal),
        "heads": int_param(op, "heads", heads),
    }
    if mask is not None:
        _check_mask(op, mask)
    return apply_array(SELF_ATTENTION, qkv, mask=mask, **params)


def _check_mask(op: str, mask: object) -> None:
    if not is_array(mask):
        raise TypeError(f"{op}: mask must be an array (boolean or floating-point), got {type(mask).__name__}")
    xp = namespace(mask)
    dtype = mask.dtype  # type: ignore[attr-defined]
    if not (dtype == xp.bool or xp.isdtype(dtype, "real floating")):
        raise TypeError(f"{op}: mask must be boolean or floating-point, got dtype {dtype}")


def scaled_dot_product_attention(
    q: AnyArray,
    k: AnyArray,
    v: AnyArray,
    mask: AnyNDArray | None = None,
    *,
    causal: bool = False,
    scale: float | None = None,
    heads: int = 1,
) -> ArrayLayer:
    """``softmax(q @ k.T * scale + mask) @ v`` as one op, over the last two axes: ``q`` of shape
    (..., Lq, heads * d), ``k`` (..., Lk, heads * d), ``v`` (..., Lk, heads * dv); the result is
    (..., Lq, heads * dv). The leading axes broadcast. ``scale`` defaults to ``1 / sqrt(d)``.

    ``heads``: the feature axis holds that many heads side by side, each attending on its own (a
    multi-head layer's fused projections, without reshapes). ``mask``: a boolean array, True where
    a query may attend to a key, or a floating-point array added to the scores; it broadcasts to
    (..., Lq, Lk) (it may not change that shape), the same for every head, and gets no delta.
    ``causal``: query i attends to keys ``j <= i`` only (with ``mask``, both apply). A query that
    keeps no key gives 0 (as PyTorch), with a zero delta; so do no keys at all (Lk = 0)."""
    op = "scaled_dot_product_attention"
    array_operand(op, q, "q")
    array_operand(op, k, "k")
    array_operand(op, v, "v")
    h = int_param(op, "heads", heads)
    if h < 1:
        raise ValueError(f"{op}: heads must be positive, got {h}")
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float))):
        raise TypeError(f"{op}: scale must be a float or None, got {type(scale).__name__} {scale!r}")
    params: dict[str, Any] = {
        "scale": None if scale is None else float(scale),
        "causal": flag_param(op, "causal", causal),
        "heads": h,
    }
    if mask is not None:
        _check_mask(op, mask)
    return apply_array(ATTENTION, q, k, v, mask=mask, **params)
