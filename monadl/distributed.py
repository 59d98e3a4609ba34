"""Data-parallel training on Ray: one replica of the model per worker, one update for all.

::

    import ray
    from monadl.distributed import DataParallel

    ray.init()  # or ray.init(address="head:6379") on a cluster
    with DataParallel(build, loss, ml.Adam(1e-3), workers=4) as trainer:
        for batch in batches:
            result = trainer.step(batch)  # Success(mean loss) or Failure(WorkerError)

``build()`` makes the model (a :class:`~monadl.nn.Module`, or anything
:func:`~monadl.nn.weights_of` takes); ``loss(model, shard)`` returns a ``FloatLayer``, **the sum** of
the shard's per-example losses. Each worker is a Ray actor (``num_cpus=1``) holding one replica. A
step splits the global batch into one shard per worker (:func:`shard_batch`), every worker computes
its shard's gradients of ``sum / n`` (``n``: the examples in the global batch) with monadl's engine,
the gradients are summed, and every replica applies the same update: the trainer minimises the mean
loss over the global batch, the same objective as one process on the whole batch (the same result
but for rounding: the terms of a sum are added in another order), but where a layer's output
depends on the rest of the batch: batch norm (see **Buffers**).

**Exactness.** The sum has a fixed order, whatever finishes first: ``reduction="tree"`` (the default)
adds worker ``i + d``'s partial sum into worker ``i``'s for ``d = 1, 2, 4, ...`` (a binary tree of
actors: the gradients go from worker to worker through Ray's object store, never through the driver,
and each worker sends and receives at most one partial sum per level); ``reduction="driver"`` fetches
every shard's gradients to the driver, adds them in worker order and sends the sum back. Every
replica applies the one sum, so the replicas stay bit-identical (:meth:`DataParallel.digests`).

**All or nothing.** A step is a two-phase commit. Every worker computes its gradients and *stages*
its replica's update (:func:`monadl.dsl.learning.training.staged_updates`: the new weights and optimizer
state, computed, not committed); only when every worker has succeeded does the driver tell them all
to commit. A step that fails anywhere (an exception in ``loss``, a non-finite loss, gradient or new
weight, a worker's process dying) is aborted everywhere: no replica and no optimizer state changes,
and the step returns ``Failure(WorkerError)`` naming the worker, with the original exception as its
``cause``.

**Buffers.** What a step stages besides the weights (:mod:`monadl.runtime.staging`) is combined over
the replicas and committed with the step, alike on every replica:

- batch norm (:class:`~monadl.nn.BatchNorm1d`, ``BatchNorm2d``): each replica's forward pass
  normalises its shard by the shard's own statistics, as PyTorch's ``DistributedDataParallel``
  without ``SyncBatchNorm`` does (so its gradients are those of the shards' normalisations, not
  one process's on the whole batch: the same only with one worker, or shards of the whole batch's
  statistics). The running statistics, though, are the whole batch's: each replica's shard
  statistics (its values' count, mean and squared deviations, per channel and per use of the
  layer) travel with its gradients and are pooled exactly, and every replica updates its running
  statistics from the pooled ones as one process does from the whole batch's. Where the layer's
  input is the same as one process's (the first step, or a layer on the data itself), its running
  statistics are one process's, but for rounding. A shard must hold more than one value per
  channel (the layer refuses to train on one), and a new running statistic that is not finite
  fails the step with :class:`~monadl.NonFiniteBufferError`, as in one process.
- another floating buffer a step stages (an op of your own, :func:`monadl.stage_buffer`): the mean
  of the replicas' values weighted by their shards' sizes (for a statistic linear in the batch,
  such as a mean, the whole batch's); a buffer of integers or bools: the value every replica
  staged (a step where they differ fails, naming the buffer).

Random streams (the :class:`~monadl.nn.GeneratorBuffer` of a :class:`~monadl.nn.Dropout`): each
replica draws a step's masks from a stream of its own (so replicas drop different units, as the
rows of one process's mask differ), seeded by a key drawn from the committed generator and split by
the worker's rank. The committed generator advances by that key once per committed step, alike on
every replica: a replica's masks depend only on the seed, the steps committed and its rank, so a
failed step run again draws the same ones, and a checkpoint resumes them.

**Faults.** A worker whose process dies is restarted by Ray (``max_restarts``; once those are spent,
the trainer starts a new actor) and restored from a surviving replica's committed state, sent in the
checkpoint format (:func:`monadl.checkpoint.to_bytes`); where no worker survives, from the last
checkpoint the trainer saved or loaded. The failed step comes back as a ``Failure`` whose error has
``lost = True``; :meth:`DataParallel.train` runs such a step again, so the final weights are those
of a run without the fault.

**Hangs.** A step that has not finished within :attr:`DataParallel.step_timeout` (the driver waits
with a deadline, whatever the workers do) is failed: the workers found hung (a worker whose first
unfinished task of the step has all its inputs, the others wait on them) are killed, restarted and
restored like lost ones (where every worker hung, from the last checkpoint), and the step returns
``Failure(WorkerError)`` with ``lost = True`` and a ``TimeoutError`` as its ``cause``. The timeout
is the greater of ``step_timeout_s`` (5 minutes by default; None: no timeout) and 10 times the
median of the last 20 successful steps' times.

A request outside a step (:meth:`~DataParallel.save`, :meth:`~DataParallel.copy_to`,
:meth:`~DataParallel.weights`, :meth:`~DataParallel.digests`, :meth:`~DataParallel.pids`, and a
restore) waits at most ``reply_timeout_s`` (a minute by default) for each worker: one that hung is
killed, restarted and restored, one whose process died (even while answering) is restored, and the
request is asked again, from the committed state; a worker that fails it again is named by a
:class:`WorkerUnavailableError`. No exception of Ray's reaches the caller.

Ctrl-C on the driver aborts the step in flight (or completes its commit, if every worker had
already agreed) and raises ``KeyboardInterrupt``: the replicas hold the last committed state, which
:meth:`DataParallel.save` writes; leaving the ``with`` block stops the workers. A step interrupted
while a worker hangs is settled by whatever the trainer is asked next (``save``, ``digests``, the
next ``step``): it waits until the step's deadline, then kills and restores the hung workers.
"""

from __future__ import annotations

import hashlib
import importlib
import math
import os
import statistics
import traceback
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from time import perf_counter, sleep
from types import TracebackType
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar

import numpy as np
from returns.result import Failure, Result, Success

from monadl import checkpoint
from monadl.data.files import atomic_write_bytes, read_regular_file
from monadl.dsl.learning.training import (
    NonFiniteBufferError,
    NonFiniteGradientError,
    Update,
    commit_updates,
    staged_updates,
)
from monadl.dsl.learning.training import forward_and_backward as gradients_and_buffers
from monadl.dsl.ops.batch_norm import Statistics, recording_statistics, stage_statistics
from monadl.nn.buffer import GeneratorBuffer
from monadl.nn.module import buffers_of, weights_of
from monadl.runtime.staging import staging
from monadl.typeclasses.backend import dtype_name, namespace
from monadl.typeclasses.sparse import SparseRows

if TYPE_CHECKING:
    from monadl.dsl.core.layers import FloatLayer
    from monadl.dsl.learning.optimizers.base import Optimizer

__all__ = [
    "DataParallel",
    "StepStats",
    "WorkerError",
    "WorkerUnavailableError",
    "WorkersLostError",
    "batch_size",
    "shard_batch",
]

M = TypeVar("M")
B = TypeVar("B")


def _ray() -> Any:
    """The ``ray`` module (an optional dependency: ``pip install 'monadl[distributed]'``)."""
    try:
        return importlib.import_module("ray")
    except ImportError:
        raise ImportError(
            "monadl.distributed needs Ray: pip install 'monadl[distributed]' (or pip install ray)"
        ) from None


# ----------------------------------------------------------------------------------------- errors


