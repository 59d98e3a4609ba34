"""Training and prediction.

A training step is all-or-nothing:

1. forward: one run of the loss's ``Do``; tapes are built, consumers acquired, every shared tape
   registered with the step's :class:`~monadl.tape.shared.StepContext`;
2. the loss must be finite, else the step fails with :class:`NonFiniteLossError` before backward;
3. backward: one run seeded with dL/dL = 1, plus the release of dangling tapes; each tape fires
   once, and each weight's tape records its summed delta;
4. update: every weight's new data and optimizer state are computed first, then all are committed
   together. An exception anywhere before the commit leaves every weight and state as it was.
   An optimizer with an ``update_owned`` (SGD) writes the new data into the step's own gradient
   array where nothing else holds it (checked by reference count): no weight-sized allocation.

``train``/``predict`` return ``returns``' ``FutureResult`` (the paper's typed asynchronous result);
``train_blocking``/``predict_blocking`` return a ``Result`` for scripts.
"""

from __future__ import annotations

import asyncio
import math
import sys
import threading
from collections.abc import Callable, Generator
from typing import Any, overload

import numpy as np
from returns.future import FutureResult
from returns.result import Failure, Result, Success

from monadl.do.do import Do, Pure, run_unit
from monadl.do.executor import Executor, default_executor
from monadl.dsl.fold import run_planned
from monadl.dsl.layers import ArrayLayer, FloatLayer
from monadl.dsl.optimizers import Optimizer
from monadl.dsl.straight import Program, program, record_stats, run_backward, run_forward
from monadl.dsl.weights import ArrayWeight, FloatWeight, freeze
from monadl.tape.shared import StepContext, in_step
from monadl.tape.tape import Tape
from monadl.typeclasses.backend import Array, namespace
from monadl.typeclasses.sparse import SparseRows

_commit_lock = threading.Lock()


class NonFiniteLossError(ArithmeticError):
    """The loss of a training step was NaN or infinite; no weight was changed."""


class NoOptimizerError(ValueError):
    """A weight received a gradient but neither it nor the step has an optimizer."""


def _is_finite(value: Any) -> bool:
    if type(value) is float:
        return math.isfinite(value)
    xp = namespace(value)
    return bool(xp.all(xp.isfinite(value)))


def _seed(value: Any) -> Any:
    if type(value) is float:
        return 1.0
    return namespace(value).ones_like(value)


def compute_gradients(
    loss: FloatLayer | ArrayLayer, *, executor: Executor | None = None
) -> tuple[Any, dict[FloatWeight | ArrayWeight, Any]]:
    """The loss and every weight's gradient, without updating anything.

    A gradient is what the weight received, summed: a float for a ``FloatWeight``, an array for an
    ``ArrayWeight`` used densely, and a :class:`~monadl.typeclasses.sparse.SparseRows` for a table
    used only through ``take_rows`` (an embedding table: the looked-up rows, not a dense table).
    ``gradient.to_dense()`` (or ``np.asarray(gradient)`` for NumPy) gives the dense array to compare.

    Raises :class:`NonFiniteLossError` for a non-finite loss, or whatever the forward or backward
    pass raised.
    """
    ex = executor or default_executor()
    if ex.batching and ex.planning:
        try:
            planned = run_planned(ex, loss.forward)
            if planned is not None and _is_finite(planned.value):
                return planned.value, _unaliased(planned.gradients(_seed(planned.value)))
        except Exception:  # noqa: BLE001 - run again unplanned: its error names the call that failed
            planned = None
        if planned is not None:
            raise NonFiniteLossError(f"the loss is not finite: {planned.value!r}; no weight was changed")
    if ex.planning:  # a static graph runs as a list of ops (monadl.dsl.straight)
        prog = program(loss.forward)
        if prog is not None:
            return _straight_gradients(ex, prog)
    return _gradients(ex, loss)


def _straight_gradients(ex: Executor, prog: Program) -> tuple[Any, dict[FloatWeight | ArrayWeight, Any]]:
    """``compute_gradients`` of a static graph, run as a list of ops (``monadl.dsl.straight``)."""
    try:
        with ex.paused():
            value = run_forward(ex, prog)
            if not _is_finite(value):
                raise NonFiniteLossError(f"the loss is not finite: {value!r}; no weight was changed")
            gradients = run_backward(ex, prog, _seed(value))
    finally:
        record_stats(ex, prog)
    return value, _unaliased(gradients)


