"""The ``DeepLearning`` type class: a witness that a value is differentiable.

A differentiable value has a forward computation ``forward: Do[Tape[Data, Delta]]``. Layers and
weights are their own witnesses (they have ``forward``); plain floats and arrays are literals, lifted
to a constant tape by ``monadl.lift``. Functions that accept "anything differentiable of array type"
are typed on the unions ``AnyFloat`` / ``AnyArray`` of ``monadl.dsl``, which mypy checks.

(Interpreted, not compiled: a ``runtime_checkable`` protocol is checked by ``isinstance``.)
"""

from __future__ import annotations

import math
import sys
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


def _article(name: str) -> str:
    return f"an {name}" if name[:1] in "AEIOU" else f"a {name}"


def array_refusal(x: object, call: str, name: str | None) -> str:
    """Why NumPy's ``call`` (``numpy.argmax``, named ``name`` in monadl if it has that op) takes no
    ``x``, a layer or a weight, and what to use instead. A weight's class says what its value is
    (``_array_value``); a layer has none until it runs."""
    kind = _article(type(x).__name__)
    # The package's namespace, read where it is needed: monadl imports this module.
    op = getattr(sys.modules.get("monadl"), name, None) if name else None
    instead = f"use monadl.{name} on it" if callable(op) else "use monadl's ops on it"
    value: str | None = getattr(type(x), "_array_value", None)
    if value is not None:
        return f"{call}: {kind} is no array: {instead}, or its value, {value}"
    return (
        f"{call}: {kind} is lazy and has no array value until it runs: {instead}, or run it first "
        "(layer.predict_blocking()) and use the array it gives"
    )


def no_array(self: Any, dtype: Any = None, copy: Any = None) -> NoReturn:
    """A layer's or a weight's ``__array__``: ``numpy.asarray(layer)`` would otherwise be a 0-d
    array of objects, which NumPy's functions would compute on (``np.argmax(layer)`` would be 0)."""
    raise TypeError(array_refusal(self, "numpy.asarray", None))


def no_array_function(self: Any, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
    """A layer's or a weight's ``__array_function__`` (NEP 18): every NumPy function given one
    (``np.mean(layer)``, ``np.dot(x, weight)``) raises, naming monadl's op of that name; but
    ``np.shape``, ``np.ndim`` and ``np.size`` of it answer from its ``.shape`` where that is known
    (a weight's always: they read no value)."""
    name = getattr(func, "__name__", "")
    if name in ("shape", "ndim", "size") and args and args[0] is self:
        shape = self.shape  # (a graph that cannot run raises its error here)
        if shape is not None:
            if name == "shape":
                return shape
            if name == "ndim":
                return len(shape)
            axis = kwargs.get("axis", args[1] if len(args) > 1 else None)
            return math.prod(shape) if axis is None else shape[axis]
    raise TypeError(array_refusal(self, f"numpy.{name}", name))


def forbid_array_value(cls: type) -> None:
    """Makes NumPy refuse ``cls``'s instances (:func:`no_array`, :func:`no_array_function`): set
    from here, not in the class, so that mypy does not take a layer for an array (NumPy's stubs
    read any ``__array__`` as one, and ``ndarray * layer`` would be typed an ndarray), and so
    that the methods are interpreted functions, bound to the instance."""
    cls.__array__ = no_array  # type: ignore[attr-defined]
    cls.__array_function__ = no_array_function  # type: ignore[attr-defined]
