"""Activations keep their operand's kind; reductions give a FloatLayer over all axes and an
ArrayLayer along an axis; argmax and argmin give integer arrays, not layers."""

from typing import assert_type

import numpy as np

import monadl
from monadl import ArrayLayer, ArrayWeight, FloatLayer, FloatWeight
from monadl.typeclasses.backend import IndexArray

w = ArrayWeight(np.zeros((3, 4)))
s = FloatWeight(0.5)

assert_type(monadl.softplus(w), ArrayLayer)
assert_type(monadl.softplus(s), FloatLayer)
assert_type(monadl.gelu(w * 2.0), ArrayLayer)
assert_type(monadl.silu(s * 2.0), FloatLayer)
assert_type(monadl.leaky_relu(w, 0.2), ArrayLayer)
assert_type(monadl.leaky_relu(1.5), FloatLayer)
assert_type(monadl.elu(np.ones(3), alpha=1.0), ArrayLayer)
assert_type(monadl.clip(w, -1.0, 1.0), ArrayLayer)
assert_type(monadl.clip(s, 0.0, 1.0), FloatLayer)

assert_type(monadl.max(w), FloatLayer)
assert_type(monadl.min(w, axis=0), ArrayLayer)
assert_type(monadl.logsumexp(w, axis=(0, 1), keepdims=True), ArrayLayer)
assert_type(monadl.var(w), FloatLayer)
assert_type(monadl.var(w, correction=1.0), FloatLayer)
assert_type(monadl.std(w, axis=-1, keepdims=True, correction=1.0), ArrayLayer)

assert_type(monadl.argmax(w), IndexArray)
assert_type(monadl.argmin(w * 1.0, axis=1, keepdims=True), IndexArray)

# where: a boolean array selects between layers, weights or constants; always an ArrayLayer
mask = np.array([True, False, True])
assert_type(monadl.where(mask, w * 2.0, 0.0), ArrayLayer)
assert_type(monadl.where(mask, s, 1.0), ArrayLayer)
