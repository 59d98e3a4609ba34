"""A convolution module's padding is typed as the op's: "full" is none of its strings."""
# expect: Argument "padding" to "new" of "Conv2d" has incompatible type "Literal['full']"

from monadl import nn

nn.Conv2d.new(3, 4, 3, padding="full")  # error
