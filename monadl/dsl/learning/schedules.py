"""Learning-rate schedules: the rate as a function of the step.

A schedule is any ``(step: int) -> float``. ``step`` is the number of updates the weight has had
before this one (0 for its first), counted by its optimizer in the weight's state: it goes on
across new optimizer values of the same kind (a new ``Adam`` with another schedule continues at the
step the old one reached), so a schedule never restarts by accident. An optimizer takes a schedule
wherever it takes a learning rate: ``ml.Adam(ml.CosineDecay(1e-3, steps=10_000))``.

The schedules here are small frozen dataclasses (equal settings, equal schedules) that compose:
``LinearWarmup(1e-3, 100, then=CosineDecay(1e-3, 900))`` warms up for 100 steps, then decays.

A checkpoint (:mod:`monadl.checkpoint`) saves a schedule by its class and settings, so only the
classes here can be saved: a plain function (or a class of your own) trains, but ``ml.save``
refuses it with a ``TypeError`` naming the weight and the schedule.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol, TypeAlias

__all__ = ["Constant", "CosineDecay", "LearningRate", "LinearWarmup", "Schedule", "StepDecay"]


class Schedule(Protocol):
    """A learning rate as a function of the step (0 for a weight's first update)."""

    def __call__(self, step: int) -> float: ...


LearningRate: TypeAlias = float | Schedule
"""What an optimizer takes as its learning rate: a constant, or a schedule of the step."""


def _positive(name: str, value: float) -> None:
    if not value > 0.0:
        raise ValueError(f"{name} must be > 0, got {value}")


def _steps(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")


@dataclass(frozen=True)
class Constant:
    """``value`` at every step."""

    value: float

    def __post_init__(self) -> None:
        _positive("Constant: value", self.value)

    def __call__(self, step: int) -> float:
        return self.value


@dataclass(frozen=True)
class StepDecay:
    """``initial * factor ** (step // every)``: multiplied by ``factor`` every ``every`` steps."""

    initial: float
    factor: float = 0.1
    every: int = 1000

    def __post_init__(self) -> None:
        _positive("StepDecay: initial", self.initial)
        if not 0.0 < self.factor <= 1.0:
            raise ValueError(f"StepDecay: factor must be in (0, 1], got {self.factor}")
        _steps("StepDecay: every", self.every)

    def __call__(self, step: int) -> float:
        return self.initial * self.factor ** (step // self.every)


@dataclass(frozen=True)
class CosineDecay:
    """From ``initial`` at step 0 to ``final`` at step ``steps`` along half a cosine, then
    ``final``: ``final + (initial - final) * (1 + cos(pi * min(step, steps) / steps)) / 2``."""

    initial: float
    steps: int
    final: float = 0.0

    def __post_init__(self) -> None:
        _positive("CosineDecay: initial", self.initial)
        _steps("CosineDecay: steps", self.steps)
        if not 0.0 <= self.final <= self.initial:
            raise ValueError(f"CosineDecay: final must be in [0, initial], got {self.final}")

    def __call__(self, step: int) -> float:
        progress = min(step, self.steps) / self.steps
        return self.final + (self.initial - self.final) * 0.5 * (1.0 + math.cos(math.pi * progress))


@dataclass(frozen=True)
class LinearWarmup:
    """``peak * (step + 1) / steps`` for the first ``steps`` steps (so the first update is not
    wasted at rate 0, and step ``steps - 1`` reaches ``peak``); then ``then(step - steps)``, or
    ``peak`` where ``then`` is None (``then`` starts at its own step 0 when the warm-up ends)."""

    peak: float
    steps: int
    then: Schedule | None = None

    def __post_init__(self) -> None:
        _positive("LinearWarmup: peak", self.peak)
        _steps("LinearWarmup: steps", self.steps)

    def __call__(self, step: int) -> float:
        if step < self.steps:
            return self.peak * (step + 1) / self.steps
        return self.peak if self.then is None else self.then(step - self.steps)
