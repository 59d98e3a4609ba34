"""Buffer updates staged by a training step's forward pass, committed with its weights.

A module's non-trainable state that a step computes (a batch norm's running statistics) must change
as its weights do: with the step's commit, all or nothing. An op's forward calls
:func:`stage_buffer` with a buffer and its new value; outside a training step's forward pass that
stages nothing and returns False. The step collects what was staged (:func:`staging`) and publishes
it in the same commit as the weights' new values (``monadl.runtime.versions``), so a step that fails
(a non-finite loss or gradient, an error, an interrupt) leaves every buffer as it was, and a
prediction reads either the old values of all of them or the new ones.

A buffer staged twice in one step (a layer used twice) keeps the last value: an op that updates a
buffer from its old value reads :func:`staged_data`, the step's staged value if there is one, else
the committed one, so two uses compose as two steps would. These functions read the calling
thread's context: an op that stages from a kernel that may run on the executor's workers declares
``context=True`` and stages through the run's context instead (``monadl.do.context.RunContext``:
batch norm's), which writes to the same staged updates.

A buffer that can be staged holds a ``head`` (its chain of versions, as a weight's) and a
``data`` property reading its newest committed version: :class:`monadl.nn.ArrayBuffer` is one.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

__all__ = ["current_staging", "stage_buffer", "staged_data", "staging"]

_STAGED: ContextVar[dict[Any, Any] | None] = ContextVar("monadl_staged_buffers", default=None)


def stage_buffer(buffer: Any, data: Any) -> bool:
    """Stages ``data`` as ``buffer``'s new value, committed with the running training step's
    weights (and dropped if the step fails). False, and nothing staged, outside a training step's
    forward pass (a prediction)."""
    staged = _STAGED.get()
    if staged is None:
        return False
    staged[buffer] = data
    return True


def staged_data(buffer: Any) -> Any:
    """``buffer``'s value as the running step has staged it, else its committed value."""
    staged = _STAGED.get()
    if staged is not None:
        value = staged.get(buffer, staged)
        if value is not staged:
            return value
    return buffer.data


def current_staging() -> dict[Any, Any] | None:
    """The updates the calling thread is staging into (buffer to new value), or None outside a
    training step's forward pass."""
    return _STAGED.get()


@contextmanager
def staging() -> Iterator[dict[Any, Any]]:
    """Collects the buffer updates staged in the calling thread while the block runs: the dict
    yielded, buffer to new value, in the order first staged."""
    staged: dict[Any, Any] = {}
    token = _STAGED.set(staged)
    try:
        yield staged
    finally:
        _STAGED.reset(token)
