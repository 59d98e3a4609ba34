"""Each lift says what it gives: lift_float a FloatLayer, lift_array an ArrayLayer, and lift the
layer of its operand's kind (a union of kinds gives a union of layers)."""

from typing import assert_type

import numpy as np

import monadl
from monadl import AnyArray, AnyFloat, ArrayLayer, ArrayWeight, FloatLayer, FloatWeight

x = np.ones((4, 3))
w = ArrayWeight.normal((3, 2), seed=1)
s = FloatWeight(0.5)
f = s * 2.0
a = x @ w

assert_type(monadl.lift_float(1.0), FloatLayer)
assert_type(monadl.lift_float(3), FloatLayer)
assert_type(monadl.lift_float(s), FloatLayer)
assert_type(monadl.lift_float(f), FloatLayer)

assert_type(monadl.lift_array(x), ArrayLayer)
assert_type(monadl.lift_array(np.zeros(2, dtype=np.float32)), ArrayLayer)
assert_type(monadl.lift_array(w), ArrayLayer)
assert_type(monadl.lift_array(a), ArrayLayer)

assert_type(monadl.lift(1.0), FloatLayer)
assert_type(monadl.lift(s), FloatLayer)
assert_type(monadl.lift(f), FloatLayer)
assert_type(monadl.lift(x), ArrayLayer)
assert_type(monadl.lift(w), ArrayLayer)
assert_type(monadl.lift(a), ArrayLayer)


def either(v: AnyFloat | AnyArray) -> FloatLayer | ArrayLayer:
    return monadl.lift(v)


def of_floats(v: AnyFloat) -> FloatLayer:
    return monadl.lift(v)


def of_arrays(v: AnyArray) -> ArrayLayer:
    return monadl.lift(v)


# a raw array on the left of an operator, lifted: a layer, not an ndarray
assert_type(monadl.lift_array(x) * a, ArrayLayer)
assert_type(monadl.lift(x) * a, ArrayLayer)
# a lifted layer has predict and train
assert_type(monadl.lift(s).predict_blocking().unwrap(), float)
