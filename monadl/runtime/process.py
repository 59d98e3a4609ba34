"""Process-wide settings the engine makes for speed: glibc's allocator, and the cyclic collector.

:func:`tune_allocator` keeps freed array memory in the process between training steps: a step
allocates its activations and deltas and frees them at its end, and glibc would return the top of
its heap to the OS (``M_TRIM_THRESHOLD``) and serve large arrays with fresh ``mmap``\\ s
(``M_MMAP_THRESHOLD``), so that every step page-faulted the same memory in again. It runs once,
when the first :class:`~monadl.do.executor.Executor` is made (``MONADL_TUNE_MALLOC=0`` turns it off);
elsewhere than glibc it does nothing.

:func:`gc_paused` pauses the cyclic garbage collector while a large graph is built and run: its
passes keep walking a batch's many small objects (layers, nodes, entries), which all live until the
step ends, and monadl's graphs and runs make no reference cycles (a test checks it), so reference
counting frees everything and nothing waits for the collector. Let the graph go before the block
ends (record and run it in a function called inside the block): a collector switched back on while
a batch's graph is still referenced walks all of it once. ``docs/benchmarks.md`` has the figures.
"""

from __future__ import annotations

import ctypes
import gc
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 * 1024 * 1024  # glibc's maximum on 64-bit systems
TRIM_THRESHOLD = 1024 * 1024 * 1024

_tuned: bool | None = None


def tune_allocator() -> bool:
    """Raises glibc's trim and mmap thresholds (once). True if the allocator was tuned."""
    global _tuned
    if _tuned is None:
        _tuned = False
        if os.environ.get("MONADL_TUNE_MALLOC", "1") != "0" and sys.platform.startswith("linux"):
            try:
                mallopt = ctypes.CDLL(None).mallopt
            except (OSError, AttributeError):  # not glibc (musl, say)
                return False
            mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
            mallopt.restype = ctypes.c_int
            _tuned = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
                mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)
            )
    return _tuned


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pauses the cyclic garbage collector inside the block (process-wide, as ``gc.disable``), and
    restores it after. Nests; does nothing if the collector is already off."""
    paused = gc.isenabled()
    if paused:
        gc.disable()
    try:
        yield
    finally:
        if paused:
            gc.enable()
