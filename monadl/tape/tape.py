"""``Tape[Data, Delta]``: a forward result and the way to push a delta back through it.

``backward`` takes the delta *lazily*, as a ``Do``: a tape that ignores its delta (a literal) never
causes the kernels that would compute it to run. It returns a ``Do`` of the side effects that push the
delta further back (into the inputs' tapes, and finally into the weights' gradients).

Protocol for consumers (an op whose forward read this tape): call :meth:`Tape.acquire` once during
the forward pass, then exactly one of :meth:`Tape.backward` (with a delta) or :meth:`Tape.release`
(no delta: the consumer itself received none) during the backward pass. Both must be called on the
interpreter's thread, i.e. from a ``Delay``/``Defer``/``map``/``flat_map`` body, never from a kernel.
"""

from __future__ import annotations

from typing import ClassVar, Generic, TypeVar

from monadl.do.do import UNIT, Do

Data = TypeVar("Data")
Delta = TypeVar("Delta")
Data_co = TypeVar("Data_co", covariant=True)


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
