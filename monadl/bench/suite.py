"""The DyNet benchmark suite (neulab/dynet-benchmark, the suite DyNet's authors compare toolkits on
dynamic networks with): its four tasks, at 1, 16 and 64 instances per update, with monadl side by
side with DyNet (autobatching on and off) and PyTorch eager, in one run.

Tasks, with the suite's sizes (``run-tests.sh``); every one trains with Adam (learning rate 0.001):

  bilstm-tagger           word embedding 128, BiLSTM hidden 50 a direction, MLP 32; a word seen 5 times
                          or fewer in training is unknown; a loss per word
  bilstm-tagger-withchar  the same, a rare word read by a char BiLSTM (char embedding 20, hidden 64
                          a direction) over its spelling between ``<*>`` pads
  treenn                  the suite's Tree-LSTM (embedding 128, hidden 128), a loss at every node
  rnnlm-batch             an LSTM language model, embedding 128, hidden 256, a softmax over the
                          vocabulary

Implementations (one thread each: BLAS capped by threadpoolctl, ``torch.set_num_threads(1)``, DyNet
on one CPU):

  monadl           ``monadl.bench.suite_monadl``: per instance, plain Python, the default executor
                   (dynamic batching on), one ``ml.add_n`` of a mini-batch's losses, one step
  dynet autobatch  the suite's ``dynet-py`` scripts' models (``monadl.bench.suite_dynet``) with
  dynet            autobatching on and off, each in a worker process of its own, driven step by step
  torch eager      the suite's ``pytorch`` scripts' models (``monadl.bench.suite_torch``; none for
                   ``treenn``, for which the suite has no PyTorch script)

Every implementation starts from the same weights (monadl's, copied) and makes, per update, the
summed loss of the mini-batch's instances, one backward and one Adam step. Data: synthetic by default
(``monadl.bench.suite_data``); ``--data DIR`` reads the real sets (a task whose files are absent is
skipped, with a note).

For each task and batch size, after ``--warmup`` instances' worth of steps, ``--repeats`` rounds time
one segment of at least ``--instances`` instances of every implementation in turn
(``common.interleaved``); the rates are instances/s and words/s (nodes/s for ``treenn``), the median
[min-max] over the rounds, and each ratio monadl / other is the median [min-max] of the rounds' own
ratios. A segment holds the same instances at every batch size; ``rnnlm-batch`` batches run over the
training set sorted by length as its scripts do, the segment's batches spread over its lengths.

Learning check: the mean loss per word (node) of a fixed held-out set, before the warm-up and after
the last segment, for every implementation and configuration. One whose loss did not fall (by
``MIN_FALL``, relative) gets a warning line and ``"learned": false`` in the JSON; and since all start
from the same weights, their initial losses must agree (a warning if not).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import math
import platform
import resource
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from threadpoolctl import threadpool_limits

from monadl.bench import suite_data
from monadl.bench.common import (
    Device,
    Progress,
    add_device_option,
    add_peer_options,
    blas_libraries,
    cpus,
    interleaved,
    torch_available,
)
from monadl.bench.suite_data import TASKS, UNITS, Missing, TaskData
from monadl.bench.suite_dynet import DynetPeer
from monadl.bench.suite_monadl import BiLstmTagger, CharBiLstmTagger, RnnLm, SuiteModel, TreeNN
from monadl.cli import non_negative_int, positive_int
from monadl.data import sst
from monadl.data.files import atomic_file, atomic_write_bytes

#: Implementation -> its label in the tables and the plot, in the order shown.
LABELS = {"monadl": "monadl", "dynet-autobatch": "dynet autobatch", "dynet": "dynet", "torch": "torch eager"}
#: What an instance of each task is called.
INSTANCES = {"bilstm-tagger": "sentences", "bilstm-tagger-withchar": "sentences", "treenn": "trees"}
MIN_FALL = 1e-4  # the held-out loss must fall by more than float32 rounding: this much of itself
AGREE = 1e-3  # initial held-out losses (same weights) may differ by this much of themselves


@dataclass(frozen=True)
class Sizes:
    """The models' sizes: the suite's (``run-tests.sh``), or tiny ones for ``--smoke``."""

    embedding: int = 128  # word embedding: taggers, treenn, rnnlm
    hidden: int = 50  # the taggers' LSTM, each direction
    mlp: int = 32
    char_embedding: int = 20
    tree_hidden: int = 128
    lm_hidden: int = 256


SMOKE_SIZES = Sizes(embedding=16, hidden=8, mlp=8, char_embedding=6, tree_hidden=8, lm_hidden=16)


@dataclass
class Measurement:
    """One implementation's rates and learning on one task at one batch size."""

    task: str
    implementation: str  # a key of LABELS
    batch: int
    instances: int  # per timed segment
    units: int  # words or nodes per timed segment
    median: float  # instances / s
    low: float
    high: float
    units_median: float  # words (nodes) / s
    units_low: float
    units_high: float
    loss_before: float  # mean held-out loss per word (node), before the warm-up
    loss_after: float  # ... after the last timed segment
    steps: int  # training steps taken between the two
    learned: bool  # loss_after < loss_before * (1 - MIN_FALL)
    samples: list[float] = field(default_factory=list)  # instances / s, one per round


