"""The CIFAR-100 "columns of experts" model of the DeepLearning.scala 2 paper, in monadl: the model
that ``examples/cifar_columns.py`` trains and ``python -m monadl.bench columns`` measures.

``n`` independent columns (each two dense layers 3072 -> 64 -> 64 with ReLU) read the image; their
outputs are summed. A coarse classifier (dense 64 -> 20) predicts the coarse class (20 classes) and 20
fine classifiers (each 64 -> 64 -> 64 -> 5 with ReLU) predict the fine class within a coarse class.
Every batch holds images of one coarse class ``c``; the loss is the cross-entropy of the coarse
prediction plus that of fine classifier ``c``:

* ``skip``: the network is built from the batch's class, in ordinary Python: only classifier ``c``
  exists in the graph, so only it runs;
* ``noskip``: all 20 fine classifiers run, forward and backward; the others' losses are added with
  weight zero, so their parameters get (exactly zero) gradients from real work. The 20 classifiers
  have equal shapes, so they run as one: each layer's 20 weights are held as one stacked weight
  (20, ...) and multiplied in one batched matmul (``stacked=False`` keeps 20 weights of each and
  runs them one by one, 20 times the ops).

The columns are independent sub-graphs: with an executor of several workers, their kernels (large
matmuls, worth the pool) run in parallel, forward and backward. The parameters' names, shapes and
initialisation are ``monadl.bench.columns_params``'s, shared with the benchmark's NumPy and PyTorch
peers.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

import numpy as np
from array_api_compat import array_namespace
from returns.result import Failure

import monadl as ml
from monadl import Array, ArrayLayer, ArrayWeight, FloatLayer
from monadl.bench.columns_params import FINE_CLASSES, FINE_PARAMS, FINE_PER_COARSE
from monadl.typeclasses.backend import IndexArray

Variant = Literal["skip", "noskip"]
COARSE_CLASSES = 20


def dense_relu(x: ml.AnyArray, w: ArrayWeight, b: ArrayWeight) -> ArrayLayer:
    """``relu(x @ w + b)``."""
    return ml.relu(ml.linear(x, w, b))


def cross_entropy(logits: ArrayLayer, labels: IndexArray, classes: int) -> FloatLayer:
    """The paper's ``-mean(log(softmax(logits)) * onehot)``, over all batch x class elements."""
    return ml.cross_entropy(logits, labels) * (1.0 / classes)


