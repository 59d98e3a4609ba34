"""A function polymorphic over the kind of its operands, typed with monadl.AnyLayer (as AnyStr is
over str and bytes), takes weights as they are, layers, and weights and layers of one kind mixed.
A layer gives its own type; a weight (or a mix) its kind's base, FloatOperators or ArrayOperators,
which every op and operator takes, and lift makes a layer again (for predict and train)."""

from typing import assert_type

import numpy as np
from returns.result import Result

import monadl as ml
from monadl import AnyLayer, ArrayLayer, ArrayOperators, ArrayWeight, FloatLayer, FloatOperators, FloatWeight


def swish(x: AnyLayer) -> AnyLayer:
    return x * ml.sigmoid(x)


def blend(a: AnyLayer, b: AnyLayer, t: float) -> AnyLayer:
    return a * t + b * (1.0 - t) + ml.maximum(a, 0.0) - ml.exp(-b) / 2.0


def same(x: AnyLayer) -> AnyLayer:
    return +x


s = FloatWeight(0.5)
w = ArrayWeight.normal((3, 2), seed=0)
f = s * 2.0
a = np.ones((4, 3)) @ w

# layers keep their type
assert_type(swish(f), FloatLayer)
assert_type(swish(a), ArrayLayer)
assert_type(blend(f, f, 0.3), FloatLayer)
assert_type(blend(a, a, 0.3), ArrayLayer)
assert_type(swish(a).predict_blocking().unwrap(), ml.Array)

# weights, as they are: their kind's base
assert_type(swish(s), FloatOperators)
assert_type(swish(w), ArrayOperators)
assert_type(same(s), FloatOperators)
assert_type(blend(s, f, 0.3), FloatOperators)
assert_type(blend(a, w, 0.3), ArrayOperators)

# which every op and operator takes, giving layers again
assert_type(ml.sum(swish(w)), FloatLayer)
assert_type(ml.exp(swish(s)), FloatLayer)
assert_type(swish(w) @ np.ones((2, 1)), ArrayLayer)
assert_type(a + swish(w), ArrayLayer)
assert_type(f * swish(s), FloatLayer)
assert_type(swish(swish(w)), ArrayOperators)
assert_type(ml.mean((np.ones((4, 3)) @ swish(w) - 1.0) ** 2.0) + swish(s), FloatLayer)
assert_type(ml.lift(swish(s)), FloatLayer)
assert_type(ml.lift(swish(w)).predict_blocking(), Result[ml.Array, Exception])
