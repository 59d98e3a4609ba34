"""Dynamic batching: the contract between batchable work and the executor.

A node that may be batched (a :class:`~monadl.do.do.Kernel` with a ``batch``, or a
:class:`~monadl.do.do.Batch`) names a :class:`Batcher`. When the executor reaches such a node with
batching on, it asks the batcher for the node's *signature*; nodes with equal signatures are
interchangeable rows of one batched computation. The executor parks them until no fiber can run,
then hands each group of two or more to :meth:`Batcher.run`, which returns one computation whose
value is the list of the members' values, in order. A call left alone under its signature gets a
second chance: calls with equal *fan signatures* (:meth:`Batcher.fan_signature`: one input shared,
the others different, such as the five gates of a Tree-LSTM cell, one input and five weights) run
as one computation of :meth:`Batcher.run_fan`. A group of one runs as if batching were off.

A batchable node reached while no other fiber can run, nothing is parked and nothing is on the pool
runs at once, with no signature computed: nothing could merge with it. So a chain of ops (an RNN
step by step, a deep network on one example) pays nothing for batching.

So batching never changes what is computed, only how many kernels compute it: the executor's
agenda groups work that is ready at the same time (DyNet's agenda-based batching), which for a
tree is every node of one height, across all the trees of a batch.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from monadl.do.do import Do


class Batcher(Protocol):
    """How a kind of batchable work merges its calls."""

    def signature(self, node: Any) -> Hashable | None:
        """The key of a call (a ``Kernel`` or ``Batch`` node naming this batcher): calls with equal
        keys merge. None: this call cannot be batched (it runs on its own)."""
        ...

    def name(self, node: Any) -> str:
        """A short name of a call's kind of work, for statistics (a primitive's or an operation's)."""
        ...

    def run(self, nodes: list[Any]) -> Do[list[Any]]:
        """One computation for all ``nodes`` (two or more, of equal signatures): the list of their
        values, in order."""
        ...

    def fan_signature(self, node: Any) -> Hashable | None:
        """A second key, asked of a call that nothing merged with under its signature: calls with
        equal ones merge by :meth:`run_fan`. None: it runs on its own."""
        ...

    def run_fan(self, nodes: list[Any]) -> Do[list[Any]]:
        """One computation for all ``nodes`` (two or more, of equal fan signatures): the list of
        their values, in order."""
        ...


@dataclass
class RunStats:
    """What one run did: kernel launches, and how batching merged them."""

    kernels: int = 0
    """Kernels launched: one per unbatched kernel, and one per merged group's kernel."""
    merged: int = 0
    """Batchable calls that ran inside merged groups (a group of n counts n)."""
    groups: int = 0
    """Merged groups (of two or more calls)."""
    kinds: dict[str, int] = field(default_factory=dict)
    """Launches of batchable work by kind (a merged group counts once; a call on its own too)."""
    signatures: int = 0
    """Distinct signatures of batchable work launched in a run (the same op on different weights
    counts twice): what a perfect batcher would launch once per level of a tree. Over several runs,
    the largest of theirs."""
    planned: int = 0
    """Forward passes run by a plan, level by level (``monadl.dsl.fold``); their statistics are
    the levels' together, as one run's."""
    straight: int = 0
    """Runs of a static graph as a list of ops, forward or forward and backward (``monadl.dsl.
    straight``): their kernels are the ops and vjps computed."""

    def add(self, other: RunStats) -> None:
        """Adds ``other``'s counts to these (statistics over several runs)."""
        self.kernels += other.kernels
        self.merged += other.merged
        self.groups += other.groups
        self.signatures = max(self.signatures, other.signatures)
        self.planned += other.planned
        self.straight += other.straight
        for name, count in other.kinds.items():
            self.kinds[name] = self.kinds.get(name, 0) + count
