"""Padding is an int, ints, "valid" or "same": not another string (the op refuses it too)."""
# expect: Argument "padding" to "conv2d" has incompatible type "Literal['SAME']"

import numpy as np

import monadl as ml

ml.conv2d(np.ones((1, 3, 5, 5)), np.ones((2, 3, 3, 3)), padding="SAME")  # error
