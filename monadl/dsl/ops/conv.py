"""Convolution: :func:`conv1d` and :func:`conv2d` (pooling, on the same geometry, is in
``monadl.dsl.ops.pooling``).

Layout: channels first, as PyTorch (NCHW). An input has shape ``(..., C, L)`` (1d) or
``(..., C, H, W)`` (2d): any number of leading batch axes, none included; a kernel has shape
``(O, C // groups, K)`` or ``(O, C // groups, KH, KW)``; a bias ``(O,)`` or a float. The output of a
convolution has shape ``(..., O, OH, OW)`` with ``OH = (H + pad_lo + pad_hi - dilation * (KH - 1)
- 1) // stride + 1``.

How it is computed: im2col as one copy and one matrix product. The input is laid out channels
first, batch second (``(C, B, H, W)``), padded, and the ``KH * KW`` strided slices of the kernel's
offsets are stacked into one matrix of columns ``(C * KH * KW, B * OH * OW)``: a single ``stack``
of views (one pass over the columns, whose order the stack itself gives, no transposing copy),
then ``w @ columns`` (one BLAS product per group). The vjp of the input is the transpose: the
columns' delta ``w.T @ d`` is added back into the padded input one kernel offset at a time, each
addition one vectorised strided slice (col2im without ``np.add.at``, which is scalar code). Only
array-API calls are used (slices, ``stack``, ``matmul``, ``zeros``), so the same code runs on
NumPy, CuPy and array-api-strict: ``sliding_window_view`` exists on NumPy only, and the stacked
slices cost no more than its window view copied into columns. The columns are saved for the
weight's delta (``d @ columns.T``), so the backward does not rebuild them.

The 1d forms are the 2d ones with a height of 1. Under dynamic batching, calls of one kernel and
bias on inputs of one shape merge along a new leading axis: one product for all of them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Final, Literal

from monadl.do.primitive import Batching
from monadl.dsl.core.arguments import array_operand, as_index
from monadl.dsl.core.layers import AnyArray, AnyFloat, ArrayLayer, apply_array, is_float_kind
from monadl.dsl.ops.registry import declare
from monadl.dsl.ops.shape_rules import Info, promoted
from monadl.typeclasses.backend import NDARRAY, NUMPY, ShapeError, on_device, shape_of

__all__ = ["conv1d", "conv2d"]

Pair = tuple[int, int]
Pads = tuple[Pair, Pair]

# ------------------------------------------------------------------------------------- geometry


def out_size(n: int, k: int, stride: int, pad: Pair, dilation: int) -> int:
    """The output side of a window of ``k`` over a side of ``n``, padded, strided and dilated."""
    return (n + pad[0] + pad[1] - dilation * (k - 1) - 1) // stride + 1


def windows(
    xp: Any, x: Any, kernel: Pair, stride: Pair, pads: Pads, dilation: Pair, fill: float
) -> tuple[Any, int, int]:
    """``x`` of shape (C, B, H, W) padded with ``fill``, and its kernel offsets' strided slices as a
    list (offset ``(i, j)`` at ``i * KW + j``), each of shape (C, B, OH, OW); and OH, OW."""
    h, w = x.shape[-2], x.shape[-1]
    oh = out_size(h, kernel[0], stride[0], pads[0], dilation[0])
    ow = out_size(w, kernel[1], stride[1], pads[1], dilation[1])
    if pads != ((0, 0), (0, 0)):
        (top, bottom), (left, right) = pads
        padded = xp.full(
            (*x.shape[:-2], h + top + bottom, w + left + right), fill, dtype=x.dtype, **on_device(xp, x)
        )
        padded[..., top : top + h, left : left + w] = x
        x = padded
    return [x[(..., *window_key(i, j, oh, ow, stride, dilation))] for i, j in offsets(kernel)], oh, ow


def offsets(kernel: Pair) -> list[Pair]:
    """A 2d kernel's offsets, row-major."""
    return [(i, j) for i in range(kernel[0]) for j in range(kernel[1])]


def window_key(i: int, j: int, oh: int, ow: int, stride: Pair, dilation: Pair) -> tuple[slice, slice]:
    """The slice of the padded input that kernel offset ``(i, j)`` reads for every output position."""
    top, left = i * dilation[0], j * dilation[1]
    return (
        slice(top, top + stride[0] * (oh - 1) + 1, stride[0]),
        slice(left, left + stride[1] * (ow - 1) + 1, stride[1]),
    )


