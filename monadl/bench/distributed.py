"""Data-parallel training on Ray (``monadl.distributed.DataParallel``): what more workers gain, and
what Ray costs a step.

  throughput   steps/s and samples/s of training the Tree-LSTM of examples/tree_lstm.py on
               synthetic SST-like trees (``monadl.data.sst``), on 1, 2, 4, ... Ray workers (up to
               --max-workers, default: this machine's CPUs; or --workers 1,2,3), against one plain
               process training the same model from the same weights on the same global batches
               (``ml.train_blocking(loss * (1 / n), optimizer)`` in the driver). The speedup is the
               median of the rounds' ratios to the plain process; the scaling efficiency is
               speedup / workers. Every configuration is up at once and they take turns, one timed
               segment of --steps steps each per round, --repeats rounds (after --warmup untimed
               steps), so that the machine's drift in speed touches them alike.
  overhead     Ray's part of a step (``StepStats.overhead_seconds``: scatter, reduction, broadcast
               and commit) for a model whose gradients are exactly 1 MiB (one float64 weight of
               512 x 256, a loss that costs next to nothing), on 1 and 2 workers, each reduction
               ("tree", "driver"); the target is under 5 ms.
  bytes        the bytes the driver sends and receives per step (``count_bytes=True``) on 2 and 4
               workers, each reduction, for that model, beside the gradients that must pass
               through the driver (its reduction's: one MiB per worker in, one out).

It prints a table of each; ``--json PATH`` writes every figure, ``--plot PATH`` a PNG of steps/s
against workers (the plain process a dashed level) and of the overhead. ``--quick``: tiny sizes, a
run of seconds but for Ray's start and its actors' (the smoke test).

BLAS runs on one thread everywhere: in the plain process (threadpoolctl) and in each Ray worker (an
actor of one CPU, capped by threadpoolctl too). The driver shares the machine's cores with the
workers. Ray is started here unless it is running already (then it needs enough CPUs for the
workers that are up at once), and stopped at the end if it was started here.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import json
import os
import platform
import statistics
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
from returns.result import Failure, Result
from threadpoolctl import threadpool_limits

import monadl as ml
from monadl.bench.common import cpus, interleaved
from monadl.bench.treelstm_model import TreeLstm
from monadl.cli import Progress, add_output_arguments, check_plot, non_negative_int, positive_int
from monadl.data import sst
from monadl.data.files import atomic_file, atomic_write_bytes
from monadl.data.trees import Tree
from monadl.distributed import DataParallel, StepStats

ROOT = Path(__file__).resolve().parents[2]
"""Where the driver's ``monadl`` is (a checkout, or site-packages): on the workers' ``PYTHONPATH``, so
that they import the same one."""

DEFAULT_BATCH = 128
"""The global batch (trees): a plain step of well over 20 ms, so that Ray's cost per step (the shards
sent, the gradients reduced: milliseconds, growing with the batch) is set against enough work
(docs/benchmarks.md has the figures; ``--batch-size 32`` shows a small step)."""
MIN_PLAIN_STEP_MS = 20.0
LEARNING_RATE = 0.05  # examples/tree_lstm.py's Adagrad (its embeddings have their own, 0.1)

OVERHEAD_SHAPE = (512, 256)
"""The overhead model's one float64 weight: 131,072 parameters, 1 MiB of gradients."""
OVERHEAD_WORKERS = (1, 2)
BYTES_WORKERS = (2, 4)
REDUCTIONS: tuple[Literal["tree", "driver"], ...] = ("tree", "driver")
TARGET_OVERHEAD_MS = 5.0
"""The issue's target for Ray's overhead per step with 1 MiB of gradients."""


# ---------------------------------------------------------------------------------------------------
# Results


