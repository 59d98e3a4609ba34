"""``Tape[Data, Delta]``: a node's value in a run, the forward data and the way back.

A plain (interpreted) Python class: generic at run time (``Tape[float, float]`` subscripts), and
subclassed by users for tapes of their own.
"""

from __future__ import annotations

from typing import ClassVar, Generic, TypeVar

from monadl.do.do import UNIT, Do

Data = TypeVar("Data")
Delta = TypeVar("Delta")


class Tape(Generic[Data, Delta]):
    """A node's value in a run: its ``data`` and the way to push a delta back through it.

    This class is the tape of a literal (a constant), whose ``backward`` ignores its delta. A tape
    of the user's own subclasses it with ``requires_delta = True``; the scheduler then calls
    ``acquire`` once when ops read it, and gives it one summed delta (``backward``, the delta as a
    ``Do``) or none (``release``)."""

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
