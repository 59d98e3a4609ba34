"""A layer used as the float it computes, without `await`."""
# expect: Incompatible types in assignment (expression has type "FloatLayer", variable has type "float")
# expect: [assignment]

import monadl
from monadl import ArrayLayer, ArrayWeight, direct

w = ArrayWeight.normal((3,), seed=0)


@direct
async def f(x: ArrayLayer) -> ArrayLayer:
    score: float = monadl.sum(w * x)  # error
    return x * score
