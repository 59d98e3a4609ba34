"""What a run did: kernel launches, merged groups, vjps, replays (for benchmarks and tests).

Counts by kind (an op's or an operation's name) are machine integers indexed by the kind's number,
given once when the kind is declared (:func:`kind_number`): a count is an increment, where a
dictionary by name costs a lookup, a store and a boxed integer for every op of every run."""

from __future__ import annotations

import threading
from typing import Final

from librt.vecs import append, vec
from mypy_extensions import i64

_NUMBERS: Final[dict[str, int]] = {}
_NAMES: Final[list[str]] = []
_NUMBERING: Final = threading.Lock()


def kind_number(name: str) -> i64:
    """The number of the kind ``name`` (the same for every kind of that name), by which runs
    count it."""
    number = _NUMBERS.get(name)
    if number is None:
        with _NUMBERING:
            number = _NUMBERS.get(name)
            if number is None:
                number = _NUMBERS[name] = len(_NAMES)
                _NAMES.append(name)
    return number


WEIGHT: Final[i64] = kind_number("weight")
"""The kind under which a weight's gradient counts as a backward pass."""


class Counts:
    """Counts by kind number, and the numbers counted (a body's counts are added to its run's each
    time it runs: a few kinds of the hundred or so numbered)."""

    def __init__(self) -> None:
        self.counts = vec[i64]()
        self.counted = vec[i64]()  # the numbers whose count is not 0, each once

    def tally(self, number: i64) -> None:
        """One more of kind ``number``."""
        counts = self.counts
        while len(counts) <= number:
            counts = append(counts, 0)
        if counts[number] == 0:
            self.counted = append(self.counted, number)
        counts[number] += 1
        self.counts = counts

    def add(self, other: Counts) -> None:
        """Adds ``other``'s counts to these."""
        counts = self.counts
        theirs = other.counts
        while len(counts) < len(theirs):
            counts = append(counts, 0)
        counted = self.counted
        for number in other.counted:
            if counts[number] == 0:
                counted = append(counted, number)
            counts[number] += theirs[number]
        self.counts = counts
        self.counted = counted

    def copy(self) -> Counts:
        """These counts, apart."""
        new = Counts()
        new.add(self)
        return new

    def by_name(self) -> dict[str, int]:
        """The counts by kind name (the kinds counted at least once)."""
        counts = self.counts
        return {_NAMES[number]: int(counts[number]) for number in sorted(self.counted)}


class RunStats:
    """What one run (or, summed, several) did."""

    def __init__(
        self, kernels: int = 0, merged: int = 0, groups: int = 0, signatures: int = 0, replayed: int = 0
    ) -> None:
        self.kernels = kernels
        """Kernels launched, forward and backward: one per op run on its own, per merged group, per
        gather of rows, per vjp."""
        self.merged = merged
        """Calls that ran inside merged groups (a group of n counts n)."""
        self.groups = groups
        """Merged groups (of two or more calls)."""
        self.signatures = signatures
        """Distinct signatures launched (the same op on different weights counts twice): what a
        perfect batcher would launch once per level of a tree. Over several runs, the largest of
        theirs."""
        self.replayed = replayed
        """Runs that replayed a compiled program (no walk of the graph's ops, no grouping, no
        checks)."""
        self.kind_counts = Counts()
        self.backward_counts = Counts()
        self.vjp_counts = Counts()

    @property
    def kinds(self) -> dict[str, int]:
        """Forward launches by kind (a primitive's or an operation's name; a merged group counts
        once)."""
        return self.kind_counts.by_name()

    @property
    def backwards(self) -> dict[str, int]:
        """Backward passes through a step, by kind (an op's name; ``weight`` for a weight's
        gradient): each runs once per run, with the sum of its consumers' deltas."""
        return self.backward_counts.by_name()

    @property
    def vjps(self) -> dict[str, int]:
        """Vjp kernels by the op's name (one per input that wants a delta; one per application or
        group for an op with a joint vjp)."""
        return self.vjp_counts.by_name()

    @property
    def planned(self) -> int:
        """Removed: no run is planned (see :attr:`replayed`, :attr:`groups` and :attr:`merged`)."""
        raise AttributeError(
            "RunStats.planned was removed (no run is planned): RunStats.replayed counts the runs that "
            "replayed a compiled program, RunStats.groups and RunStats.merged the merged calls"
        )

    def add(self, other: RunStats) -> None:
        """Adds ``other``'s counts to these (statistics over several runs)."""
        self.kernels += other.kernels
        self.merged += other.merged
        self.groups += other.groups
        self.signatures = max(self.signatures, other.signatures)
        self.replayed += other.replayed
        self.kind_counts.add(other.kind_counts)
        self.backward_counts.add(other.backward_counts)
        self.vjp_counts.add(other.vjp_counts)

    def _fields(self) -> tuple[object, ...]:
        return (
            self.kernels,
            self.merged,
            self.groups,
            self.kinds,
            self.signatures,
            self.replayed,
            self.backwards,
            self.vjps,
        )

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RunStats) and self._fields() == other._fields()

    __hash__ = None  # type: ignore[assignment]  # (mutable: as a dataclass's)

    def __repr__(self) -> str:
        return (
            f"RunStats(kernels={self.kernels}, merged={self.merged}, groups={self.groups}, "
            f"kinds={self.kinds}, signatures={self.signatures}, replayed={self.replayed}, "
            f"backwards={self.backwards}, vjps={self.vjps})"
        )
