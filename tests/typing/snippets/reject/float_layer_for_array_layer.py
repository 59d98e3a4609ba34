"""A FloatLayer passed where an ArrayLayer is required."""
# expect: Argument 1 to "g" has incompatible type "FloatLayer"; expected "ArrayLayer" [arg-type]

import monadl
from monadl import ArrayLayer, FloatWeight


def g(x: ArrayLayer) -> ArrayLayer:
    return monadl.relu(x)


bad = g(FloatWeight(1.0) * 2.0)  # error
