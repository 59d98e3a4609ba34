"""Training and prediction.

A training step is all-or-nothing:

1. forward: one run of the loss's ``Do`` (replayed from a compiled program when the graph's
   structure was seen before), every computation a step of the run's record;
2. the loss must be finite, else the step fails with :class:`NonFiniteLossError` before backward;
   and every weight's new value must be finite, else it fails with :class:`NonFiniteGradientError`
   before the commit (``Executor(check_finite=False)`` skips this check);
3. backward: the record read backwards from dL/dL = 1 (``monadl.tape``): each node's delta is the
   sum of its consumers', its vjps run once, and each weight's summed delta is its gradient;
4. update: every weight's new data and optimizer state are computed first, then all are committed
   together (``monadl.runtime.versions``: one store makes them visible). An exception anywhere before
   the commit, or an interrupt (Ctrl-C) at any moment, leaves every weight and state as it was or
   every one updated, never some. A chain's gradient transformations (clipping) run first, on the
   gradients of all the weights the chain updates. A weight's state is kept while its optimizer is
   of the same kind (``optimizers.state_kind``), whatever its hyper-parameters. A frozen weight
   (``trainable = False``) is skipped: no update, no optimizer state, though deltas flow through it.

A step's forward pass runs in training mode, a prediction's in evaluation mode: the run's context
(``monadl.do.context.RunContext``) carries the mode, and collects the buffer updates the step
commits, to the ops that declare they need it (dropout, batch norm, a ``custom_op(context=True)``);
:func:`is_training` says the calling thread's mode.

Every run reads the weights as of one commit (a snapshot): a prediction beside a training thread
sees one step's weights, never a mix of two.
   An optimizer whose class declares ``update_owned`` (``UpdatesInPlace``: SGD) writes the new data
   into the step's own gradient array where the backward pass says nothing else holds it: no
   weight-sized allocation; one that declares ``update_owned_checked`` too (``ChecksUpdate``: SGD,
   with the native kernels) says whether what it wrote is finite, and the check reads no more. What
   an optimizer can do beyond ``init`` and ``update`` is declared by its class
   (``optimizers.base.capabilities``), and one that lacks either fails the step with a
   ``TypeError`` naming it, before anything runs.

``train``/``predict`` return ``returns``' ``FutureResult`` (the paper's typed asynchronous result);
``train_blocking``/``predict_blocking`` return a ``Result`` for scripts. Awaiting a
``FutureResult[float, Exception]`` (``await loss.train(optimizer)``, in a coroutine that an asyncio
loop runs: the step runs in a worker thread) gives what ``returns`` gives for every
``FutureResult``: an ``IOResult[float, Exception]``, ``IOSuccess(loss)`` or ``IOFailure(exception)``,
the blocking form's ``Result`` marked as the outcome of a side effect. ``.map``, ``.bind`` and
``.value_or`` work on the ``IOResult`` itself (``value_or`` and ``unwrap`` give an ``IO``); returns'
escape from ``IO``, ``unsafe_perform_io(IO.from_ioresult(io_result))``, gives the ``Result``
(``unsafe_perform_io(io_result)`` gives it too, but is typed for an ``IO`` only).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, overload

import numpy as np
from mypy_extensions import mypyc_attr
from returns.future import FutureResult
from returns.result import Result, Success

from monadl.do.context import RECORDED, TRAINING, RunContext
from monadl.do.executor import Evaluation, Executor, default_executor
from monadl.do.stats import RunStats
from monadl.do.tape import Tape
from monadl.dsl.learning.finite import (
    Pending,
    all_finite,
    check_later,
    check_pending,
    is_finite,
    is_float_array,
)
from monadl.dsl.learning.optimizers import state_kind
from monadl.dsl.learning.optimizers.base import NONE, Capabilities, Optimizer, capabilities
from monadl.dsl.learning.results import Deferred, failed
from monadl.runtime.memory import large_blocks_kept
from monadl.runtime.staging import staging
from monadl.runtime.versions import COMMIT_LOCK, publish, read
from monadl.tape.backward import NonFiniteDelta, backward
from monadl.typeclasses.backend import NDARRAY, Array, freeze, namespace, writable_own
from monadl.typeclasses.sparse import SparseRows, astype

if TYPE_CHECKING:
    from monadl.dsl.core.layers import ArrayLayer, FloatLayer
    from monadl.dsl.core.weights import ArrayWeight, FloatWeight


@mypyc_attr(native_class=False)  # a compiled subclass of a builtin exception is not a plain one
class NonFiniteLossError(ArithmeticError):
    """The loss of a training step was NaN or infinite; no weight was changed."""


@mypyc_attr(native_class=False)
class NonFiniteGradientError(ArithmeticError):
    """A weight's gradient, or its new value, was NaN or infinite; no weight was changed. Its
    message names the weight and, where the step could be run again to find it, the op whose vjp
    gave the first delta of NaN or infinity (``origin``; None where unknown)."""

    origin: str | None = None


@mypyc_attr(native_class=False)
class NonFiniteBufferError(ArithmeticError):
    """A buffer's new value staged by a training step (batch norm's running statistics) was NaN or
    infinite; no weight and no buffer was changed."""


@mypyc_attr(native_class=False)
class NoOptimizerError(ValueError):
    """A weight received a gradient but neither it nor the step has an optimizer."""


def is_training() -> bool:
    """Whether the calling thread is running the forward pass of a training step (``train``,
    ``train_blocking``, ``compute_gradients``); False in a prediction and outside any run. An op's
    kernel reads the mode of its run's context instead (``custom_op(context=True)``): it may run on
    another thread."""
    return TRAINING.get()


def _non_finite(weight: Any, gradient: Any, data: Any) -> NonFiniteGradientError:
    """The error of a weight whose new value ``data`` is not finite: its name and shape, and
    whether its gradient already was not."""
    rows = gradient.values if type(gradient) is SparseRows else gradient
    cause = "its gradient is not finite" if not all_finite(rows) else "its gradient is, its update is not"
    if type(data) is float:
        what = f"{weight!r}: its new value {data!r} is not finite"
    else:
        xp = namespace(data)
        bad = int(xp.sum(xp.astype(~xp.isfinite(data), xp.int64)))  # (the array API sums no bools)
        what = f"{weight!r}: {bad} of {int(np.prod(data.shape))} entries of its new value are not finite"
    return NonFiniteGradientError(f"{what} ({cause}); no weight was changed")


def _seed(value: Any) -> Any:
    """dL/dL: 1, as a float or an array like the loss."""
    if type(value) is float:
        return 1.0
    return namespace(value).ones_like(value)


Gradients = dict["FloatWeight | ArrayWeight", Any]
Staged = dict[Any, Any]
"""Buffer updates staged by a step's forward pass: buffer to new value."""


