"""An ArrayWeight holds a float array (at run time, an integer array raises TypeError)."""
# expect: Argument 1 to "ArrayWeight" has incompatible type "ndarray[tuple[int], dtype[signedinteger[
# expect: [arg-type]

import numpy as np

from monadl import ArrayWeight

bad = ArrayWeight(np.arange(3))  # error
