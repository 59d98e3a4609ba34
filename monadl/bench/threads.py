"""Whether a pool of two can pay on this machine: the ceiling of two plain threads.

The executor's pool gains only where the kernels it hands to another thread outlast the hand-off.
This measures both sides on the machine it runs on, with plain threads and NumPy, no monadl:

  round trip   a job handed to another thread and its result handed back (two SimpleQueues):
               the least a kernel sent to a worker costs in waiting
  columns      the heavy kernels of one training step of the CIFAR column model at --columns
               columns: per column, the forward product (batch x 3072 @ 3072 x hidden), the
               weight's gradient (3072 x batch @ batch x hidden) and its SGD update. Run on one
               thread, then split over two (the calling thread and one worker, half the columns
               each) with one hand-off per phase, as an ideal pool would run them: no Python
               bookkeeping between the kernels, and the columns' kernels independent
  apart        the same split, but each thread runs all its steps on its own, one hand-off for a
               whole segment: the two cores' capacity on these kernels, without the waits

Speed-ups are medians of the rounds' ratios (the three are timed in turn, --repeats rounds of
--steps steps). ``columns`` bounds what any pool of two can gain on these kernels here: a step must
wait for its forward products before it goes on, and a whole step, with its serial part (the other
ops, Python), gains less still (Amdahl). The gap between ``columns`` and ``apart`` is what the
hand-offs cost. BLAS runs on one thread.
"""

from __future__ import annotations

import argparse
import json
import queue
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

from monadl.bench.common import cpus, interleaved
from monadl.cli import positive_int
from monadl.data.files import atomic_write_bytes


@dataclass
class Ceiling:
    """What ``measure`` found: microseconds per round trip and per step (one thread, two threads
    with one hand-off per phase, two threads apart), and the speed-ups of two threads over one
    (``speedups``: each round's, ``speedup`` their median)."""

    columns: int
    batch: int
    hidden: int
    cpus: int
    round_trip_us: float
    one_thread_us: float
    two_threads_us: float
    speedup: float
    speedups: list[float]
    apart_us: float
    apart_speedup: float


class Worker:
    """One thread that runs the jobs handed to it, one at a time."""

    def __init__(self) -> None:
        self.jobs: queue.SimpleQueue[Callable[[], Any] | None] = queue.SimpleQueue()
        self.done: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._run, name="monadl-bench-worker", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while (job := self.jobs.get()) is not None:
            try:
                job()
            except BaseException as error:  # noqa: BLE001 - handed to the caller, which raises it
                self.done.put(error)
            else:
                self.done.put(None)

    def call(self, job: Callable[[], Any], meanwhile: Callable[[], Any]) -> None:
        """Runs ``job`` on the worker and ``meanwhile`` on this thread, at the same time; returns
        when both are done, or raises what failed (this thread's error, else the job's)."""
        self.jobs.put(job)
        try:
            meanwhile()
        finally:
            error = self.done.get()  # the worker is done with the job, whatever happened here
        if error is not None:
            raise error

    def close(self) -> None:
        self.jobs.put(None)
        self.thread.join()


