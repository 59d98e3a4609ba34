"""Elementwise functions of floats and arrays: ``exp``, ``log``, ``sqrt``, ``abs``, ``maximum``,
``minimum``, the n-ary sum ``add_n``, and ``lift`` (a value as a layer of its kind).

Each accepts any mix of literal, weight and layer, and keeps the operand's kind:
``exp(float-like) -> FloatLayer``, ``exp(array-like) -> ArrayLayer``. (The operators' ops are in
``monadl.dsl.ops.operators``; the activations in ``monadl.dsl.ops.activations``.)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final, cast, overload

from monadl.do.primitive import Primitive
from monadl.do.primitive import add_n as engine_add_n
from monadl.dsl.core.apply import forward_of
from monadl.dsl.core.arguments import described, operands_of
from monadl.dsl.core.layers import AnyArray, AnyFloat, ArrayLayer, FloatLayer, apply, is_float_kind
from monadl.dsl.ops.operators import elementwise_op
from monadl.dsl.ops.registry import PerArity
from monadl.dsl.ops.shape_rules import elementwise

__all__ = ["abs", "add_n", "exp", "lift", "lift_array", "lift_float", "log", "maximum", "minimum", "sqrt"]


@overload
def lift(x: AnyFloat) -> FloatLayer: ...
@overload
def lift(x: AnyArray) -> ArrayLayer: ...
def lift(x: AnyFloat | AnyArray) -> FloatLayer | ArrayLayer:
    """``x`` as a layer of its kind: a float-like (a float, a ``FloatWeight``, a ``FloatLayer``)
    gives a ``FloatLayer``, an array-like an ``ArrayLayer`` (a layer is returned as it is). Use it
    on a raw-array operand where mypy cannot pick an operator of a union that includes ``ndarray``
    (``ndarray * ndarray`` is an ndarray, not a layer), and on what :data:`~monadl.AnyLayer` gives
    for a weight, for ``predict`` and ``train``. :func:`lift_float` and :func:`lift_array` take
    one kind only."""
    return as_layer(x, "lift")


def as_layer(x: object, op: str) -> FloatLayer | ArrayLayer:
    """``x`` as a layer of its kind (a layer as it is); ``op`` names the caller in errors."""
    if isinstance(x, (FloatLayer, ArrayLayer)):
        return x
    forward = forward_of(x, op)
    return FloatLayer(forward) if is_float_kind(x) else ArrayLayer(forward)


def lift_float(x: AnyFloat) -> FloatLayer:
    """``x``, a float, a ``FloatWeight`` or a ``FloatLayer``, as a ``FloatLayer``. Anything else is
    a TypeError (an array-like; a user's own ``DeepLearning`` value, whose kind is known only when
    it runs: :func:`lift` takes it)."""
    if type(x) is FloatLayer:
        return x
    if not is_float_kind(x):  # an array; or a user's own value, whose kind is known when it runs
        raise TypeError(f"lift_float: expected a float, float weight or float layer, got {described(x)}")
    return FloatLayer(forward_of(x, "lift_float"))


def lift_array(x: AnyArray) -> ArrayLayer:
    """``x``, an array, an ``ArrayWeight`` or an ``ArrayLayer``, as an ``ArrayLayer``: its type
    takes array-likes only (:func:`lift_float` lifts a float-like, :func:`lift` either kind). At run
    time a float-like gives a ``FloatLayer``, which untyped code may rely on."""
    # (cast: a float-like, which the type rules out, gives a FloatLayer)
    return cast(ArrayLayer, as_layer(x, "lift_array"))


EXP: Final = elementwise_op("exp", lambda xp, x: xp.exp(x), (lambda xp, d, o, x: d * o,))


@overload
def exp(x: AnyFloat) -> FloatLayer: ...
@overload
def exp(x: AnyArray) -> ArrayLayer: ...
def exp(x: AnyFloat | AnyArray) -> FloatLayer | ArrayLayer:
    """Elementwise ``e ** x``."""
    return apply(EXP, x)


LOG: Final = elementwise_op("log", lambda xp, x: xp.log(x), (lambda xp, d, o, x: d / x,))


@overload
def log(x: AnyFloat) -> FloatLayer: ...
@overload
def log(x: AnyArray) -> ArrayLayer: ...
def log(x: AnyFloat | AnyArray) -> FloatLayer | ArrayLayer:
    """Elementwise natural logarithm."""
    return apply(LOG, x)


SQRT: Final = elementwise_op("sqrt", lambda xp, x: xp.sqrt(x), (lambda xp, d, o, x: d * 0.5 / o,))


@overload
def sqrt(x: AnyFloat) -> FloatLayer: ...
@overload
def sqrt(x: AnyArray) -> ArrayLayer: ...
def sqrt(x: AnyFloat | AnyArray) -> FloatLayer | ArrayLayer:
    """Elementwise square root."""
    return apply(SQRT, x)


ABS: Final = elementwise_op("abs", lambda xp, x: xp.abs(x), (lambda xp, d, o, x: d * xp.sign(x),))


@overload
def abs(x: AnyFloat) -> FloatLayer: ...
@overload
def abs(x: AnyArray) -> ArrayLayer: ...
def abs(x: AnyFloat | AnyArray) -> FloatLayer | ArrayLayer:
    """Elementwise absolute value (its derivative at 0 is taken as 0)."""
    return apply(ABS, x)


MAXIMUM: Final = elementwise_op(
    "maximum",
    lambda xp, a, b: xp.maximum(a, b),
    (lambda xp, d, o, a, b: xp.where(a >= b, d, 0.0), lambda xp, d, o, a, b: xp.where(a >= b, 0.0, d)),
    True,
)


@overload
def maximum(a: AnyFloat, b: AnyFloat) -> FloatLayer: ...
@overload
def maximum(a: AnyArray, b: AnyFloat | AnyArray) -> ArrayLayer: ...
@overload
def maximum(a: AnyFloat, b: AnyArray) -> ArrayLayer: ...
def maximum(a: AnyFloat | AnyArray, b: AnyFloat | AnyArray) -> FloatLayer | ArrayLayer:
    """Elementwise maximum of two operands (a layer or a constant); ties send the delta to ``a``."""
    return apply(MAXIMUM, a, b)


MINIMUM: Final = elementwise_op(
    "minimum",
    lambda xp, a, b: xp.minimum(a, b),
    (lambda xp, d, o, a, b: xp.where(a <= b, d, 0.0), lambda xp, d, o, a, b: xp.where(a <= b, 0.0, d)),
    True,
)


@overload
def minimum(a: AnyFloat, b: AnyFloat) -> FloatLayer: ...
@overload
def minimum(a: AnyArray, b: AnyFloat | AnyArray) -> ArrayLayer: ...
@overload
def minimum(a: AnyFloat, b: AnyArray) -> ArrayLayer: ...
def minimum(a: AnyFloat | AnyArray, b: AnyFloat | AnyArray) -> FloatLayer | ArrayLayer:
    """Elementwise minimum of two operands; ties send the delta to ``a``."""
    return apply(MINIMUM, a, b)


def _add_n(n: int) -> Primitive:
    # the engine's own sum (its merged groups' partial sums are ``add_n`` too), given its shape rule
    prim = engine_add_n(n)
    prim.shape_rule = elementwise
    return prim


ADD_N: Final = PerArity("add_n", _add_n)


@overload
def add_n(xs: Sequence[AnyFloat]) -> FloatLayer: ...
@overload
def add_n(xs: Sequence[AnyArray]) -> ArrayLayer: ...
def add_n(xs: Sequence[AnyFloat] | Sequence[AnyArray]) -> FloatLayer | ArrayLayer:
    """The sum of ``xs`` as one op (DyNet's ``esum``): a loss summed over many terms is one kernel,
    not a chain of additions that must run one after another."""
    operands = operands_of("add_n", xs)
    if not operands:
        raise ValueError("add_n: needs at least one operand")
    if len(operands) == 1:
        return as_layer(operands[0], "add_n")
    return apply(ADD_N.of(len(operands)), *operands)
