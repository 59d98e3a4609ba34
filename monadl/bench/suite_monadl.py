"""The DyNet benchmark suite's four models in monadl, written as a user writes them.

Each model is plain Python over one instance (a sentence, a tree): an embedding lookup per word, an
LSTM cell call per step, a loss per word or node. Nothing is batched by hand: a training step makes
the losses of all the instances of a mini-batch, sums them with one ``ml.add_n``, and runs one
``train_blocking`` with Adam (learning rate 0.001, as DyNet's ``AdamTrainer`` and PyTorch's
``optim.Adam``) on the default executor, whose dynamic batching merges the equal calls of all the
instances. Weights are float32, as DyNet computes.

=========================  ==========================================================================
model                      follows (neulab/dynet-benchmark)
=========================  ==========================================================================
:class:`BiLstmTagger`      ``dynet-py/bilstm-tagger.py``
:class:`CharBiLstmTagger`  ``dynet-py/bilstm-tagger-withchar.py``
:class:`TreeNN`            ``dynet-py/treenn.py``
:class:`RnnLm`             ``dynet-py/rnnlm-batch.py`` (but per sentence: no masks, no padding)
=========================  ==========================================================================

``model.weights()`` names every weight; the benchmark's other implementations start from copies of
them (``monadl.bench.suite_dynet``, ``monadl.bench.suite_torch``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

import numpy as np

import monadl as ml
from monadl import ArrayLayer, ArrayWeight, FloatLayer, nn
from monadl.bench.common import raised
from monadl.bench.suite_data import START, Sentence, TaggedSentence
from monadl.data import sst
from monadl.data.trees import Tree

I = TypeVar("I")  # noqa: E741  (an instance: a sentence or a tree)

ADAM = ml.Adam(0.001)
F32 = np.float32


def label(value: int) -> np.ndarray:
    """A class label as ``ml.cross_entropy`` takes it: a 0-d integer array."""
    return np.asarray(value, dtype=np.int64)


def lstm_outputs(cell: nn.LSTMCell, xs: Sequence[ArrayLayer]) -> list[ArrayLayer]:
    """The outputs ``h`` of ``cell`` over ``xs``, from the zero state (DyNet's ``transduce``)."""
    h, c = cell.zeros_state()
    outputs = []
    for x in xs:
        h, c = cell(x, h, c)
        outputs.append(h)
    return outputs


class SuiteModel(ml.Module, Generic[I]):
    """A model of the suite: ``losses`` of one instance; ``step`` and ``evaluate`` of a mini-batch."""

    def losses(self, instance: I) -> list[FloatLayer]:
        """The loss of every word or node of ``instance``."""
        raise NotImplementedError

    def total(self, batch: Sequence[I]) -> FloatLayer:
        """The sum of the losses of every instance of ``batch``: one ``add_n`` over them all."""
        return ml.add_n([loss for instance in batch for loss in self.losses(instance)])

    def step(self, batch: Sequence[I]) -> float:
        """One Adam step on the summed loss of ``batch``; returns that loss (before the step)."""
        with ml.gc_paused():  # as the examples do: a batch's graph is many small objects
            value: float = raised(self.total(batch).train_blocking(ADAM))
        return value

    def evaluate(self, batch: Sequence[I]) -> float:
        """The summed loss of ``batch``, a forward pass only."""
        with ml.gc_paused():
            value: float = raised(self.total(batch).predict_blocking())
        return value


@dataclass(frozen=True, eq=False)
class BiLstmTagger(SuiteModel[TaggedSentence]):
    """A BiLSTM tagger: word embeddings, a forward and a backward LSTM over the sentence, and per
    word an MLP ``O tanh(H [f; b])`` (no biases) scored by the cross-entropy of its tag."""

    words: nn.Embedding
    forward_lstm: nn.LSTMCell
    backward_lstm: nn.LSTMCell
    mlp_hidden: nn.Linear
    mlp_output: nn.Linear

    @classmethod
    def new(
        cls,
        words: int,
        tags: int,
        *,
        embedding: int = 128,
        hidden: int = 50,
        mlp: int = 32,
        seed: int | np.random.Generator = 0,
    ) -> BiLstmTagger:
        """Weights drawn from one generator seeded by ``seed``, in the order of the fields."""
        rng = np.random.default_rng(seed)
        return cls(
            nn.Embedding.new(words, embedding, seed=rng, dtype=F32),
            nn.LSTMCell.new(embedding, hidden, seed=rng, dtype=F32),
            nn.LSTMCell.new(embedding, hidden, seed=rng, dtype=F32),
            nn.Linear.new(2 * hidden, mlp, seed=rng, dtype=F32, bias=False),
            nn.Linear.new(mlp, tags, seed=rng, dtype=F32, bias=False),
        )

    def word_vector(self, sentence: TaggedSentence, k: int) -> ArrayLayer:
        """The vector of word ``k``: its embedding (a rare word's is the ``UNK`` row)."""
        return self.words(sentence.words[k])

    def losses(self, sentence: TaggedSentence) -> list[FloatLayer]:
        xs = [self.word_vector(sentence, k) for k in range(len(sentence.words))]
        forward = lstm_outputs(self.forward_lstm, xs)
        backward = lstm_outputs(self.backward_lstm, xs[::-1])[::-1]
        losses = []
        for f, b, tag in zip(forward, backward, sentence.tags, strict=True):
            scores = self.mlp_output(ml.tanh(self.mlp_hidden(ml.concatenate([f, b]))))
            losses.append(ml.cross_entropy(scores, label(tag)))
        return losses


@dataclass(frozen=True, eq=False)
class CharBiLstmTagger(BiLstmTagger):
    """:class:`BiLstmTagger`, a rare word read by its characters: the last outputs of a forward and
    a backward LSTM over its spelling (``<*>`` at both ends), concatenated, in place of its
    embedding (each LSTM of half the word embedding's size)."""

    chars: nn.Embedding
    char_forward: nn.LSTMCell
    char_backward: nn.LSTMCell

    @classmethod
    def new_with_chars(
        cls,
        words: int,
        tags: int,
        chars: int,
        *,
        char_embedding: int = 20,
        embedding: int = 128,
        hidden: int = 50,
        mlp: int = 32,
        seed: int = 0,
    ) -> CharBiLstmTagger:
        """The word-level weights as :meth:`BiLstmTagger.new` draws them, then the char-level ones."""
        rng = np.random.default_rng(seed)
        tagger = BiLstmTagger.new(words, tags, embedding=embedding, hidden=hidden, mlp=mlp, seed=rng)
        return cls(
            tagger.words,
            tagger.forward_lstm,
            tagger.backward_lstm,
            tagger.mlp_hidden,
            tagger.mlp_output,
            nn.Embedding.new(chars, char_embedding, seed=rng, dtype=F32),
            nn.LSTMCell.new(char_embedding, embedding // 2, seed=rng, dtype=F32),
            nn.LSTMCell.new(char_embedding, embedding // 2, seed=rng, dtype=F32),
        )

    def word_vector(self, sentence: TaggedSentence, k: int) -> ArrayLayer:
        spelling = sentence.spellings[k]
        if spelling is None:
            return self.words(sentence.words[k])
        xs = [self.chars(c) for c in spelling]
        forward = lstm_outputs(self.char_forward, xs)[-1]
        backward = lstm_outputs(self.char_backward, xs[::-1])[-1]
        return ml.concatenate([forward, backward])


def _normal(rng: np.random.Generator, inputs: int, outputs: int) -> ArrayWeight:
    return ArrayWeight.normal((inputs, outputs), std=inputs**-0.5, seed=rng, dtype=F32)


@dataclass(frozen=True, eq=False)
class SuiteTreeLSTMCell(ml.Module):
    """The suite's Tree-LSTM cell (``dynet-py/treenn.py``), which differs from ``nn.TreeLSTMCell``:
    a leaf has input and output gates (``c = i * u``), an inner node one forget gate per child, each
    reading only that child's ``h``, and the biases ``b_i``, ``b_o``, ``b_u`` are shared by leaves
    and inner nodes, ``b_f`` by both forget gates::

        leaf:   i, o, u = sigmoid(W_i x + b_i), sigmoid(W_o x + b_o), tanh(W_u x + b_u);  c = i * u
        inner:  i, o, u = the same of U_* [h1; h2];  f1 = sigmoid(U_f1 h1 + b_f), f2 = sigmoid(U_f2 h2 + b_f)
                c = i * u + f1 * c1 + f2 * c2
        both:   h = o * tanh(c)
    """

    w_i: ArrayWeight  # leaves: (embedding, hidden)
    w_o: ArrayWeight
    w_u: ArrayWeight
    u_i: ArrayWeight  # inner nodes: (2 hidden, hidden)
    u_o: ArrayWeight
    u_u: ArrayWeight
    u_f1: ArrayWeight  # (hidden, hidden)
    u_f2: ArrayWeight
    b_i: ArrayWeight  # (hidden,)
    b_o: ArrayWeight
    b_u: ArrayWeight
    b_f: ArrayWeight

    @classmethod
    def new(cls, embedding: int, hidden: int, *, seed: int | np.random.Generator = 0) -> SuiteTreeLSTMCell:
        """Normal weights of std ``1 / sqrt(inputs)``, zero biases."""
        rng = np.random.default_rng(seed) if isinstance(seed, int) else seed
        leaf = [_normal(rng, embedding, hidden) for _ in "iou"]
        inner = [_normal(rng, 2 * hidden, hidden) for _ in "iou"]
        forget = [_normal(rng, hidden, hidden) for _ in "ff"]
        biases = [ArrayWeight.zeros((hidden,), dtype=F32) for _ in "iouf"]
        return cls(*leaf, *inner, *forget, *biases)

    @ml.batchable
    def leaf(self, x: ml.AnyArray) -> tuple[ArrayLayer, ArrayLayer]:
        """``(h, c)`` of a leaf, from its word's embedding."""
        i = ml.sigmoid(ml.linear(x, self.w_i, self.b_i))
        o = ml.sigmoid(ml.linear(x, self.w_o, self.b_o))
        u = ml.tanh(ml.linear(x, self.w_u, self.b_u))
        c = i * u
        return o * ml.tanh(c), c

    @ml.batchable
    def compose(
        self, h1: ml.AnyArray, c1: ml.AnyArray, h2: ml.AnyArray, c2: ml.AnyArray
    ) -> tuple[ArrayLayer, ArrayLayer]:
        """``(h, c)`` of an inner node, from its children's."""
        e = ml.concatenate([h1, h2], axis=-1)  # axis -1: the rows of merged calls stay rows
        i = ml.sigmoid(ml.linear(e, self.u_i, self.b_i))
        o = ml.sigmoid(ml.linear(e, self.u_o, self.b_o))
        f1 = ml.sigmoid(ml.linear(h1, self.u_f1, self.b_f))
        f2 = ml.sigmoid(ml.linear(h2, self.u_f2, self.b_f))
        u = ml.tanh(ml.linear(e, self.u_u, self.b_u))
        c = i * u + f1 * c1 + f2 * c2
        return o * ml.tanh(c), c


@dataclass(frozen=True, eq=False)
class TreeNN(SuiteModel[Tree]):
    """The suite's Tree-LSTM classifier: the cell over a tree, children first, and at every node
    (every non-terminal of the suite's trees, whose leaves are pre-terminals) the cross-entropy of
    its label under ``W h`` (no bias)."""

    words: nn.Embedding
    cell: SuiteTreeLSTMCell
    classifier: nn.Linear
    vocabulary: sst.Vocabulary

    @classmethod
    def new(
        cls,
        vocabulary: sst.Vocabulary,
        labels: int,
        *,
        embedding: int = 128,
        hidden: int = 128,
        seed: int = 0,
    ) -> TreeNN:
        """Weights drawn from one generator seeded by ``seed``, in the order of the fields."""
        rng = np.random.default_rng(seed)
        return cls(
            nn.Embedding.new(len(vocabulary), embedding, seed=rng, dtype=F32),
            SuiteTreeLSTMCell.new(embedding, hidden, seed=rng),
            nn.Linear.new(hidden, labels, seed=rng, dtype=F32, bias=False),
            vocabulary,
        )

    def losses(self, tree: Tree) -> list[FloatLayer]:
        states: dict[int, tuple[ArrayLayer, ArrayLayer]] = {}  # by id(node)
        losses = []
        for node in tree.nodes():  # post-order: children first
            if node.left is None or node.right is None:
                assert node.word is not None
                h, c = self.cell.leaf(self.words(self.vocabulary.index(node.word)))
            else:
                h1, c1 = states[id(node.left)]
                h2, c2 = states[id(node.right)]
                h, c = self.cell.compose(h1, c1, h2, c2)
            states[id(node)] = h, c
            losses.append(ml.cross_entropy(self.classifier(h), label(node.label)))
        return losses


@dataclass(frozen=True, eq=False)
class RnnLm(SuiteModel[Sentence]):
    """An LSTM language model: from ``<s>``, each word's embedding into the LSTM, whose output
    predicts the next word by ``softmax(W h + b)``; a sentence ends with ``<s>``, predicted too."""

    words: nn.Embedding
    lstm: nn.LSTMCell
    softmax: nn.Linear

    @classmethod
    def new(cls, words: int, *, embedding: int = 128, hidden: int = 256, seed: int = 0) -> RnnLm:
        """Weights drawn from one generator seeded by ``seed``, in the order of the fields."""
        rng = np.random.default_rng(seed)
        return cls(
            nn.Embedding.new(words, embedding, seed=rng, dtype=F32),
            nn.LSTMCell.new(embedding, hidden, seed=rng, dtype=F32),
            nn.Linear.new(hidden, words, seed=rng, dtype=F32),
        )

    def losses(self, sentence: Sentence) -> list[FloatLayer]:
        h, c = self.lstm.zeros_state()
        previous = START
        losses = []
        for word in sentence:
            h, c = self.lstm(self.words(previous), h, c)
            losses.append(ml.cross_entropy(self.softmax(h), label(word)))
            previous = word
        return losses
