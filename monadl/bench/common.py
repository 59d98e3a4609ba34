"""What the benchmarks share: loading the example they measure, timing implementations in turn, the
machine's CPUs, whether PyTorch (an optional peer) can be imported."""

from __future__ import annotations

import gc
import importlib.util
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType


def load_example(name: str) -> ModuleType:
    """``examples/<name>.py`` of this checkout (a benchmark measures the example itself)."""
    path = Path(__file__).resolve().parents[2] / "examples" / f"{name}.py"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: run the benchmarks from a monadl checkout")
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(name, module)
    spec.loader.exec_module(module)
    return module


def cpus() -> int:
    """The CPUs this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def torch_available() -> bool:
    """Whether PyTorch can be imported here."""
    if importlib.util.find_spec("torch") is None:
        return False
    try:
        import torch  # type: ignore[import-not-found, unused-ignore]  # noqa: F401
    except ImportError:
        return False
    return True


def interleaved(segments: Sequence[Callable[[], int]], repeats: int) -> list[list[float]]:
    """The rates of ``segments`` (each runs one timed segment of its implementation and returns how
    many items it did: steps, trees), ``repeats`` rounds of one segment of each in turn, so that the
    machine's drift in speed (20-50% within an hour on the project's VMs) touches them alike and
    their ratios hold even where their absolute figures move. Each segment starts from a collected
    heap: the collector's work for one segment's garbage is not timed in the next one's."""
    rates: list[list[float]] = [[] for _ in segments]
    for _ in range(repeats):
        for segment, found in zip(segments, rates, strict=True):
            gc.collect()
            start = time.perf_counter()
            items = segment()
            found.append(items / (time.perf_counter() - start))
    return rates
