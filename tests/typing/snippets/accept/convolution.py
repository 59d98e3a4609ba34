"""Convolution and pooling take arrays, weights and layers, and give array layers; the modules too."""

from typing import assert_type

import numpy as np

import monadl as ml
from monadl import ArrayLayer, ArrayWeight, nn

x = np.ones((2, 3, 8, 8))
w = ArrayWeight.zeros((4, 3, 3, 3))
b = ArrayWeight.zeros((4,))
y = ml.conv2d(x, w, b, stride=(1, 2), padding="same", dilation=1, groups=1)
assert_type(y, ArrayLayer)
assert_type(ml.conv2d(y, w, padding=(1, 0)), ArrayLayer)
assert_type(ml.conv2d(x, w, 0.5), ArrayLayer)
assert_type(ml.conv1d(np.ones((2, 3, 8)), ArrayWeight.zeros((4, 3, 3)), stride=2), ArrayLayer)
assert_type(ml.max_pool2d(y, 2), ArrayLayer)
assert_type(ml.max_pool1d(np.ones((3, 8)), 2, stride=1, padding=1), ArrayLayer)
assert_type(ml.avg_pool2d(y, (2, 1), stride=1), ArrayLayer)
assert_type(ml.avg_pool1d(y, 3), ArrayLayer)

conv = nn.Conv2d.new(3, 4, 3, padding=1)
assert_type(nn.MaxPool2d(2)(conv(x)), ArrayLayer)
assert_type(nn.AvgPool2d(2)(nn.Conv1d.new(3, 4, 3)(np.ones((2, 3, 8)))), ArrayLayer)