def _gradients(
    ex: Executor, loss: FloatLayer | ArrayLayer
) -> tuple[Any, dict[FloatWeight | ArrayWeight, Any]]:
    """``compute_gradients`` run by the executor, in a step of its own."""
    step = StepContext()

    def body() -> Any:
        forward: Do[Tape[Any, Any]] = loss.forward
        root = ex.run(forward)
        value = root.data
        if not _is_finite(value):
            raise NonFiniteLossError(f"the loss is not finite: {value!r}; no weight was changed")
        root.acquire()
        ex.run(run_unit([root.backward(Pure(_seed(value))), step.release_dangling(root)]))
        return value

    try:
        value = in_step(step, body)
    finally:
        # Weight tapes point back at the step: without this, every array of the step would live on
        # in a reference cycle until the garbage collector ran, and memory would grow between steps.
        step.tapes.clear()
    return value, _unaliased(step.gradients)


def _unaliased(gradients: dict[FloatWeight | ArrayWeight, Any]) -> dict[FloatWeight | ArrayWeight, Any]:
    """The gradients, each with memory of its own: a delta passed through unchanged (by ``+``, say),
    or a view of one (by ``reshape``), can be the gradient of two weights at once, and changing one
    in place must not change the other."""
    seen: set[int] = set()
    for weight, gradient in gradients.items():
        if type(gradient) is float:
            continue
        if _memory(gradient) in seen:
            gradient = gradients[weight] = (
                gradient.copy()  # its own object, with its own rows
                if type(gradient) is SparseRows
                else namespace(gradient).asarray(gradient, copy=True)
            )
        seen.add(_memory(gradient))
    return gradients


def _memory(gradient: Any) -> int:
    """The identity of the array that owns a gradient's memory (the array, or its rows' for a
    ``SparseRows``; or the base they are a view of)."""
    array = gradient.values if type(gradient) is SparseRows else gradient
    while getattr(array, "base", None) is not None and hasattr(array.base, "shape"):
        array = array.base
    return id(array)


def _apply(gradients: dict[FloatWeight | ArrayWeight, Any], default: Optimizer | None) -> None:
    """Computes every update, then commits them all (nothing is committed if one fails)."""
    updates = []
    for weight, gradient in gradients.items():
        optimizer = weight.optimizer or default
        if optimizer is None:
            raise NoOptimizerError(
                f"{weight!r} has a gradient but no optimizer: pass one to train() or to the weight"
            )
        held = weight.optimizer_state
        # The same optimizer object first: a dataclass's == is Python code, run once per weight.
        if held is not None and (held[0] is optimizer or held[0] == optimizer):
            state = held[1]
        else:
            state = optimizer.init(weight.data)
        gradient = _in_dtype_of(gradient, weight.data)
        update_owned = getattr(optimizer, "update_owned", None)
        if update_owned is not None and _handed_over(gradient, weight.data):
            data, state = update_owned(weight.data, gradient, state)
        else:
            data, state = optimizer.update(weight.data, gradient, state)
        updates.append((weight, data, (optimizer, state)))
    for weight, data, state in updates:
        weight.data = freeze(data)
        weight.optimizer_state = state


def _in_dtype_of(gradient: Any, data: Any) -> Any:
    """``gradient`` in the float type of the weight's ``data`` (a float32 weight used with float64
    inputs gets a float64 gradient), so that a step never changes a weight's dtype, nor that of
    its optimizer's state."""
    if type(data) is float:
        return gradient
    dtype = data.dtype
    theirs = getattr(gradient, "dtype", dtype)  # a float (a 0-d weight's delta) has none
    if theirs is dtype or theirs == dtype:  # NumPy's dtypes are one object each: ``==`` is slower
        return gradient
    if type(gradient) is SparseRows:
        xp = namespace(gradient.values)
        return SparseRows(gradient.indices, xp.astype(gradient.values, dtype), gradient.shape)
    return namespace(gradient).astype(gradient, dtype)


def _handed_over(gradient: Any, data: Any) -> bool:
    """Whether an optimizer may write ``data``'s update into ``gradient``'s memory: a writable NumPy
    array of data's shape and dtype, owning its memory, and held by nothing but ``_apply``'s
    gradients and loop (no view of it, no user or tape keeps it)."""
    return (
        type(gradient) is np.ndarray
        and type(data) is np.ndarray
        and gradient.shape == data.shape
        and gradient.dtype == data.dtype
        and gradient.flags.owndata
        and gradient.flags.writeable
        and sys.getrefcount(gradient) <= _REFS_IN_APPLY
    )


