"""The CIFAR-100 column benchmark (DeepLearning.scala 2, Tables 2 and 3), side by side with
hand-written NumPy and PyTorch eager.

For every configuration of columns x pool size x variant (``skip``: only the batch's fine classifier
runs; ``noskip``: all 20 run, forward and backward), it measures training steps per second of:

  monadl   the model of examples/cifar_columns.py (monadl.bench.columns_model), on an Executor
           with that many workers
  numpy    the same model by hand (forward, manual backward, SGD, buffers reused), one thread
  torch    the same model in PyTorch eager on the CPU, one thread (when torch is installed)

Each figure is the median over --repeats timed segments of --steps steps (after --warmup steps),
with the min and the max. The segments of one (columns, variant) are interleaved: NumPy, PyTorch,
monadl at each pool size, then NumPy again, and so on, so that the machine's drift in speed (20-50%
within an hour on the project's VMs) touches every implementation alike; a ratio is the median of
the rounds' ratios, each of the two implementations' segments in one round. BLAS (and torch) are
capped at one thread for the whole run: parallelism comes from independent columns on the
executor's pool, not from BLAS. NumPy and PyTorch do not use the pool, so they are measured once
per (columns, variant) and compared with every pool size. All three train the same model from the
same initial weights on the same batches.

``--device cuda`` runs monadl on CuPy arrays and PyTorch on CUDA (the hand-written NumPy model stays
out: it is the CPU's baseline), each batch moved to the GPU once, before the timing, and every timed
segment ending when the GPU's queued work is done. ``--device array-api-strict`` runs the same
plumbing on a stand-in namespace, on the CPU.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib.util
import json
import math
import platform
import resource
import statistics
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

from monadl.bench.columns_model import ColumnNetwork
from monadl.bench.columns_numpy import NumpyColumns
from monadl.bench.columns_params import init_params
from monadl.bench.columns_torch import TorchColumns
from monadl.bench.common import (
    Device,
    add_device_option,
    add_peer_options,
    blas_libraries,
    cpus,
    interleaved,
    torch_available,
)
from monadl.cli import non_negative_int, positive_float, positive_int
from monadl.data import cifar100
from monadl.data.files import atomic_file, atomic_write_bytes

IMPLEMENTATIONS = ("monadl", "numpy", "torch")


@dataclass
class Measurement:
    """Training steps per second of one implementation in one configuration."""

    implementation: str
    columns: int
    pool: int | None  # None: the implementation does not use the pool
    variant: str
    median: float
    low: float
    high: float
    rss_mib: float  # resident memory after the measurement
    samples: list[float] = field(default_factory=list)  # each segment's rate, round by round


def _rss_mib() -> float:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize() / 2**20
    except OSError:  # not Linux: the peak is the best we have
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _steps_per_second(
    steps: Sequence[Callable[[], object]],
    count: int,
    warmup: int,
    repeats: int,
    synchronize: Callable[[], None] | None = None,
) -> list[list[float]]:
    """Each of ``steps``' rates in its ``repeats`` timed segments of ``count`` calls, the segments
    taken in turn (one of each, then again: ``common.interleaved``), after ``warmup`` calls of each."""
    for step in steps:
        for _ in range(warmup):
            step()
    return interleaved([functools.partial(_segment, step, count) for step in steps], repeats, synchronize)


def _segment(step: Callable[[], object], count: int) -> int:
    for _ in range(count):
        step()
    return count


def _stepper(model: Any, batches: Sequence[tuple[Any, int, Any]]) -> Callable[[], object]:
    """One training step of ``model`` per call, on the batches, cycled."""
    stream = _cycle(batches)
    return lambda: model.step(*next(stream))


def _batches(data: cifar100.Cifar100, batch: int, count: int, dtype: Any, seed: int) -> list[cifar100.Batch]:
    """``count`` batches, read once up front: the benchmark times training, not data loading."""
    source = data.batches(batch, seed=seed, dtype=dtype, epochs=None)
    return [next(source) for _ in range(count)]


def _cycle(batches: Sequence[tuple[Any, int, Any]]) -> Iterator[tuple[Any, int, Any]]:
    while True:
        yield from batches


def open_data(args: argparse.Namespace) -> cifar100.Cifar100:
    """The run's data: ``--data``, or the synthetic set, made larger where ``--batch`` needs more
    samples per class than its default has (a batch's samples share one coarse class). A batch
    larger than the given data's largest class is refused, naming the sizes it can supply."""
    data = cifar100.open_dataset(args.data, seed=args.seed)
    largest = int(data.class_counts().max())
    if args.batch > largest and not args.data:
        per_fine_class = math.ceil(args.batch / cifar100.FINE_PER_COARSE)
        data = cifar100.open_dataset(None, seed=args.seed, per_fine_class=per_fine_class)
    elif args.batch > largest:
        raise SystemExit(
            f"columns: --batch {args.batch} is more than the data supplies: a batch's samples share "
            f"one coarse class, and the largest class of {data.describe()} has {largest} samples: "
            f"use --batch {largest} or less (or no --data: the synthetic set grows to the batch)"
        )
    return data


def measure(args: argparse.Namespace, out: Any = None) -> tuple[list[Measurement], dict[str, Any]]:
    """Runs the grid; returns the measurements and a description of the run (printed to ``out``)."""
    import monadl as ml

    out = out or sys.stdout
    device = Device(args.device)
    data = open_data(args)
    dtype = np.dtype(args.dtype)
    batches = _batches(data, args.batch, 64, dtype, args.seed)
    monadl_batches = [(device.put(x), c, fine) for x, c, fine in batches]  # the labels stay on the host
    have_torch = not args.no_torch and torch_available()
    info = {
        "device": device.describe(),
        "compiled": ml.compiled(),
        "data": data.describe(),
        "batch": args.batch,
        "hidden": args.hidden,
        "dtype": str(dtype),
        "learning_rate": args.learning_rate,
        "steps": args.steps,
        "repeats": args.repeats,
        "warmup": args.warmup,
        "check_finite": args.check_finite,
        "machine": f"{platform.machine()}, {platform.processor() or '?'}, {cpus()} CPUs",
        "python": platform.python_version(),
        "numpy": np.__version__,
        "blas": blas_libraries(),
        "torch": _torch_version()
        if have_torch
        else "skipped"
        if args.no_torch
        else "not installed (skipped)",
    }
    print(f"data: {info['data']}", file=out)
    if args.no_torch:
        print("torch: skipped (--no-torch)", file=out)
    elif not have_torch:
        print("torch: not installed, PyTorch figures skipped (pip install torch)", file=out)

    groups = [(columns, variant) for columns in args.columns for variant in args.variants]
    results: list[Measurement] = []
    with threadpool_limits(limits=1):
        if have_torch:
            import torch  # type: ignore[import-not-found, unused-ignore]

            torch.set_num_threads(1)
        for columns, variant in _progress(groups, args.progress):
            params = init_params(columns, hidden=args.hidden, seed=args.seed, dtype=dtype)  # each copies it
            with contextlib.ExitStack() as executors:
                contenders: list[tuple[str, int | None, Callable[[], object]]] = []
                if device.is_numpy:
                    numpy_model = NumpyColumns(params, variant, args.learning_rate)
                    contenders.append(("numpy", None, _stepper(numpy_model, batches)))
                if have_torch:
                    model = TorchColumns(params, variant, args.learning_rate, device=device.torch_device)
                    torch_batches = [model.on_device(*b) for b in batches]
                    contenders.append(("torch", None, _stepper(model, torch_batches)))
                for pool in args.pools:
                    executor = executors.enter_context(
                        ml.Executor(pool, limit_blas=False, check_finite=args.check_finite)
                    )
                    net = ColumnNetwork(params, variant, args.learning_rate, executor)
                    device.move_weights(net.weights.values())
                    contenders.append(("monadl", pool, _stepper(net, monadl_batches)))
                all_rates = _steps_per_second(
                    [step for _, _, step in contenders],
                    args.steps,
                    args.warmup,
                    args.repeats,
                    device.synchronize,
                )
            rss = _rss_mib()
            for (impl, pool, _), rates in zip(contenders, all_rates, strict=True):
                median = statistics.median(rates)
                results.append(
                    Measurement(impl, columns, pool, variant, median, min(rates), max(rates), rss, rates)
                )
    info["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return results, info


def _torch_version() -> str:
    import torch  # type: ignore[import-not-found, unused-ignore]

    return str(torch.__version__)


def _progress(jobs: list[Any], enabled: bool) -> Iterator[Any]:
    if not enabled or importlib.util.find_spec("tqdm") is None:  # tqdm: the optional bench extra
        yield from jobs
        return
    from tqdm import tqdm

    with tqdm(jobs, desc="columns benchmark", unit="config", file=sys.stderr) as bar:
        for job in bar:
            bar.set_postfix_str(f"columns={job[0]} {job[1]}")
            yield job


def _find(
    results: list[Measurement], impl: str, columns: int, variant: str, pool: int | None
) -> Measurement | None:
    for m in results:
        if (m.implementation, m.columns, m.variant, m.pool) == (impl, columns, variant, pool):
            return m
    return None


def ratio(a: Measurement, b: Measurement) -> float:
    """``a`` / ``b``: the median of their ratios round by round (each from their segments of one
    round, minutes apart at most), or the ratio of their medians if they have no paired segments."""
    if a.samples and len(a.samples) == len(b.samples):
        return statistics.median(x / y for x, y in zip(a.samples, b.samples, strict=True))
    return a.median / b.median


def table(results: list[Measurement], args: argparse.Namespace) -> str:
    """The results shaped like the paper's tables: one row per (columns, variant), pool sizes across."""
    lines = []
    pools = list(args.pools)
    header = f"{'columns':>7} {'variant':>7} | " + " ".join(f"{'pool ' + str(p):>21}" for p in pools)
    header += f" | {'numpy':>15} | {'torch':>15}"
    lines.append(
        "training steps/s: median [min-max]; under each, monadl / numpy and monadl / torch: the median "
        "of the rounds' ratios"
    )
    lines.append(header)
    lines.append("-" * len(header))
    for columns in args.columns:
        for variant in args.variants:
            numpy_m = _find(results, "numpy", columns, variant, None)
            torch_m = _find(results, "torch", columns, variant, None)
            cells, ratios = [], []
            for pool in pools:
                m = _find(results, "monadl", columns, variant, pool)
                cells.append(f"{m.median:7.0f} [{m.low:5.0f}-{m.high:5.0f}]" if m else f"{'-':>21}")
                parts = []
                if m and numpy_m:
                    parts.append(f"{ratio(m, numpy_m):4.2f}x np")
                if m and torch_m:
                    parts.append(f"{ratio(m, torch_m):4.2f}x pt")
                ratios.append(f"{' '.join(parts):>21}")
            np_cell = f"{numpy_m.median:6.0f} [{numpy_m.low:4.0f}]" if numpy_m else "-"
            pt_cell = f"{torch_m.median:6.0f} [{torch_m.low:4.0f}]" if torch_m else "skipped"
            lines.append(
                f"{columns:>7} {variant:>7} | " + " ".join(cells) + f" | {np_cell:>15} | {pt_cell:>15}"
            )
            lines.append(f"{'':>7} {'':>7} | " + " ".join(ratios) + f" | {'':>15} | {'':>15}")
            if len(pools) > 1 and (one := _find(results, "monadl", columns, variant, pools[0])):
                scaling = []
                for pool in pools:
                    m = _find(results, "monadl", columns, variant, pool)
                    scaling.append(f"{f'{ratio(m, one):4.2f}x pool {pools[0]}' if m else '':>21}")
                lines.append(f"{'':>7} {'':>7} | " + " ".join(scaling) + f" | {'':>15} | {'':>15}")
    if len(pools) > 1:
        lines.append(
            f"the last line of each: monadl at each pool / monadl at pool {pools[0]}, paired by round"
        )
    return "\n".join(lines)


def plot(results: list[Measurement], args: argparse.Namespace, path: Path) -> None:
    """Steps/s against pool size, one line per (columns, variant); NumPy and PyTorch as dashed levels."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(args.variants), figsize=(6 * len(args.variants), 4.5), squeeze=False)
    for ax, variant in zip(axes[0], args.variants, strict=True):
        for columns in args.columns:
            ms = [_find(results, "monadl", columns, variant, p) for p in args.pools]
            xs = [p for p, m in zip(args.pools, ms, strict=True) if m]
            line = ax.plot(
                xs,
                [m.median for m in ms if m],
                marker="o",
                label=f"monadl, {columns} column{'s' if columns != 1 else ''}",
            )
            numpy_m = _find(results, "numpy", columns, variant, None)
            if numpy_m:
                ax.axhline(numpy_m.median, color=line[0].get_color(), linestyle="--", linewidth=1)
            torch_m = _find(results, "torch", columns, variant, None)
            if torch_m:
                ax.axhline(torch_m.median, color=line[0].get_color(), linestyle=":", linewidth=1)
        torch_note = ", dotted: PyTorch" if any(m.implementation == "torch" for m in results) else ""
        ax.set_title(f"{variant}  (dashed: hand-written NumPy{torch_note})")
        ax.set_xlabel("pool size (executor workers)")
        ax.set_ylabel("training steps / s")
        ax.set_xticks(list(args.pools))
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=8)
    fig.suptitle(f"CIFAR-100 columns: batch {args.batch}, hidden {args.hidden}, {args.dtype}")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(path) as f:
        fig.savefig(f, format="png", dpi=110)
    plt.close(fig)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``columns`` subcommand's options."""
    parser.add_argument("--columns", type=positive_int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--pools", type=positive_int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--variants", nargs="+", choices=["skip", "noskip"], default=["skip", "noskip"])
    parser.add_argument(
        "--batch",
        type=positive_int,
        default=16,
        help="samples per step, all of one coarse class (the synthetic set grows to fit; default 16)",
    )
    parser.add_argument("--hidden", type=positive_int, default=64)
    parser.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    parser.add_argument("--learning-rate", type=positive_float, default=1e-4)
    parser.add_argument("--steps", type=positive_int, default=200, help="steps per timed segment")
    parser.add_argument("--repeats", type=positive_int, default=5, help="timed segments per configuration")
    parser.add_argument(
        "--warmup", type=non_negative_int, default=30, help="untimed steps before the segments"
    )
    add_device_option(parser)
    parser.add_argument("--data", help="a CIFAR-100 binary folder, train.bin or .tar.gz (default: synthetic)")
    parser.add_argument(
        "--no-check-finite",
        dest="check_finite",
        action="store_false",
        help="monadl's steps skip the check that new weight values are finite (Executor(check_finite=False))",
    )
    add_peer_options(parser, dynet=False)


def run_cli(args: argparse.Namespace) -> int:
    """Runs the benchmark from parsed arguments; prints the table."""
    if args.smoke:
        args.columns, args.pools = args.columns[:2], args.pools[:2]
        args.steps, args.repeats, args.warmup = 3, 2, 1
    results, info = measure(args)
    print(table(results, args))
    print(f"peak RSS: {info['peak_rss_mib']:.0f} MiB; torch: {info['torch']}; BLAS: {info['blas']}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        data = {"run": info, "results": [asdict(m) for m in results]}
        atomic_write_bytes(args.json, json.dumps(data, indent=2).encode())
        print(f"wrote {args.json}")
    if args.plot:
        plot(results, args, args.plot)
        print(f"wrote {args.plot}")
    return 0
