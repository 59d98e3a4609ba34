"""Prediction and training results: a typed Result (blocking) or FutureResult (asynchronous) of the
layer's kind, the paper's typed Future."""

from typing import assert_type

import numpy as np
from returns.future import FutureResult
from returns.result import Result

import monadl
from monadl import Array, ArrayWeight, FloatWeight

w = ArrayWeight.normal((3, 2), seed=0, optimizer=monadl.Adam(learning_rate=1e-3))
s = FloatWeight(1.0)
x = np.ones((4, 3))
out = x @ w
loss = monadl.mean(out * out) + s * s

assert_type(loss.predict_blocking(), Result[float, Exception])
assert_type(out.predict_blocking(), Result[Array, Exception])
assert_type(loss.train_blocking(), Result[float, Exception])
assert_type(loss.train_blocking(monadl.SGD(0.1)), Result[float, Exception])
assert_type(out.train_blocking(monadl.Momentum(learning_rate=0.01, momentum=0.9)), Result[Array, Exception])
assert_type(loss.predict(), FutureResult[float, Exception])
assert_type(out.predict(), FutureResult[Array, Exception])
assert_type(loss.train(monadl.Adagrad()), FutureResult[float, Exception])
assert_type(out.train(executor=monadl.default_executor()), FutureResult[Array, Exception])

value: float = loss.predict_blocking().value_or(float("nan"))
data: Array = out.predict_blocking().value_or(np.zeros(2))
assert_type(loss.train_blocking().map(lambda v: v * 2.0), Result[float, Exception])
