"""Dropout: units zeroed at random while training, with a seeded random source of its own.

``drop = ml.Dropout(0.5, seed=0)`` is a layer applied to an array-like: ``drop(h)``. In a training
step's forward pass (``train``, ``train_blocking``, ``compute_gradients``: see
:func:`monadl.dsl.learning.training.is_training`) each entry is kept with probability ``1 - p`` and scaled by
``1 / (1 - p)`` (inverted dropout: the expected value is unchanged, so a prediction needs no
rescaling); the mask is saved for the backward pass, whose delta is ``delta * mask``. A prediction
(``predict``, ``predict_blocking``, and any run outside a training step) never drops: the input
passes through unchanged.

The masks come from the layer's own NumPy generator (``drop.generator``, a
:class:`~monadl.nn.GeneratorBuffer`: a module's buffer, which checkpoints save, so that a resumed run
draws the masks the uninterrupted one would have), drawn when the op runs: every run draws a fresh
mask from the generator's state at that moment, a replayed program's (``Executor(replay=True)``) and
a graph run again included, never one fixed when the graph was built. Two layers made with the same
seed, used by the same program, give the same masks step after step. A layer used several times in
one graph draws for each use, in the order the run computes them (fixed for a program and executor
settings). A step that fails has drawn its masks all the same, and a failed step's second run (to
name the op of a non-finite delta) draws again. Masks are drawn on the host and copied to the
array's device (CuPy, array-api-strict).

Its op reads the mode and the generator from its run's context (``context=True``: see
:mod:`monadl.do.context`), never from the calling thread, so its kernel runs on the executor's
workers where its cost says so, as any other; uses of one layer whose kernels run on the workers at
the same time draw in the order they run. It never merges with other calls under dynamic batching
(each call's mask is its own draw).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from monadl.do.context import RunContext
from monadl.do.primitive import elementwise_cost
from monadl.dsl.core.layers import AnyArray, ArrayLayer, apply_array, is_float_kind
from monadl.dsl.ops.registry import declare
from monadl.nn.buffer import GeneratorBuffer
from monadl.nn.module import Module
from monadl.typeclasses.backend import NUMPY, on_device

__all__ = ["Dropout"]


class Dropout(Module):
    """Inverted dropout with probability ``p`` of dropping each entry, drawing its masks from a
    generator seeded by ``seed`` (or from the bit generator of the ``np.random.Generator`` given,
    itself where it is a :class:`~monadl.nn.GeneratorBuffer`). A module whose one buffer is its
    generator (``"generator"``). Equal only to itself: a program keeps the layer, whose generator
    its replays draw from."""

    def __init__(self, p: float = 0.5, *, seed: int | np.random.Generator = 0) -> None:
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p < 1.0:
            raise ValueError(f"Dropout: p must be a float in [0, 1), got {p!r}")
        if isinstance(seed, bool) or (isinstance(seed, (int, np.integer)) and seed < 0):
            raise ValueError(f"Dropout: seed must be a non-negative int or a numpy Generator, got {seed!r}")
        self.p = float(p)
        self.generator = seed if isinstance(seed, GeneratorBuffer) else GeneratorBuffer(seed)
        """The source of the masks: each training run's draws advance it."""

    def __call__(self, x: AnyArray) -> ArrayLayer:
        """``x`` with dropout: dropped and scaled in a training step, unchanged in a prediction."""
        if is_float_kind(x):
            raise TypeError(
                f"Dropout: expected an array, an ArrayWeight or an ArrayLayer, got {type(x).__name__}"
            )
        return apply_array(DROPOUT, x, dropout=self)

    def mask(self, xp: Any, x: Any, generator: Any = None) -> Any:
        """A fresh mask for ``x``: ``1 / (1 - p)`` where an entry is kept, 0 where it is dropped, in
        ``x``'s dtype and namespace (``xp``), drawn from ``generator`` (default: the layer's)."""
        scale = 1.0 / (1.0 - self.p)
        source = self.generator if generator is None else generator
        if type(x) is float:
            return scale if float(source.random()) >= self.p else 0.0
        keep = source.random(tuple(x.shape)) >= self.p
        if xp is NUMPY:
            return np.multiply(keep, scale, dtype=x.dtype)
        return xp.astype(xp.asarray(keep, **on_device(xp, x)), x.dtype) * scale

    def __repr__(self) -> str:
        return f"Dropout(p={self.p})"


def _forward(xp: Any, x: Any, dropout: Dropout, ctx: RunContext) -> tuple[Any, Any]:
    """The output and the mask it saves (None: nothing dropped, the input itself passed on)."""
    if dropout.p == 0.0 or not ctx.training:
        return x, None
    mask = dropout.mask(xp, x, ctx.generator(dropout))
    return x * mask, mask


def _vjp(xp: Any, delta: Any, mask: Any, x: Any, dropout: Dropout) -> Any:
    return delta if mask is None else delta * mask


def _shape(x: Any, **_: Any) -> Any:
    """The static shape rule: the input's shape and dtype (see :mod:`monadl.dsl.core.shapes`)."""
    return x


DROPOUT = declare(
    "dropout",
    _forward,
    (_vjp,),
    saves=True,
    cost=elementwise_cost,
    fresh=False,
    shape_rule=_shape,
    context=True,
)
"""The dropout op: ``dropout`` (a :class:`Dropout`) is a static parameter, kept by identity."""
