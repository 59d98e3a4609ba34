"""``FloatWeight`` and ``ArrayWeight``: trainable variables.

A weight's forward is one constant ``Delay`` node, so within a run every use of the weight shares one
tape: its reference count is the number of uses, and its backward runs once per step with the summed
delta, recording it in the step's gradients. The optimizer applies all gradients at the end of a
successful step (``training.py``); nothing here changes ``data`` during the backward pass.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, final

import numpy as np

from monadl.do.do import MAP, UNIT, Delay, Do, PrivateBind
from monadl.dsl.layers import ArrayOperators, FloatOperators
from monadl.dsl.optimizers import Optimizer
from monadl.tape.shared import SharedTape, StepContext, current_step
from monadl.typeclasses.backend import Array, check_float_array, namespace
from monadl.typeclasses.monoid import SUM


def freeze(data: Any) -> Any:
    """``data``, made read-only where the array library allows it (NumPy). A weight's data is
    replaced, never changed in place, by a training step; forward values and tapes may share it, so
    an accidental in-place change of a prediction must not change the weight."""
    if isinstance(data, np.ndarray):
        data.flags.writeable = False
    return data


class WeightTape(SharedTape[Any, Any]):
    """A weight's tape in one run: its backward records the summed delta as the gradient."""

    __slots__ = ("step", "weight")
    sparse_deltas = True
    """It records a SparseRows delta (an embedding table's) as the gradient, as it is."""

    def __init__(self, weight: FloatWeight | ArrayWeight, step: StepContext | None) -> None:
        super().__init__(weight.data)
        self.fanout = 1  # its backward reads its delta once: to record it
        self.weight = weight
        self.step = step

    def _sum(self, deltas: Sequence[Do[Any]]) -> Do[Any]:
        return SUM.sum_lazy(deltas, self.weight.size)

    def _backward(self, delta: Do[Any]) -> Do[None]:
        step = self.step
        if step is None:  # a forward pass outside training: nothing to record
            return UNIT
        weight = self.weight
        return PrivateBind((delta,), lambda d: step.record(weight, d), MAP)


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

    def _tape(self) -> WeightTape:
        step = current_step()
        tape = WeightTape(self, step)  # type: ignore[arg-type]
        if step is not None:
            step.register(tape)
        return tape


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
        self.forward = Delay(self._tape)

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
        self.forward = Delay(self._tape)

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
