"""Float-typed operands (float, int, FloatWeight, FloatLayer) in every operator, in both orders:
float with float gives a FloatLayer."""

from typing import assert_type

from monadl import FloatLayer, FloatWeight

w = FloatWeight(0.5)
v = FloatWeight(2)  # an int is a float here
layer = w * 3.0
assert_type(layer, FloatLayer)

# weight with literal, both orders, float and int
assert_type(w + 1.0, FloatLayer)
assert_type(1.0 + w, FloatLayer)
assert_type(w - 1, FloatLayer)
assert_type(1 - w, FloatLayer)
assert_type(2.0 * w, FloatLayer)
assert_type(w * 2, FloatLayer)
assert_type(w / 2.0, FloatLayer)
assert_type(2 / w, FloatLayer)
assert_type(w**2, FloatLayer)
assert_type(2.0**w, FloatLayer)

# layer with literal, both orders
assert_type(layer + 1, FloatLayer)
assert_type(1.5 + layer, FloatLayer)
assert_type(layer - 0.5, FloatLayer)
assert_type(0.5 - layer, FloatLayer)
assert_type(layer * 3, FloatLayer)
assert_type(3 * layer, FloatLayer)
assert_type(layer / 4.0, FloatLayer)
assert_type(4.0 / layer, FloatLayer)
assert_type(layer**0.5, FloatLayer)
assert_type(2**layer, FloatLayer)

# weight with weight, weight with layer, layer with layer, both orders
assert_type(w + v, FloatLayer)
assert_type(w * layer, FloatLayer)
assert_type(layer * w, FloatLayer)
assert_type(w - layer, FloatLayer)
assert_type(layer - w, FloatLayer)
assert_type(layer / w, FloatLayer)
assert_type(w / layer, FloatLayer)
assert_type(w**layer, FloatLayer)
assert_type(layer**w, FloatLayer)
assert_type(layer + layer, FloatLayer)

# unary minus
assert_type(-w, FloatLayer)
assert_type(-layer, FloatLayer)

# a longer expression keeps its type
loss = (w * 2.0 - 1.0) ** 2 + 0.01 * v * v - layer / (1.0 + w)
assert_type(loss, FloatLayer)


def affine(x: float, a: FloatWeight, b: FloatWeight) -> FloatLayer:
    return a * x + b


assert_type(affine(3.0, w, v), FloatLayer)
