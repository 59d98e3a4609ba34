"""A float weight times an array is an ArrayLayer, not a FloatLayer."""
# expect: Incompatible types in assignment (expression has type "ArrayLayer", variable has type "FloatLayer")
# expect: [assignment]

import numpy as np

from monadl import FloatLayer, FloatWeight

loss: FloatLayer = FloatWeight(1.0) * np.ones(3)  # error