@dataclass
class Throughput:
    """One configuration's training speed: the plain process (``workers`` 0) or Ray workers."""

    workers: int
    steps_per_s: float  # the median over the rounds
    low: float
    high: float
    samples_per_s: float
    step_ms: float  # 1000 / steps_per_s
    speedup: float  # against the plain process: the median of the rounds' ratios
    efficiency: float  # speedup / workers (1 for the plain process)
    final_loss: float  # the last step's mean loss (every configuration trains alike)
    # Ray workers: StepStats' means over the timed steps. Means, not medians: they add up to step_ms
    # (but for the driver's little work outside DataParallel.step), slow steps included.
    compute_ms: float | None = None
    apply_ms: float | None = None
    overhead_ms: float | None = None
    samples: list[float] = field(default_factory=list)  # steps/s, round by round


@dataclass
class Overhead:
    """Ray's overhead per step for the 1 MiB model: medians over the timed steps, in ms."""

    workers: int
    reduction: str
    overhead_ms: float
    low_ms: float
    high_ms: float
    step_ms: float
    compute_ms: float
    apply_ms: float
    steps: int
    meets_target: bool


@dataclass
class DriverBytes:
    """The driver's bytes per step for the 1 MiB model, as ``StepStats.driver_bytes`` counts them;
    ``gradient_bytes``: the gradients that must pass through the driver, whatever else it moves
    (``(workers + 1)`` MiB for the driver's reduction, none for the tree's)."""

    workers: int
    reduction: str
    driver_bytes: int
    gradient_bytes: int


@dataclass
class Report:
    """Everything one run measured, and how it ran (``run``)."""

    run: dict[str, Any]
    throughput: list[Throughput]
    overhead: list[Overhead]
    driver_bytes: list[DriverBytes]


# ---------------------------------------------------------------------------------------------------
# What the workers run (pickled by reference: this module and monadl.bench.treelstm_model import there)


@dataclass(frozen=True)
class TreeLstmBuild:
    """``build()`` for DataParallel: the Tree-LSTM, BLAS capped at one thread in the worker."""

    vocabulary_size: int
    embedding: int
    hidden: int
    seed: int

    def model(self) -> TreeLstm:
        """The model alone (the plain process's, the same weights as every replica's)."""
        return TreeLstm(self.vocabulary_size, self.embedding, self.hidden, seed=self.seed)

    def __call__(self) -> TreeLstm:
        # For the actor's lifetime: it does nothing else, and the plain process is capped alike.
        threadpool_limits(limits=1)
        return self.model()


@dataclass(frozen=True)
class TreeLoss:
    """``loss(model, shard)``: the sum of the shard's per-tree losses (DataParallel divides by the
    global batch's size)."""

    vocabulary: sst.Vocabulary

    def __call__(self, model: TreeLstm, trees: Sequence[Tree]) -> ml.FloatLayer:
        loss: ml.FloatLayer = model.loss(trees, self.vocabulary.index)
        return loss


def mebibyte_model() -> ml.ArrayWeight:
    """The overhead model: one float64 weight whose gradient is 1 MiB."""
    threadpool_limits(limits=1)
    return ml.ArrayWeight(np.zeros(OVERHEAD_SHAPE, dtype=np.float64), name="w")


def mebibyte_loss(weight: ml.ArrayWeight, shard: np.ndarray) -> ml.FloatLayer:
    """The sum of the weight, once per example of the shard (a ones-valued array): next to no work,
    and a dense gradient of the weight's whole size."""
    return ml.sum(weight) * float(np.sum(shard))


# ---------------------------------------------------------------------------------------------------
# Ray


def import_ray() -> Any:
    """The ``ray`` module, or an exit that says how to install it."""
    try:
        return importlib.import_module("ray")
    except ImportError:
        raise SystemExit(
            "distributed: this benchmark needs Ray, monadl's optional extra 'distributed': "
            "pip install 'monadl[distributed]' (or pip install ray)"
        ) from None


