"""A layer compared with a float without `await`: its value is lazy, only `await` gives it."""
# expect: Unsupported operand types for < ("float" and "FloatLayer") [operator]

import monadl
from monadl import ArrayLayer, ArrayWeight, direct

w = ArrayWeight.normal((3,), seed=0)


@direct
async def f(x: ArrayLayer) -> ArrayLayer:
    gate = monadl.sigmoid(monadl.sum(w * x))
    if gate > 0.5:  # error
        return x
    return -x
