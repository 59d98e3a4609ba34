"""Ops: elementwise ops keep the operand's kind; reductions without an axis give a FloatLayer, with
an axis an ArrayLayer; matmul, shapes, softmax and losses give what they say."""

from typing import assert_type

import numpy as np

import monadl
from monadl import ArrayLayer, ArrayWeight, FloatLayer, FloatWeight

x = np.ones((4, 3))
w = ArrayWeight.normal((3, 2), seed=1)
b = ArrayWeight.zeros((2,))
s = FloatWeight(0.1)
logits = monadl.matmul(x, w) + b
assert_type(logits, ArrayLayer)
f = s * 2.0

# elementwise, float-typed
assert_type(monadl.exp(1.0), FloatLayer)
assert_type(monadl.exp(s), FloatLayer)
assert_type(monadl.log(f), FloatLayer)
assert_type(monadl.sqrt(s), FloatLayer)
assert_type(monadl.abs(f), FloatLayer)
assert_type(monadl.tanh(f), FloatLayer)
assert_type(monadl.sigmoid(2), FloatLayer)
assert_type(monadl.relu(s), FloatLayer)

# elementwise, array-typed
assert_type(monadl.exp(x), ArrayLayer)
assert_type(monadl.exp(w), ArrayLayer)
assert_type(monadl.log(logits), ArrayLayer)
assert_type(monadl.sqrt(w), ArrayLayer)
assert_type(monadl.abs(logits), ArrayLayer)
assert_type(monadl.tanh(logits), ArrayLayer)
assert_type(monadl.sigmoid(x), ArrayLayer)
assert_type(monadl.relu(logits), ArrayLayer)
assert_type(monadl.relu(w @ b), ArrayLayer)

# binary elementwise, in every kind combination
assert_type(monadl.maximum(f, 0.0), FloatLayer)
assert_type(monadl.maximum(0.0, s), FloatLayer)
assert_type(monadl.maximum(logits, 0.0), ArrayLayer)
assert_type(monadl.maximum(0.0, logits), ArrayLayer)
assert_type(monadl.minimum(s, x), ArrayLayer)
assert_type(monadl.minimum(w, b), ArrayLayer)

# reductions
assert_type(monadl.sum(logits), FloatLayer)
assert_type(monadl.sum(x), FloatLayer)
assert_type(monadl.sum(w), FloatLayer)
assert_type(monadl.sum(logits, axis=0), ArrayLayer)
assert_type(monadl.sum(logits, 1, keepdims=True), ArrayLayer)
assert_type(monadl.sum(w, axis=(0, 1)), ArrayLayer)
assert_type(monadl.mean(logits), FloatLayer)
assert_type(monadl.mean(w, axis=-1), ArrayLayer)

# products and shapes
assert_type(monadl.matmul(w, b), ArrayLayer)
assert_type(monadl.matmul(logits, np.ones(2)), ArrayLayer)
assert_type(monadl.dot(b, b), ArrayLayer)
assert_type(monadl.sum(monadl.dot(b, b)), FloatLayer)
assert_type(monadl.reshape(w, (2, 3)), ArrayLayer)
assert_type(monadl.transpose(logits), ArrayLayer)
assert_type(monadl.transpose(w, (1, 0)), ArrayLayer)
assert_type(monadl.concatenate([logits, w, np.zeros((1, 2))]), ArrayLayer)
assert_type(monadl.take_rows(w, [0, 2]), ArrayLayer)
assert_type(monadl.take_rows(x, np.array([3, 3])), ArrayLayer)
assert_type(monadl.take_rows(w, np.arange(2)), ArrayLayer)
assert_type(monadl.take_rows(w, 1), ArrayLayer)
assert_type(monadl.take_rows(w, np.int64(1)), ArrayLayer)  # one NumPy integer (an argmax, a row of ids)
assert_type(w[np.argmax(np.zeros(3))], ArrayLayer)

# softmax and losses
assert_type(monadl.softmax(logits), ArrayLayer)
assert_type(monadl.log_softmax(logits, axis=1), ArrayLayer)
labels = np.array([0, 1, 1, 0])
assert_type(monadl.cross_entropy(logits, labels), FloatLayer)
assert_type(monadl.cross_entropy(logits, np.eye(2)[labels]), FloatLayer)
assert_type(monadl.cross_entropy(logits, np.arange(4) % 2), FloatLayer)
assert_type(monadl.cross_entropy(logits, np.zeros((4, 2), dtype=np.float32)), FloatLayer)
loss = monadl.cross_entropy(logits, labels) + 1e-4 * monadl.sum(w * w)
assert_type(loss, FloatLayer)

# lifting: see lifting.py