class Columns:
    """The columns' weights, gradient buffers and one batch (float32, as the benchmark trains)."""

    def __init__(self, columns: int, batch: int, hidden: int, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.x = rng.random((batch, 3072), dtype=np.float32)
        self.delta = (rng.standard_normal((batch, hidden)) * 1e-3).astype(np.float32)
        shape = (3072, hidden)
        self.weights = [(rng.standard_normal(shape) * 0.02).astype(np.float32) for _ in range(columns)]
        self.gradients = [np.empty_like(w) for w in self.weights]
        self.outputs = [np.empty((batch, hidden), dtype=np.float32) for _ in range(columns)]

    def forward(self, which: range) -> None:
        for c in which:
            np.dot(self.x, self.weights[c], out=self.outputs[c])

    def backward(self, which: range) -> None:
        for c in which:
            g = self.gradients[c]
            np.dot(self.x.T, self.delta, out=g)
            np.multiply(g, -1e-4, out=g)
            np.add(self.weights[c], g, out=self.weights[c])

    def step(self, which: range) -> None:
        """One step's kernels of the columns ``which``: forward, then gradients and updates."""
        self.forward(which)
        self.backward(which)

    def halves(self) -> tuple[range, range]:
        """The even columns (the calling thread's) and the odd ones (the worker's)."""
        n = len(self.weights)
        return range(0, n, 2), range(1, n, 2)


def round_trip_us(worker: Worker, count: int = 2000) -> float:
    """The median time, in microseconds, of handing an empty job to ``worker`` and back."""
    times = []
    for _ in range(count):
        start = time.perf_counter()
        worker.call(_nothing, _nothing)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def _nothing() -> None:
    return None


def step_one_thread(model: Columns) -> None:
    """One step's kernels, every column on this thread."""
    model.step(range(len(model.weights)))


def step_two_threads(model: Columns, worker: Worker) -> None:
    """One step's kernels, the even columns on this thread and the odd ones on ``worker``: one
    hand-off for the forward products, one for the gradients and updates."""
    mine, theirs = model.halves()
    worker.call(lambda: model.forward(theirs), lambda: model.forward(mine))
    worker.call(lambda: model.backward(theirs), lambda: model.backward(mine))


def steps_two_threads_apart(model: Columns, worker: Worker, steps: int) -> None:
    """``steps`` steps' kernels, each thread running its columns' steps on its own, with one hand-off
    for them all: what two threads can do on these kernels when they never wait for each other."""
    mine, theirs = model.halves()

    def run(columns: range) -> None:
        for _ in range(steps):
            model.step(columns)

    worker.call(lambda: run(theirs), lambda: run(mine))


def measure(
    columns: int = 4, batch: int = 16, hidden: int = 64, steps: int = 200, repeats: int = 5
) -> Ceiling:
    """Round trip and the columns' kernels on one and on two threads (see the module)."""
    model = Columns(columns, batch, hidden)
    worker = Worker()
    try:
        with threadpool_limits(limits=1, user_api="blas"):
            trip = round_trip_us(worker)

            def one() -> int:
                for _ in range(steps):
                    step_one_thread(model)
                return steps

            def two() -> int:
                for _ in range(steps):
                    step_two_threads(model, worker)
                return steps

            def apart() -> int:
                steps_two_threads_apart(model, worker, steps)
                return steps

            for warm_up in (one, two, apart):  # caches, pages, BLAS buffers
                warm_up()
            rates = interleaved([one, two, apart], repeats)
    finally:
        worker.close()
    ratios = [b / a for a, b in zip(rates[0], rates[1], strict=True)]
    apart_ratios = [b / a for a, b in zip(rates[0], rates[2], strict=True)]
    return Ceiling(
        columns=columns,
        batch=batch,
        hidden=hidden,
        cpus=cpus(),
        round_trip_us=trip,
        one_thread_us=1e6 / statistics.median(rates[0]),
        two_threads_us=1e6 / statistics.median(rates[1]),
        speedup=statistics.median(ratios),
        speedups=ratios,
        apart_us=1e6 / statistics.median(rates[2]),
        apart_speedup=statistics.median(apart_ratios),
    )


def format_report(c: Ceiling) -> str:
    """The measurement as a few lines of text."""
    spread = f"{min(c.speedups):.2f}-{max(c.speedups):.2f}"
    return "\n".join(
        [
            f"{c.cpus} CPUs; BLAS on one thread; float32, batch {c.batch}, hidden {c.hidden}",
            f"round trip to a worker thread and back: {c.round_trip_us:.0f} us (median)",
            f"{c.columns} columns' heavy kernels per step: one thread {c.one_thread_us:.0f} us, "
            f"two threads {c.two_threads_us:.0f} us",
            f"two threads / one: {c.speedup:.2f}x (median of rounds, {spread})",
            f"without the hand-offs (each thread its columns' steps apart): {c.apart_us:.0f} us, "
            f"{c.apart_speedup:.2f}x one thread",
        ]
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The command line of ``python -m monadl.bench threads``."""
    parser.add_argument(
        "--columns", type=positive_int, default=4, help="columns (split over the two threads)"
    )
    parser.add_argument("--batch", type=positive_int, default=16)
    parser.add_argument("--hidden", type=positive_int, default=64)
    parser.add_argument("--steps", type=positive_int, default=200, help="steps per timed segment")
    parser.add_argument("--repeats", type=positive_int, default=5, help="rounds of one segment each")
    parser.add_argument("--json", type=Path, help="also write the results as JSON here")


def run_cli(args: argparse.Namespace) -> int:
    """Runs the measurement and prints it (and writes the JSON, if asked)."""
    ceiling = measure(args.columns, args.batch, args.hidden, args.steps, args.repeats)
    print(format_report(ceiling))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(args.json, json.dumps(asdict(ceiling), indent=2).encode())
        print(f"wrote {args.json}")
    return 0
