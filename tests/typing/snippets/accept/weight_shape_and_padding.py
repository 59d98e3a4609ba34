"""A weight's shape is always known (a layer's may be None); padding takes ints, "valid" and
"same"; a sequence layer takes lists of steps and 2-D arrays."""

from typing import assert_type

import numpy as np

import monadl as ml
from monadl import ArrayWeight, FloatWeight, nn

w = ArrayWeight.zeros((3, 4))
shape: tuple[int, ...] = w.shape
assert_type(w.shape, tuple[int, ...])
assert_type(FloatWeight(1.0).shape, tuple[()])
assert_type(ml.relu(w).shape, tuple[int, ...] | None)

x, k = np.ones((1, 3, 5, 5)), ArrayWeight.zeros((2, 3, 3, 3))
for padding in (1, (1, 0), "valid", "same"):
    ml.conv2d(x, k, padding=padding)
nn.Conv1d.new(3, 2, 3, padding="same")

lstm = nn.LSTM.new(3, 2)
lstm([np.ones((4, 3)), [np.ones(3), w[0, :3]], (ArrayWeight.zeros((3,)),)])
