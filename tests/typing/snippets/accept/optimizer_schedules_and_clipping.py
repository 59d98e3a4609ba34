"""Schedules, chains and frozen weights type-check where optimizers and weights do: a chain is an
optimizer, a schedule (or any function of the step) is a learning rate, and training keeps its
precise result types."""

from typing import assert_type

import numpy as np
from returns.result import Result

import monadl
from monadl import Array, ArrayWeight

w = ArrayWeight.normal((3, 2), seed=0)
frozen = ArrayWeight(np.ones((2, 2)), trainable=False)
out = np.ones((4, 3)) @ w @ frozen
loss = monadl.mean(out * out)

schedule = monadl.LinearWarmup(1e-3, 100, then=monadl.CosineDecay(1e-3, 900))
assert_type(schedule(5), float)
adam = monadl.Adam(schedule, lazy=True)
sgd = monadl.SGD(lambda step: 0.1 / (1 + step))
clipped = monadl.chain(monadl.clip_by_global_norm(1.0), monadl.clip_by_value(5.0), adam)
assert_type(clipped, monadl.Chain)
optimizer: monadl.Optimizer = clipped
assert_type(monadl.train_blocking(loss, clipped), Result[float, Exception])
assert_type(loss.train_blocking(sgd), Result[float, Exception])
assert_type(
    out.train_blocking(monadl.chain(monadl.clip_by_value(1.0), monadl.Momentum(0.1))),
    Result[Array, Exception],
)
assert_type(monadl.global_norm([1.0, np.ones(3)]), float)
assert_type(frozen.trainable, bool)
