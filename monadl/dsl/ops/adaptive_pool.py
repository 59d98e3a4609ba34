"""Adaptive average pooling: :func:`adaptive_avg_pool2d`, as PyTorch's.

The output's size is given, not the window's: output row ``i`` of ``OH`` averages the input rows
``floor(i * H / OH)`` to ``ceil((i + 1) * H / OH)`` (excluded), PyTorch's bins (which overlap where
``OH`` does not divide ``H``), and likewise along the width. ``x`` has shape ``(..., H, W)``: any
leading axes (batch, channels), the channels among them, as the other pools take them.

How it is computed: where ``OH`` divides ``H`` and ``OW`` divides ``W`` (a global average pool, or
an output as large as the input) the bins are equal windows that tile the input: a reshape and a
mean, and a broadcast back for the vjp. Otherwise the bins' means are two products with averaging
matrices, ``A_h @ x @ A_w.T`` (``A_h[i, r] = 1 / |bin i|`` for the rows r of bin i), and the vjp is
``A_h.T @ d @ A_w``. Array-API only. Under dynamic batching the calls' inputs are stacked along a
new leading axis.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any, Final

import numpy as np

from monadl.do.primitive import Batching
from monadl.dsl.core.arguments import array_operand, as_index
from monadl.dsl.core.layers import AnyArray, ArrayLayer, apply_array
from monadl.dsl.ops.registry import declare
from monadl.dsl.ops.shape_rules import Info
from monadl.typeclasses.backend import NUMPY, ShapeError, on_device, shape_of

__all__ = ["adaptive_avg_pool2d"]

OutputSize = tuple[int | None, int | None]


def bins(n: int, out: int) -> list[tuple[int, int]]:
    """PyTorch's bins of ``n`` elements for ``out`` outputs: ``[floor(i n / out), ceil((i + 1) n /
    out))`` for each output ``i``."""
    return [((i * n) // out, -((-(i + 1) * n) // out)) for i in range(out)]


@functools.lru_cache(maxsize=64)  # a few sizes per model
def _averaging_f64(n: int, out: int) -> Any:
    a = np.zeros((out, n))
    for i, (lo, hi) in enumerate(bins(n, out)):
        a[i, lo:hi] = 1.0 / (hi - lo)
    a.flags.writeable = False
    return a


def _averaging(xp: Any, n: int, out: int, like: Any) -> Any:
    """The (out, n) matrix whose row i averages bin i, in ``like``'s dtype, namespace and device."""
    a = _averaging_f64(n, out)
    if xp is NUMPY:
        return a.astype(like.dtype, copy=False)
    return xp.asarray(a, dtype=like.dtype, **on_device(xp, like))


def _sizes(x_shape: Sequence[int], output_size: OutputSize) -> tuple[int, int]:
    h, w = x_shape[-2], x_shape[-1]
    oh, ow = output_size
    return (h if oh is None else oh), (w if ow is None else ow)


def _forward(xp: Any, x: Any, output_size: OutputSize) -> Any:
    h, w = x.shape[-2], x.shape[-1]
    oh, ow = _sizes(x.shape, output_size)
    lead = tuple(x.shape[:-2])
    if h % oh == 0 and w % ow == 0:  # equal windows that tile the input
        tiles = xp.reshape(x, (*lead, oh, h // oh, ow, w // ow))
        return xp.mean(tiles, axis=(-3, -1))
    rows = xp.matmul(_averaging(xp, h, oh, x), x)  # (..., OH, W)
    return xp.matmul(rows, xp.matrix_transpose(_averaging(xp, w, ow, x)))


def _vjp(xp: Any, d: Any, o: Any, x: Any, output_size: OutputSize) -> Any:
    h, w = x.shape[-2], x.shape[-1]
    oh, ow = _sizes(x.shape, output_size)
    lead = tuple(x.shape[:-2])
    if h % oh == 0 and w % ow == 0:
        kh, kw = h // oh, w // ow
        share = xp.reshape(d, (*lead, oh, 1, ow, 1)) / float(kh * kw)
        return xp.reshape(xp.broadcast_to(share, (*lead, oh, kh, ow, kw)), tuple(x.shape))
    rows = xp.matmul(d, _averaging(xp, w, ow, d))  # (..., OH, W)
    return xp.matmul(xp.matrix_transpose(_averaging(xp, h, oh, d)), rows)


def _check(x: Any, output_size: OutputSize) -> None:
    if type(x) is float or x.ndim < 2:
        raise ShapeError(
            f"adaptive_avg_pool2d: needs an array of 2 axes at least (..., H, W), got {shape_of(x)}"
        )
    if x.shape[-2] < 1 or x.shape[-1] < 1:
        raise ShapeError(
            f"adaptive_avg_pool2d: an input of shape {tuple(x.shape)} has no element to average (H and W "
            f"must be at least 1)"
        )


def _shape(x: Info, output_size: OutputSize) -> Info:
    return (*x[0][:-2], *_sizes(x[0], output_size)), x[1], x[2]


def _cost(x: Any, output_size: OutputSize) -> float:
    oh, ow = _sizes(x.shape, output_size)
    return float(math.prod(x.shape) * (1 if x.shape[-2] % oh == 0 and x.shape[-1] % ow == 0 else oh + ow))


ADAPTIVE_AVG_POOL: Final = declare(
    "adaptive_avg_pool2d",
    _forward,
    (_vjp,),
    cost=_cost,
    check=_check,
    batch=Batching(),  # the calls' inputs stacked on a new leading axis
    shape_rule=_shape,
)
"""The means of PyTorch's adaptive bins over ``x``'s last two axes."""


def adaptive_avg_pool2d(x: AnyArray, output_size: int | Sequence[int | None]) -> ArrayLayer:
    """The mean of each of ``output_size`` bins over the last two axes of ``x`` (..., H, W), as
    PyTorch's ``adaptive_avg_pool2d``: output row ``i`` of ``OH`` averages the input rows
    ``floor(i * H / OH)`` to ``ceil((i + 1) * H / OH)`` (excluded), and likewise along the width.
    ``output_size``: an int (a square output) or a pair ``(OH, OW)``, either of which may be None
    (the input's size along that axis). ``adaptive_avg_pool2d(x, 1)`` is a global average pool."""
    op = "adaptive_avg_pool2d"
    array_operand(op, x, "x")
    given: list[object] = (
        list(output_size)
        if isinstance(output_size, Sequence) and not isinstance(output_size, (str, bytes))
        else [output_size, output_size]
    )
    if len(given) != 2:
        raise ValueError(f"{op}: output_size must be an int or 2 sizes (OH, OW), got {output_size!r}")
    sizes: list[int | None] = []
    for s in given:
        if s is None:
            sizes.append(None)
            continue
        try:
            n = as_index(s)
        except TypeError:
            raise TypeError(
                f"{op}: output_size must be ints (or None), got {type(s).__name__} {s!r} in {output_size!r}"
            ) from None
        if n < 1:
            raise ValueError(f"{op}: output_size must be at least 1, got {output_size!r}")
        sizes.append(n)
    return apply_array(ADAPTIVE_AVG_POOL, x, output_size=(sizes[0], sizes[1]))
