"""Differentiable ops of your own: a forward and one vector-Jacobian product per input (as PyTorch's
``autograd.Function`` or JAX's ``custom_vjp``).

::

    softplus = ml.custom_op(
        "softplus",
        forward=lambda xp, x: xp.log1p(xp.exp(x)),
        vjps=(lambda xp, d, out, x: d * (1.0 - xp.exp(-out)),),
        elementwise=True,
    )
    y = softplus(layer)  # an ArrayLayer, differentiable, batched with other softplus calls

``forward(xp, *inputs, **params)`` gets the inputs' values (NumPy arrays, or another array API
namespace's: ``xp`` is it; Python floats for float inputs) and returns the output. Input ``i``'s vjp,
``vjps[i](xp, d, out, *inputs, **params)``, gets the output's delta ``d`` and the output ``out``, and
returns that input's delta: an array of the input's shape (or, with ``broadcasts=True``, of a shape
that broadcasts to it: it is summed back), a float for a float input. A delta of another shape or
type is a ``ShapeError`` naming the op and the input, and the step changes nothing.

Keyword parameters (``params``) are static: they must be hashable, and two calls merge (dynamic
batching) only with equal ones. ``elementwise=True`` declares the op elementwise, so that calls of
equal shapes merge into one call on stacked rows; other ops run one call at a time.

:func:`monadl.check_gradients` compares an op's vjps with finite differences: test yours with it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar, overload

from monadl.do.primitive import Batching, Primitive
from monadl.dsl.layers import AnyArray, AnyFloat, ArrayLayer, FloatLayer, apply_array, apply_float

L = TypeVar("L", ArrayLayer, FloatLayer)

Rule = Callable[..., Any]
"""A forward, ``(xp, *inputs, **params) -> output``, or a vjp, ``(xp, d, out, *inputs, **params)``."""


class CustomOp(Generic[L]):
    """A differentiable op of your own (see the module); calling it applies it to layers, weights,
    arrays or floats."""

    def __init__(self, primitive: Primitive, result: type[L]) -> None:
        self.primitive = primitive
        self.result: type[L] = result

    def __call__(self, *operands: AnyFloat | AnyArray, **params: Any) -> L:
        """The op applied to ``operands``: layers, weights, arrays or floats (a layer of the op's
        result type)."""
        if len(operands) != len(self.primitive.vjps):
            raise TypeError(
                f"{self.primitive.name}: takes {len(self.primitive.vjps)} operands (one per vjp), "
                f"got {len(operands)}"
            )
        if self.result is FloatLayer:
            return apply_float(self.primitive, *operands, **params)
        return apply_array(self.primitive, *operands, **params)

    def __repr__(self) -> str:
        return f"custom_op({self.primitive.name!r})"


@overload
def custom_op(
    name: str,
    forward: Rule,
    vjps: tuple[Rule, ...],
    *,
    result: type[FloatLayer],
    broadcasts: bool = False,
    elementwise: bool = False,
) -> CustomOp[FloatLayer]: ...
@overload
def custom_op(
    name: str,
    forward: Rule,
    vjps: tuple[Rule, ...],
    *,
    result: type[ArrayLayer] = ArrayLayer,
    broadcasts: bool = False,
    elementwise: bool = False,
) -> CustomOp[ArrayLayer]: ...
def custom_op(
    name: str,
    forward: Rule,
    vjps: tuple[Rule, ...],
    *,
    result: type[ArrayLayer] | type[FloatLayer] = ArrayLayer,
    broadcasts: bool = False,
    elementwise: bool = False,
) -> CustomOp[ArrayLayer] | CustomOp[FloatLayer]:
    """A differentiable op named ``name`` (errors name it): ``forward``, one vjp per input, and its
    result's layer type (``ArrayLayer``, or ``FloatLayer`` for an op of floats giving a float)."""
    if not isinstance(name, str) or not name:
        raise TypeError(f"custom_op: name must be a non-empty str, got {name!r}")
    if not callable(forward):
        raise TypeError(f"custom_op {name}: forward must be callable, got {type(forward).__name__}")
    if not isinstance(vjps, tuple) or not vjps or not all(callable(v) for v in vjps):
        raise TypeError(f"custom_op {name}: vjps must be a non-empty tuple of callables, one per input")
    if result is not ArrayLayer and result is not FloatLayer:
        raise TypeError(f"custom_op {name}: result must be ArrayLayer or FloatLayer, got {result!r}")
    batch = Batching(elementwise=True, scalar="inputs") if elementwise else None
    primitive = Primitive(name, forward, vjps, broadcasts or elementwise, batch=batch)
    if result is FloatLayer:
        return CustomOp(primitive, FloatLayer)
    return CustomOp(primitive, ArrayLayer)
