"""max along an axis is an ArrayLayer, not a FloatLayer."""
# expect: Incompatible types in assignment (expression has type "ArrayLayer", variable has type "FloatLayer")
# expect: [assignment]

import numpy as np

import monadl
from monadl import ArrayWeight, FloatLayer

top: FloatLayer = monadl.max(ArrayWeight(np.ones((2, 3))), axis=0)  # error
