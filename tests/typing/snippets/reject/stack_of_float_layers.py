"""stack joins array operands: a float layer is none."""
# expect: List item 1 has incompatible type "FloatLayer" [list-item]

import monadl
from monadl import ArrayWeight, FloatWeight

both = monadl.stack([ArrayWeight.zeros((2,)), FloatWeight(1.0) * 2.0])  # error
