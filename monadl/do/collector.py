"""Pausing Python's cyclic garbage collector while a large graph is built and run.

Recording a network and running a step allocate many small objects (layers, ``Do`` nodes, tapes)
that all live until the step ends. The collector's generational passes keep walking them meanwhile:
measured on the Tree-LSTM benchmark, about half of the time spent recording a batch of 64 trees,
and up to a third of a large batch's run. monadl's graphs and runs make no reference cycles (a test
checks it), so reference counting frees everything as usual and nothing waits for the collector.

Let the graph go before the block ends (record and run it in a function called inside the block):
a collector switched back on while a batch's graph is still referenced walks all of it once, at the
next allocation (measured: 7-20 ms for a Tree-LSTM batch of 64 trees, 10% of its inference).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


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