class ColumnNetwork:
    """The model: its weights (named as in ``columns_params``), its loss and its training step.

    The paper trains with SGD at ``learning_rate`` (1e-4); ``optimizer`` replaces it. ``stacked``
    (``noskip`` only): hold each fine layer's 20 weights as one weight ``fine.w1``, ..., ``fine.b3``
    of shape (20, ...) and run the 20 classifiers as one stack of batched matmuls (the default), or
    keep them apart and run them one by one."""

    def __init__(
        self,
        params: dict[str, np.ndarray],
        variant: Variant = "skip",
        learning_rate: float = 1e-4,
        executor: ml.Executor | None = None,
        optimizer: ml.Optimizer | None = None,
        stacked: bool = True,
    ) -> None:
        if variant not in ("skip", "noskip"):
            raise ValueError(f"variant must be 'skip' or 'noskip', got {variant!r}")
        self.variant = variant
        self.stacked = stacked and variant == "noskip"
        # A fine layer's shapes (hidden x hidden, ...), for the gradients by classifier.
        self.fine_shapes = {layer: params[f"fine0.{layer}"].shape for layer in FINE_PARAMS}
        if self.stacked:
            params = _stacked(params)
        self.weights = {name: ArrayWeight(value, name=name) for name, value in params.items()}
        self.columns = sum(1 for name in params if name.endswith(".w1") and name.startswith("column"))
        self.optimizer = optimizer or ml.SGD(learning_rate)
        self.executor = executor

    def features(self, x: Array) -> ArrayLayer:
        """The sum of the columns' outputs: independent sub-graphs, run in parallel."""
        w = self.weights
        columns = [
            dense_relu(
                dense_relu(x, w[f"column{i}.w1"], w[f"column{i}.b1"]), w[f"column{i}.w2"], w[f"column{i}.b2"]
            )
            for i in range(self.columns)
        ]
        total = columns[0]
        for column in columns[1:]:
            total = total + column
        return total

    def fine_logits(self, h: ArrayLayer, j: int) -> ArrayLayer:
        """Fine classifier ``j`` (of coarse class ``j``): 64 -> 64 -> 64 -> 5."""
        w = self.weights
        f = dense_relu(dense_relu(h, w[f"fine{j}.w1"], w[f"fine{j}.b1"]), w[f"fine{j}.w2"], w[f"fine{j}.b2"])
        return ml.linear(f, w[f"fine{j}.w3"], w[f"fine{j}.b3"])

    def loss(self, x: Array, coarse: int, fine_local: IndexArray) -> FloatLayer:
        """The loss of one batch of coarse class ``coarse``, with local fine labels 0..4."""
        if not 0 <= coarse < COARSE_CLASSES:
            raise ValueError(f"coarse class must be in 0..19, got {coarse}")
        h = self.features(x)
        coarse_labels = np.full(fine_local.shape[0], coarse, dtype=np.int64)
        w = self.weights
        total = cross_entropy(ml.linear(h, w["coarse.w"], w["coarse.b"]), coarse_labels, COARSE_CLASSES)
        if self.variant == "skip":
            return total + cross_entropy(self.fine_logits(h, coarse), fine_local, FINE_PER_COARSE)
        if not self.stacked:
            total = total + cross_entropy(self.fine_logits(h, coarse), fine_local, FINE_PER_COARSE)
            for j in range(FINE_CLASSES):
                if j != coarse:
                    total = total + 0.0 * cross_entropy(self.fine_logits(h, j), fine_local, FINE_PER_COARSE)
            return total
        # All 20 classifiers as one: their weights stacked, each layer one batched matmul.
        logits = self.stacked_fine_logits(h)  # (20, batch, 5)
        matched = ml.reshape(ml.take_rows(logits, [coarse]), (-1, FINE_PER_COARSE))
        total = total + cross_entropy(matched, fine_local, FINE_PER_COARSE)
        # The others' losses, with weight zero: they run, forward and backward, and add exactly 0.
        xp = array_namespace(x)  # the weights' namespace: CuPy's on a GPU
        hits = xp.asarray(fine_local[:, None] == np.arange(FINE_PER_COARSE))
        onehot = xp.astype(hits, self.weights["coarse.w"].data.dtype)
        return total + 0.0 * ml.sum(ml.log_softmax(logits) * onehot)

    def stacked_fine_logits(self, h: ArrayLayer) -> ArrayLayer:
        """The 20 fine classifiers' logits at once, shape (20, batch, 5): each layer's stacked
        weight (20, n, m) and bias (20, 1, m), so each layer is one batched matmul."""
        w = self.weights
        f = ml.relu(h @ w["fine.w1"] + w["fine.b1"])
        f = ml.relu(f @ w["fine.w2"] + w["fine.b2"])
        return f @ w["fine.w3"] + w["fine.b3"]

    def predict(self, x: Array, coarse: int) -> tuple[np.ndarray, np.ndarray]:
        """The scores of the images ``x`` (a forward pass only): the coarse classifier's (B, 20) and
        fine classifier ``coarse``'s (B, 5)."""
        h = self.features(x)
        w = self.weights
        if self.stacked:
            fine = ml.reshape(ml.take_rows(self.stacked_fine_logits(h), [coarse]), (-1, FINE_PER_COARSE))
        else:
            fine = self.fine_logits(h, coarse)
        scores = ml.concatenate([ml.linear(h, w["coarse.w"], w["coarse.b"]), fine], axis=1)
        result = scores.predict_blocking(executor=self.executor)
        if isinstance(result, Failure):
            raise result.failure()
        both = np.asarray(result.unwrap())
        return both[:, :COARSE_CLASSES], both[:, COARSE_CLASSES:]

    def accuracy(self, batches: Iterable[tuple[Array, int, IndexArray]]) -> tuple[float, float]:
        """The accuracy over ``batches`` (``(x, coarse, fine_local)``, each of one coarse class, as
        ``Cifar100.batches`` gives them): coarse (of 20 classes), and fine (of 100: the coarse class
        predicted right, then the fine class by that class's fine classifier)."""
        right_coarse = right_fine = seen = 0
        for x, coarse, fine_local in batches:
            coarse_scores, fine_scores = self.predict(x, coarse)
            coarse_right = np.argmax(coarse_scores, axis=1) == coarse
            right_coarse += int(np.sum(coarse_right))
            right_fine += int(np.sum(coarse_right & (np.argmax(fine_scores, axis=1) == fine_local)))
            seen += len(x)
        if not seen:
            raise ValueError("accuracy: needs at least one image")
        return right_coarse / seen, right_fine / seen

    def step(self, x: Array, coarse: int, fine_local: IndexArray) -> float:
        """One SGD step on a batch; returns its loss, or raises what failed it (then nothing changed)."""
        result = self.loss(x, coarse, fine_local).train_blocking(self.optimizer, executor=self.executor)
        if isinstance(result, Failure):
            raise result.failure()
        return result.unwrap()

    def gradients(self, x: Array, coarse: int, fine_local: IndexArray) -> tuple[float, dict[str, Array]]:
        """The loss and every weight's gradient, by name, without updating anything."""
        value, gradients = ml.compute_gradients(self.loss(x, coarse, fine_local), executor=self.executor)
        named: dict[str, Array] = {}
        for weight, gradient in gradients.items():
            if weight.name.startswith("fine."):  # a stacked weight: classifier j's is row j
                layer = weight.name.removeprefix("fine.")
                for j in range(FINE_CLASSES):
                    named[f"fine{j}.{layer}"] = np.reshape(gradient[j], self.fine_shapes[layer])
            else:
                named[weight.name] = gradient
        return float(value), named


def _stacked(params: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``params`` with each fine layer's 20 weights ``fine{j}.w1`` stacked into one ``fine.w1`` of
    shape (20, ...) (a bias as (20, 1, n), to broadcast over the batch)."""
    stacked = {name: v for name, v in params.items() if not name.startswith("fine")}
    for layer in FINE_PARAMS:
        parts = [params[f"fine{j}.{layer}"] for j in range(FINE_CLASSES)]
        stacked[f"fine.{layer}"] = np.stack([p if p.ndim == 2 else p[None, :] for p in parts])
    return stacked
