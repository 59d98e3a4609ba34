"""What shape rules share: the static information of a value and the rules many ops use.

An op's ``shape_rule`` (declared with the op, see :mod:`monadl.dsl.ops.registry`) gives its
result's :data:`Info` from its inputs' and its parameters; :mod:`monadl.dsl.core.shapes` walks a graph
with them. A rule sees its operands already cast as the run casts them; it raises :class:`Mismatch`
for operands that do not broadcast (a library op's ``ShapeError``, in the run's words).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

import numpy as np

Info = tuple[tuple[int, ...], Any, Any]
"""A value's static shape, dtype and array namespace (None for a Python float)."""
ShapeRule = Callable[..., "Info | None"]
"""``rule(*inputs, **params)``: the result's :data:`Info` from the inputs' (each an ``Info``),
or None where it is not known."""

FLOAT: Final[Info] = ((), float, None)
"""A Python float's information."""


class ShapeRuleError(TypeError):
    """A user's shape rule (``custom_op(shape_rule=)``) raised or gave no shape: ``.shape`` and
    ``.dtype`` raise it, naming the op, rather than read the op's shape as unknown."""


class Mismatch(ValueError):
    """Operands whose shapes do not broadcast, found by a rule (:func:`broadcast`): for a library
    op, the run's :class:`~monadl.ShapeError` is raised in its words."""


def promoted(*inputs: Info) -> tuple[Any, Any]:
    """The dtype and namespace of the result of arrays (and floats) combined: NumPy 2's
    ``result_type`` of the arrays' dtypes, a float taking the arrays' (a float alone: float)."""
    dtype: Any = float
    xp: Any = None
    for _, d, x in inputs:
        if x is None:
            continue
        if xp is None:
            dtype, xp = d, x
        elif d != dtype:
            dtype = xp.result_type(dtype, d)
    return dtype, xp


def broadcast(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    """NumPy's broadcast of ``shapes`` (a :class:`Mismatch` where they do not broadcast)."""
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError as e:
        raise Mismatch(str(e)) from None


def elementwise(*inputs: Info, **_: Any) -> Info:
    """The rule of an elementwise op: its operands broadcast and promoted."""
    if len(inputs) == 1:
        return inputs[0]
    dtype, xp = promoted(*inputs)
    return broadcast(*[i[0] for i in inputs]), dtype, xp


def same(x: Info, *rest: Any, **_: Any) -> Info:
    """The rule of an op whose result is its first operand's shape and dtype (a softmax, a norm)."""
    return x


def reduced(x: Info, axis: Any = None, keepdims: bool = False, **_: Any) -> Info:
    """The rule of a reduction over ``axis`` (None: all, a float without ``keepdims``)."""
    if axis is None and not keepdims:
        return FLOAT
    shape = x[0]
    n = len(shape)
    axes = range(n) if axis is None else {a % n for a in (axis if type(axis) is tuple else (axis,))}
    kept = tuple(1 if k in axes else s for k, s in enumerate(shape) if keepdims or k not in axes)
    return kept, x[1], x[2]


def scalar(*_: Any, **__: Any) -> Info:
    """The rule of an op whose result is always a float (a loss reduced)."""
    return FLOAT
