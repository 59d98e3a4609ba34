"""A schedule is a function of the step: one taking nothing is not a learning rate."""
# expect: Argument 1 to "SGD" has incompatible type "Callable[[], float]" [arg-type]

import monadl


def rate() -> float:
    return 0.1


bad = monadl.SGD(rate)  # error
