"""layer_norm's eps is a float."""
# expect: Argument "eps" to "layer_norm" has incompatible type "str"; expected "float" [arg-type]

import numpy as np

import monadl

bad = monadl.layer_norm(np.ones((2, 3)), eps="small")  # error