@dataclass(frozen=True)
class StepResult:
    """What a step's forward and backward passes give (:func:`forward_and_backward`)."""

    loss: Any
    """The loss: a float, or an array of one element."""
    gradients: Gradients
    """Every weight's gradient (the true one), each in its weight's dtype."""
    owned: set[Any]
    """The weights whose gradient is an array of the step's own: an optimizer may write into it."""
    staged: Staged
    """The buffer updates the forward pass staged (``monadl.runtime.staging``): committed with the
    weights, or not at all."""


def compute_gradients(
    loss: FloatLayer | ArrayLayer, *, executor: Executor | None = None
) -> tuple[Any, Gradients]:
    """The loss and every weight's gradient, without updating anything.

    A gradient is what the weight received, summed: a float for a ``FloatWeight``, an array for an
    ``ArrayWeight`` used densely, and a :class:`~monadl.typeclasses.sparse.SparseRows` for a table
    used only through ``take_rows`` (an embedding table: the looked-up rows, not a dense table).
    ``gradient.to_dense()`` (or ``np.asarray(gradient)`` for NumPy) gives the dense array to compare.
    The gradients are the raw ones (no chain's clipping), and a frozen weight's is reported too.
    The forward pass runs in training mode (dropout drops).

    Dtypes: a constant (an array or a float that depends on no weight) takes the dtype of the
    layers and weights it meets (a float32 model stays float32 beside a float64 array or a Python
    float); layers and weights of different dtypes promote as the array namespace does (float32
    with float64 gives float64); every array gradient is returned in its weight's dtype.

    Raises :class:`NonFiniteLossError` for a non-finite loss, or whatever the forward or backward
    pass raised.
    """
    passes = forward_and_backward(loss, executor)
    return passes.loss, passes.gradients


