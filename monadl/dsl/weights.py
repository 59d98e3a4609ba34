"""``FloatWeight`` and ``ArrayWeight``: trainable variables.

A weight's forward is one ``Variable`` node, made once, so within a run every use of the weight is
one node: its delta is the sum of every use's, computed once per step, and it is the weight's
gradient. The optimizer applies all gradients at the end of a successful step (``training.py``);
nothing here changes ``data`` during the backward pass.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, final

import numpy as np

from monadl.do.do import Variable
from monadl.dsl.layers import ArrayOperators, FloatOperators
from monadl.dsl.optimizers import Optimizer
from monadl.typeclasses.backend import Array, check_float_array, freeze, namespace


class _WeightState:
    """What every weight holds: its data, an optional optimizer of its own, and that state."""

    __slots__ = ()
    data: Any
    optimizer: Optimizer | None
    optimizer_state: tuple[Optimizer, Any] | None
    name: str

    @property
    def size(self) -> float:
        return 1.0 if type(self.data) is float else float(np.prod(self.data.shape))


@final
class FloatWeight(FloatOperators, _WeightState):
    """A trainable float. ``optimizer`` overrides the model's default for this weight."""

    __slots__ = ("data", "name", "optimizer", "optimizer_state")
    data: float

    def __init__(self, data: float, *, optimizer: Optimizer | None = None, name: str = "") -> None:
        if isinstance(data, bool) or not isinstance(data, (float, int)):
            raise TypeError(f"FloatWeight: expected a float, got {type(data).__name__}")
        self.data = float(data)
        self.optimizer = optimizer
        self.optimizer_state = None
        self.name = name
        self.forward = Variable(self)

    def __repr__(self) -> str:
        return f"FloatWeight({self.data!r}{', name=' + repr(self.name) if self.name else ''})"


@final
class ArrayWeight(ArrayOperators, _WeightState):
    """A trainable array (copied on construction). ``optimizer`` overrides the model's default."""

    __slots__ = ("data", "name", "optimizer", "optimizer_state")
    data: Array

    def __init__(self, data: Array, *, optimizer: Optimizer | None = None, name: str = "") -> None:
        check_float_array(data, "ArrayWeight")
        self.data = freeze(namespace(data).asarray(data, copy=True))
        self.optimizer = optimizer
        self.optimizer_state = None
        self.name = name
        self.forward = Variable(self)

    @classmethod
    def normal(
        cls,
        shape: Sequence[int],
        *,
        std: float | None = None,
        seed: int | np.random.Generator = 0,
        dtype: type[np.floating[Any]] = np.float64,
        optimizer: Optimizer | None = None,
        name: str = "",
    ) -> ArrayWeight:
        """Normally distributed values, deterministic under ``seed``. The default ``std`` is
        ``sqrt(2 / fan_in)`` (He et al. 2015), with fan-in the first dimension."""
        rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
        shape = tuple(shape)
        if std is None:
            std = float(np.sqrt(2.0 / max(shape[0] if shape else 1, 1)))
        data = (rng.standard_normal(shape) * std).astype(dtype)
        return cls(data, optimizer=optimizer, name=name)

    @classmethod
    def zeros(
        cls,
        shape: Sequence[int],
        *,
        dtype: type[np.floating[Any]] = np.float64,
        optimizer: Optimizer | None = None,
        name: str = "",
    ) -> ArrayWeight:
        """Zeros (for biases)."""
        return cls(np.zeros(tuple(shape), dtype=dtype), optimizer=optimizer, name=name)

    def __repr__(self) -> str:
        named = f", name={self.name!r}" if self.name else ""
        return f"ArrayWeight(shape={tuple(self.data.shape)}, dtype={self.data.dtype}{named})"


Weight = FloatWeight | ArrayWeight
