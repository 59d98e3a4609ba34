"""Gradient transformations (:func:`clip_by_global_norm`, :func:`clip_by_value`) and the
:func:`chain` that puts them before an optimizer, an optimizer itself."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast, overload

import numpy as np

from monadl.dsl.fused import sum_on_devices
from monadl.dsl.learning.optimizers.base import (
    ChecksState,
    GradientTransform,
    Optimizer,
    TransformsGradients,
    capabilities,
    summed_rows,
)
from monadl.typeclasses.backend import namespace
from monadl.typeclasses.sparse import SparseRows


def _sum_of_squares(gradient: Any) -> Any:
    """The sum of the squares of a gradient's entries (a sparse one's summed rows): a float, or a
    0-d array on the gradient's device off NumPy (read with the others': ``global_norm``)."""
    if type(gradient) is float:
        return gradient * gradient
    if type(gradient) is SparseRows:
        sparse = summed_rows(gradient)
        gradient = gradient.to_dense() if sparse is None else sparse[2]
    if type(gradient) is np.ndarray:
        return float(np.vdot(gradient, gradient))  # BLAS: one pass, no temporary array
    return namespace(gradient).sum(gradient * gradient)


def global_norm(gradients: Sequence[Any]) -> float:
    """The Euclidean norm of all the gradients together, as one vector (a sparse gradient counts
    as its dense equivalent: the squares of its summed rows). Off NumPy, the sums stay on the
    device and are read together: one wait for a GPU, not one per gradient."""
    total = 0.0
    on_devices = []
    for gradient in gradients:
        square = _sum_of_squares(gradient)
        if type(square) is float:
            total += square
        else:
            on_devices.append(square)
    if on_devices:
        total += sum_on_devices(on_devices)
    return math.sqrt(total)


def _scaled(gradient: Any, factor: float) -> Any:
    if type(gradient) is SparseRows:
        return gradient.with_values(gradient.values * factor)
    return gradient * factor


def _clipped(gradient: Any, limit: float) -> Any:
    if type(gradient) is float:  # NaN stays NaN (min and max would turn it into a limit)
        return limit if gradient > limit else -limit if gradient < -limit else gradient
    if type(gradient) is SparseRows:
        sparse = summed_rows(gradient)
        if sparse is None:
            gradient = gradient.to_dense()
        else:
            xp, rows, summed = sparse
            return SparseRows(rows, xp.clip(summed, -limit, limit), gradient.shape)
    return namespace(gradient).clip(gradient, -limit, limit)


@dataclass(frozen=True)
class ClipByGlobalNorm:
    """Scales all the gradients by ``max_norm / norm`` where their :func:`global_norm` exceeds
    ``max_norm`` (as optax's ``clip_by_global_norm``); leaves them as they are otherwise. A
    non-finite norm gives non-finite gradients, and the step fails (``NonFiniteGradientError``)."""

    max_norm: float

    def __post_init__(self) -> None:
        if not self.max_norm > 0.0:
            raise ValueError(f"clip_by_global_norm: max_norm must be > 0, got {self.max_norm}")

    def transform(self, gradients: list[Any]) -> list[Any]:
        norm = global_norm(gradients)
        if norm <= self.max_norm:
            return list(gradients)
        factor = self.max_norm / norm
        return [_scaled(g, factor) for g in gradients]


@dataclass(frozen=True)
class ClipByValue:
    """Clips every entry of every gradient to ``[-limit, limit]`` (a sparse gradient's summed
    rows: repeated indices are added first)."""

    limit: float

    def __post_init__(self) -> None:
        if not self.limit > 0.0:
            raise ValueError(f"clip_by_value: limit must be > 0, got {self.limit}")

    def transform(self, gradients: list[Any]) -> list[Any]:
        return [_clipped(g, self.limit) for g in gradients]


def clip_by_global_norm(max_norm: float) -> ClipByGlobalNorm:
    """Clipping by the global norm of all the gradients a :func:`chain` updates in a step."""
    return ClipByGlobalNorm(max_norm)


def clip_by_value(limit: float) -> ClipByValue:
    """Clipping of every gradient entry to ``[-limit, limit]``."""
    return ClipByValue(limit)


@dataclass(frozen=True)
class Chain:
    """Gradient transformations, then an optimizer: an optimizer itself (:func:`chain`).

    Its state is its optimizer's (a chain and its optimizer are of the same kind: adding clipping
    to a weight's Adam keeps the moments). A training step calls :meth:`transform_gradients` with
    the gradients of all the weights it updates with this chain, then :meth:`update` for each:
    ``update`` is the optimizer's alone, on a gradient already transformed."""

    transforms: tuple[GradientTransform, ...]
    optimizer: Optimizer

    def __post_init__(self) -> None:
        for t in self.transforms:
            if not isinstance(t, GradientTransform):
                raise TypeError(f"chain: {t!r} is not a gradient transformation (it has no transform method)")
        try:
            capabilities(self.optimizer)
        except TypeError as e:
            raise TypeError(f"chain: {e}") from None

    def init(self, data: Any) -> Any:
        return self.optimizer.init(data)

    def update(self, data: Any, gradient: Any, state: Any) -> tuple[Any, Any]:
        return self.optimizer.update(data, gradient, state)

    def check_state(self, state: object, data: Any) -> str | None:
        """Its optimizer's ``check_state`` (None where that optimizer has none: it is not checked)."""
        inner = self.optimizer
        return inner.check_state(state, data) if isinstance(inner, ChecksState) else None

    def transform_gradients(self, gradients: list[Any]) -> list[Any]:
        """The gradients of every weight of a step that this chain updates, transformed in turn
        (an inner chain's transformations last)."""
        for t in self.transforms:
            gradients = t.transform(gradients)
        inner = self.optimizer
        if capabilities(inner).transforms_gradients:
            return list(cast(TransformsGradients, inner).transform_gradients(gradients))
        return gradients


@overload
def chain(t1: GradientTransform, optimizer: Optimizer, /) -> Chain: ...
@overload
def chain(t1: GradientTransform, t2: GradientTransform, optimizer: Optimizer, /) -> Chain: ...
@overload
def chain(
    t1: GradientTransform, t2: GradientTransform, t3: GradientTransform, optimizer: Optimizer, /
) -> Chain: ...
def chain(*parts: GradientTransform | Optimizer) -> Chain:
    """Gradient transformations applied in order, then the optimizer (last), as one optimizer:
    ``chain(clip_by_global_norm(1.0), Adam(1e-3))``, usable wherever an optimizer is."""
    if len(parts) < 2:
        raise TypeError("chain: expected one or more gradient transformations, then an optimizer")
    *transforms, optimizer = parts
    return Chain(tuple(transforms), optimizer)  # type: ignore[arg-type]
