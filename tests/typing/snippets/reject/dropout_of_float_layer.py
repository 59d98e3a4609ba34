"""Dropout takes an array-like, not a float layer."""
# expect: Argument 1 to "__call__" of "Dropout" has incompatible type "FloatLayer" [arg-type]

import monadl
from monadl import FloatWeight

w = FloatWeight(1.0)
bad = monadl.Dropout(0.5)(w * 2.0)  # error
