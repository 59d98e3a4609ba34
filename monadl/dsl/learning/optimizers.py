"""Optimizers: immutable configurations with a pure update rule.

``update(data, gradient, state) -> (new_data, new_state)`` computes new values without touching the
old ones, so a training step can compute every weight's update first and commit them all at once
(or none, if anything fails). The rules use only operators and ``** 0.5``, so they serve floats and
arrays of any array-API library alike. ``weight_decay`` adds L2 regularisation:
``gradient + weight_decay * data``. All optimizers are deterministic (no randomness).

**Hyper-parameters and state are apart.** An optimizer is a value holding hyper-parameters only; a
weight's state (moments, sums, velocities, and the number of updates so far: the *step*) is kept
beside the weight's data. A training step keeps a weight's state as long as its optimizer is of the
same kind (:func:`state_kind`: its class, or the class of a :class:`Chain`'s optimizer): a new
``Adam`` with another learning rate goes on with the old one's moments and step count. A learning
rate may be a schedule of the step (``monadl.dsl.learning.schedules``); the step a rate is asked for is the
number of updates before this one (0 for a weight's first), counted in the weight's state (SGD's
state is that count: ``None``, from earlier versions, counts as 0).

An optimizer may add ``update_owned``: the same rule, allowed to write into the gradient's memory.
A training step calls it for gradients that nothing else holds (SGD's saves two weight-sized arrays).

**Gradient transformations** (:func:`clip_by_global_norm`, :func:`clip_by_value`) go before an
optimizer in a :func:`chain`, which is an optimizer itself: ``chain(clip_by_global_norm(1.0),
Adam(1e-3))``. A training step first hands a chain's ``transform_gradients`` the gradients of every
weight of the step that the chain updates (all of them, where it is the step's default and no
weight has its own optimizer), then updates each weight with its transformed gradient; so the
global norm is over all those weights, inside the all-or-nothing step.

A gradient may be a :class:`~monadl.typeclasses.sparse.SparseRows` (an embedding table's). SGD and
Adagrad without weight decay then update the touched rows only (NumPy and CuPy; elsewhere they
densify): the untouched rows have a zero gradient, so the dense rule leaves them (and Adagrad's sum)
exactly as they are, and the touched rows are computed by the dense rule's own operations on the
summed rows, so the result is bit for bit the dense one. Momentum and Adam decay their moments on
every row, and weight decay touches every row: by default they densify the gradient first, so a
sparse gradient gives bit for bit what its dense equivalent (``gradient.to_dense()``) gives.
``lazy=True`` (Momentum, Adam) updates the touched rows only: an untouched row keeps its data and
its moments (they are not decayed), and the step count goes up on every update. Lazy Momentum gives
a touched row the dense rule's result for that row. Lazy Adam is PyTorch's ``SparseAdam``, operation
for operation: on a touched row ``m += (1 - beta1) * (g - m)``, ``v += (1 - beta2) * (g * g - v)``,
``data -= lr * sqrt(1 - beta2**t) / (1 - beta1**t) * (m / (sqrt(v) + epsilon))``. Its bias
correction is on the step size, so epsilon is not scaled by it as in the dense rule
(``m_hat / (sqrt(v_hat) + epsilon)``): a touched row differs from the dense rule's by about
``epsilon / sqrt(v_hat)`` relatively. Weight decay, which SparseAdam lacks, is added to the touched
rows' gradient. On a dense gradient, and where the namespace has no scatter (array-API), lazy is
the dense rule. Clipping a sparse gradient reads its summed rows (repeated indices added first).

**A weight keeps its type, shape and dtype** across every update: NumPy's arithmetic on a 0-d array
gives a scalar, so a 0-d weight's results (data and state) are made 0-d arrays again.

**States are checked** where they come from outside a training step (a checkpoint):
``check_state(state, data)`` says what is wrong with ``state`` for a weight holding ``data``
(``None`` if nothing): its shape, the type, shape and dtype of its arrays (the weight's, for every
optimizer here, lazy ones included), step counts (Python ints from 0 to ``2**63 - 1``), sums of
squares >= 0.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, overload

import numpy as np

from monadl.dsl.fused import Kernel, on_cupy, sum_on_devices
from monadl.dsl.learning.schedules import LearningRate
from monadl.typeclasses.backend import namespace
from monadl.typeclasses.sparse import SparseRows, dense


class Optimizer(Protocol):
    """An update rule with its hyper-parameters."""

    def init(self, data: Any) -> Any:
        """The initial state for a weight holding ``data``."""
        ...

    def update(self, data: Any, gradient: Any, state: Any) -> tuple[Any, Any]:
        """The weight's new data and the new state (without modifying the old ones)."""
        ...


class GradientTransform(Protocol):
    """A change of the gradients of all the weights that one optimizer updates in a step, seen
    together (a global norm needs them all). Used in a :func:`chain`."""

    def transform(self, gradients: list[Any]) -> list[Any]:
        """The new gradients, in order; the given ones unchanged."""
        ...


def _check(learning_rate: LearningRate, weight_decay: float) -> None:
    if not callable(learning_rate) and not learning_rate > 0.0:
        raise ValueError(f"learning_rate must be > 0 or a schedule, got {learning_rate}")
    if not weight_decay >= 0.0:
        raise ValueError(f"weight_decay must be >= 0, got {weight_decay}")


def _check_epsilon(epsilon: float) -> None:
    if not epsilon >= 0.0:  # (a negative one can cancel the denominator's root: a division by 0)
        raise ValueError(f"epsilon must be >= 0, got {epsilon}")


def _rate(learning_rate: LearningRate, step: int) -> float:
    """The learning rate at ``step`` (a Python float: a NumPy scalar would promote float32 data)."""
    return float(learning_rate(step)) if callable(learning_rate) else learning_rate


