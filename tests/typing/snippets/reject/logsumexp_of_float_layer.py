"""logsumexp reduces an array; a FloatLayer is already a float."""
# expect: No overload variant of "logsumexp" matches argument type "FloatLayer" [call-overload]

import monadl
from monadl import FloatWeight

bad = monadl.logsumexp(FloatWeight(1.0) * 2.0)  # error
