"""Monoids for deltas: how the deltas a shared tape receives from its consumers are summed."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

from monadl.do.do import KERNEL_MAP, Bind, Do, PrivateBind
from monadl.typeclasses.sparse import add, add_into

Delta = TypeVar("Delta")


class Monoid(Protocol[Delta]):
    """An associative sum of two or more lazy deltas. (A tape with no delta at all does not call
    it: it releases its inputs instead, see ``tape.shared``.)"""

    def sum_lazy(self, deltas: Sequence[Do[Delta]], cost: float | Callable[[], float] = 0.0) -> Do[Delta]: ...


class SumMonoid:
    """Deltas summed with ``+``: floats, dense arrays (of one shape, since ops unbroadcast) and
    :class:`~monadl.typeclasses.sparse.SparseRows` (sparse + sparse stays sparse, sparse + dense is
    dense)."""

    def sum_lazy(self, deltas: Sequence[Do[Any]], cost: float | Callable[[], float] = 0.0) -> Do[Any]:
        """The sum of lazy deltas, folded left one delta at a time: each delta is computed just
        before it is added, so at most the running sum and one delta are alive (a weight used k
        times no longer needs k deltas in memory at once). The last step is memoised: the summed
        delta may feed several vjps."""
        total, *rest = deltas
        for i, d in enumerate(rest):
            # Each step is read once, by the next; the last may be read by several vjps.
            kind = Bind if i == len(rest) - 1 else PrivateBind
            total = kind((total, d), _add_into if i else _add, KERNEL_MAP, cost)
        return total


def _add(a: Any, b: Any) -> Any:
    return add(a, b)  # a fresh value: the deltas may be shared with other tapes


def _add_into(total: Any, d: Any) -> Any:
    # In place for dense arrays (a SparseRows ``d`` is scattered in): ``total`` is the fold's own,
    # made by _add. A SparseRows total is rebound to a fresh sum.
    return add_into(total, d)


SUM = SumMonoid()
