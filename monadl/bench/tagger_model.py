"""The BiLSTM tagger: the model that ``examples/bilstm_tagger.py`` trains and the ``bilstm``
workload of ``python -m monadl.bench models`` measures.

Each word's embedding goes into a bidirectional :class:`monadl.nn.LSTM`; at each word its two
directions' outputs, concatenated, go through an MLP without biases (``O tanh(H [f; b])``) whose
scores give the word's tag. A step is plain Python over the sentences of a mini-batch, with no
padding: the executor's dynamic batching merges the calls of one position across the sentences.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

import monadl as ml
from monadl import ArrayLayer, FloatLayer, nn
from monadl.bench.common import raised
from monadl.bench.suite_data import TaggedSentence


@dataclass(frozen=True, eq=False)
class Tagger(ml.Module):
    """Embedding, BiLSTM, MLP: ``weights()`` names them ``words.table``, ``lstm.forward_cells.0.i.w``,
    ..., ``mlp.layers.1.w``."""

    words: nn.Embedding
    lstm: nn.LSTM
    mlp: nn.MLP

    @classmethod
    def new(
        cls, words: int, tags: int, *, embedding: int = 64, hidden: int = 50, mlp: int = 32, seed: int = 0
    ) -> Tagger:
        """Weights drawn from one generator seeded by ``seed``, float32; the MLP has no biases (as
        the benchmark's)."""
        rng = np.random.default_rng(seed)
        lookups = nn.Embedding.new(words, embedding, seed=rng, dtype=np.float32)
        lstm = nn.LSTM.new(embedding, hidden, bidirectional=True, seed=rng, dtype=np.float32)
        layers = [
            nn.Linear.new(2 * hidden, mlp, seed=rng, dtype=np.float32, bias=False),
            nn.Linear.new(mlp, tags, seed=rng, dtype=np.float32, bias=False),
        ]
        return cls(lookups, lstm, nn.MLP(layers, ml.tanh))

    def scores(self, sentences: Sequence[TaggedSentence]) -> list[list[ArrayLayer]]:
        """The tag scores (logits) of every word of every sentence."""
        states = self.lstm([[self.words(w) for w in s.words] for s in sentences]).outputs
        return [[self.mlp(state) for state in sentence] for sentence in states]

    def loss(self, sentences: Sequence[TaggedSentence]) -> tuple[FloatLayer, int]:
        """The summed cross-entropy of every word's tag, and how many words there are."""
        losses = [
            ml.cross_entropy(score, np.asarray(tag))
            for sentence, scores in zip(sentences, self.scores(sentences), strict=True)
            for score, tag in zip(scores, sentence.tags, strict=True)
        ]
        return ml.add_n(losses), len(losses)

    def step(
        self,
        sentences: Sequence[TaggedSentence],
        optimizer: ml.Optimizer,
        executor: ml.Executor | None = None,
    ) -> tuple[float, int]:
        """One training step on the mean loss per word of a batch: that mean and the words' count;
        or raises what failed the step (then nothing changed)."""
        with ml.gc_paused():  # a batch's graph is many small objects
            total, count = self.loss(sentences)
            mean: float = raised((total * (1.0 / count)).train_blocking(optimizer, executor=executor))
        return mean, count

    def predict(
        self, sentences: Sequence[TaggedSentence], executor: ml.Executor | None = None
    ) -> list[np.ndarray[Any, np.dtype[np.int64]]]:
        """The most likely tag of every word of every sentence (a forward pass only)."""
        with ml.gc_paused():
            scores = self.scores(sentences)
            flat = np.asarray(
                raised(ml.stack([s for ss in scores for s in ss]).predict_blocking(executor=executor))
            )
        tags = np.argmax(flat, axis=-1)
        cuts = np.cumsum([len(s.words) for s in sentences])[:-1]
        return list(np.split(tags, cuts))

    def accuracy(
        self, sentences: Sequence[TaggedSentence], executor: ml.Executor | None = None, batch: int = 64
    ) -> float:
        """The share of the words of ``sentences`` whose predicted tag is right."""
        right = words = 0
        for part in ml.DataLoader(sentences, batch, collate=list):
            for sentence, predicted in zip(part, self.predict(part, executor), strict=True):
                right += int(np.sum(predicted == np.asarray(sentence.tags)))
                words += len(sentence.tags)
        return right / words
