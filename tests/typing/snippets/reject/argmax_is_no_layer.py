"""argmax gives integer indices (no gradient): not a layer to build on."""
# expect: "ndarray[tuple[Any, ...], dtype[integer[Any]]]" has no attribute "predict_blocking" [attr-defined]

import numpy as np

import monadl
from monadl import ArrayWeight

best = monadl.argmax(ArrayWeight(np.ones(3))).predict_blocking()  # error
