"""A FloatLayer passed to matmul, which takes arrays only."""
# expect: Argument 1 to "matmul" has incompatible type "FloatLayer" [arg-type]

import numpy as np

import monadl
from monadl import FloatWeight

bad = monadl.matmul(FloatWeight(1.0) * 2.0, np.ones((3, 3)))  # error
