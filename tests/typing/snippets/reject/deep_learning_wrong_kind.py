"""An array weight is not a DeepLearning witness of floats."""
# expect: Incompatible types in assignment (expression has type "ArrayWeight",
# expect: variable has type "DeepLearning[float, float]") [assignment]

import numpy as np

from monadl import ArrayWeight, DeepLearning

witness: DeepLearning[float, float] = ArrayWeight(np.ones(3))  # error
