"""The character-level Transformer language model that the ``transformer`` workload of ``python -m
monadl.bench models`` measures: the model of ``examples/transformer_lm.py``, which holds its own
copy for readers. This one is the package's, so that the benchmarks run from an installed wheel,
without a checkout; ``tests/test_transformer_lm.py`` checks that the two are the same model (the
same weights from a seed, the same losses before and after a step).

Each position of a window of character ids predicts the next::

    x = E[chars] + P                          embeddings of the characters and of the positions
    x = layer(x, causal=True)  (layers x)     pre-norm Transformer layers (monadl.nn), each
                                              position attending to itself and those before it
    p(next char) = softmax(W norm(x) + b)     a last LayerNorm, then the readout

and its loss is the mean cross-entropy of the next characters (nats per character) over the whole
window. A batch is one array of (batch, context) ids, so a step is a fixed graph of a few dozen
large ops (the attention is one fused op per layer, ``ml.scaled_dot_product_attention``): the
executor replays its compiled program from the second step on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

import monadl as ml
from monadl import ArrayLayer, ArrayWeight, FloatLayer, nn
from monadl.bench.common import raised

Ids = np.ndarray[Any, np.dtype[np.int64]]


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
        """The next character's logits at every position of ``windows`` (batch, length <= context)."""
        length = windows.shape[-1]
        positions = self.positions if length == self.context else self.positions[:length]
        x = self.embedding(windows) + positions
        for layer in self.layers:
            x = layer(x, causal=True)
        return self.readout(self.norm(x))

    def loss(self, windows: Ids) -> FloatLayer:
        """The mean cross-entropy of each next character of ``windows`` (batch, length + 1)."""
        return ml.cross_entropy(self.logits(windows[:, :-1]), windows[:, 1:])

    def nats(self, windows: Ids, executor: ml.Executor | None = None) -> float:
        """The mean loss per predicted character of ``windows`` (a forward pass only)."""
        return float(raised(self.loss(windows).predict_blocking(executor=executor)))
