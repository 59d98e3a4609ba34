"""The attention module's fourth argument is the mask, data (an array), not a layer."""
# expect: Argument 4 to "__call__" of "MultiHeadAttention" has incompatible type "ArrayLayer" [arg-type]

import monadl
from monadl import ArrayWeight, nn

x = ArrayWeight.normal((3, 8), seed=0)
memory = ArrayWeight.normal((5, 8), seed=1)
bad = nn.MultiHeadAttention.new(8, 2)(x, memory, memory, monadl.relu(x))  # error
