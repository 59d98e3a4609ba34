"""``FloatWeight`` and ``ArrayWeight``: trainable variables.

A weight's forward is one ``Variable`` node, made once, so within a run every use of the weight is
one node: its delta is the sum of every use's, computed once per step, and it is the weight's
gradient. The optimizer applies all gradients at the end of a successful step (``training.py``);
nothing here changes ``data`` during the backward pass.

A weight's data and optimizer state are versioned (``monadl.runtime.versions``): a run reads them as of
the commit it began after, and a step's commit makes all of its weights' new values visible at
once. ``weight.data`` is the newest committed data; assigning it is a commit of its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar, final

import numpy as np

from monadl.do.do import Variable
from monadl.dsl.core.arguments import int_sequence
from monadl.dsl.core.layers import ArrayOperators, FloatOperators
from monadl.dsl.learning.optimizers.base import Optimizer
from monadl.runtime.versions import COMMIT_LOCK, Version, publish, read
from monadl.typeclasses.backend import (
    Array,
    ShapeError,
    check_float_array,
    device_of,
    dtype_name,
    freeze,
    namespace,
    to_namespace,
)


class _WeightState:
    """What every weight holds: its versions (data and optimizer state), an optional optimizer of
    its own, and a name."""

    __slots__ = ()
    _array_value: ClassVar[str] = "weight.data"
    """What NumPy's functions are told to use for a weight's value (they refuse the weight itself:
    see :func:`~monadl.dsl.core.deep_learning.array_refusal`)."""
    head: Version
    optimizer: Optimizer | None
    name: str
    trainable: bool
    """False: a frozen weight. A training step neither updates it nor gives it optimizer state,
    though deltas flow through it to the weights it is combined with; ``compute_gradients`` still
    reports its gradient. Assign it between steps to freeze or unfreeze."""

    @property
    def data(self) -> Any:
        """The newest committed value."""
        return read(self.head, None).data

    @property
    def optimizer_state(self) -> tuple[Optimizer, Any] | None:
        """The optimizer that last updated the weight and its state (None before the first step)."""
        state: tuple[Optimizer, Any] | None = read(self.head, None).state
        return state

    @optimizer_state.setter
    def optimizer_state(self, value: object) -> None:
        raise AttributeError(
            "a weight's optimizer_state cannot be assigned: it changes only in a training step's "
            "commit, or by loading a checkpoint (ml.load), which checks it against the optimizer"
        )

    def _assign(self, data: Any) -> None:
        """Commits ``data``, keeping the optimizer state."""
        with COMMIT_LOCK:
            publish([(self, data, read(self.head, None).state)])

    @property
    def size(self) -> float:
        data = read(self.head, None).data
        return 1.0 if type(data) is float else float(np.prod(data.shape))


@final
class FloatWeight(_WeightState, FloatOperators):
    """A trainable float. ``optimizer`` overrides the model's default for this weight."""

    __slots__ = ("head", "name", "optimizer", "trainable")

    def __init__(
        self,
        data: float | np.floating[Any],
        *,
        optimizer: Optimizer | None = None,
        name: str = "",
        trainable: bool = True,
    ) -> None:
        self.head = Version(0, _checked_float(data), None, None)
        self.optimizer = optimizer
        self.trainable = trainable
        self.name = name
        self.graph = None
        self.row = -1
        self.variable = Variable(self)

    @property
    def data(self) -> float:
        """The newest committed value."""
        value: float = read(self.head, None).data
        return value

    @data.setter
    def data(self, value: float | np.floating[Any]) -> None:
        self._assign(_checked_float(value))

    def __repr__(self) -> str:
        return f"FloatWeight({self.data!r}{', name=' + repr(self.name) if self.name else ''})"


