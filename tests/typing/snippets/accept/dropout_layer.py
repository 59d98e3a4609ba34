"""A dropout layer takes anything array-like and gives an ArrayLayer; its loss trains as any other."""

from typing import assert_type

import numpy as np
from returns.result import Result

import monadl
from monadl import ArrayLayer, ArrayWeight

drop = monadl.Dropout(0.5, seed=0)
w = ArrayWeight.normal((3, 2), seed=0)
hidden = drop(monadl.relu(np.ones((4, 3)) @ w))
assert_type(hidden, ArrayLayer)
assert_type(drop(w), ArrayLayer)
assert_type(drop(np.ones(3)), ArrayLayer)
assert_type(monadl.sum(hidden).train_blocking(monadl.SGD(0.1)), Result[float, Exception])
assert_type(monadl.is_training(), bool)
