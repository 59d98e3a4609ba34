"""A type variable of the layer types alone rejects weights (a FloatWeight is no FloatLayer): type
such functions with monadl.AnyLayer, which takes them."""
# expect: Value of type variable "L" of "swish" cannot be "FloatWeight" [type-var]

from typing import TypeVar

import monadl as ml
from monadl import ArrayLayer, FloatLayer

L = TypeVar("L", FloatLayer, ArrayLayer)


def swish(x: L) -> L:
    return x * ml.sigmoid(x)


y = swish(ml.FloatWeight(1.0))  # error