def col2im(
    xp: Any, parts: Any, shape: tuple[int, ...], kernel: Pair, stride: Pair, pads: Pads, dilation: Pair
) -> Any:
    """The transpose of :func:`windows`: ``parts[k]`` (offset k's slice delta, (C, B, OH, OW)) added
    into zeros of the padded input's shape, unpadded: a (C, B, H, W) delta."""
    (top, bottom), (left, right) = pads
    h, w = shape[-2], shape[-1]
    oh, ow = parts[0].shape[-2], parts[0].shape[-1]
    padded = (*shape[:-2], h + top + bottom, w + left + right)
    if stride == kernel and dilation == (1, 1) and padded[-2:] == (oh * kernel[0], ow * kernel[1]):
        # windows that tile the padded input: each offset's delta is written, not added, into its
        # own interleaved slot of (..., OH, KH, OW, KW), which is the padded input's layout
        tiles = xp.empty(
            (*shape[:-2], oh, kernel[0], ow, kernel[1]), dtype=parts[0].dtype, **on_device(xp, parts[0])
        )
        for k, (i, j) in enumerate(offsets(kernel)):
            tiles[..., i, :, j] = parts[k]
        g = xp.reshape(tiles, padded)
    else:
        g = xp.zeros(padded, dtype=parts[0].dtype, **on_device(xp, parts[0]))
        for k, (i, j) in enumerate(offsets(kernel)):
            key = (..., *window_key(i, j, oh, ow, stride, dilation))
            g[key] += parts[k]
    if pads != ((0, 0), (0, 0)):
        g = g[..., top : top + h, left : left + w]
    return g


def as_2d(x: Any, spatial: int) -> tuple[tuple[int, int, int, int], tuple[int, ...]]:
    """The shape (B, C, H, W) of ``x`` (..., C, *spatial), and its leading axes (1d: a height of 1)."""
    lead = tuple(x.shape[: x.ndim - spatial - 1])
    c, h, w = x.shape[-3:] if spatial == 2 else (x.shape[-2], 1, x.shape[-1])
    return (math.prod(lead), c, h, w), lead


def reshaped(xp: Any, x: Any, shape: tuple[int, ...]) -> Any:
    """``x`` reshaped to ``shape`` (itself where it has that shape)."""
    return x if tuple(x.shape) == shape else xp.reshape(x, shape)


def full2d(spatial: int, v: tuple[int, ...]) -> Pair:
    """Per-axis sizes of ``spatial`` axes as 2d ones (a 1d op is 2d with a height of 1)."""
    return (1, v[0]) if spatial == 1 else (v[0], v[1])


def pads2d(spatial: int, pads: tuple[Pair, ...]) -> Pads:
    """Paddings of ``spatial`` axes as 2d ones, as :func:`full2d`."""
    return ((0, 0), pads[0]) if spatial == 1 else (pads[0], pads[1])


# ------------------------------------------------------------------------------------ convolution


