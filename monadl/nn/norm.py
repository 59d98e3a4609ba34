"""Normalisation layers: :class:`LayerNorm`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from monadl.dsl.layers import AnyArray, ArrayLayer
from monadl.dsl.norm import layer_norm
from monadl.dsl.weights import ArrayWeight
from monadl.nn.linear import positive
from monadl.nn.module import Module

__all__ = ["LayerNorm"]


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
