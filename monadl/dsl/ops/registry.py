"""The library's ops as declared: :func:`declare` makes a library primitive and registers it.

A library op is one :class:`~monadl.do.primitive.Primitive` declared beside its public function,
in its family's module, by :func:`declare`: the library's defaults (``fresh`` and ``own``: its vjps
give new arrays and its forward's ``ValueError`` is a ``ShapeError`` naming it) are set, so the
declaration names only what is particular to the op, and the op joins :data:`LIBRARY`, which the
tests walk (``tests/test_op_registry.py``): every op there needs a shape rule, a gradient case and a
batched-equals-unbatched case, and a reference entry. A user's op (``monadl.custom_op``) is made
with the engine's own defaults and is not registered.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from monadl.do.primitive import Batching, Primitive, Rule, elementwise_cost
from monadl.typeclasses.backend import ShapeError

LIBRARY: Final[list[Primitive | PerArity]] = []
"""Every library op, in the order declared: a primitive, or a family of them by arity."""


def declare(
    name: str,
    forward: Rule,
    vjps: tuple[Rule, ...],
    broadcasts: bool = False,
    passes: bool = False,
    saves: bool = False,
    cost: Callable[..., float] = elementwise_cost,
    check: Callable[..., None] | None = None,
    batch: Batching | None = None,
    *,
    shape_rule: Rule | None,
    check_values: Callable[..., None] | None = None,
    per_run: tuple[str, ...] = (),
    products: dict[int, Rule] | None = None,
    fresh: bool = True,
    register: bool = True,
    context: bool = False,
    joint_vjp: Rule | None = None,
) -> Primitive:
    """A library op's primitive (the arguments as :class:`~monadl.do.primitive.Primitive`'s), with
    the library's defaults, registered in :data:`LIBRARY` (``register=False``: one made per arity,
    registered by its :class:`PerArity`). ``shape_rule`` is always given: the result's static shape
    and dtype from the inputs' (``monadl.dsl.ops.shape_rules``), None only for an op whose result's
    shape is not known before it runs. ``fresh=False``: a vjp may give back an array it was given."""
    prim = Primitive(
        name,
        forward,
        vjps,
        broadcasts,
        passes,
        saves,
        cost,
        check,
        batch,
        check_values=check_values,
        per_run=per_run,
        fresh=fresh,
        own=True,
        products=products,
        shape_rule=shape_rule,
        context=context,
        joint_vjp=joint_vjp,
    )
    if register:
        LIBRARY.append(prim)
    return prim


class PerArity:
    """An op whose calls of each number of operands are one primitive (``add_n``, ``concatenate``,
    ``stack``): ``op.of(n)`` is the primitive of ``n`` operands, made once by ``make``. (A method,
    not ``__call__``: an instance of a Python class called goes through its type's generic call
    slot, dearer than a method's call, and this runs for every op recorded.)"""

    def __init__(self, name: str, make: Callable[[int], Primitive]) -> None:
        self.name = name
        self._make = make
        self._made: dict[int, Primitive] = {}
        LIBRARY.append(self)

    def of(self, n: int) -> Primitive:
        """The primitive of ``n`` operands."""
        prim = self._made.get(n)
        if prim is None:
            prim = self._made[n] = self._make(n)
        return prim

    def __repr__(self) -> str:
        return f"PerArity({self.name})"


def not_a_float(name: str, x: Any) -> None:
    """Raises a ShapeError naming op ``name`` for a float operand where it needs an array. The op
    itself rejects floats when it is made; a user's own differentiable value (a ``DeepLearning``)
    shows its kind only when it runs."""
    if type(x) is float:
        raise ShapeError(f"{name}: expected an array, got a float")