def _refs_in_apply() -> int:
    """``sys.getrefcount`` of an array held only as ``_apply`` holds a gradient (in a dict, a loop
    variable and ``_handed_over``'s argument), counted here on this interpreter, whose counts vary
    by version."""
    gradients = {0: np.zeros(1)}
    for _, gradient in gradients.items():
        return _count(gradient)
    raise AssertionError("unreachable")


def _count(gradient: Any) -> int:
    return sys.getrefcount(gradient)


_REFS_IN_APPLY = _refs_in_apply()


@overload
def train_blocking(
    loss: FloatLayer, optimizer: Optimizer | None = None, *, executor: Executor | None = None
) -> Result[float, Exception]: ...
@overload
def train_blocking(
    loss: ArrayLayer, optimizer: Optimizer | None = None, *, executor: Executor | None = None
) -> Result[Array, Exception]: ...
def train_blocking(
    loss: FloatLayer | ArrayLayer,
    optimizer: Optimizer | None = None,
    *,
    executor: Executor | None = None,
) -> Result[Any, Exception]:
    """One training step, now: ``Success(loss)``, or ``Failure(exception)`` with no weight changed.

    ``optimizer`` is the default for weights that have none of their own.
    """
    try:
        value, gradients = compute_gradients(loss, executor=executor)
        with _commit_lock:
            _apply(gradients, optimizer)
    except Exception as e:  # noqa: BLE001 - every failure is the caller's Failure, not a crash
        return Failure(e)
    return Success(value)


@overload
def predict_blocking(layer: FloatLayer, *, executor: Executor | None = None) -> Result[float, Exception]: ...
@overload
def predict_blocking(layer: ArrayLayer, *, executor: Executor | None = None) -> Result[Array, Exception]: ...
def predict_blocking(
    layer: FloatLayer | ArrayLayer, *, executor: Executor | None = None
) -> Result[Any, Exception]:
    """The forward value of ``layer``, now: ``Success(value)`` or ``Failure(exception)``."""
    try:
        forward: Do[Tape[Any, Any]] = layer.forward
        ex = executor or default_executor()
        if ex.batching and ex.planning:
            try:
                planned = run_planned(ex, forward)
            except Exception:  # noqa: BLE001 - run again unplanned: its error names the failed call
                planned = None
            if planned is not None:
                return Success(planned.value)
        if ex.planning:
            prog = program(forward)
            if prog is not None:
                try:
                    with ex.paused():
                        return Success(run_forward(ex, prog))
                finally:
                    record_stats(ex, prog)
        return Success(ex.run(forward).data)
    except Exception as e:  # noqa: BLE001
        return Failure(e)


class _InThread:
    """An awaitable that runs ``fn`` in a worker thread when first awaited, once (awaitable again)."""

    def __init__(self, fn: Callable[[], Result[Any, Exception]]) -> None:
        self._fn = fn
        self._future: asyncio.Future[Result[Any, Exception]] | None = None

    def __await__(self) -> Generator[Any, None, Result[Any, Exception]]:
        if self._future is None:
            self._future = asyncio.get_running_loop().run_in_executor(None, self._fn)
        return self._future.__await__()


@overload
def train(
    loss: FloatLayer, optimizer: Optimizer | None = None, *, executor: Executor | None = None
) -> FutureResult[float, Exception]: ...
@overload
def train(
    loss: ArrayLayer, optimizer: Optimizer | None = None, *, executor: Executor | None = None
) -> FutureResult[Array, Exception]: ...
def train(
    loss: FloatLayer | ArrayLayer,
    optimizer: Optimizer | None = None,
    *,
    executor: Executor | None = None,
) -> FutureResult[Any, Exception]:
    """One training step as a ``FutureResult``: it runs (in a worker thread) when awaited."""
    return FutureResult(_InThread(lambda: train_blocking(loss, optimizer, executor=executor)))


@overload
def predict(layer: FloatLayer, *, executor: Executor | None = None) -> FutureResult[float, Exception]: ...
@overload
def predict(layer: ArrayLayer, *, executor: Executor | None = None) -> FutureResult[Array, Exception]: ...
def predict(
    layer: FloatLayer | ArrayLayer, *, executor: Executor | None = None
) -> FutureResult[Any, Exception]:
    """The forward value as a ``FutureResult``: it runs (in a worker thread) when awaited."""
    return FutureResult(_InThread(lambda: predict_blocking(layer, executor=executor)))
