"""A character-level language model: an LSTM reads a text one character at a time and predicts the next.

The text is built in (``TEXT``, a few paragraphs written for this example: nothing to download). Its
sentences are the sequences, of many lengths; one sentence in eight is held out. For each sentence,
character by character::

    x_t = E[char_t]                          an embedding (monadl.nn.Embedding)
    (h_t, c_t) = LSTMCell(x_t, h_{t-1}, c_{t-1})    from zeros (monadl.nn.LSTMCell)
    p(char_{t+1}) = softmax(W h_t + b)       the readout (monadl.nn.Linear)

and the loss is the mean cross-entropy of the next characters, in nats per character; the perplexity
is its exponential (as many choices as the model is, on average, hesitating between: the size of the
alphabet for a model that knows nothing, 1 for one that knows the text by heart).

A batch is plain Python over its sentences, each one step after the other, with no padding and no
masks: the cell's calls are a batchable operation, so the executor's dynamic batching merges the
calls of one time step across the batch's sentences into one run on stacked rows; a short sentence
simply stops taking part. (The lookups, readouts and losses merge the same way, op by op.)

Training is Adam, the gradients of a step first clipped to a global norm of 1 across all the weights
(a guard against the rare exploding step; a typical step's norm is below 0.5 here):
``ml.chain(ml.clip_by_global_norm(1.0), ml.Adam(0.02))``. The model is an ``ml.Module``: ``--save``
writes a checkpoint after every epoch (``ml.save``: the weights, Adam's moments, the epoch), and
``--resume`` goes on from one exactly as if the run had never stopped.

Run it: ``python examples/char_lstm.py`` (a few seconds), ``--epochs 30 --hidden 128`` to learn the
text better, ``--plot curves.png`` for the learning curves (with matplotlib). On a terminal a progress
bar shows the characters/s and the loss (with tqdm installed; ``--no-progress`` hides it).
"""

from __future__ import annotations

import argparse
import math
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from returns.result import Failure, Result

import monadl as ml
from monadl import FloatLayer, nn
from monadl.cli import (
    Progress,
    add_output_arguments,
    check_plot,
    non_negative_int,
    plot_curves,
    positive_float,
    positive_int,
)

TEXT = """\
The lighthouse stood at the end of a long stone pier, and every evening the keeper climbed its one
hundred and twelve steps to light the lamp. He counted the steps as he went, as his father had done
before him. On calm nights the sea was quiet and dark, and the beam swept over it like a slow hand.
On stormy nights the waves broke over the pier, and the keeper listened to them from the lamp room.

The keeper kept a book in which he wrote the weather, the ships, and the hours of the lamp. A ship
passed at nine. The wind was from the west. The lamp burned until morning. Most pages said little
more than that, and he liked them that way. The book was his, and the sea was in it, line by line.

In the spring a girl from the village came to learn the work. She was quick with her hands and slow
with her words, and she asked why the lamp must turn and not simply shine. The keeper told her that
a light that turns is a light that speaks: each lighthouse has a rhythm of its own, and a sailor who
counts the flashes knows which shore he is passing. She counted them that night, and every night.

By the summer she could trim the wick, clean the glass, and wind the clockwork that turned the lens.
She wrote in the book too, in a small and careful hand. A ship passed at ten. The wind was from the
north. The lamp burned until morning. When the keeper grew old, she climbed the steps alone, and she
counted them as he had counted them, one hundred and twelve, and the light went on turning.

In the autumn the storms came back. One night the wind was from the east and the rain was so heavy
that the beam could not reach the water. She climbed the steps, counted them, and stayed in the lamp
room until morning, winding the clockwork every hour so that the light would not stop. At dawn a small
boat came in past the pier, and the men in it waved to her. She wrote in the book that a boat came in
at six, that the wind was from the east, and that the lamp burned until morning.

In the winter the days were short and the nights were long, and the lamp burned for fifteen hours at
a time. She read by its light, and she learned the names of the stars that the sailors steered by. She
learned the rhythm of every lighthouse on the coast, and she could tell them apart from the top of the
steps: two flashes and a pause, three flashes and a pause, one long flash and a long dark.

Years later a sailor asked her whether she was ever lonely at the end of the pier. She said that a
lighthouse is never alone, because it is always speaking to someone it cannot see. Then she went up
the steps, lit the lamp, and wrote in the book that the wind was from the south and the sea was calm.
"""
"""Seven short paragraphs: about 2,700 characters, 31 sentences of 21 to 197 characters."""

