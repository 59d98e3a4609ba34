"""A pooling window is an int or ints, not a string."""
# expect: Argument 2 to "max_pool2d" has incompatible type "str"

import numpy as np

import monadl as ml

ml.max_pool2d(np.ones((1, 3, 4, 4)), "2")  # error