def _decayed(gradient: Any, data: Any, weight_decay: float) -> Any:
    gradient = dense(gradient)
    return gradient + weight_decay * data if weight_decay else gradient


def _summed_rows(gradient: Any) -> tuple[Any, Any, Any] | None:
    """For a sparse gradient: the namespace, the distinct row indices and their summed rows (summed
    in the order ``to_dense`` sums them, so each equals the dense gradient's row bit for bit).
    None for a dense gradient, or where the namespace has no scatter (the array API)."""
    if type(gradient) is not SparseRows:
        return None
    sums = gradient.summed()
    return None if sums is None else (namespace(sums[1]), *sums)  # (None: the array API: densify)


def _lazy_rows(gradient: Any, data: Any, weight_decay: float) -> tuple[Any, Any, Any] | None:
    """``_summed_rows`` with weight decay added to the touched rows (a lazy update's gradient)."""
    sparse = _summed_rows(gradient)
    if sparse is None or not weight_decay:
        return sparse
    xp, rows, g = sparse
    return xp, rows, g + weight_decay * data[rows]


def _kept(result: Any, data: Any) -> Any:
    """``result`` as a 0-d array where ``data`` is a NumPy array: NumPy's arithmetic on 0-d arrays
    gives scalars, and a weight that changed type would change the structure of the next graph
    (which then is not replayed). The value is kept bit for bit."""
    if type(result) is not np.ndarray and type(data) is np.ndarray:
        return np.asarray(result)
    return result


def _shown(value: object) -> str:
    """A state part or a weight's data, as an error message names it."""
    if isinstance(value, tuple):
        return f"a tuple of {len(value)} items"
    shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
    if shape is not None and dtype is not None:
        return f"a {dtype} {tuple(shape)} {type(value).__name__}"
    return f"{type(value).__name__} {value!r}"


def _parts_problem(state: object, names: tuple[str, ...]) -> str | None:
    """What is wrong with the shape of a state that should be the tuple ``names``."""
    if type(state) is not tuple or len(state) != len(names):
        return f"the state is {_shown(state)}, not a tuple ({', '.join(names)})"
    return None


_MAX_STEP = 2**63 - 1
"""The largest step count a state may hold (a signed 64-bit counter's): more updates than any run
makes, and an exponent that the bias correction's ``beta ** step`` takes (``10**400`` overflows
Python's float there, and every later update would fail)."""


def _step_problem(step: object) -> str | None:
    """What is wrong with a step count (a schedule's argument, the bias correction's exponent)."""
    if type(step) is not int or step < 0:
        return f"the step count is {_shown(step)}, not an int >= 0"
    if step > _MAX_STEP:
        return f"the step count is an int of {step.bit_length()} bits, more than 2**63 - 1"
    return None


def _array_problem(name: str, part: Any, data: Any, non_negative: bool = False) -> str | None:
    """What is wrong with a state's array ``part`` (a moment, a sum) for a weight holding ``data``:
    not of the weight's type, shape and dtype (a float for a float weight), or negative where it
    must not be (a sum of squares, whose square root is taken). NaN and infinity are not checked:
    a diverged run's state is still its state (a checkpoint's load refuses them unless told)."""
    if isinstance(data, float) or (isinstance(part, float) and getattr(data, "shape", None) == ()):
        # A float weight's state holds floats; so did a 0-d array weight's before its results were
        # kept 0-d arrays (a checkpoint saved those NumPy scalars as floats): both are loadable.
        if not isinstance(part, float):
            return f"its {name} is {_shown(part)}, not a float like the weight"
        negative = part < 0.0
    else:
        if type(part) is not type(data) or part.shape != data.shape or part.dtype != data.dtype:
            return f"its {name} is {_shown(part)}, not {_shown(data)} like the weight"
        negative = non_negative and bool(namespace(part).any(part < 0.0))
    if non_negative and negative:
        return f"its {name} has a negative entry"
    return None


def _with_rows(xp: Any, array: Any, rows: Any, values: Any) -> Any:
    """A copy of ``array`` with ``rows`` set to ``values``."""
    new = xp.asarray(array, copy=True)
    new[rows] = values
    return new


# --------------------------------------------------------------------------- fused CuPy updates
# On CuPy arrays, each dense rule below runs as one kernel (``monadl.dsl.fused``) of the rule's own
# operations in the rule's order: one pass over a weight and its state, where the rule as written
# makes a kernel and a temporary array per operator. The scalars are the rule's Python floats,
# given to the kernel in the weight's type, as the operators would convert them. ``decay``: the
# weight decay added to the gradient first (``_decayed``).


def _decay(decay: bool) -> tuple[tuple[str, ...], tuple[str, ...], str]:
    """The scalar, the statement and the gradient's name of a kernel with L2 weight decay or none."""
    return (("wd",), ("gd = g + wd * d",), "gd") if decay else ((), (), "g")


@functools.cache
def _sgd_kernel(decay: bool) -> Kernel:
    wd, first, g = _decay(decay)
    return Kernel("sgd", ("d", "g"), ("rate", *wd), ("dnew",), (*first, f"dnew = d - rate * {g}"))


@functools.cache
def _momentum_kernel(decay: bool) -> Kernel:
    wd, first, g = _decay(decay)
    body = (*first, f"unew = mu * u + {g}", "dnew = d - rate * unew")
    return Kernel("momentum", ("d", "g", "u"), ("mu", "rate", *wd), ("dnew", "unew"), body)


@functools.cache
def _adagrad_kernel(decay: bool) -> Kernel:
    wd, first, g = _decay(decay)
    body = (*first, f"snew = s + {g} * {g}", f"dnew = d - rate * {g} / (sqrt(snew) + eps)")
    return Kernel("adagrad", ("d", "g", "s"), ("rate", "eps", *wd), ("dnew", "snew"), body)


