"""The base class of layers and weights: a differentiable value with a lazy ``forward``."""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any, ClassVar, Generic, NoReturn, TypeVar

from mypy_extensions import mypyc_attr

from monadl.do.do import Do
from monadl.do.values import Tape
from monadl.dsl.deep_learning import no_truth_value

Data = TypeVar("Data")
Delta = TypeVar("Delta")


@mypyc_attr(allow_interpreted_subclasses=True)
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

    # A class attribute, not a method: mypy reads its NoReturn (``if layer:`` is unreachable code,
    # which --strict with warn_unreachable reports), and mypyc compiles only bool-returning methods.
    __bool__: ClassVar[Callable[[Any], NoReturn]] = no_truth_value
