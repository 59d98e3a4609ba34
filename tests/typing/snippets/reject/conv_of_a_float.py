"""A convolution's input is an array: a float weight is refused."""
# expect: Argument 1 to "conv2d" has incompatible type "FloatWeight"

import monadl as ml
from monadl import ArrayWeight, FloatWeight

ml.conv2d(FloatWeight(1.0), ArrayWeight.zeros((4, 3, 3, 3)))  # error
