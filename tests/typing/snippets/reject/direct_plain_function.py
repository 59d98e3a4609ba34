"""@direct takes an `async def` function; a plain function is an error."""
# expect: Argument 1 to "direct" has incompatible type "Callable[[], ArrayLayer]" [arg-type]

import numpy as np

from monadl import ArrayLayer, ArrayWeight, direct

w = ArrayWeight(np.ones(3))


@direct  # error
def f() -> ArrayLayer:
    return w * 2.0
