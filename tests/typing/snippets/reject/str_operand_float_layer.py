"""A str operand to an operator of a float layer."""
# expect: No overload variant of "__add__" of "FloatOperators" matches argument type "str" [operator]

from monadl import FloatWeight

layer = FloatWeight(1.0) * 2.0
bad = layer + "x"  # error
