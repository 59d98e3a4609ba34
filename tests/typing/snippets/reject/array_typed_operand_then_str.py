"""An operand typed `monadl.Array` times a weight is a layer, so adding a str to it is an error
(it must not be Any, which would accept anything)."""
# expect: Unsupported operand types for + ("ArrayLayer" and "str") [operator]

from monadl import Array, ArrayLayer, ArrayWeight

w = ArrayWeight.normal((3, 3), seed=0)


def dense(x: Array) -> ArrayLayer:
    y: ArrayLayer = x @ w + "bias"  # error
    return y
