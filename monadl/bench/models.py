"""The example models' training steps, monadl side by side with PyTorch, both on one thread.

Workloads (the sizes of the examples' defaults; ``--smoke``: tiny ones):

  conv1        examples/cnn.py's first conv layer (3 -> channels, 3x3, padding 1, 32x32 images of a
               batch), forward and backward: the gradients of the sum of its output by its kernel
               and bias
  conv2        its second (channels -> 2 channels, on 16x16), forward and backward, the input's
               gradient too (inside the network it flows on to the first block)
  cnn          one training step of examples/cnn.py's CNN (conv-relu-pool twice, a dense layer to
               100 classes; Adam on the mean cross-entropy of a batch of random images)
  transformer  one training step of examples/transformer_lm.py's character Transformer (width 48,
               4 heads, 2 pre-norm layers, 16 windows of 32 characters of an alphabet of 96;
               Adam on the mean cross-entropy of the next characters, the gradients clipped to a
               global norm of 1) on random windows of ids, against ``nn.TransformerEncoderLayer``
  bilstm       one training step of examples/bilstm_tagger.py's tagger (embedding 64, BiLSTM hidden
               50, MLP 32; Adam on the mean cross-entropy per word) on --sentences sentences of the
               synthetic WikiNER-like set, against ``nn.LSTM`` over the same sentences packed

and two dense models as a user writes them, sized for a GPU (run by default with ``--device cuda``;
on the CPU only when named with ``--only``):

  mlp          one Adam step of ``nn.MLP.new([1024, 4096, 4096, 1000])`` (ReLU) on the mean
               cross-entropy of a batch of 512 random inputs, against the same ``nn.Linear`` stack
  encoder      one Adam step of one ``nn.TransformerEncoderLayer`` (512 wide, 8 heads, post-norm as
               PyTorch's default) on the mean squared error to a random target, batch 32 x 128,
               against ``nn.TransformerEncoderLayer``

The monadl side is the code of the examples (their models: ``monadl.bench.cnn_model`` and
``monadl.bench.transformer_model``, copies of those the examples hold, checked equal by their
tests, and ``monadl.bench.tagger_model``, which the tagger example imports), on an
``ml.Executor()`` (dynamic batching on); the PyTorch side (``monadl.bench.models_torch``) is the
same model from the same weights, trained the same way.
Both sides run on one thread: BLAS capped by threadpoolctl, ``torch.set_num_threads(1)``.

``--device cuda`` runs monadl on CuPy arrays and PyTorch on CUDA (each side's weights and inputs
moved there once, before the timing; integer labels and word ids as each side's user would pass
them), every timed segment ending when the GPU's queued work is done; ``--device array-api-strict``
runs monadl's side on that stand-in namespace, PyTorch on the CPU (a test of the plumbing).

Timing: a segment is a fixed number of steps (enough for about --segment seconds of the slower
side, after --warmup steps of each); --repeats rounds time one segment of each side in turn
(``common.interleaved``). A ratio is monadl's steps/s over PyTorch's, the median of the rounds' own
ratios [their min-max]. ``must`` and ``goal`` are the issues' targets for that ratio (on CUDA,
0.8 and 1.0 for every workload). Both sides' first losses are compared (they start from the same
weights and data): a warning if they differ.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

import monadl as ml
from monadl import FloatLayer, nn
from monadl.bench.cnn_model import CLASSES, CNN
from monadl.bench.common import Device, add_device_option, interleaved, torch_available
from monadl.bench.suite_data import TaggedSentence, synthetic_task
from monadl.bench.tagger_model import Tagger
from monadl.bench.transformer_model import TransformerLm
from monadl.cli import non_negative_int, positive_float, positive_int
from monadl.data.files import atomic_write_bytes
from monadl.dsl import fused

#: workload -> (must, goal): the issue's targets for monadl's speed over PyTorch's.
TARGETS: dict[str, tuple[float, float]] = {
    "conv1": (0.5, 1.0),
    "conv2": (0.5, 1.0),
    "cnn": (0.7, 1.0),
    "transformer": (1.0, 1.3),
    "bilstm": (1.0, 1.5),
    "mlp": (0.8, 1.0),
    "encoder": (0.8, 1.0),
}
#: The targets on a GPU, against PyTorch CUDA: every workload's.
CUDA_TARGETS = (0.8, 1.0)
#: The workloads run when --only names none: the examples' on the CPU, all of them on a device.
EXAMPLES = ("conv1", "conv2", "cnn", "transformer", "bilstm")


@dataclass(frozen=True)
class Sizes:
    """The workloads' sizes: the CNN's (``batch``, ``channels``), the Transformer's (``windows``
    of ``context`` characters of an ``alphabet``, ``width``, ``heads``, ``layers``: the alphabet
    is that of the example's default text) and the tagger's."""

    batch: int = 32
    channels: int = 16
    windows: int = 16
    context: int = 32
    alphabet: int = 96
    width: int = 48
    heads: int = 4
    layers: int = 2
    sentences: int = 16
    embedding: int = 64
    hidden: int = 50
    mlp: int = 32
    dense: tuple[int, ...] = (1024, 4096, 4096, 1000)
    dense_batch: int = 512
    encoder_width: int = 512
    encoder_heads: int = 8
    encoder_batch: int = 32
    encoder_length: int = 128


SMOKE_SIZES = Sizes(
    batch=2,
    channels=2,
    windows=2,
    context=4,
    alphabet=7,
    width=4,
    heads=2,
    layers=1,
    sentences=3,
    embedding=4,
    hidden=3,
    mlp=4,
    dense=(6, 8, 8, 5),
    dense_batch=4,
    encoder_width=8,
    encoder_heads=2,
    encoder_batch=2,
    encoder_length=3,
)


def _params(module: ml.Module) -> dict[str, np.ndarray]:
    return {name: np.array(w.data) for name, w in module.weights().items()}


# --------------------------------------------------------------------------- the workloads


@dataclass
class Workload:
    """A workload's two sides: each runs one step and returns its loss; ``weights``: the monadl
    side's (on the device it runs on)."""

    name: str
    what: str
    monadl: Callable[[], float]
    torch: Callable[[], float] | None
    weights: list[Any] = field(default_factory=list)


