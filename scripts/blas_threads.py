"""Whether the default executor (one worker) should cap BLAS at one thread: the example models'
training steps timed with BLAS as the process has it and capped at one thread, in alternating
rounds, wall time and CPU time (all threads) per step.

    python scripts/blas_threads.py [--repeats 5] [--segment 1.0]

Prints one row per workload: the medians of ms per step (wall, CPU) each way and their ratios.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

from threadpoolctl import threadpool_info, threadpool_limits

import monadl as ml
from monadl.bench.columns_model import ColumnNetwork
from monadl.bench.columns_params import init_params, random_batch
from monadl.bench.models import Sizes, bilstm_workload, cnn_workload, transformer_workload


def columns_step(executor: ml.Executor, variant: str) -> Callable[[], float]:
    """A step of the CIFAR-100 columns (4 columns, batch 16) on random images."""
    model = ColumnNetwork(init_params(4), "skip" if variant == "skip" else "noskip", executor=executor)
    x, coarse, labels = random_batch(16)
    return lambda: model.step(x, coarse, labels)


def segment(step: Callable[[], float], steps: int, capped: bool) -> tuple[float, float]:
    """ms per step, wall and CPU, over ``steps`` steps."""
    with threadpool_limits(limits=1, user_api="blas") if capped else threadpool_limits(limits=None):
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in range(steps):
            step()
        return (time.perf_counter() - wall) * 1e3 / steps, (time.process_time() - cpu) * 1e3 / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--segment", type=float, default=1.0, help="seconds a segment, about")
    args = parser.parse_args()
    blas = [(i["internal_api"], i["num_threads"]) for i in threadpool_info() if i["user_api"] == "blas"]
    print(f"BLAS: {blas}")
    executor = ml.Executor()
    sizes = Sizes()
    workloads: dict[str, Callable[[], float]] = {
        "columns skip": columns_step(executor, "skip"),
        "columns noskip": columns_step(executor, "noskip"),
        "cnn": cnn_workload(sizes, executor, 0, False).monadl,
        "transformer": transformer_workload(sizes, executor, 0, False).monadl,
        "bilstm": bilstm_workload(sizes, executor, 0, False, False).monadl,
    }
    header = ["wall ms, as is", "capped", "ratio", "CPU ms, as is", "capped"]
    print(f"{'workload':16} {header[0]:>15} {header[1]:>8} {header[2]:>6} {header[3]:>14} {header[4]:>8}")
    for name, step in workloads.items():
        for _ in range(3):
            step()
        started = time.perf_counter()
        step()
        steps = max(1, int(args.segment / max(time.perf_counter() - started, 1e-6)))
        rounds: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
        for _ in range(args.repeats):
            for capped in (False, True):
                rounds[capped].append(segment(step, steps, capped))
        wall = {c: statistics.median(r[0] for r in rounds[c]) for c in rounds}
        cpu = {c: statistics.median(r[1] for r in rounds[c]) for c in rounds}
        print(
            f"{name:16} {wall[False]:15.2f} {wall[True]:8.2f} {wall[False] / wall[True]:6.2f} "
            f"{cpu[False]:14.2f} {cpu[True]:8.2f}"
        )


if __name__ == "__main__":
    main()
