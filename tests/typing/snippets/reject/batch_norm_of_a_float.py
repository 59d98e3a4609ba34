"""A batch norm layer normalises arrays, not floats."""
# expect: Argument 1 to "__call__" of "_BatchNorm" has incompatible type "float" [arg-type]

from monadl.nn import BatchNorm1d

BatchNorm1d.new(3)(1.0)  # error
