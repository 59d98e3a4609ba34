"""The builders of monadl.nn: their constructors, calls (batchable cells keep their parameters and
result types) and weights are typed."""

from typing import assert_type

import numpy as np

import monadl
from monadl import ArrayLayer
from monadl.nn import MLP, Embedding, GRUCell, Linear, LSTMCell, Module, TreeLSTMCell

x = np.ones(3)
linear = Linear.new(3, 2, seed=np.random.default_rng(0), bias=False, std=0.1)
assert_type(linear, Linear)
assert_type(linear(x), ArrayLayer)
mlp = MLP.new([3, 4, 2], activation=monadl.tanh, dtype=np.float32)
assert_type(mlp(linear(x)), ArrayLayer)
assert_type(mlp.layers[0], Linear)
embedding = Embedding.new(10, 3, seed=1)
assert_type(embedding(np.array([1, 2])), ArrayLayer)

lstm = LSTMCell.new(3, 2)
h, c = lstm.zeros_state()
for _ in range(2):
    h, c = lstm(embedding(4), h, c)
assert_type(h, ArrayLayer)
assert_type(c, ArrayLayer)

gru = GRUCell.new(3, 2)
assert_type(gru(x, gru.zeros_state(rows=1)), ArrayLayer)

tree = TreeLSTMCell.new(3, 2)
left, right = tree.leaf(x), tree.leaf(embedding(0))
assert_type(tree.compose(*left, *right), tuple[ArrayLayer, ArrayLayer])

module: Module = tree
assert_type(module.weights()["leaf_c.w"], monadl.ArrayWeight | monadl.FloatWeight)
