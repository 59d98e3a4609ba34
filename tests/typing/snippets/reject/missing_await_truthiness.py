"""A layer tested for truth without `await`: its truth value is its lazy forward value (at run
time, bool() raises TypeError), so the branch can never be taken."""
# expect: Statement is unreachable [unreachable]

import monadl
from monadl import ArrayLayer, ArrayWeight, direct

w = ArrayWeight.normal((3,), seed=0)


@direct
async def f(x: ArrayLayer) -> ArrayLayer:
    if monadl.sum(w * x):
        return x  # error
    return -x  # error
