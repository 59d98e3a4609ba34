"""A nonlinearity's gain is asked by one of the names PyTorch's table knows."""
# expect: Argument 1 to "calculate_gain" has incompatible type "Literal['swish']" [arg-type]

from monadl.nn import init

gain = init.calculate_gain("swish")  # error
