"""apply_gradients takes the gradients (a dict of weights), not the loss they came from."""
# expect: Argument 1 to "apply_gradients" has incompatible type "FloatLayer" [arg-type]

import numpy as np

import monadl as ml

w = ml.ArrayWeight(np.ones(3))
ml.apply_gradients(ml.sum(w), ml.SGD(0.1))  # error
