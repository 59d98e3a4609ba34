"""A str on the left of an operator whose right operand is a weight (the reflected operator
rejects it)."""
# expect: No overload variant of "__rsub__" of "FloatOperators" matches argument type "str" [operator]

from monadl import FloatWeight

w = FloatWeight(1.0)
bad = "x" - w  # error