def _train(loss: FloatLayer, optimizer: ml.Optimizer, executor: ml.Executor) -> float:
    value: float = loss.train_blocking(optimizer, executor=executor).unwrap()
    return value


def conv_workload(
    which: int, sizes: Sizes, executor: ml.Executor, seed: int, torch: bool, device: Device | None = None
) -> Workload:
    """conv1 or conv2 of the CNN, forward and backward (see the module)."""
    device = device or Device("cpu")
    cnn = CNN.new(sizes.channels, seed=seed)
    conv = cnn.conv1 if which == 1 else cnn.conv2
    side = 32 if which == 1 else 16
    channels = 3 if which == 1 else sizes.channels
    rng = np.random.default_rng([seed, which])
    x = rng.random((sizes.batch, channels, side, side), dtype=np.float32)
    assert conv.b is not None
    peer_weights = (np.array(conv.w.data), np.array(conv.b.data))
    device.move_weights(cnn.weights().values())
    data: ml.AnyArray = device.put(x) if which == 1 else ml.ArrayWeight(device.put(x), name="input")

    def monadl_step() -> float:
        loss, _ = ml.compute_gradients(ml.sum(conv(data)), executor=executor)
        return float(loss)

    torch_step = None
    if torch:
        from monadl.bench.models_torch import TorchConv

        peer = TorchConv(*peer_weights, x, input_grad=which == 2, device=device.torch_device)
        torch_step = peer.step
    what = f"{channels} -> {conv.w.data.shape[0]} channels, 3x3, on {sizes.batch} x {side}x{side}"
    return Workload(f"conv{which}", what, monadl_step, torch_step, list(cnn.weights().values()))


def cnn_workload(
    sizes: Sizes, executor: ml.Executor, seed: int, torch: bool, device: Device | None = None
) -> Workload:
    """A training step of examples/cnn.py's CNN on random images."""
    device = device or Device("cpu")
    model = CNN.new(sizes.channels, seed=seed)
    rng = np.random.default_rng([seed, 3])
    images = rng.random((sizes.batch, 3, 32, 32), dtype=np.float32)
    labels = rng.integers(0, CLASSES, sizes.batch).astype(np.int64)
    learning_rate = 0.002  # the example's
    optimizer = ml.Adam(learning_rate)
    torch_step = None
    if torch:
        from monadl.bench.models_torch import TorchCNN

        peer = TorchCNN(_params(model), learning_rate, device=device.torch_device)
        theirs = peer.put(images), peer.put(labels)
        torch_step = lambda: peer.step(*theirs)
    device.move_weights(model.weights().values())
    ours = device.put(images)
    return Workload(
        "cnn",
        f"channels {sizes.channels}, batch {sizes.batch}",
        lambda: _train(ml.cross_entropy(model(ours), labels), optimizer, executor),
        torch_step,
        list(model.weights().values()),
    )


