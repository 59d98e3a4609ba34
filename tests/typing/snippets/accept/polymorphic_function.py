"""One ad hoc polymorphic differentiable function, called with every mix of NumPy array,
ArrayWeight and ArrayLayer. mypy cannot pick an operator on a union that includes ndarray
(ndarray * ndarray is an ndarray), so the raw operand is lifted once, as DESIGN.md says."""

from typing import assert_type

import numpy as np

import monadl
from monadl import AnyArray, ArrayLayer, ArrayWeight


def f(a: AnyArray, b: AnyArray) -> ArrayLayer:
    la = monadl.lift_array(a)
    return la * b + la


x = np.ones(3)
w = ArrayWeight(np.zeros(3))
layer = w * 2.0

assert_type(f(x, x), ArrayLayer)
assert_type(f(x, w), ArrayLayer)
assert_type(f(x, layer), ArrayLayer)
assert_type(f(w, x), ArrayLayer)
assert_type(f(w, w), ArrayLayer)
assert_type(f(w, layer), ArrayLayer)
assert_type(f(layer, x), ArrayLayer)
assert_type(f(layer, w), ArrayLayer)
assert_type(f(layer, layer), ArrayLayer)

# composes with itself and with ops
assert_type(f(f(x, w), np.zeros(3, dtype=np.float32)), ArrayLayer)
assert_type(monadl.sum(f(layer, x)), monadl.FloatLayer)
