"""Rates from the squared gradients: :class:`Adagrad` (their sum; sparse rows updated alone) and
:class:`RMSprop` (their running mean, centered or not, with or without momentum)."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from monadl.dsl.fused import Kernel, on_cupy
from monadl.dsl.learning.optimizers.base import (
    check_epsilon,
    check_learning_settings,
    decay_parts,
    keep_array,
    numpy_of_one_kind,
    rate_at_step,
    summed_rows,
    with_rows,
    with_weight_decay,
)
from monadl.dsl.learning.optimizers.checks import array_problem, parts_problem, step_problem
from monadl.dsl.learning.schedules import LearningRate
from monadl.typeclasses.sparse import dense


@functools.cache
def _adagrad_kernel(decay: bool) -> Kernel:
    wd, first, g = decay_parts(decay)
    body = (*first, f"snew = s + {g} * {g}", f"dnew = d - rate * {g} / (sqrt(snew) + eps)")
    return Kernel("adagrad", ("d", "g", "s"), ("rate", "eps", *wd), ("dnew", "snew"), body)


@functools.cache
def _rmsprop_kernel(decay: bool, centered: bool, momentum: str) -> Kernel:
    """RMSprop's rule as one kernel; ``momentum``: "" (none), "first" (the velocity starts as the
    scaled gradient) or "next" (a velocity to decay)."""
    wd, first, g = decay_parts(decay)
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
class Adagrad:
    """Adagrad (Duchi et al. 2011): per-coordinate rates from the sum of squared gradients.
    State: that sum and the step count."""

    learning_rate: LearningRate = 0.01
    epsilon: float = 1e-8
    weight_decay: float = 0.0

    def __post_init__(self) -> None:
        check_learning_settings(self.learning_rate, self.weight_decay)
        check_epsilon(self.epsilon)

    def init(self, data: Any) -> tuple[Any, int]:
        return keep_array(data * 0.0, data), 0

    def check_state(self, state: object, data: Any) -> str | None:
        """What is wrong with ``state`` for a weight holding ``data`` (None if nothing): it must be
        ``(sum of squared gradients, step count)``, the sum >= 0 and of the weight's shape and
        dtype."""
        problem = parts_problem(state, ("sum of squared gradients", "step count"))
        if problem is not None or not isinstance(state, tuple):
            return problem
        return array_problem("sum of squared gradients", state[0], data, non_negative=True) or step_problem(
            state[1]
        )

    def update(self, data: Any, gradient: Any, state: tuple[Any, int]) -> tuple[Any, tuple[Any, int]]:
        total, step = state
        rate = rate_at_step(self.learning_rate, step)
        sparse = None if self.weight_decay or not self.epsilon > 0.0 else summed_rows(gradient)
        if sparse is not None:  # the touched rows only: the rest keep their data and their sum
            xp, rows, g = sparse
            total = with_rows(xp, total, rows, total[rows] + g * g)
            new = with_rows(xp, data, rows, data[rows] - rate * g / (total[rows] ** 0.5 + self.epsilon))
            return new, (total, step + 1)
        g = dense(gradient)
        if on_cupy(data, g, total):
            wd = self.weight_decay
            scalars = (rate, self.epsilon, wd) if wd else (rate, self.epsilon)
            new, total = _adagrad_kernel(bool(wd))((data, g, total), scalars)
            return new, (total, step + 1)
        g = with_weight_decay(g, data, self.weight_decay)
        if numpy_of_one_kind(data, g, total):
            new, total = _adagrad_on_numpy(data, g, total, rate, self.epsilon)
            return new, (total, step + 1)
        total = keep_array(total + g * g, data)
        return keep_array(data - rate * g / (total**0.5 + self.epsilon), data), (total, step + 1)


def _adagrad_on_numpy(data: Any, g: Any, total: Any, rate: float, epsilon: float) -> tuple[Any, Any]:
    """Adagrad's dense rule on NumPy arrays of one shape and dtype, ``(new data, new sum)``: the
    operations of ``total + g * g`` and ``data - rate * g / (sum ** 0.5 + epsilon)`` in their
    order (so the same bits), into three fresh arrays where the expressions make seven (each a
    pass of allocation as long as its arithmetic). The inputs are not changed."""
    new_total = np.multiply(g, g)
    np.add(total, new_total, out=new_total)
    root = np.sqrt(new_total)  # ``** 0.5``: NumPy computes it as sqrt
    np.add(root, epsilon, out=root)
    scaled = np.multiply(g, rate)
    np.divide(scaled, root, out=root)
    np.subtract(data, root, out=scaled)
    return scaled, new_total


def _sqrt(x: Any) -> Any:
    """``x ** 0.5``, NaN for a negative float (Python's power would give a complex number)."""
    if isinstance(x, float):
        return math.sqrt(x) if x >= 0.0 else math.nan
    return x**0.5


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
        check_learning_settings(self.learning_rate, self.weight_decay)
        if not 0.0 <= self.alpha <= 1.0:
            raise ValueError(f"alpha must be in [0, 1], got {self.alpha}")
        if not 0.0 <= self.momentum < 1.0:
            raise ValueError(f"momentum must be in [0, 1), got {self.momentum}")
        check_epsilon(self.epsilon)

    def init(self, data: Any) -> tuple[Any, Any, Any, int]:
        return keep_array(data * 0.0, data), None, None, 0

    def check_state(self, state: object, data: Any) -> str | None:
        """What is wrong with ``state`` for a weight holding ``data`` (None if nothing): it must be
        ``(mean of squares, velocity or None, mean gradient or None, step count)``, the arrays of
        the weight's shape and dtype, the mean of squares >= 0."""
        names = ("mean of squares", "velocity", "mean gradient", "step count")
        problem = parts_problem(state, names)
        if problem is not None or not isinstance(state, tuple):
            return problem
        return (
            array_problem(names[0], state[0], data, non_negative=True)
            or (None if state[1] is None else array_problem(names[1], state[1], data))
            or (None if state[2] is None else array_problem(names[2], state[2], data))
            or step_problem(state[3])
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
        rate = rate_at_step(self.learning_rate, step)
        alpha = self.alpha
        g = dense(gradient)
        if self.centered and mean is None:
            mean = keep_array(data * 0.0, data)
        if (
            on_cupy(data, g, square)
            and (velocity is None or on_cupy(data, velocity))
            and (mean is None or on_cupy(data, mean))
        ):
            return self._fused(data, g, square, velocity, mean, rate, step)
        g = with_weight_decay(g, data, self.weight_decay)
        square = keep_array(alpha * square + (1.0 - alpha) * (g * g), data)
        if self.centered:
            mean = keep_array(mean + (1.0 - alpha) * (g - mean), data)
            root = _sqrt(square - mean * mean)  # (a variance that rounds below 0: NaN, as PyTorch's)
        else:
            root = square**0.5
        scaled = g / (root + self.epsilon)
        if self.momentum > 0.0:
            velocity = keep_array(scaled if velocity is None else self.momentum * velocity + scaled, data)
            return keep_array(data - rate * velocity, data), (square, velocity, mean, step + 1)
        return keep_array(data - rate * scaled, data), (square, velocity, mean, step + 1)
