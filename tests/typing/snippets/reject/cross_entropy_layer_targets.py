"""cross_entropy's targets are constants (arrays), not layers: no delta flows into them."""
# expect: No overload variant of "cross_entropy" matches argument types "ArrayLayer", "ArrayLayer"
# expect: [call-overload]

import numpy as np

import monadl
from monadl import ArrayWeight

logits = ArrayWeight(np.zeros((4, 2))) * 1.0
targets = ArrayWeight(np.ones((4, 2))) * 0.5
bad = monadl.cross_entropy(logits, targets)  # error
