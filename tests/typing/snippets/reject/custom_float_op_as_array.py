"""A custom op made with result=FloatLayer gives a FloatLayer: not where an ArrayLayer is wanted."""
# expect: Incompatible types in assignment (expression has type "FloatLayer",
# expect: variable has type "ArrayLayer") [assignment]

import monadl as ml

cube = ml.custom_op(
    "cube", forward=lambda xp, s: s**3, vjps=(lambda xp, d, out, s: 3 * s * s * d,), result=ml.FloatLayer
)
y: ml.ArrayLayer = cube(2.0)  # error
