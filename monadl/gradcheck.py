"""Gradient checking: monadl's gradients against central finite differences.

``check_gradients(f, *inputs)`` builds a weight per input (an ``ArrayWeight`` for a float64 array, a
``FloatWeight`` for a float), takes the gradients of ``f(*weights)`` (a ``FloatLayer`` loss) with
:func:`monadl.compute_gradients`, and compares them with central differences of ``f``'s forward
value, one element at a time. It raises :class:`GradientMismatch` naming the input and the worst
element where they differ; use it on an op of your own (:func:`monadl.custom_op`). It also checks
what every gradient must be (a float for a ``FloatWeight``; for an ``ArrayWeight``, an array of its
shape and dtype) and that reruns give the same bits, replayed or interpreted (:func:`gradients_of`
makes those checks alone, on any array backend). The library's own tests use this checker.

Tolerances: with ``eps = 1e-6`` in float64 the truncation error of a central difference is about
``eps**2 * |f'''| / 6 ~ 1e-12``, and the rounding error about ``ulp(|f|) / eps ~ 1e-10 * |f|``:
``atol = 1e-7`` leaves a margin for losses up to ~100 in magnitude, ``rtol = 1e-5`` covers large
entries. A wrong vjp is off by the order of the gradient itself.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray
from returns.result import Failure

from monadl.do.executor import Executor
from monadl.dsl.core.layers import FloatLayer
from monadl.dsl.core.weights import ArrayWeight, FloatWeight
from monadl.dsl.learning.training import compute_gradients
from monadl.typeclasses.sparse import SparseRows

__all__ = ["GradientMismatch", "check_gradients", "gradients_of", "make_weights", "numerical_gradients"]

F64 = NDArray[np.float64]
Input = F64 | float
Grad = F64 | float
Loss = Callable[..., FloatLayer]

EPS = 1e-6
RTOL = 1e-5
ATOL = 1e-7


class GradientMismatch(AssertionError):
    """monadl's gradient of an input differs from the finite differences."""


def _identity(x: Any) -> Any:
    return x


def make_weights(
    inputs: Sequence[Input], asarray: Callable[[Any], Any] = _identity
) -> list[FloatWeight | ArrayWeight]:
    """A fresh weight per input: ``FloatWeight`` for a float, ``ArrayWeight(asarray(x))`` for a
    float64 NumPy array."""
    weights: list[FloatWeight | ArrayWeight] = []
    for i, x in enumerate(inputs):
        if isinstance(x, float):
            weights.append(FloatWeight(float(x)))
        elif isinstance(x, np.ndarray) and x.dtype == np.float64:
            weights.append(ArrayWeight(asarray(x)))
        else:
            raise TypeError(f"check_gradients: input {i} must be a float64 NumPy array or a float, got {x!r}")
    return weights


def _loss_at(f: Loss, inputs: Sequence[Input]) -> float:
    result = f(*make_weights(inputs)).predict_blocking()
    if isinstance(result, Failure):
        raise result.failure()
    value = result.unwrap()
    if type(value) is not float:
        raise TypeError(f"check_gradients: f must return a FloatLayer, its value is a {type(value).__name__}")
    return value


def numerical_gradients(f: Loss, inputs: Sequence[Input], eps: float = EPS) -> list[Grad]:
    """Central finite differences of ``f``'s forward value, one input element at a time."""

    def derivative(replace: Callable[[float], list[Input]], x: float) -> float:
        up, down = x + eps, x - eps
        return (_loss_at(f, replace(up)) - _loss_at(f, replace(down))) / (up - down)  # the step taken

    out: list[Grad] = []
    for i, x in enumerate(inputs):
        if isinstance(x, float):

            def with_float(v: float, i: int = i) -> list[Input]:
                return [*inputs[:i], v, *inputs[i + 1 :]]

            out.append(derivative(with_float, x))
            continue
        grad = np.empty_like(x)
        for index in np.ndindex(x.shape):

            def with_element(v: float, i: int = i, x: F64 = x, index: tuple[int, ...] = index) -> list[Input]:
                moved = x.copy()
                moved[index] = v
                return [*inputs[:i], moved, *inputs[i + 1 :]]

            grad[index] = derivative(with_element, float(x[index]))
        out.append(grad)
    return out


