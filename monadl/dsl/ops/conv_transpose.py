"""Transposed convolution: :func:`conv_transpose2d`, as PyTorch's (NCHW).

``conv_transpose2d(x, w)`` is the adjoint of ``conv2d`` with the same kernel: the gradient of a
convolution's input, taken as an op of its own (a "deconvolution", an upsampling by ``stride``). An
input has shape ``(..., C_in, H, W)`` (any number of leading batch axes, none included), a kernel
PyTorch's layout ``(C_in, C_out // groups, KH, KW)``, a bias ``(C_out,)`` or a float; the output
``(..., C_out, OH, OW)`` with ``OH = (H - 1) * stride - 2 * padding + dilation * (KH - 1) +
output_padding + 1``.

How it is computed: the transpose of :mod:`monadl.dsl.ops.conv`'s im2col. One matrix product per group
gives every kernel offset's contribution at once (``w.T @ x``: columns ``(C_out * KH * KW, B * H *
W)``), and col2im adds each offset's slice into the output (its strided window), then crops the
padding. The vjps are the convolution's forward: the delta's windows gathered into columns (im2col,
built once for both), ``w @ columns`` for the input and ``x @ columns.T`` for the kernel. Array-API
only (slices, ``stack``, ``matmul``), so it runs on NumPy, CuPy and array-api-strict. Under dynamic
batching, calls of one kernel and bias on inputs of one shape merge along a new leading axis.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Final

from monadl.do.primitive import Batching
from monadl.dsl.core.arguments import array_operand, as_index
from monadl.dsl.core.layers import AnyArray, AnyFloat, ArrayLayer, apply_array, is_float_kind
from monadl.dsl.ops.conv import Pads, Pair, col2im, group_matmul, offsets, reshaped, sizes_param, window_key
from monadl.dsl.ops.registry import declare
from monadl.dsl.ops.shape_rules import Info, promoted
from monadl.typeclasses.backend import NDARRAY, NUMPY, ShapeError, on_device, shape_of

__all__ = ["conv_transpose2d"]


def out_size(n: int, k: int, stride: int, pad: int, output_padding: int, dilation: int) -> int:
    return (n - 1) * stride - 2 * pad + dilation * (k - 1) + output_padding + 1


def _sides(
    x_shape: Sequence[int],
    w_shape: Sequence[int],
    stride: Pair,
    padding: Pair,
    output_padding: Pair,
    dilation: Pair,
) -> Pair:
    h, w = x_shape[-2], x_shape[-1]
    return (
        out_size(h, w_shape[2], stride[0], padding[0], output_padding[0], dilation[0]),
        out_size(w, w_shape[3], stride[1], padding[1], output_padding[1], dilation[1]),
    )


def _pads(padding: Pair) -> Pads:
    return ((padding[0], padding[0]), (padding[1], padding[1]))


def _rows(xp: Any, x: Any, groups: int) -> tuple[Any, tuple[int, ...], int, int, int]:
    """``x`` (..., C, H, W) as (G, C // G, B * H * W); its leading axes, B, H and W."""
    lead = tuple(x.shape[:-3])
    c, h, w = x.shape[-3:]
    bsz = math.prod(lead)
    xm = xp.permute_dims(reshaped(xp, x, (bsz, c, h * w)), (1, 0, 2))  # (C, B, H * W)
    return xp.reshape(xm, (groups, c // groups, bsz * h * w)), lead, bsz, h, w


def _forward(
    xp: Any,
    x: Any,
    w: Any,
    b: Any,
    stride: Pair,
    padding: Pair,
    output_padding: Pair,
    dilation: Pair,
    groups: int,
) -> tuple[Any, list[Any]]:
    """The transposed convolution, and a cache the vjps fill with the delta's columns."""
    c_in, og, kh, kw = w.shape
    o = og * groups
    xm, lead, bsz, h, ww = _rows(xp, x, groups)
    wm = xp.reshape(w, (groups, c_in // groups, og * kh * kw))
    cols = group_matmul(xp, xp.permute_dims(wm, (0, 2, 1)), xm)  # (G, O // G * KH * KW, B * H * W)
    cols = xp.reshape(cols, (o, kh * kw, bsz, h, ww))
    oh, ow = _sides(x.shape, w.shape, stride, padding, output_padding, dilation)
    out = col2im(
        xp,
        [cols[:, k, ...] for k in range(kh * kw)],
        (o, bsz, oh, ow),
        (kh, kw),
        stride,
        _pads(padding),
        dilation,
    )
    if type(b) is not float:
        bias = xp.reshape(b, (o, 1, 1, 1))
        if xp is NUMPY and type(b) is NDARRAY and b.dtype == out.dtype:
            out += bias  # into col2im's own array: no second array of the output's size
        else:
            out = out + bias
    elif b != 0.0:
        out = out + b
    out = xp.permute_dims(out, (1, 0, 2, 3))  # (B, O, OH, OW)
    return xp.reshape(out, (*lead, o, oh, ow)), [None]


def _columns(
    xp: Any, d: Any, x: Any, w: Any, stride: Pair, padding: Pair, dilation: Pair, groups: int
) -> Any:
    """The delta's windows as columns (G, O // G * KH * KW, B * H * W): the im2col of the
    convolution whose input is the delta, one window per element of ``x``."""
    og, kh, kw = w.shape[1:]
    o = og * groups
    h, ww = x.shape[-2], x.shape[-1]
    bsz = math.prod(x.shape[:-3])
    oh, ow = d.shape[-2], d.shape[-1]
    dm = xp.permute_dims(reshaped(xp, d, (bsz, o, oh, ow)), (1, 0, 2, 3))  # (O, B, OH, OW)
    (top, left) = padding
    if top or left:
        padded = xp.zeros((o, bsz, oh + 2 * top, ow + 2 * left), dtype=d.dtype, **on_device(xp, d))
        padded[:, :, top : top + oh, left : left + ow] = dm
        dm = padded
    parts = [dm[(..., *window_key(i, j, h, ww, stride, dilation))] for i, j in offsets((kh, kw))]
    return xp.reshape(xp.stack(parts, axis=1), (groups, og * kh * kw, bsz * h * ww))


def _cached_columns(
    xp: Any,
    d: Any,
    saved: list[Any],
    x: Any,
    w: Any,
    stride: Pair,
    padding: Pair,
    dilation: Pair,
    groups: int,
) -> Any:
    """:func:`_columns` of ``d``, built by the first of the input's and the kernel's vjps and kept
    for the other (for this ``d``)."""
    cached = saved[0]
    if cached is not None and cached[0] is d:
        return cached[1]
    cols = _columns(xp, d, x, w, stride, padding, dilation, groups)
    saved[0] = (d, cols)  # one assignment: a vjp on another thread sees the pair or nothing
    return cols


def _vjp_x(
    xp: Any,
    d: Any,
    saved: list[Any],
    x: Any,
    w: Any,
    b: Any,
    stride: Pair,
    padding: Pair,
    output_padding: Pair,
    dilation: Pair,
    groups: int,
) -> Any:
    c_in, og, kh, kw = w.shape
    cols = _cached_columns(xp, d, saved, x, w, stride, padding, dilation, groups)
    wm = xp.reshape(w, (groups, c_in // groups, og * kh * kw))
    g = group_matmul(xp, wm, cols)  # (G, C // G, B * H * W)
    lead = tuple(x.shape[:-3])
    h, ww = x.shape[-2], x.shape[-1]
    g = xp.permute_dims(xp.reshape(g, (c_in, math.prod(lead), h * ww)), (1, 0, 2))
    return xp.reshape(g, tuple(x.shape))


def _vjp_w(
    xp: Any,
    d: Any,
    saved: list[Any],
    x: Any,
    w: Any,
    b: Any,
    stride: Pair,
    padding: Pair,
    output_padding: Pair,
    dilation: Pair,
    groups: int,
) -> Any:
    cols = _cached_columns(xp, d, saved, x, w, stride, padding, dilation, groups)
    xm = _rows(xp, x, groups)[0]
    dw = group_matmul(xp, xm, xp.permute_dims(cols, (0, 2, 1)))  # (G, C // G, O // G * KH * KW)
    return xp.reshape(dw, tuple(w.shape))


def _vjp_b(xp: Any, d: Any, saved: list[Any], x: Any, w: Any, b: Any, **_: Any) -> Any:
    o = d.shape[-3]
    per_channel = xp.sum(xp.reshape(d, (-1, o, d.shape[-2] * d.shape[-1])), axis=(0, 2))
    return float(xp.sum(per_channel)) if type(b) is float else per_channel


def _check(
    x: Any,
    w: Any,
    b: Any,
    stride: Pair,
    padding: Pair,
    output_padding: Pair,
    dilation: Pair,
    groups: int,
) -> None:
    name = "conv_transpose2d"
    if type(x) is float or x.ndim < 3 or type(w) is float or w.ndim != 4:
        raise ShapeError(
            f"{name}: needs x of shape (..., C_in, H, W) and w of shape (C_in, C_out // groups, KH, KW), "
            f"got {shape_of(x)} and {shape_of(w)}"
        )
    c = x.shape[-3]
    if c != w.shape[0] or c % groups:
        raise ShapeError(
            f"{name}: x of shape {tuple(x.shape)} ({c} channels) and w of shape {tuple(w.shape)} do not "
            f"fit {groups} group(s) (w must be (C_in, C_out // groups, KH, KW) with C_in divisible by groups)"
        )
    o = w.shape[1] * groups
    if type(b) is not float and tuple(b.shape) != (o,):
        raise ShapeError(f"{name}: bias of shape {tuple(b.shape)} does not fit {o} output channels")
    sides = _sides(x.shape, w.shape, stride, padding, output_padding, dilation)
    if any(n < 1 for n in sides):
        raise ShapeError(
            f"{name}: an input of shape {tuple(x.shape)}, a kernel of shape {tuple(w.shape[2:])} and "
            f"padding {padding} give an output of sides {sides}"
        )


def _shape(
    x: Info,
    w: Info,
    b: Info,
    stride: Pair,
    padding: Pair,
    output_padding: Pair,
    dilation: Pair,
    groups: int,
) -> Info:
    sides = _sides(x[0], w[0], stride, padding, output_padding, dilation)
    return (*x[0][:-3], w[0][1] * groups, *sides), *promoted(x, w, b)


def _cost(x: Any, w: Any, b: Any, **_: Any) -> float:
    return float(math.prod(x.shape) * w.shape[1] * math.prod(w.shape[2:]))


CONV_TRANSPOSE: Final = declare(
    "conv_transpose2d",
    _forward,
    (_vjp_x, _vjp_w, _vjp_b),
    saves=True,
    cost=_cost,
    check=_check,
    batch=Batching(shared=(1, 2)),  # calls of one kernel and bias: their inputs stacked, one product
    shape_rule=_shape,
)
"""A 2d transposed convolution: inputs x, w, b (a bias, or a float)."""


Size = int | Sequence[int]


def conv_transpose2d(
    x: AnyArray,
    w: AnyArray,
    b: AnyFloat | AnyArray | None = None,
    *,
    stride: Size = 1,
    padding: Size = 0,
    output_padding: Size = 0,
    groups: int = 1,
    dilation: Size = 1,
) -> ArrayLayer:
    """2d transposed convolution, as PyTorch's ``conv_transpose2d`` (NCHW): the adjoint of
    :func:`~monadl.conv2d` of the same kernel (its input's gradient), which upsamples by
    ``stride``. ``x`` (..., C_in, H, W), ``w`` (C_in, C_out // groups, KH, KW) (PyTorch's layout,
    inputs first), ``b`` (C_out,), a float or None; the result (..., C_out, OH, OW) with ``OH = (H
    - 1) * stride - 2 * padding + dilation * (KH - 1) + output_padding + 1``. ``stride``,
    ``padding``, ``output_padding`` and ``dilation`` are an int or one per axis (height, width);
    ``padding`` crops the output's sides, ``output_padding`` (less than the stride or the
    dilation) adds to one side of it, to pick among the sizes a strided convolution maps to one."""
    op = "conv_transpose2d"
    array_operand(op, x, "x")
    array_operand(op, w, "w")
    if isinstance(b, bool) or (b is not None and not is_float_kind(b)):
        array_operand(op, b, "b")  # (a bool is refused there)
    strides = _pair(sizes_param(op, "stride", stride, 2, 1))
    pads = _pair(sizes_param(op, "padding", padding, 2, 0))
    extra = _pair(sizes_param(op, "output_padding", output_padding, 2, 0))
    dilations = _pair(sizes_param(op, "dilation", dilation, 2, 1))
    for a in range(2):
        if extra[a] >= max(strides[a], dilations[a]):
            raise ValueError(
                f"{op}: output_padding {extra} must be less than the stride {strides} or the dilation "
                f"{dilations} along each axis"
            )
    try:
        g = as_index(groups)
    except TypeError:
        raise TypeError(f"{op}: groups must be an int, got {type(groups).__name__} {groups!r}") from None
    if g < 1:
        raise ValueError(f"{op}: groups must be at least 1, got {g}")
    bias: AnyFloat | AnyArray = 0.0 if b is None else float(b) if type(b) is int else b
    return apply_array(
        CONV_TRANSPOSE,
        x,
        w,
        bias,
        stride=strides,
        padding=pads,
        output_padding=extra,
        dilation=dilations,
        groups=g,
    )


def _pair(sizes: tuple[int, ...]) -> Pair:
    return sizes[0], sizes[1]