class Contender(Protocol):
    """One implementation of a task, from the same initial weights at every ``new_model``."""

    implementation: str

    def new_model(self) -> None: ...
    def step(self, indices: Sequence[int]) -> float: ...
    def evaluate(self, indices: Sequence[int]) -> float: ...
    def prepare(self, batches: Sequence[Sequence[int]]) -> None: ...
    def segment(self) -> None: ...


class _Model(Protocol):
    def step(self, batch: Sequence[Any]) -> float: ...
    def evaluate(self, batch: Sequence[Any]) -> float: ...


class InProcess:
    """An implementation run in this process (monadl, torch): ``make`` builds a fresh model."""

    def __init__(self, implementation: str, make: Callable[[], _Model], data: TaskData) -> None:
        self.implementation = implementation
        self.make = make
        self.data = data
        self.model: _Model | None = None
        self.batches: list[list[Any]] = []

    def new_model(self) -> None:
        self.model = None  # the last one goes first
        self.model = self.make()

    def step(self, indices: Sequence[int]) -> float:
        assert self.model is not None
        train = self.data.train
        return self.model.step([train[i] for i in indices])

    def evaluate(self, indices: Sequence[int]) -> float:
        assert self.model is not None
        held_out = self.data.held_out
        return self.model.evaluate([held_out[i] for i in indices])

    def prepare(self, batches: Sequence[Sequence[int]]) -> None:
        """Sets the batches that :meth:`segment` steps on, in order."""
        self.batches = [[self.data.train[i] for i in b] for b in batches]

    def segment(self) -> None:
        assert self.model is not None
        for batch in self.batches:
            self.model.step(batch)


class OnPeer:
    """A task on a DyNet worker (``load_task`` done)."""

    def __init__(self, peer: DynetPeer) -> None:
        self.implementation = peer.implementation
        self.peer = peer

    def new_model(self) -> None:
        self.peer.new_model()

    def step(self, indices: Sequence[int]) -> float:
        return self.peer.step(indices)

    def evaluate(self, indices: Sequence[int]) -> float:
        return self.peer.evaluate(indices)

    def prepare(self, batches: Sequence[Sequence[int]]) -> None:
        self.peer.prepare(batches)

    def segment(self) -> None:
        self.peer.segment()


def monadl_model(
    data: TaskData, sizes: Sizes, seed: int, vocabulary: sst.Vocabulary | None
) -> SuiteModel[Any]:
    """A fresh monadl model of ``data``'s task (``vocabulary``: treenn's, of the training trees)."""
    s = data.sizes
    if data.task == "bilstm-tagger":
        return BiLstmTagger.new(
            s["words"], s["tags"], embedding=sizes.embedding, hidden=sizes.hidden, mlp=sizes.mlp, seed=seed
        )
    if data.task == "bilstm-tagger-withchar":
        return CharBiLstmTagger.new_with_chars(
            s["words"],
            s["tags"],
            s["chars"],
            char_embedding=sizes.char_embedding,
            embedding=sizes.embedding,
            hidden=sizes.hidden,
            mlp=sizes.mlp,
            seed=seed,
        )
    if data.task == "treenn":
        assert vocabulary is not None
        return TreeNN.new(
            vocabulary, s["labels"], embedding=sizes.embedding, hidden=sizes.tree_hidden, seed=seed
        )
    return RnnLm.new(s["words"], embedding=sizes.embedding, hidden=sizes.lm_hidden, seed=seed)


