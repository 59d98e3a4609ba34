"""A character-level Transformer language model: each position of a window of text predicts the next.

The text is built in: the prose of Python's own reference topics (``pydoc_data.topics``, in the
standard library: nothing to download), its first ``--characters`` characters. The last tenth is
held out, never trained on. A step takes ``--batch`` windows of ``--context`` characters at random
from the rest::

    x = E[chars] + P                          embeddings of the characters and of the positions
    x = layer(x, causal=True)  (--layers x)   pre-norm Transformer layers (monadl.nn), each
                                              position attending to itself and those before it
    p(next char) = softmax(W norm(x) + b)     a last LayerNorm, then the readout

and its loss is the mean cross-entropy of the next characters (nats per character) over the whole
window: every position predicts, from what it has seen so far. The held-out perplexity (its
exponential: the alphabet's size for a model that knows nothing) is measured after every epoch on
the held-out text cut into windows.

A batch is one array of (batch, context) character ids, so a step is a fixed graph of a few dozen
large ops (the attention is one fused op per layer, ``ml.scaled_dot_product_attention``): the
executor replays its compiled program from the second step on. Training is Adam with the step's
gradients clipped to a global norm of 1. The model is the class ``TransformerLm`` below; the
``transformer`` workload of ``python -m monadl.bench models`` measures the same model
(``monadl.bench.transformer_model``, a copy that the installed package carries:
``tests/test_transformer_lm.py`` checks that the two agree).

Run it: ``python examples/transformer_lm.py`` (well under a minute on two cores), ``--epochs 20
--width 64`` to learn the text better, ``--plot curves.png`` for the learning curves (with
matplotlib).
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pydoc_data.topics import topics
from typing import Any

import numpy as np
from returns.result import Failure, Result

import monadl as ml
from monadl import ArrayLayer, ArrayWeight, FloatLayer, nn
from monadl.cli import Progress, add_output_arguments, check_plot, non_negative_int, plot_curves, positive_int

HELD_OUT = 0.1
"""The share of the text, at its end, that is held out."""

Ids = np.ndarray[Any, np.dtype[np.int64]]
"""Character ids: a window (length,) or a batch of windows (batch, length)."""


@dataclass(frozen=True, eq=False)
class TransformerLm(ml.Module):
    """Embeddings of characters and positions, pre-norm Transformer layers, a last LayerNorm and
    the readout: ``weights()`` names them ``embedding.table``, ``positions``,
    ``layers.0.attention.qkv.w``, ..., ``readout.b``."""

    embedding: nn.Embedding
    positions: ArrayWeight
    layers: list[nn.TransformerEncoderLayer]
    norm: nn.LayerNorm
    readout: nn.Linear

    @classmethod
    def new(
        cls, alphabet: int, context: int, width: int = 48, heads: int = 4, layers: int = 2, *, seed: int = 0
    ) -> TransformerLm:
        """Weights drawn from one generator seeded by ``seed``, float32; a feed-forward block of
        4 * ``width`` units per layer."""
        rng = np.random.default_rng(seed)
        f32 = np.float32
        return cls(
            nn.Embedding.new(alphabet, width, seed=rng, dtype=f32),
            ArrayWeight.normal((context, width), std=width**-0.5, seed=rng, dtype=f32),
            [
                nn.TransformerEncoderLayer.new(width, heads, norm_first=True, seed=rng, dtype=f32)
                for _ in range(layers)
            ],
            nn.LayerNorm.new(width, dtype=f32),
            nn.Linear.new(width, alphabet, seed=rng, dtype=f32),
        )

    @property
    def context(self) -> int:
        return int(self.positions.data.shape[0])

    def logits(self, windows: Ids) -> ArrayLayer:
        """The next character's logits at every position of ``windows`` (batch, length <= context):
        a layer, run by a training step or a prediction."""
        length = windows.shape[-1]
        positions = self.positions if length == self.context else self.positions[:length]
        x = self.embedding(windows) + positions  # (batch, length, width)
        for layer in self.layers:
            x = layer(x, causal=True)  # each position sees itself and those before it
        return self.readout(self.norm(x))  # (batch, length, alphabet)

    def loss(self, windows: Ids) -> FloatLayer:
        """The mean cross-entropy of each next character of ``windows`` (batch, length + 1)."""
        return ml.cross_entropy(self.logits(windows[:, :-1]), windows[:, 1:])

    def nats(self, windows: Ids, executor: ml.Executor | None = None) -> float:
        """The mean loss per predicted character of ``windows`` (a forward pass only)."""
        return float(_raised(self.loss(windows).predict_blocking(executor=executor)))


def text(characters: int) -> str:
    """The first ``characters`` characters of the reference topics' prose, in the order of their
    names, runs of blank lines and spaces collapsed."""
    parts = [" ".join(line.split()) for name in sorted(topics) for line in topics[name].splitlines()]
    flat = "\n".join(p for p in parts if p)
    return flat[:characters]


@dataclass(frozen=True)
class Alphabet:
    """The characters of a text, each an id (its rank in code point order)."""

    characters: str

    @staticmethod
    def of(text: str) -> Alphabet:
        return Alphabet("".join(sorted(set(text))))

    def __len__(self) -> int:
        return len(self.characters)

    def encode(self, text: str) -> Ids:
        index = {ch: i for i, ch in enumerate(self.characters)}
        return np.array([index[ch] for ch in text], dtype=np.int64)


def _raised(result: Result[Any, Exception]) -> Any:
    """The value of ``result``, or its original exception raised."""
    if isinstance(result, Failure):
        raise result.failure()
    return result.unwrap()


def batches(train: Ids, context: int, batch: int, steps: int, rng: np.random.Generator) -> list[Ids]:
    """``steps`` batches of ``batch`` windows of ``context + 1`` characters of ``train``, at random."""
    starts = rng.integers(0, len(train) - context, size=(steps, batch))
    return [train[s[:, None] + np.arange(context + 1)] for s in starts]


def windows(ids: Ids, context: int) -> Ids:
    """``ids`` cut into consecutive windows of ``context + 1`` characters, each sharing its last
    character with the next one's first (so every character but the first is predicted once)."""
    count = (len(ids) - 1) // context
    return np.stack([ids[k * context : k * context + context + 1] for k in range(count)])


