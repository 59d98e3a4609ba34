"""Padding: :func:`pad`, as PyTorch's ``torch.nn.functional.pad``.

``pad(x, (left, right, top, bottom, ...), mode)`` pads ``x``'s last axes, the last axis first (as
PyTorch's pad tuple reads): its first two numbers pad the last axis, the next two the one before,
and so on. Modes: ``"constant"`` (``value`` on every side; a negative number crops that side),
``"reflect"`` (the input mirrored about its edge element, which is not repeated), ``"replicate"``
(the edge element repeated) and ``"circular"`` (the input wrapped around). Every mode pads any
number of trailing axes of an input of any rank (PyTorch's reflect, replicate and circular modes
take 1 to 3 axes of inputs of particular ranks only).

One primitive; a mode other than ``constant`` pads one axis after another by slices, flips and one
concatenation each, and its vjp adds the padding's deltas back into the input's edge slices, axis
by axis in reverse, so the code is array-API only (no ``np.pad``, no scatter-add) and runs on NumPy,
CuPy and array-api-strict. Under dynamic batching the calls' inputs are stacked along a new leading
axis, which no pad reaches.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Final, Literal

from monadl.do.primitive import Batching
from monadl.dsl.core.arguments import array_operand, as_index
from monadl.dsl.core.layers import AnyArray, ArrayLayer, apply_array
from monadl.dsl.ops.registry import declare
from monadl.dsl.ops.shape_rules import Info
from monadl.typeclasses.backend import ShapeError, on_device, shape_of

__all__ = ["PadMode", "pad"]

PadMode = Literal["constant", "reflect", "replicate", "circular"]
"""How :func:`pad` fills the padding."""

_MODES: Final = ("constant", "reflect", "replicate", "circular")

Widths = tuple[tuple[int, int], ...]
"""The (before, after) widths of the padded axes, the first padded axis first (the reverse of
PyTorch's pad tuple, whose first pair is the last axis's)."""


def _at(axis: int, part: slice) -> tuple[Any, ...]:
    """The key that takes ``part`` of ``axis`` and every element of the other axes."""
    return (*(slice(None),) * axis, part, Ellipsis)


def _first(ndim: int, widths: Widths) -> int:
    """The first padded axis of an array of ``ndim`` axes."""
    return ndim - len(widths)


# ----------------------------------------------------------------------------------- constant


def _kept(n: int, lo: int, hi: int) -> tuple[slice, slice]:
    """The input's slice that a constant pad keeps along one axis (a negative width crops), and
    where it lands in the output."""
    start, stop = max(-lo, 0), n - max(-hi, 0)
    at = max(lo, 0)
    return slice(start, stop), slice(at, at + stop - start)


def _constant_forward(xp: Any, x: Any, widths: Widths, value: float) -> Any:
    first = _first(x.ndim, widths)
    sides = x.shape[first:]
    shape = (*x.shape[:first], *(n + lo + hi for n, (lo, hi) in zip(sides, widths, strict=True)))
    out = xp.full(shape, value, dtype=x.dtype, **on_device(xp, x))
    kept = [_kept(n, lo, hi) for n, (lo, hi) in zip(sides, widths, strict=True)]
    source = (..., *(k[0] for k in kept))
    target = (..., *(k[1] for k in kept))
    out[target] = x[source]
    return out


def _constant_vjp(xp: Any, d: Any, o: Any, x: Any, widths: Widths, value: float) -> Any:
    first = _first(x.ndim, widths)
    kept = [_kept(n, lo, hi) for n, (lo, hi) in zip(x.shape[first:], widths, strict=True)]
    target = (..., *(k[1] for k in kept))
    if all(lo >= 0 and hi >= 0 for lo, hi in widths):  # nothing cropped: the delta's middle
        return d[target]
    g = xp.zeros(tuple(x.shape), dtype=d.dtype, **on_device(xp, d))
    g[(..., *(k[0] for k in kept))] = d[target]
    return g


# ------------------------------------------------------------------------- the other modes


def _pad_axis(xp: Any, x: Any, axis: int, lo: int, hi: int, mode: str) -> Any:
    """``x`` padded along ``axis`` by ``lo`` before and ``hi`` after (both at least 0)."""
    if lo == 0 and hi == 0:
        return x
    n = x.shape[axis]
    if mode == "reflect":
        before = xp.flip(x[_at(axis, slice(1, lo + 1))], axis=axis)
        after = xp.flip(x[_at(axis, slice(n - 1 - hi, n - 1))], axis=axis)
    elif mode == "replicate":
        edge = list(x.shape)
        edge[axis] = lo
        before = xp.broadcast_to(x[_at(axis, slice(0, 1))], tuple(edge))
        edge[axis] = hi
        after = xp.broadcast_to(x[_at(axis, slice(n - 1, n))], tuple(edge))
    else:  # circular
        before = x[_at(axis, slice(n - lo, n))]
        after = x[_at(axis, slice(0, hi))]
    return xp.concat([before, x, after], axis=axis)


def _unpad_axis(xp: Any, d: Any, axis: int, n: int, lo: int, hi: int, mode: str) -> Any:
    """The delta of :func:`_pad_axis`'s input (``n`` long along ``axis``), given its output's."""
    if lo == 0 and hi == 0:
        return d
    g = xp.asarray(d[_at(axis, slice(lo, lo + n))], copy=True)
    before = d[_at(axis, slice(0, lo))]
    after = d[_at(axis, slice(lo + n, lo + n + hi))]
    if mode == "reflect":
        g[_at(axis, slice(1, lo + 1))] += xp.flip(before, axis=axis)
        g[_at(axis, slice(n - 1 - hi, n - 1))] += xp.flip(after, axis=axis)
    elif mode == "replicate":
        if lo:
            g[_at(axis, slice(0, 1))] += xp.sum(before, axis=axis, keepdims=True)
        if hi:
            g[_at(axis, slice(n - 1, n))] += xp.sum(after, axis=axis, keepdims=True)
    else:  # circular
        g[_at(axis, slice(n - lo, n))] += before
        g[_at(axis, slice(0, hi))] += after
    return g


def _filled(widths: Widths, mode: str) -> bool:
    """Whether the padding is a fill (a constant, or no padding at all: a copy)."""
    return mode == "constant" or not any(lo or hi for lo, hi in widths)


def _forward(xp: Any, x: Any, widths: Widths, mode: str, value: float) -> Any:
    if _filled(widths, mode):
        return _constant_forward(xp, x, widths, value)
    first = _first(x.ndim, widths)
    for k, (lo, hi) in enumerate(widths):
        x = _pad_axis(xp, x, first + k, lo, hi, mode)
    return x


def _vjp(xp: Any, d: Any, o: Any, x: Any, widths: Widths, mode: str, value: float) -> Any:
    if _filled(widths, mode):
        return _constant_vjp(xp, d, o, x, widths, value)
    first = _first(x.ndim, widths)
    for k in reversed(range(len(widths))):
        lo, hi = widths[k]
        d = _unpad_axis(xp, d, first + k, x.shape[first + k], lo, hi, mode)
    return d


# ----------------------------------------------------------------------------- checks, shapes


def _sizes(shape: Sequence[int], widths: Widths) -> tuple[int, ...]:
    first = len(shape) - len(widths)
    return (*shape[:first], *(n + lo + hi for n, (lo, hi) in zip(shape[first:], widths, strict=True)))


def _check(x: Any, widths: Widths, mode: str, value: float) -> None:
    if type(x) is float or x.ndim < len(widths):
        raise ShapeError(
            f"pad: padding {2 * len(widths)} numbers (the last {len(widths)} axes) needs an array of "
            f"{len(widths)} axes at least, got {shape_of(x)}"
        )
    first = _first(x.ndim, widths)
    for k, (lo, hi) in enumerate(widths):
        axis = first + k
        n = x.shape[axis]
        where = f"axis {axis} of an input of shape {tuple(x.shape)}"
        if mode == "constant":
            if n + min(lo, 0) + min(hi, 0) < 0:
                raise ShapeError(f"pad: widths ({lo}, {hi}) crop more than the {n} elements of {where}")
        elif mode == "reflect" and (lo >= n or hi >= n):
            raise ShapeError(
                f"pad: reflect widths ({lo}, {hi}) must be less than the {n} elements of {where}"
            )
        elif mode == "circular" and (lo > n or hi > n):
            raise ShapeError(f"pad: circular widths ({lo}, {hi}) exceed the {n} elements of {where}")
        elif mode == "replicate" and n == 0 and (lo or hi):
            raise ShapeError(f"pad: replicate has no element to repeat along {where}")


def _shape(x: Info, widths: Widths, **_: Any) -> Info:
    return _sizes(x[0], widths), x[1], x[2]


def _cost(x: Any, widths: Widths, **_: Any) -> float:
    return float(math.prod(_sizes(tuple(x.shape), widths)))


PAD: Final = declare(
    "pad",
    _forward,
    (_vjp,),
    cost=_cost,
    check=_check,
    batch=Batching(),  # the calls' inputs stacked on a new leading axis, which no pad reaches
    shape_rule=_shape,
)
"""Padding of ``x``'s last axes by ``widths`` (the first padded axis first), in ``mode``."""


