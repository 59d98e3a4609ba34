"""A @batchable operation keeps its parameters and its result type, as a function and as a method
(where the bound object is not a parameter)."""

from dataclasses import dataclass
from typing import assert_type

import numpy as np

import monadl
from monadl import AnyArray, ArrayLayer, ArrayWeight, FloatLayer, FloatWeight

w = ArrayWeight.normal((3, 3), seed=0)
b = ArrayWeight.zeros((3,))
s = FloatWeight(0.5)


@monadl.batchable
def dense(x: AnyArray, weight: ArrayWeight) -> ArrayLayer:
    return monadl.tanh(monadl.linear(x, weight, b))


@monadl.batchable
def gates(x: ArrayLayer, h: ArrayLayer) -> tuple[ArrayLayer, ArrayLayer]:
    return monadl.sigmoid(x) * h, monadl.tanh(x)


@monadl.batchable
def mix(a: FloatLayer, c: FloatLayer) -> FloatLayer:
    return monadl.tanh(a * s + c)


@dataclass(frozen=True)
class Cell:
    w: ArrayWeight

    @monadl.batchable
    def step(self, x: ArrayLayer) -> ArrayLayer:
        return monadl.relu(x @ self.w)


h = dense(np.ones(3), w)
assert_type(h, ArrayLayer)
assert_type(dense(h, weight=w), ArrayLayer)
out, z = gates(h, h)
assert_type(out, ArrayLayer)
assert_type(z, ArrayLayer)
assert_type(mix(s * 1.0, monadl.sum(z)), FloatLayer)
assert_type(Cell(w).step(out), ArrayLayer)
assert_type(monadl.sum(Cell(w).step(h)) + mix(s * 2.0, s * 3.0), FloatLayer)
