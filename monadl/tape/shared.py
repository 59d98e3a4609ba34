"""Reference-counted tapes (DeepLearning.scala 2, section 5.4).

A :class:`SharedTape` counts its consumers and collects their (lazy) deltas. When the last consumer
has given its delta or released, the tape runs its own backward *once*, with the sum of the deltas.
So a node used k times costs one backward call, and n nested diamonds cost O(n), not O(2^n).

Firing is returned as a ``Defer`` rather than done on the spot: the release cascade of a chain of
2,000 layers is then walked by the executor's iterative loop, not by Python recursion.

A node evaluated in the forward pass but not on the path to the loss (a value only awaited for control
flow, say) has no consumer that will ever give it a delta. :class:`StepContext` records every shared
tape of a training step, so that the step can release those dangling tapes (:meth:`StepContext.
release_dangling`), which lets the tapes they consumed fire too: each tape's backward runs exactly
once per step, whatever the graph's shape.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Generic, TypeVar

from monadl.do.do import UNIT, Do, PrivateDefer, run_unit
from monadl.tape.tape import Tape
from monadl.typeclasses.sparse import add

Data = TypeVar("Data")
Delta = TypeVar("Delta")


class SharedTape(Tape[Data, Delta], Generic[Data, Delta]):
    """A tape with a reference count and a delta accumulator.

    Subclasses implement :meth:`_backward`, which receives the summed delta (lazy) and must call
    ``backward`` or ``release`` exactly once on each tape in ``inputs``.
    """

    __slots__ = ("_count", "_deltas", "_fired", "fanout", "inputs")

    def __init__(self, data: Data, inputs: tuple[Tape[Any, Any], ...] = ()) -> None:
        self.data = data
        self.inputs = inputs
        self.fanout = 2  # unknown: assume the delta may be read twice (kept in the memo)
        self._count = 0
        self._deltas: list[Do[Delta]] | None = None
        self._fired = False

    requires_delta: ClassVar[bool] = True

    @property
    def consumers(self) -> int:
        """How many consumers have acquired this tape and not yet released it."""
        return self._count

    def acquire(self) -> None:
        if self._fired:
            raise RuntimeError(f"{type(self).__name__}: acquired after its backward already ran")
        self._count += 1

    def backward(self, delta: Do[Delta]) -> Do[None]:
        if self._deltas is None:
            self._deltas = [delta]
        else:
            self._deltas.append(delta)
        self._count -= 1
        if self._count > 0:
            return UNIT
        return self._last_release()

    def release(self) -> Do[None]:
        self._count -= 1
        if self._count > 0:
            return UNIT
        return self._last_release()

    def _last_release(self) -> Do[None]:
        if self._count < 0 or self._fired:
            raise RuntimeError(f"{type(self).__name__}: released more often than acquired")
        self._fired = True
        if not self.inputs:  # nothing can cascade from here: no need to defer (a weight's tape)
            return self._fire()
        return PrivateDefer(self._fire)

    def _fire(self) -> Do[None]:
        delta = self.take_delta()
        if delta is None:
            return run_unit(t.release() for t in self.inputs)
        return self._backward(delta)

    def take_deltas(self) -> list[Do[Delta]] | None:
        """The consumers' deltas, unsummed, and forgotten here; None if there were none."""
        deltas, self._deltas = self._deltas, None
        return deltas or None

    def take_delta(self) -> Do[Delta] | None:
        """The consumers' deltas, summed (lazily), and forgotten here; None if there were none."""
        deltas = self.take_deltas()
        if deltas is None:
            return None
        return deltas[0] if len(deltas) == 1 else self._sum(deltas)

    def sole_reader(self) -> bool:
        """True if a delta given now by a consumer will be read by one computation only: summed
        with others (a sum reads each once), or passed on to a backward that reads it once
        (``fanout``: how many computations read the delta passed to :meth:`_backward`)."""
        return self._count > 1 or bool(self._deltas) or self.fanout <= 1

    def _sum(self, deltas: Sequence[Do[Delta]]) -> Do[Delta]:
        """The sum of several lazy deltas (subclasses know their monoid)."""
        raise NotImplementedError

    def _backward(self, delta: Do[Delta]) -> Do[None]:
        raise NotImplementedError


class StepContext:
    """The bookkeeping of one training step: its shared tapes and the weights' summed deltas."""

    __slots__ = ("gradients", "tapes")

    def __init__(self) -> None:
        self.tapes: list[SharedTape[Any, Any]] = []
        self.gradients: dict[Any, Any] = {}

    def register(self, tape: SharedTape[Any, Any]) -> None:
        self.tapes.append(tape)

    def record(self, weight: object, delta: Any) -> None:
        """Records a weight's summed delta (added, should a weight have several tapes)."""
        previous = self.gradients.get(weight)
        self.gradients[weight] = delta if previous is None else add(previous, delta)

    def release_dangling(self, root: Tape[Any, Any]) -> Do[None]:
        """Releases every tape of the step that no consumer acquired, except ``root``."""
        return run_unit(t.release() for t in self._dangling(root))

    def _dangling(self, root: Tape[Any, Any]) -> list[SharedTape[Any, Any]]:
        dangling = [t for t in self.tapes if t._count == 0 and not t._fired and t is not root]
        for t in dangling:  # so that release() counts them down to zero, not below
            t._count = 1
        return dangling


_current_step: contextvars.ContextVar[StepContext | None] = contextvars.ContextVar(
    "monadl_step", default=None
)


def current_step() -> StepContext | None:
    """The training step being run on this thread, if any (None during prediction)."""
    return _current_step.get()


def in_step(context: StepContext, body: Callable[[], Any]) -> Any:
    """Runs ``body`` with ``context`` as the current training step."""
    token = _current_step.set(context)
    try:
        return body()
    finally:
        _current_step.reset(token)