def gradients_of(
    f: Loss,
    inputs: Sequence[Input],
    *,
    asarray: Callable[[Any], Any] = _identity,
    executor: Executor | None = None,
) -> tuple[float, list[Any]]:
    """The loss of ``f`` at ``inputs`` (each array made ``asarray(x)``: any array backend) and
    monadl's gradient of every input, in input order (dense arrays of that backend), on ``executor``
    (default: the default executor). Raises :class:`GradientMismatch` unless each is a gradient of its
    weight: a float for a ``FloatWeight``, an array of the weight's shape and dtype for an
    ``ArrayWeight``."""
    weights = make_weights(inputs, asarray)
    loss, gradients = compute_gradients(f(*weights), executor=executor)
    if type(loss) is not float:
        raise TypeError(f"check_gradients: f must return a FloatLayer, its value is a {type(loss).__name__}")
    out: list[Any] = []
    for i, w in enumerate(weights):
        g = gradients.get(w)
        if g is None:
            raise GradientMismatch(f"input {i} got no gradient: f does not depend on it")
        if isinstance(w, FloatWeight):
            if type(g) is not float:
                raise GradientMismatch(f"input {i} is a FloatWeight: its gradient is a {type(g).__name__}")
        else:
            if type(g) is SparseRows:  # an embedding table's gradient: the rows it looked up
                g = g.to_dense()
            data = w.data
            shape = tuple(getattr(g, "shape", ()))
            if shape != tuple(data.shape) or getattr(g, "dtype", None) != data.dtype:
                raise GradientMismatch(
                    f"input {i}: its gradient is a {type(g).__name__} of shape {shape} and "
                    f"{getattr(g, 'dtype', None)}, its weight's {tuple(data.shape)} and {data.dtype}"
                )
        out.append(g)
    return loss, out


def check_gradients(
    f: Loss,
    *inputs: Input,
    eps: float = EPS,
    rtol: float = RTOL,
    atol: float = ATOL,
    executor: Executor | None = None,
) -> list[Grad]:
    """Raises :class:`GradientMismatch` unless monadl's gradients of ``f`` at ``inputs`` equal
    central finite differences and a rerun gives them bit for bit (on ``executor``, whose second run
    of a static graph replays its compiled program, and on an executor that never replays); returns
    monadl's gradients, in input order (dense NumPy arrays, or floats)."""
    _, first = gradients_of(f, inputs, executor=executor)
    for again, how in ((executor, "run again"), (Executor(replay=False), "without replay")):
        _, rerun = gradients_of(f, inputs, executor=again)
        for i, (a, r) in enumerate(zip(first, rerun, strict=True)):
            if not np.array_equal(np.asarray(a), np.asarray(r), equal_nan=True):
                raise GradientMismatch(f"input {i}: its gradient {how} differs: {a!r}, then {r!r}")
    analytic: list[Grad] = [g if type(g) is float else np.asarray(g) for g in first]
    numeric = numerical_gradients(f, inputs, eps)
    for i, (a, n) in enumerate(zip(analytic, numeric, strict=True)):
        error = np.abs(np.asarray(a) - np.asarray(n)) - (atol + rtol * np.abs(np.asarray(n)))
        # NaN fails too: a finite difference that is not finite (the function has no derivative
        # there, or is not defined a step away) makes ``inf - inf``, which no comparison passes.
        error = np.where(error <= 0, error, np.inf)
        if np.any(error > 0) or not np.all(np.isfinite(a)):
            worst = tuple(int(k) for k in np.unravel_index(int(np.argmax(error)), np.shape(n)))
            raise GradientMismatch(
                f"gradient of input {i} (shape {np.shape(inputs[i])}): monadl vs finite differences at "
                f"{worst}: {float(np.asarray(a)[worst])!r} vs {float(np.asarray(n)[worst])!r} "
                f"(rtol {rtol}, atol {atol})"
            )
    return analytic
