"""A @direct function must be annotated to return a FloatLayer or an ArrayLayer."""
# expect: Value of type variable "L" of "direct" cannot be "float" [type-var]

from monadl import FloatWeight, direct

w = FloatWeight(1.0)


@direct  # error
async def f() -> float:
    return await w