@functools.cache
def _adam_kernel(decay: str) -> Kernel:
    """``adam_rule`` as one kernel; ``decay``: "" (none), "l2" (Adam's, added to the gradient) or
    "decoupled" (AdamW's: the data shrunk first, by the scalar ``shrink``)."""
    scalars: tuple[str, ...] = ("b1", "c1", "b2", "c2", "k1", "k2", "rate", "eps")
    first: tuple[str, ...] = ()
    g, d = "g", "d"
    if decay == "l2":
        wd, first, g = _decay(True)
        scalars += wd
    elif decay == "decoupled":
        scalars, first, d = (*scalars, "shrink"), ("dd = d * shrink",), "dd"
    body = (
        *first,
        f"mnew = b1 * m + c1 * {g}",
        f"vnew = b2 * v + c2 * ({g} * {g})",
        "mhat = mnew / k1",
        "vhat = vnew / k2",
        f"dnew = {d} - rate * mhat / (sqrt(vhat) + eps)",
    )
    return Kernel(f"adam{decay}", ("d", "g", "m", "v"), scalars, ("dnew", "mnew", "vnew"), body)


def _fused_adam(
    data: Any,
    g: Any,
    m: Any,
    v: Any,
    b1: float,
    b2: float,
    t: int,
    rate: float,
    epsilon: float,
    decay: tuple[str, float] | None,
) -> tuple[Any, ...]:
    """Adam's (or AdamW's) dense update of CuPy arrays in one kernel: ``(new data, m, v)``.
    ``decay``: ``("l2", weight decay)``, ``("decoupled", shrink)`` or None."""
    scalars = (b1, 1.0 - b1, b2, 1.0 - b2, 1.0 - b1**t, 1.0 - b2**t, rate, epsilon)
    kernel = _adam_kernel("" if decay is None else decay[0])
    return kernel((data, g, m, v), scalars if decay is None else (*scalars, decay[1]))


@functools.cache
def _rmsprop_kernel(decay: bool, centered: bool, momentum: str) -> Kernel:
    """RMSprop's rule as one kernel; ``momentum``: "" (none), "first" (the velocity starts as the
    scaled gradient) or "next" (a velocity to decay)."""
    wd, first, g = _decay(decay)
    inputs, scalars, outputs = ["d", "g", "q"], ["alpha", "c", "eps", "rate", *wd], ["dnew", "qnew"]
    body = [*first, f"qnew = alpha * q + c * ({g} * {g})"]
    if centered:
        inputs.append("a")
        outputs.append("anew")
        body += [f"anew = a + c * ({g} - a)", "root = sqrt(qnew - anew * anew)"]
    else:
        body.append("root = sqrt(qnew)")
    body.append(f"scaled = {g} / (root + eps)")
    if momentum:
        outputs.append("unew")
        if momentum == "next":
            inputs.append("u")
            scalars.append("mu")
            body.append("unew = mu * u + scaled")
        else:
            body.append("unew = scaled")
        body.append("dnew = d - rate * unew")
    else:
        body.append("dnew = d - rate * scaled")
    return Kernel("rmsprop", tuple(inputs), tuple(scalars), tuple(outputs), tuple(body))


@dataclass(frozen=True)
class SGD:
    """Plain gradient descent: ``data - learning_rate * gradient``. State: the step count."""

    learning_rate: LearningRate = 0.01
    weight_decay: float = 0.0

    def __post_init__(self) -> None:
        _check(self.learning_rate, self.weight_decay)

    def init(self, data: Any) -> int:
        return 0

    def update(self, data: Any, gradient: Any, state: int | None) -> tuple[Any, Any]:
        step = state or 0
        rate = _rate(self.learning_rate, step)
        sparse = None if self.weight_decay else _summed_rows(gradient)
        if sparse is not None:  # the touched rows only: the rest keep ``data - lr * 0 == data``
            xp, rows, g = sparse
            return _with_rows(xp, data, rows, data[rows] - rate * g), step + 1
        g = dense(gradient)
        if on_cupy(data, g):
            wd = self.weight_decay
            return _sgd_kernel(bool(wd))((data, g), (rate, wd) if wd else (rate,))[0], step + 1
        return _kept(data - rate * _decayed(g, data, self.weight_decay), data), step + 1

    def check_state(self, state: object, data: Any) -> str | None:
        """What is wrong with ``state`` for a weight holding ``data`` (None if nothing): it must
        be a step count (``None``, from earlier versions, counts as 0)."""
        return None if state is None else _step_problem(state)

    def update_owned(self, data: Any, gradient: Any, state: int | None) -> tuple[Any, Any]:
        """``update`` for a gradient whose memory the caller hands over (a training step's own NumPy
        array, which nothing else holds): the new data is written into that memory, bit for bit
        ``update``'s result. It saves ``update``'s two fresh arrays as large as the weight; for a
        large weight glibc maps them anew on every step, and page-faulting them in costs several
        times the arithmetic (``docs/benchmarks.md``)."""
        if self.weight_decay or type(gradient) is not np.ndarray:
            return self.update(data, gradient, state)
        step = state or 0
        # -(lr * g) + data rounds exactly as data - lr * g: negation is exact.
        np.multiply(gradient, -_rate(self.learning_rate, step), out=gradient)
        np.add(data, gradient, out=gradient)
        return gradient, step + 1

    def folded_rate(self) -> float | None:
        """The factor a training step may fold into its backward pass's seed, so that every gradient
        comes out already multiplied by it and the update is one subtraction (:meth:`update_folded`):
        the learning rate, where it is a constant and there is no weight decay (which is added to
        the gradient unscaled)."""
        rate = self.learning_rate
        return None if self.weight_decay or callable(rate) else rate

    def update_folded(self, data: Any, scaled: Any, state: int | None, owned: bool) -> tuple[Any, Any]:
        """``update`` of a gradient already multiplied by the learning rate (folded into the step's
        seed): ``data - scaled``, written into ``scaled``'s memory when the step owns it (``owned``):
        one pass over the weight where ``update_owned`` makes two."""
        step = (state or 0) + 1
        sparse = _summed_rows(scaled)
        if sparse is not None:
            xp, rows, g = sparse
            return _with_rows(xp, data, rows, data[rows] - g), step
        if owned and type(scaled) is np.ndarray:
            np.subtract(data, scaled, out=scaled)
            return scaled, step
        return _kept(data - dense(scaled), data), step


