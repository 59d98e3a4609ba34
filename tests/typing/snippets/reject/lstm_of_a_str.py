"""A sequence layer takes a list of sequences (lists of steps, or 2-D arrays), not a string."""
# expect: Argument 1 to "__call__" of "LSTM" has incompatible type "str"

from monadl import nn

nn.LSTM.new(3, 4)("hello")  # error
