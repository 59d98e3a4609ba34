"""split takes a number of sections or a sequence of indices: not a float."""
# expect: Argument 2 to "split" has incompatible type "float" [arg-type]

import monadl
from monadl import ArrayWeight

gates = monadl.split(ArrayWeight.zeros((3, 8)), 4.0, axis=-1)  # error