# ---------------------------------------------------------------------------------------------------
# Segments


def plan(data: TaskData, batch: int, instances: int, seed: int) -> list[list[int]]:
    """The batches (indices into ``data.train``) of one timed segment: ceil(instances / batch) of
    them. The training set is shuffled under ``seed``, and a segment takes its first instances (the
    same at every batch size). ``rnnlm-batch``, as its scripts: batches are runs of the training set
    sorted by length (longest first), and the segment's are spread evenly over those runs."""
    steps = max(1, math.ceil(instances / batch))
    order = [int(i) for i in np.random.default_rng(seed).permutation(len(data.train))]
    if data.task != "rnnlm-batch":
        return [[order[(k * batch + j) % len(order)] for j in range(batch)] for k in range(steps)]
    by_length = sorted(order, key=lambda i: -len(data.train[i]))
    runs = [by_length[k : k + batch] for k in range(0, len(by_length) - batch + 1, batch)] or [
        [by_length[j % len(by_length)] for j in range(batch)]
    ]
    return [runs[int((k + 0.5) * len(runs) / steps) % len(runs)] for k in range(steps)]


def _segment(contender: Contender, instances: int) -> int:
    contender.segment()
    return instances


def measure_config(
    data: TaskData,
    batch: int,
    contenders: Sequence[Contender],
    held_out: Sequence[int],
    args: argparse.Namespace,
    synchronize: Callable[[], None] | None = None,
) -> list[Measurement]:
    """Every contender on ``data`` at ``batch``: held-out loss, warm-up, ``args.repeats`` rounds of
    interleaved timed segments (each to the end of its GPU work: ``synchronize``), held-out loss
    again."""
    batches = plan(data, batch, args.instances, args.seed)
    held_units = sum(data.units(data.held_out[i]) for i in held_out)
    before = []
    for c in contenders:
        c.new_model()
        before.append(c.evaluate(held_out) / held_units)
    warmup = math.ceil(args.warmup / batch)
    for c in contenders:
        for k in range(warmup):
            c.step(batches[k % len(batches)])
    count = sum(len(b) for b in batches)
    for c in contenders:
        c.prepare(batches)
    segments = [functools.partial(_segment, c, count) for c in contenders]
    rates = interleaved(segments, args.repeats, synchronize)
    units = sum(data.units(data.train[i]) for b in batches for i in b)
    measured: list[Measurement] = []
    for c, start, samples in zip(contenders, before, rates, strict=True):
        after = c.evaluate(held_out) / held_units
        per_unit = [r * units / count for r in samples]
        measured.append(
            Measurement(
                data.task,
                c.implementation,
                batch,
                count,
                units,
                statistics.median(samples),
                min(samples),
                max(samples),
                statistics.median(per_unit),
                min(per_unit),
                max(per_unit),
                start,
                after,
                warmup + args.repeats * len(batches),
                bool(after < start * (1.0 - MIN_FALL)),
                samples,
            )
        )
    return measured


# ---------------------------------------------------------------------------------------------------
# The run


def dynet_available() -> bool:
    """Whether the ``dynet`` module (the pip package dynet38) is installed here."""
    import importlib.util

    return importlib.util.find_spec("dynet") is not None


def _version(package: str, *names: str) -> str:
    for name in names or (package,):
        try:
            return version(name)
        except PackageNotFoundError:
            continue
    return "?"


