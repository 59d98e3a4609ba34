"""The binary constituency Tree-LSTM cell (Tai, Socher and Manning, 2015): :class:`TreeLSTMCell`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from monadl.dsl.core.layers import AnyArray, ArrayLayer
from monadl.dsl.extend.operation import batchable
from monadl.dsl.ops.recurrent import lstm_h, tree_lstm_c
from monadl.dsl.ops.shape import concatenate
from monadl.nn.init import Initializer
from monadl.nn.linear import Linear, Seed, generator, positive
from monadl.nn.module import Module


@dataclass(frozen=True, eq=False)
class TreeLSTMCell(Module):
    """The node functions of a binary Tree-LSTM, each node's state ``(h, c)`` of shape (hidden,).

    A leaf reads its word's embedding ``x`` (the leaf module of Tai et al.'s released code)::

        c = W_c x + b_c                h = sigmoid(W_o x + b_o) * tanh(c)

    An inner node reads only its children's states (the N-ary Tree-LSTM with N = 2)::

        i   = sigmoid(U_i [h_l; h_r] + b_i)        f_l = sigmoid(U_fl [h_l; h_r] + b_fl)
        o   = sigmoid(U_o [h_l; h_r] + b_o)        f_r = sigmoid(U_fr [h_l; h_r] + b_fr)
        u   = tanh(U_u [h_l; h_r] + b_u)
        c   = i * u + f_l * c_l + f_r * c_r        h = o * tanh(c)

    ``U [h_l; h_r]`` is the paper's ``U_l h_l + U_r h_r``, ``U`` of shape (2 hidden, hidden), the
    left child's rows first. Both functions are batchable operations: the calls of the nodes of one
    height, across all the trees of a batch, merge. (``examples/tree_lstm.py``'s ``Cell``, the same.)
    """

    leaf_c: Linear  # leaves: (embedding, hidden)
    leaf_o: Linear
    i: Linear  # inner nodes: (2 hidden, hidden)
    f_left: Linear
    f_right: Linear
    o: Linear
    u: Linear

    @classmethod
    def new(
        cls,
        embedding: int,
        hidden: int,
        *,
        seed: Seed = 0,
        dtype: type[np.floating[Any]] = np.float32,
        init: Initializer | None = None,
        xp: Any = np,
        device: Any = None,
    ) -> TreeLSTMCell:
        """Weights drawn by :meth:`Linear.new` (std ``1 / sqrt(inputs)``, or by ``init``; zero
        biases) in the order of the fields: from one generator, the weights of
        ``examples/tree_lstm.py``'s ``Cell.new`` (``xp`` and ``device`` as :meth:`Linear.new`'s)."""
        embedding = positive("TreeLSTMCell.new", "embedding", embedding)
        hidden = positive("TreeLSTMCell.new", "hidden", hidden)
        rng = generator(seed, "TreeLSTMCell.new")
        shared: dict[str, Any] = {"seed": rng, "dtype": dtype, "init": init, "xp": xp, "device": device}
        leaf = [Linear.new(embedding, hidden, **shared) for _ in range(2)]
        inner = [Linear.new(2 * hidden, hidden, **shared) for _ in range(5)]
        return cls(*leaf, *inner)

    @property
    def embedding(self) -> int:
        return self.leaf_c.inputs

    @property
    def hidden(self) -> int:
        return self.leaf_c.outputs

    @batchable
    def leaf(self, x: AnyArray) -> tuple[ArrayLayer, ArrayLayer]:
        """``(h, c)`` of a leaf, from its word's embedding ``x``."""
        c = self.leaf_c(x)
        return lstm_h(self.leaf_o(x), c), c

    @batchable
    def compose(
        self, h_left: AnyArray, c_left: AnyArray, h_right: AnyArray, c_right: AnyArray
    ) -> tuple[ArrayLayer, ArrayLayer]:
        """``(h, c)`` of an inner node, from its children's states."""
        children = concatenate([h_left, h_right], axis=-1)  # [h_l; h_r], shared by the five gates
        # the gates' activations and products fused: 2 kernels forward, 8 vjps (monadl.dsl.ops.recurrent)
        i, f_left, f_right, u = (gate(children) for gate in (self.i, self.f_left, self.f_right, self.u))
        c = tree_lstm_c(i, f_left, f_right, u, c_left, c_right)
        return lstm_h(self.o(children), c), c
