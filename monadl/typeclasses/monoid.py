"""Monoids for deltas: how the deltas a shared tape receives from its consumers are summed."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

from monadl.do.do import KERNEL_MAP, Bind, Do

Delta = TypeVar("Delta")


class Monoid(Protocol[Delta]):
    """An associative sum of two or more deltas. (A tape with no delta at all does not call it:
    it releases its inputs instead, see ``tape.shared``.)"""

    def combine_all(self, deltas: Sequence[Delta]) -> Delta: ...


class SumMonoid:
    """Deltas summed with ``+``: floats and dense arrays (of one shape, since ops unbroadcast)."""

    def combine_all(self, deltas: Sequence[Any]) -> Any:
        first, second, *rest = deltas
        total = first + second  # a fresh value: the inputs may be shared with other tapes
        for d in rest:
            total += d  # in place for arrays (the array API has in-place operators)
        return total

    def sum_lazy(self, deltas: Sequence[Do[Any]], cost: float | Callable[[], float] = 0.0) -> Do[Any]:
        """The sum of lazy deltas, as one kernel over their values (memoised: the summed delta
        may feed several vjps)."""
        return Bind(tuple(deltas), self._sum_values, KERNEL_MAP, cost)

    def _sum_values(self, *values: Any) -> Any:
        return self.combine_all(values)


SUM = SumMonoid()