def transformer_workload(
    sizes: Sizes, executor: ml.Executor, seed: int, torch: bool, device: Device | None = None
) -> Workload:
    """A training step of examples/transformer_lm.py's Transformer on random windows of ids."""
    device = device or Device("cpu")
    model = TransformerLm.new(
        sizes.alphabet, sizes.context, sizes.width, sizes.heads, sizes.layers, seed=seed
    )
    rng = np.random.default_rng([seed, 4])
    windows = rng.integers(0, sizes.alphabet, (sizes.windows, sizes.context + 1)).astype(np.int64)
    learning_rate, max_norm = 3e-3, 1.0  # the example's
    optimizer = ml.chain(ml.clip_by_global_norm(max_norm), ml.Adam(learning_rate))
    torch_step = None
    if torch:
        from monadl.bench.models_torch import TorchTransformerLm

        peer = TorchTransformerLm(
            _params(model), sizes.heads, learning_rate, max_norm, device=device.torch_device
        )
        theirs = peer.put(windows)
        torch_step = lambda: peer.step(theirs)
    device.move_weights(model.weights().values())
    ours = device.put(windows)
    what = (
        f"width {sizes.width}, {sizes.heads} heads, {sizes.layers} layers, {sizes.windows} windows "
        f"of {sizes.context} characters, alphabet {sizes.alphabet}"
    )
    step = lambda: _train(model.loss(ours), optimizer, executor)
    return Workload("transformer", what, step, torch_step, list(model.weights().values()))


def mlp_workload(
    sizes: Sizes, executor: ml.Executor, seed: int, torch: bool, device: Device | None = None
) -> Workload:
    """An Adam step of a ReLU ``nn.MLP`` of ``sizes.dense`` on random inputs and labels."""
    device = device or Device("cpu")
    model = nn.MLP.new(list(sizes.dense), seed=seed)
    rng = np.random.default_rng([seed, 6])
    x = rng.standard_normal((sizes.dense_batch, sizes.dense[0]), dtype=np.float32)
    labels = rng.integers(0, sizes.dense[-1], sizes.dense_batch).astype(np.int64)
    learning_rate = 1e-3
    optimizer = ml.Adam(learning_rate)
    torch_step = None
    if torch:
        from monadl.bench.models_torch import TorchMLP

        peer = TorchMLP(_params(model), learning_rate, device=device.torch_device)
        theirs = peer.put(x), peer.put(labels)
        torch_step = lambda: peer.step(*theirs)
    device.move_weights(model.weights().values())
    ours = device.put(x)
    what = f"{'-'.join(map(str, sizes.dense))}, batch {sizes.dense_batch}"
    step = lambda: _train(ml.cross_entropy(model(ours), labels), optimizer, executor)
    return Workload("mlp", what, step, torch_step, list(model.weights().values()))


def encoder_workload(
    sizes: Sizes, executor: ml.Executor, seed: int, torch: bool, device: Device | None = None
) -> Workload:
    """An Adam step of one post-norm ``nn.TransformerEncoderLayer`` on the mean squared error of
    its output to a random target."""
    device = device or Device("cpu")
    width, heads = sizes.encoder_width, sizes.encoder_heads
    layer = nn.TransformerEncoderLayer.new(width, heads, seed=seed)
    rng = np.random.default_rng([seed, 7])
    shape = (sizes.encoder_batch, sizes.encoder_length, width)
    x = rng.standard_normal(shape, dtype=np.float32)
    target = rng.standard_normal(shape, dtype=np.float32)
    learning_rate = 1e-4
    optimizer = ml.Adam(learning_rate)
    torch_step = None
    if torch:
        from monadl.bench.models_torch import TorchEncoderLayer

        peer = TorchEncoderLayer(_params(layer), heads, learning_rate, device=device.torch_device)
        theirs = peer.put(x), peer.put(target)
        torch_step = lambda: peer.step(*theirs)
    device.move_weights(layer.weights().values())
    ours = device.put(x), device.put(target)
    what = f"width {width}, {heads} heads, batch {sizes.encoder_batch} x {sizes.encoder_length}"
    step = lambda: _train(ml.mse_loss(layer(ours[0]), ours[1]), optimizer, executor)
    return Workload("encoder", what, step, torch_step, list(layer.weights().values()))


