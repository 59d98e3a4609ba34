"""Array-typed operands (NumPy arrays, ArrayWeight, ArrayLayer) in every operator, in both orders,
with each other and with float-typed operands: anything with an array gives an ArrayLayer."""

from typing import assert_type

import numpy as np

from monadl import ArrayLayer, ArrayWeight, FloatLayer, FloatWeight

x = np.ones(3)
m = np.zeros((3, 3))
w = ArrayWeight(np.zeros((3, 3)))
b = ArrayWeight.zeros((3,))
layer = w @ x
assert_type(layer, ArrayLayer)
s = FloatWeight(1.0)
f = s * 2.0
assert_type(f, FloatLayer)

# NumPy array with weight and with layer, both orders
assert_type(x + b, ArrayLayer)
assert_type(b + x, ArrayLayer)
assert_type(np.ones(3) * layer, ArrayLayer)
assert_type(layer * np.ones(3), ArrayLayer)
assert_type(x - layer, ArrayLayer)
assert_type(layer - x, ArrayLayer)
assert_type(x / b, ArrayLayer)
assert_type(b / x, ArrayLayer)
assert_type(x**layer, ArrayLayer)
assert_type(layer**x, ArrayLayer)
assert_type(m @ w, ArrayLayer)
assert_type(w @ m, ArrayLayer)
assert_type(m @ layer, ArrayLayer)
assert_type(layer @ x, ArrayLayer)

# float and int literals with array weights and layers, both orders
assert_type(2.0 * w, ArrayLayer)
assert_type(w * 2, ArrayLayer)
assert_type(1 + layer, ArrayLayer)
assert_type(layer + 1.0, ArrayLayer)
assert_type(1.0 - b, ArrayLayer)
assert_type(b / 2, ArrayLayer)
assert_type(1 / layer, ArrayLayer)
assert_type(layer**2, ArrayLayer)
assert_type(2.0**b, ArrayLayer)

# float weights and float layers with arrays, both orders
assert_type(s * x, ArrayLayer)
assert_type(x * s, ArrayLayer)
assert_type(np.ones(3) * f, ArrayLayer)
assert_type(f + x, ArrayLayer)
assert_type(s * w, ArrayLayer)
assert_type(w * s, ArrayLayer)
assert_type(f - layer, ArrayLayer)
assert_type(layer - f, ArrayLayer)
assert_type(f / b, ArrayLayer)
assert_type(b**f, ArrayLayer)
assert_type(s**layer, ArrayLayer)

# weight with weight, weight with layer, layer with layer, both orders
assert_type(w + w, ArrayLayer)
assert_type(b * layer, ArrayLayer)
assert_type(layer * b, ArrayLayer)
assert_type(w @ b, ArrayLayer)
assert_type(layer @ w, ArrayLayer)
assert_type(layer / layer, ArrayLayer)

# unary minus
assert_type(-w, ArrayLayer)
assert_type(-layer, ArrayLayer)

# other float dtypes are arrays too
assert_type(np.zeros(3, dtype=np.float32) * layer, ArrayLayer)
assert_type(layer + np.ones((2, 3), dtype=np.float32), ArrayLayer)

# a dense layer
hidden = w @ x + b
assert_type(hidden, ArrayLayer)
assert_type(-(hidden * s) + 0.5 * x, ArrayLayer)

# rows of a weight (an embedding lookup)
assert_type(w[[0, 2]], ArrayLayer)
assert_type(w[np.array([1, 1])], ArrayLayer)
assert_type(w[np.arange(2)], ArrayLayer)
assert_type(layer[0], ArrayLayer)
