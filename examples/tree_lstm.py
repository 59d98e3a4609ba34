"""Sentiment of sentences with a binary constituency Tree-LSTM (Tai, Socher and Manning, 2015).

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

Accuracy is measured at the roots, as in the SST papers: fine-grained (5 classes) and binary, where
neutral roots are dropped and a prediction is positive when the two positive classes are more
probable together than the two negative ones.

The network is plain Python over the tree, one node at a time, with no manual batching. The two
node functions are ``@ml.batchable`` operations: a call records one node, and the executor's dynamic
batching merges the calls of every node of one height, across all the trees of a batch, into one
run of the cell on stacked rows (``--no-batching`` turns that off; the results are the same). The
word lookups and the per-node classifier are merged the same way, op by op. The tree is walked in
post-order with a loop, not recursion, and the executor runs the graph iteratively, so a degenerate
tree thousands of levels deep is fine.

Run it: ``python examples/tree_lstm.py`` (synthetic trees from ``monadl.data.sst``), or
``python examples/tree_lstm.py --data path/to/trainDevTestTrees_PTB`` for the real treebank.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import Any, NamedTuple

import numpy as np
from returns.result import Failure, Result

import monadl as ml
from monadl import ArrayLayer, ArrayWeight, FloatLayer
from monadl.cli import non_negative_float, non_negative_int, positive_float, positive_int
from monadl.data.trees import Tree

WordId = Callable[[str], int]
"""A word's row in the embedding table (0 for an unknown word, by convention)."""


@dataclass(frozen=True)
class Affine:
    """``x @ w + b``: the weights of one gate (or of the classifier)."""

    w: ArrayWeight
    b: ArrayWeight

    @staticmethod
    def new(inputs: int, outputs: int, rng: np.random.Generator, dtype: type[np.floating[Any]]) -> Affine:
        """Weights with std ``1 / sqrt(inputs)`` (the variance of Torch's default), zero bias."""
        w = ArrayWeight.normal((inputs, outputs), std=inputs**-0.5, seed=rng, dtype=dtype)
        return Affine(w, ArrayWeight.zeros((outputs,), dtype=dtype))

    def __call__(self, x: ml.AnyArray) -> ArrayLayer:
        return ml.linear(x, self.w, self.b)


class State(NamedTuple):
    """A node's output ``h`` and memory cell ``c``, each of shape (hidden,). (A named tuple: one is
    made per node of every tree, and a frozen dataclass costs several times more to make.)"""

    h: ArrayLayer
    c: ArrayLayer


@dataclass(frozen=True)
class Cell:
    """The Tree-LSTM's weights and its two node functions."""

    leaf_c: Affine  # leaves: (embedding, hidden)
    leaf_o: Affine
    i: Affine  # inner nodes: (2 hidden, hidden), the left child's rows first
    f_left: Affine
    f_right: Affine
    o: Affine
    u: Affine

    @staticmethod
    def new(embedding: int, hidden: int, rng: np.random.Generator, dtype: type[np.floating[Any]]) -> Cell:
        leaf = [Affine.new(embedding, hidden, rng, dtype) for _ in range(2)]
        inner = [Affine.new(2 * hidden, hidden, rng, dtype) for _ in range(5)]
        return Cell(*leaf, *inner)

    def leaf(self, x: ArrayLayer) -> State:
        """A leaf, from its word's embedding ``x``."""
        return State(*self.leaf_cell(x))

    def compose(self, left: State, right: State) -> State:
        """An inner node, from its children's states."""
        return State(*self.inner_cell(left.h, left.c, right.h, right.c))

    # The node functions proper, on layers: batchable operations, so the calls of many nodes merge
    # (their arguments then have a leading axis of rows: hence ``axis=-1``).

    @ml.batchable
    def leaf_cell(self, x: ArrayLayer) -> tuple[ArrayLayer, ArrayLayer]:
        """``(h, c)`` of a leaf."""
        c = self.leaf_c(x)
        return ml.sigmoid(self.leaf_o(x)) * ml.tanh(c), c

    @ml.batchable
    def inner_cell(
        self, h_left: ArrayLayer, c_left: ArrayLayer, h_right: ArrayLayer, c_right: ArrayLayer
    ) -> tuple[ArrayLayer, ArrayLayer]:
        """``(h, c)`` of an inner node."""
        children = ml.concatenate([h_left, h_right], axis=-1)  # [h_l; h_r], shared by the five gates
        i, f_left, f_right, o = (
            ml.sigmoid(gate(children)) for gate in (self.i, self.f_left, self.f_right, self.o)
        )
        u = ml.tanh(self.u(children))
        c = i * u + f_left * c_left + f_right * c_right
        return o * ml.tanh(c), c


def _raised(result: Result[Any, Exception]) -> Any:
    """The value of ``result``, or its original exception raised."""
    if isinstance(result, Failure):
        raise result.failure()
    return result.unwrap()


