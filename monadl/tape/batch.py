"""Tapes computed together as rows of one batched computation, whose backward runs together.

Dynamic batching (``monadl.do.batching``) computes n independent calls as one: n rows of one array.
Their backward is merged the same way: each member tape, when it fires (its last consumer gave a
delta or released), hands its deltas to its :class:`BatchGroup` instead of running a backward
of its own. When every member has fired, the group runs one backward for all of them, with the
members' deltas stacked as rows (zero rows for members that got no delta). A member's several
deltas (one per consumer) are not summed one kernel per member: they are added into its row by the
one kernel that stacks the group's deltas.

Waiting for all members cannot deadlock: members of a group were ready at the same time in the
forward pass, so none is upstream of another, and no member's delta depends on another's backward.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import numpy as np

from monadl.do.do import KERNEL_MAP, MAP, UNIT, Bind, Do, PrivateBind
from monadl.tape.shared import SharedTape
from monadl.tape.tape import Tape
from monadl.typeclasses.backend import host_in, minus_zeros
from monadl.typeclasses.sparse import SparseRows, scatter_add

GroupBackward = Callable[[list[list[Do[Any]] | None]], Do[None]]


class BatchGroup:
    """The members of one merged computation: their deltas, collected until all have fired."""

    __slots__ = ("_backward", "_deltas", "_remaining")

    def __init__(self, size: int, backward: GroupBackward) -> None:
        self._deltas: list[list[Do[Any]] | None] = [None] * size
        self._remaining = size
        self._backward = backward

    def fired(self, index: int, deltas: list[Do[Any]] | None) -> Do[None]:
        """Member ``index`` fired with its consumers' deltas (None: it got none). The group's
        backward, once the last member has fired; nothing before."""
        self._deltas[index] = deltas
        self._remaining -= 1
        if self._remaining:
            return UNIT
        collected, self._deltas = self._deltas, []
        return self._backward(collected)


def release_member(tape: SharedTape[Any, Any], group: BatchGroup, index: int) -> Do[None] | None:
    """Fires a group's member on the spot if it is not the group's last (which only records its
    deltas: no fiber needed for that); None if it is the last, whose firing must be deferred as any
    tape's (it runs the group's backward, and the release cascade must stay iterative)."""
    if group._remaining > 1 and tape._count == 0 and not tape._fired:
        tape._fired = True
        return group.fired(index, tape.take_deltas())
    return None


class RowTape(SharedTape[Any, Any]):
    """Row ``index`` of a batched result: its data is that row; its delta goes to its group.

    ``source`` is the batched result's tape; it is only named as an input, so that the member's
    firing is deferred like any tape's (the release cascade stays iterative)."""

    __slots__ = ("group", "index")

    def __init__(self, data: Any, source: Tape[Any, Any], group: BatchGroup, index: int) -> None:
        super().__init__(data, (source,))
        self.fanout = 1  # the group reads its deltas once, to stack them (never summed here)
        self.group = group
        self.index = index

    def _last_release(self) -> Do[None]:
        done = release_member(self, self.group, self.index)
        return super()._last_release() if done is None else done

    def _fire(self) -> Do[None]:
        return self.group.fired(self.index, self.take_deltas())


def value_key(data: Any) -> Hashable:
    """A value's part of a merge signature: ``float`` for a Python float, else the array's type,
    shape and dtype (calls whose values have equal keys stack into one array of rows)."""
    return float if type(data) is float else (type(data), data.shape, data.dtype)


def float_key(x: float) -> Hashable:
    """A float's part of a merge signature, where calls merge only on equal floats (a shared
    constant, a static argument): the float itself, but 0.0 and -0.0, equal in Python, kept apart
    (``2.0 * -0.0`` is ``-0.0``, and NumPy's ``1 / -0.0`` is ``-inf``: merged, one call would get
    the other's). A NaN keys as itself: calls given different NaN objects do not merge."""
    return x if x else (x, math.copysign(1.0, x))


def stack_values(xp: Any, values: Sequence[Any], float_dtype: Any) -> Any:
    """The values one argument takes in merged calls, as the rows of one array: floats as a vector
    of ``float_dtype``, arrays stacked."""
    if type(values[0]) is float:
        return xp.asarray(values, dtype=float_dtype)
    return stack_arrays(xp, values)


