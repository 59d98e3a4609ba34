"""lift_array lifts arrays only: a float weight is lift_float's (or lift's)."""
# expect: Argument 1 to "lift_array" has incompatible type "FloatWeight" [arg-type]

import monadl

s = monadl.FloatWeight(1.0)
layer = monadl.lift_array(s)  # error