def forward_and_backward(
    loss: FloatLayer | ArrayLayer, executor: Executor | None, diagnose: bool = False
) -> StepResult:
    """A step's forward and backward passes (:class:`StepResult`). Their statistics are the
    executor's ``last_stats``. ``diagnose``: the backward pass checks every delta
    (``Backward``)."""
    ex = executor or default_executor()
    stats = RunStats()
    try:
        with ex.paused(), large_blocks_kept():
            evaluation, staged = forward_pass(loss, ex, stats)
            return backward_pass(evaluation, staged, diagnose)
    finally:
        ex.publish(stats)


def forward_pass(loss: FloatLayer | ArrayLayer, ex: Executor, stats: RunStats) -> tuple[Evaluation, Staged]:
    """A step's forward pass, in training mode, counted in ``stats``: its evaluation and the buffer
    updates it staged. Raises where the loss is not one finite number."""
    mode = TRAINING.set(True)
    try:
        with staging() as staged:  # (a user's op may stage with ``stage_buffer`` too)
            context = RunContext(True, staged, RECORDED.get())
            evaluation = ex.evaluate(loss.forward, stats, own_root=True, context=context)
    finally:
        TRAINING.reset(mode)
    value = evaluation.value
    if type(value) is not float and math.prod(value.shape) != 1:
        raise ValueError(
            f"the loss must be one number (a FloatLayer, or an array of one element), not an "
            f"array of shape {tuple(value.shape)}: reduce it first (ml.sum, ml.mean); no weight "
            "was changed"
        )
    if not is_finite(value):
        raise NonFiniteLossError(f"the loss is not finite: {value!r}; no weight was changed")
    return evaluation, staged


def backward_pass(evaluation: Evaluation, staged: Staged, diagnose: bool = False) -> StepResult:
    """The backward pass of a step whose forward pass (:func:`forward_pass`) gave ``evaluation``
    and ``staged``."""
    assert evaluation.slot >= 0  # own_root: the root's value has a slot of its own
    run = evaluation.run
    value = evaluation.value
    gradients, owned = backward(run, evaluation.slot, _seed(value), run.dispatcher, diagnose)
    return StepResult(value, gradients, owned, staged)


def commit_step(passes: StepResult, default: Optimizer | None, check: bool) -> None:
    """Computes every update, then commits them all with the buffer updates the step staged
    (nothing is committed if one fails). The caller holds ``COMMIT_LOCK``."""
    pending: Pending = []
    updates = _updates(passes.gradients, default, passes.owned, check, pending)
    for buffer, data in passes.staged.items():
        if check and is_float_array(data):
            error = functools.partial(_non_finite_buffer, buffer)
            if type(data) is not NDARRAY:
                check_later(pending, data, error)
            elif not all_finite(data):
                raise error()
        updates.append((buffer, data, None))
    check_pending(pending)
    publish(updates)


def _non_finite_buffer(buffer: Any) -> NonFiniteBufferError:
    return NonFiniteBufferError(
        f"{buffer!r}: the step's new value of it is not finite (an empty or extreme batch's "
        "statistics?); no weight and no buffer was changed"
    )


Update = tuple[Any, Any, Any]
"""A weight's update, computed and not yet committed: ``(weight, new data, (optimizer, state))``."""


def staged_updates(
    gradients: Gradients, optimizer: Optimizer | None = None, *, check_finite: bool = True
) -> list[Update]:
    """The updates a training step would make from ``gradients`` (true gradients, as
    :func:`compute_gradients` gives them, or a sum of such), computed but not committed: nothing
    changes until :func:`commit_updates`. ``optimizer``: the default of weights without their own.
    Raises as a step would (:class:`NonFiniteGradientError`, :class:`NoOptimizerError`).

    The two halves of a step let a caller commit only when others agree (data-parallel replicas:
    ``monadl.distributed``). The updates are computed from the weights' current values: commit them
    before another step changes the weights."""
    with COMMIT_LOCK:
        return _updates(gradients, optimizer, set(), check_finite)


def commit_gradients(
    gradients: Gradients, optimizer: Optimizer | None = None, *, check_finite: bool = True
) -> None:
    """:func:`staged_updates` and :func:`commit_updates` under one hold of the commit lock: no other
    step's commit comes between the weights the updates are computed from and the commit."""
    with COMMIT_LOCK:
        publish(_updates(gradients, optimizer, set(), check_finite))


def commit_updates(updates: list[Update]) -> None:
    """Commits updates from :func:`staged_updates`: every weight and optimizer state at once."""
    with COMMIT_LOCK:
        publish(updates)


