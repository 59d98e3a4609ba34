"""Batch normalisation layers with running statistics kept as buffers.

``BatchNorm1d`` takes ``(N, C)`` or ``(N, C, L)``, ``BatchNorm2d`` ``(N, C, H, W)`` (channels on
axis 1, NCHW, as PyTorch's). In a training step's forward pass (``train``, ``train_blocking``) the
layer normalises by the batch's statistics and stages the running statistics' update,
``(1 - momentum) * running + momentum * batch`` (the variance the batch's unbiased one, as
PyTorch's), which the step commits with its weights: a failed step leaves them as they were. A
training batch needs 2 values per channel at least (PyTorch's rule): fewer is a ``ShapeError``,
where one value would shrink the running variance to 0 and none make it NaN. A
prediction normalises by the running statistics, as last committed. ``compute_gradients`` runs
in training mode (the batch's statistics) but commits nothing, so the running statistics do not
change there.

The running statistics are :class:`~monadl.nn.ArrayBuffer`\\ s (``running_mean``,
``running_var``): not trainable, saved and loaded by checkpoints, moved by ``module.to(xp)``. A
checkpoint's running variance with a negative entry is refused (``check_state``): normalising by it
would make predictions NaN.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Self

import numpy as np

from monadl.dsl.core.layers import AnyArray, ArrayLayer, apply_array, is_float_kind
from monadl.dsl.core.weights import ArrayWeight
from monadl.dsl.ops.batch_norm import BATCH_NORM
from monadl.nn.buffer import ArrayBuffer, BufferState
from monadl.nn.module import Module

__all__ = ["BatchNorm1d", "BatchNorm2d"]


class _Variance(ArrayBuffer):
    """A running variance: an :class:`ArrayBuffer` whose state from outside (a checkpoint's) is
    refused where an entry is negative (its square root is taken). NaN is the finite check's."""

    __slots__ = ()

    def check_state(self, state: BufferState) -> str | None:
        problem = super().check_state(state)
        if problem is None and bool(np.any(state.arrays["data"] < 0)):
            return "a running variance has a negative entry"
        return problem


@dataclass(eq=False)
class _BatchNorm(Module):
    """Batch normalisation over axis 1 (see the module): a per-channel scale ``weight`` and shift
    ``bias``, and the running statistics. Equal only to itself (the op keeps it by identity)."""

    weight: ArrayWeight
    bias: ArrayWeight
    running_mean: ArrayBuffer
    running_var: ArrayBuffer
    momentum: float = 0.1
    eps: float = 1e-5
    ranks: ClassVar[tuple[int, ...]] = ()

    def __post_init__(self) -> None:
        for name in ("momentum", "eps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(
                    f"{type(self).__name__}: {name} must be a float, got {type(value).__name__} {value!r}"
                )
            setattr(self, name, float(value))
        if not 0.0 <= self.momentum <= 1.0:
            raise ValueError(f"{type(self).__name__}: momentum must be in [0, 1], got {self.momentum}")
        if not self.eps > 0.0:
            raise ValueError(f"{type(self).__name__}: eps must be positive, got {self.eps}")

    @classmethod
    def new(
        cls,
        channels: int,
        *,
        momentum: float = 0.1,
        eps: float = 1e-5,
        dtype: type[np.floating[Any]] = np.float32,
        xp: Any = np,
        device: Any = None,
    ) -> Self:
        """A layer of ``channels`` channels: scale ones, shift zeros, running mean zeros and
        running variance ones (PyTorch's start), weights and running statistics in the namespace
        ``xp`` (on ``device``), as :meth:`~monadl.nn.Linear.new`'s."""
        if isinstance(channels, bool) or not isinstance(channels, int) or channels < 1:
            raise ValueError(f"{cls.__name__}.new: channels must be a positive int, got {channels!r}")
        ones = np.ones((channels,), dtype=dtype)
        return cls(
            ArrayWeight(ones, xp=xp, device=device),
            ArrayWeight.zeros((channels,), dtype=dtype, xp=xp, device=device),
            ArrayBuffer(np.zeros((channels,), dtype=dtype), xp=xp, device=device),
            _Variance(ones, xp=xp, device=device),
            momentum=momentum,
            eps=eps,
        )

    def __call__(self, x: AnyArray) -> ArrayLayer:
        """``x`` normalised: by the batch's statistics in a training step, else the running ones."""
        if is_float_kind(x):
            raise TypeError(f"{type(self).__name__}: expected an array, got {type(x).__name__}")
        return apply_array(BATCH_NORM, x, self.weight, self.bias, eps=self.eps, stats=self)

    def __repr__(self) -> str:
        (channels,) = tuple(self.running_mean.data.shape)
        return f"{type(self).__name__}({channels}, momentum={self.momentum}, eps={self.eps})"


@dataclass(eq=False, repr=False)
class BatchNorm1d(_BatchNorm):
    """Batch normalisation of ``(N, C)`` or ``(N, C, L)`` inputs (see the module)."""

    ranks: ClassVar[tuple[int, ...]] = (2, 3)


@dataclass(eq=False, repr=False)
class BatchNorm2d(_BatchNorm):
    """Batch normalisation of ``(N, C, H, W)`` inputs (see the module)."""

    ranks: ClassVar[tuple[int, ...]] = (4,)
