"""lstm_h's operands are arrays: a Python float is no gate."""
# expect: Argument 1 to "lstm_h" has incompatible type "float" [arg-type]

import numpy as np

import monadl

bad = monadl.lstm_h(0.5, np.zeros(3))  # error