class Batches:
    """The sentences in batches of ``size``, in turn, from the first again after the last."""

    def __init__(self, sentences: Sequence[TaggedSentence], size: int) -> None:
        self.batches = list(ml.DataLoader(sentences, size, drop_last=True, collate=list))
        self.next = 0

    def take(self) -> Sequence[TaggedSentence]:
        batch = self.batches[self.next % len(self.batches)]
        self.next += 1
        return batch


def bilstm_workload(
    sizes: Sizes, executor: ml.Executor, seed: int, torch: bool, smoke: bool, device: Device | None = None
) -> Workload:
    """A training step of examples/bilstm_tagger.py's tagger, against packed ``nn.LSTM``."""
    device = device or Device("cpu")
    data = synthetic_task("bilstm-tagger", seed=seed, smoke=smoke)
    model = Tagger.new(
        data.sizes["words"],
        data.sizes["tags"],
        embedding=sizes.embedding,
        hidden=sizes.hidden,
        mlp=sizes.mlp,
        seed=seed,
    )
    learning_rate = 0.005  # the example's
    optimizer = ml.Adam(learning_rate)
    ours = Batches(data.train, sizes.sentences)

    def monadl_step() -> float:
        return model.step(ours.take(), optimizer, executor)[0]

    torch_step = None
    if torch:
        from monadl.bench.models_torch import TorchTagger

        peer = TorchTagger(_params(model), learning_rate, device=device.torch_device)
        theirs = Batches(data.train, sizes.sentences)
        torch_step = lambda: peer.step(theirs.take())
    device.move_weights(model.weights().values())
    words = sum(len(s.words) for b in ours.batches for s in b) / len(ours.batches)
    what = (
        f"{sizes.sentences} sentences a step ({words:.0f} words on average), embedding "
        f"{sizes.embedding}, hidden {sizes.hidden}, MLP {sizes.mlp}"
    )
    return Workload("bilstm", what, monadl_step, torch_step, list(model.weights().values()))


# --------------------------------------------------------------------------- measuring


@dataclass
class Result:
    """One workload's figures: steps/s of each side (medians over the rounds), each round's ratio
    monadl / PyTorch and their median, and both sides' first losses."""

    name: str
    what: str
    steps: int
    monadl_rate: float
    torch_rate: float | None = None
    ratio: float | None = None
    ratios: list[float] = field(default_factory=list)
    must: float = math.nan
    goal: float = math.nan
    first_losses: list[float] = field(default_factory=list)


def _segment(step: Callable[[], float], steps: int) -> Callable[[], int]:
    def run() -> int:
        for _ in range(steps):
            step()
        return steps

    return run


def measure(
    workload: Workload,
    *,
    warmup: int,
    repeats: int,
    segment: float,
    device: Device | None = None,
) -> Result:
    """Times ``workload``'s sides in turn (see the module), on ``device`` (its queued work waited
    for around every timed step or segment)."""
    device = device or Device("cpu")
    sides = [workload.monadl] + ([workload.torch] if workload.torch is not None else [])
    first = [side() for side in sides]
    slowest = 0.0
    for side in sides:
        for _ in range(max(warmup - 1, 0)):
            side()
        device.synchronize()
        start = time.perf_counter()
        side()
        device.synchronize()
        slowest = max(slowest, time.perf_counter() - start)
    steps = max(1, round(segment / max(slowest, 1e-9)))
    rates = interleaved([_segment(side, steps) for side in sides], repeats, device.synchronize)
    must, goal = targets(workload.name, device)
    result = Result(workload.name, workload.what, steps, statistics.median(rates[0]), must=must, goal=goal)
    result.first_losses = first
    if len(rates) == 2:
        result.torch_rate = statistics.median(rates[1])
        result.ratios = [m / t for m, t in zip(rates[0], rates[1], strict=True)]
        result.ratio = statistics.median(result.ratios)
    return result


def targets(name: str, device: Device) -> tuple[float, float]:
    """The workload's must and goal on ``device`` (none on the stand-in namespace)."""
    if device.name == "cuda":
        return CUDA_TARGETS
    return TARGETS[name] if device.is_numpy else (math.nan, math.nan)


def _target(value: float) -> str:
    return f"{'-':>6}" if math.isnan(value) else f"{value:>5.1f}x"


def format_row(r: Result) -> str:
    """The table's row of ``r``."""
    aims = f"{_target(r.must)} {_target(r.goal)}"
    if r.ratio is None:
        return f"{r.name:<12} {r.monadl_rate:>10.1f} {'-':>10} {'-':>16} {aims}"
    span = f"[{min(r.ratios):.2f}-{max(r.ratios):.2f}]"
    assert r.torch_rate is not None
    return f"{r.name:<12} {r.monadl_rate:>10.1f} {r.torch_rate:>10.1f} {r.ratio:>5.2f}x {span:>10} {aims}"