class WorkerError(RuntimeError):
    """A data-parallel step failed on a worker; no replica and no optimizer state changed.

    ``worker``: the worker's rank (0-based); ``step``: the step that failed (1-based);
    ``cause``: the original exception (also ``__cause__``); ``lost``: the worker's process died, or
    it hung past the step's timeout and was killed (``cause``: a ``TimeoutError``); the worker is
    restored, and the step can be run again (:meth:`DataParallel.train` does)."""

    def __init__(self, worker: int, workers: int, step: int, cause: BaseException, lost: bool) -> None:
        what = "was lost" if lost else "failed"
        super().__init__(
            f"step {step}: worker {worker} of {workers} {what}: {type(cause).__name__}: {cause}; "
            "no replica was changed"
        )
        self.worker = worker
        self.step = step
        self.cause = cause
        self.lost = lost
        self.__cause__ = cause


class WorkersLostError(RuntimeError):
    """Every worker was lost at once and no checkpoint is there to restore them from."""


class WorkerUnavailableError(RuntimeError):
    """A worker did not answer a request of the trainer (``call``: ``save``, ``digests``, ...): it
    hung past ``reply_timeout_s`` or its process died, and it did again after it was restarted and
    restored. ``worker``: its rank; ``cause``: what the last try met (also ``__cause__``)."""

    def __init__(self, worker: int, workers: int, call: str, cause: BaseException) -> None:
        super().__init__(
            f"DataParallel.{call}: worker {worker} of {workers} did not answer, and did not after it "
            f"was restarted and restored either: {type(cause).__name__}: {cause}"
        )
        self.worker = worker
        self.call = call
        self.cause = cause
        self.__cause__ = cause


class _Unanswered(Exception):
    """Workers that did not answer a request in time (``hung``: to kill) or whose process died
    (``lost``), each with what was met."""

    def __init__(self, hung: list[int], failed: list[tuple[int, BaseException]]) -> None:
        super().__init__(f"workers {[rank for rank, _ in failed]} did not answer")
        self.hung = hung
        self.failed = failed


STEP_TIMEOUT_FACTOR = 10.0
"""A step may take this many times the median of the recent steps' times (at least
``step_timeout_s``) before the workers still in it are taken as hung: far above a step's normal
spread (an uneven shard, a garbage collection), so a slow but live worker is not killed."""
STEP_TIMEOUT_WINDOW = 20
"""The number of recent successful steps whose median time sets the timeout."""
RECOVERY_ROUNDS = 3
"""How many times a recovery restores the lost workers where one is lost again meanwhile."""
UNAVAILABLE_PAUSE_S = 0.2
"""How long a read waits before asking again a worker that Ray says is coming back."""


def _check_seconds(name: str, value: object, other: str = "") -> None:
    if not (
        isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0
    ):
        raise ValueError(f"DataParallel: {name} must be a positive number of seconds{other}, got {value!r}")


# ----------------------------------------------------------------------------------------- batches


def shard_batch(batch: Any, n: int) -> list[Any]:
    """``batch`` split into ``n`` contiguous shards whose sizes differ by at most one (the first
    ``len % n`` shards get one more example, as ``numpy.array_split``'s).

    A NumPy array is split along its first axis; a list (or another sequence that is not a tuple) is
    a sequence of examples; a tuple (a named tuple too) or a dict is a batch of columns, each split
    alike (``(images, labels)``): its columns must be equally long."""
    if n < 1:
        raise ValueError(f"shard_batch: n must be at least 1, got {n}")
    if isinstance(batch, np.ndarray):
        if batch.ndim == 0:
            raise TypeError("shard_batch: a 0-d array is not a batch")
        return list(np.array_split(batch, n))
    if isinstance(batch, tuple):
        batch_size(batch)  # the columns' lengths agree
        columns = [shard_batch(column, n) for column in batch]
        make = getattr(type(batch), "_make", None)  # a named tuple keeps its type
        return [tuple(parts) if make is None else make(parts) for parts in zip(*columns, strict=True)]
    if isinstance(batch, Mapping):
        batch_size(batch)
        split = {key: shard_batch(column, n) for key, column in batch.items()}
        return [{key: split[key][k] for key in split} for k in range(n)]
    if isinstance(batch, Sequence) and not isinstance(batch, (str, bytes)):
        size, extra = divmod(len(batch), n)
        shards, start = [], 0
        for k in range(n):
            stop = start + size + (1 if k < extra else 0)
            shards.append(batch[start:stop])
            start = stop
        return shards
    raise TypeError(
        f"shard_batch: cannot split a {type(batch).__name__}: pass an array, a list of examples, a "
        "tuple or dict of columns, or DataParallel(split=...)"
    )


def batch_size(batch: Any) -> int:
    """The number of examples in a batch, as :func:`shard_batch` sees it."""
    if isinstance(batch, np.ndarray):
        return int(batch.shape[0]) if batch.ndim else 1
    if isinstance(batch, (tuple, Mapping)):
        columns = list(batch.values()) if isinstance(batch, Mapping) else list(batch)
        if not columns:
            raise ValueError("a batch of columns has no column")
        sizes = [batch_size(column) for column in columns]
        if len(set(sizes)) > 1:
            raise ValueError(f"a batch's columns differ in length: {sizes}")
        return sizes[0]
    if isinstance(batch, Sequence) and not isinstance(batch, (str, bytes)):
        return len(batch)
    raise TypeError(f"not a batch: a {type(batch).__name__}")


# ----------------------------------------------------------------------------------------- gradients

# Gradients travel as a list in the order of the model's weight names, an entry per weight: None
# (the shard did not reach it), a float, an array, or a table's rows as ("rows", indices, values,
# shape) (a compiled SparseRows is not pickled); then one entry more, the buffers' updates
# (_BufferUpdates, summed alike).
Packed = list[Any]


def _pack(gradient: Any) -> Any:
    if type(gradient) is SparseRows:
        indices, values = _coalesced(np.asarray(gradient.indices), np.asarray(gradient.values))
        return ("rows", indices, values, tuple(gradient.shape))
    return gradient


def _coalesced(indices: np.ndarray[Any, Any], values: np.ndarray[Any, Any]) -> tuple[Any, Any]:
    """A table's rows with each index once (a repeated one's rows summed): fewer bytes to send
    where a shard looks a row up many times (a word in many sentences), and the same rows
    touched."""
    unique, inverse = np.unique(indices, return_inverse=True)
    if len(unique) == len(indices):
        return indices, values
    summed = np.zeros((len(unique), *values.shape[1:]), dtype=values.dtype)
    np.add.at(summed, inverse, values)
    return unique, summed


def _unpack(packed: Any) -> Any:
    if type(packed) is tuple:
        _, indices, values, shape = packed
        return SparseRows(indices, values, shape)
    return packed


def _add(a: Packed, b: Packed) -> Packed:
    """``a + b``, weight by weight, ``a``'s terms first."""
    total: Packed = []
    for x, y in zip(a, b, strict=True):
        if x is None or y is None:
            total.append(y if x is None else x)
        else:
            total.append(_pack(_unpack(x) + _unpack(y)))
    return total


def _finite(gradient: Any) -> bool:
    values = gradient.values if type(gradient) is SparseRows else gradient
    return bool(np.isfinite(values).all())


# ----------------------------------------------------------------------------------------- buffers


@dataclass
class _RunningStats:
    """A batch norm module's running statistics as a replica finds them by name (what
    :func:`~monadl.dsl.ops.batch_norm.stage_statistics` reads)."""

    running_mean: Any
    running_var: Any
    momentum: float
    ranks: tuple[int, ...] = ()

    def __repr__(self) -> str:
        return f"the running statistics {self.running_mean!r}, {self.running_var!r}"


Pooled = tuple[float, int, Any, Any]
"""Batch statistics pooled over shards: the module's momentum, the number of values per channel,
their mean and the sum of their squared deviations from it."""


