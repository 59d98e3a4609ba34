"""Sequences of different lengths packed by time step, as PyTorch's ``PackedSequence``: the
layout of the whole-layer recurrent ops (:mod:`monadl.dsl.packed_lstm`, :mod:`monadl.dsl.packed_gru`).

The sequences' steps come one sequence after another (the rows of ``x``); packed, the steps of time
``t`` of every sequence that has one are consecutive rows, the sequences sorted by length, longest
first, so that those still running at step ``t`` are the first ``batch[t]``. A backward direction
reads each sequence from its last step, so it has its own packing of the same shape.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

from monadl.typeclasses.backend import on_device

__all__ = ["Packing", "indices", "packing"]


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
    forward: np.ndarray[Any, np.dtype[np.intp]]
    """For each packed row, the row of ``x`` the forward direction reads there."""
    backward: np.ndarray[Any, np.dtype[np.intp]]
    """For each packed row, the row of ``x`` the backward direction reads there (each sequence's
    steps from its last)."""
    forward_rows: np.ndarray[Any, np.dtype[np.intp]]
    """The inverse of ``forward``: for each row of ``x``, its packed row."""
    backward_rows: np.ndarray[Any, np.dtype[np.intp]]
    """The inverse of ``backward``."""
    last: np.ndarray[Any, np.dtype[np.intp]]
    """For each sequence, the packed row of its last step (in either direction)."""


@functools.lru_cache(maxsize=256)
def packing(lengths: tuple[int, ...]) -> Packing:
    """The packing of sequences of ``lengths`` (each 1 or more)."""
    order = sorted(range(len(lengths)), key=lambda s: -lengths[s])
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.intp)
    batch = tuple(sum(1 for n in lengths if n > t) for t in range(max(lengths)))
    offsets = tuple(int(o) for o in np.concatenate([[0], np.cumsum(batch)[:-1]]))
    forward = np.empty(sum(lengths), dtype=np.intp)
    backward = np.empty_like(forward)
    last = np.empty(len(lengths), dtype=np.intp)
    for rank, s in enumerate(order):
        n = lengths[s]
        steps = np.asarray(offsets[:n], dtype=np.intp) + rank
        forward[steps] = starts[s] + np.arange(n)
        backward[steps] = starts[s] + np.arange(n)[::-1]
        last[s] = steps[-1]
    return Packing(
        batch,
        offsets,
        np.asarray(order, dtype=np.intp),
        forward,
        backward,
        np.argsort(forward).astype(np.intp),
        np.argsort(backward).astype(np.intp),
        last,
    )


def indices(xp: Any, like: Any, *arrays: Any) -> list[Any]:
    """NumPy index arrays as ``xp``'s, on ``like``'s device."""
    return [xp.asarray(a, **on_device(xp, like)) for a in arrays]
