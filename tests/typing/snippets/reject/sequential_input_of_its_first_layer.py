"""A Sequential takes what its first layer takes: an embedding's indices, not a string."""
# expect: Argument 1 to "__call__" of "Sequential" has incompatible type "str" [arg-type]

from monadl import nn

tokens = nn.Sequential(nn.Embedding.new(10, 4), nn.Linear.new(4, 2))
bad = tokens("the cat")  # error
