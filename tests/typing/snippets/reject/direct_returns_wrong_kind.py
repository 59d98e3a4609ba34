"""A @direct function annotated to return an ArrayLayer returns a FloatLayer."""
# expect: Incompatible return value type (got "FloatLayer", expected "ArrayLayer") [return-value]

import monadl
from monadl import Array, ArrayLayer, ArrayWeight, direct

w = ArrayWeight.normal((3,), seed=0)


@direct
async def f(x: Array) -> ArrayLayer:
    return monadl.sum(w * x)  # error
