"""A learning rate is a float or a schedule of the step, not a string."""
# expect: Argument 1 to "Adam" has incompatible type "str"; expected "float | Schedule" [arg-type]

import monadl

bad = monadl.Adam("0.001")  # error
