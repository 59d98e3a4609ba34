"""A @batchable operation keeps its parameters' types: a str where it takes a layer is an error
(the decorator must not erase the signature to Any)."""
# expect: Argument 1 to "cell" has incompatible type "str"; expected "ArrayLayer" [arg-type]

import monadl
from monadl import ArrayLayer, ArrayWeight

w = ArrayWeight.normal((3, 3), seed=0)


@monadl.batchable
def cell(x: ArrayLayer) -> ArrayLayer:
    return monadl.tanh(x @ w)


bad = cell("x")  # error
