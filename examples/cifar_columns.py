"""CIFAR-100 with columns of experts: the benchmark model of the DeepLearning.scala 2 paper.

``n`` independent columns (each two dense layers 3072 -> 64 -> 64 with ReLU) read the image; their
outputs are summed. A coarse classifier (dense 64 -> 20) predicts the coarse class (20 classes) and 20
fine classifiers (each 64 -> 64 -> 64 -> 5 with ReLU) predict the fine class within a coarse class.
Every batch holds images of one coarse class ``c``; the loss is the cross-entropy of the coarse
prediction plus that of fine classifier ``c``:

* ``skip``: the network is built from the batch's class, in ordinary Python: only classifier ``c``
  exists in the graph, so only it runs;
* ``noskip``: all 20 fine classifiers run, forward and backward; the others' losses are added with
  weight zero, so their parameters get (exactly zero) gradients from real work. The 20 classifiers
  have equal shapes, so they run as one: each layer's 20 weights are held as one stacked weight
  (20, ...) and multiplied in one batched matmul (``stacked=False`` keeps 20 weights of each and
  runs them one by one, 20 times the ops).

The columns are independent sub-graphs: with an executor of several workers, their kernels (large
matmuls, worth the pool) run in parallel, forward and backward.

Run it: ``python examples/cifar_columns.py`` (synthetic data in the CIFAR-100 binary format, made on
first use), or ``python examples/cifar_columns.py --data path/to/cifar-100-binary`` for the real set.
On a terminal a progress bar shows the images/s and the loss (with tqdm installed; ``--no-progress``
hides it); ``--plot curves.png`` draws the loss per step and per 50 steps (with matplotlib).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Literal

import numpy as np
from array_api_compat import array_namespace
from returns.result import Failure

import monadl as ml
from monadl import Array, ArrayLayer, ArrayWeight, FloatLayer
from monadl.bench.columns_params import FINE_CLASSES, FINE_PARAMS, FINE_PER_COARSE, init_params
from monadl.cli import (
    Progress,
    add_output_arguments,
    check_plot,
    non_negative_int,
    plot_curves,
    positive_float,
    positive_int,
)
from monadl.typeclasses.backend import IndexArray

Variant = Literal["skip", "noskip"]
COARSE_CLASSES = 20
SEGMENT = 50
"""Steps per printed (and plotted) mean of the loss."""


def dense_relu(x: ml.AnyArray, w: ArrayWeight, b: ArrayWeight) -> ArrayLayer:
    """``relu(x @ w + b)``."""
    return ml.relu(ml.linear(x, w, b))


def cross_entropy(logits: ArrayLayer, labels: IndexArray, classes: int) -> FloatLayer:
    """The paper's ``-mean(log(softmax(logits)) * onehot)``, over all batch x class elements."""
    return ml.cross_entropy(logits, labels) * (1.0 / classes)


