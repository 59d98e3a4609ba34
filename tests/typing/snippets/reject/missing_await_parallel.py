"""parallel() without `await` is a computation, not a tuple of values."""
# expect: object is not iterable [misc]

import numpy as np

from monadl import Array, ArrayLayer, ArrayWeight, direct, parallel

w = ArrayWeight(np.ones(3))


@direct
async def f(x: Array) -> ArrayLayer:
    _s0, _s1 = parallel(w * x, w - x)  # error
    return w * 2.0
