"""Awaiting a training step gives an IOResult, not the Result that train_blocking returns
(unsafe_perform_io of it is)."""
# expect: Incompatible types in assignment (expression has type "IOResult[float, Exception]",
# expect: variable has type "Result[float, Exception]") [assignment]

from returns.result import Result

import monadl as ml

s = ml.FloatWeight(1.0)


async def step() -> None:
    result: Result[float, Exception] = await (s * s).train(ml.SGD(0.1))  # error