def main(argv: Sequence[str] | None = None) -> list[float]:
    """Trains on the built-in text and prints the held-out perplexity per epoch; returns the
    held-out perplexities (the first before training)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--epochs", type=positive_int, default=10)
    parser.add_argument("--steps", type=positive_int, default=60, help="training steps per epoch")
    parser.add_argument("--batch", type=positive_int, default=16, help="windows per step")
    parser.add_argument("--context", type=positive_int, default=32, help="characters per window")
    parser.add_argument("--width", type=positive_int, default=48, help="the model's width (features)")
    parser.add_argument("--heads", type=positive_int, default=4)
    parser.add_argument("--layers", type=positive_int, default=2)
    parser.add_argument("--characters", type=positive_int, default=60_000, help="of the built-in text")
    parser.add_argument("--learning-rate", type=float, default=3e-3)
    parser.add_argument("--seed", type=non_negative_int, default=0)
    add_output_arguments(parser, plot="training loss and held-out perplexity per epoch")
    args = parser.parse_args(argv)
    check_plot(parser, args.plot)
    if args.width % args.heads:
        parser.error(f"argument --heads: {args.heads} heads do not divide a width of {args.width}")

    corpus = text(args.characters)
    alphabet = Alphabet.of(corpus)
    ids = alphabet.encode(corpus)
    cut = int(len(ids) * (1.0 - HELD_OUT))
    train, held_out = ids[:cut], windows(ids[cut:], args.context)
    if len(train) <= args.context or not len(held_out):
        parser.error(f"argument --characters: {args.characters} are too few for a context of {args.context}")
    print(
        f"data: Python's reference topics, {len(corpus):,} characters, an alphabet of {len(alphabet)}; "
        f"{len(train):,} for training, {len(held_out)} held-out windows of {args.context}"
    )
    model = TransformerLm.new(
        len(alphabet), args.context, args.width, args.heads, args.layers, seed=args.seed
    )
    adam = ml.chain(ml.clip_by_global_norm(1.0), ml.Adam(args.learning_rate))
    losses: list[float] = []
    perplexities: list[float] = []
    rng = np.random.default_rng(args.seed)
    with ml.Executor(1) as executor:
        perplexities.append(math.exp(model.nats(held_out, executor)))
        print(f"before training: held-out perplexity {perplexities[-1]:.2f}")
        for epoch in range(args.epochs):
            total = 0.0
            start = time.perf_counter()
            with Progress(
                args.steps, desc=f"epoch {epoch}", unit="steps", enabled=not args.no_progress
            ) as bar:
                for k, batch in enumerate(batches(train, args.context, args.batch, args.steps, rng)):
                    total += float(_raised(model.loss(batch).train_blocking(adam, executor=executor)))
                    bar.update(1, loss=total / (k + 1))
            seconds = time.perf_counter() - start
            losses.append(total / args.steps)
            perplexities.append(math.exp(model.nats(held_out, executor)))
            print(
                f"epoch {epoch}: loss {losses[-1]:.3f} nats per character "
                f"({1000 * seconds / args.steps:.1f} ms a step); held-out perplexity {perplexities[-1]:.2f}",
                flush=True,
            )
    if args.plot:
        epochs = list(range(1, len(losses) + 1))
        plot_curves(
            args.plot,
            f"character Transformer: width {args.width}, {args.layers} layers, {args.heads} heads",
            "epoch",
            {
                "training loss (nats per character)": {"train": (epochs, losses)},
                "held-out perplexity": {"held out": (list(range(len(perplexities))), perplexities)},
            },
        )
        print(f"plot: {args.plot}")
    return perplexities


if __name__ == "__main__":
    main()
