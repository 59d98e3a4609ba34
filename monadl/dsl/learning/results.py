"""What a step or a prediction gives back: ``returns``' ``Result`` and ``FutureResult``, with two
things made plain for the user.

* :func:`failed`: a ``Failure`` whose ``unwrap()`` raises an ``UnwrapFailedError`` that names the
  error it holds. ``returns``' own is raised with no message, so the last line of the traceback, the
  one a user reads first, said nothing of the shape error above it.
* :class:`Deferred`: the awaitable of a ``FutureResult`` that runs its work in a worker thread when
  first awaited, and warns when it is dropped without ever being awaited, as an un-awaited coroutine
  does: ``loss.train(optimizer)`` without ``await`` trains nothing.

Interpreted, not compiled: the failure subclasses a Python class and the awaitable needs ``__del__``.
"""

from __future__ import annotations

import asyncio
import warnings
from collections.abc import Callable, Generator
from typing import Any, Never, TypeVar, final

from returns.primitives.exceptions import UnwrapFailedError
from returns.result import Failure, Result

E = TypeVar("E", bound=BaseException)

__all__ = ["Deferred", "failed"]


@final
class _Failure(Failure[E]):  # type: ignore[misc]  # (returns marks Failure final for its own types)
    """A ``Failure`` whose ``unwrap()`` names its error. Equal to a plain ``Failure`` of the same
    error, and shown as one."""

    __slots__ = ()
    __qualname__ = "Failure"

    def unwrap(self) -> Never:
        error = self.failure()
        raised = UnwrapFailedError(self)
        raised.args = (f"{type(error).__module__}.{type(error).__qualname__}: {error}",)
        raise raised from error

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Failure) and self.failure() == other.failure()

    def __hash__(self) -> int:
        return hash(self.failure())


def failed(error: E) -> Result[Any, E]:
    """``Failure(error)``, whose ``unwrap()`` raises an ``UnwrapFailedError`` naming ``error`` (with
    ``error`` as its cause, as ``returns``' own)."""
    return _Failure(error)


class Deferred:
    """An awaitable that runs ``fn`` in a worker thread when first awaited, once (awaitable again:
    the same result). ``what`` names it in the warning given if it is dropped never awaited (None:
    no warning, for work whose only effect is its result)."""

    def __init__(self, fn: Callable[[], Result[Any, Exception]], what: str | None) -> None:
        self._fn = fn
        self._what = what
        self._future: asyncio.Future[Result[Any, Exception]] | None = None

    def __await__(self) -> Generator[Any, None, Result[Any, Exception]]:
        if self._future is None:
            self._future = asyncio.get_running_loop().run_in_executor(None, self._fn)
        return self._future.__await__()

    def __del__(self) -> None:
        if self._future is None and self._what is not None:
            warnings.warn(
                f"{self._what} was never awaited, so it never ran: await it, or call the blocking form",
                RuntimeWarning,
                stacklevel=2,
            )