class TreeLstm:
    """A constituency Tree-LSTM sentiment classifier: embeddings, cell, classifier, optimizer.

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
        rng = np.random.default_rng(seed)
        self.classes = classes
        self.embeddings = ArrayWeight.normal(
            (vocabulary_size, embedding),
            std=embedding**-0.5,
            seed=rng,
            dtype=dtype,
            optimizer=ml.Adagrad(embedding_learning_rate),
            name="embeddings",
        )
        self.cell = Cell.new(embedding, hidden, rng, dtype)
        self.classifier = Affine.new(hidden, classes, rng, dtype)
        self.optimizer = ml.Adagrad(learning_rate, weight_decay=weight_decay)
        self.executor = executor

    @property
    def weights(self) -> dict[str, ArrayWeight]:
        """Every weight, by name (``embeddings``, ``i.w``, ``i.b``, ..., ``classifier.b``)."""
        affines = {field.name: getattr(self.cell, field.name) for field in fields(self.cell)}
        affines["classifier"] = self.classifier
        named = {"embeddings": self.embeddings}
        for name, affine in affines.items():
            named[f"{name}.w"], named[f"{name}.b"] = affine.w, affine.b
        return named

    def states(self, tree: Tree, word_id: WordId) -> list[tuple[Tree, State]]:
        """Every node of ``tree`` with its state, children before parents (the root last)."""
        nodes = list(tree.nodes())  # post-order, by a loop: no Python recursion at any depth
        states: dict[int, State] = {}  # by id(node)
        for node in nodes:
            if node.left is None or node.right is None:
                # One lookup per leaf: batching merges them (one sparse delta of the rows used).
                word = word_id(node.word) if node.word is not None else 0
                states[id(node)] = self.cell.leaf(ml.take_rows(self.embeddings, word))
            else:
                states[id(node)] = self.cell.compose(states[id(node.left)], states[id(node.right)])
        return [(node, states[id(node)]) for node in nodes]

    def node_losses(self, tree: Tree, word_id: WordId) -> list[FloatLayer]:
        """The cross-entropy of each node's label, for every node of ``tree``."""
        return [
            ml.cross_entropy(self.classifier(state.h), np.asarray(node.label, dtype=np.int64))
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
        # gone (with _step's frame) before it is back, so it never walks them (monadl.do.collector).
        with ml.gc_paused():
            return self._step(trees, word_id)

    def _step(self, trees: Sequence[Tree], word_id: WordId) -> float:
        mean = self.loss(trees, word_id) * (1.0 / len(trees))
        value: float = _raised(mean.train_blocking(self.optimizer, executor=self.executor))
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
        return np.asarray(_raised(scores.predict_blocking(executor=self.executor)))

    def predict(self, tree: Tree, word_id: WordId) -> int:
        """The most probable class of the root of ``tree``."""
        return int(np.argmax(self.root_logits(tree, word_id)))

    def accuracy(self, trees: Sequence[Tree], word_id: WordId) -> tuple[float, float]:
        """Root accuracy: fine-grained (all classes), and binary over the roots not of the middle,
        neutral class (NaN if there are none): a prediction is positive when the classes above the
        middle are more probable together than those below it."""
        middle = self.classes // 2  # the neutral class (2 of 0-4)
        fine = binary = binary_total = 0
        chunks = [self.predict_roots(trees[i : i + 256], word_id) for i in range(0, len(trees), 256)]
        for tree, logits in zip(trees, (row for chunk in chunks for row in chunk), strict=True):
            fine += int(np.argmax(logits)) == tree.label
            if tree.label != middle:
                p = np.exp(logits - np.max(logits))
                positive = p[middle + 1 :].sum() > p[:middle].sum()
                binary += bool(positive) == (tree.label > middle)
                binary_total += 1
        return fine / len(trees), binary / binary_total if binary_total else math.nan


def main(argv: Sequence[str] | None = None) -> list[float]:
    """Trains on synthetic trees (or the SST, ``--data``) and prints loss, accuracy and speed;
    returns each epoch's mean training loss per tree."""
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
    args = parser.parse_args(argv)

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
    rng = np.random.default_rng(args.seed)
    losses: list[float] = []
    best: tuple[float, int, dict[str, Any]] | None = None  # dev accuracy, epoch, the weights' data
    for epoch in range(args.epochs):
        order = rng.permutation(len(train))
        batches = [[train[k] for k in order[i : i + args.batch]] for i in range(0, len(train), args.batch)]
        start = time.perf_counter()
        total = sum(model.step(batch, vocabulary.index) * len(batch) for batch in batches)
        seconds = time.perf_counter() - start
        losses.append(total / len(train))
        fine, binary = model.accuracy(dev, vocabulary.index)
        print(
            f"epoch {epoch}: loss {losses[-1]:.3f} per tree ({len(train) / seconds:.1f} trees/s); "
            f"dev root accuracy {fine:.3f} fine-grained, {binary:.3f} binary",
            flush=True,
        )
        if best is None or fine > best[0]:
            # A step replaces a weight's data and never changes it in place: keeping the arrays is a copy.
            best = fine, epoch, {name: w.data for name, w in model.weights.items()}
    if best is not None and "test" in data:
        for name, w in model.weights.items():  # the epoch selected on dev
            w.data = best[2][name]
        fine, binary = model.accuracy(data["test"], vocabulary.index)
        print(
            f"test root accuracy, weights of epoch {best[1]} (best on dev, {best[0]:.3f}): {fine:.3f} "
            f"fine-grained, {binary:.3f} binary (Tai et al. 2015, with GloVe vectors: 0.510, 0.880)"
        )
    return losses


if __name__ == "__main__":
    main()
