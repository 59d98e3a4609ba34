"""What AnyLayer gives for a weight is its kind's base, which has no predict: lift it first."""
# expect: "FloatOperators" has no attribute "predict_blocking" [attr-defined]

import monadl as ml
from monadl import AnyLayer


def swish(x: AnyLayer) -> AnyLayer:
    return x * ml.sigmoid(x)


s = ml.FloatWeight(1.0)
value = swish(s).predict_blocking()  # error
lifted = ml.lift(swish(s)).predict_blocking()