@dataclass(frozen=True)
class _BufferUpdates:
    """The buffer updates of a shard's step, or those of several shards combined (in rank order,
    as gradients are summed), to be staged alike on every replica.

    ``pooled``: each running-statistics update of a batch norm module, by the names of its two
    buffers and its use in the step (0, 1, ...), from the statistics of every shard's values
    together (Chan's pairwise combination): the whole batch's, as one process computes them.
    ``averaged``: any other floating buffer a step staged, by name: the sum of each replica's
    value times its share of the batch, and the sum of those shares. ``agreed``: a buffer of
    integers or bools, by name: the one value every replica staged (``disagreed``: the names of
    those where they differ)."""

    pooled: dict[tuple[str, str, int], Pooled] = field(default_factory=dict)
    averaged: dict[str, tuple[float, Any]] = field(default_factory=dict)
    agreed: dict[str, Any] = field(default_factory=dict)
    disagreed: frozenset[str] = frozenset()

    @staticmethod
    def of_shard(
        recorded: list[Statistics], staged: dict[Any, Any], names: dict[int, str], share: float
    ) -> _BufferUpdates:
        """A shard's updates: its batch norm modules' statistics (``recorded``), and the other
        buffers of the model that it ``staged``; ``share``: its share of the global batch."""
        pooled: dict[tuple[str, str, int], Pooled] = {}
        covered: set[int] = set()
        for stats, mean, var, n in recorded:
            mean_name, var_name = names.get(id(stats.running_mean)), names.get(id(stats.running_var))
            if mean_name is None or var_name is None:
                continue  # a module outside the model: nothing of it is kept
            use = 0
            while (mean_name, var_name, use) in pooled:
                use += 1
            pooled[mean_name, var_name, use] = (float(stats.momentum), n, mean, var * n)
            covered.update((id(stats.running_mean), id(stats.running_var)))
        averaged: dict[str, tuple[float, Any]] = {}
        agreed: dict[str, Any] = {}
        for buffer, data in staged.items():
            name = names.get(id(buffer))
            if name is None or id(buffer) in covered:
                continue
            if dtype_name(data).startswith("float"):
                averaged[name] = (share, data * share)
            else:
                agreed[name] = data
        return _BufferUpdates(pooled, averaged, agreed)

    def __add__(self, other: _BufferUpdates) -> _BufferUpdates:
        pooled = dict(self.pooled)
        for key, b in other.pooled.items():
            a = pooled.get(key)
            pooled[key] = b if a is None else _pool(a, b)
        averaged = dict(self.averaged)
        for name, (share, total) in other.averaged.items():
            have = averaged.get(name)
            averaged[name] = (share, total) if have is None else (have[0] + share, have[1] + total)
        agreed = dict(self.agreed)
        disagreed = set(self.disagreed | other.disagreed)
        for name, value in other.agreed.items():
            have = agreed.setdefault(name, value)
            if have is not value and not _equal(have, value):
                disagreed.add(name)
        return _BufferUpdates(pooled, averaged, agreed, frozenset(disagreed))

    def updates(self, buffers: dict[str, Any], check: bool) -> list[Update]:
        """The buffers' new values, staged as one process's step on the whole batch would stage
        them (from the statistics pooled; the replicas' average; the one value agreed). ``check``:
        a floating one that is not finite is a :class:`~monadl.NonFiniteBufferError`, as in a
        step of one process."""
        if self.disagreed:
            names = ", ".join(repr(name) for name in sorted(self.disagreed))
            raise ValueError(
                f"DataParallel: the replicas staged different values for the buffer(s) {names}: a "
                "buffer of integers or bools must be staged alike on every replica (a floating one "
                "gets the mean of their values, weighted by their shards' sizes)"
            )
        with staging() as staged:
            for (mean_name, var_name, _), (momentum, n, mean, squares) in self.pooled.items():
                if n > 0:
                    stats = _RunningStats(buffers[mean_name], buffers[var_name], momentum)
                    stage_statistics(stats, mean, squares / n, n)
        for name, (share, total) in self.averaged.items():
            buffer = buffers[name]
            average = total if share == 1.0 else total / share
            staged[buffer] = (
                average
                if dtype_name(average) == dtype_name(buffer.data)
                else (namespace(average).astype(average, buffer.data.dtype))
            )
        for name, value in self.agreed.items():
            staged[buffers[name]] = value
        name_of = {id(buffer): name for name, buffer in buffers.items()}
        for buffer, data in staged.items():
            xp = namespace(data)
            if check and dtype_name(data).startswith("float") and not bool(xp.all(xp.isfinite(data))):
                raise NonFiniteBufferError(
                    f"the buffer {name_of[id(buffer)]!r} ({buffer!r}): the step's new value of it is not "
                    "finite (an extreme batch's statistics?); no weight and no buffer was changed"
                )
        return [(buffer, data, None) for buffer, data in staged.items()]


def _equal(a: Any, b: Any) -> bool:
    return tuple(a.shape) == tuple(b.shape) and bool(namespace(a).all(a == b))


def _pool(a: Pooled, b: Pooled) -> Pooled:
    """Two shards' statistics as one: their values' count, mean and squared deviations."""
    momentum, n_a, mean_a, squares_a = a
    _, n_b, mean_b, squares_b = b
    if n_b == 0:
        return a
    if n_a == 0:
        return b
    n = n_a + n_b
    delta = mean_b - mean_a
    return momentum, n, mean_a + delta * (n_b / n), squares_a + squares_b + delta * delta * (n_a * n_b / n)


# ----------------------------------------------------------------------------------------- worker


def _portable(error: BaseException, rank: int) -> BaseException:
    """``error`` as it can travel to the driver: with its traceback as a note, or, where it cannot be
    pickled, a ``RuntimeError`` that names it."""
    cloudpickle = _ray().cloudpickle
    note = f"on worker {rank}:\n" + "".join(traceback.format_exception(error)).rstrip()
    try:
        error.add_note(note)
        cloudpickle.loads(cloudpickle.dumps(error))
    except Exception:  # noqa: BLE001 - any error of pickling: send a description instead
        stand_in = RuntimeError(f"{type(error).__name__}: {error}")
        stand_in.add_note(note)
        return stand_in
    return error


Outcome = tuple[Any, ...]
"""A worker's answer: ``("ok", ...)``, ``("error", exception)`` or ``("skipped",)`` (an earlier
phase failed elsewhere)."""


