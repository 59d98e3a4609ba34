"""AnyLayer takes layers and weights, not plain arrays (ndarray * ndarray is no layer): lift them."""
# expect: Value of type variable "AnyLayer" of "swish" cannot be "ndarray[ [type-var]

import numpy as np

import monadl as ml
from monadl import AnyLayer


def swish(x: AnyLayer) -> AnyLayer:
    return x * ml.sigmoid(x)


raw = swish(np.ones(3))  # error
lifted = swish(ml.lift_array(np.ones(3)))
