"""The module-level forms of predict/train are as precise as the methods: a FloatLayer gives a
float result, an ArrayLayer an Array result."""

from typing import assert_type

import numpy as np
from returns.future import FutureResult
from returns.result import Result

import monadl
from monadl import Array, ArrayWeight

w = ArrayWeight.normal((3, 2), seed=0)
out = np.ones((4, 3)) @ w
loss = monadl.mean(out * out)

assert_type(monadl.predict_blocking(loss), Result[float, Exception])
assert_type(monadl.predict_blocking(out), Result[Array, Exception])
assert_type(monadl.train_blocking(loss, monadl.SGD(0.1)), Result[float, Exception])
assert_type(monadl.train_blocking(out, monadl.SGD(0.1)), Result[Array, Exception])
assert_type(monadl.predict(loss), FutureResult[float, Exception])
assert_type(monadl.predict(out), FutureResult[Array, Exception])
assert_type(monadl.train(loss, monadl.SGD(0.1)), FutureResult[float, Exception])
assert_type(monadl.train(out), FutureResult[Array, Exception])
