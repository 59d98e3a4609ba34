"""Process-wide settings the engine makes for speed: glibc's allocator, the cyclic collector, and
BLAS's threads.

:func:`tune_allocator` keeps freed array memory in the process between training steps: a step
allocates its activations and deltas and frees them at its end, and glibc would return the top of
its heap to the OS (``M_TRIM_THRESHOLD``) and serve large arrays with fresh ``mmap``\\ s
(``M_MMAP_THRESHOLD``), so that every step page-faulted the same memory in again. It runs once,
when the first :class:`~monadl.do.executor.Executor` is made (``MONADL_TUNE_MALLOC=0`` turns it off);
elsewhere than glibc it does nothing.

:func:`gc_paused` pauses the cyclic garbage collector while a large graph is built and run: its
passes keep walking a batch's many small objects (layers, nodes, entries), which all live until the
step ends, and monadl's graphs and runs make no reference cycles (a test checks it), so reference
counting frees everything and nothing waits for the collector. At the block's end the objects it
made move to the collector's oldest generation, so that a graph the caller still holds is not
walked by the first collection after it. ``docs/benchmarks.md`` has the figures.
"""

from __future__ import annotations

import ctypes
import gc
import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Final

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
    restores it after. Nests; does nothing if the collector is already off.

    An interrupt (Ctrl-C) at any moment leaves the collector as it was: the pause begins inside
    the ``try``, and the collector is switched back on in a ``finally`` of its own, which runs even
    where the interrupt lands in the ageing before it (a Python call, where interrupts are taken)."""
    paused = gc.isenabled()
    try:
        if paused:
            gc.disable()
        yield
    finally:
        if paused:
            try:
                _age_tracked_objects()
            finally:
                gc.enable()


FULL_COLLECTION_AFTER: Final = 1_000_000
"""Objects moved to the oldest generation between full collections (see
:func:`_age_tracked_objects`): a full collection walks what lives, so spread over this many
objects moved it costs a small part of the young-generation passes it saves."""

_aged = 0


def _age_tracked_objects() -> None:
    """Moves every object the collector tracks into its oldest generation (``freeze``, then
    ``unfreeze``: two list splices), so that the collector switched back on does not begin with a
    pass over all that the block made and the caller still holds (a batch's graph: a millisecond or
    more). They are freed by reference counting as before. A cycle among them (a user's) would wait
    for a full collection, which a process that allocates mostly inside these blocks seldom makes:
    once ``FULL_COLLECTION_AFTER`` objects have been moved, the block ends with one instead.
    Skipped where the process froze objects itself (``gc.freeze`` before a fork): ``unfreeze``
    would release them too."""
    global _aged
    if gc.get_freeze_count():
        return
    _aged += gc.get_count()[0]  # the young generation's objects (freeze counts it down to 0)
    if _aged >= FULL_COLLECTION_AFTER:
        _aged = 0
        gc.collect()
        return
    gc.freeze()
    gc.unfreeze()


_blas_lock = threading.Lock()
_blas_holders = 0
_blas_limit: Any = None  # threadpoolctl's limiter, while any executor holds the cap


def cap_blas() -> None:
    """Caps every BLAS library of the process at one thread, for as long as one caller holds the
    cap (each :func:`cap_blas` is undone by one :func:`release_blas`; the last restores the limits
    as the first found them). Parallelism comes from the executor's own workers, if any, and BLAS's
    threads beside a busy core spin: on this project's 2-core machines, a training loop of the
    example models ran 1.7-33x slower with BLAS's two threads than capped (``docs/benchmarks.md``)."""
    global _blas_holders, _blas_limit
    with _blas_lock:
        if _blas_holders == 0:
            from threadpoolctl import threadpool_limits

            _blas_limit = threadpool_limits(limits=1, user_api="blas")
        _blas_holders += 1


def release_blas() -> None:
    """Undoes one :func:`cap_blas`."""
    global _blas_holders, _blas_limit
    with _blas_lock:
        _blas_holders -= 1
        if _blas_holders == 0 and _blas_limit is not None:
            _blas_limit.restore_original_limits()
            _blas_limit = None


class BlasCap:
    """One hold of :func:`cap_blas`, released once: by :meth:`release`, or when the hold is dropped
    (an executor never closed would otherwise keep BLAS on one thread for the rest of the process)."""

    def __init__(self) -> None:
        cap_blas()
        self._held = True

    def release(self) -> None:
        """Undoes the hold (again: nothing)."""
        if self._held:
            self._held = False
            release_blas()

    def __del__(self) -> None:
        # At interpreter exit the limits die with the process, and threadpoolctl's module may already
        # be torn down (its globals None): restoring them then only prints an ignored exception.
        if not sys.is_finalizing():
            self.release()
