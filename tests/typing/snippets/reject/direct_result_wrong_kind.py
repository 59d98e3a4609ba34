"""A @direct function annotated to return an ArrayLayer gives an ArrayLayer to its caller."""
# expect: Incompatible types in assignment (expression has type "ArrayLayer", variable has type "FloatLayer")
# expect: [assignment]

import numpy as np

from monadl import Array, ArrayLayer, ArrayWeight, FloatLayer, direct

w = ArrayWeight.normal((3, 3), seed=0)


@direct
async def f(x: Array) -> ArrayLayer:
    return w @ x


loss: FloatLayer = f(np.ones(3))  # error
