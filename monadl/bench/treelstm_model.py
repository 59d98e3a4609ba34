"""The sentiment classifier of Tai, Socher and Manning (2015), a binary constituency Tree-LSTM, in
monadl: the model that ``examples/tree_lstm.py`` trains and ``python -m monadl.bench treelstm`` (and
``distributed``) measure.

A sentence is a binary parse tree (``monadl.data.trees.Tree``): its words are the leaves, and every
node, leaf or not, carries a sentiment label 0-4 (very negative .. very positive), as in the Stanford
Sentiment Treebank. The network is built in plain Python from each tree, children before their
parent: the graph has the tree's shape, a different one for every sentence. Per node ``j``:

* a leaf reads its word's embedding ``x`` (the *leaf module* of Tai et al.'s released code, rather
  than the inner-node equations below with zero children)::

      c = W_c x + b_c                h = sigmoid(W_o x + b_o) * tanh(c)

* an inner node (the N-ary Tree-LSTM with N = 2, constituency variant) reads only its children's
  states ``(h_l, c_l)`` and ``(h_r, c_r)``, no word::

      i   = sigmoid(U_i [h_l; h_r] + b_i)            input gate
      f_l = sigmoid(U_fl [h_l; h_r] + b_fl)          forget gate of the left child's memory
      f_r = sigmoid(U_fr [h_l; h_r] + b_fr)          forget gate of the right child's memory
      o   = sigmoid(U_o [h_l; h_r] + b_o)            output gate
      u   = tanh(U_u [h_l; h_r] + b_u)               candidate memory
      c   = i * u + f_l * c_l + f_r * c_r            h = o * tanh(c)

  ``U [h_l; h_r]`` is the paper's ``U_l h_l + U_r h_r`` with ``U = [U_l; U_r]`` stacked into one
  (2H, H) matrix: the two children are concatenated once and each gate is one ``linear`` op.

A softmax classifier (``linear`` + ``cross_entropy``) reads every node's ``h``, and the loss is at
every node, as in Tai et al.: a tree's loss is the sum of its nodes' cross-entropies; a training step
takes the mean of its trees' losses. Training is Adagrad at learning rate 0.05 (0.1 for the
embeddings, which get no weight decay), as in the paper; L2 weight decay (1e-4 there) is optional.
Left out: dropout and pre-trained GloVe vectors (the embeddings here start random).

The cell is ``monadl.nn.TreeLSTMCell`` (these equations), the classifier a ``monadl.nn.Linear``, and
the model an ``ml.Module``: ``model.weights()`` names its weights, and ``ml.save`` / ``ml.load``
checkpoint it.

The network is plain Python over the tree, one node at a time, with no manual batching. The cell's
two node functions (``leaf`` and ``compose``) are batchable operations: a call records one node, and
the executor's dynamic batching merges the calls of every node of one height, across all the trees
of a batch, into one run of the cell on stacked rows (``ml.Executor(batching=False)`` turns that
off; the results are the same). The word lookups and the per-node classifier are merged the same
way, op by op. The tree is walked in post-order with a loop, not recursion, and the executor runs
the graph iteratively, so a degenerate tree thousands of levels deep is fine.

Accuracy (:meth:`TreeLstm.accuracy`) is measured at the roots, as in the SST papers: fine-grained (5
classes) and binary, where neutral roots are dropped and a prediction is positive when the two
positive classes are more probable together than the two negative ones.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np

import monadl as ml
from monadl import ArrayLayer, ArrayWeight, FloatLayer, nn
from monadl.bench.common import raised
from monadl.data.trees import Tree
from monadl.nn.module import Weight

WordId = Callable[[str], int]
"""A word's row in the embedding table (0 for an unknown word, by convention)."""


class State(NamedTuple):
    """A node's output ``h`` and memory cell ``c``, each of shape (hidden,). (A named tuple: one is
    made per node of every tree, and a frozen dataclass costs several times more to make.)"""

    h: ArrayLayer
    c: ArrayLayer


class ArrayWeights(dict[str, ArrayWeight]):
    """A model's weights by name, every one an array; called, the same as a plain dict (the
    :meth:`monadl.Module.weights` API). ``model.weights`` is then both ``weights()`` and the mapping
    that code written before the model was a module reads (the benchmark's peers)."""

    def __call__(self) -> dict[str, Weight]:
        return dict[str, Weight](self)


