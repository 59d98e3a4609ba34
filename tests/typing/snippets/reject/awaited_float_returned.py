"""An awaited float layer is a float: returning it as the layer is an error."""
# expect: Incompatible return value type (got "float", expected "FloatLayer") [return-value]

from monadl import FloatLayer, FloatWeight, direct

w = FloatWeight(1.0)


@direct
async def f(x: float) -> FloatLayer:
    v = await (w * x)
    return v  # error
