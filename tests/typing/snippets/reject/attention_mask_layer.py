"""An attention mask is data (a NumPy array), not a layer: no delta flows into it."""
# expect: Argument 4 to "scaled_dot_product_attention" has incompatible type "ArrayLayer" [arg-type]

import monadl
from monadl import ArrayWeight

x = ArrayWeight.normal((3, 4), seed=0)
bad = monadl.scaled_dot_product_attention(x, x, x, monadl.relu(x))  # error
