"""The base class of layers and weights: a differentiable value with a lazy ``forward``."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any, ClassVar, Generic, NoReturn, TypeVar

from monadl.do.do import Do
from monadl.tape.tape import Tape

Data = TypeVar("Data")
Delta = TypeVar("Delta")


class Differentiable(Generic[Data, Delta]):
    """A layer or a weight. It is its own ``DeepLearning`` witness: it has a ``forward``.

    ``__array_ufunc__ = None`` makes ``ndarray * layer`` call our reflected operator instead of
    building an object array. ``await x`` (in a ``@direct`` function) gives its forward data,
    shared with every differentiable use of ``x`` in the same run.
    """

    __slots__ = ("forward",)
    __array_ufunc__: ClassVar[None] = None
    forward: Do[Tape[Data, Delta]]

    def __await__(self) -> Generator[Do[Any], Any, Data]:
        tape: Tape[Data, Delta] = yield self.forward
        return tape.data

    def __bool__(self) -> NoReturn:
        raise TypeError(
            f"the truth value of a {type(self).__name__} is its forward value, which is lazy: "
            "await it in a @direct function, or predict() it, first"
        )
