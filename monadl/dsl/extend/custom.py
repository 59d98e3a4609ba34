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

A layer's ``.shape`` and ``.dtype`` are known before it runs where each of its ops has a shape
rule. Give yours with ``shape_rule=``: ``shape_rule(*shapes, **params)`` gets the operands' static
shapes (tuples; ``()`` for a float) and the call's parameters, and returns the result's shape, a
tuple of ints; the result's dtype is the operands' promoted, as an elementwise op's::

    outer = ml.custom_op(
        "outer",
        forward=lambda xp, a, b: a[:, None] * b[None, :],
        vjps=(lambda xp, d, out, a, b: d @ b, lambda xp, d, out, a, b: a @ d),
        shape_rule=lambda a, b: (*a, *b),
    )
    outer(np.ones(3), np.ones(4)).shape  # (3, 4), before it runs

Without one, an ``ArrayLayer`` op's ``.shape`` and ``.dtype`` (and those of the layers built on
it) are None. A ``FloatLayer`` op needs none: its result is a float, of shape ``()``. A rule that raises,
or returns anything but a tuple of ints, makes ``.shape`` raise :class:`ShapeRuleError` (a
``TypeError``) naming the op and the operands' shapes. The rule is not asked while the op runs.

An op that behaves by the run it is part of (noise or a mask in training only, a buffer it
updates) declares ``context=True``: its forward then also receives the run's
:class:`~monadl.do.context.RunContext` as the keyword argument ``ctx`` (its vjps do not), and
reads it instead of any state of the calling thread, since its kernel may run on the executor's
workers: ``ctx.training`` (a training step's forward pass, or a prediction),
``ctx.generator(owner)`` (the random generator of ``owner``, an object with a ``generator``, such
as a :class:`~monadl.nn.GeneratorBuffer` holder: draw from it, so a checkpoint saves its state),
and ``ctx.stage(buffer, value)`` / ``ctx.update(buffer, rule)`` (a buffer's new value, committed
with the step's weights, dropped if it fails)::

    class Noise:  # an owner of a random stream (a module's generator is saved by checkpoints)
        def __init__(self) -> None:
            self.generator = ml.GeneratorBuffer(0)

    noise = Noise()
    add_noise = ml.custom_op(
        "add_noise",
        forward=lambda xp, x, *, ctx: (
            x + ctx.generator(noise).standard_normal(x.shape) if ctx.training else x
        ),
        vjps=(lambda xp, d, out, x: d,),
        context=True,
    )

A context op's calls never merge (each is its own draw); ``elementwise=True`` then only says its
vjps' results are summed back to their inputs' shapes.

:func:`monadl.check_gradients` compares an op's vjps with finite differences: test yours with it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar, overload

import numpy as np

from monadl.do.primitive import Batching, Primitive
from monadl.dsl.core.layers import AnyArray, AnyFloat, ArrayLayer, FloatLayer, apply_array, apply_float
from monadl.dsl.ops.shape_rules import FLOAT, Info, ShapeRuleError, promoted

__all__ = ["CustomOp", "ShapeRule", "ShapeRuleError", "custom_op"]

L = TypeVar("L", ArrayLayer, FloatLayer)

Rule = Callable[..., Any]
"""A forward, ``(xp, *inputs, **params) -> output``, or a vjp, ``(xp, d, out, *inputs, **params)``."""

ShapeRule = Callable[..., tuple[int, ...]]
"""``shape_rule(*shapes, **params) -> shape``: the result's shape from the operands' static shapes
(``()`` for a float) and the call's parameters."""


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
    context: bool = False,
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
    shape_rule: ShapeRule | None = None,
    context: bool = False,
) -> CustomOp[ArrayLayer]: ...
def custom_op(
    name: str,
    forward: Rule,
    vjps: tuple[Rule, ...],
    *,
    result: type[ArrayLayer] | type[FloatLayer] = ArrayLayer,
    broadcasts: bool = False,
    elementwise: bool = False,
    shape_rule: ShapeRule | None = None,
    context: bool = False,
) -> CustomOp[ArrayLayer] | CustomOp[FloatLayer]:
    """A differentiable op named ``name`` (errors name it): ``forward``, one vjp per input, and its
    result's layer type (``ArrayLayer``, or ``FloatLayer`` for an op of floats giving a float).
    ``shape_rule``, for an ``ArrayLayer`` op: ``shape_rule(*shapes, **params)``, the result's shape
    from the operands' (tuples) and the parameters, which gives its layers a static ``.shape`` and
    ``.dtype`` (the operands' promoted). ``context=True``: ``forward`` also receives the run's
    :class:`~monadl.do.context.RunContext` as ``ctx`` (its mode, random generators and staged
    buffer updates), and calls do not merge; see the module."""
    if not isinstance(name, str) or not name:
        raise TypeError(f"custom_op: name must be a non-empty str, got {name!r}")
    if not callable(forward):
        raise TypeError(f"custom_op {name}: forward must be callable, got {type(forward).__name__}")
    if not isinstance(vjps, tuple) or not vjps or not all(callable(v) for v in vjps):
        raise TypeError(f"custom_op {name}: vjps must be a non-empty tuple of callables, one per input")
    if result is not ArrayLayer and result is not FloatLayer:
        raise TypeError(f"custom_op {name}: result must be ArrayLayer or FloatLayer, got {result!r}")
    if shape_rule is not None and not callable(shape_rule):
        raise TypeError(
            f"custom_op {name}: shape_rule must be callable or None, got {type(shape_rule).__name__}"
        )
    if shape_rule is not None and result is FloatLayer:
        raise TypeError(f"custom_op {name}: shape_rule is for ArrayLayer ops (a FloatLayer's shape is ())")
    if not isinstance(context, bool):
        raise TypeError(f"custom_op {name}: context must be a bool, got {type(context).__name__}")
    batch = Batching(elementwise=True, scalar="inputs") if elementwise and not context else None
    primitive = Primitive(name, forward, vjps, broadcasts or elementwise, batch=batch, context=context)
    if result is FloatLayer:
        primitive.shape_rule = _float_info
        return CustomOp(primitive, FloatLayer)
    if shape_rule is not None:
        primitive.shape_rule = _InfoRule(name, shape_rule)
    return CustomOp(primitive, ArrayLayer)


def _float_info(*_: Info, **__: Any) -> Info:
    return FLOAT


class _InfoRule:
    """A user's rule of shapes as a rule of static information (``monadl.dsl.core.shapes``): the shape
    checked, the dtype and namespace the operands' promoted."""

    def __init__(self, name: str, rule: ShapeRule) -> None:
        self.name = name
        self.rule = rule

    def __call__(self, *inputs: Info, **params: Any) -> Info | None:
        shapes = tuple(shape for shape, _, _ in inputs)
        listed = ", ".join(str(s) for s in shapes)
        try:
            shape = self.rule(*shapes, **params)
        except Exception as e:
            raise ShapeRuleError(
                f"custom_op {self.name}: shape_rule raised {type(e).__name__}: {e} (operand shapes {listed})"
            ) from e
        if type(shape) is not tuple or not all(
            isinstance(n, (int, np.integer)) and not isinstance(n, bool) and n >= 0 for n in shape
        ):
            raise ShapeRuleError(
                f"custom_op {self.name}: shape_rule must return a tuple of non-negative ints, got "
                f"{shape!r} (operand shapes {listed})"
            )
        dtype, xp = promoted(*inputs)
        if xp is None:  # floats alone: no array whose dtype the result would take
            return None
        return tuple(int(n) for n in shape), dtype, xp
