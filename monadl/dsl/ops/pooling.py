"""Pooling: :func:`max_pool1d`, :func:`max_pool2d`, :func:`avg_pool1d`, :func:`avg_pool2d`.

On the geometry of ``monadl.dsl.ops.conv`` (channels first, any leading batch axes): the output
keeps the channels, ``(..., C, OH, OW)``, with ``OH = (H + 2 * pad - KH) // stride + 1``. Calls
on inputs of one shape merge under dynamic batching along a new leading axis.
"""

from __future__ import annotations

import math
from typing import Any, Final

from monadl.do.primitive import Batching, Primitive
from monadl.dsl.core.arguments import array_operand
from monadl.dsl.core.layers import AnyArray, ArrayLayer, apply_array
from monadl.dsl.ops.conv import Pair, Size, col2im, full2d, out_size, pads2d, reshaped, sizes_param, windows
from monadl.dsl.ops.registry import declare
from monadl.dsl.ops.shape_rules import Info
from monadl.typeclasses.backend import ShapeError, on_device, shape_of

__all__ = ["avg_pool1d", "avg_pool2d", "max_pool1d", "max_pool2d"]


# ---------------------------------------------------------------------------------------- pooling


def _pool_input(xp: Any, x: Any, spatial: int) -> tuple[Any, tuple[int, ...]]:
    """``x`` (..., *spatial) as (1, B, H, W) (the channels, like the batch, are rows of windows)."""
    lead = tuple(x.shape[: x.ndim - spatial])
    h, w = (1, x.shape[-1]) if spatial == 1 else (x.shape[-2], x.shape[-1])
    return reshaped(xp, x, (1, math.prod(lead), h, w)), lead


def _pool_out(xp: Any, out: Any, lead: tuple[int, ...], spatial: int) -> Any:
    return xp.reshape(out, (*lead, *out.shape[-spatial:]))


def _max_pool_forward(
    xp: Any, x: Any, kernel: tuple[int, ...], stride: tuple[int, ...], padding: tuple[Pair, ...]
) -> tuple[Any, Any]:
    """The windows' maxima, and (saved) the offset of each window's first maximum."""
    spatial = len(kernel)
    x4, lead = _pool_input(xp, x, spatial)
    parts, _, _ = windows(
        xp,
        x4,
        full2d(spatial, kernel),
        full2d(spatial, stride),
        pads2d(spatial, padding),
        (1, 1),
        -math.inf,
    )
    # A running maximum over the offsets, elementwise: a reduction over a stacked leading axis
    # (``argmax(axis=0)``) walks memory across the whole stack for every element, many times slower,
    # and so does ``where``. Strictly greater: a tie keeps the earlier offset, the window's first
    # maximum; the offsets come in increasing order, so the latest greater one is the largest index.
    index = xp.int8 if len(parts) <= 127 else xp.int32
    top = xp.asarray(parts[0], copy=True) if len(parts) == 1 else parts[0]
    first = xp.zeros(tuple(top.shape), dtype=index, **on_device(xp, top))
    for k, part in enumerate(parts[1:], start=1):
        first = xp.maximum(first, xp.astype(part > top, index) * k)
        top = xp.maximum(top, part)
    return _pool_out(xp, top, lead, spatial), first


def _max_pool_vjp(
    xp: Any,
    d: Any,
    first: Any,
    x: Any,
    kernel: tuple[int, ...],
    stride: tuple[int, ...],
    padding: tuple[Pair, ...],
) -> Any:
    """The delta goes to each window's first maximum (as PyTorch's)."""
    spatial = len(kernel)
    x4, _ = _pool_input(xp, x, spatial)
    d4 = xp.reshape(d, tuple(first.shape))
    k2 = full2d(spatial, kernel)
    # a product by the 0/1 mask: many times faster than ``where`` (a delta is finite)
    parts = [d4 * xp.astype(first == k, d4.dtype) for k in range(k2[0] * k2[1])]
    g = col2im(xp, parts, tuple(x4.shape), k2, full2d(spatial, stride), pads2d(spatial, padding), (1, 1))
    return xp.reshape(g, tuple(x.shape))


def _avg_pool_forward(
    xp: Any, x: Any, kernel: tuple[int, ...], stride: tuple[int, ...], padding: tuple[Pair, ...]
) -> Any:
    """The windows' means; padding counts as zeros (PyTorch's ``count_include_pad=True``)."""
    spatial = len(kernel)
    x4, lead = _pool_input(xp, x, spatial)
    parts, _, _ = windows(
        xp, x4, full2d(spatial, kernel), full2d(spatial, stride), pads2d(spatial, padding), (1, 1), 0.0
    )
    total = parts[0] + parts[1] if len(parts) > 1 else parts[0] * 1.0
    for p in parts[2:]:
        total += p
    return _pool_out(xp, total / float(len(parts)), lead, spatial)