@dataclass(frozen=True)
class Momentum:
    """Gradient descent with (heavy-ball) momentum: ``v = momentum * v + g; data -= lr * v``.
    State: the velocity and the step count. ``lazy``: a sparse gradient updates its rows only."""

    learning_rate: LearningRate = 0.01
    momentum: float = 0.9
    weight_decay: float = 0.0
    lazy: bool = False

    def __post_init__(self) -> None:
        _check(self.learning_rate, self.weight_decay)
        if not 0.0 <= self.momentum < 1.0:
            raise ValueError(f"momentum must be in [0, 1), got {self.momentum}")

    def init(self, data: Any) -> tuple[Any, int]:
        return _kept(data * 0.0, data), 0

    def check_state(self, state: object, data: Any) -> str | None:
        """What is wrong with ``state`` for a weight holding ``data`` (None if nothing): it must be
        ``(velocity, step count)``, the velocity of the weight's shape and dtype."""
        problem = _parts_problem(state, ("velocity", "step count"))
        if problem is not None or not isinstance(state, tuple):
            return problem
        return _array_problem("velocity", state[0], data) or _step_problem(state[1])

    def update(self, data: Any, gradient: Any, state: tuple[Any, int]) -> tuple[Any, tuple[Any, int]]:
        velocity, step = state
        rate = _rate(self.learning_rate, step)
        sparse = _lazy_rows(gradient, data, self.weight_decay) if self.lazy else None
        if sparse is not None:
            xp, rows, g = sparse
            new_velocity = _with_rows(xp, velocity, rows, self.momentum * velocity[rows] + g)
            return _with_rows(xp, data, rows, data[rows] - rate * new_velocity[rows]), (
                new_velocity,
                step + 1,
            )
        g = dense(gradient)
        if on_cupy(data, g, velocity):
            wd = self.weight_decay
            scalars = (self.momentum, rate, wd) if wd else (self.momentum, rate)
            new, velocity = _momentum_kernel(bool(wd))((data, g, velocity), scalars)
            return new, (velocity, step + 1)
        velocity = _kept(self.momentum * velocity + _decayed(g, data, self.weight_decay), data)
        return _kept(data - rate * velocity, data), (velocity, step + 1)


@dataclass(frozen=True)
class Adam:
    """Adam (Kingma and Ba 2015), with bias correction. State: the first and second moments and
    the step count. ``lazy``: a sparse gradient updates its rows only (as PyTorch's SparseAdam)."""

    learning_rate: LearningRate = 0.001
    beta1: float = 0.9
    beta2: float = 0.999
    epsilon: float = 1e-8
    weight_decay: float = 0.0
    lazy: bool = False

    def __post_init__(self) -> None:
        _check(self.learning_rate, self.weight_decay)
        if not (0.0 <= self.beta1 < 1.0 and 0.0 <= self.beta2 < 1.0):
            raise ValueError(f"betas must be in [0, 1), got {self.beta1}, {self.beta2}")
        _check_epsilon(self.epsilon)

    def init(self, data: Any) -> tuple[Any, Any, int]:
        return _kept(data * 0.0, data), _kept(data * 0.0, data), 0

    def check_state(self, state: object, data: Any) -> str | None:
        """What is wrong with ``state`` for a weight holding ``data`` (None if nothing): it must be
        ``(first moment, second moment, step count)``, the moments of the weight's shape and dtype
        (lazy or not), the second one >= 0."""
        problem = _parts_problem(state, ("first moment", "second moment", "step count"))
        if problem is not None or not isinstance(state, tuple):
            return problem
        return (
            _array_problem("first moment", state[0], data)
            or _array_problem("second moment", state[1], data, non_negative=True)
            or _step_problem(state[2])
        )

    def update(
        self, data: Any, gradient: Any, state: tuple[Any, Any, int]
    ) -> tuple[Any, tuple[Any, Any, int]]:
        m, v, t = state
        rate = _rate(self.learning_rate, t)
        t += 1
        b1, b2 = self.beta1, self.beta2
        sparse = _lazy_rows(gradient, data, self.weight_decay) if self.lazy else None
        if sparse is not None:  # torch.optim.SparseAdam's operations, in its order (its bits)
            xp, rows, g = sparse
            m_rows, v_rows = m[rows], v[rows]
            m_rows = m_rows + (1.0 - b1) * (g - m_rows)
            v_rows = v_rows + (1.0 - b2) * (g * g - v_rows)
            step_size = rate * math.sqrt(1.0 - b2**t) / (1.0 - b1**t)
            new_rows = data[rows] - step_size * (m_rows / (v_rows**0.5 + self.epsilon))
            m, v = _with_rows(xp, m, rows, m_rows), _with_rows(xp, v, rows, v_rows)
            return _with_rows(xp, data, rows, new_rows), (m, v, t)
        if type(gradient) is SparseRows and not self.weight_decay and _same_arrays(data, m, v):
            summed = _summed_rows(gradient)
            if summed is not None and type(summed[2]) is np.ndarray and summed[2].dtype == data.dtype:
                new, m, v = _adam_in_chunks(data, summed[2], m, v, b1, b2, t, rate, self.epsilon, summed[1])
                return new, (m, v, t)
        g = dense(gradient)
        if on_cupy(data, g, m, v):
            wd = self.weight_decay
            decay = ("l2", wd) if wd else None
            new, m, v = _fused_adam(data, g, m, v, b1, b2, t, rate, self.epsilon, decay)
            return new, (m, v, t)
        g = _decayed(g, data, self.weight_decay)
        if _same_arrays(data, g, m, v):
            new, m, v = _adam_in_chunks(data, g, m, v, b1, b2, t, rate, self.epsilon)
            return new, (m, v, t)
        new, m, v = adam_rule(data, g, m, v, b1, b2, t, rate, self.epsilon)
        return _kept(new, data), (_kept(m, data), _kept(v, data), t)


