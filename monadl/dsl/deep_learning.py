"""The ``DeepLearning`` type class: a witness that a value is differentiable.

A differentiable value has a forward computation ``forward: Do[Tape[Data, Delta]]``. Layers and
weights are their own witnesses (they have ``forward``); plain floats and arrays are literals, lifted
to a constant tape by ``monadl.lift``. Functions that accept "anything differentiable of array type"
are typed on the unions ``AnyFloat`` / ``AnyArray`` of ``monadl.dsl``, which mypy checks.

(Interpreted, not compiled: a ``runtime_checkable`` protocol is checked by ``isinstance``.)
"""

from __future__ import annotations

from typing import Any, NoReturn, Protocol, TypeVar, runtime_checkable

from monadl.do.do import Do
from monadl.do.tape import Tape

Data = TypeVar("Data")
Delta = TypeVar("Delta")


@runtime_checkable
class DeepLearning(Protocol[Data, Delta]):
    """Witnesses that a value is differentiable, with its ``Data`` and ``Delta`` types."""

    @property
    def forward(self) -> Do[Tape[Data, Delta]]:
        """The lazy forward pass: a tape of the value and of the way back to its weights."""
        ...


def no_truth_value(self: Any) -> NoReturn:
    """A layer's ``__bool__`` (here, interpreted: a compiled function is no method descriptor, so
    as a class attribute of a compiled class it would not be bound to the layer)."""
    raise TypeError(
        f"the truth value of a {type(self).__name__} is its forward value, which is lazy: "
        "await it in a @direct function, or predict() it, first"
    )


def forbid_truth_value(cls: type) -> None:
    """Makes ``bool()`` of ``cls``'s instances raise (:func:`no_truth_value`). Set from here, an
    interpreted module, so that the type's slot follows: a compiled class's own class attribute is
    stored without updating the slot ``bool()`` reads."""
    cls.__bool__ = no_truth_value  # type: ignore[attr-defined]
