"""An awaited layer is an ndarray, which has no predict_blocking()."""
# expect: has no attribute "predict_blocking" [attr-defined]

import numpy as np

from monadl import Array, ArrayLayer, ArrayWeight, direct

w = ArrayWeight(np.ones((3, 3)))


@direct
async def f(x: Array) -> ArrayLayer:
    layer = w @ x
    v = await layer
    v.predict_blocking()  # error
    return layer