class ColumnNetwork:
    """The model: its weights (named as in ``columns_params``), its loss and its training step.

    The paper trains with SGD at ``learning_rate`` (1e-4); ``optimizer`` replaces it. ``stacked``
    (``noskip`` only): hold each fine layer's 20 weights as one weight ``fine.w1``, ..., ``fine.b3``
    of shape (20, ...) and run the 20 classifiers as one stack of batched matmuls (the default), or
    keep them apart and run them one by one."""

    def __init__(
        self,
        params: dict[str, np.ndarray],
        variant: Variant = "skip",
        learning_rate: float = 1e-4,
        executor: ml.Executor | None = None,
        optimizer: ml.Optimizer | None = None,
        stacked: bool = True,
    ) -> None:
        if variant not in ("skip", "noskip"):
            raise ValueError(f"variant must be 'skip' or 'noskip', got {variant!r}")
        self.variant = variant
        self.stacked = stacked and variant == "noskip"
        # A fine layer's shapes (hidden x hidden, ...), for the gradients by classifier.
        self.fine_shapes = {layer: params[f"fine0.{layer}"].shape for layer in FINE_PARAMS}
        if self.stacked:
            params = _stacked(params)
        self.weights = {name: ArrayWeight(value, name=name) for name, value in params.items()}
        self.columns = sum(1 for name in params if name.endswith(".w1") and name.startswith("column"))
        self.optimizer = optimizer or ml.SGD(learning_rate)
        self.executor = executor

    def features(self, x: Array) -> ArrayLayer:
        """The sum of the columns' outputs: independent sub-graphs, run in parallel."""
        w = self.weights
        columns = [
            dense_relu(
                dense_relu(x, w[f"column{i}.w1"], w[f"column{i}.b1"]), w[f"column{i}.w2"], w[f"column{i}.b2"]
            )
            for i in range(self.columns)
        ]
        total = columns[0]
        for column in columns[1:]:
            total = total + column
        return total

    def fine_logits(self, h: ArrayLayer, j: int) -> ArrayLayer:
        """Fine classifier ``j`` (of coarse class ``j``): 64 -> 64 -> 64 -> 5."""
        w = self.weights
        f = dense_relu(dense_relu(h, w[f"fine{j}.w1"], w[f"fine{j}.b1"]), w[f"fine{j}.w2"], w[f"fine{j}.b2"])
        return ml.linear(f, w[f"fine{j}.w3"], w[f"fine{j}.b3"])

    def loss(self, x: Array, coarse: int, fine_local: IndexArray) -> FloatLayer:
        """The loss of one batch of coarse class ``coarse``, with local fine labels 0..4."""
        if not 0 <= coarse < COARSE_CLASSES:
            raise ValueError(f"coarse class must be in 0..19, got {coarse}")
        h = self.features(x)
        coarse_labels = np.full(fine_local.shape[0], coarse, dtype=np.int64)
        w = self.weights
        total = cross_entropy(ml.linear(h, w["coarse.w"], w["coarse.b"]), coarse_labels, COARSE_CLASSES)
        if self.variant == "skip":
            return total + cross_entropy(self.fine_logits(h, coarse), fine_local, FINE_PER_COARSE)
        if not self.stacked:
            total = total + cross_entropy(self.fine_logits(h, coarse), fine_local, FINE_PER_COARSE)
            for j in range(FINE_CLASSES):
                if j != coarse:
                    total = total + 0.0 * cross_entropy(self.fine_logits(h, j), fine_local, FINE_PER_COARSE)
            return total
        # All 20 classifiers as one: their weights stacked, each layer one batched matmul.
        logits = self.stacked_fine_logits(h)  # (20, batch, 5)
        matched = ml.reshape(ml.take_rows(logits, [coarse]), (-1, FINE_PER_COARSE))
        total = total + cross_entropy(matched, fine_local, FINE_PER_COARSE)
        # The others' losses, with weight zero: they run, forward and backward, and add exactly 0.
        xp = array_namespace(x)  # the weights' namespace: CuPy's on a GPU
        hits = xp.asarray(fine_local[:, None] == np.arange(FINE_PER_COARSE))
        onehot = xp.astype(hits, self.weights["coarse.w"].data.dtype)
        return total + 0.0 * ml.sum(ml.log_softmax(logits) * onehot)

    def stacked_fine_logits(self, h: ArrayLayer) -> ArrayLayer:
        """The 20 fine classifiers' logits at once, shape (20, batch, 5): each layer's stacked
        weight (20, n, m) and bias (20, 1, m), so each layer is one batched matmul."""
        w = self.weights
        f = ml.relu(h @ w["fine.w1"] + w["fine.b1"])
        f = ml.relu(f @ w["fine.w2"] + w["fine.b2"])
        return f @ w["fine.w3"] + w["fine.b3"]

    def step(self, x: Array, coarse: int, fine_local: IndexArray) -> float:
        """One SGD step on a batch; returns its loss, or raises what failed it (then nothing changed)."""
        result = self.loss(x, coarse, fine_local).train_blocking(self.optimizer, executor=self.executor)
        if isinstance(result, Failure):
            raise result.failure()
        return result.unwrap()

    def gradients(self, x: Array, coarse: int, fine_local: IndexArray) -> tuple[float, dict[str, Array]]:
        """The loss and every weight's gradient, by name, without updating anything."""
        value, gradients = ml.compute_gradients(self.loss(x, coarse, fine_local), executor=self.executor)
        named: dict[str, Array] = {}
        for weight, gradient in gradients.items():
            if weight.name.startswith("fine."):  # a stacked weight: classifier j's is row j
                layer = weight.name.removeprefix("fine.")
                for j in range(FINE_CLASSES):
                    named[f"fine{j}.{layer}"] = np.reshape(gradient[j], self.fine_shapes[layer])
            else:
                named[weight.name] = gradient
        return float(value), named


