"""Optimizers: immutable configurations with a pure update rule.

``update(data, gradient, state) -> (new_data, new_state)`` computes new values without touching the
old ones, so a training step can compute every weight's update first and commit them all at once
(or none, if anything fails). The rules use only operators and ``** 0.5``, so they serve floats and
arrays of any array-API library alike. ``weight_decay`` adds L2 regularisation:
``gradient + weight_decay * data``. All optimizers are deterministic (no randomness).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol


class Optimizer(Protocol):
    """An update rule with its hyper-parameters."""

    def init(self, data: Any) -> Any:
        """The initial state for a weight holding ``data``."""
        ...

    def update(self, data: Any, gradient: Any, state: Any) -> tuple[Any, Any]:
        """The weight's new data and the new state (without modifying the old ones)."""
        ...


def _check(learning_rate: float, weight_decay: float) -> None:
    if not learning_rate > 0.0:
        raise ValueError(f"learning_rate must be > 0, got {learning_rate}")
    if weight_decay < 0.0:
        raise ValueError(f"weight_decay must be >= 0, got {weight_decay}")


def _decayed(gradient: Any, data: Any, weight_decay: float) -> Any:
    return gradient + weight_decay * data if weight_decay else gradient


@dataclass(frozen=True)
class SGD:
    """Plain gradient descent: ``data - learning_rate * gradient``."""

    learning_rate: float = 0.01
    weight_decay: float = 0.0

    def __post_init__(self) -> None:
        _check(self.learning_rate, self.weight_decay)

    def init(self, data: Any) -> None:
        return None

    def update(self, data: Any, gradient: Any, state: None) -> tuple[Any, None]:
        return data - self.learning_rate * _decayed(gradient, data, self.weight_decay), None


@dataclass(frozen=True)
class Momentum:
    """Gradient descent with (heavy-ball) momentum: ``v = momentum * v + g; data -= lr * v``."""

    learning_rate: float = 0.01
    momentum: float = 0.9
    weight_decay: float = 0.0

    def __post_init__(self) -> None:
        _check(self.learning_rate, self.weight_decay)
        if not 0.0 <= self.momentum < 1.0:
            raise ValueError(f"momentum must be in [0, 1), got {self.momentum}")

    def init(self, data: Any) -> Any:
        return data * 0.0

    def update(self, data: Any, gradient: Any, state: Any) -> tuple[Any, Any]:
        velocity = self.momentum * state + _decayed(gradient, data, self.weight_decay)
        return data - self.learning_rate * velocity, velocity


@dataclass(frozen=True)
class Adam:
    """Adam (Kingma and Ba 2015), with bias correction."""

    learning_rate: float = 0.001
    beta1: float = 0.9
    beta2: float = 0.999
    epsilon: float = 1e-8
    weight_decay: float = 0.0

    def __post_init__(self) -> None:
        _check(self.learning_rate, self.weight_decay)
        if not (0.0 <= self.beta1 < 1.0 and 0.0 <= self.beta2 < 1.0):
            raise ValueError(f"betas must be in [0, 1), got {self.beta1}, {self.beta2}")

    def init(self, data: Any) -> tuple[Any, Any, int]:
        return data * 0.0, data * 0.0, 0

    def update(self, data: Any, gradient: Any, state: tuple[Any, Any, int]) -> tuple[Any, Any]:
        m, v, t = state
        g = _decayed(gradient, data, self.weight_decay)
        t += 1
        m = self.beta1 * m + (1.0 - self.beta1) * g
        v = self.beta2 * v + (1.0 - self.beta2) * (g * g)
        m_hat = m / (1.0 - self.beta1**t)
        v_hat = v / (1.0 - self.beta2**t)
        return data - self.learning_rate * m_hat / (v_hat**0.5 + self.epsilon), (m, v, t)


@dataclass(frozen=True)
class Adagrad:
    """Adagrad (Duchi et al. 2011): per-coordinate rates from the sum of squared gradients."""

    learning_rate: float = 0.01
    epsilon: float = 1e-8
    weight_decay: float = 0.0

    def __post_init__(self) -> None:
        _check(self.learning_rate, self.weight_decay)

    def init(self, data: Any) -> Any:
        return data * 0.0

    def update(self, data: Any, gradient: Any, state: Any) -> tuple[Any, Any]:
        g = _decayed(gradient, data, self.weight_decay)
        total = state + g * g
        return data - self.learning_rate * g / (total**0.5 + self.epsilon), total