def stack_arrays(xp: Any, arrays: Sequence[Any]) -> Any:
    """Arrays of one shape as the rows of one array (``xp.stack``). On NumPy ``np.array`` of the
    list, the same array built in C: ``np.stack`` spends about a microsecond of Python on each
    array, and merged calls stack hundreds of rows (a Tree-LSTM level's word ids or labels). (An
    array subclass comes out a plain ndarray: the values stacked here are plain arrays.)"""
    if xp is np:
        return np.array(arrays)
    return xp.stack(arrays)


def row_at(rows: Any, k: int) -> Any:
    """Row ``k`` of stacked rows: ``rows[k]`` on NumPy; the array API indexes every axis."""
    return rows[k] if type(rows) is np.ndarray else rows[k, ...]


def result_row(out: Any, k: int, scalar: bool) -> Any:
    """Row ``k`` of a merged result, as its call alone gives it: a float if ``scalar``, else an
    array (NumPy's rows of a vector are scalars: made 0-d arrays again)."""
    row = row_at(out, k)
    if scalar:
        return float(row)
    return np.asarray(row) if isinstance(row, np.generic) else row


class RowOf(PrivateBind[Any]):
    """Row ``row`` of a lazy stacked delta (``source``), shaped like a member's input. A group that
    stacks deltas recognises these and gathers rows of one source with one indexing, instead of
    taking each row apart and stacking them again."""

    __slots__ = ("row",)

    def __init__(self, source: Do[Any], row: int, like: Any, xp: Any) -> None:
        super().__init__((source,), functools.partial(row_of, xp, row, like), MAP)
        self.row = row


def row_of(xp: Any, k: int, like: Any, rows: Any) -> Any:
    """Row ``k`` of ``rows``, shaped (and typed: a float or an array) like ``like``."""
    r = row_at(rows, k)
    if type(like) is float:  # a float input's row; a padded one has shape (1, ...)
        return float(xp.reshape(r, ())) if getattr(r, "ndim", 0) else float(r)
    if tuple(r.shape) != tuple(like.shape):
        r = xp.reshape(r, like.shape)
    return np.asarray(r) if isinstance(r, np.generic) else r


def stacked_delta(
    xp: Any, deltas: Sequence[list[Do[Any]] | None], like: Any, cost: Any, shared: bool
) -> Do[Any] | None:
    """The members' deltas stacked as the rows of an array shaped and typed like ``like`` (the
    merged result): row k is the sum of member k's deltas, -0.0 if it has none. None if no member
    has a delta. ``shared``: the result is read by several computations (memoised)."""
    sources: dict[Do[Any], tuple[list[int], list[int]]] = {}  # RowOf sources: (members, their rows)
    loose_owners: list[int] = []
    loose: list[Do[Any]] = []
    for k, ds in enumerate(deltas):
        for d in ds or ():
            if type(d) is RowOf:
                members, rows = sources.setdefault(d.sources[0], ([], []))
                members.append(k)
                rows.append(d.row)
            else:
                loose_owners.append(k)
                loose.append(d)
    if not sources and not loose:
        return None
    gather = functools.partial(_gather, xp, like, list(sources.values()), loose_owners)
    return (Bind if shared else PrivateBind)((*sources, *loose), gather, KERNEL_MAP, cost)


def _gather(
    xp: Any, like: Any, indices: list[tuple[list[int], list[int]]], loose_owners: list[int], *values: Any
) -> Any:
    n = len(indices)
    size = like.shape[0]
    if xp is not np:  # the deltas of float rows (a loss per row) are NumPy: floats are the host's
        values = tuple([host_in(xp, v) for v in values])
    if n == 1 and not loose_owners:
        members, rows = indices[0]
        if members == rows == list(range(size)) and values[0].shape[0] == size:  # all its rows, in order
            return xp.reshape(values[0], like.shape)
    out = minus_zeros(xp, like.shape, like.dtype)  # a row given one delta is that delta (-0.0 too)
    for (members, rows), source in zip(indices, values[:n], strict=True):
        picked = xp.reshape(xp.take(source, xp.asarray(rows), axis=0), (len(rows), *like.shape[1:]))
        if xp is np and len(set(members)) == len(members):
            index = np.asarray(members)
            out[index] = out[index] + picked
        else:  # the array API has no assignment to an index array: a scatter
            out = scatter_add(xp, out, xp.asarray(members), picked)
    for k, d in zip(loose_owners, values[n:], strict=True):
        out[k, ...] += d.to_dense(xp) if type(d) is SparseRows else d
    return out
