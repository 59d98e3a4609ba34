"""layer_norm and scaled_dot_product_attention take array-likes and give ArrayLayers; the attention
modules take array-likes (queries, and keys and values for cross-attention) and an optional NumPy
mask."""

from typing import assert_type

import numpy as np

import monadl
from monadl import ArrayLayer, ArrayWeight, nn

x = ArrayWeight.normal((2, 5, 8), seed=0)
w, b = ArrayWeight(np.ones(8)), ArrayWeight.zeros((8,))
assert_type(monadl.layer_norm(x), ArrayLayer)
assert_type(monadl.layer_norm(x * 2.0, w, b, eps=1e-6), ArrayLayer)
assert_type(monadl.layer_norm(np.ones((3, 8)), bias=b), ArrayLayer)
keep = np.tril(np.ones((5, 5), dtype=bool))
assert_type(monadl.scaled_dot_product_attention(x, x, x), ArrayLayer)
assert_type(monadl.scaled_dot_product_attention(x, x, x, keep, heads=2), ArrayLayer)
assert_type(monadl.scaled_dot_product_attention(x, x, x, causal=True, scale=0.5), ArrayLayer)
layer = nn.TransformerEncoderLayer.new(8, 2, activation=monadl.tanh, norm_first=True)
assert_type(layer(x, causal=True), ArrayLayer)
assert_type(nn.MultiHeadAttention.new(8, 4)(x, mask=keep), ArrayLayer)
memory = ArrayWeight.normal((2, 7, 6), seed=1)
cross = nn.MultiHeadAttention.new(8, 4, kdim=6, vdim=6)
assert_type(cross(x, memory), ArrayLayer)
assert_type(cross(x * 2.0, memory, np.ones((2, 7, 6)), np.ones((5, 7), dtype=bool), causal=True), ArrayLayer)
assert_type(nn.LayerNorm.new(8)(layer(x)), ArrayLayer)
