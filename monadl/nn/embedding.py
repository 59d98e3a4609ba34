"""An embedding table: :class:`Embedding`, a row of trainable vectors per id."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from monadl.dsl.core.layers import ArrayLayer
from monadl.dsl.core.weights import ArrayWeight
from monadl.dsl.learning.optimizers.base import Optimizer
from monadl.dsl.ops.selection import take_rows
from monadl.nn.init import Initializer
from monadl.nn.linear import Seed, generator, positive
from monadl.nn.module import Module
from monadl.typeclasses.backend import RowIndices


@dataclass(frozen=True, eq=False)
class Embedding(Module):
    """``table[ids]``: ``table`` of shape (count, dim); ``ids`` an int (one row, shape (dim,)) or an
    array of ints (shape ``ids.shape + (dim,)``). The table's gradient is sparse: the rows used."""

    table: ArrayWeight

    def __post_init__(self) -> None:
        if len(self.table.shape) != 2:
            raise ValueError(
                f"Embedding: table must have 2 dimensions (count, dim), got shape {self.table.shape}"
            )

    @classmethod
    def new(
        cls,
        count: int,
        dim: int,
        *,
        seed: Seed = 0,
        dtype: type[np.floating[Any]] = np.float32,
        std: float | None = None,
        optimizer: Optimizer | None = None,
        init: Initializer | None = None,
        xp: Any = np,
        device: Any = None,
    ) -> Embedding:
        """Normal rows of ``std`` (default ``1 / sqrt(dim)``), or drawn by ``init`` (of shape (count,
        dim): the fans ``count`` and ``dim``, as a :class:`Linear` from one-hot ids); ``optimizer``
        overrides the model's for the table (embeddings often learn at a rate of their own). ``xp``
        and ``device``: where the table is, as :meth:`Linear.new`'s."""
        count, dim = positive("Embedding.new", "count", count), positive("Embedding.new", "dim", dim)
        seed = generator(seed, "Embedding.new")
        if init is not None:
            if std is not None:
                raise ValueError(f"Embedding.new: give std or init, not both (std={std}, init={init!r})")
            drawn = init((count, dim), seed=seed, dtype=dtype)
            return cls(ArrayWeight(drawn, optimizer=optimizer, xp=xp, device=device))
        std = dim**-0.5 if std is None else std
        return cls(
            ArrayWeight.normal(
                (count, dim), std=std, seed=seed, dtype=dtype, optimizer=optimizer, xp=xp, device=device
            )
        )

    @property
    def count(self) -> int:
        return int(self.table.data.shape[0])

    @property
    def dim(self) -> int:
        return int(self.table.data.shape[1])

    def __call__(self, ids: RowIndices) -> ArrayLayer:
        return take_rows(self.table, ids)
