"""The module-level predict_blocking is as precise as the method: a FloatLayer gives a float."""
# expect: Incompatible types in assignment (expression has type "Result[float, Exception]",
# expect: variable has type "Result[str, Exception]") [assignment]

from returns.result import Result

import monadl
from monadl import FloatWeight

loss = FloatWeight(1.0) * 2.0
r: Result[str, Exception] = monadl.predict_blocking(loss)  # error
