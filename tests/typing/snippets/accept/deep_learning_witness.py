"""Layers and weights are their own DeepLearning witnesses, with the Data and Delta of their kind."""

from typing import assert_type

import numpy as np

import monadl
from monadl import Array, ArrayWeight, DeepLearning, Do, FloatWeight

s = FloatWeight(1.0)
w = ArrayWeight(np.ones(3))

float_witnesses: list[DeepLearning[float, float]] = [s, s * 2.0, monadl.exp(s)]
array_witnesses: list[DeepLearning[Array, Array]] = [w, w * 2.0, monadl.exp(w), s * w]


def data_of(x: DeepLearning[float, float]) -> Do[float]:
    return x.forward.map(lambda tape: tape.data)


assert_type(data_of(s * s), Do[float])
