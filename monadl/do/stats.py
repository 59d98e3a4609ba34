"""What a run did: kernel launches, merged groups, vjps, replays (for benchmarks and tests)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RunStats:
    """What one run (or, summed, several) did."""

    kernels: int = 0
    """Kernels launched, forward and backward: one per op run on its own, per merged group, per
    gather of rows, per vjp."""
    merged: int = 0
    """Calls that ran inside merged groups (a group of n counts n)."""
    groups: int = 0
    """Merged groups (of two or more calls)."""
    kinds: dict[str, int] = field(default_factory=dict)
    """Forward launches by kind (a primitive's or an operation's name; a merged group counts once)."""
    signatures: int = 0
    """Distinct signatures launched (the same op on different weights counts twice): what a perfect
    batcher would launch once per level of a tree. Over several runs, the largest of theirs."""
    replayed: int = 0
    """Runs that replayed a compiled program (no walk of the graph's ops, no grouping, no checks)."""
    backwards: dict[str, int] = field(default_factory=dict)
    """Backward passes through a step, by kind (an op's name; ``weight`` for a weight's gradient):
    each runs once per run, with the sum of its consumers' deltas."""
    vjps: dict[str, int] = field(default_factory=dict)
    """Vjp kernels by the op's name (one per input that wants a delta)."""

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
        for mine, theirs in (
            (self.kinds, other.kinds),
            (self.backwards, other.backwards),
            (self.vjps, other.vjps),
        ):
            for name, count in theirs.items():
                mine[name] = mine.get(name, 0) + count


def tally(counts: dict[str, int], name: str) -> None:
    """One more of ``name`` in ``counts``."""
    counts[name] = counts.get(name, 0) + 1
