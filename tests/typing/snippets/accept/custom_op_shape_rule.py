"""A custom op's shape rule: a function of the operands' shapes (and the call's parameters) that
gives the result's; the op's layers then have a static ``.shape``."""

from typing import assert_type

import numpy as np

import monadl as ml


def dropped(x: tuple[int, ...], w: tuple[int, ...], axis: int) -> tuple[int, ...]:
    return x[:axis] + x[axis + 1 :]


outer = ml.custom_op(
    "outer",
    forward=lambda xp, a, b: a[:, None] * b[None, :],
    vjps=(lambda xp, d, out, a, b: d @ b, lambda xp, d, out, a, b: a @ d),
    shape_rule=lambda a, b: (*a, *b),
)
summed = ml.custom_op(
    "summed",
    forward=lambda xp, x, w, axis: xp.sum(x * w, axis=axis),
    vjps=(
        lambda xp, d, out, x, w, axis: xp.expand_dims(d, axis) * w,
        lambda xp, d, out, x, w, axis: xp.sum(xp.expand_dims(d, axis) * x, axis=0),
    ),
    shape_rule=dropped,
    broadcasts=True,
)
assert_type(outer, ml.CustomOp[ml.ArrayLayer])
assert_type(outer(np.ones(3), ml.ArrayWeight(np.ones(4))).shape, tuple[int, ...] | None)
assert_type(summed(np.ones((3, 4)), np.ones(4), axis=1), ml.ArrayLayer)
