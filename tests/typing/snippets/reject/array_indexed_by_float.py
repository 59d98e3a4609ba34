"""An array layer is indexed by ints, slices, None, ... or integer rows: not by a float."""
# expect: Invalid index type "float" for "ArrayLayer" [index]

from monadl import ArrayWeight

half = (ArrayWeight.zeros((3, 8)) * 2.0)[1.5]  # error
