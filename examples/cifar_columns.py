"""CIFAR-100 with columns of experts: the benchmark model of the DeepLearning.scala 2 paper.

The model is ``monadl.bench.columns_model.ColumnNetwork``, the one ``python -m monadl.bench
columns`` measures: ``--columns`` independent columns (two dense ReLU layers each) read the image and
are summed; a coarse classifier picks one of 20 classes, and 20 fine classifiers, one per coarse
class, the fine class within it. Every batch holds images of one coarse class ``c``, and the loss is
the coarse cross-entropy plus fine classifier ``c``'s. ``--variant skip`` builds the network from the
batch's class in ordinary Python, so only classifier ``c`` runs; ``noskip`` runs all 20, the others
with weight zero. With ``--workers 2`` the columns' kernels run in parallel.

This script trains it with SGD and prints the training loss, and the held-out accuracy (coarse, of 20
classes, and fine, of 100) before and after training: the test set's images, never trained on. (The
paper trains at learning rate 1e-4; at 0.01 this short run learns the synthetic set.)

Run it: ``python examples/cifar_columns.py`` (synthetic data in the CIFAR-100 binary format, made on
first use), or ``python examples/cifar_columns.py --data path/to/cifar-100-binary`` for the real set.
On a terminal a progress bar shows the images/s and the loss (with tqdm installed; ``--no-progress``
hides it); ``--plot curves.png`` draws the loss per step and per 50 steps (with matplotlib).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

import monadl as ml
from monadl.bench.columns_model import ColumnNetwork, Variant
from monadl.bench.columns_params import init_params
from monadl.cli import (
    Progress,
    add_output_arguments,
    check_plot,
    non_negative_int,
    plot_curves,
    positive_float,
    positive_int,
)
from monadl.data import cifar100

__all__ = ["ColumnNetwork", "Variant", "main"]

SEGMENT = 50
"""Steps per printed (and plotted) mean of the loss."""
EVALUATION_BATCH = 100
"""Held-out images per forward pass (at most: a batch holds one coarse class)."""


def held_out_set(data: str | None, seed: int) -> cifar100.Cifar100 | None:
    """The images to measure on, never trained on: the test split of ``data`` (a folder or the
    archive; for a ``.bin`` file, the ``test.bin`` beside it, None if there is none)."""
    if data is not None and Path(data).suffix == ".bin":
        beside = Path(data).with_name("test.bin")
        return cifar100.open_dataset(beside) if beside.is_file() and beside != Path(data) else None
    return cifar100.open_dataset(data, split="test", seed=seed)


def report_accuracy(network: ColumnNetwork, held_out: cifar100.Cifar100 | None, when: str) -> None:
    """Prints the network's accuracy on ``held_out``."""
    if held_out is None:
        return
    batches = held_out.batches(EVALUATION_BATCH, seed=None, drop_last=False)
    coarse, fine = network.accuracy(batches)
    print(f"held-out accuracy {when}: {coarse:.3f} coarse (of 20 classes), {fine:.3f} fine (of 100)")


def main(argv: Sequence[str] | None = None) -> list[float]:
    """Trains on CIFAR-100 (or the built-in synthetic set) and prints the loss, and the held-out
    accuracy before and after; returns the losses."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--data", help="a cifar-100-binary folder, train.bin, or the .tar.gz (default: synthetic)"
    )
    parser.add_argument("--columns", type=positive_int, default=2)
    parser.add_argument("--variant", choices=["skip", "noskip"], default="skip")
    parser.add_argument("--steps", type=positive_int, default=1000)
    parser.add_argument("--batch", type=positive_int, default=16)
    parser.add_argument(
        "--learning-rate", type=positive_float, default=0.01, help="SGD's (the paper's: 1e-4)"
    )
    parser.add_argument("--workers", type=positive_int, default=1, help="executor workers (1: sequential)")
    parser.add_argument("--seed", type=non_negative_int, default=0)
    add_output_arguments(parser, plot=f"loss per step and per segment of {SEGMENT} steps")
    args = parser.parse_args(argv)
    check_plot(parser, args.plot)

    data = cifar100.open_dataset(args.data, seed=args.seed)
    held_out = held_out_set(args.data, args.seed)
    print(f"data: {data.describe()}")
    if held_out is not None:
        print(f"held out: {held_out.describe()}")
    params = init_params(args.columns, seed=args.seed)
    losses: list[float] = []
    segments: list[tuple[int, float]] = []  # (last step, mean loss of the segment's steps)
    bar = Progress(args.steps * args.batch, desc="training", unit="images", enabled=not args.no_progress)
    with ml.Executor(args.workers) as executor, bar:
        network = ColumnNetwork(params, args.variant, args.learning_rate, executor)
        report_accuracy(network, held_out, "before training")
        batches = data.batches(args.batch, seed=args.seed, epochs=None)
        for step in range(args.steps):
            x, coarse, fine_local = next(batches)
            losses.append(network.step(x, coarse, fine_local))
            recent = losses[-SEGMENT:]
            bar.update(len(x), loss=sum(recent) / len(recent))
            if step % SEGMENT == 0 or step == args.steps - 1:
                segments.append((step, sum(recent) / len(recent)))
                bar.write(f"step {step:4d}: loss {segments[-1][1]:.5f} (mean of the last {len(recent)})")
        report_accuracy(network, held_out, f"after {args.steps} steps")
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
