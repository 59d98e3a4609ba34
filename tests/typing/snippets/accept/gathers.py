"""take_along_axis and advanced indexing give array layers."""

from typing import assert_type

import numpy as np

import monadl
from monadl import ArrayLayer, ArrayWeight

w = ArrayWeight(np.zeros((3, 4)))
labels = np.array([[0], [3], [1]])

assert_type(monadl.take_along_axis(w, labels, axis=1), ArrayLayer)
assert_type(monadl.take_along_axis(w * 2.0, [[0, 1]], axis=0), ArrayLayer)
assert_type(w[[0, 2], [1, 3]], ArrayLayer)
assert_type((w * 2.0)[:, np.array([0, 0])], ArrayLayer)
assert_type(w[np.ones((3, 4), dtype=bool)], ArrayLayer)
