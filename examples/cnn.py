"""A small convolutional network on CIFAR-100's 100 fine classes.

Two blocks of ``nn.Conv2d`` (3x3, padding 1), ReLU and ``nn.MaxPool2d(2)``, then a dense layer to
the 100 classes: ``(B, 3, 32, 32) -> (B, c, 16, 16) -> (B, 2c, 8, 8) -> (B, 100)``, channels first
(NCHW) as everywhere in monadl. The model is the class ``CNN`` below; ``python -m monadl.bench
models`` measures the same model (``monadl.bench.cnn_model``, a copy that the installed package
carries: ``tests/test_cnn_example.py`` checks that the two agree). Images are the pixel bytes
/ 256, float32, in shuffled batches of every class; training is Adam on the mean cross-entropy.
After every epoch it prints the training loss and the accuracy on the held-out test split (never
trained on).

Run it: ``python examples/cnn.py`` (synthetic data in the CIFAR-100 binary format, made on first
use), or ``python examples/cnn.py --data path/to/cifar-100-binary`` for the real set. On a terminal
a progress bar shows the images/s and the loss (with tqdm installed; ``--no-progress`` hides it);
``--plot curves.png`` draws the loss and the held-out accuracy per epoch (with matplotlib).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

import monadl as ml
from monadl import nn
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

__all__ = ["CNN", "main"]

CLASSES = 100
"""CIFAR-100's fine classes: the width of the dense layer's output."""

EVALUATION_BATCH = 250
"""Held-out images per forward pass."""


Images = npt.NDArray[np.float32]
Labels = npt.NDArray[np.int64]


@dataclass(frozen=True, eq=False)
class CNN(ml.Module):
    """conv-relu-pool twice, then a dense layer to the classes. A ``Module``: its weights are found
    by name in its fields (``conv1.w``, ``conv1.b``, ``conv2.w``, ``conv2.b``, ``head.w``,
    ``head.b``)."""

    conv1: nn.Conv2d
    conv2: nn.Conv2d
    head: nn.Linear

    @classmethod
    def new(cls, channels: int = 16, *, seed: int = 0) -> CNN:
        """``channels`` in the first conv, twice that in the second; weights drawn from one
        generator seeded by ``seed``, float32."""
        rng = np.random.default_rng(seed)
        return cls(
            nn.Conv2d.new(3, channels, 3, padding=1, seed=rng, dtype=np.float32),
            nn.Conv2d.new(channels, 2 * channels, 3, padding=1, seed=rng, dtype=np.float32),
            nn.Linear.new(2 * channels * 8 * 8, CLASSES, seed=rng, dtype=np.float32),
        )

    def __call__(self, images: ml.AnyArray) -> ml.ArrayLayer:
        """Logits (B, 100) of images (B, 3, 32, 32). Nothing runs here: the result is a layer, a
        description of the computation, run by a training step or a prediction."""
        pool = nn.MaxPool2d(2)
        h = pool(ml.relu(self.conv1(images)))  # (B, c, 16, 16)
        h = pool(ml.relu(self.conv2(h)))  # (B, 2c, 8, 8)
        return self.head(ml.reshape(h, (-1, self.head.inputs)))  # (B, 100)


def load(data: cifar100.Cifar100, limit: int | None) -> tuple[Images, Labels]:
    """The images (n, 3, 32, 32) / 256 as float32 and their fine labels, the first ``limit`` only."""
    n = len(data) if limit is None else min(limit, len(data))
    pixels = data.pixels[:n].reshape(n, 3, 32, 32).astype(np.float32)
    pixels *= np.float32(1.0 / 256.0)
    return pixels, data.fine_labels[:n].astype(np.int64)


def accuracy(model: CNN, images: Images, labels: Labels, executor: ml.Executor) -> float:
    """The fraction of ``images`` whose most probable class is their label."""
    right = 0
    for batch, truth in ml.DataLoader((images, labels), EVALUATION_BATCH):
        logits = ml.predict_blocking(model(batch), executor=executor)
        right += int(np.sum(np.argmax(np.asarray(logits.unwrap()), axis=1) == truth))
    return right / len(images)


def main(argv: Sequence[str] | None = None) -> list[tuple[float, float]]:
    """Trains the CNN and prints each epoch's loss and held-out accuracy; returns them."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--data", help="a cifar-100-binary folder or the .tar.gz (default: synthetic, made on first use)"
    )
    parser.add_argument("--epochs", type=positive_int, default=5)
    parser.add_argument("--batch", type=positive_int, default=32)
    parser.add_argument(
        "--channels", type=positive_int, default=16, help="of the first conv (the second: twice)"
    )
    parser.add_argument("--learning-rate", type=positive_float, default=0.002, help="Adam's")
    parser.add_argument("--train-size", type=positive_int, help="train on the first N images only")
    parser.add_argument("--test-size", type=positive_int, help="measure on the first N test images only")
    parser.add_argument("--seed", type=non_negative_int, default=0)
    add_output_arguments(parser, plot="loss and held-out accuracy per epoch")
    args = parser.parse_args(argv)
    check_plot(parser, args.plot)

    train = cifar100.open_dataset(args.data, seed=args.seed)
    test = cifar100.open_dataset(args.data, split="test", seed=args.seed)
    print(f"data: {train.describe()}\nheld out: {test.describe()}")
    x, y = load(train, args.train_size)
    x_test, y_test = load(test, args.test_size)
    model = CNN.new(args.channels, seed=args.seed)
    optimizer = ml.Adam(args.learning_rate)
    # Shuffled batches of whole size (the last short one dropped), each epoch's order the seed's
    # generator's next permutation.
    batches = ml.DataLoader(
        (x, y), args.batch, shuffle=True, seed=np.random.default_rng(args.seed), drop_last=True
    )
    history: list[tuple[float, float]] = []
    steps = len(batches)
    with ml.Executor() as executor:
        print(f"held-out accuracy before training: {accuracy(model, x_test, y_test, executor):.3f}")
        for epoch in range(1, args.epochs + 1):
            total = 0.0
            with Progress(
                steps * args.batch, desc=f"epoch {epoch}", unit="images", enabled=not args.no_progress
            ) as bar:
                for step, (images, labels) in enumerate(batches):
                    loss = ml.cross_entropy(model(images), labels)
                    value = ml.train_blocking(loss, optimizer, executor=executor).unwrap()
                    total += value
                    bar.update(len(images), loss=total / (step + 1))
            held_out = accuracy(model, x_test, y_test, executor)
            history.append((total / max(steps, 1), held_out))
            print(
                f"epoch {epoch}: loss {history[-1][0]:.4f}, "
                f"held-out accuracy {held_out:.3f} (of {CLASSES} classes)"
            )
    if args.plot:
        epochs = range(1, len(history) + 1)
        plot_curves(
            args.plot,
            f"CIFAR-100 CNN: channels {args.channels}, batch {args.batch}",
            "epoch",
            {
                "training loss": {"mean over the epoch": (epochs, [h[0] for h in history])},
                "held-out accuracy": {"test split": (epochs, [h[1] for h in history])},
            },
        )
        print(f"plot: {args.plot}")
    return history


if __name__ == "__main__":
    main()