def run(args: argparse.Namespace, device: Device | None = None) -> list[Result]:
    """Builds the workloads asked for and measures them on ``device`` (default ``--device``'s),
    printing a table as it goes."""
    sizes = SMOKE_SIZES if args.smoke else Sizes()
    if args.batch is not None:
        sizes = Sizes(**{**asdict(sizes), "batch": args.batch})
    device = device or Device(args.device)
    with_torch = not args.no_torch and torch_available()
    if not args.no_torch and not with_torch:
        print("torch: not installed, monadl's rates only")
    results: list[Result] = []
    with threadpool_limits(limits=1), ml.Executor() as executor:
        if with_torch:
            import torch  # type: ignore[import-not-found, unused-ignore]

            torch.set_num_threads(1)
        engine = ("compiled" if ml.compiled() else "pure") + ("" if fused.ENABLED else ", unfused")
        print(f"monadl {engine}; one thread each; steps/s; device {device.describe()}")
        print(
            f"{'workload':<12} {'monadl':>10} {'torch':>10} {'ratio':>6} {'[min-max]':>10} "
            f"{'must':>6} {'goal':>6}"
        )
        for name in args.only or (EXAMPLES if device.is_numpy else list(TARGETS)):
            workload: Workload
            options = (sizes, executor, args.seed, with_torch)
            if name in ("conv1", "conv2"):
                workload = conv_workload(int(name[-1]), *options, device)
            elif name == "cnn":
                workload = cnn_workload(*options, device)
            elif name == "transformer":
                workload = transformer_workload(*options, device)
            elif name == "mlp":
                workload = mlp_workload(*options, device)
            elif name == "encoder":
                workload = encoder_workload(*options, device)
            else:
                workload = bilstm_workload(*options, args.smoke, device)
            result = measure(
                workload, warmup=args.warmup, repeats=args.repeats, segment=args.segment, device=device
            )
            results.append(result)
            print(format_row(result), flush=True)
            if len(result.first_losses) == 2 and not math.isclose(*result.first_losses, rel_tol=1e-3):
                print(
                    f"  warning: the first losses differ: monadl {result.first_losses[0]:.6g}, "
                    f"torch {result.first_losses[1]:.6g}"
                )
    for r in results:
        print(f"  {r.name}: {r.what}; {r.steps} steps a segment")
    return results


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The command line of ``python -m monadl.bench models``."""
    parser.add_argument(
        "--only",
        nargs="+",
        choices=list(TARGETS),
        help=f"these workloads only (default: {' '.join(EXAMPLES)} on the CPU, all on another device)",
    )
    parser.add_argument("--batch", type=positive_int, help="images per CNN step (default 32)")
    parser.add_argument("--repeats", type=positive_int, default=5, help="timed rounds per workload")
    parser.add_argument("--warmup", type=non_negative_int, default=3, help="untimed steps per side first")
    parser.add_argument("--segment", type=positive_float, default=0.5, help="seconds a timed segment")
    parser.add_argument("--seed", type=non_negative_int, default=0)
    parser.add_argument("--no-torch", action="store_true", help="skip PyTorch even when installed")
    parser.add_argument("--json", type=Path, help="write the results as JSON here")
    parser.add_argument("--smoke", action="store_true", help="a seconds-long run (for CI): tiny sizes")
    parser.add_argument(
        "--no-fused",
        dest="fused",
        action="store_false",
        help="monadl runs its rules unfused on CuPy, one kernel per operator (to measure the fused kernels)",
    )
    add_device_option(parser)


def run_cli(args: argparse.Namespace) -> int:
    """Runs the benchmark, prints its table (and writes the JSON, if asked)."""
    if args.smoke:
        args.repeats, args.warmup, args.segment = min(args.repeats, 2), min(args.warmup, 1), 0.01
    device = Device(args.device)
    fused.ENABLED = args.fused
    try:
        results = run(args, device)
    finally:
        fused.ENABLED = True
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        document: dict[str, Any] = {
            "compiled": ml.compiled(),
            "fused": args.fused,
            "device": device.describe(),
            "results": [asdict(r) for r in results],
        }
        atomic_write_bytes(args.json, json.dumps(document, indent=2).encode())
        print(f"wrote {args.json}")
    return 0
