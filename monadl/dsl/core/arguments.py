"""The checks of an op's arguments when the op is made, shared by every module of ops.

The static parameters of an op (axes, shapes, flags) are checked when the op is made, so that a
wrong one is reported at the call that gave it, naming the op; NumPy would only report it when the
op runs, with an error that names neither the op nor the parameter. The operands of an op that only
arrays have (it reads an axis, a shape or rows) are checked then too: a float or a FloatWeight
there would otherwise fail only when the op runs, in the rule's own code, with an error that names
neither the op nor the operand. An operand of a user's own differentiable type (``DeepLearning``)
may be of either kind until it runs: the op's run-time checks report a float there.
"""

from __future__ import annotations

import operator
import reprlib
from collections.abc import Sequence

import numpy as np

from monadl.dsl.core.deep_learning import DeepLearning
from monadl.dsl.core.layers import ArrayOperators, is_float_kind
from monadl.typeclasses.backend import NDARRAY, check_float_array, is_array

__all__ = [
    "array_operand",
    "array_operands",
    "as_index",
    "axis_param",
    "described",
    "flag_param",
    "int_param",
    "int_sequence",
    "operands_of",
]


def as_index(value: object) -> int:
    """``value`` as an int: an int or NumPy integer, not a bool (TypeError otherwise)."""
    if type(value) is int:  # the common case first: ops are made once per node of a batch
        return value
    if isinstance(value, (bool, np.bool_)):
        raise TypeError
    return operator.index(value)  # type: ignore[arg-type]


def int_param(op: str, name: str, value: object) -> int:
    """An int parameter."""
    try:
        return as_index(value)
    except TypeError:
        raise TypeError(f"{op}: {name} must be an int, got {type(value).__name__} {value!r}") from None


def int_sequence(op: str, name: str, values: object) -> tuple[int, ...]:
    """A sequence of ints (a shape, a permutation), as a tuple."""
    if not isinstance(values, (str, bytes)) and isinstance(values, Sequence):
        try:
            return tuple([as_index(v) for v in values])
        except TypeError:
            pass
    raise TypeError(f"{op}: {name} must be a sequence of ints, got {type(values).__name__} {values!r}")


def axis_param(op: str, axis: object) -> int | tuple[int, ...]:
    """An ``axis`` parameter: an int or a tuple of ints."""
    try:
        return tuple([as_index(a) for a in axis]) if type(axis) is tuple else as_index(axis)
    except TypeError:
        raise TypeError(
            f"{op}: axis must be an int or a tuple of ints, got {type(axis).__name__} {axis!r}"
        ) from None


def flag_param(op: str, name: str, value: object) -> bool:
    """A boolean parameter (NumPy's bool included)."""
    if type(value) is bool or type(value) is np.bool_:
        return bool(value)
    raise TypeError(f"{op}: {name} must be a bool, got {type(value).__name__} {value!r}")


def described(x: object) -> str:
    """``x`` for an error message: its type and a short repr (a weight's repr names its type; a
    layer's would be an address, so its type alone)."""
    if type(x).__repr__ is object.__repr__:
        return type(x).__name__
    shown = reprlib.repr(x)
    return shown if shown.startswith(type(x).__name__) else f"{type(x).__name__} {shown}"


def array_operand(op: str, x: object, name: str = "") -> None:
    """Raises a TypeError naming ``op`` (and the operand's ``name``, for an op of several) unless
    ``x`` may be an array operand: an array layer or weight, a floating-point array, or a user's
    own differentiable value. An array of another dtype (integers,
    booleans) is a TypeError naming ``op``: the op's primitive may have another name (``conv2d``'s
    is ``conv``)."""
    if type(x) is NDARRAY:  # the common case first
        if x.dtype.kind != "f":
            check_float_array(x, op)
        return
    if isinstance(x, ArrayOperators):
        return
    if not is_float_kind(x) and is_array(x):
        check_float_array(x, op)
        return
    if not is_float_kind(x) and isinstance(x, DeepLearning):
        return
    operand = f" for {name}" if name else ""
    raise TypeError(
        f"{op}: expected an array layer, array weight or floating-point array{operand}, got {described(x)}"
    )


def operands_of(op: str, xs: object) -> Sequence[object]:
    """The operands of an op of a sequence of them (a list or a tuple: a single array, which is
    no sequence of operands, is not taken for one)."""
    if isinstance(xs, (list, tuple)):
        return xs
    raise TypeError(f"{op}: expected a list or a tuple of operands, got {described(xs)}")


def array_operands(op: str, xs: object) -> Sequence[object]:
    """The operands of an op of a non-empty sequence of arrays, each checked to be one."""
    operands = operands_of(op, xs)
    if not operands:
        raise ValueError(f"{op}: needs at least one array")
    for i, x in enumerate(operands):
        if not isinstance(x, ArrayOperators):  # a layer's or weight's is fine: no name to make
            array_operand(op, x, f"xs[{i}]")
    return operands
