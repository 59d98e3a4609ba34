"""An array layer used as the array it computes, without `await`."""
# expect: Incompatible types in assignment (expression has type "ArrayLayer", variable has type "ndarray[
# expect: [assignment]

from monadl import Array, ArrayLayer, ArrayWeight, direct

w = ArrayWeight.normal((3, 3), seed=0)


@direct
async def f(x: Array) -> ArrayLayer:
    h: Array = w @ x  # error
    return w @ h
