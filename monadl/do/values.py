"""``Tape[Data, Delta]``: the value of a differentiable node in a run.

A tape holds the forward data and the way to push a delta back through it. ``backward`` takes the
delta *lazily*, as a ``Do``, and returns a ``Do`` of the side effects that push it further back; a
literal's tape (this class) ignores its delta, so the kernel that would compute it never runs.

Consumers follow a protocol: ``acquire`` once when they read the tape in the forward pass, then
exactly one of ``backward`` (with a delta) or ``release`` (no delta). The scheduler's own tapes
(``program.RunTape``) are rows of a run's record, whose backward pass (``monadl.tape``) sums the
deltas of every consumer of a node before it runs that node's vjps: a node used k times runs its
backward once. A user's own tape class (a subclass of this one with ``requires_delta = True``)
keeps the protocol: the scheduler acquires it once and gives it one summed delta, or releases it.
"""

from __future__ import annotations

from typing import Any, ClassVar, Generic, TypeVar

from mypy_extensions import mypyc_attr

from monadl.do.do import UNIT, Do

Data = TypeVar("Data")
Delta = TypeVar("Delta")


@mypyc_attr(allow_interpreted_subclasses=True)
class Tape(Generic[Data, Delta]):
    """A tape whose delta goes nowhere: the tape of a literal (a constant float or array)."""

    __slots__ = ("data",)
    requires_delta: ClassVar[bool] = False
    """False when :meth:`backward` ignores its delta, so consumers need not build it."""

    def __init__(self, data: Data) -> None:
        self.data = data

    def acquire(self) -> None:
        """Registers one more consumer of this tape (forward pass)."""

    def backward(self, delta: Do[Delta]) -> Do[None]:
        """Adds ``delta`` to this tape's accumulated delta and releases one consumer."""
        return UNIT

    def release(self) -> Do[None]:
        """Releases one consumer that has no delta to give (it was not on the path to the loss)."""
        return UNIT

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.data!r})"


def is_literal(value: Any) -> bool:
    """Whether ``value`` is a literal's tape (a constant: no delta wanted)."""
    return type(value) is Tape
