"""An LSTM's final state is a pair (h, c), not one layer as a GRU's."""
# expect: Incompatible types in assignment [assignment]

import numpy as np

from monadl import ArrayLayer
from monadl.nn import LSTM

state: ArrayLayer = LSTM.new(3, 4)([np.ones((2, 3))]).states[0][0]  # error