def _updates(
    gradients: Gradients,
    default: Optimizer | None,
    owned: set[Any],
    check: bool,
    pending: Pending | None = None,
) -> list[Update]:
    """Every weight's update, computed, not committed (nothing is, if one fails). ``owned``: the
    weights whose gradient memory the step hands over. ``check``: fail if a new value is not
    finite: at once for NumPy arrays and floats, and for arrays off NumPy (on a GPU) in one read at
    the end, or by the caller where it gives ``pending``.

    A frozen weight is skipped. An optimizer that transforms gradients (``TransformsGradients``: a
    chain with clipping) gets the gradients of all the weights it updates at once, before any of
    them is updated. An object that is not an optimizer is a ``TypeError`` naming what it lacks."""
    later: Pending = [] if pending is None else pending
    updates: list[Update] = []
    chains: list[Any] = []  # the optimizers that transform gradients, and for each, its weights
    members: list[list[Any]] = []
    last: Any = None
    can = NONE
    for weight, gradient in gradients.items():
        if not weight.trainable:
            continue  # frozen: deltas flowed through it; its data and state stay as they are
        optimizer = weight.optimizer or default
        if optimizer is None:
            raise NoOptimizerError(
                f"{weight!r} has a gradient but no optimizer: pass one to train() or to the weight"
            )
        if optimizer is not last:  # (a run of weights with one optimizer, the default: one look-up)
            last, can = optimizer, capabilities(optimizer)
        if not can.transforms_gradients:
            updates.append(_updated(weight, gradient, optimizer, can, owned, check, later))
            continue
        k = 0
        while k < len(chains) and not (chains[k] is optimizer or chains[k] == optimizer):
            k += 1
        if k == len(chains):
            chains.append(optimizer)
            members.append([])
        members[k].append(weight)
    for k in range(len(chains)):
        optimizer = chains[k]
        weights = members[k]
        given = [_in_dtype_of(gradients[weight], weight.data) for weight in weights]
        transformed = optimizer.transform_gradients(given)
        if len(transformed) != len(weights):
            raise ValueError(
                f"{optimizer!r}: transform_gradients gave {len(transformed)} gradients for {len(weights)}"
            )
        for weight, gradient in zip(weights, transformed, strict=True):  # (not the step's own arrays)
            updates.append(_updated(weight, gradient, optimizer, NONE, set(), check, later))
    if pending is None:
        check_pending(later)
    return updates


def _updated(
    weight: Any,
    gradient: Any,
    optimizer: Any,
    can: Capabilities,
    owned: set[Any],
    check: bool,
    pending: Pending,
) -> Update:
    """A weight's update: ``(weight, new data, (optimizer, new state))``, computed, not committed.
    The state is the weight's own while its optimizers are of one kind, else a fresh one.
    ``can``: the optimizer's capabilities; where it updates in place (``update_owned``), it does
    where the step owns the gradient's memory, and where it says whether its result is finite
    (``update_owned_checked``), the check reads no more. The finite check of an array off NumPy
    goes to ``pending``."""
    newest = read(weight.head, None)  # (the weight's properties read it again each: interpreted)
    old = newest.data
    held = newest.state
    # The same optimizer object first: no call for a loop over one optimizer.
    if held is not None and (held[0] is optimizer or state_kind(held[0]) is state_kind(optimizer)):
        state = held[1]
    else:
        state = optimizer.init(old)
    converted = _in_dtype_of(gradient, old)
    finite: bool | None = None  # (of data: an update in place is of a dense NumPy gradient)
    if can.updates_in_place and (weight in owned or converted is not gradient) and _fits(converted, old):
        if can.checks_update:
            data, state, finite = optimizer.update_owned_checked(old, converted, state)
        else:
            data, state = optimizer.update_owned(old, converted, state)
    else:
        data, state = optimizer.update(old, converted, state)
    if check:
        # A table's sparse gradient changes only its rows: their values are what to check.
        checked = gradient.values if type(gradient) is SparseRows else data
        if type(checked) is NDARRAY or type(checked) is float:
            if not (all_finite(checked) if finite is None else finite):
                raise _non_finite(weight, gradient, data)
        else:
            check_later(pending, checked, functools.partial(_non_finite, weight, gradient, data))
    return weight, freeze(data), (optimizer, state)


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
    return astype(gradient, dtype)


