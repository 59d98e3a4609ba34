"""A @direct function keeps its parameters' types: a str where it takes an array is an error."""
# expect: Argument 1 to "f" has incompatible type "str" [arg-type]

from monadl import Array, ArrayLayer, ArrayWeight, direct

w = ArrayWeight.normal((3, 3), seed=0)


@direct
async def f(x: Array) -> ArrayLayer:
    return w @ x


bad = f("x")  # error
