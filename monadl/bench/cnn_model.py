"""The small CIFAR-100 convolutional network that ``python -m monadl.bench models`` measures (its
``conv1``, ``conv2`` and ``cnn`` workloads): the model of ``examples/cnn.py``, which holds its own
copy for readers. This one is the package's, so that the benchmarks run from an installed wheel,
without a checkout; ``tests/test_cnn_example.py`` checks that the two are the same model (the same
weights from a seed, the same logits).

Two blocks of ``nn.Conv2d`` (3x3, padding 1), ReLU and ``nn.MaxPool2d(2)``, then a dense layer to
the 100 classes: ``(B, 3, 32, 32) -> (B, c, 16, 16) -> (B, 2c, 8, 8) -> (B, 100)``, channels first
(NCHW), float32.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

import monadl as ml
from monadl import nn

CLASSES = 100
"""CIFAR-100's fine classes: the width of the dense layer's output."""


@dataclass(frozen=True, eq=False)
class CNN(ml.Module):
    """conv-relu-pool twice, then a dense layer to the classes."""

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
        """Logits (B, 100) of images (B, 3, 32, 32)."""
        pool = nn.MaxPool2d(2)
        h = pool(ml.relu(self.conv1(images)))
        h = pool(ml.relu(self.conv2(h)))
        return self.head(ml.reshape(h, (-1, self.head.inputs)))
