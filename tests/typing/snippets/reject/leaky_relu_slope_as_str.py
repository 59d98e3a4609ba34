"""leaky_relu's slope is a float."""
# expect: No overload variant of "leaky_relu" matches argument types "ArrayWeight", "str" [call-overload]

import numpy as np

import monadl
from monadl import ArrayWeight

bad = monadl.leaky_relu(ArrayWeight(np.ones(3)), "0.1")  # error
