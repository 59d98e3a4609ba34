"""A run's context: what an op with effects reads and writes, handed to it as an argument.

Most kernels are pure functions of their inputs, safe on any thread. A few behave by the run they
are part of: dropout draws a mask in a training step and passes its input on in a prediction; batch
norm uses the batch's statistics in training, stages the update of its running ones, and uses the
running ones in a prediction. Such a primitive declares ``context=True``
(:class:`~monadl.do.primitive.Primitive`) and its forward receives the run's :class:`RunContext` as
the keyword argument ``ctx``; no kernel reads the calling thread's state, so these ops may run on
the executor's workers as any other.

The executor makes one context per run on the calling thread (:meth:`RunContext.of_thread`, unless
the caller gives its own: a training step's is in training mode and collects the step's staged
buffer updates, committed with its weights after it succeeds, and dropped if it fails).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any, Final

from monadl.runtime.staging import current_staging

__all__ = ["TRAINING", "RECORDED", "RunContext"]

TRAINING: Final[ContextVar[bool]] = ContextVar("monadl_training", default=False)
"""The calling thread's mode: True while it runs the forward pass of a training step (what
``monadl.is_training`` reads; a run's context takes it when the run starts)."""

RECORDED: Final[ContextVar[list[Any] | None]] = ContextVar("monadl_batch_statistics", default=None)
"""Where the calling thread records what staged updates were made from, or None (see
``monadl.dsl.ops.batch_norm.recording_statistics``; a run's context takes it when the run starts)."""


class RunContext:
    """One run's mode, random streams and staged buffer updates, given to the primitives that
    declare ``context=True`` (as ``ctx``).

    ``training``: the run is a training step's forward pass. ``staged``: the step's buffer
    updates, buffer to new value (None: a prediction, which stages nothing); the step commits them
    with its weights after it succeeds, or drops them. ``recorded``: a list that :meth:`record`
    appends to (None: nothing recorded). ``streams``: a random generator to use in place of an
    owner's own (:meth:`generator`). Safe to use from the executor's worker threads."""

    def __init__(
        self,
        training: bool = False,
        staged: dict[Any, Any] | None = None,
        recorded: list[Any] | None = None,
        streams: dict[Any, Any] | None = None,
    ) -> None:
        self.training = training
        self.staged = staged
        self.recorded = recorded
        self.streams: dict[Any, Any] = {} if streams is None else streams
        self._lock = threading.Lock()

    @staticmethod
    def of_thread() -> RunContext:
        """A context of the calling thread's mode, staging and recording (as its run starts)."""
        return RunContext(TRAINING.get(), current_staging(), RECORDED.get())

    def generator(self, owner: Any) -> Any:
        """The random generator ``owner`` (a module with a ``generator``) draws from in this run:
        its own, unless the context was given another for it."""
        stream = self.streams.get(owner)
        return owner.generator if stream is None else stream

    def staged_data(self, buffer: Any) -> Any:
        """``buffer``'s value as this run has staged it, else its committed value."""
        staged = self.staged
        if staged is not None:
            with self._lock:
                value = staged.get(buffer, staged)
            if value is not staged:
                return value
        return buffer.data

    def stage(self, buffer: Any, data: Any) -> bool:
        """Stages ``data`` as ``buffer``'s new value; False, and nothing staged, in a prediction."""
        staged = self.staged
        if staged is None:
            return False
        with self._lock:
            staged[buffer] = data
        return True

    def update(self, buffer: Any, new: Callable[[Any], Any]) -> bool:
        """Stages ``new(old)`` as ``buffer``'s new value, ``old`` its staged or committed value, in
        one step (two kernels updating one buffer compose, whichever thread runs them); False, and
        nothing staged, in a prediction."""
        staged = self.staged
        if staged is None:
            return False
        with self._lock:
            old = staged.get(buffer, staged)
            staged[buffer] = new(buffer.data if old is staged else old)
        return True

    def record(self, entry: Any) -> None:
        """Appends ``entry`` to :attr:`recorded`, if the run records."""
        if self.recorded is not None:
            with self._lock:
                self.recorded.append(entry)

    def __repr__(self) -> str:
        mode = "training" if self.training else "evaluation"
        return f"RunContext({mode}, {0 if self.staged is None else len(self.staged)} staged)"