_CHUNK = 1 << 15
"""Elements an update computes at a time: its dozen passes stay in the cache, where a large table
(an embedding) would stream each of them through memory."""


def _same_arrays(*arrays: Any) -> bool:
    """Whether these are NumPy arrays of one shape and dtype, contiguous (then updated in chunks)."""
    first = arrays[0]
    if type(first) is not np.ndarray or first.size <= _CHUNK:
        return False
    for a in arrays:
        if type(a) is not np.ndarray or a.shape != first.shape or a.dtype != first.dtype:
            return False
        if not a.flags.c_contiguous:
            return False
    return True


def adam_rule(
    data: Any, g: Any, m: Any, v: Any, b1: float, b2: float, t: int, rate: float, epsilon: float
) -> Any:
    """Adam's dense rule as written, on any arrays: ``(new data, m, v)`` (what the chunked NumPy
    path equals bit for bit)."""
    m = b1 * m + (1.0 - b1) * g
    v = b2 * v + (1.0 - b2) * (g * g)
    m_hat = m / (1.0 - b1**t)
    v_hat = v / (1.0 - b2**t)
    return data - rate * m_hat / (v_hat**0.5 + epsilon), m, v


def _adam_in_chunks(
    data: Any,
    g: Any,
    m: Any,
    v: Any,
    b1: float,
    b2: float,
    t: int,
    rate: float,
    epsilon: float,
    rows: Any = None,
) -> tuple[Any, Any, Any]:
    """Adam's dense rule on NumPy arrays, the same operations in the same order (so the same bits),
    a chunk of rows at a time into fresh arrays: ``(new data, m, v)``. With ``rows`` (sorted,
    distinct), ``g`` is a sparse gradient's summed rows there, every other row's gradient +0.0: a
    chunk of such rows adds that +0.0 to ``b1 * m`` and ``b2 * v`` without computing it, and no
    dense gradient is made (an embedding table's update, whose batch touched few of its rows)."""
    new, m_new, v_new = np.empty_like(data), np.empty_like(m), np.empty_like(v)
    flat = [x.reshape(-1) for x in (data, m, v, new, m_new, v_new)]
    count, width = data.shape[0], math.prod(data.shape[1:])
    per = max(1, _CHUNK // width)  # rows per chunk
    c1, c2 = 1.0 - b1**t, 1.0 - b2**t
    a = np.empty(min(count, per) * width, dtype=data.dtype)
    b = np.empty_like(a)
    if rows is None:
        dense_g = g.reshape(-1)
    else:
        g_rows = g.reshape(g.shape[0], width)
        bounds = np.searchsorted(rows, np.arange(0, count + per, per))
        chunk_g = np.empty_like(a)
    for k, first in enumerate(range(0, count, per)):
        last = min(first + per, count)
        start, end = first * width, last * width
        d_, m_, v_, new_, mn, vn = (x[start:end] for x in flat)
        ta, tb = a[: end - start], b[: end - start]
        if rows is None:
            g_ = dense_g[start:end]
        elif bounds[k] < bounds[k + 1]:  # rows of this chunk have a gradient: made dense here
            g_ = chunk_g[: end - start]
            g_.fill(0.0)
            lo, hi = bounds[k], bounds[k + 1]
            g_.reshape(last - first, width)[rows[lo:hi] - first] = g_rows[lo:hi]
        else:
            g_ = None
        np.multiply(m_, b1, out=mn)  # m = b1 * m + (1 - b1) * g
        if g_ is None:
            np.add(mn, 0.0, out=mn)
            np.multiply(v_, b2, out=vn)  # v = b2 * v + (1 - b2) * (g * g)
            np.add(vn, 0.0, out=vn)
        else:
            np.multiply(g_, 1.0 - b1, out=ta)
            np.add(mn, ta, out=mn)
            np.multiply(g_, g_, out=ta)
            np.multiply(ta, 1.0 - b2, out=ta)
            np.multiply(v_, b2, out=vn)
            np.add(vn, ta, out=vn)
        np.divide(mn, c1, out=ta)  # m_hat
        np.divide(vn, c2, out=tb)  # v_hat
        np.sqrt(tb, out=tb)
        np.add(tb, epsilon, out=tb)
        np.multiply(ta, rate, out=ta)  # rate * m_hat / (v_hat ** 0.5 + epsilon)
        np.divide(ta, tb, out=ta)
        np.subtract(d_, ta, out=new_)
    return new, m_new, v_new


@dataclass(frozen=True)
class Adagrad:
    """Adagrad (Duchi et al. 2011): per-coordinate rates from the sum of squared gradients.
    State: that sum and the step count."""

    learning_rate: LearningRate = 0.01
    epsilon: float = 1e-8
    weight_decay: float = 0.0

    def __post_init__(self) -> None:
        _check(self.learning_rate, self.weight_decay)
        _check_epsilon(self.epsilon)

    def init(self, data: Any) -> tuple[Any, int]:
        return _kept(data * 0.0, data), 0

    def check_state(self, state: object, data: Any) -> str | None:
        """What is wrong with ``state`` for a weight holding ``data`` (None if nothing): it must be
        ``(sum of squared gradients, step count)``, the sum >= 0 and of the weight's shape and
        dtype."""
        problem = _parts_problem(state, ("sum of squared gradients", "step count"))
        if problem is not None or not isinstance(state, tuple):
            return problem
        return _array_problem("sum of squared gradients", state[0], data, non_negative=True) or _step_problem(
            state[1]
        )

    def update(self, data: Any, gradient: Any, state: tuple[Any, int]) -> tuple[Any, tuple[Any, int]]:
        total, step = state
        rate = _rate(self.learning_rate, step)
        sparse = None if self.weight_decay or not self.epsilon > 0.0 else _summed_rows(gradient)
        if sparse is not None:  # the touched rows only: the rest keep their data and their sum
            xp, rows, g = sparse
            total = _with_rows(xp, total, rows, total[rows] + g * g)
            new = _with_rows(xp, data, rows, data[rows] - rate * g / (total[rows] ** 0.5 + self.epsilon))
            return new, (total, step + 1)
        g = dense(gradient)
        if on_cupy(data, g, total):
            wd = self.weight_decay
            scalars = (rate, self.epsilon, wd) if wd else (rate, self.epsilon)
            new, total = _adagrad_kernel(bool(wd))((data, g, total), scalars)
            return new, (total, step + 1)
        g = _decayed(g, data, self.weight_decay)
        total = _kept(total + g * g, data)
        return _kept(data - rate * g / (total**0.5 + self.epsilon), data), (total, step + 1)


@dataclass(frozen=True)
class AdamW:
    """AdamW (Loshchilov and Hutter 2019): Adam with decoupled weight decay, as
    ``torch.optim.AdamW`` (its defaults too). Each update first shrinks the data, ``data * (1 -
    learning_rate * weight_decay)``, then takes Adam's step on the gradient alone: the decay is not
    in the moments, where :class:`Adam`'s ``weight_decay`` (L2) puts it. ``amsgrad``: the step
    divides by the largest second moment so far (Reddi et al. 2018). State: the first and second
    moments, the largest second moment (None until ``amsgrad`` needs it) and the step count.

    A sparse gradient gives bit for bit what its dense equivalent gives (the decay touches every
    row, so there is no lazy form); without ``amsgrad``, a large NumPy weight's update reads the
    sparse rows as Adam's does, without making a dense gradient."""

    learning_rate: LearningRate = 0.001
    beta1: float = 0.9
    beta2: float = 0.999
    epsilon: float = 1e-8
    weight_decay: float = 0.01
    amsgrad: bool = False

    def __post_init__(self) -> None:
        _check(self.learning_rate, self.weight_decay)
        if not (0.0 <= self.beta1 < 1.0 and 0.0 <= self.beta2 < 1.0):
            raise ValueError(f"betas must be in [0, 1), got {self.beta1}, {self.beta2}")
        _check_epsilon(self.epsilon)

    def init(self, data: Any) -> tuple[Any, Any, Any, int]:
        return _kept(data * 0.0, data), _kept(data * 0.0, data), None, 0

    def check_state(self, state: object, data: Any) -> str | None:
        """What is wrong with ``state`` for a weight holding ``data`` (None if nothing): it must be
        ``(first moment, second moment, largest second moment or None, step count)``, the moments
        of the weight's shape and dtype, the second ones >= 0."""
        names = ("first moment", "second moment", "largest second moment", "step count")
        problem = _parts_problem(state, names)
        if problem is not None or not isinstance(state, tuple):
            return problem
        return (
            _array_problem("first moment", state[0], data)
            or _array_problem("second moment", state[1], data, non_negative=True)
            or (None if state[2] is None else _array_problem(names[2], state[2], data, non_negative=True))
            or _step_problem(state[3])
        )

    def update(
        self, data: Any, gradient: Any, state: tuple[Any, Any, Any, int]
    ) -> tuple[Any, tuple[Any, Any, Any, int]]:
        m, v, v_max, t = state
        rate = _rate(self.learning_rate, t)
        t += 1
        b1, b2 = self.beta1, self.beta2
        if not self.amsgrad and on_cupy(data, m, v) and on_cupy(data, g := dense(gradient)):
            shrink = ("decoupled", 1.0 - rate * self.weight_decay) if self.weight_decay else None
            new, m, v = _fused_adam(data, g, m, v, b1, b2, t, rate, self.epsilon, shrink)
            return new, (m, v, v_max, t)
        decayed = _kept(data * (1.0 - rate * self.weight_decay), data) if self.weight_decay else data
        if not self.amsgrad:
            if type(gradient) is SparseRows and _same_arrays(decayed, m, v):
                summed = _summed_rows(gradient)
                if summed is not None and type(summed[2]) is np.ndarray and summed[2].dtype == data.dtype:
                    new, m, v = _adam_in_chunks(
                        decayed, summed[2], m, v, b1, b2, t, rate, self.epsilon, summed[1]
                    )
                    return new, (m, v, v_max, t)
            g = dense(gradient)
            if _same_arrays(decayed, g, m, v):
                new, m, v = _adam_in_chunks(decayed, g, m, v, b1, b2, t, rate, self.epsilon)
                return new, (m, v, v_max, t)
            new, m, v = adam_rule(decayed, g, m, v, b1, b2, t, rate, self.epsilon)
            return _kept(new, data), (_kept(m, data), _kept(v, data), v_max, t)
        g = dense(gradient)
        m = _kept(b1 * m + (1.0 - b1) * g, data)
        v = _kept(b2 * v + (1.0 - b2) * (g * g), data)
        v_max = _kept(_maximum(v if v_max is None else v_max, v), data)
        new = decayed - rate * (m / (1.0 - b1**t)) / ((v_max / (1.0 - b2**t)) ** 0.5 + self.epsilon)
        return _kept(new, data), (m, v, v_max, t)


def _sqrt(x: Any) -> Any:
    """``x ** 0.5``, NaN for a negative float (Python's power would give a complex number)."""
    if isinstance(x, float):
        return math.sqrt(x) if x >= 0.0 else math.nan
    return x**0.5


def _maximum(a: Any, b: Any) -> Any:
    """The elementwise maximum of two arrays of one namespace, or of two floats."""
    if isinstance(a, float):
        return b if b > a else a
    return namespace(a).maximum(a, b)


@dataclass(frozen=True)
class RMSprop:
    """RMSprop (Hinton 2012), as ``torch.optim.RMSprop`` (its defaults too): the gradient divided by
    the root of a running mean of its squares, ``mean = alpha * mean + (1 - alpha) * g * g``,
    ``data -= learning_rate * g / (sqrt(mean) + epsilon)``. ``centered``: the running mean of the
    gradient is taken off (its variance, not its second moment); ``momentum``: the divided gradient
    is accumulated in a velocity, which the step takes. ``weight_decay`` adds L2 to the gradient.
    State: the mean of the squares, the velocity and the mean of the gradient (each None until
    ``momentum`` or ``centered`` needs it) and the step count. A sparse gradient is made dense (the
    mean decays on every row)."""

    learning_rate: LearningRate = 0.01
    alpha: float = 0.99
    epsilon: float = 1e-8
    weight_decay: float = 0.0
    momentum: float = 0.0
    centered: bool = False

    def __post_init__(self) -> None:
        _check(self.learning_rate, self.weight_decay)
        if not 0.0 <= self.alpha <= 1.0:
            raise ValueError(f"alpha must be in [0, 1], got {self.alpha}")
        if not 0.0 <= self.momentum < 1.0:
            raise ValueError(f"momentum must be in [0, 1), got {self.momentum}")
        _check_epsilon(self.epsilon)

    def init(self, data: Any) -> tuple[Any, Any, Any, int]:
        return _kept(data * 0.0, data), None, None, 0

    def check_state(self, state: object, data: Any) -> str | None:
        """What is wrong with ``state`` for a weight holding ``data`` (None if nothing): it must be
        ``(mean of squares, velocity or None, mean gradient or None, step count)``, the arrays of
        the weight's shape and dtype, the mean of squares >= 0."""
        names = ("mean of squares", "velocity", "mean gradient", "step count")
        problem = _parts_problem(state, names)
        if problem is not None or not isinstance(state, tuple):
            return problem
        return (
            _array_problem(names[0], state[0], data, non_negative=True)
            or (None if state[1] is None else _array_problem(names[1], state[1], data))
            or (None if state[2] is None else _array_problem(names[2], state[2], data))
            or _step_problem(state[3])
        )

    def _fused(
        self, data: Any, g: Any, square: Any, velocity: Any, mean: Any, rate: float, step: int
    ) -> tuple[Any, tuple[Any, Any, Any, int]]:
        """``update`` of CuPy arrays (a dense gradient) in one kernel."""
        momentum = "" if not self.momentum > 0.0 else "first" if velocity is None else "next"
        kernel = _rmsprop_kernel(bool(self.weight_decay), self.centered, momentum)
        arrays = [data, g, square]
        scalars = [self.alpha, 1.0 - self.alpha, self.epsilon, rate]
        if self.weight_decay:
            scalars.append(self.weight_decay)
        if self.centered:
            arrays.append(mean)
        if momentum == "next":
            arrays.append(velocity)
            scalars.append(self.momentum)
        out = iter(kernel(arrays, scalars))
        new, square = next(out), next(out)
        if self.centered:
            mean = next(out)
        if momentum:
            velocity = next(out)
        return new, (square, velocity, mean, step + 1)

    def update(
        self, data: Any, gradient: Any, state: tuple[Any, Any, Any, int]
    ) -> tuple[Any, tuple[Any, Any, Any, int]]:
        square, velocity, mean, step = state
        rate = _rate(self.learning_rate, step)
        alpha = self.alpha
        g = dense(gradient)
        if self.centered and mean is None:
            mean = _kept(data * 0.0, data)
        if (
            on_cupy(data, g, square)
            and (velocity is None or on_cupy(data, velocity))
            and (mean is None or on_cupy(data, mean))
        ):
            return self._fused(data, g, square, velocity, mean, rate, step)
        g = _decayed(g, data, self.weight_decay)
        square = _kept(alpha * square + (1.0 - alpha) * (g * g), data)
        if self.centered:
            mean = _kept(mean + (1.0 - alpha) * (g - mean), data)
            root = _sqrt(square - mean * mean)  # (a variance that rounds below 0: NaN, as PyTorch's)
        else:
            root = square**0.5
        scaled = g / (root + self.epsilon)
        if self.momentum > 0.0:
            velocity = _kept(scaled if velocity is None else self.momentum * velocity + scaled, data)
            return _kept(data - rate * velocity, data), (square, velocity, mean, step + 1)
        return _kept(data - rate * scaled, data), (square, velocity, mean, step + 1)


# --------------------------------------------------------------------------- gradient transforms


def _sum_of_squares(gradient: Any) -> Any:
    """The sum of the squares of a gradient's entries (a sparse one's summed rows): a float, or a
    0-d array on the gradient's device off NumPy (read with the others': ``global_norm``)."""
    if type(gradient) is float:
        return gradient * gradient
    if type(gradient) is SparseRows:
        sparse = _summed_rows(gradient)
        gradient = gradient.to_dense() if sparse is None else sparse[2]
    if type(gradient) is np.ndarray:
        return float(np.vdot(gradient, gradient))  # BLAS: one pass, no temporary array
    return namespace(gradient).sum(gradient * gradient)


def global_norm(gradients: Sequence[Any]) -> float:
    """The Euclidean norm of all the gradients together, as one vector (a sparse gradient counts
    as its dense equivalent: the squares of its summed rows). Off NumPy, the sums stay on the
    device and are read together: one wait for a GPU, not one per gradient."""
    total = 0.0
    on_devices = []
    for gradient in gradients:
        square = _sum_of_squares(gradient)
        if type(square) is float:
            total += square
        else:
            on_devices.append(square)
    if on_devices:
        total += sum_on_devices(on_devices)
    return math.sqrt(total)


def _scaled(gradient: Any, factor: float) -> Any:
    if type(gradient) is SparseRows:
        return gradient.with_values(gradient.values * factor)
    return gradient * factor


def _clipped(gradient: Any, limit: float) -> Any:
    if type(gradient) is float:  # NaN stays NaN (min and max would turn it into a limit)
        return limit if gradient > limit else -limit if gradient < -limit else gradient
    if type(gradient) is SparseRows:
        sparse = _summed_rows(gradient)
        if sparse is None:
            gradient = gradient.to_dense()
        else:
            xp, rows, summed = sparse
            return SparseRows(rows, xp.clip(summed, -limit, limit), gradient.shape)
    return namespace(gradient).clip(gradient, -limit, limit)


@dataclass(frozen=True)
class ClipByGlobalNorm:
    """Scales all the gradients by ``max_norm / norm`` where their :func:`global_norm` exceeds
    ``max_norm`` (as optax's ``clip_by_global_norm``); leaves them as they are otherwise. A
    non-finite norm gives non-finite gradients, and the step fails (``NonFiniteGradientError``)."""

    max_norm: float

    def __post_init__(self) -> None:
        if not self.max_norm > 0.0:
            raise ValueError(f"clip_by_global_norm: max_norm must be > 0, got {self.max_norm}")

    def transform(self, gradients: list[Any]) -> list[Any]:
        norm = global_norm(gradients)
        if norm <= self.max_norm:
            return list(gradients)
        factor = self.max_norm / norm
        return [_scaled(g, factor) for g in gradients]


@dataclass(frozen=True)
class ClipByValue:
    """Clips every entry of every gradient to ``[-limit, limit]`` (a sparse gradient's summed
    rows: repeated indices are added first)."""

    limit: float

    def __post_init__(self) -> None:
        if not self.limit > 0.0:
            raise ValueError(f"clip_by_value: limit must be > 0, got {self.limit}")

    def transform(self, gradients: list[Any]) -> list[Any]:
        return [_clipped(g, self.limit) for g in gradients]


def clip_by_global_norm(max_norm: float) -> ClipByGlobalNorm:
    """Clipping by the global norm of all the gradients a :func:`chain` updates in a step."""
    return ClipByGlobalNorm(max_norm)


def clip_by_value(limit: float) -> ClipByValue:
    """Clipping of every gradient entry to ``[-limit, limit]``."""
    return ClipByValue(limit)


@dataclass(frozen=True)
class Chain:
    """Gradient transformations, then an optimizer: an optimizer itself (:func:`chain`).

    Its state is its optimizer's (a chain and its optimizer are of the same kind: adding clipping
    to a weight's Adam keeps the moments). A training step calls :meth:`transform_gradients` with
    the gradients of all the weights it updates with this chain, then :meth:`update` for each:
    ``update`` is the optimizer's alone, on a gradient already transformed."""

    transforms: tuple[GradientTransform, ...]
    optimizer: Optimizer

    def __post_init__(self) -> None:
        for t in self.transforms:
            if not callable(getattr(t, "transform", None)):
                raise TypeError(f"chain: {t!r} is not a gradient transformation")
        if not callable(getattr(self.optimizer, "update", None)):
            raise TypeError(f"chain: {self.optimizer!r} is not an optimizer")

    def init(self, data: Any) -> Any:
        return self.optimizer.init(data)

    def update(self, data: Any, gradient: Any, state: Any) -> tuple[Any, Any]:
        return self.optimizer.update(data, gradient, state)

    def check_state(self, state: object, data: Any) -> str | None:
        """Its optimizer's ``check_state`` (None where that optimizer has none: it is not checked)."""
        check = getattr(self.optimizer, "check_state", None)
        return None if check is None else check(state, data)

    def transform_gradients(self, gradients: list[Any]) -> list[Any]:
        """The gradients of every weight of a step that this chain updates, transformed in turn
        (an inner chain's transformations last)."""
        for t in self.transforms:
            gradients = t.transform(gradients)
        inner = getattr(self.optimizer, "transform_gradients", None)
        return gradients if inner is None else list(inner(gradients))


@overload
def chain(t1: GradientTransform, optimizer: Optimizer, /) -> Chain: ...
@overload
def chain(t1: GradientTransform, t2: GradientTransform, optimizer: Optimizer, /) -> Chain: ...
@overload
def chain(
    t1: GradientTransform, t2: GradientTransform, t3: GradientTransform, optimizer: Optimizer, /
) -> Chain: ...
def chain(*parts: GradientTransform | Optimizer) -> Chain:
    """Gradient transformations applied in order, then the optimizer (last), as one optimizer:
    ``chain(clip_by_global_norm(1.0), Adam(1e-3))``, usable wherever an optimizer is."""
    if len(parts) < 2:
        raise TypeError("chain: expected one or more gradient transformations, then an optimizer")
    *transforms, optimizer = parts
    return Chain(tuple(transforms), optimizer)  # type: ignore[arg-type]


OPTIMIZER_CLASSES: tuple[type[SGD | Momentum | Adam | AdamW | Adagrad | RMSprop | Chain], ...] = (
    SGD,
    Momentum,
    Adam,
    AdamW,
    Adagrad,
    RMSprop,
    Chain,
)
"""monadl's optimizers (each has ``check_state``): what a checkpoint may rebuild as a weight's."""


def state_kind(optimizer: Optimizer) -> type:
    """The class whose state an optimizer keeps: its own, or a chain's optimizer's. A training step
    keeps a weight's state while its optimizers are of one kind, and starts afresh otherwise."""
    while type(optimizer) is Chain:
        optimizer = optimizer.optimizer
    return type(optimizer)
