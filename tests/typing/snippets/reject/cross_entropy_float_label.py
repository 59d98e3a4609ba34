"""cross_entropy takes a Python int label, not a float one."""
# expect: No overload variant of "cross_entropy" matches argument types
# expect: "float" [call-overload]

import numpy as np

import monadl as ml

ml.cross_entropy(np.ones(3), 1)
ml.cross_entropy(np.ones(3), 1.0)  # error
