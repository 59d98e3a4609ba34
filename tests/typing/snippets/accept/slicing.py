"""Slicing, splitting and stacking array layers and weights give array layers; split gives a tuple
of them, unpacked into gates."""

from typing import assert_type

import numpy as np

import monadl
from monadl import ArrayLayer, ArrayWeight

w = ArrayWeight.normal((3, 8), seed=1)
z = w * 2.0

# basic indexing
assert_type(w[:, 2:4], ArrayLayer)
assert_type(z[1:], ArrayLayer)
assert_type(z[..., -1], ArrayLayer)
assert_type(z[None, 1, ::-2], ArrayLayer)
assert_type(w[-1], ArrayLayer)
assert_type(w[np.int64(0), :], ArrayLayer)
# rows (an embedding lookup), as before
assert_type(w[[0, 2]], ArrayLayer)
assert_type(w[np.arange(2)], ArrayLayer)

# split and stack
assert_type(monadl.split(z, 4, axis=-1), tuple[ArrayLayer, ...])
i, f, o, u = monadl.split(z, 4, axis=-1)
assert_type(i, ArrayLayer)
assert_type(monadl.split(w, [1, 5], axis=1), tuple[ArrayLayer, ...])
assert_type(monadl.split(np.ones((4, 2)), np.array([1, 3])), tuple[ArrayLayer, ...])
assert_type(monadl.stack([i, f, w[0]], axis=-1), ArrayLayer)
assert_type(monadl.stack((z, np.ones((3, 8)))), ArrayLayer)
