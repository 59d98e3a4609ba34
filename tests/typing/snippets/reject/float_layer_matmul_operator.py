"""`@` between a FloatLayer and an ArrayLayer: a float has no matrix product."""
# expect: Unsupported operand types for @ ("FloatLayer" and "ArrayLayer") [operator]

import numpy as np

from monadl import ArrayWeight, FloatWeight

f = FloatWeight(1.0) * 2.0
a = ArrayWeight(np.ones((3, 3))) * 2.0
bad = f @ a  # error
