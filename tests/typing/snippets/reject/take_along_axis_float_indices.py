"""take_along_axis's indices are integers, not a float."""
# expect: Argument 2 to "take_along_axis" has incompatible type "float" [arg-type]

import numpy as np

import monadl
from monadl import ArrayWeight

picked = monadl.take_along_axis(ArrayWeight(np.ones((2, 2))), 1.0, axis=0)  # error
