"""A loss with reduction="none" is an ArrayLayer (one loss per element), not a FloatLayer."""
# expect: Incompatible types in assignment (expression has type "ArrayLayer", variable has type "FloatLayer")
# expect: [assignment]

import numpy as np

import monadl as ml
from monadl import FloatLayer

mean: FloatLayer = ml.mse_loss(np.ones(3), np.zeros(3))
each: FloatLayer = ml.mse_loss(np.ones(3), np.zeros(3), reduction="none")  # error
