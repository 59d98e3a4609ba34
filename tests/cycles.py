"""The one check for reference cycles: what only the cyclic garbage collector would free.

A failed step or run must leave no cycle behind: an exception's traceback holds the frames it
passed through, so a frame that keeps the exception in a local, or an object that keeps it in an
attribute while its methods are on the traceback, makes a cycle that holds every tape and array
of the step until the next collection."""

from __future__ import annotations

import gc
from collections.abc import Callable


def cyclic_garbage(action: Callable[[], object]) -> list[str]:
    """The type names of the objects left in reference cycles by ``action()`` (sorted); what it
    returns is dropped before the collection."""
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        action()
        gc.collect()
        return sorted(type(o).__name__ for o in gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
