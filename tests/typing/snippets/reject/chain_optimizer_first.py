"""A chain's gradient transformations come first and its optimizer last."""
# expect: No overload variant of "chain" matches argument types "Adam", "ClipByGlobalNorm" [call-overload]

import monadl

bad = monadl.chain(monadl.Adam(1e-3), monadl.clip_by_global_norm(1.0))  # error
