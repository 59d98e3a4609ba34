"""Direct style: in a @direct async function, `await layer` is the layer's forward data (an array
or a float), `await parallel(...)` a tuple of them; the decorated function keeps its parameters
and returns the annotated layer kind."""

from collections.abc import Callable
from typing import assert_type

import numpy as np

import monadl
from monadl import Array, ArrayLayer, ArrayWeight, FloatLayer, FloatWeight, direct, parallel

w = ArrayWeight.normal((3, 3), seed=0)
g = ArrayWeight.normal((3,), seed=1)
t = FloatWeight(0.5)


def gate(x: Array) -> FloatLayer:
    return monadl.sigmoid(monadl.sum(g * x))


def expert(x: Array) -> ArrayLayer:
    return monadl.tanh(w @ x)


@direct
async def gated(x: Array) -> ArrayLayer:
    layer = expert(x)
    data = await layer
    assert_type(data, Array)
    score = await gate(x)
    assert_type(score, float)
    threshold = await t
    assert_type(threshold, float)
    weights = await w
    assert_type(weights, Array)
    if score > threshold and data.shape == weights.shape[:1]:
        return layer * gate(x)
    return -layer


@direct
async def pick(x: Array, y: Array) -> FloatLayer:
    a, b = await parallel(gate(x), gate(y))
    assert_type(a, float)
    assert_type(b, float)
    pair = await parallel(expert(x), gate(y))
    assert_type(pair, tuple[Array, float])
    triple = await parallel(t, w, gate(x))
    assert_type(triple, tuple[float, Array, float])
    four = await parallel(t, t, w, g)
    assert_type(four, tuple[float, float, Array, Array])
    many = await parallel(gate(x), gate(y), gate(x), gate(y), gate(x))
    assert_type(many, tuple[float, ...])
    return gate(x) if a > b else monadl.sum(expert(y))


@direct
async def unroll(x: Array, steps: int) -> ArrayLayer:
    """A dynamic network: its depth depends on a forward value."""
    h = expert(x)
    for _ in range(steps):
        if await monadl.mean(h) > 0.0:
            h = monadl.tanh(w @ h + x)
    return h


x = np.ones(3)
as_function: Callable[[Array], ArrayLayer] = gated
assert_type(gated(x), ArrayLayer)
assert_type(pick(x, x), FloatLayer)
assert_type(unroll(x, steps=3), ArrayLayer)
assert_type(monadl.sum(gated(x) * unroll(x, 2)) + pick(x, np.zeros(3)), FloatLayer)
