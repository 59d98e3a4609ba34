"""A BiLSTM tagger: named-entity tags of the words of sentences of any lengths, with no padding.

Each word's embedding goes into a bidirectional :class:`monadl.nn.LSTM`; at each word its two
directions' outputs, concatenated, go through an MLP whose scores give the word's tag::

    x_t = E[word_t]                                   an embedding (monadl.nn.Embedding)
    [f_t; b_t] = BiLSTM(x_1 .. x_n)_t                 forward and backward (monadl.nn.LSTM)
    p(tag_t) = softmax(O tanh(H [f_t; b_t]))          the MLP (monadl.nn.MLP, no biases)

A step is plain Python over the sentences of a mini-batch: the layer takes the list of sentences as
they are, and the executor's dynamic batching merges the cells' calls of one position across the
sentences and both directions (a short sentence simply stops taking part), as it merges the lookups,
the MLPs and the losses. This is the model of the DyNet benchmark's ``bilstm-tagger`` (and of
``python -m monadl.bench suite``), written with the sequence layer; it is
``monadl.bench.tagger_model.Tagger``, the one ``python -m monadl.bench models`` measures.

The data is the WikiNER sample of the DyNet benchmark (``dynet-benchmark/tags/wikiner-sample.txt``
under ``--data DIR``, by default the ``shared/data`` folder beside the repository when it holds it:
``word|TAG`` tokens, a sentence a line, the first 90% trained on and the rest held out), else
synthetic sentences of its shape whose tags need a word and its left neighbour
(``monadl.bench.suite_data``; ``--synthetic`` asks for them). A word seen 5 times or fewer in
training is unknown (one shared embedding). Every epoch prints the held-out tag accuracy, beside
the share of the most frequent tag (``O``: what a tagger that knows nothing scores).

Run it: ``python examples/bilstm_tagger.py`` (seconds an epoch on the WikiNER sample, with the
compiled engine), ``--plot curves.png`` for the learning curves (with matplotlib).
"""

from __future__ import annotations

import argparse
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import monadl as ml
from monadl.bench.suite_data import Missing, TaskData, load_task, synthetic_task
from monadl.bench.tagger_model import Tagger
from monadl.cli import (
    Progress,
    add_output_arguments,
    check_plot,
    non_negative_int,
    positive_float,
    positive_int,
)

__all__ = ["Tagger", "main"]

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
"""Where the WikiNER sample is looked for without ``--data``: the shared data beside the checkout."""


def load(parser: argparse.ArgumentParser, args: argparse.Namespace) -> TaskData:
    """The WikiNER sample under ``--data`` (or the default folder when it holds it), else synthetic."""
    if args.synthetic:
        return synthetic_task("bilstm-tagger", seed=args.seed, smoke=args.smoke)
    folder = Path(args.data) if args.data is not None else DEFAULT_DATA
    try:
        return load_task("bilstm-tagger", folder)
    except Missing as e:
        if args.data is not None:
            parser.error(f"argument --data: {e}")
        return synthetic_task("bilstm-tagger", seed=args.seed, smoke=args.smoke)
    except (OSError, ValueError) as e:
        parser.error(f"argument --data: {e}")


def main(argv: Sequence[str] | None = None) -> list[float]:
    """Trains the tagger and prints the held-out tag accuracy per epoch; returns those accuracies."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--epochs", type=positive_int, default=5)
    parser.add_argument("--batch", type=positive_int, default=16, help="sentences per step")
    parser.add_argument("--embedding", type=positive_int, default=64)
    parser.add_argument("--hidden", type=positive_int, default=50)
    parser.add_argument("--learning-rate", type=positive_float, default=0.005)
    parser.add_argument("--seed", type=non_negative_int, default=0)
    parser.add_argument("--workers", type=positive_int, default=1, help="executor workers (1: sequential)")
    parser.add_argument(
        "--data", metavar="DIR", help="the folder holding dynet-benchmark/tags/wikiner-sample.txt"
    )
    parser.add_argument(
        "--synthetic", action="store_true", help="synthetic sentences, even if the sample is there"
    )
    parser.add_argument("--smoke", action="store_true", help="a few short synthetic sentences (a test)")
    add_output_arguments(parser, plot="training loss and held-out accuracy per epoch")
    args = parser.parse_args(argv)
    check_plot(parser, args.plot)
    if args.smoke:
        args.synthetic = True

    data = load(parser, args)
    train, held_out = data.train, data.held_out
    words = sum(len(s.words) for s in train)
    counts = Counter(tag for s in held_out for tag in s.tags)
    majority = max(counts.values()) / sum(counts.values())
    print(
        f"data: {data.description}; {len(train)} training sentences ({words:,} words), "
        f"{len(held_out)} held out; {data.sizes['words']:,} known words, {data.sizes['tags']} tags "
        f"(the most frequent tag is {majority:.1%} of the held-out words)"
    )
    model = Tagger.new(
        data.sizes["words"], data.sizes["tags"], embedding=args.embedding, hidden=args.hidden, seed=args.seed
    )
    adam = ml.Adam(args.learning_rate)
    losses: list[float] = []
    accuracies: list[float] = []
    # Each epoch's order from the seed and the epoch alone.
    batches = ml.DataLoader(train, args.batch, shuffle=True, seed=args.seed, collate=list)
    with ml.Executor(args.workers) as executor:
        for epoch in range(args.epochs):
            total, seen = 0.0, 0
            start = time.perf_counter()
            with Progress(words, desc=f"epoch {epoch}", unit="words", enabled=not args.no_progress) as bar:
                for batch in batches.epoch(epoch):
                    mean, count = model.step(batch, adam, executor)
                    total, seen = total + mean * count, seen + count
                    bar.update(count, loss=total / seen)
            seconds = time.perf_counter() - start
            losses.append(total / seen)
            accuracies.append(model.accuracy(held_out, executor))
            print(
                f"epoch {epoch}: loss {losses[-1]:.3f} nats per word ({seen / seconds:,.0f} words/s); "
                f"held-out tag accuracy {accuracies[-1]:.2%}",
                flush=True,
            )
    if args.plot:
        from monadl.cli import plot_curves

        epochs = list(range(1, len(losses) + 1))
        plot_curves(
            args.plot,
            f"BiLSTM tagger: hidden {args.hidden}, {len(train)} training sentences",
            "epoch",
            {
                "training loss (nats per word)": {"train": (epochs, losses)},
                "held-out tag accuracy": {"held out": (epochs, accuracies)},
            },
        )
        print(f"plot: {args.plot}")
    return accuracies


if __name__ == "__main__":
    main()
