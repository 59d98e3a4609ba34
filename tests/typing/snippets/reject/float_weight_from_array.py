"""A FloatWeight holds a float, not an array."""
# expect: Argument 1 to "FloatWeight" has incompatible type "ndarray[ [arg-type]

import numpy as np

from monadl import FloatWeight

bad = FloatWeight(np.zeros(3))  # error
