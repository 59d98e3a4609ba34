"""A loss's reduction is "mean", "sum" or "none": another string is no reduction."""
# expect: No overload variant of "cross_entropy" matches argument types [call-overload]

import numpy as np

import monadl as ml

ml.cross_entropy(np.ones((2, 3)), np.array([0, 1]), reduction="sum")
ml.cross_entropy(np.ones((2, 3)), np.array([0, 1]), reduction="avg")  # error