HELD_OUT_EVERY = 8
"""One sentence in this many is held out, never trained on: the perplexity is measured on those."""


def sentences(text: str = TEXT) -> list[str]:
    """The text's sentences (line breaks within a paragraph as spaces), each with its final mark."""
    flat = re.sub(r"\s+", " ", text).strip()
    return [s for s in re.split(r"(?<=[.!?]) ", flat) if s]


@dataclass(frozen=True)
class Alphabet:
    """The characters of a text, each an id (its rank in code point order)."""

    characters: str

    @staticmethod
    def of(text: str) -> Alphabet:
        return Alphabet("".join(sorted(set(text))))

    def __len__(self) -> int:
        return len(self.characters)

    def encode(self, text: str) -> np.ndarray[Any, np.dtype[np.int64]]:
        index = {ch: i for i, ch in enumerate(self.characters)}
        return np.array([index[ch] for ch in text], dtype=np.int64)

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(self.characters[i] for i in ids)


def _raised(result: Result[Any, Exception]) -> Any:
    """The value of ``result``, or its original exception raised."""
    if isinstance(result, Failure):
        raise result.failure()
    return result.unwrap()


@dataclass(frozen=True, eq=False)
class CharLstm(ml.Module):
    """Embedding, LSTM cell, readout: ``weights()`` names them ``embedding.table``, ``cell.i.w``,
    ..., ``readout.b``."""

    embedding: nn.Embedding
    cell: nn.LSTMCell
    readout: nn.Linear

    @classmethod
    def new(cls, alphabet: int, embedding: int = 16, hidden: int = 64, *, seed: int = 0) -> CharLstm:
        """Weights drawn from one generator seeded by ``seed``, float32."""
        rng = np.random.default_rng(seed)
        return cls(
            nn.Embedding.new(alphabet, embedding, seed=rng, dtype=np.float32),
            nn.LSTMCell.new(embedding, hidden, seed=rng, dtype=np.float32),
            nn.Linear.new(hidden, alphabet, seed=rng, dtype=np.float32),
        )

    def losses(self, sequence: np.ndarray[Any, np.dtype[np.int64]]) -> list[FloatLayer]:
        """The cross-entropy of each next character of ``sequence`` (ids), read from the start."""
        h, c = self.cell.zeros_state()
        losses = []
        for t in range(len(sequence) - 1):
            h, c = self.cell(self.embedding(int(sequence[t])), h, c)
            losses.append(ml.cross_entropy(self.readout(h), np.asarray(sequence[t + 1])))
        return losses

    def loss(self, sequences: Sequence[np.ndarray[Any, np.dtype[np.int64]]]) -> tuple[FloatLayer, int]:
        """The sum of the losses of every next character of ``sequences``, and how many there are
        (one ``add_n`` over them all: sums of different lengths would not merge)."""
        losses = [loss for sequence in sequences for loss in self.losses(sequence)]
        if not losses:
            raise ValueError("loss: needs a sequence of two characters at least")
        return ml.add_n(losses), len(losses)

    def step(
        self,
        sequences: Sequence[np.ndarray[Any, np.dtype[np.int64]]],
        optimizer: ml.Optimizer,
        executor: ml.Executor | None = None,
    ) -> tuple[float, int]:
        """One training step on the mean loss per character of a batch: that mean (nats) and the
        number of characters predicted; or raises what failed the step (then nothing changed)."""
        with ml.gc_paused():  # a batch's graph is many small objects (as in examples/tree_lstm.py)
            total, count = self.loss(sequences)
            mean: float = _raised((total * (1.0 / count)).train_blocking(optimizer, executor=executor))
        return mean, count

    def nats(
        self, sequences: Sequence[np.ndarray[Any, np.dtype[np.int64]]], executor: ml.Executor | None = None
    ) -> float:
        """The mean loss per predicted character of ``sequences`` (a forward pass only)."""
        with ml.gc_paused():
            total, count = self.loss(sequences)
            value: float = _raised(total.predict_blocking(executor=executor))
        return value / count

    def perplexity(
        self, sequences: Sequence[np.ndarray[Any, np.dtype[np.int64]]], executor: ml.Executor | None = None
    ) -> float:
        """``exp`` of :meth:`nats`: the alphabet's size for a model that knows nothing, 1 at best."""
        return math.exp(self.nats(sequences, executor))

    def sample(
        self, prompt: Sequence[int], length: int, rng: np.random.Generator, temperature: float = 0.7
    ) -> list[int]:
        """``length`` characters drawn one by one after ``prompt`` (ids), from the softmax of the
        readout at ``temperature``. Each step's state comes back as arrays, and the next step starts
        from them: a graph of one step at a time."""
        hidden = self.cell.hidden
        if not prompt:
            raise ValueError("sample: needs a prompt of one character at least")
        h, c = self.cell.zeros_state()
        for char in prompt[:-1]:
            h, c = self.cell(self.embedding(char), h, c)
        drawn = [prompt[-1]]
        for _ in range(length):
            h, c = self.cell(self.embedding(drawn[-1]), h, c)
            both = np.asarray(_raised(ml.concatenate([h, c, self.readout(h)]).predict_blocking()))
            h, c = ml.lift_array(both[:hidden]), ml.lift_array(both[hidden : 2 * hidden])
            logits = both[2 * hidden :].astype(np.float64) / temperature
            p = np.exp(logits - logits.max())
            drawn.append(int(rng.choice(len(p), p=p / p.sum())))
        return drawn[1:]


