"""cross_entropy takes a Python int label, not a float one."""
# expect: Argument 2 to "cross_entropy" has incompatible type "float" [arg-type]

import numpy as np

import monadl as ml

ml.cross_entropy(np.ones(3), 1)
ml.cross_entropy(np.ones(3), 1.0)  # error
