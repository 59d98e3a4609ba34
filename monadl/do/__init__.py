"""The program and its scheduler: ``Do[A]`` (a lazy computation whose differentiable part is ops as
data), the one loop that runs it (merging equal calls), its record, and the executor."""

from monadl.do.coroutine import from_coroutine
from monadl.do.do import UNIT, Do, defer, delay, flat_map_n, gather, gather_all, kernel, kernel_n, map_n, pure
from monadl.do.executor import Executor, default_executor, run, set_default_executor
from monadl.do.stats import RunStats
from monadl.do.tape import Tape
from monadl.runtime.process import gc_paused

__all__ = [
    "UNIT",
    "Do",
    "Executor",
    "RunStats",
    "Tape",
    "default_executor",
    "defer",
    "delay",
    "flat_map_n",
    "from_coroutine",
    "gather",
    "gather_all",
    "gc_paused",
    "kernel",
    "kernel_n",
    "map_n",
    "pure",
    "run",
    "set_default_executor",
]
