"""A str operand to an operator of an array layer."""
# expect: Unsupported operand types for * ("ArrayLayer" and "str") [operator]

import numpy as np

from monadl import ArrayWeight

layer = ArrayWeight(np.zeros(3)) * 2.0
bad = layer * "x"  # error