def _fits(gradient: Any, data: Any) -> bool:
    """Whether an optimizer may write ``data``'s update into ``gradient``'s memory (the step's
    own): a writable NumPy array of data's shape and dtype, owning its memory."""
    return (
        type(gradient) is NDARRAY
        and type(data) is NDARRAY
        and gradient.shape == data.shape
        and gradient.dtype == data.dtype
        and writable_own(gradient)
    )


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

    ``optimizer`` is the default for weights that have none of their own (a chain with clipping
    too); an object without ``init`` and ``update`` methods is a ``Failure(TypeError)`` naming the
    one it lacks, before the forward pass. Frozen weights (``trainable = False``) are not updated.
    The forward pass runs in training mode (dropout drops).
    """
    try:
        ex = executor or default_executor()
        if optimizer is not None:
            capabilities(optimizer)  # (a TypeError naming what it lacks, before any work)
        passes = forward_and_backward(loss, ex)
        with COMMIT_LOCK, large_blocks_kept():
            commit_step(passes, optimizer, ex.check_finite)
    except NonFiniteGradientError as non_finite:  # (its own name: mypyc types a name once)
        return failed(_located(non_finite, loss, ex))
    except Exception as e:  # noqa: BLE001 - every failure is the caller's Failure, not a crash
        return failed(e)
    return Success(passes.loss)


def _located(
    error: NonFiniteGradientError, loss: FloatLayer | ArrayLayer, ex: Executor
) -> NonFiniteGradientError:
    """``error``, with the op whose vjp gave the first non-finite delta where a second run of the
    step, checking every delta, finds it (only a failed step pays for it)."""
    try:
        forward_and_backward(loss, ex, diagnose=True)
    except NonFiniteDelta as found:
        located = NonFiniteGradientError(f"{error}; {found}")
        located.origin = found.origin
        return located
    except Exception:  # noqa: BLE001 - the step's own error stands, unlocated
        return error
    return error


@overload
def predict_blocking(layer: FloatLayer, *, executor: Executor | None = None) -> Result[float, Exception]: ...
@overload
def predict_blocking(layer: ArrayLayer, *, executor: Executor | None = None) -> Result[Array, Exception]: ...
def predict_blocking(
    layer: FloatLayer | ArrayLayer, *, executor: Executor | None = None
) -> Result[Any, Exception]:
    """The forward value of ``layer``, now: ``Success(value)`` or ``Failure(exception)``. The
    forward pass runs in evaluation mode (dropout passes its input on)."""
    ex = executor or default_executor()
    stats = RunStats()
    try:
        with ex.paused(), large_blocks_kept():
            mode = TRAINING.set(False)  # (evaluation mode even where called inside a training step)
            try:
                value = ex.evaluate(layer.forward, stats, context=RunContext()).value
            finally:
                TRAINING.reset(mode)
        if isinstance(value, Tape):  # a literal's or a user's own tape, the root of a dynamic graph
            value = value.data
    except Exception as e:  # noqa: BLE001
        return failed(e)
    finally:
        ex.publish(stats)
    return Success(value)


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
    """One training step as a ``FutureResult``: it runs, once, in a worker thread when first
    awaited (in an asyncio loop). Awaiting it (or its ``awaitable()``) gives an ``IOResult``:
    ``IOSuccess(loss)``, or ``IOFailure(exception)`` with no weight changed, where
    :func:`train_blocking` returns ``Success(loss)`` or ``Failure(exception)``
    (``unsafe_perform_io(IO.from_ioresult(io_result))`` is that ``Result``)."""
    return FutureResult(
        Deferred(lambda: train_blocking(loss, optimizer, executor=executor), "a training step (train)")
    )


@overload
def predict(layer: FloatLayer, *, executor: Executor | None = None) -> FutureResult[float, Exception]: ...
@overload
def predict(layer: ArrayLayer, *, executor: Executor | None = None) -> FutureResult[Array, Exception]: ...
def predict(
    layer: FloatLayer | ArrayLayer, *, executor: Executor | None = None
) -> FutureResult[Any, Exception]:
    """The forward value as a ``FutureResult``: it runs, once, in a worker thread when first
    awaited (in an asyncio loop). Awaiting it (or its ``awaitable()``) gives an ``IOResult``:
    ``IOSuccess(value)`` or ``IOFailure(exception)``, where :func:`predict_blocking` returns
    ``Success(value)`` or ``Failure(exception)``."""
    return FutureResult(Deferred(lambda: predict_blocking(layer, executor=executor), None))