def _conv_forward(
    xp: Any,
    x: Any,
    w: Any,
    b: Any,
    stride: tuple[int, ...],
    padding: tuple[Pair, ...],
    dilation: tuple[int, ...],
    groups: int,
) -> tuple[Any, Any]:
    """The convolution, and the columns (G, Cg * KH * KW, B * OH * OW) saved for the vjps."""
    spatial = len(stride)
    shape, lead = as_2d(x, spatial)
    bsz, c = shape[0], shape[1]
    o = w.shape[0]
    kernel = full2d(spatial, tuple(w.shape[2:]))
    chw = xp.permute_dims(reshaped(xp, x, shape), (1, 0, 2, 3))  # (C, B, H, W): a view
    parts, oh, ow = windows(
        xp, chw, kernel, full2d(spatial, stride), pads2d(spatial, padding), full2d(spatial, dilation), 0.0
    )
    # (C, KH * KW, B, OH, OW) in one copy: rows (c, i, j) as the kernel's, columns (b, oh, ow)
    cols = xp.reshape(xp.stack(parts, axis=1), (groups, (c // groups) * len(parts), bsz * oh * ow))
    wm = xp.reshape(w, (groups, o // groups, cols.shape[1]))
    out = group_matmul(xp, wm, cols)  # (G, O // G, B * OH * OW)
    out = xp.reshape(out, (o, bsz * oh * ow))
    if type(b) is not float:
        if xp is NUMPY and type(b) is NDARRAY and b.dtype == out.dtype:
            out += b.reshape((o, 1))  # into the product's own array: no second array of the output's size
        else:
            out = out + xp.reshape(b, (o, 1))
    elif b != 0.0:
        out = out + b
    out = xp.permute_dims(xp.reshape(out, (o, bsz, oh, ow)), (1, 0, 2, 3))
    return xp.reshape(out, (*lead, o, *((ow,) if spatial == 1 else (oh, ow)))), cols


def group_matmul(xp: Any, a: Any, b: Any) -> Any:
    """Products of (G, n, k) and (G, k, m) stacks; one BLAS product when G is 1."""
    if a.shape[0] == 1:
        return xp.expand_dims(xp.matmul(a[0, ...], b[0, ...]), axis=0)
    return xp.matmul(a, b)


def _d_rows(xp: Any, d: Any, x: Any, o: int, spatial: int, groups: int) -> Any:
    """The output's delta (..., O, OH, OW) as (G, O // G, B * OH * OW), as the forward's product."""
    bsz = as_2d(x, spatial)[0][0]
    positions = math.prod(d.shape[d.ndim - spatial :])
    dm = xp.permute_dims(xp.reshape(d, (bsz, o, positions)), (1, 0, 2))
    return xp.reshape(dm, (groups, o // groups, bsz * positions))


def _conv_vjp_x(
    xp: Any,
    d: Any,
    cols: Any,
    x: Any,
    w: Any,
    b: Any,
    stride: tuple[int, ...],
    padding: tuple[Pair, ...],
    dilation: tuple[int, ...],
    groups: int,
) -> Any:
    spatial = len(stride)
    shape, _ = as_2d(x, spatial)
    bsz, c, oh, ow = shape[0], shape[1], d.shape[-2] if spatial == 2 else 1, d.shape[-1]
    kernel = full2d(spatial, tuple(w.shape[2:]))
    wm = xp.reshape(w, (groups, w.shape[0] // groups, cols.shape[1]))
    dcols = group_matmul(xp, xp.permute_dims(wm, (0, 2, 1)), _d_rows(xp, d, x, w.shape[0], spatial, groups))
    dcols = xp.reshape(dcols, (c, kernel[0] * kernel[1], bsz, oh, ow))
    parts = [dcols[:, k, ...] for k in range(kernel[0] * kernel[1])]
    g = col2im(
        xp,
        parts,
        (c, bsz, shape[2], shape[3]),
        kernel,
        full2d(spatial, stride),
        pads2d(spatial, padding),
        full2d(spatial, dilation),
    )
    return xp.reshape(xp.permute_dims(g, (1, 0, 2, 3)), tuple(x.shape))


def _conv_vjp_w(
    xp: Any, d: Any, cols: Any, x: Any, w: Any, b: Any, stride: tuple[int, ...], groups: int, **_: Any
) -> Any:
    # (cols @ d.T).T, not d @ cols.T: the same product with the long side (the positions) as its
    # inner dimension on the right, which BLAS kernels with wide registers run faster, others alike
    dm = _d_rows(xp, d, x, w.shape[0], len(stride), groups)
    dw = xp.permute_dims(group_matmul(xp, cols, xp.permute_dims(dm, (0, 2, 1))), (0, 2, 1))
    return xp.reshape(dw, tuple(w.shape))


def _conv_vjp_b(xp: Any, d: Any, cols: Any, x: Any, w: Any, b: Any, stride: tuple[int, ...], **_: Any) -> Any:
    spatial = len(stride)
    o = d.shape[d.ndim - spatial - 1]
    positions = math.prod(d.shape[d.ndim - spatial :])
    # each channel's sum as a product with a vector of ones: BLAS sums a (B, O, positions) stack in
    # one vectorised pass, faster than a reduction over the batch and spatial axes together
    per_row = xp.matmul(
        xp.reshape(d, (-1, o, positions)), xp.ones((positions,), dtype=d.dtype, **on_device(xp, d))
    )
    g = xp.sum(per_row, axis=0)
    return float(xp.sum(g)) if type(b) is float else g


def _check_conv(
    x: Any,
    w: Any,
    b: Any,
    stride: tuple[int, ...],
    padding: tuple[Pair, ...],
    dilation: tuple[int, ...],
    groups: int,
) -> None:
    spatial = len(stride)
    name = f"conv{spatial}d"
    if type(x) is float or x.ndim < spatial + 1 or type(w) is float or w.ndim != spatial + 2:
        raise ShapeError(
            f"{name}: needs x of shape (..., C, {'L' if spatial == 1 else 'H, W'}) and w of shape "
            f"(O, C // groups, {'K' if spatial == 1 else 'KH, KW'}), got {shape_of(x)} and {shape_of(w)}"
        )
    if any(k < 1 for k in w.shape[2:]):
        raise ShapeError(f"{name}: w of shape {tuple(w.shape)} has a kernel side of 0")
    c, o = x.shape[-spatial - 1], w.shape[0]
    if c != w.shape[1] * groups or o % groups:
        raise ShapeError(
            f"{name}: x of shape {tuple(x.shape)} ({c} channels) and w of shape {tuple(w.shape)} do "
            f"not fit {groups} group(s) (w must be (O, C // groups, ...) with O divisible by groups)"
        )
    if type(b) is not float and tuple(b.shape) != (o,):
        raise ShapeError(f"{name}: bias of shape {tuple(b.shape)} does not fit {o} output channels")
    sizes = [
        out_size(x.shape[x.ndim - spatial + a], w.shape[2 + a], stride[a], padding[a], dilation[a])
        for a in range(spatial)
    ]
    if any(n < 1 for n in sizes):
        raise ShapeError(
            f"{name}: a kernel of shape {tuple(w.shape[2:])} (dilation {dilation}) does not fit an "
            f"input of shape {tuple(x.shape)} padded by {padding}"
        )


def _conv_cost(x: Any, w: Any, b: Any, **_: Any) -> float:
    return float(math.prod(x.shape) * w.shape[0] * math.prod(w.shape[2:]))


def _conv_rule(
    x: Info,
    w: Info,
    b: Info,
    stride: tuple[int, ...],
    padding: tuple[tuple[int, int], ...],
    dilation: tuple[int, ...],
    groups: int,
) -> Info:
    spatial = len(stride)
    shape, kernel = x[0], w[0][2:]
    sides = shape[len(shape) - spatial :]
    out = [out_size(*args) for args in zip(sides, kernel, stride, padding, dilation, strict=True)]
    return (*shape[: len(shape) - spatial - 1], w[0][0], *out), *promoted(x, w, b)


CONV: Final = declare(
    "conv",
    _conv_forward,
    (_conv_vjp_x, _conv_vjp_w, _conv_vjp_b),
    saves=True,
    cost=_conv_cost,
    check=_check_conv,
    # calls of one kernel and bias merge: their inputs stacked on a new leading axis, one product
    batch=Batching(shared=(1, 2)),
    shape_rule=_conv_rule,
)
"""A convolution of 1 or 2 spatial axes (``len(stride)``): inputs x, w, b (a bias, or a float)."""


# ----------------------------------------------------------------------------------- public ops

Size = int | Sequence[int]
"""A window's size along each spatial axis: one int for every axis, or one per axis."""
Padding = int | Sequence[int] | Literal["valid", "same"]
"""Padding: an int (or one per axis) on both sides of each axis, ``"valid"`` (none) or ``"same"``
(the output as large as the input). Other strings are refused by the type, and when the op is made."""


def sizes_param(op: str, name: str, value: object, spatial: int, least: int) -> tuple[int, ...]:
    """An int or ``spatial`` ints, each at least ``least``, as a tuple of ``spatial`` ints."""
    try:
        if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
            sizes = tuple(as_index(v) for v in value)
        else:
            sizes = (as_index(value),) * spatial
    except TypeError:
        raise TypeError(
            f"{op}: {name} must be an int or {spatial} ints, got {type(value).__name__} {value!r}"
        ) from None
    if len(sizes) != spatial or any(n < least for n in sizes):
        raise ValueError(f"{op}: {name} must be {spatial} int(s) of at least {least}, got {value!r}")
    return sizes


def _padding(
    op: str,
    value: object,
    spatial: int,
    kernel: tuple[int, ...] | None,
    dilation: tuple[int, ...],
    stride: tuple[int, ...],
) -> tuple[Pair, ...]:
    """Padding as (before, after) per spatial axis: ints, ``"valid"`` (none) or ``"same"`` (the
    output as large as the input, for a stride of 1; an odd total puts the extra after, as PyTorch)."""
    if value == "valid":
        return ((0, 0),) * spatial
    if value == "same":
        if kernel is None:
            raise ValueError(f"{op}: padding 'same' needs the kernel's size")
        if any(s != 1 for s in stride):
            raise ValueError(f"{op}: padding 'same' needs a stride of 1, got {stride}")
        totals = [d * (k - 1) for k, d in zip(kernel, dilation, strict=True)]
        return tuple((t // 2, t - t // 2) for t in totals)
    if isinstance(value, str):
        raise ValueError(f"{op}: padding must be ints, 'valid' or 'same', got {value!r}")
    return tuple((p, p) for p in sizes_param(op, "padding", value, spatial, 0))


def _conv(
    spatial: int,
    x: AnyArray,
    w: AnyArray,
    b: AnyFloat | AnyArray | None,
    stride: Size,
    padding: Padding,
    dilation: Size,
    groups: int,
) -> ArrayLayer:
    op = f"conv{spatial}d"
    array_operand(op, x, "x")
    array_operand(op, w, "w")
    if isinstance(b, bool) or (b is not None and not is_float_kind(b)):
        array_operand(op, b, "b")  # (a bool is refused there)
    strides = sizes_param(op, "stride", stride, spatial, 1)
    dilations = sizes_param(op, "dilation", dilation, spatial, 1)
    kernel = _kernel_of(w, spatial)
    pads = _padding(op, padding, spatial, kernel, dilations, strides)
    try:
        g = as_index(groups)
    except TypeError:
        raise TypeError(f"{op}: groups must be an int, got {type(groups).__name__} {groups!r}") from None
    if g < 1:
        raise ValueError(f"{op}: groups must be at least 1, got {g}")
    bias: AnyFloat | AnyArray = 0.0 if b is None else float(b) if type(b) is int else b
    return apply_array(CONV, x, w, bias, stride=strides, padding=pads, dilation=dilations, groups=g)


def _kernel_of(w: object, spatial: int) -> tuple[int, ...] | None:
    """The kernel's spatial size where it is known before the op runs (an array or a weight)."""
    data = getattr(w, "data", w)
    shape = getattr(data, "shape", None)
    if shape is None or len(shape) != spatial + 2:
        return None
    return tuple(int(n) for n in shape[2:])


def conv1d(
    x: AnyArray,
    w: AnyArray,
    b: AnyFloat | AnyArray | None = None,
    *,
    stride: Size = 1,
    padding: Padding = 0,
    dilation: Size = 1,
    groups: int = 1,
) -> ArrayLayer:
    """1d cross-correlation, as PyTorch's ``conv1d``: ``x`` (..., C, L), ``w`` (O, C // groups, K),
    ``b`` (O,), a float (a ``FloatWeight``, a ``FloatLayer``: added to every output) or None; the
    result (..., O, (L + 2 * padding - dilation * (K - 1) - 1) // stride + 1). ``padding``: an int,
    ``"valid"`` or ``"same"``. ``groups``: the channels are split into that many groups, each
    convolved with its own O // groups kernels."""
    return _conv(1, x, w, b, stride, padding, dilation, groups)


def conv2d(
    x: AnyArray,
    w: AnyArray,
    b: AnyFloat | AnyArray | None = None,
    *,
    stride: Size = 1,
    padding: Padding = 0,
    dilation: Size = 1,
    groups: int = 1,
) -> ArrayLayer:
    """2d cross-correlation, as PyTorch's ``conv2d`` (NCHW): ``x`` (..., C, H, W), ``w``
    (O, C // groups, KH, KW), ``b`` (O,), a float (a ``FloatWeight``, a ``FloatLayer``: added to
    every output, its delta the sum of the output's) or None; the result (..., O, OH, OW).
    ``stride``, ``padding`` and ``dilation`` are an int or one per axis (height, width);
    ``padding`` may be ``"valid"`` or ``"same"``. Computed as im2col and one matrix product (see
    the module)."""
    return _conv(2, x, w, b, stride, padding, dilation, groups)
