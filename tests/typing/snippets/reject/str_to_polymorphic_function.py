"""A str passed to a polymorphic differentiable function typed on AnyArray."""
# expect: Argument 1 to "f" has incompatible type "str" [arg-type]

import numpy as np

import monadl
from monadl import AnyArray, ArrayLayer


def f(a: AnyArray, b: AnyArray) -> ArrayLayer:
    la = monadl.lift_array(a)
    return la * b + la


bad = f("x", np.ones(3))  # error