def measure(args: argparse.Namespace, out: Any = None) -> tuple[list[Measurement], dict[str, Any]]:
    """Runs every task and batch size; returns the measurements and a description of the run (its
    notes, also printed to ``out``: what was skipped and why, and the learning check's warnings)."""
    out = out or sys.stdout
    sizes = SMOKE_SIZES if args.smoke else Sizes()
    device = Device(args.device)
    have_torch = not args.no_torch and torch_available()
    have_dynet = not args.no_dynet and dynet_available() and device.is_numpy
    notes: list[str] = []
    if not device.is_numpy:
        notes.append(f"dynet: skipped on --device {device.name} (the suite's DyNet runs on the CPU)")
    if args.no_torch:
        notes.append("torch: skipped (--no-torch)")
    elif not have_torch:
        notes.append("torch: not installed, its figures skipped (pip install torch)")
    if args.no_dynet:
        notes.append("dynet: skipped (--no-dynet)")
    elif not have_dynet and device.is_numpy:
        notes.append("dynet: not installed, its figures skipped (pip install dynet38)")

    tasks: list[TaskData] = []
    for task in args.tasks:
        try:
            tasks.append(suite_data.load_task(task, args.data, seed=args.seed, smoke=args.smoke))
        except Missing as e:
            notes.append(str(e))
        except (ValueError, OSError) as e:  # a malformed or unreadable file: the other tasks still run
            notes.append(f"{task}: skipped, {e}")
    if have_torch and any(d.task not in _torch_tasks() for d in tasks):
        notes.append("torch: no figures for treenn (the suite has no PyTorch script for it)")
    info: dict[str, Any] = {
        "tasks": {d.task: d.description for d in tasks},
        "batches": list(args.batches),
        "instances_per_segment": args.instances,
        "repeats": args.repeats,
        "warmup_instances": args.warmup,
        "held_out_instances": args.held_out,
        "sizes": asdict(sizes),
        "seed": args.seed,
        "device": device.describe(),
        "machine": f"{platform.machine()}, {platform.processor() or '?'}, {cpus()} CPUs, one thread used",
        "python": platform.python_version(),
        "numpy": np.__version__,
        "blas": blas_libraries(),
        "monadl_compiled": _compiled(),
        "torch": _version("torch") if have_torch else "skipped",
        "dynet": _version("dynet", "dynet38", "dyNET38") if have_dynet else "skipped",
    }
    progress = Progress(len(tasks) * len(args.batches), args.progress, "suite")
    results: list[Measurement] = []
    try:
        with threadpool_limits(limits=1), contextlib.ExitStack() as stack:
            if have_torch:
                import torch  # type: ignore[import-not-found, unused-ignore]

                torch.set_num_threads(1)
                if device.torch_device != "cpu":  # the suite's models make their tensors there
                    stack.callback(torch.set_default_device, torch.get_default_device())
                    torch.set_default_device(device.torch_device)
            peers: list[DynetPeer] = []
            if have_dynet:
                for autobatch in (True, False):
                    try:
                        peers.append(
                            stack.enter_context(DynetPeer(autobatch, mem=args.dynet_mem, seed=args.seed))
                        )
                    except RuntimeError as e:
                        notes.append(str(e))
            for data in tasks:
                results += _measure_task(data, peers, have_torch, sizes, args, progress, device)
    finally:
        progress.close()
    notes += check_learning(results)
    info["notes"] = notes
    info["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    for data in tasks:
        print(f"{data.task}: {data.description}", file=out)
    for note in notes:
        print(note, file=out)
    return results, info


def _torch_tasks() -> tuple[str, ...]:
    from monadl.bench.suite_torch import TASKS as torch_tasks

    return torch_tasks


def _compiled() -> bool:
    import monadl

    return bool(monadl.compiled())


def _measure_task(
    data: TaskData,
    peers: Sequence[DynetPeer],
    have_torch: bool,
    sizes: Sizes,
    args: argparse.Namespace,
    progress: Progress,
    device: Device,
) -> list[Measurement]:
    vocabulary = sst.Vocabulary.from_trees(data.train) if data.task == "treenn" else None
    on_host = functools.partial(monadl_model, data, sizes, args.seed, vocabulary)
    params = {name: np.asarray(w.data) for name, w in on_host().weights().items()}

    def make() -> Any:
        model = on_host()
        device.move_weights(model.weights().values())
        return model

    contenders: list[Contender] = [InProcess("monadl", make, data)]
    for peer in peers:
        peer.load_task(data, params)
        contenders.append(OnPeer(peer))
    if have_torch and data.task in _torch_tasks():
        from monadl.bench.suite_torch import torch_model

        contenders.append(InProcess("torch", functools.partial(torch_model, data, params), data))
    held_out = list(range(min(args.held_out, len(data.held_out))))
    measured: list[Measurement] = []
    for batch in args.batches:
        progress.start(f"{data.task} batch {batch}")
        measured += measure_config(data, batch, contenders, held_out, args, device.synchronize)
        progress.advance()
    return measured


def check_learning(results: Sequence[Measurement]) -> list[str]:
    """Warnings: every implementation whose held-out loss did not fall, and every configuration
    whose implementations started from different losses (their weights being the same)."""
    warnings = []
    for m in results:
        if not m.learned:
            warnings.append(
                f"WARNING: {m.task} batch {m.batch}: {LABELS[m.implementation]}'s held-out loss did not fall "
                f"({m.loss_before:.4f} -> {m.loss_after:.4f} per {UNITS[m.task][:-1]} after {m.steps} steps)"
            )
    for task in dict.fromkeys(m.task for m in results):
        for batch in dict.fromkeys(m.batch for m in results if m.task == task):
            starts = [m.loss_before for m in results if (m.task, m.batch) == (task, batch)]
            if max(starts) - min(starts) > AGREE * max(abs(x) for x in starts):
                warnings.append(
                    f"WARNING: {task} batch {batch}: the implementations' initial held-out losses differ "
                    f"({min(starts):.5f}-{max(starts):.5f}) though their weights are the same"
                )
    return warnings


# ---------------------------------------------------------------------------------------------------
# Reporting


def _find(results: Sequence[Measurement], task: str, impl: str, batch: int) -> Measurement | None:
    for m in results:
        if (m.task, m.implementation, m.batch) == (task, impl, batch):
            return m
    return None


def paired_ratio(a: Measurement, b: Measurement) -> tuple[float, float, float] | None:
    """``a``'s rate over ``b``'s round by round (their segments ran in turn): the median, min and max
    of the rounds' ratios."""
    if not a.samples or len(a.samples) != len(b.samples):
        return None
    ratios = [x / y for x, y in zip(a.samples, b.samples, strict=True)]
    return statistics.median(ratios), min(ratios), max(ratios)


def ratios(results: Sequence[Measurement]) -> list[dict[str, Any]]:
    """monadl / every other implementation, per task and batch size (see :func:`paired_ratio`)."""
    found = []
    for m in results:
        mine = _find(results, m.task, "monadl", m.batch)
        r = paired_ratio(mine, m) if mine and m.implementation != "monadl" else None
        if r:
            found.append(
                {
                    "task": m.task,
                    "batch": m.batch,
                    "other": m.implementation,
                    "median": r[0],
                    "low": r[1],
                    "high": r[2],
                }
            )
    return found


def table(results: Sequence[Measurement], args: argparse.Namespace) -> str:
    """Per task: instances/s, words (nodes)/s, the ratios monadl / other, the held-out losses."""
    width, label = 22, 20
    lines: list[str] = []

    def row(name: str, cells: Sequence[str]) -> None:
        lines.append(f"  {name:<{label - 2}}| " + " ".join(f"{c:>{width}}" for c in cells))

    for task in dict.fromkeys(m.task for m in results):
        ms = [m for m in results if m.task == task]
        impls = [i for i in LABELS if any(m.implementation == i for m in ms)]
        instances, units = INSTANCES.get(task, "sentences"), UNITS[task]
        head = f"{'':<{label}}| " + " ".join(f"{'batch ' + str(b):>{width}}" for b in args.batches)
        sizes = ", ".join(
            f"{m.instances} ({m.units} {units}) at batch {m.batch}"
            for m in ms
            if m.implementation == "monadl"
        )
        lines += [
            "",
            f"{task}: median [min-max] of {args.repeats} rounds; a segment: {sizes}",
            head,
            "-" * len(head),
        ]

        for what, pick in ((instances, _rates), (units, _unit_rates)):
            lines.append(f"{what}/s")
            for impl in impls:
                row(LABELS[impl], [pick(_find(ms, task, impl, b)) for b in args.batches])
        if len(impls) > 1:
            lines.append("monadl / other, per round")
        for impl in impls[1:]:
            cells = []
            for b in args.batches:
                mine, theirs = _find(ms, task, "monadl", b), _find(ms, task, impl, b)
                r = paired_ratio(mine, theirs) if mine and theirs else None
                cells.append(f"{r[0]:.2f} [{r[1]:.2f}-{r[2]:.2f}]" if r else "-")
            row(f"/ {LABELS[impl]}", cells)
        lines.append(f"held-out loss per {units[:-1]}, before -> after (steps)")
        for impl in impls:
            cells = []
            for b in args.batches:
                m = _find(ms, task, impl, b)
                mark = "" if m is None or m.learned else " !"
                cells.append(f"{m.loss_before:.4f}->{m.loss_after:.4f} ({m.steps}){mark}" if m else "-")
            row(LABELS[impl], cells)
    lines += [
        "",
        "ratio: monadl's rate / the other's in each round (their segments ran in turn): median [min-max]",
        f"loss: the mean over {args.held_out} held-out instances, from the same initial weights; '!': it did "
        f"not fall by {MIN_FALL:.2%}",
    ]
    return "\n".join(lines)


def _rates(m: Measurement | None) -> str:
    return f"{m.median:.1f} [{m.low:.1f}-{m.high:.1f}]" if m else "-"


def _unit_rates(m: Measurement | None) -> str:
    return f"{m.units_median:.0f} [{m.units_low:.0f}-{m.units_high:.0f}]" if m else "-"


def plot(results: Sequence[Measurement], args: argparse.Namespace, path: Path) -> None:
    """Instances/s against batch size (log-log), one panel per task, one line per implementation."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = list(dict.fromkeys(m.task for m in results))
    fig, axes = plt.subplots(1, max(1, len(tasks)), figsize=(4.5 * max(1, len(tasks)), 4.2), squeeze=False)
    for ax, task in zip(axes[0], tasks, strict=False):
        for impl, label in LABELS.items():
            ms = [m for b in args.batches if (m := _find(results, task, impl, b))]
            if not ms:
                continue
            xs = [m.batch for m in ms]
            style = "-" if impl == "monadl" else "--"
            (line,) = ax.plot(xs, [m.median for m in ms], style, marker="o", label=label)
            ax.fill_between(xs, [m.low for m in ms], [m.high for m in ms], color=line.get_color(), alpha=0.15)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(list(args.batches), [str(b) for b in args.batches])
        ax.set_title(task)
        ax.set_xlabel(f"batch size ({INSTANCES.get(task, 'sentences')})")
        ax.set_ylabel(f"{INSTANCES.get(task, 'sentences')} / s (min-max shaded)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=max(1, len(labels)), fontsize=9, frameon=False)
    fig.suptitle("DyNet benchmark suite: training, one Adam step per batch, one thread")
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(path) as f:
        fig.savefig(f, format="png", dpi=110)
    plt.close(fig)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``suite`` subcommand's options."""
    parser.add_argument("--tasks", nargs="+", choices=TASKS, default=list(TASKS), help="the tasks to run")
    parser.add_argument(
        "--batches", type=positive_int, nargs="+", default=[1, 16, 64], help="instances per update"
    )
    parser.add_argument("--repeats", type=positive_int, default=5, help="timed rounds per configuration")
    parser.add_argument(
        "--instances", type=positive_int, default=256, help="at least this many instances per timed segment"
    )
    parser.add_argument(
        "--warmup", type=non_negative_int, default=32, help="instances' worth of untimed steps first"
    )
    parser.add_argument(
        "--held-out", type=positive_int, default=32, help="held-out instances of the learning check"
    )
    parser.add_argument(
        "--data", type=Path, help="the data folder (see monadl.bench.suite_data; default: synthetic)"
    )
    add_device_option(parser)
    add_peer_options(parser, dynet=True)


def run_cli(args: argparse.Namespace) -> int:
    """Runs the benchmark from parsed arguments; prints the table and writes the JSON and plot."""
    if args.smoke:
        args.batches = [1, 4]
        args.instances, args.repeats, args.warmup, args.held_out = 4, 3, 4, 8
        args.dynet_mem = min(args.dynet_mem, 128)
    plot_note = None
    if args.plot:
        import importlib.util

        if importlib.util.find_spec("matplotlib") is None:
            plot_note = f"--plot {args.plot}: skipped, matplotlib is not installed"
    results, info = measure(args)
    print(table(results, args))
    print(f"peak RSS: {info['peak_rss_mib']:.0f} MiB; torch: {info['torch']}; dynet: {info['dynet']}")
    print(f"BLAS: {info['blas']}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        data = {
            "benchmark": "suite",
            "unit": "instances/s",
            "run": info,
            "learned": all(m.learned for m in results),
            "not_learned": [
                {"task": m.task, "implementation": m.implementation, "batch": m.batch}
                for m in results
                if not m.learned
            ],
            "ratios": ratios(results),
            "results": [asdict(m) for m in results],
        }
        atomic_write_bytes(args.json, json.dumps(data, indent=2).encode())
        print(f"wrote {args.json}")
    if args.plot:
        if plot_note:
            print(plot_note)
        else:
            plot(results, args, args.plot)
            print(f"wrote {args.plot}")
    return 0
