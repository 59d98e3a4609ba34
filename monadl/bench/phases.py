"""Where a training step's time goes: the DyNet suite's models (``monadl.bench.suite_monadl``, the
code a user writes) timed phase by phase inside one step, on one thread.

Phases, in milliseconds, medians over ``--steps`` steps (after ``--warmup``), each step on the
next ``--batch`` instances of the training data:

  record    the user's code building the step's graph (``model.total(batch)``): nothing runs
  forward   the forward run (walk, signatures, merged kernels, batchable bodies)
  backward  the backward pass (vjps, gathers' transposes, each weight's gradient summed and
            given memory of its own)
  update    the optimizer's updates, computed and committed (Adam)
  teardown  dropping the step's graph, record and gradients
  step      all of them

and the graph's size: its rows (``nodes``), the run's slots and steps, the kernels it launched
(forward and backward) and the merged groups. ``us/node`` is the step's time over its rows.

    python -m monadl.bench phases --task bilstm-tagger --batch 64 --data ../shared/data
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

from threadpoolctl import threadpool_limits

import monadl as ml
from monadl.bench import suite_data
from monadl.bench.suite import SMOKE_SIZES, Sizes, monadl_model
from monadl.bench.suite_monadl import ADAM
from monadl.cli import positive_int
from monadl.data import sst
from monadl.do.stats import RunStats
from monadl.dsl.learning import training
from monadl.runtime.versions import COMMIT_LOCK

PHASES = ("record", "forward", "backward", "update", "teardown", "step")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--task", default="bilstm-tagger", choices=suite_data.TASKS)
    parser.add_argument("--batch", type=positive_int, default=64, help="instances per step (64)")
    parser.add_argument("--steps", type=positive_int, default=10, help="timed steps (10)")
    parser.add_argument("--warmup", type=positive_int, default=3, help="steps before timing (3)")
    parser.add_argument("--data", type=Path, default=None, help="the suite's data folder (synthetic: none)")
    parser.add_argument("--smoke", action="store_true", help="tiny models and data (for tests)")


def measure(
    task: str, batch: int, steps: int, warmup: int, data_dir: Path | None, smoke: bool
) -> dict[str, Any]:
    """The phases of ``steps`` training steps (see the module), medians in milliseconds."""
    data = suite_data.load_task(task, data_dir, smoke=smoke)
    vocabulary = sst.Vocabulary(dict.fromkeys(data.vocabulary, 1)) if task == "treenn" else None
    model = monadl_model(data, SMOKE_SIZES if smoke else Sizes(), 0, vocabulary)
    executor = ml.default_executor()
    train = data.train
    times: dict[str, list[float]] = {phase: [] for phase in PHASES}
    sizes: dict[str, list[int]] = {"nodes": [], "slots": [], "steps": [], "kernels": [], "groups": []}
    for s in range(warmup + steps):
        start = (s * batch) % max(1, len(train) - batch + 1)
        instances = train[start : start + batch]
        with ml.gc_paused():
            t0 = time.perf_counter()
            loss = model.total(instances)
            t1 = time.perf_counter()
            stats = RunStats()
            evaluation, staged = training.forward_pass(loss, executor, stats)
            t2 = time.perf_counter()
            passes = training.backward_pass(evaluation, staged)
            t3 = time.perf_counter()
            with COMMIT_LOCK:
                training.commit_step(passes, ADAM, True)
            t4 = time.perf_counter()
            graph = getattr(loss, "graph", None)  # (an engine of nodes as objects has none)
            nodes = 0 if graph is None else len(graph)
            slots, recorded = len(evaluation.run.datas), len(evaluation.run.steps)
            del loss, evaluation, passes, graph
            t5 = time.perf_counter()
        if s >= warmup:
            for phase, value in zip(
                PHASES, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4, t5 - t0), strict=True
            ):
                times[phase].append(value * 1e3)
            for name, value in zip(sizes, (nodes, slots, recorded, stats.kernels, stats.groups), strict=True):
                sizes[name].append(value)
    result: dict[str, Any] = {phase: statistics.median(values) for phase, values in times.items()}
    result.update({name: statistics.median(values) for name, values in sizes.items()})
    result["us/node"] = 1e3 * result["step"] / max(1, result["nodes"])
    return result


def run_cli(args: argparse.Namespace) -> int:
    with threadpool_limits(limits=1, user_api="blas"):
        result = measure(args.task, args.batch, args.steps, args.warmup, args.data, args.smoke)
    print(f"{args.task}, {args.batch} per step ({(ml.compiled() and 'compiled') or 'pure'} engine)")
    print(" ".join(f"{name} {result[name]:.2f}" for name in PHASES) + " ms")
    print(" ".join(f"{name} {result[name]:.0f}" for name in ("nodes", "slots", "steps", "kernels", "groups")))
    print(f"{result['us/node']:.2f} us per node")
    return 0