def optimizer(learning_rate: float = 0.02, max_norm: float = 1.0) -> ml.Optimizer:
    """Adam, after clipping the step's gradients to a global norm of ``max_norm``."""
    return ml.chain(ml.clip_by_global_norm(max_norm), ml.Adam(learning_rate))


def main(argv: Sequence[str] | None = None) -> list[float]:
    """Trains on the built-in text and prints the held-out perplexity per epoch; returns each
    epoch's mean training loss per character (nats)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--epochs", type=positive_int, default=10)
    parser.add_argument("--batch", type=positive_int, default=4, help="sentences per step")
    parser.add_argument("--embedding", type=positive_int, default=16)
    parser.add_argument("--hidden", type=positive_int, default=64)
    parser.add_argument("--learning-rate", type=positive_float, default=0.02)
    parser.add_argument(
        "--clip", type=positive_float, default=1.0, help="the gradients' global norm, at most"
    )
    parser.add_argument("--seed", type=non_negative_int, default=0)
    parser.add_argument("--workers", type=positive_int, default=1, help="executor workers (1: sequential)")
    parser.add_argument("--save", metavar="PATH", help="write a checkpoint there after every epoch")
    parser.add_argument("--resume", metavar="PATH", help="go on from a checkpoint of --save")
    parser.add_argument("--sample", type=non_negative_int, default=160, help="characters to draw at the end")
    add_output_arguments(parser, plot="training loss and held-out perplexity per epoch")
    args = parser.parse_args(argv)
    check_plot(parser, args.plot)
    if args.save is not None and not Path(args.save).parent.is_dir():
        parser.error(f"argument --save: the folder {str(Path(args.save).parent)!r} does not exist")

    alphabet = Alphabet.of(TEXT)
    encoded = [alphabet.encode(s) for s in sentences()]
    train = [s for k, s in enumerate(encoded) if k % HELD_OUT_EVERY != HELD_OUT_EVERY - 1]
    held_out = [s for k, s in enumerate(encoded) if k % HELD_OUT_EVERY == HELD_OUT_EVERY - 1]
    characters = sum(len(s) - 1 for s in train)  # predicted per epoch
    print(
        f"data: the built-in text, {len(TEXT):,} characters, an alphabet of {len(alphabet)}; "
        f"{len(train)} training sentences ({characters:,} characters to predict), "
        f"{len(held_out)} held out"
    )
    model = CharLstm.new(len(alphabet), args.embedding, args.hidden, seed=args.seed)
    adam = optimizer(args.learning_rate, args.clip)
    losses: list[float] = []
    perplexities: list[float] = []
    first = 0
    if args.resume is not None:
        try:
            metadata = ml.load(args.resume, model)
        except (OSError, ml.CheckpointError) as e:
            parser.error(f"argument --resume: {e}")
        epoch = metadata.get("epoch")
        if metadata.get("alphabet") != alphabet.characters or not isinstance(epoch, int):
            parser.error(f"argument --resume: {args.resume} is not a checkpoint of this example's text")
        first = epoch
        losses, perplexities = _floats(metadata.get("losses")), _floats(metadata.get("perplexities"))
        print(f"resumed: {args.resume}, after {first} epochs")
    with ml.Executor(args.workers) as executor:
        if not perplexities:
            print(f"before training: held-out perplexity {model.perplexity(held_out, executor):.2f}")
        # The order of an epoch's sentences depends on the seed and the epoch alone: a resumed run
        # takes the same batches as one that never stopped.
        batches = ml.DataLoader(train, args.batch, shuffle=True, seed=args.seed, collate=list)
        for epoch in range(first, args.epochs):
            total, seen = 0.0, 0
            start = time.perf_counter()
            with Progress(
                characters, desc=f"epoch {epoch}", unit="chars", enabled=not args.no_progress
            ) as bar:
                for batch in batches.epoch(epoch):
                    mean, count = model.step(batch, adam, executor)
                    total, seen = total + mean * count, seen + count
                    bar.update(count, loss=total / seen)
            seconds = time.perf_counter() - start
            losses.append(total / seen)
            perplexities.append(model.perplexity(held_out, executor))
            print(
                f"epoch {epoch}: loss {losses[-1]:.3f} nats per character ({seen / seconds:,.0f} "
                f"characters/s); held-out perplexity {perplexities[-1]:.2f}",
                flush=True,
            )
            if args.save is not None:
                ml.save(
                    args.save,
                    model,
                    metadata={
                        "epoch": epoch + 1,
                        "alphabet": alphabet.characters,
                        "losses": list(losses),
                        "perplexities": list(perplexities),
                    },
                )
    if args.save is not None:
        print(f"checkpoint: {args.save}")
    if args.sample:
        prompt = "The "
        drawn = model.sample(alphabet.encode(prompt).tolist(), args.sample, np.random.default_rng(args.seed))
        print(f"sample: {prompt}{alphabet.decode(drawn)}")
    if args.plot:
        epochs = list(range(1, len(losses) + 1))
        plot_curves(
            args.plot,
            f"character LSTM: hidden {args.hidden}, {len(train)} training sentences",
            "epoch",
            {
                "training loss (nats per character)": {"train": (epochs, losses)},
                "held-out perplexity": {"held out": (epochs, perplexities)},
            },
        )
        print(f"plot: {args.plot}")
    return losses


def _floats(value: object) -> list[float]:
    """The numbers of a list of a checkpoint's metadata (JSON)."""
    items = value if isinstance(value, list) else []
    return [float(v) for v in items if isinstance(v, (int, float))]


if __name__ == "__main__":
    main()