class _Replica:
    """A worker: one replica of the model and the step it is in (a Ray actor runs it)."""

    def __init__(
        self,
        rank: int,
        build: Callable[[], Any],
        loss: Callable[[Any, Any], Any],
        optimizer: Any,
        check_finite: bool,
    ) -> None:
        self._rank = rank
        self._model = build()
        self._weights = list(weights_of(self._model).items())
        if not self._weights:
            raise ValueError("DataParallel: build() made a model without weights")
        self._buffers = buffers_of(self._model)
        self._names = {id(buffer): name for name, buffer in self._buffers.items()}
        # The random streams: each bit generator once (two buffers may share one).
        generators = {
            id(b.bit_generator): b.bit_generator for b in self._buffers.values() if type(b) is GeneratorBuffer
        }
        self._generators = list(generators.values())
        self._loss = loss
        self._optimizer = optimizer
        self._check = check_finite
        self._incarnation = os.urandom(8).hex()  # a new one each time the process starts
        self._committed = -1  # a fresh build(), until a state is restored into it
        self._clear(0)

    def _clear(self, step: int) -> None:
        self._step = step  # the step in progress (0: none)
        self._pending: Packed | None = None  # its gradients: this shard's, then partial sums
        self._staged: list[Update] | None = None  # its update, computed, not committed
        self._streams: list[Mapping[str, Any]] | None = None  # its generators' next committed states

    def hello(self) -> tuple[str, int, int]:
        """Who this is: the process's incarnation, the last committed step (-1: none, a fresh
        replica), the process id."""
        return self._incarnation, self._committed, os.getpid()

    def read(self, what: str, *args: Any) -> Outcome:
        """``("ok", incarnation, last committed step, answer)``, the answer that of the method
        ``what`` (``state``, ``weights``, ``digest``, ``pid``), or ``("error", exception)``."""
        try:
            answer = getattr(self, what)(*args)
        except Exception as e:  # noqa: BLE001 - every failure goes back to the driver
            return ("error", _portable(e, self._rank))
        return ("ok", self._incarnation, self._committed, answer)

    def pid(self) -> int:
        """The process id."""
        return os.getpid()

    def compute(self, step: int, shard: Any, scale: float, commit: int = 0, incarnation: str = "") -> Outcome:
        """The shard's loss times ``scale`` and its gradients, kept for the reduction. ``commit``:
        the previous step, to commit first (the driver's decision rides on the next step).
        ``incarnation``: the one the driver knows this worker by; another is a process Ray started
        anew since (a fresh replica, not the committed state), which computes nothing: the driver
        restores it before its gradients count."""
        if incarnation and incarnation != self._incarnation:
            self._clear(step)
            return ("restarted", self._incarnation)
        if commit:
            self.commit(commit)
        self._clear(step)
        started = perf_counter()
        committed = [generator.state for generator in self._generators]
        try:
            self._streams = self._own_streams()
            value, packed = self._gradients(shard, scale)
        except Exception as e:  # noqa: BLE001 - every failure goes back to the driver
            return ("error", _portable(e, self._rank))
        finally:  # the draws of the step were its stream's: the committed states stay
            for generator, state in zip(self._generators, committed, strict=True):
                generator.state = state
        self._pending = packed
        return ("ok", value, perf_counter() - started)

    def _own_streams(self) -> list[Mapping[str, Any]]:
        """Puts this replica's stream of the step in each random generator of the model, and
        returns the generators' next committed states. A step's streams come from a key drawn
        from the committed state (the same on every replica), split by rank: each replica draws
        its own masks, and a run (or a step run again after a failure) draws the same ones."""
        following: list[Mapping[str, Any]] = []
        for generator in self._generators:
            key = [int(k) for k in generator.random_raw(2)]
            following.append(generator.state)
            stream = np.random.SeedSequence(key, spawn_key=(self._rank,))
            generator.state = type(generator)(stream).state
        return following

    def _gradients(self, shard: Any, scale: float) -> tuple[float, Packed]:
        size = batch_size(shard)
        if size == 0:
            return 0.0, [None] * len(self._weights) + [_BufferUpdates()]
        from monadl.dsl.core.layers import FloatLayer

        layer = self._loss(self._model, shard)
        if not isinstance(layer, FloatLayer):
            raise TypeError(
                f"DataParallel: loss(model, shard) must return a FloatLayer (the sum of the shard's "
                f"losses), got {type(layer).__name__}"
            )
        with recording_statistics() as recorded:
            passes = gradients_and_buffers(layer * scale, None)
            value, gradients, staged = passes.loss, passes.gradients, passes.staged
        packed: Packed = []
        for name, weight in self._weights:
            gradient = gradients.get(weight)
            if gradient is not None and self._check and not _finite(gradient):
                raise NonFiniteGradientError(
                    f"the gradient of {name!r} on worker {self._rank}'s shard is not finite; "
                    "no weight was changed"
                )
            packed.append(None if gradient is None else _pack(gradient))
        packed.append(_BufferUpdates.of_shard(recorded, staged, self._names, size * scale))
        return float(value), packed

    def compute_and_send(
        self, step: int, shard: Any, scale: float, commit: int = 0, incarnation: str = ""
    ) -> tuple[Outcome, Packed | None]:
        """:meth:`compute`, and the gradients to send on (two objects: the driver fetches only the
        first)."""
        outcome = self.compute(step, shard, scale, commit, incarnation)
        return outcome, self._pending

    def reduce(self, step: int, *children: Packed | None) -> Packed | None:
        """This worker's gradients plus its children's partial sums, in their order (None: one
        failed)."""
        if step != self._step:
            self._pending = None
        for child in children:
            if self._pending is None or child is None:
                self._pending = None
                break
            self._pending = _add(self._pending, child)
        return self._pending

    def reduce_and_prepare(self, step: int, *children: Packed | None) -> Outcome:
        """The root of the tree when it is alone: :meth:`reduce`, then :meth:`prepare`."""
        return self.prepare(step, self.reduce(step, *children))

    def reduce_prepare_and_send(self, step: int, *children: Packed | None) -> tuple[Outcome, Packed | None]:
        """The root of the tree: :meth:`reduce_and_prepare`, and the total, which it sends on to
        the other workers."""
        outcome = self.reduce_and_prepare(step, *children)
        return outcome, self._pending

    def prepare(self, step: int, total: Packed | None) -> Outcome:
        """Stages the update of the summed gradients ``total`` (None: a worker failed)."""
        if step != self._step or total is None:
            return ("skipped",)
        started = perf_counter()
        try:
            *summed, buffers = total
            gradients = {
                weight: _unpack(g)
                for (_, weight), g in zip(self._weights, summed, strict=True)
                if g is not None
            }
            updates = staged_updates(gradients, self._optimizer, check_finite=self._check)
            self._staged = updates + buffers.updates(self._buffers, self._check)
        except Exception as e:  # noqa: BLE001
            return ("error", _portable(e, self._rank))
        return ("ok", perf_counter() - started)

    def commit(self, step: int) -> int:
        """Commits the staged update of ``step`` (again: nothing)."""
        if step == self._step and self._staged is not None:
            commit_updates(self._staged)
            for generator, state in zip(self._generators, self._streams or (), strict=False):
                generator.state = state
            self._committed = step
            self._clear(0)
        return self._committed

    def abort(self, step: int) -> None:
        """Drops whatever ``step`` computed or staged."""
        if step == self._step:
            self._clear(0)

    def state(self, metadata: dict[str, Any] | None = None) -> bytes:
        """The replica's committed state as a checkpoint (the step in its metadata: 0 for a fresh
        replica's, the state before any step)."""
        step = max(self._committed, 0)
        return checkpoint.to_bytes(self._model, metadata={**(metadata or {}), "step": step})

    def restore(self, data: bytes) -> Outcome:
        """Loads a checkpoint's state; its metadata's ``step`` becomes the last committed step."""
        try:
            metadata = checkpoint.from_bytes(data, self._model)
        except Exception as e:  # noqa: BLE001
            return ("error", _portable(e, self._rank))
        step = metadata.get("step", 0)
        self._committed = step if isinstance(step, int) else 0
        self._clear(0)
        return ("ok", self._committed)

    def digest(self) -> str:
        """A hash of the replica's weights and optimizer state."""
        return hashlib.sha256(self.state()).hexdigest()

    def weights(self) -> dict[str, Any]:
        """The replica's weights' data by name."""
        return {name: weight.data for name, weight in self._weights}


# ----------------------------------------------------------------------------------------- driver


@dataclass(frozen=True)
class _Task:
    """A task of a step, as the driver submitted it: the worker that runs it, the references to its
    results, and those to its inputs that other tasks produce (it runs once they are ready)."""

    rank: int
    results: list[Any]
    inputs: list[Any]


@dataclass(frozen=True)
class _InFlight:
    """A step submitted and not yet settled: its tasks (appended as they are submitted), its
    timeout and the ``perf_counter`` time it ends at (None: none)."""

    step: int
    tasks: list[_Task]
    timeout: float | None
    deadline: float | None


@dataclass(frozen=True)
class StepStats:
    """Where a step's time went, as the driver saw it.

    ``overhead_seconds`` is the rest of the step: Ray's scatter of the shards, the reduction of the
    gradients, the broadcast of their sum and the commit (and waiting on the slowest worker)."""

    seconds: float
    """The step's wall-clock time at the driver."""
    compute_seconds: float
    """The slowest worker's forward and backward pass."""
    apply_seconds: float
    """The slowest replica's update (computed, then committed)."""
    overhead_seconds: float
    driver_bytes: int | None
    """The bytes the driver sent and received (shards, and gradients where it reduces them), as
    Ray serializes them; None unless ``count_bytes=True``."""


