"""Awaiting train/predict (in an asyncio coroutine) gives what returns gives for a FutureResult: an
IOResult of the layer's kind; returns' escape from IO gives the blocking form's Result."""

from typing import assert_type

import numpy as np
from returns.io import IO, IOResult
from returns.result import Result
from returns.unsafe import unsafe_perform_io

import monadl as ml
from monadl import Array, ArrayWeight, FloatWeight

w = ArrayWeight.normal((3, 2), seed=0)
s = FloatWeight(1.0)
out = np.ones((4, 3)) @ w
loss = ml.mean(out * out) + s * s


async def steps() -> float:
    assert_type(await loss.train(ml.SGD(0.1)), IOResult[float, Exception])
    assert_type(await out.train(ml.SGD(0.1)), IOResult[Array, Exception])
    assert_type(await loss.predict(), IOResult[float, Exception])
    assert_type(await out.predict(), IOResult[Array, Exception])
    assert_type(await ml.train(loss, ml.SGD(0.1)), IOResult[float, Exception])
    assert_type(await ml.predict(out), IOResult[Array, Exception])
    assert_type(await loss.train().awaitable(), IOResult[float, Exception])
    step = await loss.train(ml.SGD(0.1))
    result: Result[float, Exception] = unsafe_perform_io(IO.from_ioresult(step))
    assert_type(unsafe_perform_io(IO.from_ioresult(await out.predict())), Result[Array, Exception])
    assert_type(step.value_or(0.0), IO[float])
    assert_type(step.map(lambda v: v * 2.0), IOResult[float, Exception])
    return unsafe_perform_io(step.value_or(float("nan"))) + result.value_or(float("nan"))
