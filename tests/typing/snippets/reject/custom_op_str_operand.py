"""A custom op applies to layers, weights, arrays and floats: a str is none of them."""
# expect: Argument 1 to "__call__" of "CustomOp" has incompatible type "str" [arg-type]

import monadl as ml

square = ml.custom_op("square", forward=lambda xp, x: x * x, vjps=(lambda xp, d, out, x: 2.0 * x * d,))
y = square("x")  # error
