"""Sequences of different lengths packed by time step, as PyTorch's ``PackedSequence``: the
layout of the whole-layer recurrent ops (:mod:`monadl.dsl.ops.packed_lstm`, :mod:`monadl.dsl.ops.packed_gru`),
and what those ops share: their operands' checks, the moves between the sequences' order and the
packed one, and their primitives, each with a joint vjp (one backward pass gives every operand's
delta).

The sequences' steps come one sequence after another (the rows of ``x``); packed, the steps of time
``t`` of every sequence that has one are consecutive rows, the sequences sorted by length, longest
first, so that those still running at step ``t`` are the first ``batch[t]``. A right-to-left direction
reads each sequence from its last step, so it has its own packing of the same shape.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

import numpy as np

from monadl.do.primitive import Primitive
from monadl.dsl.core.layers import AnyArray, ArrayLayer, apply_array
from monadl.dsl.ops.registry import declare
from monadl.typeclasses.backend import ShapeError, on_device, shape_of

__all__ = ["Packing", "indices", "layer_op", "packing"]

PER_DIRECTION: Final = 8
"""Operands a direction of a layer op takes: its cell's four gates' weights, then their biases."""


@dataclass(frozen=True)
class Packing:
    """Where each sequence's steps go when the batch is packed by time step (as PyTorch's
    ``PackedSequence``): the sequences sorted by length, longest first (ties in their order)."""

    batch: tuple[int, ...]
    """``batch[t]``: how many sequences have a step ``t`` (the first ``batch[t]`` in sorted order)."""
    offsets: tuple[int, ...]
    """``offsets[t]``: the packed row of step ``t``'s first sequence."""
    order: np.ndarray[Any, np.dtype[np.intp]]
    """The sequences in sorted order."""
    left_to_right: np.ndarray[Any, np.dtype[np.intp]]
    """For each packed row, the row of ``x`` the left-to-right direction reads there."""
    right_to_left: np.ndarray[Any, np.dtype[np.intp]]
    """For each packed row, the row of ``x`` the right-to-left direction reads there (each
    sequence's steps from its last)."""
    left_to_right_rows: np.ndarray[Any, np.dtype[np.intp]]
    """The inverse of ``left_to_right``: for each row of ``x``, its packed row."""
    right_to_left_rows: np.ndarray[Any, np.dtype[np.intp]]
    """The inverse of ``right_to_left``."""
    last: np.ndarray[Any, np.dtype[np.intp]]
    """For each sequence, the packed row of its last step (in either direction)."""


@functools.lru_cache(maxsize=256)
def packing(lengths: tuple[int, ...]) -> Packing:
    """The packing of sequences of ``lengths`` (each 1 or more)."""
    order = sorted(range(len(lengths)), key=lambda s: -lengths[s])
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.intp)
    batch = tuple(sum(1 for n in lengths if n > t) for t in range(max(lengths)))
    offsets = tuple(int(o) for o in np.concatenate([[0], np.cumsum(batch)[:-1]]))
    left_to_right = np.empty(sum(lengths), dtype=np.intp)
    right_to_left = np.empty_like(left_to_right)
    last = np.empty(len(lengths), dtype=np.intp)
    for rank, s in enumerate(order):
        n = lengths[s]
        steps = np.asarray(offsets[:n], dtype=np.intp) + rank
        left_to_right[steps] = starts[s] + np.arange(n)
        right_to_left[steps] = starts[s] + np.arange(n)[::-1]
        last[s] = steps[-1]
    return Packing(
        batch,
        offsets,
        np.asarray(order, dtype=np.intp),
        left_to_right,
        right_to_left,
        np.argsort(left_to_right).astype(np.intp),
        np.argsort(right_to_left).astype(np.intp),
        last,
    )


def indices(xp: Any, like: Any, *arrays: Any) -> list[Any]:
    """NumPy index arrays as ``xp``'s, on ``like``'s device."""
    return [xp.asarray(a, **on_device(xp, like)) for a in arrays]


