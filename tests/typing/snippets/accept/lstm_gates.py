"""lstm_c, lstm_h, tree_lstm_c and gru_h take array-likes (layers, weights, arrays) and give ArrayLayers."""

from typing import assert_type

import numpy as np

import monadl
from monadl import ArrayLayer, ArrayWeight

i = ArrayWeight.normal((2, 4), seed=0)
c = monadl.lstm_c(i, i * 2.0, np.zeros((2, 4)), np.zeros(4))
assert_type(c, ArrayLayer)
assert_type(monadl.lstm_h(i, c), ArrayLayer)
assert_type(monadl.tree_lstm_c(i, i, i, np.zeros((2, 4)), c, np.zeros(4)), ArrayLayer)
assert_type(monadl.gru_h(i, i, np.zeros((2, 4)), i * 0.5, c), ArrayLayer)
