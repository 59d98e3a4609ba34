"""Normalisation layers: :class:`LayerNorm`, :class:`GroupNorm` and :class:`RMSNorm`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from monadl.dsl.core.layers import AnyArray, ArrayLayer
from monadl.dsl.core.weights import ArrayWeight
from monadl.dsl.ops.norm import group_norm, layer_norm, rms_norm
from monadl.nn.linear import positive
from monadl.nn.module import Module

__all__ = ["GroupNorm", "LayerNorm", "RMSNorm"]


@dataclass(frozen=True, eq=False)
class LayerNorm(Module):
    """:func:`~monadl.layer_norm` over the last axis: each vector of ``x`` (shape (..., features))
    normalised, then scaled by ``weight`` and shifted by ``bias`` (shape (features,); None: no
    scale, or no shift)."""

    weight: ArrayWeight | None
    bias: ArrayWeight | None
    eps: float = 1e-5

    def __post_init__(self) -> None:
        shapes = {tuple(w.data.shape) for w in (self.weight, self.bias) if w is not None}
        if len(shapes) > 1 or any(len(s) != 1 for s in shapes):
            raise ValueError(f"LayerNorm: weight and bias must be vectors of one size, got shapes {shapes}")
        if not self.eps > 0.0:
            raise ValueError(f"LayerNorm: eps must be positive, got {self.eps!r}")

    @classmethod
    def new(
        cls,
        features: int,
        *,
        eps: float = 1e-5,
        affine: bool = True,
        dtype: type[np.floating[Any]] = np.float32,
        xp: Any = np,
        device: Any = None,
    ) -> LayerNorm:
        """A weight of ones and a bias of zeros, as PyTorch's (none if not ``affine``), in the
        namespace ``xp`` (on ``device``), as :meth:`~monadl.nn.Linear.new`'s."""
        features = positive("LayerNorm.new", "features", features)
        if not affine:
            return cls(None, None, eps)
        ones = ArrayWeight(np.ones((features,), dtype=dtype), xp=xp, device=device)
        return cls(ones, ArrayWeight.zeros((features,), dtype=dtype, xp=xp, device=device), eps)

    def __call__(self, x: AnyArray) -> ArrayLayer:
        return layer_norm(x, self.weight, self.bias, eps=self.eps)


@dataclass(frozen=True, eq=False)
class GroupNorm(Module):
    """:func:`~monadl.group_norm`, as PyTorch's ``nn.GroupNorm``: the channels (axis ``axis``,
    PyTorch's 1 of (N, C, *)) split into ``groups`` groups, each group's elements normalised, then
    scaled by ``weight`` and shifted by ``bias`` per channel (shape (C,); None: no scale, or no
    shift). For one example without a batch axis, give the channel axis from the end
    (``axis=-3`` for (C, H, W))."""

    weight: ArrayWeight | None
    bias: ArrayWeight | None
    groups: int
    eps: float = 1e-5
    axis: int = 1

    def __post_init__(self) -> None:
        shapes = {tuple(w.data.shape) for w in (self.weight, self.bias) if w is not None}
        if len(shapes) > 1 or any(len(s) != 1 for s in shapes):
            raise ValueError(f"GroupNorm: weight and bias must be vectors of one size, got shapes {shapes}")
        groups = positive("GroupNorm", "groups", self.groups)
        if any(s[0] % groups for s in shapes):
            raise ValueError(f"GroupNorm: {groups} groups do not divide channels of shapes {shapes}")
        _check_eps("GroupNorm", self.eps)

    @classmethod
    def new(
        cls,
        groups: int,
        channels: int,
        *,
        eps: float = 1e-5,
        affine: bool = True,
        axis: int = 1,
        dtype: type[np.floating[Any]] = np.float32,
        xp: Any = np,
        device: Any = None,
    ) -> GroupNorm:
        """``channels`` in ``groups`` groups (PyTorch's ``num_groups``, ``num_channels``): a weight
        of ones and a bias of zeros, as PyTorch's (none if not ``affine``), in the namespace ``xp``
        (on ``device``)."""
        groups = positive("GroupNorm.new", "groups", groups)
        channels = positive("GroupNorm.new", "channels", channels)
        if channels % groups:
            raise ValueError(f"GroupNorm.new: {groups} groups do not divide {channels} channels")
        if not affine:
            return cls(None, None, groups, eps, axis)
        ones = ArrayWeight(np.ones((channels,), dtype=dtype), xp=xp, device=device)
        zeros = ArrayWeight.zeros((channels,), dtype=dtype, xp=xp, device=device)
        return cls(ones, zeros, groups, eps, axis)

    def __call__(self, x: AnyArray) -> ArrayLayer:
        return group_norm(x, self.groups, self.weight, self.bias, eps=self.eps, axis=self.axis)


@dataclass(frozen=True, eq=False)
class RMSNorm(Module):
    """:func:`~monadl.rms_norm`, as PyTorch's ``nn.RMSNorm``: ``x / sqrt(mean(x ** 2) + eps) *
    weight`` over the last axes of ``x``, those of ``normalized_shape``; ``weight`` of that shape,
    or None (no scale). ``eps`` None: the machine epsilon of ``x``'s dtype, as PyTorch's."""

    weight: ArrayWeight | None
    normalized_shape: tuple[int, ...]
    eps: float | None = None

    def __post_init__(self) -> None:
        if self.weight is not None and tuple(self.weight.data.shape) != tuple(self.normalized_shape):
            raise ValueError(
                f"RMSNorm: weight of shape {tuple(self.weight.data.shape)} does not fit the normalized "
                f"shape {tuple(self.normalized_shape)}"
            )
        if self.eps is not None:
            _check_eps("RMSNorm", self.eps)

    @classmethod
    def new(
        cls,
        normalized_shape: int | Sequence[int],
        *,
        eps: float | None = None,
        affine: bool = True,
        dtype: type[np.floating[Any]] = np.float32,
        xp: Any = np,
        device: Any = None,
    ) -> RMSNorm:
        """A weight of ones of ``normalized_shape`` (an int: one axis), as PyTorch's (none if not
        ``affine``, PyTorch's ``elementwise_affine``), in the namespace ``xp`` (on ``device``)."""
        given = normalized_shape if isinstance(normalized_shape, Sequence) else (normalized_shape,)
        shape = tuple(positive("RMSNorm.new", "each side of normalized_shape", n) for n in given)
        if not shape:
            raise ValueError("RMSNorm.new: normalized_shape must have one side at least, got ()")
        if not affine:
            return cls(None, shape, eps)
        return cls(ArrayWeight(np.ones(shape, dtype=dtype), xp=xp, device=device), shape, eps)

    def __call__(self, x: AnyArray) -> ArrayLayer:
        return rms_norm(x, self.normalized_shape, self.weight, eps=self.eps)


def _check_eps(name: str, eps: object) -> None:
    if isinstance(eps, bool) or not isinstance(eps, (int, float)):
        raise TypeError(f"{name}: eps must be a float, got {type(eps).__name__} {eps!r}")
    if not eps > 0.0:
        raise ValueError(f"{name}: eps must be positive, got {eps!r}")
