"""Sentiment of sentences with a binary constituency Tree-LSTM (Tai, Socher and Manning, 2015).

A sentence is a binary parse tree whose words are the leaves, and every node carries a sentiment
label 0-4 (very negative .. very positive), as in the Stanford Sentiment Treebank. The model is
``monadl.bench.treelstm_model.TreeLstm``, the one ``python -m monadl.bench treelstm`` measures: a
``monadl.nn.TreeLSTMCell`` run over each tree in plain Python, children before their parent, one
node at a time, so that the graph has the tree's shape; a classifier and a loss at every node.
There is no manual batching: the executor's dynamic batching merges the cell's calls of one height
across all the trees of a batch into one run on stacked rows (``--no-batching`` turns that off; the
results are the same).

This script trains it with Adagrad and prints, for the dev trees (never trained on), the root
accuracy before training and after each epoch: fine-grained (5 classes) and binary (neutral roots
dropped; positive when the two positive classes are together more probable than the two negative
ones). With ``--data``, it also scores the test trees with the epoch that did best on dev.

Run it: ``python examples/tree_lstm.py`` (synthetic trees from ``monadl.data.sst``), or
``python examples/tree_lstm.py --data path/to/trainDevTestTrees_PTB`` for the real treebank. On a
terminal a progress bar shows each epoch's trees/s and loss (with tqdm installed; ``--no-progress``
hides it); ``--plot curves.png`` draws the loss and the dev accuracy per epoch (with matplotlib).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

import monadl as ml
from monadl import nn
from monadl.bench.treelstm_model import ArrayWeights, State, TreeLstm, WordId
from monadl.cli import (
    Progress,
    add_output_arguments,
    check_plot,
    non_negative_float,
    non_negative_int,
    plot_curves,
    positive_float,
    positive_int,
)
from monadl.nn.linear import Seed

__all__ = ["ArrayWeights", "Cell", "State", "TreeLstm", "WordId", "main"]


class Cell(nn.TreeLSTMCell):
    """The example's own cell of old, now :class:`monadl.nn.TreeLSTMCell`, under its old API (``new``
    with a positional generator, ``leaf_cell``, ``inner_cell``) for code that still uses it
    (tests/test_nn.py compares the two). The model, ``TreeLstm``, uses ``TreeLSTMCell`` itself."""

    leaf_cell = nn.TreeLSTMCell.leaf
    inner_cell = nn.TreeLSTMCell.compose

    @classmethod
    def new(
        cls,
        embedding: int,
        hidden: int,
        seed: Seed = 0,
        dtype: type[np.floating[Any]] = np.float64,
        *,
        init: nn.init.Initializer | None = None,
        xp: Any = np,
        device: Any = None,
    ) -> Cell:
        cell = super().new(embedding, hidden, seed=seed, dtype=dtype, init=init, xp=xp, device=device)
        assert isinstance(cell, Cell)
        return cell


def main(argv: Sequence[str] | None = None) -> list[float]:
    """Trains on synthetic trees (or the SST, ``--data``) and prints the loss, the speed, and the
    dev accuracy before training and after each epoch; returns each epoch's mean training loss per
    tree."""
    from monadl.data import sst

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--data", help="the SST folder of train.txt, dev.txt, test.txt (default: synthetic)")
    parser.add_argument(
        "--trees", type=positive_int, default=400, help="synthetic training trees (dev: a quarter)"
    )
    parser.add_argument("--epochs", type=positive_int, default=3)
    parser.add_argument("--batch", type=positive_int, default=25)
    parser.add_argument("--embedding", type=positive_int, default=128)
    parser.add_argument("--hidden", type=positive_int, default=128)
    parser.add_argument("--learning-rate", type=positive_float, default=0.05)
    parser.add_argument("--weight-decay", type=non_negative_float, default=0.0, help="L2 (Tai et al.: 1e-4)")
    parser.add_argument("--seed", type=non_negative_int, default=0)
    parser.add_argument("--no-batching", action="store_true", help="run every kernel on its own")
    add_output_arguments(parser, plot="loss and dev accuracy per epoch")
    args = parser.parse_args(argv)
    check_plot(parser, args.plot)

    sizes = {"train": args.trees, "dev": max(args.trees // 4, 1)}
    data = sst.open_dataset(args.data, seed=args.seed, sizes=sizes)
    train, dev = data["train"], data["dev"]
    vocabulary = sst.Vocabulary.from_trees(train)
    print(f"data: {data.describe()}; {vocabulary.describe()}")
    model = TreeLstm(
        len(vocabulary),
        args.embedding,
        args.hidden,
        seed=args.seed,
        learning_rate=args.learning_rate,
        weight_decay=args.weight_decay,
        executor=ml.Executor(batching=not args.no_batching),
    )
    fine, binary = model.accuracy(dev, vocabulary.index)
    print(f"before training: dev root accuracy {fine:.3f} fine-grained, {binary:.3f} binary", flush=True)
    # Each epoch's order the seed's generator's next permutation.
    loader = ml.DataLoader(
        train, args.batch, shuffle=True, seed=np.random.default_rng(args.seed), collate=list
    )
    losses: list[float] = []
    accuracies: list[tuple[float, float]] = []  # dev: fine-grained, binary
    best: tuple[float, int, dict[str, Any]] | None = None  # dev accuracy, epoch, the weights' data
    for epoch in range(args.epochs):
        start = time.perf_counter()
        total, seen = 0.0, 0
        with Progress(len(train), desc=f"epoch {epoch}", unit="trees", enabled=not args.no_progress) as bar:
            for batch in loader:
                total += model.step(batch, vocabulary.index) * len(batch)
                seen += len(batch)
                bar.update(len(batch), loss=total / seen)
        seconds = time.perf_counter() - start
        losses.append(total / len(train))
        fine, binary = model.accuracy(dev, vocabulary.index)
        accuracies.append((fine, binary))
        print(
            f"epoch {epoch}: loss {losses[-1]:.3f} per tree ({len(train) / seconds:.1f} trees/s); "
            f"dev root accuracy {fine:.3f} fine-grained, {binary:.3f} binary",
            flush=True,
        )
        if best is None or fine > best[0]:
            # A step replaces a weight's data and never changes it in place: keeping the arrays is a copy.
            best = fine, epoch, {name: w.data for name, w in model.weights().items()}
    if best is not None and "test" in data:
        for name, w in model.weights().items():  # the epoch selected on dev
            w.data = best[2][name]
        fine, binary = model.accuracy(data["test"], vocabulary.index)
        print(
            f"test root accuracy, weights of epoch {best[1]} (best on dev, {best[0]:.3f}): {fine:.3f} "
            f"fine-grained, {binary:.3f} binary (Tai et al. 2015, with GloVe vectors: 0.510, 0.880)"
        )
    if args.plot:
        epochs = list(range(1, args.epochs + 1))
        plot_curves(
            args.plot,
            f"Tree-LSTM sentiment: {len(train)} training trees, {len(dev)} dev trees",
            "epoch",
            {
                "training loss per tree": {"train": (epochs, losses)},
                "dev root accuracy": {
                    "fine-grained": (epochs, [a[0] for a in accuracies]),
                    "binary": (epochs, [a[1] for a in accuracies]),
                },
            },
        )
        print(f"plot: {args.plot}")
    return losses


if __name__ == "__main__":
    main()
