"""A shape rule gives a tuple of ints: a list is no shape."""
# expect: Argument "shape_rule" to "custom_op" has incompatible type "Callable[[Any], list[Any]]" [arg-type]

import monadl as ml

identity = ml.custom_op(
    "identity",
    forward=lambda xp, x: x,
    vjps=(lambda xp, d, out, x: d,),
    shape_rule=lambda x: list(x),  # error
)