class TreeLstm(ml.Module):
    """A constituency Tree-LSTM sentiment classifier: embeddings, cell, classifier, optimizer.

    A module: ``weights()`` names every weight (``embeddings``, ``leaf_c.w``, ``leaf_c.b``, ...,
    ``u.b``, ``classifier.w``, ``classifier.b``), and ``ml.save`` / ``ml.load`` take the model.
    ``dtype``: the weights' float type (``np.float64`` for gradient checks). ``weight_decay``: L2 on
    every weight but the embeddings (Tai et al. use 1e-4)."""

    def __init__(
        self,
        vocabulary_size: int,
        embedding: int = 128,
        hidden: int = 128,
        classes: int = 5,
        seed: int = 0,
        *,
        learning_rate: float = 0.05,
        embedding_learning_rate: float = 0.1,
        weight_decay: float = 0.0,
        dtype: type[np.floating[Any]] = np.float32,
        executor: ml.Executor | None = None,
    ) -> None:
        rng = np.random.default_rng(seed)  # the weights are drawn from it in the order below
        self.classes = classes
        self.embeddings = ArrayWeight.normal(
            (vocabulary_size, embedding),
            std=embedding**-0.5,
            seed=rng,
            dtype=dtype,
            optimizer=ml.Adagrad(embedding_learning_rate),
            name="embeddings",
        )
        cell = nn.TreeLSTMCell.new(embedding, hidden, seed=rng, dtype=dtype)
        # The cell's gates are the model's own fields too, before the cell: weights() names a weight
        # by the first path to it, so they are "leaf_c.w", ..., "u.b" (not "cell.leaf_c.w"), the
        # names the benchmark's peers (PyTorch, DyNet) read.
        self.leaf_c, self.leaf_o = cell.leaf_c, cell.leaf_o
        self.i, self.f_left, self.f_right, self.o, self.u = cell.i, cell.f_left, cell.f_right, cell.o, cell.u
        self.classifier = nn.Linear.new(hidden, classes, seed=rng, dtype=dtype)
        self.cell = cell
        self.optimizer = ml.Adagrad(learning_rate, weight_decay=weight_decay)
        self.executor = executor

    @property
    def weights(self) -> ArrayWeights:
        """Every weight, by name: ``model.weights()`` as for any module, and ``model.weights`` the
        same as a mapping (see :class:`ArrayWeights`)."""
        found = ml.weights_of(self)
        arrays = ArrayWeights({name: w for name, w in found.items() if isinstance(w, ArrayWeight)})
        assert len(arrays) == len(found), "every weight of the model is an array"
        return arrays

    def states(self, tree: Tree, word_id: WordId) -> list[tuple[Tree, State]]:
        """Every node of ``tree`` with its state, children before parents (the root last)."""
        nodes = list(tree.nodes())  # post-order, by a loop: no Python recursion at any depth
        states: dict[int, State] = {}  # by id(node)
        for node in nodes:
            if node.left is None or node.right is None:
                # One lookup per leaf: batching merges them (one sparse delta of the rows used).
                word = word_id(node.word) if node.word is not None else 0
                states[id(node)] = State(*self.cell.leaf(ml.take_rows(self.embeddings, word)))
            else:
                left, right = states[id(node.left)], states[id(node.right)]
                states[id(node)] = State(*self.cell.compose(left.h, left.c, right.h, right.c))
        return [(node, states[id(node)]) for node in nodes]

    def node_losses(self, tree: Tree, word_id: WordId) -> list[FloatLayer]:
        """The cross-entropy of each node's label, for every node of ``tree``."""
        return [
            ml.cross_entropy(self.classifier(state.h), node.label)
            for node, state in self.states(tree, word_id)
        ]

    def loss(self, trees: Sequence[Tree], word_id: WordId) -> FloatLayer:
        """The sum of the trees' losses: one ``add_n`` over all their nodes (one sum per tree would
        be sums of different arities, which do not merge)."""
        if not trees:
            raise ValueError("loss: needs at least one tree")
        return ml.add_n([loss for tree in trees for loss in self.node_losses(tree, word_id)])

    def step(self, trees: Sequence[Tree], word_id: WordId) -> float:
        """One Adagrad step on the mean loss per tree of a batch; returns that mean, or raises what
        failed the step (then no weight and no optimizer state changed)."""
        # A batch's graph is many small objects: recorded and run with the collector paused, and
        # gone (with _step's frame) before it is back, so it never walks them (monadl.runtime.process).
        with ml.gc_paused():
            return self._step(trees, word_id)

    def _step(self, trees: Sequence[Tree], word_id: WordId) -> float:
        mean = self.loss(trees, word_id) * (1.0 / len(trees))
        value: float = raised(mean.train_blocking(self.optimizer, executor=self.executor))
        return value

    def root_logits(self, tree: Tree, word_id: WordId) -> np.ndarray:
        """The classifier's scores for the root of ``tree`` (a forward pass only)."""
        logits: np.ndarray = self.predict_roots([tree], word_id)[0]
        return logits

    def predict_roots(self, trees: Sequence[Tree], word_id: WordId) -> np.ndarray:
        """The classifier's scores for the roots of ``trees``, shape ``(len(trees), classes)``: one
        forward pass for them all, so batching merges their nodes."""
        if not trees:
            raise ValueError("predict_roots: needs at least one tree")
        with ml.gc_paused():  # as in step
            return self._predict_roots(trees, word_id)

    def _predict_roots(self, trees: Sequence[Tree], word_id: WordId) -> np.ndarray:
        roots = [self.classifier(self.states(tree, word_id)[-1][1].h) for tree in trees]
        scores = ml.reshape(ml.concatenate(roots), (len(trees), self.classes))
        scores_data: np.ndarray = raised(scores.predict_blocking(executor=self.executor))
        return scores_data  # in the weights' namespace: a CuPy array where they are on a GPU

    def predict(self, tree: Tree, word_id: WordId) -> int:
        """The most probable class of the root of ``tree``."""
        return int(np.argmax(self.root_logits(tree, word_id)))

    def accuracy(self, trees: Sequence[Tree], word_id: WordId) -> tuple[float, float]:
        """Root accuracy: fine-grained (all classes), and binary over the roots not of the middle,
        neutral class (NaN if there are none): a prediction is positive when the classes above the
        middle are more probable together than those below it."""
        middle = self.classes // 2  # the neutral class (2 of 0-4)
        fine = binary = binary_total = 0
        chunks = [self.predict_roots(part, word_id) for part in ml.DataLoader(trees, 256, collate=list)]
        for tree, logits in zip(trees, (row for chunk in chunks for row in chunk), strict=True):
            fine += int(np.argmax(logits)) == tree.label
            if tree.label != middle:
                p = np.exp(logits - np.max(logits))
                positive = p[middle + 1 :].sum() > p[:middle].sum()
                binary += bool(positive) == (tree.label > middle)
                binary_total += 1
        return fine / len(trees), binary / binary_total if binary_total else math.nan