@contextlib.contextmanager
def ray_cluster(ray: Any, needed: int) -> Iterator[dict[str, Any]]:
    """Ray, started here for ``needed`` workers at once (or more logical CPUs: the machine's) unless
    it is running; yields how it runs, and stops it if it was started here."""
    started = not ray.is_initialized()
    if started:
        # The workers import this module and its model by name, and run the driver's engine.
        env = {"PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
        for name in ("MONADL_PURE", "MONADL_WORKERS"):
            if name in os.environ:
                env[name] = os.environ[name]
        ray.init(
            num_cpus=max(needed, os.cpu_count() or 1),
            include_dashboard=False,
            logging_level="ERROR",
            log_to_driver=False,
            runtime_env={"env_vars": env},
        )
    try:
        have = int(ray.cluster_resources().get("CPU", 0))
        if have < needed:
            raise SystemExit(
                f"distributed: the running Ray cluster has {have} CPUs; this run holds {needed} "
                "workers at once (one CPU each): fewer --workers, or stop Ray and let the benchmark "
                "start its own"
            )
        yield {"ray": ray.__version__, "ray_cpus": have, "ray_started_here": started}
    finally:
        if started:
            ray.shutdown()


def _unwrap(result: Result[float, Any]) -> float:
    """The step's loss, or its error raised (a benchmark's step must not fail)."""
    if isinstance(result, Failure):
        raise result.failure()
    value: float = result.unwrap()
    return value


def _step(trainer: DataParallel[Any, Any], batch: Any) -> tuple[float, StepStats]:
    """One step's loss and where its time went."""
    loss = _unwrap(trainer.step(batch))
    assert trainer.last_stats is not None  # (a step that succeeded sets them)
    return loss, trainer.last_stats


def _median_ms(values: Sequence[float]) -> float:
    return statistics.median(values) * 1e3


def _mean_ms(values: Sequence[float]) -> float:
    return statistics.mean(values) * 1e3


# ---------------------------------------------------------------------------------------------------
# Measurements


def measure_throughput(args: argparse.Namespace, info: dict[str, Any]) -> list[Throughput]:
    """The plain process and DataParallel on each of ``args.workers``, interleaved (see the module)."""
    trees = sst.synthetic_trees(
        args.batch_size * args.steps, seed=args.seed, min_leaves=args.min_leaves, max_leaves=args.max_leaves
    )
    vocabulary = sst.Vocabulary.from_trees(trees)
    batches = list(ml.DataLoader(trees, args.batch_size, collate=list))
    leaves = [len(tree) for tree in trees]
    info["model"] = (
        f"Tree-LSTM of examples/tree_lstm.py: embedding {args.embedding}, hidden {args.hidden}, "
        f"vocabulary {len(vocabulary)}, Adagrad {LEARNING_RATE}"
    )
    info["data"] = (
        f"{len(trees)} synthetic SST-like trees (monadl.data.sst, seed {args.seed}), "
        f"{args.min_leaves}-{args.max_leaves} leaves, {statistics.mean(leaves):.1f} on average; "
        f"{len(batches)} global batches of {args.batch_size}, the same for every configuration"
    )
    build = TreeLstmBuild(len(vocabulary), args.embedding, args.hidden, args.seed)
    loss = TreeLoss(vocabulary)
    plain_model = build.model()
    plain_optimizer = ml.Adagrad(LEARNING_RATE)

    def plain(batch: list[Tree]) -> float:
        return _unwrap(ml.train_blocking(loss(plain_model, batch) * (1.0 / len(batch)), plain_optimizer))

    stats: list[list[StepStats]] = [[] for _ in range(len(args.workers) + 1)]  # of the timed steps
    losses = [0.0] * (len(args.workers) + 1)
    total = (args.warmup + args.steps * args.repeats) * (len(args.workers) + 1)
    with (
        Progress(total, desc="throughput", unit="steps", enabled=args.progress) as progress,
        contextlib.ExitStack() as stack,
    ):
        trainers: list[DataParallel[Any, Sequence[Tree]] | None] = [None]  # None: the plain process
        for workers in args.workers:
            trainers.append(
                stack.enter_context(DataParallel(build, loss, ml.Adagrad(LEARNING_RATE), workers))
            )

        def run(k: int, count: int, timed: bool) -> int:
            trainer = trainers[k]
            for i in range(count):
                batch = batches[i % len(batches)]
                if trainer is None:
                    losses[k] = plain(batch)
                else:
                    losses[k], step = _step(trainer, batch)
                    if timed:
                        stats[k].append(step)
                progress.update(1)
            return count

        for k in range(len(trainers)):
            run(k, args.warmup, timed=False)
        segments = [functools.partial(run, k, args.steps, True) for k in range(len(trainers))]
        rates = interleaved(segments, args.repeats)

    results = []
    for k, samples in enumerate(rates):
        workers = 0 if k == 0 else args.workers[k - 1]
        median = statistics.median(samples)
        speedup = statistics.median(x / y for x, y in zip(samples, rates[0], strict=True))
        found = stats[k]
        results.append(
            Throughput(
                workers=workers,
                steps_per_s=median,
                low=min(samples),
                high=max(samples),
                samples_per_s=median * args.batch_size,
                step_ms=1e3 / median,
                speedup=speedup,
                efficiency=speedup / max(workers, 1),
                final_loss=losses[k],
                compute_ms=_mean_ms([s.compute_seconds for s in found]) if found else None,
                apply_ms=_mean_ms([s.apply_seconds for s in found]) if found else None,
                overhead_ms=_mean_ms([s.overhead_seconds for s in found]) if found else None,
                samples=samples,
            )
        )
    return results


def plain_alone(args: argparse.Namespace) -> list[float]:
    """The plain process's steps/s per round, in this process, without Ray: what a user's own
    single-process run gets (``--plain-alone``: ``measure`` runs it as a subprocess of its own).
    The driver's plain steps run slower than this: a Ray driver is a busier process."""
    trees = sst.synthetic_trees(
        args.batch_size * args.steps, seed=args.seed, min_leaves=args.min_leaves, max_leaves=args.max_leaves
    )
    vocabulary = sst.Vocabulary.from_trees(trees)
    batches = list(ml.DataLoader(trees, args.batch_size, collate=list))
    build = TreeLstmBuild(len(vocabulary), args.embedding, args.hidden, args.seed)
    loss = TreeLoss(vocabulary)
    model = build.model()
    optimizer = ml.Adagrad(LEARNING_RATE)

    def run(count: int) -> int:
        for i in range(count):
            batch = batches[i % len(batches)]
            _unwrap(ml.train_blocking(loss(model, batch) * (1.0 / len(batch)), optimizer))
        return count

    with threadpool_limits(limits=1):
        run(args.warmup)
        return interleaved([functools.partial(run, args.steps)], args.repeats)[0]


def measure_plain_alone(args: argparse.Namespace) -> list[float]:
    """:func:`plain_alone` in a process of its own (no Ray in it), with the same arguments."""
    command = [
        sys.executable, "-m", "monadl.bench", "distributed", "--plain-alone",
        "--batch-size", str(args.batch_size), "--steps", str(args.steps), "--repeats", str(args.repeats),
        "--warmup", str(args.warmup), "--embedding", str(args.embedding), "--hidden", str(args.hidden),
        "--min-leaves", str(args.min_leaves), "--max-leaves", str(args.max_leaves), "--seed", str(args.seed),
    ]  # fmt: skip
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"distributed: the plain process alone failed:\n{done.stderr[-2000:]}")
    rates: list[float] = json.loads(done.stdout.strip().splitlines()[-1])
    return rates