def packed_rows(xp: Any, x: Any, layout: Packing, directions: int) -> Any:
    """The rows of ``x`` (N, ...) in each direction's packed order: (D, N, ...)."""
    reads = indices(xp, x, layout.left_to_right, layout.right_to_left)[:directions]
    return xp.stack([xp.take(x, r, axis=0) for r in reads])


def packed_deltas(xp: Any, d: Any, layout: Packing, directions: int, hidden: int) -> Any:
    """The outputs' deltas: the first N rows of ``d``, each direction's ``hidden`` columns, in its
    packed order (D, N, hidden)."""
    reads = indices(xp, d, layout.left_to_right, layout.right_to_left)[:directions]
    steps = layout.left_to_right.shape[0]
    return xp.stack(
        [xp.take(d[:steps, k * hidden : (k + 1) * hidden], reads[k], axis=0) for k in range(directions)]
    )


def unpacked_rows(xp: Any, packed: Any, layout: Packing, summed: bool) -> Any:
    """Each direction's packed rows (D, N, k) back in the sequences' order: side by side, (N, D k),
    or ``summed``, (N, k) (an input's delta, read by both directions)."""
    rows = indices(xp, packed, layout.left_to_right_rows, layout.right_to_left_rows)[: packed.shape[0]]
    parts = [xp.take(packed[d, ...], rows[d], axis=0) for d in range(packed.shape[0])]
    if not summed:
        return xp.concat(parts, axis=1)
    return parts[0] if len(parts) == 1 else parts[0] + parts[1]


def previous_steps(xp: Any, h: Any, layout: Packing) -> Any:
    """Each packed row's previous step's ``h`` (D, N, hidden), zeros before the first step."""
    first = xp.zeros((h.shape[0], layout.batch[0], h.shape[2]), dtype=h.dtype, **on_device(xp, h))
    steps = [
        h[:, layout.offsets[t - 1] : layout.offsets[t - 1] + n, :] for t, n in enumerate(layout.batch) if t
    ]
    return xp.concat([first, *steps], axis=1)


def check_steps(op: str, x: Any, inputs: int, lengths: tuple[int, ...]) -> None:
    """Raises a ShapeError naming ``op`` unless ``x`` is (sum of ``lengths``, ``inputs``)."""
    if type(x) is float or x.ndim != 2 or x.shape[1] != inputs:
        raise ShapeError(f"{op}: the steps must be (steps, {inputs}) for these cells, got {shape_of(x)}")
    if not lengths or min(lengths) < 1 or sum(lengths) != x.shape[0]:
        raise ShapeError(
            f"{op}: lengths {list(lengths)} do not add up to the {x.shape[0]} steps of {shape_of(x)}"
        )


def layer_op(
    name: str,
    forward: Callable[..., tuple[Any, tuple[Any, ...]]],
    deltas: Callable[..., list[Any]],
    cost: Callable[..., float],
    check: Callable[..., None],
    shape_rule: Callable[..., Any],
) -> Primitive:
    """A whole-layer op's primitive, for one direction or two (8 or 16 weights: ``shape_rule``
    gives their result's, see ``monadl.dsl.ops.shape_rules``). ``forward(xp, x, *weights, lengths)``
    gives the result and what it saves; ``deltas(xp, d, saved, x, *weights, lengths)``, its joint
    vjp, gives every operand's delta at once (one pass of backpropagation through time). Its calls
    never merge: each is a whole layer over a batch already."""
    return declare(
        name, forward, (), saves=True, cost=cost, check=check, shape_rule=shape_rule, joint_vjp=deltas
    )


def apply_layer(
    prim: Primitive, x: AnyArray, lengths: tuple[int, ...], weights: tuple[AnyArray, ...]
) -> ArrayLayer:
    """The layer op ``prim`` on ``x`` and ``weights`` (one direction's or two)."""
    if len(weights) not in (PER_DIRECTION, 2 * PER_DIRECTION):
        raise ValueError(f"{prim.name}: takes {PER_DIRECTION} weights a direction, got {len(weights)}")
    return apply_array(prim, x, *weights, lengths=tuple(int(n) for n in lengths))
