"""The concatenation primitive (``concatenate``'s, in :mod:`monadl.dsl.ops.shape`): its kernel, its
joint vjp, its check and shape rule.

Compiled with the engine (its public function, which validates its arguments, stays interpreted
in ``shape``): a recurrent cell joins its input and state on every step, ``[x; h]``, and its
vjp slices the delta back on every step of the backward pass, every input's slice in one call.
"""

from __future__ import annotations

from typing import Any, Final

from monadl.do.primitive import Batching, Primitive
from monadl.dsl.ops.registry import PerArity, declare, not_a_float
from monadl.dsl.ops.shape_rules import Info, promoted
from monadl.typeclasses.backend import ShapeError, concat_arrays


def _concatenate_rule(*xs: Info, axis: int = 0) -> Info:
    shape = list(xs[0][0])
    ax = axis % len(shape)
    shape[ax] = sum(x[0][ax] for x in xs)
    return (tuple(shape), *promoted(*xs))


def _concat_deltas(xp: Any, d: Any, o: Any, *xs: Any, axis: int = 0) -> tuple[Any, ...]:
    """Every input's delta, its slice of ``d`` along the axis: one call for them all (a cell's
    ``[x; h]`` is sliced back on every step of the backward pass)."""
    last = d.ndim - 1
    ax = axis if axis >= 0 else axis + last + 1  # (in range: the op's check)
    deltas = []
    start = 0
    for x in xs:
        stop = start + x.shape[ax]
        if ax == last:  # the commonest: features joined (a cell's [x; h])
            deltas.append(d[..., start:stop])
        else:  # (the trailing ellipsis: the array API indexes every axis)
            deltas.append(d[(*(slice(None),) * ax, slice(start, stop), ...)])
        start = stop
    return tuple(deltas)


def _check_concat(*xs: Any, axis: int = 0) -> None:
    for x in xs:
        not_a_float("concatenate", x)
    shapes = [tuple(x.shape) for x in xs]
    ndim = len(shapes[0])
    if any(len(s) != ndim for s in shapes) or not -ndim <= axis < ndim:
        raise ShapeError(f"concatenate: arrays of shapes {shapes} cannot be joined along axis {axis}")
    ax = axis % ndim
    if any(s[:ax] + s[ax + 1 :] != shapes[0][:ax] + shapes[0][ax + 1 :] for s in shapes):
        raise ShapeError(f"concatenate: arrays of shapes {shapes} differ off axis {axis}")


def _join(xp: Any, *xs: Any, axis: int = 0) -> Any:
    return concat_arrays(xp, xs, axis)


def _concatenate(n: int) -> Primitive:
    """The concatenation of ``n`` arrays (one primitive per arity, as ``stack``'s and ``add_n``'s)."""
    return declare(
        "concatenate",
        _join,
        (),
        check=_check_concat,
        batch=Batching(axis=True, axis_default=0, joins_rows=True),
        shape_rule=_concatenate_rule,
        register=False,
        joint_vjp=_concat_deltas,
    )


CONCATENATE: Final = PerArity("concatenate", _concatenate)
