"""Ops that rearrange an array: ``reshape``, ``transpose``, ``concatenate``, ``split`` and ``stack``.

Each moves or copies elements without arithmetic, and its vjp moves the delta back.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Final

import numpy as np

from monadl.do.primitive import Batching, Primitive, Rule
from monadl.dsl.core.arguments import array_operand, array_operands, as_index, int_param, int_sequence
from monadl.dsl.core.indices import integral
from monadl.dsl.core.layers import AnyArray, ArrayLayer, apply_array
from monadl.dsl.ops.concatenation import CONCATENATE
from monadl.dsl.ops.elementwise import as_layer
from monadl.dsl.ops.operators import WHOLE, key_for, scatter
from monadl.dsl.ops.registry import PerArity, declare, not_a_float
from monadl.dsl.ops.shape_rules import Info, promoted
from monadl.typeclasses.backend import IndexArray, ShapeError, shape_of

__all__ = ["concatenate", "reshape", "split", "stack", "transpose"]


def _reshape_rule(x: Info, shape: tuple[int, ...]) -> Info:
    if -1 in shape:
        known = math.prod(n for n in shape if n != -1)
        shape = tuple(math.prod(x[0]) // known if n == -1 else n for n in shape)
    return shape, x[1], x[2]


def _check_reshape(x: Any, shape: tuple[int, ...]) -> None:
    not_a_float("reshape", x)
    known = math.prod(n for n in shape if n != -1)
    total = math.prod(x.shape)
    # (A -1 among sides of no elements could be any side: NumPy refuses it.)
    unknown = -1 in shape
    if shape.count(-1) > 1 or (not unknown and known != total) or (unknown and (not known or total % known)):
        raise ShapeError(f"reshape: cannot reshape an array of shape {tuple(x.shape)} to {shape}")


RESHAPE: Final = declare(
    "reshape",
    lambda xp, x, shape: xp.reshape(x, shape),
    (lambda xp, d, o, x, shape: xp.reshape(d, x.shape),),
    check=_check_reshape,
    shape_rule=_reshape_rule,
)


def reshape(x: AnyArray, shape: Sequence[int]) -> ArrayLayer:
    """``x`` with a new shape of the same size (one dimension may be -1)."""
    array_operand("reshape", x)
    dims = int_sequence("reshape", "shape", shape)
    # Whether the shape is one at all is known now; whether it fits x's size, when x has run.
    if dims.count(-1) > 1:
        raise ValueError(f"reshape: shape {dims} has more than one -1 (an unknown dimension)")
    if any(n < -1 for n in dims):
        raise ValueError(f"reshape: shape {dims} has a negative dimension (only -1 may be)")
    return apply_array(RESHAPE, x, shape=dims)


def _transpose_rule(x: Info, axes: tuple[int, ...] | None = None) -> Info:
    shape = x[0]
    order = range(len(shape) - 1, -1, -1) if axes is None else axes
    return tuple(shape[a] for a in order), x[1], x[2]


def _axes(x: Any, axes: tuple[int, ...] | None) -> tuple[int, ...]:
    return tuple(reversed(range(x.ndim))) if axes is None else axes


def _inverse(axes: tuple[int, ...]) -> tuple[int, ...]:
    inverse = [0] * len(axes)
    for i, a in enumerate(axes):
        inverse[a] = i
    return tuple(inverse)


def _check_transpose(x: Any, axes: tuple[int, ...] | None) -> None:
    not_a_float("transpose", x)
    n = x.ndim
    if axes is not None and (
        any(not -n <= a < n for a in axes) or sorted(a % n for a in axes) != list(range(n))
    ):
        raise ShapeError(f"transpose: axes {axes} do not fit an array of shape {tuple(x.shape)}")


TRANSPOSE: Final = declare(
    "transpose",
    lambda xp, x, axes=None: xp.permute_dims(x, _axes(x, axes)),
    (lambda xp, d, o, x, axes=None: xp.permute_dims(d, _inverse(_axes(x, axes))),),
    check=_check_transpose,
    shape_rule=_transpose_rule,
)


def transpose(x: AnyArray, axes: Sequence[int] | None = None) -> ArrayLayer:
    """``x`` with its axes permuted (reversed by default)."""
    array_operand("transpose", x)
    return apply_array(TRANSPOSE, x, axes=None if axes is None else int_sequence("transpose", "axes", axes))


def concatenate(xs: Sequence[AnyArray], axis: int = 0) -> ArrayLayer:
    """The arrays joined along an existing ``axis``."""
    operands = array_operands("concatenate", xs)
    return apply_array(CONCATENATE.of(len(operands)), *operands, axis=int_param("concatenate", "axis", axis))


def _split_rule(x: Info, sections: int | tuple[int, ...], piece: int, axis: int = 0) -> Info:
    shape = list(x[0])
    n = shape[axis]
    if isinstance(sections, int):
        shape[axis] = n // sections
    else:
        bounds = (0, *sections, n)
        shape[axis] = len(range(n)[bounds[piece] : bounds[piece + 1]])
    return tuple(shape), x[1], x[2]


def _split_key(x: Any, sections: int | tuple[int, ...], piece: int, axis: int) -> tuple[Any, ...]:
    """The index of piece ``piece`` of ``x`` split along ``axis`` (as ``numpy.split``)."""
    n = x.shape[axis]
    if isinstance(sections, int):
        size = n // sections
        part = slice(piece * size, (piece + 1) * size)
    else:
        bounds = (0, *sections, n)
        part = slice(bounds[piece], bounds[piece + 1])
    if axis >= 0:
        return (*(WHOLE,) * axis, part, Ellipsis)
    return (Ellipsis, part, *(WHOLE,) * (-axis - 1))


def _check_split(x: Any, sections: int | tuple[int, ...], piece: int, axis: int = 0) -> None:
    not_a_float("split", x)
    if not -x.ndim <= axis < x.ndim:
        raise ShapeError(f"split: axis {axis} is out of range for shape {shape_of(x)}")
    n = x.shape[axis]
    if isinstance(sections, int) and n % sections:
        raise ShapeError(f"split: {sections} sections do not divide axis {axis} of length {n}")


# One piece of ``split``: ``sections`` (their number, or the indices they start at) and the piece
# are parameters, so the four gates of an LSTM are four ops, each merged over the cells.
SPLIT: Final = declare(
    "split",
    lambda xp, x, sections, piece, axis=0: x[key_for(xp, _split_key(x, sections, piece, axis), x)],
    (
        lambda xp, d, o, x, sections, piece, axis=0: scatter(
            xp, x, key_for(xp, _split_key(x, sections, piece, axis), x), d
        ),
    ),
    check=_check_split,
    batch=Batching(axis=True, axis_default=0),
    shape_rule=_split_rule,
)


def split(
    x: AnyArray, sections_or_indices: int | Sequence[int] | IndexArray, axis: int = 0
) -> tuple[ArrayLayer, ...]:
    """``x`` cut along ``axis`` into pieces, as ``numpy.split``: an int ``n`` gives ``n`` pieces of
    equal length (``n`` must divide the axis' length), a sequence of indices the pieces between
    them (``[2, 5]``: ``[:2]``, ``[2:5]``, ``[5:]``). Each piece is an op of its own (a slice,
    whose delta is its own in zeros of ``x``'s shape): ``i, f, o, u = split(z, 4, axis=-1)``
    cuts one fused gate matrix of an LSTM into its four gates (in a ``@batchable`` body, whose
    arrays have a leading axis of rows, an axis counted from the end is the same for every call)."""
    array_operand("split", x)
    ax = int_param("split", "axis", axis)
    sections: int | tuple[int, ...]
    try:
        sections = as_index(sections_or_indices)
    except TypeError:
        indices: object = sections_or_indices
        if isinstance(indices, np.ndarray) and indices.ndim == 1 and integral(indices):
            indices = indices.tolist()  # the indices as NumPy computes them (a cumsum)
        if isinstance(indices, (str, bytes)) or not isinstance(indices, Sequence):
            raise TypeError(
                "split: sections_or_indices must be an int or a sequence of ints, "
                f"got {type(indices).__name__} {indices!r}"
            ) from None
        sections = int_sequence("split", "sections_or_indices", indices)
        pieces = len(sections) + 1
    else:
        if sections < 1:
            raise ValueError(f"split: the number of sections must be positive, got {sections}")
        pieces = sections
    layer = as_layer(x, "split")  # one node, read by every piece
    return tuple([apply_array(SPLIT, layer, sections=sections, piece=j, axis=ax) for j in range(pieces)])


def _stack_rule(*xs: Info, axis: int = 0) -> Info:
    shape = list(xs[0][0])
    shape.insert(axis % (len(shape) + 1), len(xs))
    return (tuple(shape), *promoted(*xs))


def _stack_vjp(i: int) -> Rule:
    def vjp(xp: Any, d: Any, o: Any, *xs: Any, axis: int = 0) -> Any:
        return d[(*(WHOLE,) * (axis % d.ndim), i, Ellipsis)]

    return vjp


def _check_stack(*xs: Any, axis: int = 0) -> None:
    for x in xs:
        not_a_float("stack", x)
    shapes = [tuple(x.shape) for x in xs]
    for s in shapes:
        if s != shapes[0]:
            raise ShapeError(f"stack: arrays of shapes {shapes} differ (stacked arrays need one shape)")
    ndim = len(shapes[0]) + 1
    if not -ndim <= axis < ndim:
        raise ShapeError(f"stack: axis {axis} is out of range for stacking arrays of shape {shapes[0]}")


def _stack(n: int) -> Primitive:
    """``n`` arrays of one shape stacked along a new ``axis`` (one primitive per arity, as
    :func:`concatenate`)."""
    return declare(
        "stack",
        lambda xp, *xs, axis=0: xp.stack(xs, axis=axis),
        tuple(_stack_vjp(i) for i in range(n)),
        check=_check_stack,
        # the new axis counts past the rows' axis (a negative one, from the end, is the same);
        # alone, rows of groups are gathered (the steps of a sequence layer)
        batch=Batching(axis=True, axis_default=0, stacks_rows=True),
        shape_rule=_stack_rule,
        register=False,
    )


STACK: Final = PerArity("stack", _stack)


def stack(xs: Sequence[AnyArray], axis: int = 0) -> ArrayLayer:
    """The arrays, all of one shape, joined along a new ``axis`` of the result (as ``numpy.stack``:
    ``stack([a, b], axis=-1)`` has shape ``a.shape + (2,)``)."""
    operands = array_operands("stack", xs)
    return apply_array(STACK.of(len(operands)), *operands, axis=int_param("stack", "axis", axis))
