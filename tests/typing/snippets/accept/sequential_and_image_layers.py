"""A Sequential is typed by its first layer's input, and every later layer takes and gives an
ArrayLayer; the image, padding and normalisation layers and ops are typed."""

from collections.abc import Callable
from typing import assert_type

import numpy as np

import monadl
from monadl import AnyArray, ArrayLayer, ArrayWeight, nn
from monadl.typeclasses.backend import RowIndices

cnn = nn.Sequential(
    nn.Conv2d.new(1, 4, 3, padding=1),
    nn.GroupNorm.new(2, 4),
    monadl.relu,
    nn.ConvTranspose2d.new(4, 2, 2, stride=2),
    nn.AdaptiveAvgPool2d((2, None)),
    nn.Flatten(),
    nn.Dropout(0.1),
    nn.Linear.new(2 * 2 * 10, 3),
    lambda h: monadl.tanh(h) * 2.0,
)
assert_type(cnn, nn.Sequential[AnyArray])
assert_type(cnn(np.ones((2, 1, 5, 5), dtype=np.float32)), ArrayLayer)
assert_type(cnn[0], Callable[..., ArrayLayer])  # a layer by position (its own type not kept)
assert_type(len(cnn), int)

tokens = nn.Sequential(nn.Embedding.new(10, 4), nn.RMSNorm.new(4), nn.Linear.new(4, 2))
assert_type(tokens, nn.Sequential[RowIndices])
assert_type(tokens(np.array([1, 2, 3])), ArrayLayer)

functions = nn.Sequential(monadl.relu, monadl.sigmoid)  # functions of a layer, first included
assert_type(functions, nn.Sequential[AnyArray])
assert_type(functions(ArrayWeight.zeros((3,))), ArrayLayer)


def block(h: ArrayLayer) -> ArrayLayer:
    return monadl.relu(h) + h


blocks = nn.Sequential(block, block)
assert_type(blocks, nn.Sequential[ArrayLayer])

x = ArrayWeight.normal((2, 3, 4, 4), seed=0)
assert_type(monadl.conv_transpose2d(x, np.ones((3, 1, 2, 2)), stride=2, output_padding=1), ArrayLayer)
assert_type(monadl.adaptive_avg_pool2d(x, (2, None)), ArrayLayer)
assert_type(monadl.pad(x, (1, 1, 2, 0), mode="reflect"), ArrayLayer)
assert_type(monadl.flatten(x, 1), ArrayLayer)
assert_type(monadl.group_norm(x, 3, eps=1e-3, axis=-3), ArrayLayer)
assert_type(monadl.rms_norm(x, (4, 4)), ArrayLayer)

decoder = nn.TransformerDecoderLayer.new(8, 2, activation=monadl.gelu, norm_first=True)
target, memory = ArrayWeight.normal((5, 8), seed=1), ArrayWeight.normal((7, 8), seed=2)
assert_type(decoder(target, memory, memory_mask=np.ones((5, 7), dtype=bool)), ArrayLayer)
