"""Operands typed `monadl.Array` (a parameter so annotated, an awaited layer) mix with layers and
weights like any NumPy array: the result is an ArrayLayer, not Any."""

from typing import assert_type

import numpy as np

import monadl
from monadl import Array, ArrayLayer, ArrayWeight, FloatLayer, FloatWeight, direct

w = ArrayWeight.normal((3, 3), seed=0)
s = FloatWeight(2.0)


def dense(x: Array) -> ArrayLayer:
    y = x @ w
    assert_type(y, ArrayLayer)
    assert_type(x * w, ArrayLayer)
    assert_type(x + y, ArrayLayer)
    assert_type(x - s, ArrayLayer)
    assert_type(x / (s * 1.0), ArrayLayer)
    return y


@direct
async def residual(x: Array) -> ArrayLayer:
    h = dense(x)
    v = await h
    assert_type(v * h, ArrayLayer)
    assert_type(v @ w, ArrayLayer)
    return v + h


assert_type(residual(np.ones(3)), ArrayLayer)
assert_type(monadl.sum(dense(np.ones(3))), FloatLayer)
