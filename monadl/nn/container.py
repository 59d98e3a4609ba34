"""Containers and reshaping layers: :class:`Sequential` and :class:`Flatten`.

A :class:`Sequential` is layers applied one after another, as PyTorch's ``nn.Sequential``: modules
(``Linear``, ``Conv2d``, ``Dropout``, another ``Sequential``) and plain functions of a layer
(``ml.relu``, ``ml.tanh``, a ``lambda``) alike. It is typed: the first layer says what the
container takes (an array for ``Conv2d``, indices for ``Embedding``), every later one takes an
``ArrayLayer`` and gives one, and mypy checks each; ``seq[k]`` and iteration give the layers back.
Its weights are its layers', named by position: ``"layers.0.w"`` (:func:`monadl.interop` names them
as PyTorch's ``nn.Sequential`` does, ``"0.weight"``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, overload

from monadl.dsl.core.layers import AnyArray, ArrayLayer
from monadl.dsl.ops.flatten import flatten
from monadl.nn.module import Module

__all__ = ["Flatten", "Layer", "Sequential"]

X = TypeVar("X", contravariant=True)

Layer = Callable[[ArrayLayer], ArrayLayer]
"""A layer of a :class:`Sequential` after the first: a function of an ``ArrayLayer`` to one (a
module such as ``Linear``, or ``ml.relu``)."""


@dataclass(frozen=True, eq=False, init=False)
class Sequential(Module, Generic[X]):
    """Layers applied in order: ``Sequential(first, *rest)(x)`` is ``rest[-1](...rest[0](first(x)))``,
    as PyTorch's ``nn.Sequential``. ``first`` takes the container's input (of type ``X``: what the
    first layer takes), each later layer an ``ArrayLayer``; every layer gives an ``ArrayLayer``."""

    layers: tuple[Callable[..., ArrayLayer], ...]
    """The layers, in the order they are applied."""

    @overload
    def __init__(self, first: Callable[[X], ArrayLayer], /, *rest: Layer) -> None: ...
    @overload
    def __init__(
        self: Sequential[AnyArray], first: Callable[[AnyArray], ArrayLayer], /, *rest: Layer
    ) -> None: ...
    def __init__(self, first: Callable[..., ArrayLayer], /, *rest: Layer) -> None:
        """``first``, then each of ``rest`` in order. An overloaded function first (``ml.relu``,
        whose forms take floats or arrays) makes a container of arrays."""
        for k, layer in enumerate((first, *rest)):
            if not callable(layer):
                raise TypeError(f"Sequential: layer {k} is a {type(layer).__name__}, not a callable layer")
        object.__setattr__(self, "layers", (first, *rest))

    def __call__(self, x: X) -> ArrayLayer:
        first, *rest = self.layers
        out = first(x)
        for layer in rest:
            out = layer(out)
        return out

    def __len__(self) -> int:
        return len(self.layers)

    def __iter__(self) -> Iterator[Callable[..., ArrayLayer]]:
        return iter(self.layers)

    @overload
    def __getitem__(self, index: int) -> Callable[..., ArrayLayer]: ...
    @overload
    def __getitem__(self, index: slice) -> tuple[Callable[..., ArrayLayer], ...]: ...
    def __getitem__(self, index: int | slice) -> Any:
        """The layer at ``index`` (a slice: a tuple of them)."""
        return self.layers[index]


@dataclass(frozen=True, eq=False)
class Flatten(Module):
    """The axes ``start_dim`` to ``end_dim`` of its input joined into one (:func:`~monadl.flatten`),
    as PyTorch's ``nn.Flatten``: by default every axis but the first, so (N, C, H, W) becomes
    (N, C * H * W). For one example without a batch axis (per-example code under dynamic batching),
    ``Flatten(0)`` or ``Flatten(-3)`` flattens (C, H, W). No weights."""

    start_dim: int = 1
    end_dim: int = -1

    def __call__(self, x: AnyArray) -> ArrayLayer:
        return flatten(x, self.start_dim, self.end_dim)
