"""A weight's data has its kind's type: a float for a FloatWeight, an Array for an ArrayWeight."""

from typing import assert_type

import numpy as np

from monadl import Array, ArrayWeight, FloatWeight

s = FloatWeight(1.0)
w = ArrayWeight(np.ones(3))
assert_type(s.data, float)
assert_type(w.data, Array)
