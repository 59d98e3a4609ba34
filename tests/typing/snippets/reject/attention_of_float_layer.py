"""Attention takes array-likes, not a float layer."""
# expect: Argument 1 to "scaled_dot_product_attention" has incompatible type "FloatLayer" [arg-type]

import numpy as np

import monadl
from monadl import FloatWeight

w = FloatWeight(1.0)
k = np.ones((3, 4))
bad = monadl.scaled_dot_product_attention(w * 2.0, k, k)  # error
