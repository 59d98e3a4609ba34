"""A str passed to an op."""
# expect: No overload variant of "exp" matches argument type "str" [call-overload]

import monadl

bad = monadl.exp("x")  # error