def measure_overhead(args: argparse.Namespace) -> list[Overhead]:
    """StepStats of the 1 MiB model on each of OVERHEAD_WORKERS, both reductions taking turns."""
    batch = np.ones(8)
    results = []
    total = len(OVERHEAD_WORKERS) * len(REDUCTIONS) * (args.warmup + args.overhead_steps * args.repeats)
    with Progress(total, desc="overhead", unit="steps", enabled=args.progress) as progress:
        # One worker count at a time: both reductions' workers are up at once, and no more.
        for workers in OVERHEAD_WORKERS:
            with contextlib.ExitStack() as stack:
                trainers = [
                    stack.enter_context(
                        DataParallel(mebibyte_model, mebibyte_loss, ml.SGD(1e-3), workers, reduction=r)
                    )
                    for r in REDUCTIONS
                ]
                found: list[list[StepStats]] = [[] for _ in trainers]
                for trainer in trainers:
                    for _ in range(args.warmup):
                        _unwrap(trainer.step(batch))
                        progress.update(1)
                for _ in range(args.repeats):
                    for trainer, stats in zip(trainers, found, strict=True):
                        for _ in range(args.overhead_steps):
                            stats.append(_step(trainer, batch)[1])
                            progress.update(1)
            for reduction, stats in zip(REDUCTIONS, found, strict=True):
                overheads = [s.overhead_seconds * 1e3 for s in stats]
                median = statistics.median(overheads)
                results.append(
                    Overhead(
                        workers=workers,
                        reduction=reduction,
                        overhead_ms=median,
                        low_ms=min(overheads),
                        high_ms=max(overheads),
                        step_ms=_median_ms([s.seconds for s in stats]),
                        compute_ms=_median_ms([s.compute_seconds for s in stats]),
                        apply_ms=_median_ms([s.apply_seconds for s in stats]),
                        steps=len(stats),
                        meets_target=median < TARGET_OVERHEAD_MS,
                    )
                )
    return results


