"""Dense layers: :class:`Linear` (``x @ w + b``) and :class:`MLP` (a stack of them).

Every builder of ``monadl.nn`` is a frozen dataclass whose fields are its weights and sub-modules,
so ``module.weights()`` names them by path (``"layers.0.w"``), and a ``new`` class method that draws
its initial weights. ``seed`` is an int or a ``numpy.random.Generator``: a module of several weights
draws them all from one generator, in the order of its fields, so the same generator gives the same
weights. Modules compare and hash by identity, as weights do.

Every ``new`` takes ``xp=`` (an array namespace: ``cupy``, ``array_api_strict``; default NumPy) and
``device=``, with the meaning of ``module.to(xp, device=device)``: the weights are drawn by NumPy's
generator as they are for NumPy (a seed gives the same values on every device), then each is copied
to ``xp`` once, as ``to`` would copy it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import numpy as np

from monadl.dsl.core.layers import AnyArray, ArrayLayer
from monadl.dsl.core.weights import ArrayWeight
from monadl.dsl.ops.activations import relu
from monadl.dsl.ops.linalg import linear, matmul
from monadl.nn.init import Initializer
from monadl.nn.module import Module

Seed = int | np.random.Generator
"""Where initial weights come from: a seed, or a generator that the draws advance."""

Activation = Callable[[ArrayLayer], ArrayLayer]
"""An elementwise function between layers (``ml.relu``, ``ml.tanh``)."""


def generator(seed: Seed, name: str = "") -> np.random.Generator:
    """``seed`` itself if a generator, else a new generator seeded with it (a non-negative int:
    else a ValueError naming ``name``, the builder)."""
    if isinstance(seed, np.random.Generator):
        return seed
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        where = f"{name}: " if name else ""
        kind = ValueError if isinstance(seed, (int, np.integer)) and not isinstance(seed, bool) else TypeError
        raise kind(f"{where}seed must be a non-negative int or a numpy Generator, got {seed!r}")
    return np.random.default_rng(seed)


def positive(name: str, what: str, n: object) -> int:
    """``n``, a size of a builder (inputs, outputs, features, heads): a positive int, else a
    TypeError or ValueError naming the builder ``name`` (NumPy's own errors name neither, and a size
    of 0 divides by 0 in an initialiser's ``1 / sqrt(fan_in)``)."""
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
        raise TypeError(f"{name}: {what} must be a positive int, got {type(n).__name__} {n!r}")
    if n < 1:
        raise ValueError(f"{name}: {what} must be a positive int, got {n!r}")
    return int(n)


@dataclass(frozen=True, eq=False)
class Linear(Module):
    """``x @ w + b``: ``w`` of shape (inputs, outputs), ``b`` of shape (outputs,), or no bias
    (``b`` None: ``x @ w``). ``x`` has shape (..., inputs): a row, or rows."""

    w: ArrayWeight
    b: ArrayWeight | None = None

    def __post_init__(self) -> None:
        shape = tuple(self.w.data.shape)
        if len(shape) != 2:
            raise ValueError(f"Linear: w must have 2 dimensions (inputs, outputs), got shape {shape}")
        if self.b is not None and tuple(self.b.data.shape) != shape[1:]:
            raise ValueError(f"Linear: b must have shape {shape[1:]}, got {tuple(self.b.data.shape)}")

    @classmethod
    def new(
        cls,
        inputs: int,
        outputs: int,
        *,
        seed: Seed = 0,
        dtype: type[np.floating[Any]] = np.float32,
        bias: bool = True,
        std: float | None = None,
        init: Initializer | None = None,
        xp: Any = np,
        device: Any = None,
    ) -> Linear:
        """Normal weights of ``std`` (default ``1 / sqrt(inputs)``, LeCun's initialisation, as
        ``examples/tree_lstm.py``'s), or drawn by ``init`` (``nn.init.xavier_uniform``: of shape
        (inputs, outputs), the fans ``inputs`` and ``outputs``); a zero bias (none if not ``bias``).
        ``xp`` and ``device``: where the weights are (see the module)."""
        inputs, outputs = positive("Linear.new", "inputs", inputs), positive("Linear.new", "outputs", outputs)
        seed = generator(seed, "Linear.new")
        if init is not None:
            if std is not None:
                raise ValueError(f"Linear.new: give std or init, not both (std={std}, init={init!r})")
            w = ArrayWeight(init((inputs, outputs), seed=seed, dtype=dtype), xp=xp, device=device)
        else:
            std = inputs**-0.5 if std is None else std
            w = ArrayWeight.normal((inputs, outputs), std=std, seed=seed, dtype=dtype, xp=xp, device=device)
        b = ArrayWeight.zeros((outputs,), dtype=dtype, xp=xp, device=device) if bias else None
        return cls(w, b)

    @property
    def inputs(self) -> int:
        return int(self.w.data.shape[0])

    @property
    def outputs(self) -> int:
        return int(self.w.data.shape[1])

    def __call__(self, x: AnyArray) -> ArrayLayer:
        return matmul(x, self.w) if self.b is None else linear(x, self.w, self.b)


@dataclass(frozen=True, eq=False)
class MLP(Module):
    """Linear layers with ``activation`` between them and none after the last (the output is the
    last layer's, for a loss to read). ``activation`` is not a weight: ``weights()`` skips it."""

    layers: list[Linear]
    activation: Activation

    def __post_init__(self) -> None:
        if not self.layers:
            raise ValueError("MLP: needs at least one layer")

    @classmethod
    def new(
        cls,
        sizes: Sequence[int],
        *,
        activation: Activation = relu,
        seed: Seed = 0,
        dtype: type[np.floating[Any]] = np.float32,
        init: Initializer | None = None,
        xp: Any = np,
        device: Any = None,
    ) -> MLP:
        """Layers of ``sizes[k] -> sizes[k + 1]`` (``[4, 16, 3]``: two layers), drawn in order from
        one generator (see :meth:`Linear.new`; ``init``, ``xp`` and ``device`` for every layer)."""
        if len(sizes) < 2:
            raise ValueError(f"MLP.new: sizes needs an input and an output size at least, got {list(sizes)}")
        for n in sizes:
            positive("MLP.new", f"each of sizes {list(sizes)}", n)
        rng = generator(seed, "MLP.new")
        layers = [
            Linear.new(n, m, seed=rng, dtype=dtype, init=init, xp=xp, device=device)
            for n, m in pairwise(sizes)
        ]
        return cls(layers, activation)

    def __call__(self, x: AnyArray) -> ArrayLayer:
        *hidden, last = self.layers
        for layer in hidden:
            x = self.activation(layer(x))
        return last(x)
