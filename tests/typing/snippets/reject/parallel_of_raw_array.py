"""parallel() evaluates layers and weights; a raw array has nothing to evaluate."""
# expect: No overload variant of "parallel" matches argument types [call-overload]

import numpy as np

from monadl import Array, ArrayLayer, ArrayWeight, direct, parallel

w = ArrayWeight(np.ones(3))


@direct
async def f(x: Array) -> ArrayLayer:
    pair = await parallel(x, w)  # error
    return w * 2.0
