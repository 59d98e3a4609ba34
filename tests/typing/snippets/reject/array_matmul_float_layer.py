"""`@` between a NumPy array and a FloatLayer: a float has no matrix product."""
# expect: No overload variant of "__matmul__" of "ndarray" matches argument type "FloatLayer" [operator]

import numpy as np

from monadl import FloatWeight

bad = np.ones((3, 3)) @ (FloatWeight(1.0) * 2.0)  # error