class DataParallel(Generic[M, B]):
    """Data-parallel training of the model ``build()`` makes, on ``workers`` Ray actors (see the
    module's documentation).

    ``loss(model, shard)``: the **sum** of the shard's per-example losses (a ``FloatLayer``); the
    trainer minimises their mean over the global batch. ``optimizer``: the default of weights
    without their own (as ``train_blocking``'s). ``split(batch, n)``: the shards (default
    :func:`shard_batch`); each shard's size is :func:`batch_size`'s. ``reduction``: ``"tree"`` or
    ``"driver"``. ``check_finite``: a non-finite gradient or new weight fails the step.
    ``max_restarts``: Ray's restarts of a worker's actor. ``count_bytes``: measure the driver's
    bytes per step (:class:`StepStats`; it serializes the shards once more).

    ``step_timeout_s``: the least time a step may take before the workers still in it are taken as
    hung, killed and restored (:attr:`step_timeout`: it grows with the recent steps' times); None
    waits for ever. The default, 5 minutes, is for a first step, which has no recent times to go
    by and pays the workers' one-off costs (imports, the first run of the model): a false alarm
    kills a live worker and fails the step again each time it is run, while a late one only waits.
    ``restart_timeout_s``: how long a lost worker may take to come back before it is replaced.
    ``start_timeout_s``: how long a new worker (each at the start, or one that replaces a lost one)
    may take to start and answer: a new process, with its imports, on a machine that may be busy.
    ``reply_timeout_s``: how long a worker may take to answer a request outside a step (its state
    for :meth:`save`, :meth:`copy_to` and :meth:`weights`, :meth:`digests`, :meth:`pids`) or to
    load a state; one that has not (hung) is killed, restarted and restored, and asked again.

    ``build``, ``loss`` and the batches are pickled to the workers (Ray's cloudpickle): a function
    defined in an importable module is sent by name, so that module must be importable where the
    workers run. ``build()`` should make the same model everywhere; the replicas start from worker
    0's, sent to the others. Ray is started with ``ray.init()`` unless it is already running (with
    at least ``workers`` CPUs declared); a cluster with fewer CPUs than workers is an error.
    """

    def __init__(
        self,
        build: Callable[[], M],
        loss: Callable[[M, B], FloatLayer],
        optimizer: Optimizer | None,
        workers: int,
        *,
        split: Callable[[B, int], Sequence[B]] | None = None,
        reduction: Literal["tree", "driver"] = "tree",
        check_finite: bool = True,
        max_restarts: int = 3,
        restart_timeout_s: float = 120.0,
        start_timeout_s: float = 120.0,
        step_timeout_s: float | None = 300.0,
        reply_timeout_s: float = 60.0,
        count_bytes: bool = False,
    ) -> None:
        if step_timeout_s is not None:
            _check_seconds("step_timeout_s", step_timeout_s, " or None")
        _check_seconds("restart_timeout_s", restart_timeout_s)
        _check_seconds("start_timeout_s", start_timeout_s)
        _check_seconds("reply_timeout_s", reply_timeout_s)
        if workers < 1:
            raise ValueError(f"DataParallel: workers must be at least 1, got {workers}")
        if reduction not in ("tree", "driver"):
            raise ValueError(f"DataParallel: reduction must be 'tree' or 'driver', got {reduction!r}")
        self._ray = ray = _ray()
        # Ray's answer for a worker whose process it is restarting (none in Rays without it).
        self._unavailable: Any = getattr(ray.exceptions, "ActorUnavailableError", ())
        if not ray.is_initialized():
            # A worker asks for one CPU: declare enough even where the machine has fewer cores.
            ray.init(num_cpus=max(workers, os.cpu_count() or 1))
        cpus = ray.cluster_resources().get("CPU", 0)
        if cpus < workers:
            raise ValueError(
                f"DataParallel: {workers} workers need {workers} CPUs (one each), and the Ray cluster "
                f"has {cpus:g}: start it with more (ray.init(num_cpus={workers}), ray start --num-cpus) "
                "or use fewer workers"
            )
        self.workers = workers
        self.reduction = reduction
        self._split = split or shard_batch
        self._args = (build, loss, optimizer, check_finite)
        self._max_restarts = max_restarts
        self._restart_timeout = float(restart_timeout_s)
        self._start_timeout = float(start_timeout_s)
        self._reply_timeout = float(reply_timeout_s)
        self._step_timeout = None if step_timeout_s is None else float(step_timeout_s)
        self._recent: deque[float] = deque(maxlen=STEP_TIMEOUT_WINDOW)  # successful steps' seconds
        self._in_flight: _InFlight | None = None  # a step Ctrl-C interrupted, until settled
        self._count_bytes = count_bytes
        self._committed = 0
        self._decided = False  # whether the step in flight is to be committed everywhere
        self._unsent = False  # whether the last step's commit is still to be sent
        self._checkpoint: Path | None = None
        self._reload = False  # whether a load was cut short: every replica is to load the checkpoint
        self.last_stats: StepStats | None = None
        """Where the last successful step's time went."""
        self._actors: list[Any] = []
        self._incarnations: list[str] = []
        self._killed: dict[int, str] = {}  # rank -> the incarnation killed, until a survey sees it gone
        try:
            self._actors = [self._spawn(rank) for rank in range(workers)]
            self._incarnations = [self._hello(rank)[0] for rank in range(workers)]
            # Every replica starts from worker 0's model, as it stands after build().
            try:
                self._restore(list(range(workers)), self._actors[0].state.remote())
            except _Unanswered as e:
                rank, cause = e.failed[0]
                raise RuntimeError(f"DataParallel: worker {rank} could not start: {cause}") from cause
        except BaseException:
            self.shutdown()
            raise

    # -- workers

    def _spawn(self, rank: int) -> Any:
        options = {"num_cpus": 1, "max_restarts": self._max_restarts, "max_task_retries": 0}
        return self._ray.remote(**options)(_Replica).remote(rank, *self._args)

    def _hello(self, rank: int) -> tuple[str, int, int]:
        """A new worker's hello, within the start timeout."""
        ray = self._ray
        try:
            hello: tuple[str, int, int] = ray.get(
                self._actors[rank].hello.remote(), timeout=self._start_timeout
            )
        except ray.exceptions.GetTimeoutError as e:
            raise RuntimeError(
                f"DataParallel: worker {rank} did not start within {self._start_timeout:g} s "
                "(is the cluster short of CPUs or memory?)"
            ) from e
        except ray.exceptions.RayActorError as e:
            raise RuntimeError(f"DataParallel: worker {rank} could not start: {e}") from e
        return hello

    def _restore(self, ranks: list[int], state: Any, source: int | None = None) -> int:
        """Loads ``state`` (a checkpoint's bytes, or a reference to worker ``source``'s) into the
        given workers; returns its step. Raises :class:`_Unanswered` where a worker did not load
        it within the reply timeout (the source, where its state is not ready: it hung) or died."""
        refs = [self._actors[rank].restore.remote(state) for rank in ranks]
        outcomes = self._answers(ranks, refs, self._reply_timeout)
        failed = [(rank, o) for rank, o in zip(ranks, outcomes, strict=True) if isinstance(o, BaseException)]
        if failed:
            hung = [rank for rank, o in failed if isinstance(o, TimeoutError)]
            if hung and source is not None:
                ready, _ = self._ray.wait([state], timeout=0, fetch_local=False)
                hung = hung if ready else [source]
            raise _Unanswered(hung, failed)
        for outcome in outcomes:
            if outcome[0] != "ok":
                raise outcome[1]  # (the same error on each: a checkpoint that does not fit the model)
        step: int = outcomes[0][1] if outcomes else self._committed
        return step

    def _answers(self, ranks: list[int], refs: list[Any], timeout: float) -> list[Any]:
        """Each reference's value, waited for at most ``timeout`` seconds in all: a worker's
        answer, or the exception that stands for it (a ``TimeoutError`` where it did not answer in
        time; Ray's error where its process died)."""
        ray = self._ray
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout, fetch_local=True)
        done = set(ready)
        answers: list[Any] = []
        for rank, ref in zip(ranks, refs, strict=True):
            if ref not in done:
                answers.append(TimeoutError(f"worker {rank} did not answer within {timeout:g} s"))
                continue
            try:
                answers.append(ray.get(ref))
            except ray.exceptions.RayError as e:
                answers.append(e)
        return answers

    def _kill(self, ranks: list[int]) -> None:
        """Kills hung workers, for Ray to restart them (:meth:`_recover` restores them). Ray kills
        asynchronously: until the kill lands, the old process may still answer, so the next survey
        waits for another incarnation of each."""
        for rank in ranks:
            self._ray.kill(self._actors[rank], no_restart=False)
            self._killed[rank] = self._incarnations[rank]

    @property
    def steps(self) -> int:
        """The number of steps committed (a checkpoint's ``step`` after :meth:`load`)."""
        return self._committed

    @property
    def step_timeout(self) -> float | None:
        """How long the next step may take before the workers still in it are taken as hung: the
        greater of ``step_timeout_s`` and :data:`STEP_TIMEOUT_FACTOR` times the median of the last
        :data:`STEP_TIMEOUT_WINDOW` successful steps' times (None: no timeout)."""
        if self._step_timeout is None or not self._recent:
            return self._step_timeout
        return max(self._step_timeout, STEP_TIMEOUT_FACTOR * statistics.median(self._recent))

    # -- a step

    def step(self, batch: B) -> Result[float, WorkerError]:
        """One step on a global batch: ``Success(mean loss)``, or ``Failure(WorkerError)`` with no
        replica changed (a lost worker is restored before this returns)."""
        shards = list(self._split(batch, self.workers))
        if len(shards) != self.workers:
            raise ValueError(f"DataParallel: split gave {len(shards)} shards for {self.workers} workers")
        count = sum(batch_size(shard) for shard in shards)
        if count == 0:
            raise ValueError("DataParallel.step: the batch is empty")
        self._drain()
        if self._reload:
            self._recover()
        step = self._committed + 1
        self._decided = False
        started = perf_counter()
        timeout = self.step_timeout
        flight = _InFlight(step, [], timeout, None if timeout is None else started + timeout)
        try:
            failure, times, sent = self._run(flight, shards, 1.0 / count)
        except KeyboardInterrupt:
            self._settle(step)  # (the step stays in flight: see _drain)
            raise
        self._in_flight = None
        if failure is not None or times is None:
            # A worker lost, now or unseen (another's failure came first): restore it.
            restarted = self._recover()
            if failure is not None and failure.lost and restarted and failure.worker not in restarted:
                failure = WorkerError(restarted[0], self.workers, step, failure.cause, lost=True)
        if failure is not None:
            return Failure(failure)
        assert times is not None
        loss, compute, apply = times
        seconds = perf_counter() - started
        self.last_stats = StepStats(seconds, compute, apply, seconds - compute - apply, sent)
        self._recent.append(seconds)
        return Success(loss)

    def _run(
        self, flight: _InFlight, shards: list[Any], scale: float
    ) -> tuple[WorkerError | None, tuple[float, float, float] | None, int | None]:
        """The step's two phases: the failure (None: committed), (the loss, the slowest compute, the
        slowest apply), the driver's bytes. ``self._decided`` turns True when every worker has
        staged its update. Past the step's deadline, the workers found hung are killed and the step
        fails.

        A worker's tasks run in the order they were submitted, each when its arguments are ready:
        the whole step is submitted at once, and the driver waits only for the workers' small
        answers (never for the gradients, in a tree)."""
        ray = self._ray
        actors = self._actors
        n = self.workers
        step, tasks = flight.step, flight.tasks  # tasks: in the order submitted, to find a hung worker
        self._in_flight = flight
        sent = sum(self._bytes(shard) for shard in shards) if self._count_bytes else None
        commit = self._committed if self._unsent else 0  # the last step's commit rides on this one
        self._unsent = False
        known = self._incarnations  # each worker checks it is the process the driver knows
        outcomes: list[Any] = [None] * n  # each worker's compute's answer
        sums: list[Any] = [None] * n  # the reference to each worker's gradients, then partial sum
        linked: list[tuple[int, Any]] = []  # (worker, its gradients) where the driver fetched them
        prepares: list[Any] = []
        if self.reduction == "tree":
            # Worker i adds worker i + d's partial sum to its own, for d = 1, 2, 4, ... while i is a
            # multiple of 2d: a worker's children, in that order. A leaf sends its gradients as it
            # computes them; worker 0, the root, stages the update of the total and sends it on.
            children: list[list[int]] = [[] for _ in range(n)]
            distance = 1
            while distance < n:
                for i in range(0, n - distance, 2 * distance):
                    children[i].append(i + distance)
                distance *= 2
            for i in range(n):
                if children[i] or i == 0:
                    outcomes[i] = actors[i].compute.remote(step, shards[i], scale, commit, known[i])
                    tasks.append(_Task(i, [outcomes[i]], []))
                else:
                    send = actors[i].compute_and_send.options(num_returns=2)
                    outcomes[i], sums[i] = send.remote(step, shards[i], scale, commit, known[i])
                    tasks.append(_Task(i, [outcomes[i], sums[i]], []))
            # (The partial sums are not awaited here: a failure among them fails the root's task,
            # and the workers lost are found by the recovery.)
            for i in reversed(range(1, n)):  # children (greater ranks) before their parents
                if children[i]:
                    partials = [sums[c] for c in children[i]]
                    sums[i] = actors[i].reduce.remote(step, *partials)
                    tasks.append(_Task(i, [sums[i]], partials))
            if n == 1:
                prepares = [actors[0].reduce_and_prepare.remote(step)]
                tasks.append(_Task(0, prepares[:], []))
            else:
                root = actors[0].reduce_prepare_and_send.options(num_returns=2)
                partials = [sums[c] for c in children[0]]
                prepared_at_root, total = root.remote(step, *partials)
                tasks.append(_Task(0, [prepared_at_root, total], partials))
                prepares = [prepared_at_root] + [actor.prepare.remote(step, total) for actor in actors[1:]]
                tasks += [_Task(i, [prepares[i]], [total]) for i in range(1, n)]
        else:
            for i in range(n):
                send = actors[i].compute_and_send.options(num_returns=2)
                outcomes[i], sums[i] = send.remote(step, shards[i], scale, commit, known[i])
                tasks.append(_Task(i, [outcomes[i], sums[i]], []))
            hung = self._wait(sums, flight)
            if hung:
                return self._timed_out(flight, hung), None, sent
            parts = self._gather(sums)
            linked = list(enumerate(parts))
            if all(type(part) is list for part in parts):
                summed = parts[0]
                for part in parts[1:]:
                    summed = _add(summed, part)
                total = ray.put(summed)
                if sent is not None:
                    sent += sum(self._bytes(part) for part in parts) + self._bytes(summed)
                prepares = [actor.prepare.remote(step, total) for actor in actors]
                tasks += [_Task(i, [prepares[i]], []) for i in range(n)]
        hung = self._wait(outcomes + prepares, flight)
        if hung:
            return self._timed_out(flight, hung), None, sent
        answers = self._gather(outcomes + prepares)
        computed, prepared = answers[:n], answers[n:]
        failure = self._failure(step, computed, linked, prepared)
        if failure is not None:
            for actor in actors:
                actor.abort.remote(step)
            return failure, None, sent
        # Every worker has staged the same update: the step stands, to be committed everywhere (a
        # worker lost from now on is restored from one that committed). The commit rides on the
        # next step's first task, or is sent before anything else is asked of the workers
        # (_flush): a worker runs its tasks in order, so whatever it is asked next sees the step.
        self._decided = True
        self._committed = step
        self._unsent = True
        loss = 0.0
        for outcome in computed:  # in worker order: the loss is deterministic too
            loss += outcome[1]
        times = (loss, max(outcome[2] for outcome in computed), max(outcome[1] for outcome in prepared))
        return None, times, sent

    def _settle(self, step: int) -> None:
        """Settles an interrupted step everywhere before the interrupt goes on: commits it if every
        worker had agreed (some may have committed already: a commit is idempotent), else aborts
        it, after committing the step before (whose commit may not have been sent). Another Ctrl-C
        meanwhile does not cut this short (it takes a message or two per worker)."""
        if self._decided:
            self._committed = step
        self._unsent = False
        settled = 0
        while settled < len(self._actors):
            try:
                while settled < len(self._actors):
                    actor = self._actors[settled]
                    actor.commit.remote(self._committed)
                    if not self._decided:
                        actor.abort.remote(step)
                    settled += 1
            except KeyboardInterrupt:
                continue

    def _wait(self, refs: list[Any], flight: _InFlight) -> list[int]:
        """Waits until every reference is ready or the step's deadline has passed; returns the ranks
        of the workers that hung (none: every reference is ready, or the step has no deadline).
        Nothing is fetched here: a tree's gradients stay in the workers."""
        if flight.deadline is None or not refs:
            return []
        left = max(0.0, flight.deadline - perf_counter())
        _, waiting = self._ray.wait(refs, num_returns=len(refs), timeout=left, fetch_local=False)
        return self._hung(flight.tasks) if waiting else []

    def _hung(self, tasks: list[_Task]) -> list[int]:
        """The workers whose first unfinished task of the step has every input it waits on: the one
        that runs it is stuck in it (the other workers' unfinished tasks wait on its results). A
        snapshot taken at the deadline, so a task that finished meanwhile is not counted."""
        refs = list(dict.fromkeys(ref for task in tasks for ref in task.results + task.inputs))
        ready, waiting = self._ray.wait(refs, num_returns=len(refs), timeout=0, fetch_local=False)
        if not waiting:
            return []
        done = set(ready)
        hung: list[int] = []
        unfinished: list[int] = []
        for rank in range(self.workers):
            first = next((t for t in tasks if t.rank == rank and not all(r in done for r in t.results)), None)
            if first is not None:
                unfinished.append(rank)
                if all(r in done for r in first.inputs):
                    hung.append(rank)
        return hung or unfinished  # (every chain of waits ends at a hung worker: a safeguard)

    def _timed_out(self, flight: _InFlight, hung: list[int]) -> WorkerError:
        """Kills the hung workers (Ray restarts them; :meth:`_recover` restores them) and aborts the
        step everywhere: the step's failure. The tasks that waited on a hung worker fail with it,
        so no worker's queue is left behind the step."""
        self._kill(hung)
        for actor in self._actors:
            actor.abort.remote(flight.step)
        names = ", ".join(str(rank) for rank in hung)
        error = TimeoutError(
            f"step {flight.step} did not finish within {flight.timeout:g} s (DataParallel's "
            f"step_timeout): worker{'s' if len(hung) > 1 else ''} {names} hung, killed and restarted"
        )
        return WorkerError(hung[0], self.workers, flight.step, error, lost=True)

    def _drain(self) -> None:
        """Settles a step that Ctrl-C interrupted while it was still in flight: waits for its tasks
        until its deadline, then kills and restores the workers that hung, so that no later request
        waits behind them (a worker runs its tasks in order)."""
        flight = self._in_flight
        if flight is None:
            return
        hung = self._wait([ref for task in flight.tasks for ref in task.results], flight)
        self._in_flight = None
        if hung:
            self._timed_out(flight, hung)
            self._recover()

    def _flush(self) -> None:
        """Sends the last step's commit, where it has not ridden on a step yet."""
        self._drain()
        if self._unsent:
            for actor in self._actors:
                actor.commit.remote(self._committed)
            self._unsent = False

    def _gather(self, refs: list[Any]) -> list[Any]:
        """Each reference's value, or the Ray error that stands for it (a lost worker's)."""
        ray = self._ray
        try:
            values: list[Any] = ray.get(refs)  # all at once: the common case
            return values
        except ray.exceptions.RayError:
            values = []
        for ref in refs:
            try:
                values.append(ray.get(ref))
            except ray.exceptions.RayError as e:
                values.append(e)
        return values

    def _failure(
        self, step: int, outcomes: list[Any], linked: list[tuple[int, Any]], prepared: list[Any]
    ) -> WorkerError | None:
        """The step's failure: the first worker whose own computation failed, else the first one
        lost, else the first whose update failed (None: every worker staged its update)."""
        for k, outcome in enumerate(outcomes):
            if isinstance(outcome, tuple) and outcome[0] == "error":
                return WorkerError(k, self.workers, step, outcome[1], lost=False)
        lost = [(k, value) for k, value in enumerate(outcomes) if isinstance(value, BaseException)]
        lost += [
            (k, RuntimeError(f"worker {k} was restarted since the last step (a fresh replica)"))
            for k, value in enumerate(outcomes)
            if isinstance(value, tuple) and value[0] == "restarted"
        ]
        lost += [(k, value) for k, value in linked if isinstance(value, BaseException)]
        lost += [(k, value) for k, value in enumerate(prepared) if isinstance(value, BaseException)]
        if lost:
            # The worker whose own task found it gone, before one whose task's argument (another
            # worker's partial sum) was lost with it.
            exceptions = self._ray.exceptions
            k, error = min(lost, key=lambda found: (isinstance(found[1], exceptions.RayTaskError), found[0]))
            return WorkerError(k, self.workers, step, error, lost=True)
        for k, outcome in enumerate(prepared):
            if outcome[0] == "error":
                return WorkerError(k, self.workers, step, outcome[1], lost=False)
        if len(prepared) != self.workers or any(outcome[0] != "ok" for outcome in prepared):
            raise AssertionError(f"DataParallel: step {step} neither failed nor was staged everywhere")
        return None

    def _bytes(self, value: Any) -> int:
        """``value``'s size as Ray serializes it (pickle 5, arrays out of band)."""
        size = 0

        def out_of_band(buffer: Any) -> bool:
            nonlocal size
            size += memoryview(buffer).nbytes
            return False

        in_band = len(self._ray.cloudpickle.dumps(value, protocol=5, buffer_callback=out_of_band))
        return in_band + size  # (after the dump: it adds the out-of-band buffers to size)

    # -- recovery

    def _recover(self) -> list[int]:
        """Restarts the workers that were lost and restores them to the last committed state: from
        a surviving replica, or, where none survived, from the last checkpoint. Returns the ranks
        of the workers that had been restarted. A worker that hangs or dies meanwhile is killed
        and replaced in turn, a few times at most; past that, :class:`WorkerUnavailableError`."""
        self._flush()
        restarted: set[int] = set()
        for _ in range(RECOVERY_ROUNDS):
            stale, survivors = self._survey(restarted)
            if not stale:
                return sorted(restarted)
            try:
                if survivors:
                    source = survivors[0]
                    self._restore(stale, self._actors[source].state.remote(), source)
                elif self._checkpoint is None:
                    raise WorkersLostError(
                        f"DataParallel: every worker was lost after step {self._committed}, and no "
                        "checkpoint was saved to restore them from (DataParallel.save)"
                    )
                else:
                    self._load_everywhere(read_regular_file(self._checkpoint))
            except _Unanswered as e:
                self._kill(e.hung)
                failed = e.failed[0]
                continue
            return sorted(restarted)
        raise WorkerUnavailableError(failed[0], self.workers, "restore", failed[1])

    def _survey(self, restarted: set[int]) -> tuple[list[int], list[int]]:
        """Asks every worker who it is (within the restart timeout: one may be coming back); one
        that does not answer is replaced by a new actor. Returns the workers that do not hold the
        last committed state (restarted, fresh or behind) and those that do; adds those restarted
        since the driver last knew them to ``restarted``."""
        ray = self._ray
        ranks = list(range(self.workers))
        answers = self._hellos()
        missing = [rank for rank in ranks if isinstance(answers[rank], BaseException)]
        for rank in missing:  # Ray's restarts are spent, or it did not come back in time: a new actor
            ray.kill(self._actors[rank], no_restart=True)
            self._actors[rank] = self._spawn(rank)
        for rank in missing:
            answers[rank] = self._hello(rank)
        stale: list[int] = []
        survivors: list[int] = []
        for rank in ranks:
            incarnation, committed, _ = answers[rank]
            if incarnation != self._incarnations[rank]:
                restarted.add(rank)
            if incarnation == self._incarnations[rank] and committed == self._committed and not self._reload:
                survivors.append(rank)
            else:
                stale.append(rank)
            self._incarnations[rank] = incarnation
        return stale, survivors

    def _hellos(self) -> list[Any]:
        """Each worker's hello, or the exception that stands for it, within the restart timeout. Two
        answers are asked again, until the timeout: Ray's ``ActorUnavailableError`` (it is restarting
        the worker's process), and a worker killed since the last survey answering as the process it
        was (the kill has not landed yet; one that still does at the timeout is taken as not
        answering)."""
        ranks = list(range(self.workers))
        deadline = perf_counter() + self._restart_timeout
        answers: list[Any] = [None] * self.workers
        asking = ranks
        while True:
            refs = [self._actors[rank].hello.remote() for rank in asking]
            for rank, answer in zip(
                asking, self._answers(asking, refs, max(deadline - perf_counter(), 0.0)), strict=True
            ):
                answers[rank] = answer
            asking = [
                rank
                for rank in asking
                if isinstance(answers[rank], self._unavailable)
                or (
                    not isinstance(answers[rank], BaseException)
                    and answers[rank][0] == self._killed.get(rank)
                )
            ]
            if not asking or perf_counter() >= deadline:
                break
            sleep(UNAVAILABLE_PAUSE_S)
        for rank in asking:
            if not isinstance(answers[rank], BaseException):
                answers[rank] = TimeoutError(
                    f"worker {rank} still ran {self._restart_timeout:g} s after it was killed"
                )
        self._killed.clear()  # (each answered as a new process, or is replaced by a new actor)
        return answers

    def _load_everywhere(self, data: bytes) -> None:
        """Loads a checkpoint's bytes into every replica; its step becomes the last committed. Cut
        short (a worker that does not answer, Ctrl-C), it leaves some replicas loaded and some not:
        until it succeeds, every replica is stale, to be loaded from the last checkpoint."""
        self._reload = True
        try:
            self._committed = self._restore(list(range(self.workers)), self._ray.put(data))
        except (_Unanswered, KeyboardInterrupt):
            raise
        except BaseException:
            self._reload = False  # refused by every replica (it does not fit): nothing changed
            raise
        self._reload = False

    # -- training

    def train(
        self, batches: Iterable[B], *, retries: int = 3, on_step: Callable[[int, float], None] | None = None
    ) -> Result[list[float], WorkerError]:
        """Steps over ``batches``: ``Success(losses)``, or the first step's ``Failure`` that is not a
        lost worker (one that is, is run again, up to ``retries`` times). ``on_step(step, loss)`` is
        called after each committed step."""
        losses: list[float] = []
        for batch in batches:
            for attempt in range(retries + 1):
                result = self.step(batch)
                if isinstance(result, Success):
                    loss = result.unwrap()
                    losses.append(loss)
                    if on_step is not None:
                        on_step(self._committed, loss)
                    break
                error = result.failure()
                if not error.lost or attempt == retries:
                    return Failure(error)
        return Success(losses)

    # -- state

    def _read(self, call: str, what: str, *args: Any, ranks: list[int] | None = None) -> list[Any]:
        """Each worker's (or each of ``ranks``') answer to ``what`` (a method of the replica: its
        ``state``, ``weights``, ``digest``, ``pid``), read from the last committed state. A worker
        that does not answer within the reply timeout (hung: it is killed), whose process died, or
        that does not hold that state (Ray restarted it since, a fresh replica; or it is behind)
        is restored (:meth:`_recover`) and asked again, once; then :class:`WorkerUnavailableError`
        names it and ``call``. An exception the method raised is raised here."""
        self._flush()
        if self._reload:
            self._recover()
        ranks = list(range(self.workers)) if ranks is None else ranks
        # Ray answers ActorUnavailableError while a worker it restarts is coming back: that is no
        # attempt of the worker's, so it is asked again until the reply timeout has passed since
        # the call began or since the restore that follows a real failure.
        deadline = perf_counter() + self._reply_timeout
        attempt = 0
        while True:
            refs = [self._actors[rank].read.remote(what, *args) for rank in ranks]
            answers = self._answers(ranks, refs, self._reply_timeout)
            values: list[Any] = []
            failed: list[tuple[int, BaseException]] = []
            for rank, answer in zip(ranks, answers, strict=True):
                if isinstance(answer, BaseException):
                    failed.append((rank, answer))
                elif answer[0] == "error":
                    raise answer[1]
                elif answer[1] != self._incarnations[rank] or answer[2] != self._committed:
                    failed.append((rank, RuntimeError(f"worker {rank} does not hold step {self._committed}")))
                else:
                    values.append(answer[3])
            if not failed:
                return values
            # (A hung worker is killed even when this call gives up: the next restores it.)
            self._kill([rank for rank, error in failed if isinstance(error, TimeoutError)])
            coming_back = all(isinstance(error, self._unavailable) for _, error in failed)
            if coming_back and perf_counter() < deadline:
                sleep(UNAVAILABLE_PAUSE_S)
                self._recover()
                continue
            if attempt:
                raise WorkerUnavailableError(failed[0][0], self.workers, call, failed[0][1])
            attempt = 1
            self._recover()
            deadline = perf_counter() + self._reply_timeout  # (counted from the restore it waits on)

    def save(self, path: str | Path, *, metadata: Mapping[str, Any] | None = None) -> None:
        """Writes the last committed state (weights and optimizer state) to a checkpoint, atomically
        (``monadl.checkpoint``'s format; its metadata's ``step`` is :attr:`steps`). Where every worker
        is lost later, the trainer restores them from this file."""
        (data,) = self._read("save", "state", dict(metadata or {}), ranks=[0])
        atomic_write_bytes(Path(path), data)
        self._checkpoint = Path(path)

    def load(self, path: str | Path) -> None:
        """Loads a checkpoint into every replica (validated first: a mismatch changes nothing)."""
        data = read_regular_file(Path(path))
        self._flush()
        previous, self._checkpoint = self._checkpoint, Path(path)
        try:
            self._load_everywhere(data)
        except _Unanswered as e:  # every replica is loaded from the file, as a recovery would
            self._kill(e.hung)
            self._recover()
        except BaseException:
            if not self._reload:
                self._checkpoint = previous
            raise

    def copy_to(self, model: object) -> None:
        """Copies the last committed state into a local ``model`` of the same structure (to evaluate
        it in the driver)."""
        (data,) = self._read("copy_to", "state", ranks=[0])
        checkpoint.from_bytes(data, model)

    def weights(self) -> dict[str, Any]:
        """Worker 0's weights' data by dotted name."""
        (weights,) = self._read("weights", "weights", ranks=[0])
        return dict(weights)

    def digests(self) -> list[str]:
        """Each replica's hash of its weights, optimizer state and buffers: equal while they are
        identical."""
        return [str(digest) for digest in self._read("digests", "digest")]

    def pids(self) -> list[int]:
        """The workers' process ids (to watch them, or to test faults)."""
        return [int(pid) for pid in self._read("pids", "pid")]

    def shutdown(self) -> None:
        """Stops the workers (their replicas go with them: :meth:`save` first)."""
        for actor in self._actors:
            self._ray.kill(actor, no_restart=True)
        self._actors = []

    def __enter__(self) -> DataParallel[M, B]:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.shutdown()