def _avg_pool_vjp(
    xp: Any,
    d: Any,
    o: Any,
    x: Any,
    kernel: tuple[int, ...],
    stride: tuple[int, ...],
    padding: tuple[Pair, ...],
) -> Any:
    spatial = len(kernel)
    x4, _ = _pool_input(xp, x, spatial)
    k2 = full2d(spatial, kernel)
    share = xp.reshape(d, (1, x4.shape[1], d.shape[-2] if spatial == 2 else 1, d.shape[-1])) / float(
        k2[0] * k2[1]
    )
    parts = [share] * (k2[0] * k2[1])
    g = col2im(xp, parts, tuple(x4.shape), k2, full2d(spatial, stride), pads2d(spatial, padding), (1, 1))
    return xp.reshape(g, tuple(x.shape))


def _check_pool(name: str) -> Any:
    def check(x: Any, kernel: tuple[int, ...], stride: tuple[int, ...], padding: tuple[Pair, ...]) -> None:
        spatial = len(kernel)
        full = f"{name}{spatial}d"
        if type(x) is float or x.ndim < spatial:
            raise ShapeError(f"{full}: needs an array of at least {spatial} axes, got {shape_of(x)}")
        for a in range(spatial):
            n = x.shape[x.ndim - spatial + a]
            if max(padding[a]) * 2 > kernel[a]:
                raise ShapeError(f"{full}: padding {padding[a]} is more than half the kernel {kernel}")
            if out_size(n, kernel[a], stride[a], padding[a], 1) < 1:
                raise ShapeError(
                    f"{full}: a kernel of {kernel} does not fit an input of shape {tuple(x.shape)}"
                )

    return check


def _pool_cost(x: Any, kernel: tuple[int, ...], **_: Any) -> float:
    return float(math.prod(x.shape) * math.prod(kernel))


def _pool_rule(
    x: Info, kernel: tuple[int, ...], stride: tuple[int, ...], padding: tuple[tuple[int, int], ...]
) -> Info:
    spatial = len(kernel)
    shape = x[0]
    sides = shape[len(shape) - spatial :]
    out = [out_size(n, k, s, p, 1) for n, k, s, p in zip(sides, kernel, stride, padding, strict=True)]
    return (*shape[: len(shape) - spatial], *out), x[1], x[2]


MAX_POOL: Final = declare(
    "max_pool",
    _max_pool_forward,
    (_max_pool_vjp,),
    saves=True,
    cost=_pool_cost,
    check=_check_pool("max_pool"),
    batch=Batching(),  # the calls' inputs stacked: windows of every row at once
    shape_rule=_pool_rule,
)
AVG_POOL: Final = declare(
    "avg_pool",
    _avg_pool_forward,
    (_avg_pool_vjp,),
    cost=_pool_cost,
    check=_check_pool("avg_pool"),
    batch=Batching(),
    shape_rule=_pool_rule,
)


def _pool(
    prim: Primitive, op: str, spatial: int, x: AnyArray, kernel_size: Size, stride: Size | None, padding: Size
) -> ArrayLayer:
    array_operand(op, x)
    kernel = sizes_param(op, "kernel_size", kernel_size, spatial, 1)
    strides = kernel if stride is None else sizes_param(op, "stride", stride, spatial, 1)
    pads = sizes_param(op, "padding", padding, spatial, 0)
    if any(2 * p > k for p, k in zip(pads, kernel, strict=True)):
        raise ValueError(f"{op}: padding {pads} must be at most half the kernel {kernel}")
    return apply_array(prim, x, kernel=kernel, stride=strides, padding=tuple((p, p) for p in pads))


def max_pool1d(x: AnyArray, kernel_size: Size, stride: Size | None = None, padding: Size = 0) -> ArrayLayer:
    """The maximum of each window of ``kernel_size`` along the last axis of ``x`` (..., L), every
    ``stride`` (default ``kernel_size``), padding counted as -inf. The delta goes to each window's
    first maximum."""
    return _pool(MAX_POOL, "max_pool1d", 1, x, kernel_size, stride, padding)


def max_pool2d(x: AnyArray, kernel_size: Size, stride: Size | None = None, padding: Size = 0) -> ArrayLayer:
    """The maximum of each ``kernel_size`` window over the last two axes of ``x`` (..., H, W), as
    PyTorch's ``max_pool2d`` (NCHW: the channels are leading axes); ``stride`` defaults to the
    kernel. The delta goes to each window's first maximum (row-major)."""
    return _pool(MAX_POOL, "max_pool2d", 2, x, kernel_size, stride, padding)


def avg_pool1d(x: AnyArray, kernel_size: Size, stride: Size | None = None, padding: Size = 0) -> ArrayLayer:
    """The mean of each window of ``kernel_size`` along the last axis of ``x`` (..., L), every
    ``stride`` (default ``kernel_size``); padding counts as zeros in the mean."""
    return _pool(AVG_POOL, "avg_pool1d", 1, x, kernel_size, stride, padding)


def avg_pool2d(x: AnyArray, kernel_size: Size, stride: Size | None = None, padding: Size = 0) -> ArrayLayer:
    """The mean of each ``kernel_size`` window over the last two axes of ``x`` (..., H, W), as
    PyTorch's ``avg_pool2d`` (padding counts as zeros in the mean); ``stride`` defaults to the kernel."""
    return _pool(AVG_POOL, "avg_pool2d", 2, x, kernel_size, stride, padding)
