"""A custom op's shape rule is a function of the operands' shapes, not the result's shape itself."""
# expect: No overload variant of "custom_op" matches argument types
# expect: "tuple[int]" [call-overload]

import monadl as ml

square = ml.custom_op(  # error
    "square", forward=lambda xp, x: x * x, vjps=(lambda xp, d, out, x: 2.0 * x * d,), shape_rule=(3,)
)