def pad(x: AnyArray, pad: Sequence[int], mode: PadMode = "constant", value: float = 0.0) -> ArrayLayer:
    """``x`` padded as PyTorch's ``torch.nn.functional.pad``: ``pad`` holds a (before, after) pair
    of widths per padded axis, the last axis first: ``(left, right)`` pads the last axis, ``(left,
    right, top, bottom)`` the last two. ``mode``: ``"constant"`` fills with ``value`` (a negative
    width crops that side instead); ``"reflect"`` mirrors the input about its edge element (widths
    less than the axis); ``"replicate"`` repeats the edge element; ``"circular"`` wraps the input
    around (widths up to the axis). Any number of trailing axes of an input of any rank may be
    padded, in every mode; the delta of a padded element goes to the element it copies."""
    op = "pad"
    array_operand(op, x, "x")
    if isinstance(pad, (str, bytes)) or not isinstance(pad, Sequence):
        raise TypeError(f"{op}: pad must be a sequence of ints, got {type(pad).__name__} {pad!r}")
    try:
        numbers = [as_index(p) for p in pad]
    except TypeError:
        raise TypeError(f"{op}: pad must be a sequence of ints, got {pad!r}") from None
    if len(numbers) % 2:
        raise ValueError(f"{op}: pad must hold pairs of widths (before, after), got {len(numbers)}: {pad!r}")
    if mode not in _MODES:
        raise ValueError(f"{op}: mode must be one of {', '.join(_MODES)}, got {mode!r}")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{op}: value must be a float, got {type(value).__name__} {value!r}")
    if mode != "constant":
        if value != 0.0:
            raise ValueError(f"{op}: mode {mode!r} takes no value (it fills from the input), got {value!r}")
        if any(p < 0 for p in numbers):
            raise ValueError(f"{op}: mode {mode!r} takes no negative width, got {tuple(numbers)}")
    pairs = [(numbers[k], numbers[k + 1]) for k in range(0, len(numbers), 2)]
    widths = tuple(reversed(pairs))
    return apply_array(PAD, x, widths=widths, mode=mode, value=float(value))
