"""An awaited layer is its forward data, an ndarray: returning it as the layer is an error."""
# expect: Incompatible return value type (got "ndarray[
# expect: expected "ArrayLayer") [return-value]

import numpy as np

from monadl import Array, ArrayLayer, ArrayWeight, direct

w = ArrayWeight(np.ones((3, 3)))


@direct
async def f(x: Array) -> ArrayLayer:
    layer = w @ x
    v = await layer
    return v  # error
