"""Direct style at the ``Do`` level: a coroutine that awaits ``Do`` values, run as a ``Do``.

The executor drives the coroutine itself (no asyncio event loop): each ``await`` hands a ``Do`` to
the interpreter, whose value is sent back. The steps are chained by ``flat_map``, so a coroutine that
awaits 100,000 times runs without growing the Python stack.
"""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any, TypeVar

from monadl.do.do import Defer, Do, Node, Pure

A = TypeVar("A")


def from_coroutine(coroutine: Coroutine[Any, Any, A], name: str = "") -> Do[A]:
    """Runs ``coroutine`` (which may only await ``Do`` values, layers and weights) as a ``Do``."""
    where = name or getattr(coroutine, "__qualname__", "coroutine")

    def step(value: Any) -> Do[A]:
        try:
            request = coroutine.send(value)
        except StopIteration as stop:
            return Pure(stop.value)
        if not isinstance(request, Node):
            coroutine.close()
            raise TypeError(
                f"{where}: awaited an object that yielded {type(request).__name__}; a monadl "
                "coroutine can only await layers, weights and Do values (there is no asyncio "
                "event loop here: asyncio futures, tasks and sleeps cannot be awaited)"
            )
        return request.flat_map(step)

    return Defer(lambda: step(None))