def measure_bytes() -> list[DriverBytes]:
    """The driver's bytes of a step of the 1 MiB model (the second: the first may differ in setup)."""
    gradient = int(np.prod(OVERHEAD_SHAPE)) * np.dtype(np.float64).itemsize
    results = []
    for workers in BYTES_WORKERS:
        for reduction in REDUCTIONS:
            with DataParallel(
                mebibyte_model, mebibyte_loss, ml.SGD(1e-3), workers, reduction=reduction, count_bytes=True
            ) as trainer:
                for _ in range(2):
                    _, stats = _step(trainer, np.ones(8))
                assert stats.driver_bytes is not None
                through_driver = (workers + 1) * gradient if reduction == "driver" else 0
                results.append(DriverBytes(workers, reduction, stats.driver_bytes, through_driver))
    return results


def workers_held(args: argparse.Namespace) -> int:
    """The most workers up at once: every throughput configuration's, or one overhead pair's."""
    counts: list[int] = args.workers
    return max(sum(counts), 2 * max(OVERHEAD_WORKERS), max(BYTES_WORKERS))


def measure(args: argparse.Namespace) -> Report:
    """Every measurement, with Ray started (or found) for them."""
    ray = import_ray()
    info: dict[str, Any] = {
        "machine": f"{platform.machine()}, {platform.processor() or '?'}, {cpus()} CPUs",
        "cpus": cpus(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "engine": "compiled (mypyc)" if ml.compiled() else "from source",
        "blas": "1 thread in the plain process and in each Ray worker (threadpoolctl)",
        "batch_size": args.batch_size,
        "workers": list(args.workers),
        "steps": args.steps,
        "repeats": args.repeats,
        "warmup": args.warmup,
        "overhead_steps": args.overhead_steps,
    }
    alone = measure_plain_alone(args)  # first: no Ray running beside it
    info["plain_alone_steps_per_s"] = alone
    info["plain_alone_step_ms"] = 1e3 / statistics.median(alone)
    with ray_cluster(ray, workers_held(args)) as cluster, threadpool_limits(limits=1):
        info.update(cluster)
        throughput = measure_throughput(args, info)
        overhead = measure_overhead(args)
        driver_bytes = measure_bytes()
    info["plain_step_ms"] = throughput[0].step_ms
    return Report(info, throughput, overhead, driver_bytes)


# ---------------------------------------------------------------------------------------------------
# Reporting


def _config(workers: int) -> str:
    return "plain process" if workers == 0 else f"ray, {workers} worker{'s' if workers != 1 else ''}"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def format_report(report: Report) -> str:
    """The run's description and its three tables."""
    run = report.run
    plain = report.throughput[0]
    lines = [
        f"model: {run['model']}",
        f"data: {run['data']}",
        f"machine: {run['machine']}; Python {run['python']}, NumPy {run['numpy']}, Ray {run['ray']} "
        f"({'started here' if run['ray_started_here'] else 'already running'}, {run['ray_cpus']} CPUs)",
        f"engine: {run['engine']}; BLAS: {run['blas']}; the driver shares the cores with the workers",
        f"plain process: one step of {run['batch_size']} trees took {plain.step_ms:.1f} ms (median)",
    ]
    if plain.step_ms < MIN_PLAIN_STEP_MS:
        lines.append(
            f"  (under {MIN_PLAIN_STEP_MS:.0f} ms: Ray's per-step overhead weighs heavily; "
            "a larger --batch-size shows what the workers gain)"
        )
    lines += [
        "",
        f"throughput: medians of {run['repeats']} rounds of {run['steps']} steps (after {run['warmup']} "
        f"warm-up step{'s' if run['warmup'] != 1 else ''} each); speedup: the median of the rounds' "
        "ratios to the plain process; compute, apply, Ray: StepStats' means per step, in ms (the "
        "slowest worker's forward and backward, its update, Ray's overhead)",
    ]
    header = (
        f"{'configuration':<16} {'steps/s':>8} {'[min-max]':>13} {'samples/s':>10} {'step ms':>8} "
        f"{'compute':>8} {'apply':>6} {'Ray':>6} {'speedup':>8} {'efficiency':>10}"
    )
    lines += [header, "-" * len(header)]
    for t in report.throughput:
        spread = f"[{t.low:.1f}-{t.high:.1f}]"
        efficiency = "-" if t.workers == 0 else f"{t.efficiency:.0%}"
        lines.append(
            f"{_config(t.workers):<16} {t.steps_per_s:8.2f} {spread:>13} {t.samples_per_s:10.1f} "
            f"{t.step_ms:8.1f} {_ms(t.compute_ms):>8} {_ms(t.apply_ms):>6} {_ms(t.overhead_ms):>6} "
            f"{t.speedup:7.2f}x {efficiency:>10}"
        )
    drift = max(abs(t.final_loss - plain.final_loss) / abs(plain.final_loss) for t in report.throughput)
    lines.append(f"(the last step's loss, every configuration against the plain process: within {drift:.1e})")
    alone_ms = run.get("plain_alone_step_ms")
    if alone_ms is not None:
        against = ", ".join(
            f"{t.workers} worker{'s' if t.workers != 1 else ''} {alone_ms / t.step_ms:.2f}x"
            for t in report.throughput[1:]
        )
        lines.append(
            f"a plain process of its own (no Ray in it, measured first): one step {alone_ms:.1f} ms "
            f"(the driver's: {plain.step_ms:.1f} ms); the speedup against it: {against}"
        )

    shape = " x ".join(map(str, OVERHEAD_SHAPE))
    lines += [
        "",
        f"Ray's overhead per step, 1 MiB of gradients (one float64 weight of {shape}): "
        f"StepStats.overhead_seconds, median of {run['repeats']} rounds of {run['overhead_steps']} "
        f"steps; target under {TARGET_OVERHEAD_MS:.0f} ms",
    ]
    header = (
        f"{'workers':>7} {'reduction':>9} {'overhead ms':>11} {'[min-max]':>13} {'step ms':>8} "
        f"{'compute ms':>10} {'apply ms':>8} {'target':>7}"
    )
    lines += [header, "-" * len(header)]
    for o in report.overhead:
        spread = f"[{o.low_ms:.1f}-{o.high_ms:.1f}]"
        lines.append(
            f"{o.workers:>7} {o.reduction:>9} {o.overhead_ms:11.2f} {spread:>13} {o.step_ms:8.2f} "
            f"{o.compute_ms:10.2f} {o.apply_ms:8.2f} {'met' if o.meets_target else 'missed':>7}"
        )

    lines += [
        "",
        "the driver's bytes per step, 1 MiB of gradients (StepStats.driver_bytes, count_bytes=True)",
    ]
    header = f"{'workers':>7} {'reduction':>9} {'driver bytes':>13} {'gradients that pass the driver':>31}"
    lines += [header, "-" * len(header)]
    for b in report.driver_bytes:
        lines.append(f"{b.workers:>7} {b.reduction:>9} {b.driver_bytes:>13,} {b.gradient_bytes:>31,}")
    if any(b.driver_bytes < b.gradient_bytes for b in report.driver_bytes):
        lines.append(
            "(driver bytes below the gradients the driver's reduction receives and sends: "
            "StepStats.driver_bytes under-counts them)"
        )
    return "\n".join(lines)


def to_json(report: Report) -> dict[str, Any]:
    """The report as JSON-ready data: every figure."""
    return {
        "benchmark": "distributed",
        "run": report.run,
        "throughput": {"unit": "steps/s", "rows": [asdict(t) for t in report.throughput]},
        "overhead": {
            "unit": "ms",
            "gradient_bytes": int(np.prod(OVERHEAD_SHAPE)) * 8,
            "parameters": int(np.prod(OVERHEAD_SHAPE)),
            "target_ms": TARGET_OVERHEAD_MS,
            "rows": [asdict(o) for o in report.overhead],
        },
        "driver_bytes": {"unit": "bytes", "rows": [asdict(b) for b in report.driver_bytes]},
    }


def plot(report: Report, path: Path) -> None:
    """Steps/s against workers (the plain process a dashed level) and the overhead's bars."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(11, 4.2), layout="constrained")
    left, right = figure.subplots(1, 2)
    plain, ray = report.throughput[0], report.throughput[1:]
    counts = [t.workers for t in ray]
    left.errorbar(
        counts,
        [t.steps_per_s for t in ray],
        yerr=[[t.steps_per_s - t.low for t in ray], [t.high - t.steps_per_s for t in ray]],
        marker="o",
        capsize=3,
        label="DataParallel (median, min-max)",
    )
    left.axhline(plain.steps_per_s, color="gray", linestyle="--", label="plain process")
    left.set_xticks(counts)
    left.set_xlabel("Ray workers")
    left.set_ylabel("training steps / s")
    left.set_ylim(bottom=0)
    left.set_title(f"Tree-LSTM, global batch {report.run['batch_size']}")
    left.legend(fontsize=8)

    width = 0.8 / len(REDUCTIONS)
    for k, reduction in enumerate(REDUCTIONS):
        rows = [o for o in report.overhead if o.reduction == reduction]
        xs = [i + (k - (len(REDUCTIONS) - 1) / 2) * width for i in range(len(rows))]
        right.bar(xs, [o.overhead_ms for o in rows], width, label=f'reduction="{reduction}"')
    right.axhline(TARGET_OVERHEAD_MS, color="red", linestyle=":", label=f"target {TARGET_OVERHEAD_MS:.0f} ms")
    right.set_xticks(range(len(OVERHEAD_WORKERS)), [_config(w) for w in OVERHEAD_WORKERS])
    right.set_ylabel("overhead per step, ms (median)")
    right.set_title("Ray's overhead, 1 MiB of gradients")
    right.legend(fontsize=8)
    with atomic_file(path) as f:
        figure.savefig(f, format="png", dpi=110)


# ---------------------------------------------------------------------------------------------------
# Command line


def worker_counts(text: str) -> list[int]:
    """``1,2,4``: distinct positive worker counts, in ascending order."""
    try:
        counts = sorted({positive_int(part.strip()) for part in text.split(",")})
    except argparse.ArgumentTypeError as e:
        raise argparse.ArgumentTypeError(f"expected worker counts like 1,2,4: {e}") from None
    return counts


def default_workers(most: int) -> list[int]:
    """1, 2, 4, ... up to ``most``, and ``most`` itself."""
    counts = [1]
    while counts[-1] * 2 <= most:
        counts.append(counts[-1] * 2)
    return counts if counts[-1] == most else [*counts, most]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``distributed`` subcommand's options."""
    parser.add_argument(
        "--workers",
        type=worker_counts,
        help="worker counts to measure, such as 1,2 (default: see --max-workers)",
    )
    parser.add_argument(
        "--max-workers",
        type=positive_int,
        default=os.cpu_count() or 1,
        help="1, 2, 4, ... workers up to this many (default: the machine's CPUs)",
    )
    parser.add_argument(
        "--batch-size", type=positive_int, default=DEFAULT_BATCH, help="the global batch, in trees"
    )
    parser.add_argument("--steps", type=positive_int, default=20, help="steps per timed segment")
    parser.add_argument("--repeats", type=positive_int, default=5, help="rounds of one segment each")
    parser.add_argument("--warmup", type=non_negative_int, default=3, help="untimed steps of each first")
    parser.add_argument(
        "--overhead-steps", type=positive_int, default=30, help="steps per round of the overhead model"
    )
    parser.add_argument("--embedding", type=positive_int, default=128)
    parser.add_argument("--hidden", type=positive_int, default=128)
    parser.add_argument("--min-leaves", type=positive_int, default=10, help="synthetic trees' fewest leaves")
    parser.add_argument("--max-leaves", type=positive_int, default=40, help="synthetic trees' most leaves")
    parser.add_argument("--seed", type=non_negative_int, default=0)
    parser.add_argument(
        "--quick", action="store_true", help="a seconds-long run (the smoke test): tiny sizes"
    )
    parser.add_argument("--json", type=Path, help="write every figure as JSON here")
    parser.add_argument("--plain-alone", action="store_true", help=argparse.SUPPRESS)  # (see plain_alone)
    add_output_arguments(parser, plot="steps/s against workers and the overhead per step")
    # check_plot reports a bad --plot through this subcommand's parser, before Ray starts.
    parser.set_defaults(parser=parser)


def run_cli(args: argparse.Namespace) -> int:
    """Runs the benchmark from parsed arguments; prints the tables."""
    check_plot(args.parser, args.plot)
    args.progress = not args.no_progress
    if args.quick:
        args.workers = [1, 2]
        args.batch_size, args.embedding, args.hidden = 8, 16, 16
        args.min_leaves, args.max_leaves = 2, 6
        args.steps, args.repeats, args.warmup, args.overhead_steps = 2, 2, 1, 3
    if args.workers is None:
        args.workers = default_workers(args.max_workers)
    if args.min_leaves > args.max_leaves:
        raise SystemExit(
            f"distributed: --min-leaves {args.min_leaves} is above --max-leaves {args.max_leaves}"
        )
    if args.batch_size < max(args.workers):
        raise SystemExit(
            f"distributed: --batch-size {args.batch_size} is below {max(args.workers)} workers: "
            "every worker needs a tree"
        )
    if args.plain_alone:
        print(json.dumps(plain_alone(args)))
        return 0
    report = measure(args)
    print(format_report(report))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(args.json, json.dumps(to_json(report), indent=2).encode())
        print(f"wrote {args.json}")
    if args.plot:
        plot(report, Path(args.plot))
        print(f"wrote {args.plot}")
    return 0
