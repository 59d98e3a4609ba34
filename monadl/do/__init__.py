"""``Do[A]``, the lazy monadic computation, and the executor that runs it."""

from monadl.do.collector import gc_paused
from monadl.do.coroutine import from_coroutine
from monadl.do.do import (
    UNIT,
    Do,
    defer,
    delay,
    flat_map_n,
    gather,
    gather_all,
    kernel,
    kernel_n,
    map_n,
    pure,
)
from monadl.do.executor import Executor, default_executor, run, set_default_executor

__all__ = [
    "UNIT",
    "Do",
    "Executor",
    "default_executor",
    "defer",
    "delay",
    "flat_map_n",
    "from_coroutine",
    "gc_paused",
    "gather",
    "gather_all",
    "kernel",
    "kernel_n",
    "map_n",
    "pure",
    "run",
    "set_default_executor",
]
