"""Attention layers: :class:`MultiHeadAttention`, :class:`TransformerEncoderLayer` and
:class:`TransformerDecoderLayer`.

Queries ``query`` of shape (..., Lq, features) attend to keys and values of shape (..., Lk, kdim)
and (..., Lk, vdim) (self-attention: the queries themselves), giving (..., Lq, features). In
self-attention the heads of a :class:`MultiHeadAttention` are one fused projection ``x @ qkv.w``
(queries, keys and values side by side) and one attention op on it (``self_attention``: the fused
:func:`~monadl.scaled_dot_product_attention` of its thirds, with ``heads``): no reshapes,
transposes or slices of its own, and one delta for the projection. Cross-attention projects the
queries, keys and values apart and calls :func:`~monadl.scaled_dot_product_attention`.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np

from monadl.dsl.core.layers import AnyArray, ArrayLayer
from monadl.dsl.ops.activations import relu
from monadl.dsl.ops.attention import scaled_dot_product_attention, self_attention
from monadl.dsl.ops.linalg import linear, matmul
from monadl.nn.dropout import Dropout
from monadl.nn.linear import Activation, Linear, Seed, generator, positive
from monadl.nn.module import Module
from monadl.nn.norm import LayerNorm
from monadl.typeclasses.backend import AnyNDArray, is_array, namespace

__all__ = ["MultiHeadAttention", "TransformerDecoderLayer", "TransformerEncoderLayer"]


@dataclass(frozen=True, eq=False)
class MultiHeadAttention(Module):
    """Attention of ``heads`` heads, as PyTorch's ``nn.MultiheadAttention``: queries, keys and
    values projected to ``features`` each, each head attending over its slice of ``features //
    heads``, and the heads' results joined by ``out`` (features to features).

    Keys and values of ``features`` (the default): ``qkv`` maps features to 3 * features, the three
    projections side by side (PyTorch's ``in_proj_weight``, transposed), and ``k``, ``v`` are None.
    Keys of ``kdim`` or values of ``vdim`` features otherwise: ``qkv`` maps features to features (the
    queries' projection alone), ``k`` kdim to features and ``v`` vdim to features."""

    qkv: Linear
    out: Linear
    heads: int
    k: Linear | None = None
    v: Linear | None = None

    def __post_init__(self) -> None:
        features = self.out.outputs
        if self.heads < 1 or features % self.heads:
            raise ValueError(f"MultiHeadAttention: {self.heads} heads do not divide {features} features")
        if (self.k is None) != (self.v is None):
            raise ValueError("MultiHeadAttention: k and v are both projections or both None")
        if self.k is None or self.v is None:
            if (self.qkv.inputs, self.qkv.outputs, self.out.inputs) != (features, 3 * features, features):
                raise ValueError(
                    f"MultiHeadAttention: qkv of shape {tuple(self.qkv.w.data.shape)} and out of shape "
                    f"{tuple(self.out.w.data.shape)} do not fit (expected (n, 3n) and (n, n))"
                )
            return
        parts = {"q": self.qkv, "k": self.k, "v": self.v, "out": self.out}
        square = (self.qkv.inputs, self.out.inputs) == (features, features)
        if not square or any(p.outputs != features for p in parts.values()):
            shapes = ", ".join(f"{name} {tuple(p.w.data.shape)}" for name, p in parts.items())
            raise ValueError(
                f"MultiHeadAttention: projections {shapes} do not fit (expected q (n, n), k (kdim, n), "
                f"v (vdim, n), out (n, n))"
            )

    @classmethod
    def new(
        cls,
        features: int,
        heads: int,
        *,
        kdim: int | None = None,
        vdim: int | None = None,
        seed: Seed = 0,
        dtype: type[np.floating[Any]] = np.float32,
        bias: bool = True,
        xp: Any = np,
        device: Any = None,
    ) -> MultiHeadAttention:
        """Projections drawn as :meth:`Linear.new` draws them, in the order of the fields, zero
        biases; ``xp`` and ``device`` as its. ``kdim`` and ``vdim``, the keys' and values'
        features, default to ``features`` (as PyTorch's); either one other than it gives separate
        projections ``k`` and ``v``."""
        name = "MultiHeadAttention.new"
        features, heads = positive(name, "features", features), positive(name, "heads", heads)
        kdim = features if kdim is None else positive(name, "kdim", kdim)
        vdim = features if vdim is None else positive(name, "vdim", vdim)
        rng = generator(seed, name)
        if kdim == vdim == features:
            qkv = Linear.new(features, 3 * features, seed=rng, dtype=dtype, bias=bias, xp=xp, device=device)
            out = Linear.new(features, features, seed=rng, dtype=dtype, bias=bias, xp=xp, device=device)
            return cls(qkv, out, heads)
        q, out, k, v = (
            Linear.new(n, features, seed=rng, dtype=dtype, bias=bias, xp=xp, device=device)
            for n in (features, features, kdim, vdim)
        )
        return cls(q, out, heads, k, v)

    @property
    def features(self) -> int:
        return self.out.outputs

    @property
    def kdim(self) -> int:
        """The keys' features."""
        return self.features if self.k is None else self.k.inputs

    @property
    def vdim(self) -> int:
        """The values' features."""
        return self.features if self.v is None else self.v.inputs

    def __call__(
        self,
        query: AnyArray,
        key: AnyArray | None = None,
        value: AnyArray | None = None,
        mask: AnyNDArray | None = None,
        *,
        causal: bool = False,
    ) -> ArrayLayer:
        """Each position of ``query`` (..., Lq, features) attending to every position of ``key``
        (..., Lk, kdim) and ``value`` (..., Lk, vdim): ``key`` defaults to ``query``
        (self-attention) and ``value`` to ``key``. ``causal``: query i attends to keys ``j <= i``
        only; ``mask``, of a shape that broadcasts against (..., Lq, Lk): as
        :func:`~monadl.scaled_dot_product_attention`'s. The leading axes broadcast."""
        if key is not None and _is_boolean_array(key):
            raise TypeError(
                "MultiHeadAttention: key is a boolean array: pass a mask as mask= (the arguments are "
                "query, key, value, mask)"
            )
        key = query if key is None else key
        value = key if value is None else value
        if self.k is None or self.v is None:
            if key is query and value is query:  # self-attention: one fused projection and op
                return self.out(self_attention(self.qkv(query), mask, causal=causal, heads=self.heads))
            q, k, v = (self._packed(i, x) for i, x in enumerate((query, key, value)))
        else:
            q, k, v = self.qkv(query), self.k(key), self.v(value)
        return self.out(scaled_dot_product_attention(q, k, v, mask, causal=causal, heads=self.heads))

    def _packed(self, part: int, x: AnyArray) -> ArrayLayer:
        """``x`` projected by the ``part``-th third of ``qkv`` (0: queries, 1: keys, 2: values)."""
        thirds = _THIRDS.get(self)
        if thirds is None:
            thirds = _THIRDS[self] = _thirds(self.qkv, self.features)
        w, b = thirds[part]
        return matmul(x, w) if b is None else linear(x, w, b)


_Third = tuple[ArrayLayer, ArrayLayer | None]

_THIRDS: weakref.WeakKeyDictionary[MultiHeadAttention, tuple[_Third, _Third, _Third]] = (
    weakref.WeakKeyDictionary()
)
"""The column slices of a module's packed ``qkv`` (weight and bias), made once per module: every
cross-attention call of a run then reads the same slices, each computed once, and its delta is one
scatter of the calls' summed deltas. Kept apart from the module, which stays a plain dataclass of
weights (copied, pickled and compared as one)."""


def _thirds(qkv: Linear, n: int) -> tuple[_Third, _Third, _Third]:
    def third(part: int) -> _Third:
        columns = slice(part * n, (part + 1) * n)
        return qkv.w[:, columns], None if qkv.b is None else qkv.b[columns]

    return third(0), third(1), third(2)


def _is_boolean_array(x: object) -> bool:
    """Whether ``x`` is an array of booleans (a mask where a key was expected). A layer is none:
    its ``dtype`` would be worked out from its graph."""
    return not isinstance(x, ArrayLayer) and is_array(x) and getattr(x, "dtype", None) == namespace(x).bool


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
        name = "TransformerEncoderLayer.new"
        features = positive(name, "features", features)
        hidden = 4 * features if feedforward is None else positive(name, "feedforward", feedforward)
        rng = generator(seed, name)
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
            h = self.attention(self.norm1(x), mask=mask, causal=causal) + x
            return self.ff2(self.activation(self.ff1(self.norm2(h)))) + h
        h = self.norm1(self.attention(x, mask=mask, causal=causal) + x)
        return self.norm2(self.ff2(self.activation(self.ff1(h))) + h)


@dataclass(frozen=True, eq=False)
class TransformerDecoderLayer(Module):
    """Causal self-attention, cross-attention to a ``memory`` (an encoder's output), then a
    feed-forward block ``ff2(activation(ff1(x)))``, each with a residual connection and a
    :class:`LayerNorm`, as PyTorch's ``nn.TransformerDecoderLayer``. Post-norm (PyTorch's default):
    ``x = norm1(x + attention(x))``, ``x = norm2(x + cross_attention(x, memory))``, ``x = norm3(x +
    ff(x))``. Pre-norm (``norm_first``): ``x = x + attention(norm1(x))``, ``x = x +
    cross_attention(norm2(x), memory)``, ``x = x + ff(norm3(x))``.

    Dropout where PyTorch's layer has it (None: none): ``dropout1`` on the self-attention's result,
    ``dropout2`` on the cross-attention's, ``dropout`` inside the feed-forward block (after the
    activation) and ``dropout3`` on its result; only in training steps (see
    :class:`~monadl.nn.Dropout`). PyTorch's attention also drops attention weights; this one does
    not."""

    attention: MultiHeadAttention
    cross_attention: MultiHeadAttention
    norm1: LayerNorm
    norm2: LayerNorm
    norm3: LayerNorm
    ff1: Linear
    ff2: Linear
    activation: Activation
    norm_first: bool
    dropout: Dropout | None = None
    dropout1: Dropout | None = None
    dropout2: Dropout | None = None
    dropout3: Dropout | None = None

    def __post_init__(self) -> None:
        features = self.attention.features
        if self.cross_attention.features != features:
            raise ValueError(
                f"TransformerDecoderLayer: the self-attention has {features} features and the "
                f"cross-attention {self.cross_attention.features}"
            )

    @classmethod
    def new(
        cls,
        features: int,
        heads: int,
        feedforward: int | None = None,
        *,
        dropout: float = 0.1,
        activation: Activation = relu,
        norm_first: bool = False,
        seed: Seed = 0,
        dtype: type[np.floating[Any]] = np.float32,
        xp: Any = np,
        device: Any = None,
    ) -> TransformerDecoderLayer:
        """A layer of ``features`` (the model's width, PyTorch's ``d_model``), ``heads`` heads and a
        feed-forward block of ``feedforward`` units (default 4 * features), its weights drawn from
        one generator in the order of the fields (``xp`` and ``device`` as :meth:`Linear.new`'s);
        ``dropout``, as PyTorch's default 0.1 (0: no dropout layers), the seeds of its four
        generators drawn from the same generator after the weights."""
        name = "TransformerDecoderLayer.new"
        features = positive(name, "features", features)
        hidden = 4 * features if feedforward is None else positive(name, "feedforward", feedforward)
        rng = generator(seed, name)
        attention = MultiHeadAttention.new(features, heads, seed=rng, dtype=dtype, xp=xp, device=device)
        cross = MultiHeadAttention.new(features, heads, seed=rng, dtype=dtype, xp=xp, device=device)
        norm1, norm2, norm3 = (LayerNorm.new(features, dtype=dtype, xp=xp, device=device) for _ in range(3))
        ff1 = Linear.new(features, hidden, seed=rng, dtype=dtype, xp=xp, device=device)
        ff2 = Linear.new(hidden, features, seed=rng, dtype=dtype, xp=xp, device=device)
        if not dropout:
            return cls(attention, cross, norm1, norm2, norm3, ff1, ff2, activation, norm_first)
        drop, drop1, drop2, drop3 = (Dropout(dropout, seed=int(rng.integers(2**63))) for _ in range(4))
        return cls(
            attention, cross, norm1, norm2, norm3, ff1, ff2, activation, norm_first, drop, drop1, drop2, drop3
        )

    @property
    def features(self) -> int:
        return self.attention.features

    def __call__(
        self,
        x: AnyArray,
        memory: AnyArray,
        mask: AnyNDArray | None = None,
        memory_mask: AnyNDArray | None = None,
        *,
        causal: bool = True,
    ) -> ArrayLayer:
        """The layer on ``x`` of shape (..., length, features) (PyTorch's ``tgt``, batch first)
        attending to ``memory`` of shape (..., memory length, features). ``causal`` (the
        default, a decoder's): position i of ``x`` attends to its positions ``j <= i`` only
        (PyTorch's ``tgt_mask`` of ``generate_square_subsequent_mask``, ``tgt_is_causal``); ``mask``
        (a further mask of the self-attention) and ``memory_mask`` (of the cross-attention, of a
        shape that broadcasts against (..., length, memory length)) as
        :meth:`MultiHeadAttention.__call__`'s: True (or an added 0) where a query may attend."""
        # (each sum with the layer first: an array of another namespace on the left of ``+``
        # raises where it does not know the layer, array-api-strict's, instead of deferring)
        if self.norm_first:
            h = self._drop(self.dropout1, self.attention(self.norm1(x), mask=mask, causal=causal)) + x
            h = (
                self._drop(self.dropout2, self.cross_attention(self.norm2(h), memory, memory, memory_mask))
                + h
            )
            return self._drop(self.dropout3, self._feedforward(self.norm3(h))) + h
        h = self.norm1(self._drop(self.dropout1, self.attention(x, mask=mask, causal=causal)) + x)
        h = self.norm2(self._drop(self.dropout2, self.cross_attention(h, memory, memory, memory_mask)) + h)
        return self.norm3(self._drop(self.dropout3, self._feedforward(h)) + h)

    def _feedforward(self, x: AnyArray) -> ArrayLayer:
        return self.ff2(self._drop(self.dropout, self.activation(self.ff1(x))))

    @staticmethod
    def _drop(dropout: Dropout | None, x: ArrayLayer) -> ArrayLayer:
        return x if dropout is None else dropout(x)
