"""Recording an op: a primitive applied to operands becomes an ``Apply`` node of the program.

Nothing runs here: ``apply_primitive`` turns each operand into its forward computation (a layer's
or a weight's own, or a literal's constant tape) and makes one node of the primitive, its inputs
and its static parameters. The scheduler (``monadl.do.scheduler``) runs it, merged with the ops of
equal signature that are ready with it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from monadl.do.do import Apply, Do, Pure
from monadl.do.primitive import Primitive
from monadl.do.values import Tape
from monadl.dsl.base import Differentiable
from monadl.dsl.deep_learning import DeepLearning
from monadl.typeclasses.backend import NDARRAY, check_float_array, is_array


def forward_of(x: object, where: str) -> Do[Tape[Any, Any]]:
    """The forward computation of an operand: a layer's or weight's, or a literal's constant tape.

    Raises a TypeError naming ``where`` for anything that is not a float, a floating-point array,
    a weight or a layer.
    """
    if isinstance(x, Differentiable):
        return x.forward
    if type(x) is NDARRAY and x.dtype.kind == "f":  # the common constant, without the general checks
        return Pure(Tape(x))
    if isinstance(x, (float, int)) and not isinstance(x, bool):
        return Pure(Tape(float(x)))
    if is_array(x):
        check_float_array(x, where)
        return Pure(Tape(x))
    if isinstance(x, DeepLearning):  # a user's own differentiable type
        forward: Do[Tape[Any, Any]] = x.forward
        return forward
    raise TypeError(
        f"{where}: expected a float, a floating-point array, a weight or a layer, got {type(x).__name__}"
    )


def apply_primitive(
    prim: Primitive, operands: Sequence[object], params: dict[str, Any]
) -> Do[Tape[Any, Any]]:
    """The forward computation of ``prim`` applied to ``operands``: one ``Apply`` node."""
    sources = []
    for x in operands:  # a loop, not a comprehension (a call of its own in Python 3.11): every op
        sources.append(forward_of(x, prim.name))
    return Apply(prim, tuple(sources), params)
