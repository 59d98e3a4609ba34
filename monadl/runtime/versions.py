"""Committed versions of the weights: snapshot-isolated runs and atomic commits.

A weight's data and optimizer state are a chain of :class:`Version`\\ s, newest first, each stamped
with the number of the commit that wrote it. A run reads every weight as of one commit, its
:class:`Snapshot` (the newest commit when the run began), whatever commits while it runs: a
prediction made beside a training thread sees one step's weights, never two steps' mixed.

A commit (:func:`publish`) writes its versions first, stamped with a number no snapshot has, so no
reader sees them; then it makes them all visible with one store (``_clock.visible = number``). An
exception or a signal (Ctrl-C) at any moment before that store leaves every weight as it was (the
next commit removes what the broken one wrote); after it, every weight is updated. This is the
multi-version concurrency control of databases (PostgreSQL, LMDB): readers never wait for
writers, and writers wait only for each other (:data:`COMMIT_LOCK`).

Old versions are kept while a live snapshot may read them. A snapshot is an object its run holds;
when the run is gone, so is its claim (the clock keeps weak references to snapshots), however the
run ended: an interrupt cannot leave a claim behind. The references have no callbacks (a ``WeakSet``
has): a signal handler's exception raised inside a callback is lost ("Exception ignored"), and a
user's Ctrl-C must not be; dead ones are dropped when the list is read.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Sequence
from typing import Any, Final

from mypy_extensions import mypyc_attr

__all__ = ["COMMIT_LOCK", "Snapshot", "Version", "data_of", "last_reshape", "publish", "read", "snapshot"]


class Version:
    """One committed (or, until its commit's number is visible, pending) state of a weight."""

    __slots__ = ("data", "number", "older", "state")

    def __init__(self, number: int, data: Any, state: Any, older: Version | None) -> None:
        self.number = number
        self.data = data
        self.state = state
        self.older = older


@mypyc_attr(native_class=False)  # (weakly referenced: a compiled class cannot be)
class Snapshot:
    """The commit a run reads the weights as of."""

    __slots__ = ("__weakref__", "number")

    def __init__(self, number: int) -> None:
        self.number = number


class _Clock:
    def __init__(self) -> None:
        self.visible = 0
        """The newest commit whose versions are visible: the one store that commits."""
        self.written: list[Any] | None = None
        """The weights a commit was writing, until it is visible: if it never is (an interrupt),
        the next commit removes their invisible versions first."""
        self.reshaped_at = 0
        """The newest commit that changed a weight's type, shape or dtype (see
        :func:`last_reshape`)."""
        self.live: list[weakref.ref[Snapshot]] = []  # every snapshot taken that may be alive
        self.compact_at = _COMPACT
        self.lock = threading.Lock()  # a snapshot taken vs old versions dropped


_COMPACT = 64  # live references at which dead ones are dropped (then twice those left)
_clock: Final = _Clock()

COMMIT_LOCK = threading.Lock()
"""Held by a commit, from reading the weights it updates to :func:`publish`: commits one at a time,
each applied to the weights as the one before left them (no update is lost)."""


def snapshot() -> Snapshot:
    """A claim on the newest commit: :func:`read` with it gives each weight as of that commit, for
    as long as the snapshot is referenced."""
    with _clock.lock:
        taken = Snapshot(_clock.visible)
        live = _clock.live
        live.append(weakref.ref(taken))
        if len(live) >= _clock.compact_at:  # runs without commits (predictions) end here
            _compact()
    return taken


def _compact() -> list[Snapshot]:
    """The live snapshots; dead references dropped. Called with ``_clock.lock`` held."""
    alive = [taken for ref in _clock.live if (taken := ref()) is not None]
    _clock.live = [weakref.ref(taken) for taken in alive]
    _clock.compact_at = max(_COMPACT, 2 * len(alive))
    return alive


def _at(head: Version, limit: int) -> Version:
    """The newest version of the chain at ``head`` written by commit ``limit`` or before."""
    while head.number > limit:
        older = head.older
        assert older is not None  # the first version (number 0) and those live snapshots need stay
        head = older
    return head


def read(head: Version, taken: Snapshot | None) -> Version:
    """The version of the chain at ``head`` that ``taken`` sees (None: the newest visible one)."""
    return _at(head, _clock.visible if taken is None else taken.number)


def data_of(weight: Any, taken: Snapshot | None) -> Any:
    """``weight``'s data as ``taken`` sees it (None: the newest visible): the engine's read of a
    weight, once per weight and run."""
    head: Version = weight.head
    return _at(head, _clock.visible if taken is None else taken.number).data


def publish(writes: Sequence[tuple[Any, Any, Any]]) -> None:
    """Commits ``(weight, data, optimizer state)`` for every weight of ``writes``: all become
    visible at once, or (interrupted before its last store) none does. The caller holds
    :data:`COMMIT_LOCK`."""
    _repair()
    number = _clock.visible + 1
    _clock.written = [weight for weight, _, _ in writes]
    reshaped = False
    for weight, data, state in writes:
        head = weight.head
        if not reshaped and not _same_kind(data, head.data):
            reshaped = True
        weight.head = Version(number, data, state, head)
    if reshaped:  # set before the commit: a snapshot that sees the commit sees this too
        _clock.reshaped_at = number
    _clock.visible = number  # the commit
    _clock.written = None
    _prune(writes, number)


def last_reshape() -> int:
    """The number of the newest commit that changed a weight's type, shape or dtype (0: none yet),
    set before that commit becomes visible. Read after a snapshot of number ``n`` is taken: if it
    is at most ``m <= n``, every weight has the same kind as of ``n`` as it had as of ``m`` (a replayed
    program's check of its weights). An interrupted commit may set it without changing any."""
    return _clock.reshaped_at


def _same_kind(data: Any, old: Any) -> bool:
    """Whether ``data`` has ``old``'s type, shape and dtype (a float: its type)."""
    if data is old:
        return True
    kind = type(data)
    if kind is not type(old):
        return False
    if kind is float:
        return True
    return bool(
        getattr(data, "shape", None) == getattr(old, "shape", None)
        and getattr(data, "dtype", None) == getattr(old, "dtype", None)
    )


def _repair() -> None:
    """Removes the invisible versions of a commit that never became visible (idempotent: an
    interrupt here leaves the work to the next commit)."""
    written = _clock.written
    if written is None:
        return
    visible = _clock.visible
    for weight in written:
        weight.head = _at(weight.head, visible)
    _clock.written = None


def _prune(writes: Sequence[tuple[Any, Any, Any]], number: int) -> None:
    """Drops the versions of the written weights that no live snapshot can read: each chain is cut
    after its newest version at or before the oldest live snapshot."""
    with _clock.lock:
        oldest = min((taken.number for taken in _compact()), default=number)
    for weight, _, _ in writes:
        _at(weight.head, oldest).older = None
