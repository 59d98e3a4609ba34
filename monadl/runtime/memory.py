"""Large blocks kept between steps: inside :func:`large_blocks_kept`, NumPy arrays of 32 MiB or more
take their memory from blocks that arrays of their size freed before (``monadl/_memory.c``, built
with the compiled engine; without it NumPy allocates as always).

A step makes the same large arrays every time (a language model's logits and their gradient), and
glibc maps a block that large fresh from the system and unmaps it when it is freed, whatever its
thresholds (``process.tune_allocator`` raises them to their maximum, 32 MiB), so the next step's
array faults in every page again and the system zeroes it. The kept blocks (up to 8, 256 MiB
together) stay mapped. :func:`release_kept_blocks` gives them back; ``MONADL_KEEP_LARGE_BLOCKS=0``
(read at import) leaves NumPy's allocation alone."""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from monadl._compiled import compiled

_MEMORY: Any = (
    importlib.import_module("monadl._memory")
    if compiled() and os.environ.get("MONADL_KEEP_LARGE_BLOCKS", "1") != "0"
    else None
)
"""The handler's module, where it is built and not turned off (``MONADL_KEEP_LARGE_BLOCKS=0``)."""


@contextmanager
def large_blocks_kept() -> Iterator[None]:
    """NumPy's arrays of 32 MiB or more made in this thread inside the block take kept blocks (see
    the module); the handler in place before is put back after."""
    if _MEMORY is None:
        yield
        return
    previous = _MEMORY.use()
    try:
        yield
    finally:
        _MEMORY.restore(previous)


def release_kept_blocks() -> int:
    """Frees the blocks kept for later arrays; returns how many bytes they held (0 where the
    engine is not compiled)."""
    return 0 if _MEMORY is None else int(_MEMORY.release())
