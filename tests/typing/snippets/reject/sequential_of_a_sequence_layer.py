"""A Sequential's later layers take an ArrayLayer and give one: a sequence layer does not."""
# expect: Argument 2 to "Sequential" has incompatible type "LSTM"; expected
# expect: "Callable[[ArrayLayer], ArrayLayer]" [arg-type]

from monadl import nn

bad = nn.Sequential(nn.Linear.new(3, 4), nn.LSTM.new(4, 2))  # error
