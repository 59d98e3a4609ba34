"""The Tree-LSTM benchmark: trees per second of the SST sentiment Tree-LSTM, training and inference,
with monadl's dynamic batching on and off, side by side with PyTorch eager and DyNet.

The model is ``examples/tree_lstm.py``'s, ``monadl.bench.treelstm_model.TreeLstm`` (hidden 128,
embeddings 128, a classifier and a loss at every node, Adagrad 0.05 / 0.1), run on synthetic SST-like
trees of 10-40 leaves (``--data DIR``: the real SST's train split). For every batch size
(``--batches``, default 1 16 64 256) and phase (``train``: one Adagrad step on the batch; ``infer``:
``predict_roots``, one forward over the batch) it measures:

  monadl batched     an Executor that merges equal kernels across and within trees
  monadl unbatched   the same Executor with batching off: every kernel on its own (slow at big
                     batches: skipped above --max-unbatched, 64 by default)
  torch eager        the same model in PyTorch eager, node by node (when torch is installed): the
                     naive peer
  torch by level     the same model in PyTorch batched by tree level by hand, as DGL's Tree-LSTM
                     example and careful users write it (``TorchLevelTreeLstm``): all the leaves in
                     one op, then each height's inner nodes gathered, their five gates in one
                     product, scattered back; the classifier and the loss over all nodes at once.
                     The strong peer: dynamic batching should cost the user nothing against it
  dynet autobatch    the same model in DyNet with autobatching, and ``dynet`` without it (when
                     ``dynet`` imports: pip install dynet38; each in a worker process of its own,
                     as DyNet fixes autobatching once per process, told step by step what to run)

Each figure is the median over --repeats timed segments of at least --trees trees (a segment is
ceil(trees / batch) steps over distinct batches of a shuffled pool), after --warmup trees, with the
min and the max. The segments of one (phase, batch) are interleaved: every implementation one
segment, then again, so that the machine's drift in speed touches them alike and their ratios hold.
A DyNet step is timed here, around a request to its worker and the answer (a pipe's round trip,
tens of microseconds against milliseconds a step). One thread throughout: BLAS capped by
threadpoolctl, torch.set_num_threads(1), DyNet on one CPU thread. All implementations start from
the same weights (monadl's initialisation), and each one's first step (or inference) on the
segment's first batch is compared with monadl batched's: the loss (or the root scores) must agree
to 1e-3, else the run prints a warning and the measurement records ``agrees: false``.

``--device cuda`` runs monadl on CuPy and both PyTorch peers on CUDA (DyNet stays out), every
timed segment ending when the GPU's queued work is done.

For monadl it also reports, on the first batch of each size: the kernel launches of a training step
and of an inference (``Executor.stats.kernels`` over its runs: a merged group counts once), against
the depth bound = op kinds x (max tree height + 1), where op kinds = the kinds (op and operation
names) of the model's batched inference (the scheduler's gathers of rows are launches, not kinds of
the model): a perfect batcher runs each kind once per tree level.
(The distinct signatures, where one op on different weights counts once per weight, are reported too.) The
ratio is launches / bound. And the recording cost: ``model.loss`` (graph recording only, nothing
runs; each batch into a graph of its own, as a training step records), in microseconds per cell
call (one per tree node).
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
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

from monadl.bench.common import (
    Device,
    Progress,
    WorkerProcess,
    add_device_option,
    add_peer_options,
    blas_libraries,
    cpus,
    host_array,
    interleaved,
    torch_available,
)
from monadl.bench.treelstm_model import TreeLstm
from monadl.bench.treelstm_torch import PARAMETERS, TorchLevelTreeLstm, TorchTreeLstm
from monadl.cli import non_negative_int, positive_int
from monadl.data import sst
from monadl.data.files import atomic_file, atomic_write_bytes
from monadl.data.trees import Tree

WordId = Callable[[str], int]
PHASES = ("train", "infer")
#: Implementation name -> its label in the tables and the plot, in the order they are shown.
LABELS = {
    "monadl": "monadl batched",
    "monadl-unbatched": "monadl unbatched",
    "torch": "torch eager",
    "torch-levels": "torch by level",
    "dynet-autobatch": "dynet autobatch",
    "dynet": "dynet",
}
_DYNET_MARK = "@@treelstm "  # the worker's result lines on its stdout start with this


@dataclass
class Measurement:
    """Trees per second of one implementation, phase and batch size (and monadl's kernel counts)."""

    implementation: str  # a key of LABELS
    phase: str  # "train" or "infer"
    batch: int
    trees: int  # trees per timed segment
    median: float  # trees / s
    low: float
    high: float
    kernels: int | None = None  # monadl: kernel launches of one batch (the first of this size)
    merged: int | None = None  # monadl: kernels that ran inside merged groups
    kinds: dict[str, int] | None = None  # monadl: batchable kernel kinds -> launches
    signatures: int | None = None  # monadl: distinct signatures of the batchable work launched
    height: int | None = None  # the max tree height of that batch
    model_kinds: list[str] | None = None  # monadl batched: the model's kinds of op and operation
    bound: int | None = None  # the model's op kinds (model_kinds) x (height + 1)
    ratio: float | None = None  # kernels / bound
    record_us: float | None = None  # monadl train: model.loss recording, microseconds per cell call
    samples: list[float] = field(default_factory=list)
    first_loss: float | None = None  # train: the loss of its first step on the segment's first batch
    agrees: bool | None = None  # whether its first result is monadl batched's (None: monadl's own)


# ---------------------------------------------------------------------------------------------------
# Data and timing, shared by every implementation (and by the DyNet worker process)


def load_trees(args: argparse.Namespace) -> tuple[list[Tree], str]:
    """A shuffled pool of ``args.pool`` trees and a description: synthetic, or SST's train split."""
    if args.data:
        train = list(sst.open_dataset(args.data)["train"])
        source = f"SST train split from {args.data} ({len(train)} trees)"
    else:
        train = sst.synthetic_trees(
            args.pool, seed=args.seed, min_leaves=args.min_leaves, max_leaves=args.max_leaves
        )
        source = f"synthetic SST-like trees, {args.min_leaves}-{args.max_leaves} leaves"
    order = np.random.default_rng(args.seed).permutation(len(train))[: args.pool]
    pool = [train[i] for i in order]
    leaves = [len(tree) for tree in pool]
    heights = [tree.height() for tree in pool]
    description = (
        f"{source}: a pool of {len(pool)}, {statistics.mean(leaves):.1f} leaves per tree "
        f"({min(leaves)}-{max(leaves)}), height {min(heights)}-{max(heights)}"
    )
    return pool, description


def segment(pool: Sequence[Tree], batch: int, trees: int) -> list[list[Tree]]:
    """The batches of one timed segment: ceil(trees / batch) distinct batches, the pool cycled."""
    steps = max(1, math.ceil(trees / batch))
    return [[pool[(k * batch + j) % len(pool)] for j in range(batch)] for k in range(steps)]


def trees_per_second(
    run: Callable[[Sequence[Tree]], object], batches: Sequence[Sequence[Tree]], warmup: int, repeats: int
) -> list[float]:
    """Trees/s of ``run`` over ``batches``, once per repeat, after ``warmup`` trees' worth of steps."""
    return interleaved_trees([run], batches, warmup, repeats)[0]


def interleaved_trees(
    runs: Sequence[Callable[[Sequence[Tree]], object]],
    batches: Sequence[Sequence[Tree]],
    warmup: int,
    repeats: int,
    synchronize: Callable[[], None] | None = None,
) -> list[list[float]]:
    """Trees/s of each of ``runs`` over ``batches``, ``repeats`` times: each warmed up with
    ``warmup`` trees' worth of steps, then one timed segment of each in turn per round
    (``common.interleaved``)."""
    for run in runs:
        for k in range(max(1, math.ceil(warmup / len(batches[0])))):
            run(batches[k % len(batches)])
    return interleaved([functools.partial(_segment, run, batches) for run in runs], repeats, synchronize)


def _segment(run: Callable[[Sequence[Tree]], object], batches: Sequence[Sequence[Tree]]) -> int:
    for b in batches:
        run(b)
    return sum(len(b) for b in batches)


def _with_words(
    run: Callable[[Sequence[Tree], WordId], object], word_id: WordId
) -> Callable[[Sequence[Tree]], object]:
    return lambda trees: run(trees, word_id)


def _measurement(impl: str, phase: str, batches: list[list[Tree]], rates: list[float]) -> Measurement:
    trees = sum(len(b) for b in batches)
    return Measurement(
        impl, phase, len(batches[0]), trees, statistics.median(rates), min(rates), max(rates), samples=rates
    )


def initial_params(vocabulary_size: int, args: argparse.Namespace) -> dict[str, Any]:
    """The initial weights of monadl's model (by its names), for the peers to start from."""
    model = TreeLstm(vocabulary_size, args.embedding, args.hidden, seed=args.seed)
    return {name: np.asarray(weight.data) for name, weight in model.weights.items()}


# ---------------------------------------------------------------------------------------------------
# monadl


def _record_us(model: Any, batches: Sequence[Sequence[Tree]], word_id: WordId, repeats: int) -> float:
    """The median over ``repeats`` of ``model.loss``'s time (recording only) per cell call, in us,
    with the garbage collector paused as the example's training step records (``ml.gc_paused``).
    Each batch records into a graph of its own, as each training step does (its run takes the
    graph from the thread): not run, every batch would append to one graph, ever larger."""
    import monadl as ml
    from monadl.do.graph import swap_recording

    nodes = sum(2 * len(tree) - 1 for b in batches for tree in b)
    samples = []
    for _ in range(repeats):
        seconds = 0.0
        with ml.gc_paused():
            for b in batches:
                start = time.perf_counter()
                loss = model.loss(b, word_id)
                seconds += time.perf_counter() - start
                swap_recording(None)  # the next batch's graph is a new one; this one goes with loss
                del loss
        samples.append(seconds / nodes * 1e6)
    return statistics.median(samples)


@dataclass
class _Contender:
    """One implementation of a (phase, batch) configuration, ready to time: its step or inference,
    (monadl) what to count once the timing is done, and (a worker process's peer) a step that sends
    its result back, where ``run`` does not."""

    implementation: str
    run: Callable[[Sequence[Tree]], object]
    finish: Callable[[Measurement], None] | None = None
    checked: Callable[[Sequence[Tree]], object] | None = None


def monadl_contender(
    vocabulary_size: int,
    word_id: WordId,
    impl: str,
    phase: str,
    batches: list[list[Tree]],
    args: argparse.Namespace,
    executor: Any,
    device: Device | None = None,
) -> _Contender:
    """The model on ``executor`` (``impl``: batching on or off, which the executor must match),
    its weights moved to ``device``; its ``finish`` adds the kernel counts of one more batch and,
    for training, the recording cost."""
    model = TreeLstm(vocabulary_size, args.embedding, args.hidden, seed=args.seed, executor=executor)
    if device is not None:
        device.move_weights(model.weights.values())
    run = _with_words(model.step if phase == "train" else model.predict_roots, word_id)

    def finish(m: Measurement) -> None:
        executor.stats = type(executor.stats)()  # counts from here on: a step is two runs
        run(batches[0])  # once more, to count its kernels (forward and backward)
        stats = executor.stats
        m.kernels, m.merged, m.kinds = stats.kernels, stats.merged, dict(stats.kinds)
        m.signatures = stats.signatures
        m.height = max(tree.height() for tree in batches[0])
        if impl == "monadl" and phase == "infer":  # the bound's kinds (add_bounds): the model's own
            m.model_kinds = sorted(stats.kinds)
        if phase == "train":
            m.record_us = _record_us(model, batches, word_id, args.repeats)

    return _Contender(impl, run, finish)


def _monadl_executor(impl: str, pool: int = 1) -> Any:
    import monadl as ml

    return ml.Executor(pool, limit_blas=False, batching=impl != "monadl-unbatched")


def _pool_of(impl: str) -> int:
    """The pool size of a monadl implementation's executor: ``monadl@4`` is batched on a pool of 4."""
    return int(impl.partition("@")[2] or 1)


def measure_together(
    vocabulary_size: int,
    word_id: WordId,
    impls: Sequence[str],
    phase: str,
    batches: list[list[Tree]],
    params: Mapping[str, np.ndarray],
    args: argparse.Namespace,
    peers: Sequence[DynetPeer] = (),
    device: Device | None = None,
) -> list[Measurement]:
    """Trees/s of ``impls`` (monadl batched or unbatched, torch) and of the DyNet ``peers`` in one
    phase, their segments timed in turn (``interleaved_trees``), and monadl's kernel counts;
    ``params``: torch's initial weights; ``device``: where monadl's and torch's arrays live."""
    device = device or Device("cpu")
    with contextlib.ExitStack() as stack:
        contenders = []
        for impl in impls:
            if impl.startswith("dynet"):
                continue
            if impl in ("torch", "torch-levels"):
                torch_model = TorchTreeLstm if impl == "torch" else TorchLevelTreeLstm
                model = torch_model(params, device=device.torch_device)
                run = _with_words(model.step if phase == "train" else model.predict_roots, word_id)
                contenders.append(_Contender(impl, run))
            else:
                executor = stack.enter_context(_monadl_executor(impl, _pool_of(impl)))
                contenders.append(
                    monadl_contender(vocabulary_size, word_id, impl, phase, batches, args, executor, device)
                )
        for peer in peers:
            run, checked = peer.runner(phase, batches), peer.runner(phase, batches, result=True)
            contenders.append(_Contender(peer.implementation, run, checked=checked))
        runs = [c.run for c in contenders]
        firsts = [_first_result((c.checked or c.run)(batches[0])) for c in contenders]  # a warm-up step
        rates = interleaved_trees(runs, batches, args.warmup, args.repeats, device.synchronize)
        measured = []
        for contender, samples, first in zip(contenders, rates, firsts, strict=True):
            m = _measurement(contender.implementation, phase, batches, samples)
            if contender.finish is not None:
                contender.finish(m)
            m.first_loss = first if isinstance(first, float) else None
            if contender is not contenders[0] and contenders[0].implementation == "monadl":
                m.agrees = _agree(firsts[0], first)
            measured.append(m)
    return measured


def _first_result(result: object) -> float | np.ndarray | None:
    """A step's loss (a float) or an inference's root scores (on the host); None from a peer that
    sends no result back."""
    if result is None or isinstance(result, float):
        return result
    return np.asarray(host_array(result), dtype=np.float64)


def _agree(mine: float | np.ndarray | None, theirs: float | np.ndarray | None) -> bool | None:
    """Whether two first results agree to 1e-3 (the implementations compute in float32, in
    different orders); None where one is missing."""
    if mine is None or theirs is None:
        return None
    if isinstance(mine, float) and isinstance(theirs, float):
        return math.isclose(mine, theirs, rel_tol=1e-3)
    if isinstance(mine, float) or isinstance(theirs, float) or np.shape(mine) != np.shape(theirs):
        return False
    return bool(np.allclose(theirs, mine, rtol=1e-3, atol=1e-4))


def add_bounds(results: list[Measurement]) -> None:
    """Sets every monadl measurement's depth bound and ratio, from the batched inference's op kinds."""
    kinds = {
        m.batch: len(m.model_kinds)
        for m in results
        if (m.implementation, m.phase) == ("monadl", "infer") and m.model_kinds is not None
    }
    for m in results:
        if m.kinds is not None and m.height is not None and kinds.get(m.batch):
            m.bound = kinds[m.batch] * (m.height + 1)
            if m.kernels is not None:
                m.ratio = m.kernels / m.bound


# ---------------------------------------------------------------------------------------------------
# DyNet (run in a worker process: DyNet fixes autobatching at import, once per process)


def dynet_available() -> bool:
    """Whether the ``dynet`` module (the pip package dynet38) is installed here."""
    return importlib.util.find_spec("dynet") is not None


class DynetTreeLstm:
    """The Tree-LSTM in DyNet: node by node like the example; ``dy`` is the imported ``dynet``.

    Weights are copies of ``params`` (DyNet's matrices are (outputs, inputs): the transposes);
    two Adagrad trainers, 0.05 and 0.1 for the embeddings, epsilon 1e-8, no gradient clipping.
    """

    def __init__(
        self,
        dy: Any,
        params: Mapping[str, np.ndarray],
        *,
        learning_rate: float = 0.05,
        embedding_learning_rate: float = 0.1,
    ) -> None:
        self.dy = dy
        self.weights = dy.ParameterCollection()
        self.embedding_weights = dy.ParameterCollection()
        self.embeddings = self.embedding_weights.lookup_parameters_from_numpy(params["embeddings"])
        gates = {name.rsplit(".", 1)[0] for name in PARAMETERS if name != "embeddings"}
        self.affine = {
            gate: (
                self.weights.parameters_from_numpy(np.asarray(params[f"{gate}.b"])),
                self.weights.parameters_from_numpy(np.ascontiguousarray(np.asarray(params[f"{gate}.w"]).T)),
            )
            for gate in gates
        }
        self.trainers = [
            dy.AdagradTrainer(self.weights, learning_rate, 1e-8),
            dy.AdagradTrainer(self.embedding_weights, embedding_learning_rate, 1e-8),
        ]
        for trainer in self.trainers:
            trainer.set_clip_threshold(0)  # DyNet clips gradients at 5 by default; monadl does not

    def _gate(self, gate: str, x: Any) -> Any:
        b, w = self.affine[gate]
        return self.dy.affine_transform([b, w, x])

    def states(self, tree: Tree, word_id: WordId) -> list[tuple[Any, Any]]:
        """Every node's ``(h, c)`` expressions, in post-order (the root last)."""
        dy = self.dy
        nodes = list(tree.nodes())
        states: dict[int, tuple[Any, Any]] = {}
        for node in nodes:
            if node.left is None or node.right is None:
                assert node.word is not None
                x = dy.lookup(self.embeddings, word_id(node.word))
                c = self._gate("leaf_c", x)
                h = dy.cmult(dy.logistic(self._gate("leaf_o", x)), dy.tanh(c))
            else:
                h_l, c_l = states[id(node.left)]
                h_r, c_r = states[id(node.right)]
                children = dy.concatenate([h_l, h_r])
                i, f_l, f_r, o = (
                    dy.logistic(self._gate(g, children)) for g in ("i", "f_left", "f_right", "o")
                )
                u = dy.tanh(self._gate("u", children))
                c = dy.cmult(i, u) + dy.cmult(f_l, c_l) + dy.cmult(f_r, c_r)
                h = dy.cmult(o, dy.tanh(c))
            states[id(node)] = (h, c)
        return [states[id(node)] for node in nodes]

    def _loss(self, trees: Sequence[Tree], word_id: WordId) -> Any:
        dy = self.dy
        dy.renew_cg()
        losses = []
        for tree in trees:
            labels = [node.label for node in tree.nodes()]
            node_losses = [
                dy.pickneglogsoftmax(self._gate("classifier", h), label)
                for (h, _), label in zip(self.states(tree, word_id), labels, strict=True)
            ]
            losses.append(dy.esum(node_losses))
        return dy.esum(losses) * (1.0 / len(trees))

    def loss(self, trees: Sequence[Tree], word_id: WordId) -> float:
        """The mean loss per tree of the batch, forward only."""
        return float(self._loss(trees, word_id).value())

    def step(self, trees: Sequence[Tree], word_id: WordId) -> float:
        """One Adagrad step on the mean loss per tree of the batch; returns that mean."""
        loss = self._loss(trees, word_id)
        value = float(loss.value())
        loss.backward()
        for trainer in self.trainers:
            trainer.update()
        return value

    def predict_roots(self, trees: Sequence[Tree], word_id: WordId) -> np.ndarray:
        """The classifier's scores at every tree's root, (len(trees), classes): one forward."""
        dy = self.dy
        dy.renew_cg()
        roots = [self._gate("classifier", self.states(tree, word_id)[-1][0]) for tree in trees]
        scores = np.asarray(dy.concatenate_cols(roots).npvalue())
        return scores.reshape(-1, len(trees)).T


def dynet_worker(folder: str) -> None:
    """The DyNet worker's main: reads ``folder`` (``task.json``, the trees in SST's format and the
    weights as ``.npz``, read without pickle), then runs one step per request line on stdin
    (``phase batch k``: batch ``k`` of that configuration's segment), answering each on stdout
    (with ``result`` after them: the step's loss or the root scores in the answer)."""
    task = json.loads((Path(folder) / "task.json").read_text())
    pool = sst.read_trees(Path(folder) / "trees.txt")
    with np.load(Path(folder) / "params.npz", allow_pickle=False) as saved:
        params = {name: saved[name] for name in saved.files}
    import dynet_config  # type: ignore[import-not-found, import-untyped, unused-ignore]

    dynet_config.set(mem=task["mem"], random_seed=task["seed"] + 1, autobatch=int(task["autobatch"]))
    import dynet as dy  # type: ignore[import-not-found, import-untyped, unused-ignore]

    word_id = sst.Vocabulary.from_trees(pool).index  # the parent's, built from the same pool
    models: dict[tuple[str, int], Callable[[Sequence[Tree]], object]] = {}
    segments: dict[int, list[list[Tree]]] = {}
    print(_DYNET_MARK + "ready", flush=True)
    for line in sys.stdin:
        words = line.split()  # phase batch k [result]
        phase, batch, k = words[:3]
        key = (phase, int(batch))
        run = models.get(key)
        if run is None:  # a model of its own per configuration, as monadl's
            model = DynetTreeLstm(dy, params)
            run = models[key] = _with_words(model.step if phase == "train" else model.predict_roots, word_id)
        if key[1] not in segments:
            segments[key[1]] = segment(pool, key[1], task["trees"])
        result = run(segments[key[1]][int(k)])
        sent = "" if len(words) < 4 else "".join(f" {float(x)!r}" for x in np.ravel(np.asarray(result)))
        print(_DYNET_MARK + "done" + sent, flush=True)


class DynetPeer(WorkerProcess):
    """A DyNet worker process (autobatching on or off), run step by step from here, so that its
    segments are timed in turn with the others (``dynet_worker``). A context manager."""

    def __init__(
        self, autobatch: bool, pool: list[Tree], params: dict[str, np.ndarray], args: argparse.Namespace
    ) -> None:
        self.implementation = "dynet-autobatch" if autobatch else "dynet"
        self.pool = pool
        self.trees = args.trees
        task = {"autobatch": autobatch, "trees": args.trees, "seed": args.seed, "mem": str(args.dynet_mem)}

        def files(folder: Path) -> None:
            (folder / "task.json").write_text(json.dumps(task))
            sst.write_trees(pool, folder / "trees.txt")
            arrays: dict[str, Any] = dict(params)
            np.savez(folder / "params.npz", allow_pickle=False, **arrays)

        super().__init__(
            LABELS[self.implementation], "monadl.bench.treelstm", "dynet_worker", _DYNET_MARK, files
        )

    def runner(
        self, phase: str, batches: list[list[Tree]], *, result: bool = False
    ) -> Callable[[Sequence[Tree]], object]:
        """A step of this peer on one of ``batches`` (a segment's, found by identity); ``result``:
        one that returns the step's loss or the inference's root scores (sent back as text)."""
        index = {id(b): k for k, b in enumerate(batches)}
        batch = len(batches[0])

        def run(trees: Sequence[Tree]) -> object:
            answer = self.ask(f"{phase} {batch} {index[id(trees)]}{' result' if result else ''}")
            if not result:
                return None
            values = np.array([float(x) for x in answer[1:]])
            return float(values[0]) if phase == "train" else values.reshape(len(trees), -1)

        return run


def start_dynet(
    pool: list[Tree], params: dict[str, np.ndarray], args: argparse.Namespace, stack: contextlib.ExitStack
) -> tuple[list[DynetPeer], list[str]]:
    """The two DyNet peers (autobatching on, off) that start, and why any did not."""
    peers: list[DynetPeer] = []
    notes: list[str] = []
    for autobatch in (True, False):
        try:
            peers.append(stack.enter_context(DynetPeer(autobatch, pool, params, args)))
        except RuntimeError as e:
            notes.append(str(e))
    return peers, notes


# ---------------------------------------------------------------------------------------------------
# The run


def measure(args: argparse.Namespace, out: Any = None) -> tuple[list[Measurement], dict[str, Any]]:
    """Runs every configuration; returns the measurements and a description of the run, whose notes
    (what was skipped, and why) are also printed to ``out``."""
    out = out or sys.stdout
    pool, description = load_trees(args)
    vocabulary = sst.Vocabulary.from_trees(pool)
    word_id = vocabulary.index
    device = Device(args.device)
    have_torch = not args.no_torch and torch_available()
    have_dynet = not args.no_dynet and dynet_available() and device.is_numpy
    notes: list[str] = []
    if not device.is_numpy:
        notes.append(f"dynet: skipped on --device {device.name} (the suite's DyNet runs on the CPU)")
    pools = sorted(set(args.workers) - {1})  # monadl batched on more workers than one
    for workers in pools:
        LABELS.setdefault(f"monadl@{workers}", f"monadl {workers} workers")
    if args.max_unbatched < max(args.batches):
        skipped = [b for b in args.batches if b > args.max_unbatched]
        notes.append(
            f"monadl unbatched: skipped at batch {skipped} (above --max-unbatched {args.max_unbatched})"
        )
    if args.no_torch:
        notes.append("torch: skipped (--no-torch)")
    elif args.no_torch_eager and have_torch:
        notes.append("torch eager: skipped (--no-torch-eager)")
    elif not have_torch:
        notes.append("torch: not installed, its figures skipped (pip install torch)")
    if args.no_dynet:
        notes.append("dynet: skipped (--no-dynet)")
    elif not have_dynet and device.is_numpy:
        notes.append("dynet: not installed, its figures skipped (pip install dynet38)")

    # The implementations of one (batch, phase) are timed in turn, segment by segment (interleaved).
    configs: list[tuple[int, str, list[str]]] = []
    for batch in args.batches:
        for phase in args.phases:
            impls = ["monadl", *(f"monadl@{workers}" for workers in pools)]
            if batch <= args.max_unbatched:
                impls.append("monadl-unbatched")
            if have_torch:
                impls += ["torch-levels"] if args.no_torch_eager else ["torch", "torch-levels"]
            configs.append((batch, phase, impls))
    progress = Progress(len(configs), args.progress, "treelstm benchmark")

    results: list[Measurement] = []
    params = initial_params(len(vocabulary), args)
    info: dict[str, Any] = {
        "data": description,
        "vocabulary": len(vocabulary),
        "batches": list(args.batches),
        "phases": list(args.phases),
        "embedding": args.embedding,
        "hidden": args.hidden,
        "trees_per_segment": args.trees,
        "repeats": args.repeats,
        "warmup_trees": args.warmup,
        "max_unbatched": args.max_unbatched,
        "pools": [1, *pools],
        "device": device.describe(),
        "compiled": _compiled(),
        "machine": f"{platform.machine()}, {platform.processor() or '?'}, {cpus()} CPUs, one thread used",
        "python": platform.python_version(),
        "numpy": np.__version__,
        "blas": blas_libraries(),
        "torch": _version("torch") if have_torch else "skipped",
        "dynet": _version("dynet") if have_dynet else "skipped",
    }
    try:
        with threadpool_limits(limits=1), contextlib.ExitStack() as stack:
            if have_torch:
                import torch  # type: ignore[import-not-found, unused-ignore]

                torch.set_num_threads(1)
            peers: list[DynetPeer] = []
            if have_dynet:
                peers, failures = start_dynet(pool, params, args, stack)
                notes += failures
            for batch, phase, impls in configs:
                names = impls + [peer.implementation for peer in peers]
                progress.start(f"{' / '.join(LABELS[i] for i in names)} {phase} batch {batch}")
                batches = segment(pool, batch, args.trees)
                results += measure_together(
                    len(vocabulary), word_id, impls, phase, batches, params, args, peers, device
                )
                progress.advance()
    finally:
        progress.close()
    add_bounds(results)
    for m in results:
        if m.agrees is False:
            mine = _find(results, "monadl", m.phase, m.batch)
            what = "loss" if m.phase == "train" else "root scores"
            values = ""
            if mine is not None and m.first_loss is not None and mine.first_loss is not None:
                values = f": {m.first_loss:.6g} against {mine.first_loss:.6g}"
            notes.append(
                f"warning: {LABELS[m.implementation]}'s first {what} at {m.phase} batch {m.batch} "
                f"differ from monadl batched's{values}"
            )
    info["notes"] = notes
    info["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"data: {description}; vocabulary {len(vocabulary)}", file=out)
    for note in notes:
        print(note, file=out)
    return results, info


def _compiled() -> bool:
    """Whether monadl's engine runs compiled (mypyc) in this run."""
    import monadl as ml

    return ml.compiled()


def _version(package: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    for name in {"dynet": ("dynet38", "dyNET38", "dynet")}.get(package, (package,)):
        try:
            return version(name)
        except PackageNotFoundError:
            continue
    return "?"


# ---------------------------------------------------------------------------------------------------
# Reporting


def _find(results: Sequence[Measurement], impl: str, phase: str, batch: int) -> Measurement | None:
    for m in results:
        if (m.implementation, m.phase, m.batch) == (impl, phase, batch):
            return m
    return None


def table(results: Sequence[Measurement], args: argparse.Namespace) -> str:
    """Trees/s per implementation and phase, batch sizes across; then monadl's kernel launches."""
    width = 20
    impls = [impl for impl in LABELS if any(m.implementation == impl for m in results)]
    head = f"{'':<17} {'phase':<5} | " + " ".join(f"{'batch ' + str(b):>{width}}" for b in args.batches)
    lines = [
        f"trees/s: median [min-max] of {args.repeats} repeats; train: one Adagrad step, infer: a forward"
    ]
    lines += [head, "-" * len(head)]
    for phase in args.phases:
        for impl in impls:
            cells = []
            for b in args.batches:
                m = _find(results, impl, phase, b)
                cells.append(f"{m.median:7.1f} [{m.low:.1f}-{m.high:.1f}]" if m else "-")
            lines.append(f"{LABELS[impl]:<17} {phase:<5} | " + " ".join(f"{c:>{width}}" for c in cells))
    lines += _ratio_lines(results, args, head, width)
    counted = [m for m in results if m.kernels is not None]
    if counted:
        lines += ["", "kernel launches per batch / depth bound (op kinds x (max height + 1)) = ratio"]
        lines += [head, "-" * len(head)]
        for phase in args.phases:
            for impl in ("monadl", "monadl-unbatched"):
                cells = []
                for b in args.batches:
                    m = _find(counted, impl, phase, b)
                    ratio = f" = {m.ratio:.1f}x" if m and m.ratio is not None else ""
                    cells.append(f"{m.kernels}/{m.bound if m.bound else '?'}{ratio}" if m else "-")
                if any(c != "-" for c in cells):
                    lines.append(
                        f"{LABELS[impl]:<17} {phase:<5} | " + " ".join(f"{c:>{width}}" for c in cells)
                    )
        kinds = {
            b: m.model_kinds
            for b in args.batches
            if (m := _find(results, "monadl", "infer", b)) and m.model_kinds
        }
        if kinds:
            largest = max(kinds)
            infer = _find(results, "monadl", "infer", largest)
            lines.append(
                f"op kinds of the model's batched inference at batch {largest}: {len(kinds[largest])} "
                f"({', '.join(kinds[largest])}); {infer.signatures if infer else '?'} distinct signatures "
                "(one op on different weights or shapes counts once for each)"
            )
    else:
        lines.append("kernel launches: this Executor has no last_stats (not reported)")
    records = [
        m.record_us for b in args.batches if (m := _find(results, "monadl", "train", b)) and m.record_us
    ]
    if records:
        lines.append(
            f"recording (model.loss, nothing runs): {statistics.median(records):.1f} us per cell call "
            f"(median over batch sizes; {min(records):.1f}-{max(records):.1f})"
        )
    return "\n".join(lines)


def paired_ratio(a: Measurement, b: Measurement) -> tuple[float, float, float] | None:
    """``a``'s rate over ``b``'s, round by round (their segments ran in turn), as the median, min
    and max over the rounds: the drift of the machine's speed between rounds cancels out."""
    if not a.samples or len(a.samples) != len(b.samples):
        return None
    ratios = [x / y for x, y in zip(a.samples, b.samples, strict=True)]
    return statistics.median(ratios), min(ratios), max(ratios)


def _ratio_lines(
    results: Sequence[Measurement], args: argparse.Namespace, head: str, width: int
) -> list[str]:
    """monadl batched against each other implementation: the median of the per-round ratios."""
    lines: list[str] = []
    for phase in args.phases:
        for other in LABELS:
            if other == "monadl":
                continue
            cells = []
            for b in args.batches:
                mine, theirs = _find(results, "monadl", phase, b), _find(results, other, phase, b)
                r = paired_ratio(mine, theirs) if mine and theirs else None
                cells.append(f"{r[0]:.2f} [{r[1]:.2f}-{r[2]:.2f}]" if r else "-")
            if any(c != "-" for c in cells):
                lines.append(
                    f"/ {LABELS[other]:<15} {phase:<5} | " + " ".join(f"{c:>{width}}" for c in cells)
                )
    if not lines:
        return []
    return [
        "",
        "monadl batched / each other, per round: median [min-max] of the rounds' ratios",
        head,
        "-" * len(head),
        *lines,
    ]


def plot(results: Sequence[Measurement], args: argparse.Namespace, path: Path) -> None:
    """Trees/s against batch size (log-log), one panel per phase, one line per implementation."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(args.phases), figsize=(6 * len(args.phases), 4.5), squeeze=False)
    for ax, phase in zip(axes[0], args.phases, strict=True):
        for impl, label in LABELS.items():
            ms = [m for b in args.batches if (m := _find(results, impl, phase, b))]
            if not ms:
                continue
            style = "-" if impl.startswith("monadl") else "--"
            xs = [m.batch for m in ms]
            (line,) = ax.plot(xs, [m.median for m in ms], style, marker="o", label=label)
            ax.fill_between(xs, [m.low for m in ms], [m.high for m in ms], color=line.get_color(), alpha=0.15)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(list(args.batches), [str(b) for b in args.batches])
        ax.set_title(
            {"train": "training (one Adagrad step per batch)", "infer": "inference"}.get(phase, phase)
        )
        ax.set_xlabel("batch size (trees)")
        ax.set_ylabel("trees / s (min-max shaded)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=9, frameon=False)
    fig.suptitle(f"Tree-LSTM: hidden {args.hidden}, embedding {args.embedding}, one thread")
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(path) as f:
        fig.savefig(f, format="png", dpi=110)
    plt.close(fig)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``treelstm`` subcommand's options."""
    parser.add_argument(
        "--batches", type=positive_int, nargs="+", default=[1, 16, 64, 256], help="batch sizes (trees)"
    )
    parser.add_argument("--phases", nargs="+", choices=PHASES, default=list(PHASES))
    parser.add_argument(
        "--max-unbatched", type=non_negative_int, default=64, help="monadl unbatched only up to this batch"
    )
    parser.add_argument(
        "--trees", type=positive_int, default=64, help="at least this many trees per timed segment"
    )
    parser.add_argument("--repeats", type=positive_int, default=5, help="timed segments per configuration")
    parser.add_argument(
        "--warmup", type=non_negative_int, default=16, help="trees' worth of untimed steps first"
    )
    parser.add_argument(
        "--pool", type=positive_int, default=1024, help="distinct trees the batches are drawn from"
    )
    parser.add_argument("--embedding", type=positive_int, default=128)
    parser.add_argument("--hidden", type=positive_int, default=128)
    parser.add_argument("--min-leaves", type=positive_int, default=10, help="synthetic trees' fewest leaves")
    parser.add_argument("--max-leaves", type=positive_int, default=40, help="synthetic trees' most leaves")
    parser.add_argument(
        "--data", help="the SST folder (train.txt, ...): its train split (default: synthetic)"
    )
    parser.add_argument(
        "--workers",
        type=positive_int,
        nargs="+",
        default=[1],
        help="executor pool sizes of monadl batched (default 1; BLAS stays at one thread)",
    )
    parser.add_argument(
        "--no-torch-eager",
        action="store_true",
        help="skip the node-by-node PyTorch peer (slow at large batches on a GPU); keep the batched one",
    )
    add_device_option(parser)
    add_peer_options(parser, dynet=True)


def run_cli(args: argparse.Namespace) -> int:
    """Runs the benchmark from parsed arguments; prints the tables."""
    if args.smoke:
        args.batches = [1, 4]
        args.embedding = args.hidden = 16
        args.min_leaves, args.max_leaves = 2, 6
        args.pool, args.trees, args.repeats, args.warmup = 16, 4, 3, 1
        args.dynet_mem = min(args.dynet_mem, 128)
    if args.min_leaves > args.max_leaves:
        raise SystemExit(f"treelstm: --min-leaves {args.min_leaves} is above --max-leaves {args.max_leaves}")
    results, info = measure(args)
    print(table(results, args))
    print(f"peak RSS: {info['peak_rss_mib']:.0f} MiB; torch: {info['torch']}; dynet: {info['dynet']}")
    print(f"BLAS: {info['blas']}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        data = {
            "benchmark": "treelstm",
            "unit": "trees/s",
            "run": info,
            "results": [asdict(m) for m in results],
        }
        atomic_write_bytes(args.json, json.dumps(data, indent=2).encode())
        print(f"wrote {args.json}")
    if args.plot:
        plot(results, args, args.plot)
        print(f"wrote {args.plot}")
    return 0
