"""Gradient checking: monadl's gradients against central finite differences.

``check_gradients(f, *inputs)`` builds a weight per input (an ``ArrayWeight`` for a float64 array, a
``FloatWeight`` for a float), takes the gradients of ``f(*weights)`` (a ``FloatLayer`` loss) with
:func:`monadl.compute_gradients`, and compares them with central differences of ``f``'s forward
value, one element at a time. It raises :class:`GradientMismatch` naming the input and the worst
element where they differ; use it on an op of your own (:func:`monadl.custom_op`).

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
from monadl.dsl.layers import FloatLayer
from monadl.dsl.training import compute_gradients
from monadl.dsl.weights import ArrayWeight, FloatWeight
from monadl.typeclasses.sparse import SparseRows

__all__ = ["GradientMismatch", "check_gradients", "make_weights", "numerical_gradients"]

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


def check_gradients(
    f: Loss,
    *inputs: Input,
    eps: float = EPS,
    rtol: float = RTOL,
    atol: float = ATOL,
    executor: Executor | None = None,
) -> list[Grad]:
    """Raises :class:`GradientMismatch` unless monadl's gradients of ``f`` at ``inputs`` equal
    central finite differences; returns monadl's gradients, in input order (dense arrays)."""
    weights = make_weights(inputs)
    _, gradients = compute_gradients(f(*weights), executor=executor)
    analytic: list[Grad] = []
    for i, (x, w) in enumerate(zip(inputs, weights, strict=True)):
        g = gradients.get(w)
        if g is None:
            raise GradientMismatch(f"input {i} got no gradient: f does not depend on it")
        if type(g) is SparseRows:
            g = g.to_dense()
        analytic.append(g if isinstance(x, float) else np.asarray(g))
    numeric = numerical_gradients(f, inputs, eps)
    for i, (a, n) in enumerate(zip(analytic, numeric, strict=True)):
        error = np.abs(np.asarray(a) - np.asarray(n)) - (atol + rtol * np.abs(np.asarray(n)))
        if np.shape(a) != np.shape(n) or np.any(error > 0) or not np.all(np.isfinite(a)):
            worst = np.unravel_index(int(np.argmax(error)), np.shape(n)) if np.ndim(n) else ()
            raise GradientMismatch(
                f"gradient of input {i} (shape {np.shape(inputs[i])}): at {worst}, monadl gives "
                f"{np.asarray(a)[worst]!r}, finite differences {np.asarray(n)[worst]!r} "
                f"(rtol {rtol}, atol {atol})"
            )
    return analytic
