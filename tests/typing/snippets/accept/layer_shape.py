"""A layer's static shape: ``tuple[int, ...] | None`` for an array, ``()`` for a float; a weight's
is always known."""

from typing import Any, assert_type

import numpy as np

import monadl
from monadl import ArrayWeight

w = ArrayWeight(np.ones((2, 3)))
h = monadl.relu(w @ np.ones((3, 4)))
assert_type(h.shape, tuple[int, ...] | None)
assert_type(w.shape, tuple[int, ...])  # a weight's is always known
assert_type(h.dtype, Any)
assert_type(monadl.sum(h).shape, tuple[()])
assert_type(monadl.sum(h).dtype, type[float])
if h.shape is not None:
    rows, *rest = h.shape
    assert_type(rows, int)
