"""Attention layers: :class:`MultiHeadAttention` and :class:`TransformerEncoderLayer`.

Both take ``x`` of shape (..., length, features) (a sequence, or a batch of them) and give the same
shape. The heads of a :class:`MultiHeadAttention` are one fused projection ``x @ qkv.w`` (queries,
keys and values side by side) and one attention op on it (``self_attention``: the fused
:func:`~monadl.scaled_dot_product_attention` of its thirds, with ``heads``): no reshapes,
transposes or slices of its own, and one delta for the projection.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from monadl.dsl.attention import self_attention
from monadl.dsl.layers import AnyArray, ArrayLayer
from monadl.dsl.ops import relu
from monadl.nn.linear import Activation, Linear, Seed, generator
from monadl.nn.module import Module
from monadl.nn.norm import LayerNorm
from monadl.typeclasses.backend import AnyNDArray

__all__ = ["MultiHeadAttention", "TransformerEncoderLayer"]


@dataclass(frozen=True, eq=False)
class MultiHeadAttention(Module):
    """Self-attention of ``heads`` heads: ``q, k, v = split(x @ qkv.w + qkv.b, 3)``, each head
    attending over its slice of ``features // heads``, and the heads' results joined by ``out``.
    ``qkv`` maps features to 3 * features, ``out`` features to features."""

    qkv: Linear
    out: Linear
    heads: int

    def __post_init__(self) -> None:
        features = self.out.outputs
        if self.heads < 1 or features % self.heads:
            raise ValueError(f"MultiHeadAttention: {self.heads} heads do not divide {features} features")
        if (self.qkv.inputs, self.qkv.outputs, self.out.inputs) != (features, 3 * features, features):
            raise ValueError(
                f"MultiHeadAttention: qkv of shape {tuple(self.qkv.w.data.shape)} and out of shape "
                f"{tuple(self.out.w.data.shape)} do not fit (expected (n, 3n) and (n, n))"
            )

    @classmethod
    def new(
        cls,
        features: int,
        heads: int,
        *,
        seed: Seed = 0,
        dtype: type[np.floating[Any]] = np.float32,
        bias: bool = True,
        xp: Any = np,
        device: Any = None,
    ) -> MultiHeadAttention:
        """Projections drawn as :meth:`Linear.new` draws them (``qkv`` first), zero biases; ``xp``
        and ``device`` as its."""
        rng = generator(seed)
        qkv = Linear.new(features, 3 * features, seed=rng, dtype=dtype, bias=bias, xp=xp, device=device)
        out = Linear.new(features, features, seed=rng, dtype=dtype, bias=bias, xp=xp, device=device)
        return cls(qkv, out, heads)

    @property
    def features(self) -> int:
        return self.out.outputs

    def __call__(self, x: AnyArray, mask: AnyNDArray | None = None, *, causal: bool = False) -> ArrayLayer:
        """Each position of ``x`` (..., length, features) attending to every position (``causal``:
        to itself and those before it; ``mask``: as :func:`~monadl.scaled_dot_product_attention`)."""
        return self.out(self_attention(self.qkv(x), mask, causal=causal, heads=self.heads))


@dataclass(frozen=True, eq=False)
class TransformerEncoderLayer(Module):
    """Self-attention then a feed-forward block ``ff2(activation(ff1(x)))``, each with a residual
    connection and a :class:`LayerNorm`. Pre-norm (``norm_first``, as GPT-2): ``x + attention(
    norm1(x))``, then ``x + ff(norm2(x))``, whose residual path is never normalised (deep stacks
    train without warm-up; put a last ``LayerNorm`` after the stack). Post-norm (PyTorch's default,
    the original Transformer's): ``norm1(x + attention(x))``, then ``norm2(x + ff(x))``. No
    dropout: put a :class:`~monadl.nn.Dropout` around the layer where one is wanted."""

    attention: MultiHeadAttention
    norm1: LayerNorm
    norm2: LayerNorm
    ff1: Linear
    ff2: Linear
    activation: Activation
    norm_first: bool

    @classmethod
    def new(
        cls,
        features: int,
        heads: int,
        feedforward: int | None = None,
        *,
        activation: Activation = relu,
        norm_first: bool = False,
        seed: Seed = 0,
        dtype: type[np.floating[Any]] = np.float32,
        xp: Any = np,
        device: Any = None,
    ) -> TransformerEncoderLayer:
        """A layer of ``features`` (the model's width), ``heads`` heads and a feed-forward block of
        ``feedforward`` units (default 4 * features), its weights drawn from one generator in the
        order of the fields (``xp`` and ``device`` as :meth:`Linear.new`'s)."""
        rng = generator(seed)
        hidden = 4 * features if feedforward is None else feedforward
        return cls(
            MultiHeadAttention.new(features, heads, seed=rng, dtype=dtype, xp=xp, device=device),
            LayerNorm.new(features, dtype=dtype, xp=xp, device=device),
            LayerNorm.new(features, dtype=dtype, xp=xp, device=device),
            Linear.new(features, hidden, seed=rng, dtype=dtype, xp=xp, device=device),
            Linear.new(hidden, features, seed=rng, dtype=dtype, xp=xp, device=device),
            activation,
            norm_first,
        )

    def __call__(self, x: AnyArray, mask: AnyNDArray | None = None, *, causal: bool = False) -> ArrayLayer:
        """The layer on ``x`` of shape (..., length, features); ``mask`` and ``causal`` as
        :meth:`MultiHeadAttention.__call__`'s."""
        if self.norm_first:
            h = self.attention(self.norm1(x), mask, causal=causal) + x
            return self.ff2(self.activation(self.ff1(self.norm2(h)))) + h
        h = self.norm1(self.attention(x, mask, causal=causal) + x)
        return self.norm2(self.ff2(self.activation(self.ff1(h))) + h)
