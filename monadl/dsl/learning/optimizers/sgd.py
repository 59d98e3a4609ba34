"""Gradient descent: :class:`SGD` (with the in-place update a training step may use,
``UpdatesInPlace``) and :class:`Momentum` (heavy-ball, dense or lazy on a sparse gradient)."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

from monadl.dsl.fused import Kernel, on_cupy
from monadl.dsl.learning.optimizers import native
from monadl.dsl.learning.optimizers.base import (
    check_learning_settings,
    decay_parts,
    keep_array,
    lazy_rows,
    rate_at_step,
    summed_rows,
    with_rows,
    with_weight_decay,
)
from monadl.dsl.learning.optimizers.checks import array_problem, parts_problem, step_problem
from monadl.dsl.learning.schedules import LearningRate
from monadl.typeclasses.sparse import dense


@functools.cache
def _sgd_kernel(decay: bool) -> Kernel:
    wd, first, g = decay_parts(decay)
    return Kernel("sgd", ("d", "g"), ("rate", *wd), ("dnew",), (*first, f"dnew = d - rate * {g}"))


@functools.cache
def _momentum_kernel(decay: bool) -> Kernel:
    wd, first, g = decay_parts(decay)
    body = (*first, f"unew = mu * u + {g}", "dnew = d - rate * unew")
    return Kernel("momentum", ("d", "g", "u"), ("mu", "rate", *wd), ("dnew", "unew"), body)


@dataclass(frozen=True)
class SGD:
    """Plain gradient descent: ``data - learning_rate * gradient``. State: the step count."""

    learning_rate: LearningRate = 0.01
    weight_decay: float = 0.0

    def __post_init__(self) -> None:
        check_learning_settings(self.learning_rate, self.weight_decay)

    def init(self, data: Any) -> int:
        return 0

    def update(self, data: Any, gradient: Any, state: int | None) -> tuple[Any, Any]:
        step = state or 0
        rate = rate_at_step(self.learning_rate, step)
        sparse = None if self.weight_decay else summed_rows(gradient)
        if sparse is not None:  # the touched rows only: the rest keep ``data - lr * 0 == data``
            xp, rows, g = sparse
            return with_rows(xp, data, rows, data[rows] - rate * g), step + 1
        g = dense(gradient)
        if on_cupy(data, g):
            wd = self.weight_decay
            return _sgd_kernel(bool(wd))((data, g), (rate, wd) if wd else (rate,))[0], step + 1
        return keep_array(data - rate * with_weight_decay(g, data, self.weight_decay), data), step + 1

    def check_state(self, state: object, data: Any) -> str | None:
        """What is wrong with ``state`` for a weight holding ``data`` (None if nothing): it must
        be a step count (``None``, from earlier versions, counts as 0)."""
        return None if state is None else step_problem(state)

    def update_owned(self, data: Any, gradient: Any, state: int | None) -> tuple[Any, Any]:
        """``update`` for a gradient whose memory the caller hands over (a training step's own NumPy
        array, which nothing else holds): the new data is written into that memory, bit for bit
        ``update``'s result. It saves ``update``'s two fresh arrays as large as the weight; for a
        large weight glibc maps them anew on every step, and page-faulting them in costs several
        times the arithmetic (``docs/benchmarks.md``)."""
        new, step, _ = self.update_owned_checked(data, gradient, state)
        return new, step

    def update_owned_checked(
        self, data: Any, gradient: Any, state: int | None
    ) -> tuple[Any, Any, bool | None]:
        """:meth:`update_owned`, and whether every element of the new data is finite where the
        native kernel wrote it (it reads each as it writes it: a step's check needs no pass of its
        own over the weight); None otherwise."""
        if self.weight_decay or type(gradient) is not np.ndarray:
            new, step = self.update(data, gradient, state)
            return new, step, None
        step = state or 0
        rate = rate_at_step(self.learning_rate, step)
        finite = native.sgd(data, gradient, gradient, rate)  # (one pass where the kernels are built)
        if finite is None:
            # -(lr * g) + data rounds exactly as data - lr * g: negation is exact.
            np.multiply(gradient, -rate, out=gradient)
            np.add(data, gradient, out=gradient)
        return gradient, step + 1, finite


@dataclass(frozen=True)
class Momentum:
    """Gradient descent with (heavy-ball) momentum: ``v = momentum * v + g; data -= lr * v``.
    State: the velocity and the step count. ``lazy``: a sparse gradient updates its rows only."""

    learning_rate: LearningRate = 0.01
    momentum: float = 0.9
    weight_decay: float = 0.0
    lazy: bool = False

    def __post_init__(self) -> None:
        check_learning_settings(self.learning_rate, self.weight_decay)
        if not 0.0 <= self.momentum < 1.0:
            raise ValueError(f"momentum must be in [0, 1), got {self.momentum}")

    def init(self, data: Any) -> tuple[Any, int]:
        return keep_array(data * 0.0, data), 0

    def check_state(self, state: object, data: Any) -> str | None:
        """What is wrong with ``state`` for a weight holding ``data`` (None if nothing): it must be
        ``(velocity, step count)``, the velocity of the weight's shape and dtype."""
        problem = parts_problem(state, ("velocity", "step count"))
        if problem is not None or not isinstance(state, tuple):
            return problem
        return array_problem("velocity", state[0], data) or step_problem(state[1])

    def update(self, data: Any, gradient: Any, state: tuple[Any, int]) -> tuple[Any, tuple[Any, int]]:
        velocity, step = state
        rate = rate_at_step(self.learning_rate, step)
        sparse = lazy_rows(gradient, data, self.weight_decay) if self.lazy else None
        if sparse is not None:
            xp, rows, g = sparse
            new_velocity = with_rows(xp, velocity, rows, self.momentum * velocity[rows] + g)
            return with_rows(xp, data, rows, data[rows] - rate * new_velocity[rows]), (
                new_velocity,
                step + 1,
            )
        g = dense(gradient)
        if on_cupy(data, g, velocity):
            wd = self.weight_decay
            scalars = (self.momentum, rate, wd) if wd else (self.momentum, rate)
            new, velocity = _momentum_kernel(bool(wd))((data, g, velocity), scalars)
            return new, (velocity, step + 1)
        velocity = keep_array(self.momentum * velocity + with_weight_decay(g, data, self.weight_decay), data)
        return keep_array(data - rate * velocity, data), (velocity, step + 1)
