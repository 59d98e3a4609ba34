"""A module of weights, its checkpoint, and an op of one's own, as a user writes them."""

from dataclasses import dataclass
from typing import assert_type

import numpy as np

import monadl as ml
from monadl.nn import Linear


@dataclass
class Model(ml.Module):
    hidden: Linear
    scale: ml.FloatWeight


model = Model(Linear.new(3, 2, seed=0), ml.FloatWeight(1.0))
assert_type(model.weights(), dict[str, ml.FloatWeight | ml.ArrayWeight])
assert_type(ml.weights_of([model, model.hidden]), dict[str, ml.FloatWeight | ml.ArrayWeight])
ml.save("model.safetensors", model, metadata={"step": 3, "notes": ["a", 1.5, None]})
metadata = ml.load("model.safetensors", model, partial=True)
step = metadata["step"]

square = ml.custom_op("square", forward=lambda xp, x: x * x, vjps=(lambda xp, d, out, x: 2.0 * x * d,))
assert_type(square, ml.CustomOp[ml.ArrayLayer])
assert_type(square(np.ones(3)), ml.ArrayLayer)
cube = ml.custom_op(
    "cube", forward=lambda xp, s: s**3, vjps=(lambda xp, d, out, s: 3 * s * s * d,), result=ml.FloatLayer
)
assert_type(cube(model.scale), ml.FloatLayer)
gradients = ml.check_gradients(lambda w: ml.sum(square(w)), np.ones(2))
try:
    ml.load("model.safetensors", model)
except ml.CheckpointError as error:
    assert_type(error, ml.CheckpointError)
