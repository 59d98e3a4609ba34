"""An activation of a float-like is a FloatLayer, not an ArrayLayer."""
# expect: Incompatible types in assignment (expression has type "FloatLayer", variable has type "ArrayLayer")
# expect: [assignment]

import monadl
from monadl import ArrayLayer, FloatWeight

out: ArrayLayer = monadl.softplus(FloatWeight(1.0))  # error
