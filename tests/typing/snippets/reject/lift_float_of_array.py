"""lift_float lifts floats only: an array is lift_array's (or lift's)."""
# expect: Argument 1 to "lift_float" has incompatible type "ndarray[ [arg-type]

import numpy as np

import monadl

layer = monadl.lift_float(np.ones(3))  # error
