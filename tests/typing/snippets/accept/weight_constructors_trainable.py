"""A frozen weight made by a class method, as by the constructor: ``trainable=False``."""

from typing import assert_type

import numpy as np

import monadl as ml

assert_type(ml.ArrayWeight(np.zeros(3), trainable=False), ml.ArrayWeight)
assert_type(ml.ArrayWeight.zeros((3,), trainable=False), ml.ArrayWeight)
assert_type(ml.ArrayWeight.normal((3, 2), seed=0, trainable=False), ml.ArrayWeight)
