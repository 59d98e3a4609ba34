"""A custom op given the run's context: its forward takes ``ctx``, a ``RunContext``."""

from typing import Any, assert_type

import numpy as np

import monadl as ml

owner = ml.Dropout(0.5, seed=0)


def noisy(xp: Any, x: Any, *, ctx: ml.RunContext) -> Any:
    assert_type(ctx.training, bool)
    return x + ctx.generator(owner).standard_normal(x.shape) if ctx.training else x


add_noise = ml.custom_op("add_noise", noisy, (lambda xp, d, out, x: d,), context=True)
assert_type(add_noise, ml.CustomOp[ml.ArrayLayer])
assert_type(add_noise(np.ones(3)), ml.ArrayLayer)
