"""Tapes computed together as rows of one batched computation, whose backward runs together.

Dynamic batching (``monadl.do.batching``) computes n independent calls as one: n rows of one array.
Their backward is merged the same way: each member tape, when it fires (its last consumer gave a
delta or released), hands its summed delta to its :class:`BatchGroup` instead of running a backward
of its own. When every member has fired, the group runs one backward for all of them, with the
members' deltas stacked as rows (zero rows for members that got no delta). A member's several
deltas (one per consumer) are not summed one kernel per member: they are added into its row by the
one kernel that stacks the group's deltas.

Waiting for all members cannot deadlock: members of a group were ready at the same time in the
forward pass, so none is upstream of another, and no member's delta depends on another's backward.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from monadl.do.do import UNIT, Do
from monadl.tape.shared import SharedTape
from monadl.tape.tape import Tape
from monadl.typeclasses.monoid import SUM
from monadl.typeclasses.sparse import SparseRows

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


class RowTape(SharedTape[Any, Any]):
    """Row ``index`` of a batched result: its data is that row; its delta goes to its group.

    ``source`` is the batched result's tape; it is only named as an input, so that the member's
    firing is deferred like any tape's (the release cascade stays iterative)."""

    __slots__ = ("cost", "group", "index")

    def __init__(self, data: Any, source: Tape[Any, Any], group: BatchGroup, index: int, cost: float) -> None:
        super().__init__(data, (source,))
        self.fanout = 1  # the group reads its delta once, to stack it
        self.group = group
        self.index = index
        self.cost = cost

    def _sum(self, deltas: Sequence[Do[Any]]) -> Do[Any]:
        return SUM.sum_lazy(deltas, self.cost)

    def _fire(self) -> Do[None]:
        return self.group.fired(self.index, self.take_deltas())


def given_deltas(deltas: Sequence[list[Do[Any]] | None]) -> tuple[list[int], tuple[Do[Any], ...]]:
    """The members' deltas as one flat tuple, and for each, the row (member) it belongs to."""
    owners: list[int] = []
    given: list[Do[Any]] = []
    for k, ds in enumerate(deltas):
        if ds:
            owners.extend([k] * len(ds))
            given.extend(ds)
    return owners, tuple(given)


def stack_rows(xp: Any, rows: Sequence[Any], owners: Sequence[int], size: int, like: Any) -> Any:
    """The array of ``size`` rows shaped and typed like ``like`` (the batched result): row k is the
    sum of the ``rows[j]`` with ``owners[j] == k``, zero if there are none. Rows may be floats,
    arrays or :class:`~monadl.typeclasses.sparse.SparseRows`."""
    dense = [r.to_dense(xp) if type(r) is SparseRows else r for r in rows]
    if len(dense) == size and all(k == j for j, k in enumerate(owners)):  # one each, in order
        if type(dense[0]) is float:
            return xp.asarray(dense, dtype=like.dtype)
        return xp.stack(dense)
    out = xp.zeros(like.shape, dtype=like.dtype)
    for k, r in zip(owners, dense, strict=True):
        out[k] += r
    return out
