"""Convolution and pooling modules: :class:`Conv1d`, :class:`Conv2d`, :class:`ConvTranspose2d`,
:class:`MaxPool2d`, :class:`AvgPool2d` and :class:`AdaptiveAvgPool2d`, over :mod:`monadl.dsl.ops.conv`,
:mod:`monadl.dsl.ops.pooling`, :mod:`monadl.dsl.ops.conv_transpose` and :mod:`monadl.dsl.ops.adaptive_pool`.

Channels first, as PyTorch (NCHW): an input has shape ``(..., C, H, W)`` (``Conv1d``:
``(..., C, L)``), a kernel ``(O, C // groups, KH, KW)`` (``ConvTranspose2d``'s, as PyTorch's:
``(C, O // groups, KH, KW)``). Calls of one module on inputs of one shape merge under dynamic
batching (one product for all of them).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from monadl.dsl.core.layers import AnyArray, ArrayLayer
from monadl.dsl.core.weights import ArrayWeight
from monadl.dsl.ops.adaptive_pool import adaptive_avg_pool2d
from monadl.dsl.ops.conv import Padding, Size, conv1d, conv2d
from monadl.dsl.ops.conv_transpose import conv_transpose2d
from monadl.dsl.ops.pooling import avg_pool2d, max_pool2d
from monadl.nn.init import Initializer
from monadl.nn.linear import Seed, generator, positive
from monadl.nn.module import Module


def _pair(name: str, value: int | Sequence[int], spatial: int) -> tuple[int, ...]:
    sizes = (value,) * spatial if isinstance(value, int) else tuple(value)
    if len(sizes) != spatial or any(n < 1 for n in sizes):
        raise ValueError(f"{name}: kernel_size must be {spatial} positive int(s), got {value!r}")
    return sizes


def _kernel_weights(
    name: str,
    spatial: int,
    inputs: int,
    outputs: int,
    kernel_size: int | Sequence[int],
    groups: int,
    seed: Seed,
    dtype: type[np.floating[Any]],
    bias: bool,
    xp: Any,
    device: Any,
) -> tuple[ArrayWeight, ArrayWeight | None]:
    """Normal kernels of std ``1 / sqrt(fan_in)`` (fan_in: ``inputs // groups`` times the kernel's
    size, LeCun's initialisation, as :class:`~monadl.nn.Linear`'s), and a zero bias."""
    kernel = _pair(name, kernel_size, spatial)
    inputs, outputs = positive(f"{name}.new", "inputs", inputs), positive(f"{name}.new", "outputs", outputs)
    if groups < 1 or inputs % groups or outputs % groups:
        raise ValueError(f"{name}: {inputs} inputs and {outputs} outputs do not divide into {groups} groups")
    fan_in = inputs // groups * math.prod(kernel)
    shape = (outputs, inputs // groups, *kernel)
    w = ArrayWeight.normal(
        shape, std=fan_in**-0.5, seed=generator(seed, f"{name}.new"), dtype=dtype, xp=xp, device=device
    )
    return w, ArrayWeight.zeros((outputs,), dtype=dtype, xp=xp, device=device) if bias else None


def _check(name: str, spatial: int, w: ArrayWeight, b: ArrayWeight | None) -> None:
    shape = tuple(w.data.shape)
    if len(shape) != spatial + 2:
        raise ValueError(f"{name}: w must have {spatial + 2} dimensions (O, C // groups, ...), got {shape}")
    if b is not None and tuple(b.data.shape) != shape[:1]:
        raise ValueError(f"{name}: b must have shape {shape[:1]}, got {tuple(b.data.shape)}")


@dataclass(frozen=True, eq=False)
class _Conv(Module):
    """What :class:`Conv1d` and :class:`Conv2d` share: their fields, checked, and the call of the
    op over ``_spatial`` axes that they set."""

    _spatial: ClassVar[int]
    w: ArrayWeight
    b: ArrayWeight | None = None
    stride: Size = 1
    padding: Padding = 0
    dilation: Size = 1
    groups: int = 1

    def __post_init__(self) -> None:
        _check(f"Conv{self._spatial}d", self._spatial, self.w, self.b)

    def __call__(self, x: AnyArray) -> ArrayLayer:
        conv = conv1d if self._spatial == 1 else conv2d
        return conv(
            x,
            self.w,
            self.b,
            stride=self.stride,
            padding=self.padding,
            dilation=self.dilation,
            groups=self.groups,
        )


@dataclass(frozen=True, eq=False)
class Conv2d(_Conv):
    """2d convolution (:func:`~monadl.conv2d`): ``w`` of shape (O, C // groups, KH, KW), ``b`` (O,)
    or None. Input (..., C, H, W), output (..., O, OH, OW)."""

    _spatial = 2

    @classmethod
    def new(
        cls,
        inputs: int,
        outputs: int,
        kernel_size: int | Sequence[int],
        *,
        stride: Size = 1,
        padding: Padding = 0,
        dilation: Size = 1,
        groups: int = 1,
        bias: bool = True,
        seed: Seed = 0,
        dtype: type[np.floating[Any]] = np.float32,
        xp: Any = np,
        device: Any = None,
    ) -> Conv2d:
        """``inputs`` channels to ``outputs``, kernels of ``kernel_size`` (an int: square), drawn
        normal with std ``1 / sqrt(fan_in)``; a zero bias (none if not ``bias``). ``xp`` and
        ``device``: where the weights are, as :meth:`Linear.new`'s."""
        w, b = _kernel_weights(
            "Conv2d", 2, inputs, outputs, kernel_size, groups, seed, dtype, bias, xp, device
        )
        return cls(w, b, stride, padding, dilation, groups)


@dataclass(frozen=True, eq=False)
class Conv1d(_Conv):
    """1d convolution (:func:`~monadl.conv1d`): ``w`` of shape (O, C // groups, K), ``b`` (O,) or
    None. Input (..., C, L), output (..., O, OL)."""

    _spatial = 1

    @classmethod
    def new(
        cls,
        inputs: int,
        outputs: int,
        kernel_size: int,
        *,
        stride: Size = 1,
        padding: Padding = 0,
        dilation: Size = 1,
        groups: int = 1,
        bias: bool = True,
        seed: Seed = 0,
        dtype: type[np.floating[Any]] = np.float32,
        xp: Any = np,
        device: Any = None,
    ) -> Conv1d:
        """As :meth:`Conv2d.new`, with kernels of ``kernel_size`` along one axis."""
        w, b = _kernel_weights(
            "Conv1d", 1, inputs, outputs, kernel_size, groups, seed, dtype, bias, xp, device
        )
        return cls(w, b, stride, padding, dilation, groups)


@dataclass(frozen=True, eq=False)
class MaxPool2d(Module):
    """The maximum of each ``kernel_size`` window over the last two axes (:func:`~monadl.max_pool2d`);
    ``stride`` defaults to the kernel. No weights."""

    kernel_size: Size
    stride: Size | None = None
    padding: Size = 0

    def __call__(self, x: AnyArray) -> ArrayLayer:
        return max_pool2d(x, self.kernel_size, self.stride, self.padding)


@dataclass(frozen=True, eq=False)
class AvgPool2d(Module):
    """The mean of each ``kernel_size`` window over the last two axes (:func:`~monadl.avg_pool2d`);
    ``stride`` defaults to the kernel. No weights."""

    kernel_size: Size
    stride: Size | None = None
    padding: Size = 0

    def __call__(self, x: AnyArray) -> ArrayLayer:
        return avg_pool2d(x, self.kernel_size, self.stride, self.padding)


@dataclass(frozen=True, eq=False)
class ConvTranspose2d(Module):
    """2d transposed convolution (:func:`~monadl.conv_transpose2d`), as PyTorch's
    ``nn.ConvTranspose2d``: ``w`` of shape (C, O // groups, KH, KW) (PyTorch's layout, inputs
    first), ``b`` (O,) or None. Input (..., C, H, W), output (..., O, OH, OW), upsampled by
    ``stride``."""

    w: ArrayWeight
    b: ArrayWeight | None = None
    stride: Size = 1
    padding: Size = 0
    output_padding: Size = 0
    groups: int = 1
    dilation: Size = 1

    def __post_init__(self) -> None:
        shape = tuple(self.w.data.shape)
        if len(shape) != 4:
            raise ValueError(
                f"ConvTranspose2d: w must have 4 dimensions (C, O // groups, KH, KW), got {shape}"
            )
        outputs = shape[1] * self.groups
        if self.b is not None and tuple(self.b.data.shape) != (outputs,):
            raise ValueError(
                f"ConvTranspose2d: b must have shape ({outputs},), got {tuple(self.b.data.shape)}"
            )

    @classmethod
    def new(
        cls,
        inputs: int,
        outputs: int,
        kernel_size: int | Sequence[int],
        *,
        stride: Size = 1,
        padding: Size = 0,
        output_padding: Size = 0,
        groups: int = 1,
        dilation: Size = 1,
        bias: bool = True,
        seed: Seed = 0,
        dtype: type[np.floating[Any]] = np.float32,
        init: Initializer | None = None,
        xp: Any = np,
        device: Any = None,
    ) -> ConvTranspose2d:
        """``inputs`` channels to ``outputs``, kernels of ``kernel_size`` (an int: square) drawn
        normal with std ``1 / sqrt(fan_in)`` (fan_in: ``outputs // groups`` times the kernel's size,
        PyTorch's count for this layout), or by ``init`` (of the shape (C, O // groups, KH, KW)); a
        zero bias (none if not ``bias``). ``xp`` and ``device``: where the weights are, as
        :meth:`Linear.new`'s."""
        name = "ConvTranspose2d.new"
        kernel = _pair(name, kernel_size, 2)
        inputs, outputs = positive(name, "inputs", inputs), positive(name, "outputs", outputs)
        groups = positive(name, "groups", groups)
        if inputs % groups or outputs % groups:
            raise ValueError(
                f"{name}: {inputs} inputs and {outputs} outputs do not divide into {groups} groups"
            )
        shape = (inputs, outputs // groups, *kernel)
        if init is not None:
            w = ArrayWeight(init(shape, seed=seed, dtype=dtype), xp=xp, device=device)
        else:
            fan_in = outputs // groups * math.prod(kernel)
            w = ArrayWeight.normal(
                shape, std=fan_in**-0.5, seed=generator(seed, name), dtype=dtype, xp=xp, device=device
            )
        b = ArrayWeight.zeros((outputs,), dtype=dtype, xp=xp, device=device) if bias else None
        return cls(w, b, stride, padding, output_padding, groups, dilation)

    def __call__(self, x: AnyArray) -> ArrayLayer:
        return conv_transpose2d(
            x,
            self.w,
            self.b,
            stride=self.stride,
            padding=self.padding,
            output_padding=self.output_padding,
            groups=self.groups,
            dilation=self.dilation,
        )


@dataclass(frozen=True, eq=False)
class AdaptiveAvgPool2d(Module):
    """The means of ``output_size`` bins over the last two axes (:func:`~monadl.adaptive_avg_pool2d`),
    as PyTorch's ``nn.AdaptiveAvgPool2d``: an int (a square output) or (OH, OW), either None for
    the input's size. ``AdaptiveAvgPool2d(1)`` is a global average pool. No weights."""

    output_size: int | tuple[int | None, int | None]

    def __call__(self, x: AnyArray) -> ArrayLayer:
        return adaptive_avg_pool2d(x, self.output_size)
