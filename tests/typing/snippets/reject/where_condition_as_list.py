"""where's condition is a boolean array, not a list."""
# expect: Argument 1 to "where" has incompatible type "list[bool]" [arg-type]

import numpy as np

import monadl
from monadl import ArrayWeight

picked = monadl.where([True, False], ArrayWeight(np.ones(2)), 0.0)  # error
