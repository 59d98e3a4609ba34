"""Initialisers: functions that draw a weight's initial NumPy array of a shape, as ``torch.nn.init``.

Each takes the ``shape``, a ``seed`` (an int, or a ``numpy.random.Generator`` that the draw advances)
and a ``dtype``, and returns a new array: NumPy's, or, given ``xp=`` (``cupy``, ``array_api_strict``)
and ``device=``, a copy of the same draw in that namespace (NumPy's generator draws on every device,
so a seed gives the same values everywhere). The builders of ``monadl.nn`` take one as ``init=``
(``Linear.new(3, 2, init=nn.init.xavier_uniform)``); pass a gain or a mode with
``functools.partial``.

**Fans.** A 2-D shape is monadl's ``(inputs, outputs)``, the layout of :class:`~monadl.nn.Linear`'s
``w`` (the transpose of PyTorch's ``(out_features, in_features)``): ``fan_in = shape[0]``,
``fan_out = shape[1]``, so a PyTorch layer and its monadl copy get the same distribution. A shape of
more dimensions is a convolution kernel in PyTorch's layout ``(outputs, inputs / groups, *kernel)``:
``fan_in = shape[1] * prod(kernel)``, ``fan_out = shape[0] * prod(kernel)``. ``fans=(fan_in,
fan_out)`` overrides both for any other layout.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal, Protocol

import numpy as np

from monadl.typeclasses.backend import to_namespace

Seed = int | np.random.Generator
FloatArray = np.ndarray[Any, np.dtype[np.floating[Any]]]
Nonlinearity = Literal[
    "linear", "conv1d", "conv2d", "conv3d", "sigmoid", "tanh", "relu", "leaky_relu", "selu"
]
Mode = Literal["fan_in", "fan_out"]


class Initializer(Protocol):
    """What a builder's ``init=`` takes: a function of a shape, a seed and a dtype to a new array
    (the functions of this module, or ``functools.partial`` of them)."""

    def __call__(
        self, shape: Sequence[int], *, seed: Seed = ..., dtype: type[np.floating[Any]] = ...
    ) -> FloatArray: ...


def _generator(seed: Seed) -> np.random.Generator:
    return seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)


def fans(shape: Sequence[int], name: str = "fans") -> tuple[int, int]:
    """``(fan_in, fan_out)`` of ``shape`` (see the module); raises for fewer than 2 dimensions."""
    shape = tuple(int(n) for n in shape)
    if len(shape) < 2:
        raise ValueError(f"{name}: needs a shape of 2 dimensions or more, got {shape}")
    if len(shape) == 2:
        return shape[0], shape[1]
    receptive = math.prod(shape[2:])
    return shape[1] * receptive, shape[0] * receptive


def calculate_gain(nonlinearity: Nonlinearity, param: float | None = None) -> float:
    """The gain recommended for a nonlinearity (PyTorch's table): 1 for linear, conv and sigmoid,
    5/3 for tanh, sqrt(2) for relu, ``sqrt(2 / (1 + slope^2))`` for leaky_relu (``param``, the
    negative slope, default 0.01), 3/4 for selu."""
    if nonlinearity in ("linear", "conv1d", "conv2d", "conv3d", "sigmoid"):
        return 1.0
    if nonlinearity == "tanh":
        return 5.0 / 3.0
    if nonlinearity == "relu":
        return math.sqrt(2.0)
    if nonlinearity == "leaky_relu":
        slope = 0.01 if param is None else float(param)
        return math.sqrt(2.0 / (1.0 + slope**2))
    if nonlinearity == "selu":
        return 0.75
    raise ValueError(f"calculate_gain: unknown nonlinearity {nonlinearity!r}")


def _fans(shape: Sequence[int], given: tuple[int, int] | None, name: str) -> tuple[int, int]:
    if given is None:
        return fans(shape, name)
    fan_in, fan_out = given
    if fan_in < 1 or fan_out < 1:
        raise ValueError(f"{name}: fans must be positive, got {given}")
    return fan_in, fan_out


def _placed(drawn: FloatArray, xp: Any, device: Any) -> FloatArray:
    """A NumPy draw as the initialisers return it: itself for NumPy, else a copy in ``xp`` (on
    ``device``), converted as ``module.to(xp)`` converts."""
    if xp is np and device is None:
        return drawn
    converted: FloatArray = to_namespace(drawn, xp, device)
    return converted


def _uniform(shape: Sequence[int], bound: float, seed: Seed, dtype: type[np.floating[Any]]) -> FloatArray:
    drawn: FloatArray = _generator(seed).uniform(-bound, bound, tuple(shape)).astype(dtype)
    return drawn


def _normal(shape: Sequence[int], std: float, seed: Seed, dtype: type[np.floating[Any]]) -> FloatArray:
    drawn: FloatArray = (_generator(seed).standard_normal(tuple(shape)) * std).astype(dtype)
    return drawn


def xavier_uniform(
    shape: Sequence[int],
    *,
    gain: float = 1.0,
    seed: Seed = 0,
    dtype: type[np.floating[Any]] = np.float32,
    fans: tuple[int, int] | None = None,
    xp: Any = np,
    device: Any = None,
) -> FloatArray:
    """Uniform on ``[-a, a]``, ``a = gain * sqrt(6 / (fan_in + fan_out))`` (Glorot and Bengio, 2010):
    the variance ``gain^2 * 2 / (fan_in + fan_out)``."""
    fan_in, fan_out = _fans(shape, fans, "xavier_uniform")
    return _placed(_uniform(shape, gain * math.sqrt(6.0 / (fan_in + fan_out)), seed, dtype), xp, device)


def xavier_normal(
    shape: Sequence[int],
    *,
    gain: float = 1.0,
    seed: Seed = 0,
    dtype: type[np.floating[Any]] = np.float32,
    fans: tuple[int, int] | None = None,
    xp: Any = np,
    device: Any = None,
) -> FloatArray:
    """Normal of mean 0 and ``std = gain * sqrt(2 / (fan_in + fan_out))`` (Glorot and Bengio, 2010)."""
    fan_in, fan_out = _fans(shape, fans, "xavier_normal")
    return _placed(_normal(shape, gain * math.sqrt(2.0 / (fan_in + fan_out)), seed, dtype), xp, device)


def _kaiming_std(
    shape: Sequence[int],
    a: float,
    mode: Mode,
    nonlinearity: Nonlinearity,
    given: tuple[int, int] | None,
    name: str,
) -> float:
    if mode not in ("fan_in", "fan_out"):
        raise ValueError(f"{name}: mode must be 'fan_in' or 'fan_out', got {mode!r}")
    fan_in, fan_out = _fans(shape, given, name)
    fan = fan_in if mode == "fan_in" else fan_out
    return calculate_gain(nonlinearity, a) / math.sqrt(fan)


def kaiming_uniform(
    shape: Sequence[int],
    *,
    a: float = 0.0,
    mode: Mode = "fan_in",
    nonlinearity: Nonlinearity = "leaky_relu",
    seed: Seed = 0,
    dtype: type[np.floating[Any]] = np.float32,
    fans: tuple[int, int] | None = None,
    xp: Any = np,
    device: Any = None,
) -> FloatArray:
    """Uniform on ``[-b, b]``, ``b = gain * sqrt(3 / fan)`` (He et al., 2015), ``fan`` the fan-in or
    the fan-out (``mode``), ``gain = calculate_gain(nonlinearity, a)`` (``a``: leaky_relu's negative
    slope; the defaults give ``sqrt(2)``, for relu): the variance ``gain^2 / fan``."""
    std = _kaiming_std(shape, a, mode, nonlinearity, fans, "kaiming_uniform")
    return _placed(_uniform(shape, math.sqrt(3.0) * std, seed, dtype), xp, device)


def kaiming_normal(
    shape: Sequence[int],
    *,
    a: float = 0.0,
    mode: Mode = "fan_in",
    nonlinearity: Nonlinearity = "leaky_relu",
    seed: Seed = 0,
    dtype: type[np.floating[Any]] = np.float32,
    fans: tuple[int, int] | None = None,
    xp: Any = np,
    device: Any = None,
) -> FloatArray:
    """Normal of mean 0 and ``std = gain / sqrt(fan)`` (He et al., 2015), ``fan`` and ``gain`` as
    :func:`kaiming_uniform`'s."""
    std = _kaiming_std(shape, a, mode, nonlinearity, fans, "kaiming_normal")
    return _placed(_normal(shape, std, seed, dtype), xp, device)


def orthogonal(
    shape: Sequence[int],
    *,
    gain: float = 1.0,
    seed: Seed = 0,
    dtype: type[np.floating[Any]] = np.float32,
    xp: Any = np,
    device: Any = None,
) -> FloatArray:
    """A (semi-)orthogonal matrix times ``gain`` (Saxe et al., 2014), as PyTorch draws it: the Q of
    the QR decomposition of a normal matrix, signs fixed by R's diagonal so that the draw is uniform
    over orthogonal matrices. The shape is seen as (``shape[0]``, the product of the rest): its rows
    are orthonormal if they are fewer than its columns, else its columns are."""
    shape = tuple(int(n) for n in shape)
    if len(shape) < 2:
        raise ValueError(f"orthogonal: needs a shape of 2 dimensions or more, got {shape}")
    rows, columns = shape[0], math.prod(shape[1:])
    flat = _generator(seed).standard_normal((rows, columns))
    if rows < columns:
        flat = flat.T
    q, r = np.linalg.qr(flat)
    q = q * np.sign(np.diag(r))  # a column's sign by R's diagonal: the Haar measure
    if rows < columns:
        q = q.T
    drawn: FloatArray = (gain * q).reshape(shape).astype(dtype)
    return _placed(drawn, xp, device)
