"""Unary plus returns its operand, typed as such: `+x` can stand wherever `x` can."""

from typing import assert_type

import numpy as np

from monadl import ArrayLayer, ArrayWeight, FloatLayer, FloatWeight

s = FloatWeight(1.0)
w = ArrayWeight(np.ones(3))
assert_type(+s, FloatWeight)
assert_type(+(s * 2.0), FloatLayer)
assert_type(+w, ArrayWeight)
assert_type(+(w * 2.0), ArrayLayer)


def identity(x: ArrayLayer) -> ArrayLayer:
    return +x
