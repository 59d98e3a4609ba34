"""The training helpers: apply_gradients gives a Result, parameter_count an int, summary a
str, Module.to the module itself, cross_entropy a Python int label, batch norm array layers."""

from typing import Any, assert_type

import array_api_strict
import numpy as np
from returns.result import Result

import monadl as ml
from monadl.nn import BatchNorm1d, BatchNorm2d, Linear

layer = Linear.new(3, 2)
loss, grads = ml.compute_gradients(ml.cross_entropy(layer(np.ones(3)), 1))
assert_type(ml.apply_gradients(grads, ml.SGD(0.1)), Result[None, Exception])
assert_type(ml.parameter_count(layer), int)
assert_type(layer.parameter_count(trainable_only=True), int)
assert_type(ml.summary(layer), str)
assert_type(layer.to(array_api_strict), Linear)
ml.to_device(layer, np)
norm = BatchNorm2d.new(4)
assert_type(norm, BatchNorm2d)
assert_type(norm(np.ones((1, 4, 2, 2))), ml.ArrayLayer)
assert_type(BatchNorm1d.new(3, momentum=0.01), BatchNorm1d)
assert_type(ml.batch_norm(np.ones((2, 3)), np.ones(3), np.zeros(3)), ml.ArrayLayer)
staged: bool = ml.stage_buffer(norm.running_mean, np.zeros(4))
current: Any = ml.staged_data(norm.running_mean)