@final
class ArrayWeight(_WeightState, ArrayOperators):
    """A trainable array (copied on construction). ``optimizer`` overrides the model's default.
    ``xp``: the array namespace to hold it in (``cupy``, ``array_api_strict``; None: ``data``'s
    own), on ``device`` where given, as ``module.to(xp, device=device)`` would move it; the copy is
    the conversion."""

    __slots__ = ("head", "name", "optimizer", "trainable")

    def __init__(
        self,
        data: Array,
        *,
        optimizer: Optimizer | None = None,
        name: str = "",
        trainable: bool = True,
        xp: Any = None,
        device: Any = None,
    ) -> None:
        check_float_array(data, "ArrayWeight")
        if xp is None and device is None:
            copy = namespace(data).asarray(data, copy=True)
        else:
            copy = to_namespace(data, namespace(data) if xp is None else xp, device)
        self.head = Version(0, freeze(copy), None, None)
        self.optimizer = optimizer
        self.trainable = trainable
        self.name = name
        self.graph = None
        self.row = -1
        self.variable = Variable(self)

    @property
    def data(self) -> Array:
        """The newest committed value (read-only: assign a new array to change it)."""
        value: Array = read(self.head, None).data
        return value

    @data.setter
    def data(self, value: Array) -> None:
        """Commits a copy of ``value``, which must have the weight's shape and dtype (by name:
        ``float32`` of any namespace). An array of another namespace or device (a CuPy array for a
        NumPy weight) moves the weight there, before its first training step; once the weight has
        optimizer state, it is an error that names ``module.to(xp)`` / ``ml.to_device``, which move
        the state with the weight."""
        check_float_array(value, "ArrayWeight.data")
        version = read(self.head, None)
        have = version.data
        if tuple(value.shape) != tuple(have.shape) or dtype_name(value) != dtype_name(have):
            raise ShapeError(
                f"{self!r}.data = {dtype_name(value)} array of shape {tuple(value.shape)}: "
                f"the weight holds {dtype_name(have)} {tuple(have.shape)}"
            )
        moved = type(value) is not type(have) or device_of(value) != device_of(have)
        if moved and version.state is not None:
            raise ValueError(
                f"{self!r}.data = an array of {_library(value)} on {device_of(value)}: the weight, of "
                f"{_library(have)} on {device_of(have)}, has optimizer state, which an assignment "
                "cannot move; move the model with module.to(xp, device=...) or ml.to_device(model, "
                "xp), which move the state with the weights"
            )
        self._assign(freeze(namespace(value).asarray(value, copy=True)))

    @classmethod
    def normal(
        cls,
        shape: Sequence[int],
        *,
        std: float | None = None,
        seed: int | np.random.Generator = 0,
        dtype: type[np.floating[Any]] = np.float32,
        optimizer: Optimizer | None = None,
        name: str = "",
        trainable: bool = True,
        xp: Any = np,
        device: Any = None,
    ) -> ArrayWeight:
        """Normally distributed values, deterministic under ``seed``. The default ``std`` is
        ``sqrt(2 / fan_in)`` (He et al. 2015), with fan-in the first dimension. ``optimizer``,
        ``name`` and ``trainable`` as for the constructor. Drawn by NumPy's generator whatever
        ``xp`` (so a seed gives the same values on every device), then copied to ``xp`` (on
        ``device``) once."""
        shape = _shape("ArrayWeight.normal", shape)
        rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
        if std is None:
            std = float(np.sqrt(2.0 / max(shape[0] if shape else 1, 1)))
        data = (rng.standard_normal(shape) * std).astype(dtype)
        return cls(data, optimizer=optimizer, name=name, trainable=trainable, xp=xp, device=device)

    @classmethod
    def zeros(
        cls,
        shape: Sequence[int],
        *,
        dtype: type[np.floating[Any]] = np.float32,
        optimizer: Optimizer | None = None,
        name: str = "",
        trainable: bool = True,
        xp: Any = np,
        device: Any = None,
    ) -> ArrayWeight:
        """Zeros (for biases), in the namespace ``xp`` (on ``device``). ``optimizer``, ``name`` and
        ``trainable`` as for the constructor."""
        zeros = np.zeros(_shape("ArrayWeight.zeros", shape), dtype=dtype)
        return cls(zeros, optimizer=optimizer, name=name, trainable=trainable, xp=xp, device=device)

    @property
    def shape(self) -> tuple[int, ...]:
        """The shape of the weight's data: always known (a layer's may not be)."""
        return tuple(read(self.head, None).data.shape)

    def __repr__(self) -> str:
        named = f", name={self.name!r}" if self.name else ""
        return f"ArrayWeight(shape={tuple(self.data.shape)}, dtype={self.data.dtype}{named})"


def _library(array: object) -> str:
    """The library of an array, by its top module's name (``numpy``, ``cupy``, ``array_api_strict``)."""
    return type(array).__module__.partition(".")[0]


def _shape(where: str, shape: object) -> tuple[int, ...]:
    """A weight's shape: ints of 0 or more (NumPy's error for a negative one names no weight)."""
    sides = int_sequence(where, "shape", shape)
    if any(n < 0 for n in sides):
        raise ValueError(f"{where}: shape {sides} has a negative side")
    return sides


def _checked_float(data: object) -> float:
    """A float weight's value as a Python float: a float, an int, or a NumPy float scalar (a
    float32's value is exact in a float)."""
    if isinstance(data, bool) or not isinstance(data, (float, int, np.floating)):
        raise TypeError(f"FloatWeight: expected a float, got {type(data).__name__}")
    return float(data)


Weight = FloatWeight | ArrayWeight
