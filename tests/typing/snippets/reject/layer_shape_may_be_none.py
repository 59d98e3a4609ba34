"""A layer's shape may be unknown (None) before it runs: it must be checked before it is indexed."""
# expect: Value of type "tuple[int, ...] | None" is not indexable [index]

import numpy as np

import monadl

h = monadl.relu(monadl.lift_array(np.ones((2, 3))))
rows = h.shape[0]  # error
