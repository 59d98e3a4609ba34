"""lift of a float weight is a FloatLayer: not an ArrayLayer."""
# expect: Incompatible types in assignment (expression has type "FloatLayer", variable has type "ArrayLayer")
# expect: [assignment]

import monadl
from monadl import ArrayLayer

layer: ArrayLayer = monadl.lift(monadl.FloatWeight(1.0))  # error
