"""Flattening: :func:`flatten`, as PyTorch's ``torch.flatten``.

``flatten(x, start_dim, end_dim)`` joins the axes ``start_dim`` to ``end_dim`` (both included,
negative ones counted from the end) into one. A reshape whose target is worked out from the
input's shape when the op runs, so the op needs no static shape. The two axes are the op's
``axis`` parameter, ``(start, end)``: under dynamic batching the calls' inputs are stacked along a
new leading axis and an axis counted from the front is counted past it (``Batching(axis=True)``),
so each row is flattened as its call would be; a ``@batchable`` body, which runs once on the
calls' stacked rows, is refused where it flattens from the front (it would join the rows), and
runs where it counts from the end (``flatten(x, -3)`` of (C, H, W)).
"""

from __future__ import annotations

import math
from typing import Any, Final

from monadl.do.primitive import Batching
from monadl.dsl.core.arguments import array_operand, int_param
from monadl.dsl.core.layers import AnyArray, ArrayLayer, apply_array
from monadl.dsl.ops.registry import declare
from monadl.dsl.ops.shape_rules import Info
from monadl.typeclasses.backend import ShapeError, shape_of

__all__ = ["flatten"]


def _bounds(rank: int, start: int, end: int) -> tuple[int, int] | None:
    """``start`` and ``end`` as axes of an array of ``rank`` axes (a 0-d array counts as one
    axis, as in PyTorch), or None where they are not axes of it or ``end`` comes first."""
    n = max(rank, 1)
    s, e = start + n if start < 0 else start, end + n if end < 0 else end
    if not (0 <= s < n and 0 <= e < n) or s > e:
        return None
    return s, e


def flattened(shape: tuple[int, ...], start: int, end: int) -> tuple[int, ...]:
    """The shape of ``flatten`` of an array of ``shape`` (a ValueError where the axes are not)."""
    bounds = _bounds(len(shape), start, end)
    if bounds is None:
        raise ValueError(f"flatten: start_dim {start} and end_dim {end} are not axes of shape {shape}")
    s, e = bounds
    if not shape:
        return (1,)
    return (*shape[:s], math.prod(shape[s : e + 1]), *shape[e + 1 :])


def _forward(xp: Any, x: Any, axis: tuple[int, int]) -> Any:
    return xp.reshape(x, flattened(tuple(x.shape), *axis))


def _stacked_forward(xp: Any, x: Any, axis: tuple[int, int]) -> Any:
    """Merged calls (``axis`` already counted past the rows' axis): each row flattened as its call
    would flatten it. Rows of 0-d arrays (a vector of them) each become (1,)."""
    if x.ndim == 1:
        return xp.reshape(x, (x.shape[0], 1))
    return _forward(xp, x, axis)


def _vjp(xp: Any, d: Any, o: Any, x: Any, axis: tuple[int, int]) -> Any:
    return xp.reshape(d, tuple(x.shape))


def _check(x: Any, axis: tuple[int, int]) -> None:
    start, end = axis
    if type(x) is float:
        raise ShapeError("flatten: needs an array, got a float")
    if _bounds(x.ndim, start, end) is None:
        raise ShapeError(
            f"flatten: start_dim {start} and end_dim {end} are not axes of an array of shape "
            f"{shape_of(x)} in order (start_dim first)"
        )


def _shape(x: Info, axis: tuple[int, int]) -> Info:
    return flattened(x[0], *axis), x[1], x[2]


FLATTEN: Final = declare(
    "flatten",
    _forward,
    (_vjp,),
    cost=lambda *_, **__: 1.0,  # a view: no work worth a pool's thread
    check=_check,
    batch=Batching(axis=True, forward=_stacked_forward, vjps=(_vjp,)),
    shape_rule=_shape,
)
"""The axes ``axis = (start, end)`` of ``x`` joined into one."""


def flatten(x: AnyArray, start_dim: int = 0, end_dim: int = -1) -> ArrayLayer:
    """``x`` with its axes ``start_dim`` to ``end_dim`` (both included; negative ones counted from
    the end) joined into one, as PyTorch's ``torch.flatten``: ``flatten(x)`` of any shape is a
    vector, ``flatten(x, 1)`` of (N, C, H, W) is (N, C * H * W), and a 0-d ``x`` becomes (1,)."""
    op = "flatten"
    array_operand(op, x, "x")
    axis = (int_param(op, "start_dim", start_dim), int_param(op, "end_dim", end_dim))
    return apply_array(FLATTEN, x, axis=axis)