def _stacked(params: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``params`` with each fine layer's 20 weights ``fine{j}.w1`` stacked into one ``fine.w1`` of
    shape (20, ...) (a bias as (20, 1, n), to broadcast over the batch)."""
    stacked = {name: v for name, v in params.items() if not name.startswith("fine")}
    for layer in FINE_PARAMS:
        parts = [params[f"fine{j}.{layer}"] for j in range(FINE_CLASSES)]
        stacked[f"fine.{layer}"] = np.stack([p if p.ndim == 2 else p[None, :] for p in parts])
    return stacked


def main(argv: Sequence[str] | None = None) -> list[float]:
    """Trains on CIFAR-100 (or the built-in synthetic set) and prints the loss; returns the losses."""
    from monadl.data import cifar100

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--data", help="a cifar-100-binary folder, train.bin, or the .tar.gz (default: synthetic)"
    )
    parser.add_argument("--columns", type=positive_int, default=2)
    parser.add_argument("--variant", choices=["skip", "noskip"], default="skip")
    parser.add_argument("--steps", type=positive_int, default=300)
    parser.add_argument("--batch", type=positive_int, default=16)
    parser.add_argument("--learning-rate", type=positive_float, default=1e-4)
    parser.add_argument("--workers", type=positive_int, default=1, help="executor workers (1: sequential)")
    parser.add_argument("--seed", type=non_negative_int, default=0)
    add_output_arguments(parser, plot=f"loss per step and per segment of {SEGMENT} steps")
    args = parser.parse_args(argv)
    check_plot(parser, args.plot)

    data = cifar100.open_dataset(args.data, seed=args.seed)
    print(f"data: {data.describe()}")
    params = init_params(args.columns, seed=args.seed)
    losses: list[float] = []
    segments: list[tuple[int, float]] = []  # (last step, mean loss of the segment's steps)
    bar = Progress(args.steps * args.batch, desc="training", unit="images", enabled=not args.no_progress)
    with ml.Executor(args.workers) as executor, bar:
        network = ColumnNetwork(params, args.variant, args.learning_rate, executor)
        batches = data.batches(args.batch, seed=args.seed, epochs=None)
        for step in range(args.steps):
            x, coarse, fine_local = next(batches)
            losses.append(network.step(x, coarse, fine_local))
            recent = losses[-SEGMENT:]
            bar.update(len(x), loss=sum(recent) / len(recent))
            if step % SEGMENT == 0 or step == args.steps - 1:
                segments.append((step, sum(recent) / len(recent)))
                bar.write(f"step {step:4d}: loss {segments[-1][1]:.5f} (mean of the last {len(recent)})")
    if args.plot:
        plot_curves(
            args.plot,
            f"CIFAR-100 columns: {args.columns} column(s), {args.variant}, batch {args.batch}",
            "step",
            {
                "training loss": {
                    "per step": (range(len(losses)), losses),
                    f"mean of the last {SEGMENT} steps": ([s for s, _ in segments], [m for _, m in segments]),
                }
            },
        )
        print(f"plot: {args.plot}")
    return losses


if __name__ == "__main__":
    main()
