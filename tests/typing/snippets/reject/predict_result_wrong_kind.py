"""An ArrayLayer's prediction is an array result, not a float result."""
# expect: Incompatible types in assignment (expression has type "Result[ndarray[ [assignment]

import numpy as np
from returns.result import Result

from monadl import ArrayWeight

out = ArrayWeight(np.ones(3)) * 2.0
r: Result[float, Exception] = out.predict_blocking()  # error
