"""AnyLayer's operands are of one kind: a float weight and an array layer together are rejected."""
# expect: Value of type variable "AnyLayer" of "blend" cannot be [type-var]

import numpy as np

import monadl as ml
from monadl import AnyLayer


def blend(a: AnyLayer, b: AnyLayer) -> AnyLayer:
    return a * 0.5 + b * 0.5


mixed = blend(ml.FloatWeight(1.0), np.ones((2, 3)) @ ml.ArrayWeight.zeros((3, 2)))  # error
