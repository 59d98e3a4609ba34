"""Data-parallel training on Ray (``monadl.distributed``): N workers equal one process on the global
batch, the replicas stay bit-identical, a step is all-or-nothing across workers, and lost workers
(SIGKILL, ``ray.kill``, every one at once) are restored so that training ends where it would have
without the fault.

The model's functions live in this module: the workers import it by name (the session's Ray fixture
puts ``tests/`` on their path)."""

from __future__ import annotations

import _thread
import math
import os
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from returns.result import Failure, Success

import monadl as ml
from monadl import nn
from monadl.distributed import DataParallel, StepStats, WorkerError, batch_size, shard_batch
from monadl.do.primitive import Primitive
from monadl.dsl.core.layers import apply_array

Batch = tuple[np.ndarray, np.ndarray, np.ndarray]
POISON = 999.0  # an input value that makes the loss raise
NON_FINITE_GRADIENT = 7777.0  # one whose gradient is not finite
SLOW = 5555.0  # one that makes the shard's loss slow (a worker to kill mid-step)


@dataclass
class Net(ml.Module):
    table: ml.ArrayWeight
    hidden: nn.Linear
    out: nn.Linear
    gain: ml.FloatWeight


def build(width: int = 16) -> Net:
    rng = np.random.default_rng(7)
    table = ml.ArrayWeight(rng.normal(size=(10, 4)))
    f64 = np.float64  # the float64 table's dtype: workers and a single process agree to 1e-12
    return Net(
        table,
        nn.Linear.new(8, width, seed=rng, dtype=f64),
        nn.Linear.new(width, 3, seed=rng, dtype=f64),
        ml.FloatWeight(0.9),
    )


def build_wide() -> Net:
    return build(64)


def build_unseeded() -> Net:
    """A model whose initial weights differ from process to process."""
    rng = np.random.default_rng()
    return Net(
        ml.ArrayWeight(rng.normal(size=(10, 4))),
        nn.Linear.new(8, 16, seed=rng, dtype=np.float64),
        nn.Linear.new(16, 3, seed=rng, dtype=np.float64),
        ml.FloatWeight(float(rng.normal())),
    )


def loss(net: Net, shard: Batch) -> ml.FloatLayer:
    """The sum of the shard's cross-entropies: an embedding looked up (a sparse gradient), two dense
    layers and a float weight."""
    x, ids, y = shard
    if np.any(x == POISON):
        raise ValueError("a poisoned example")
    if np.any(x == SLOW):
        time.sleep(2.0)
    rows = ml.take_rows(net.table, ids)
    h = ml.tanh(net.hidden(ml.concatenate([x, rows], axis=1))) * net.gain
    total = ml.cross_entropy(net.out(h), y) * float(len(y))
    if np.any(x == NON_FINITE_GRADIENT):
        total = total + ml.sqrt(ml.abs(net.gain - net.gain))  # 0, but its gradient is not finite
    return total


@dataclass(frozen=True)
class KillOnce:
    """A loss that SIGKILLs its own worker, mid-step, the first time it sees a slow example (a file
    marks that it did, so that the restarted worker computes normally)."""

    marker: str

    def __call__(self, net: Net, shard: Batch) -> ml.FloatLayer:
        if np.any(shard[0] == SLOW) and not os.path.exists(self.marker):
            Path(self.marker).touch()
            os.kill(os.getpid(), signal.SIGKILL)
        return loss(net, shard)


def batch(k: int, n: int = 7) -> Batch:
    rng = np.random.default_rng(100 + k)
    return rng.normal(size=(n, 4)), rng.integers(0, 10, size=n), rng.integers(0, 3, size=n)


def marked(b: Batch, row: int, value: float) -> Batch:
    x = b[0].copy()
    x[row, 0] = value
    return x, b[1], b[2]


def reference(batches: list[Batch], optimizer: Any) -> Net:
    """One process on each whole batch: the mean loss over the batch, step by step."""
    net = build()
    for b in batches:
        result = ml.train_blocking(loss(net, b) * (1.0 / batch_size(b)), optimizer)
        assert isinstance(result, Success), result
    return net


def assert_close(trainer: DataParallel[Any, Any], net: Net, tolerance: float = 1e-12) -> None:
    weights = trainer.weights()
    for name, weight in net.weights().items():
        np.testing.assert_allclose(np.asarray(weights[name]), np.asarray(weight.data), rtol=0, atol=tolerance)


def identical(trainer: DataParallel[Any, Any]) -> bool:
    return len(set(trainer.digests())) == 1


# ----------------------------------------------------------------------------------------- shards


class Columns(NamedTuple):
    x: np.ndarray
    y: np.ndarray


@settings(max_examples=60, deadline=None)
@given(size=st.integers(0, 23), n=st.integers(1, 6))
def test_shards_cover_the_batch_in_order_with_sizes_that_differ_by_at_most_one(size: int, n: int) -> None:
    examples = list(range(size))
    shards = shard_batch(examples, n)
    sizes = [len(shard) for shard in shards]
    assert len(shards) == n and [e for shard in shards for e in shard] == examples
    assert sizes == sorted(sizes, reverse=True) and max(sizes) - min(sizes) <= 1
    x = np.arange(size * 2.0).reshape(size, 2)
    columns = shard_batch(Columns(x, np.arange(size)), n)
    assert all(type(c) is Columns for c in columns)
    assert [batch_size(c) for c in columns] == sizes
    np.testing.assert_array_equal(np.concatenate([c.x for c in columns]), x)
    as_dict = shard_batch({"x": x, "y": np.arange(size)}, n)
    assert [batch_size(d) for d in as_dict] == sizes
    np.testing.assert_array_equal(np.concatenate([d["y"] for d in as_dict]), np.arange(size))


def test_a_batch_that_cannot_be_split_is_refused_clearly() -> None:
    with pytest.raises(ValueError, match=r"columns differ in length: \[3, 2\]"):
        shard_batch((np.zeros(3), np.zeros(2)), 2)
    with pytest.raises(TypeError, match="cannot split a str"):
        shard_batch("abc", 2)
    with pytest.raises(ValueError, match="at least 1"):
        shard_batch([1, 2], 0)


# ----------------------------------------------------------------------------------------- exactness


@pytest.mark.parametrize(("workers", "reduction"), [(1, "tree"), (2, "tree"), (3, "tree"), (3, "driver")])
def test_n_workers_equal_one_process_on_the_global_batch(
    ray_session: Any, workers: int, reduction: Any
) -> None:
    # 7 examples: shards of 7; 4 + 3; 3 + 2 + 2. The loss is the global batch's mean, not a mean
    # of the shards' means (those would weigh a 2-example shard's examples more).
    batches = [batch(k) for k in range(4)]
    with DataParallel(build, loss, ml.Adam(0.01), workers, reduction=reduction) as trainer:
        losses = []
        for b in batches:
            result = trainer.step(b)
            assert isinstance(result, Success), result
            losses.append(result.unwrap())
        assert identical(trainer)
        assert trainer.steps == 4
        assert_close(trainer, reference(batches, ml.Adam(0.01)))
    expected = build()
    for b, value in zip(batches, losses, strict=True):
        step = ml.train_blocking(loss(expected, b) * (1.0 / 7), ml.Adam(0.01))
        assert abs(step.unwrap() - value) < 1e-12


def test_more_workers_than_examples_leaves_some_shards_empty(ray_session: Any) -> None:
    batches = [batch(k, n=2) for k in range(2)]
    with DataParallel(build, loss, ml.SGD(0.1), 3) as trainer:
        assert isinstance(trainer.train(batches), Success)
        assert identical(trainer)
        assert_close(trainer, reference(batches, ml.SGD(0.1)))


def test_a_tree_of_four_workers_keeps_the_gradients_away_from_the_driver(ray_session: Any) -> None:
    batches = [batch(k, n=10) for k in range(3)]
    sent: dict[str, int] = {}
    for reduction in ("tree", "driver"):
        with DataParallel(
            build_wide, loss, ml.Adam(0.01), 4, reduction=reduction, count_bytes=True
        ) as trainer:
            assert isinstance(trainer.train(batches), Success)
            assert identical(trainer)
            stats = trainer.last_stats
            assert isinstance(stats, StepStats) and stats.driver_bytes is not None
            sent[reduction] = stats.driver_bytes
            weights = trainer.weights()
        net = build_wide()
        for b in batches:
            ml.train_blocking(loss(net, b) * 0.1, ml.Adam(0.01)).unwrap()
        for name, weight in net.weights().items():
            np.testing.assert_allclose(np.asarray(weights[name]), np.asarray(weight.data), rtol=0, atol=1e-12)
    gradient_bytes = sum(np.asarray(w.data).nbytes for w in build_wide().weights().values())
    # Through the driver: four shards' gradients in, their sum out. Through the tree: the shards.
    assert sent["driver"] > 4 * gradient_bytes
    assert sent["tree"] < gradient_bytes / 2


# ----------------------------------------------------------------------------------------- all or nothing


@pytest.mark.parametrize(
    ("value", "cause", "message"),
    [
        (POISON, ValueError, "a poisoned example"),
        (np.nan, ml.NonFiniteLossError, "the loss is not finite"),
        (NON_FINITE_GRADIENT, ml.NonFiniteGradientError, "'gain' on worker 1's shard is not finite"),
    ],
)
def test_a_step_that_fails_on_one_worker_changes_no_replica(
    ray_session: Any, value: float, cause: type[Exception], message: str
) -> None:
    good = [batch(k) for k in range(3)]
    with DataParallel(build, loss, ml.Adam(0.01), 3) as trainer:
        assert isinstance(trainer.step(good[0]), Success)
        before, digests = trainer.weights(), trainer.digests()
        result = trainer.step(marked(batch(9), 3, value))  # row 3 is in worker 1's shard (3 + 2 + 2)
        assert isinstance(result, Failure)
        error = result.failure()
        assert isinstance(error, WorkerError)
        assert (error.worker, error.step, error.lost) == (1, 2, False)
        assert isinstance(error.cause, cause) and error.__cause__ is error.cause
        assert message in str(error.cause) and "worker 1 of 3 failed" in str(error)
        assert "no replica was changed" in str(error)
        assert trainer.digests() == digests and trainer.steps == 1
        after = trainer.weights()
        assert all(np.array_equal(np.asarray(after[k]), np.asarray(v)) for k, v in before.items())
        # Training goes on as if the failed step had never been tried.
        assert isinstance(trainer.train(good[1:]), Success)
        assert identical(trainer)
        assert_close(trainer, reference(good, ml.Adam(0.01)))


def test_a_loss_that_is_not_a_float_layer_is_named(ray_session: Any) -> None:
    def not_a_layer(net: Net, shard: Batch) -> Any:
        return 1.0

    with DataParallel(build, not_a_layer, ml.SGD(0.1), 1) as trainer:
        error = trainer.step(batch(0)).failure()
        assert isinstance(error.cause, TypeError) and "must return a FloatLayer" in str(error.cause)


def test_replicas_start_from_worker_0s_model(ray_session: Any) -> None:
    with DataParallel(build_unseeded, loss, ml.SGD(0.1), 2) as trainer:
        assert identical(trainer)
        assert isinstance(trainer.step(batch(0)), Success)
        assert identical(trainer)


def test_bad_settings_are_refused(ray_session: Any) -> None:
    with pytest.raises(ValueError, match="workers must be at least 1"):
        DataParallel(build, loss, ml.SGD(0.1), 0)
    with pytest.raises(ValueError, match="reduction must be"):
        DataParallel(build, loss, ml.SGD(0.1), 1, reduction="ring")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"5 workers need 5 CPUs \(one each\), and the Ray cluster has 4"):
        DataParallel(build, loss, ml.SGD(0.1), 5)


# ----------------------------------------------------------------------------------------- faults


def test_a_worker_killed_mid_step_is_restored_and_training_ends_where_it_would_have(
    ray_session: Any, tmp_path: Path
) -> None:
    batches = [batch(k) for k in range(4)]
    batches[2] = marked(batches[2], 5, SLOW)  # row 5: worker 1's shard (4 + 3)
    losses_seen: list[tuple[int, float]] = []
    with DataParallel(build, KillOnce(str(tmp_path / "killed")), ml.Adam(0.01), 2) as trainer:
        pids = trainer.pids()
        result = trainer.train(batches, on_step=lambda step, value: losses_seen.append((step, value)))
        assert isinstance(result, Success), result
        assert (tmp_path / "killed").exists()
        assert trainer.pids()[0] == pids[0] and trainer.pids()[1] != pids[1]
        assert [step for step, _ in losses_seen] == [1, 2, 3, 4] and trainer.steps == 4
        assert identical(trainer)
        assert_close(trainer, reference(batches, ml.Adam(0.01)))


@pytest.mark.parametrize("how", ["sigkill", "ray.kill", "no restarts left"])
def test_a_step_with_a_lost_worker_fails_cleanly(ray_session: Any, how: str) -> None:
    batches = [batch(k) for k in range(3)]
    restarts = 0 if how == "no restarts left" else 3
    with DataParallel(build, loss, ml.Adam(0.01), 2, max_restarts=restarts) as trainer:
        assert isinstance(trainer.step(batches[0]), Success)
        digests = trainer.digests()
        victim = trainer.pids()[1]

        def kill() -> None:
            if how == "ray.kill":
                ray_session.kill(trainer._actors[1], no_restart=False)
            else:
                os.kill(victim, signal.SIGKILL)

        timer = threading.Timer(0.3, kill)
        timer.start()  # while worker 1 sleeps in its loss
        result = trainer.step(marked(batches[1], 5, SLOW))
        timer.join()
        error = result.failure()
        assert isinstance(error, WorkerError) and error.lost and error.worker == 1
        assert trainer.steps == 1 and trainer.digests() == digests  # restored, and nothing applied
        assert trainer.pids()[1] != victim
        assert isinstance(trainer.train(batches[1:]), Success)
        assert identical(trainer)
        assert_close(trainer, reference(batches, ml.Adam(0.01)))


def test_a_worker_restarted_between_steps_is_restored_before_its_gradients_count(ray_session: Any) -> None:
    """Killed between steps, a worker comes back as a fresh replica of ``build()`` with no task of
    the driver's failing: every step's first task checks the worker's incarnation, so the next step
    fails as lost, the worker is restored, and the replicas stay those of a run without the fault."""
    batches = [batch(k) for k in range(4)]
    with DataParallel(build, loss, ml.Adam(0.01), 2, max_restarts=3) as trainer:
        assert isinstance(trainer.train(batches[:2]), Success)
        victim = trainer.pids()[1]
        os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + 30.0
        while True:  # until Ray has started it again (the driver is told nothing)
            try:
                if ray_session.get(trainer._actors[1].hello.remote(), timeout=5.0)[2] != victim:
                    break
            except ray_session.exceptions.RayError:
                pass
            assert time.monotonic() < deadline, "Ray did not restart the worker"
            time.sleep(0.2)
        error = trainer.step(batches[2]).failure()
        assert isinstance(error, WorkerError) and error.lost and error.worker == 1
        assert trainer.steps == 2 and identical(trainer)  # restored, and nothing applied
        assert isinstance(trainer.train(batches[2:]), Success)
        assert identical(trainer)
        assert_close(trainer, reference(batches, ml.Adam(0.01)))


def test_save_after_worker_0_restarted_between_steps_writes_the_committed_state(
    ray_session: Any, tmp_path: Path
) -> None:
    """Worker 0, which ``save``, ``copy_to`` and ``weights`` read, killed between steps comes back
    as a fresh replica of ``build()``: it is restored before anything is read from it."""
    batches = [batch(k) for k in range(3)]
    with DataParallel(build, loss, ml.Adam(0.01), 2, max_restarts=3) as trainer:
        assert isinstance(trainer.train(batches), Success)
        committed = trainer.weights()
        victim = trainer.pids()[0]
        os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + 30.0
        while True:  # until Ray has started it again (the driver is told nothing)
            try:
                if ray_session.get(trainer._actors[0].hello.remote(), timeout=5.0)[2] != victim:
                    break
            except ray_session.exceptions.RayError:
                pass
            assert time.monotonic() < deadline, "Ray did not restart the worker"
            time.sleep(0.2)
        trainer.save(tmp_path / "after.safetensors")
        assert identical(trainer) and trainer.steps == 3
        for name, data in trainer.weights().items():
            np.testing.assert_array_equal(data, committed[name])
        saved = build()
        ml.load(tmp_path / "after.safetensors", saved)
        for name, weight in ml.weights_of(saved).items():
            np.testing.assert_array_equal(weight.data, committed[name])


def test_every_worker_lost_is_restored_from_the_last_checkpoint(ray_session: Any, tmp_path: Path) -> None:
    batches = [batch(k) for k in range(4)]
    path = tmp_path / "last.safetensors"
    with DataParallel(build, loss, ml.Adam(0.01), 2) as trainer:
        assert isinstance(trainer.train(batches[:2]), Success)
        trainer.save(path, metadata={"note": "after two"})
        assert ml.load(path, build()) == {"note": "after two", "step": 2}
        assert isinstance(trainer.step(batches[2]), Success)
        for pid in trainer.pids():
            os.kill(pid, signal.SIGKILL)
        error = trainer.step(batches[3]).failure()
        assert error.lost
        assert trainer.steps == 2  # the checkpoint's: step 3 is to be run again
        assert isinstance(trainer.train(batches[2:]), Success)
        assert identical(trainer)
        assert_close(trainer, reference(batches, ml.Adam(0.01)))


def test_ctrl_c_in_the_driver_leaves_the_last_committed_state(ray_session: Any, tmp_path: Path) -> None:
    batches = [batch(k) for k in range(3)]
    with DataParallel(build, loss, ml.Adam(0.01), 2) as trainer:
        assert isinstance(trainer.step(batches[0]), Success)
        digests = trainer.digests()
        timer = threading.Timer(0.3, _thread.interrupt_main)
        timer.start()
        started = time.perf_counter()
        with pytest.raises(KeyboardInterrupt):
            trainer.step(marked(batches[1], 0, SLOW))  # worker 0 sleeps 2 s in its loss
        timer.join()
        assert time.perf_counter() - started < 1.5  # at once, not when the step would have ended
        assert trainer.steps == 1 and trainer.digests() == digests
        trainer.save(tmp_path / "interrupted.safetensors")
        assert isinstance(trainer.train(batches[1:]), Success)
        assert_close(trainer, reference(batches, ml.Adam(0.01)))
    net = build()
    ml.load(tmp_path / "interrupted.safetensors", net)
    expected = reference(batches[:1], ml.Adam(0.01)).weights()
    for name, weight in net.weights().items():
        np.testing.assert_allclose(
            np.asarray(weight.data), np.asarray(expected[name].data), rtol=0, atol=1e-12
        )


def test_a_checkpoint_that_does_not_fit_changes_nothing(ray_session: Any, tmp_path: Path) -> None:
    path = tmp_path / "wide.safetensors"
    ml.save(path, build_wide())
    with DataParallel(build, loss, ml.SGD(0.1), 2) as trainer:
        assert isinstance(trainer.step(batch(0)), Success)
        digests = trainer.digests()
        with pytest.raises(ml.CheckpointError, match=r"hidden\.w"):
            trainer.load(path)
        assert trainer.digests() == digests and trainer.steps == 1
        net = build()
        trainer.copy_to(net)
        assert_close(trainer, net, tolerance=0.0)


# ----------------------------------------------------------------------------------------- buffers


@dataclass
class NormNet(ml.Module):
    norm: nn.BatchNorm1d
    out: nn.Linear


def build_norm() -> NormNet:
    return NormNet(nn.BatchNorm1d.new(3, dtype=np.float64), nn.Linear.new(12, 3, seed=5, dtype=np.float64))


NormBatch = tuple[np.ndarray, np.ndarray]


def norm_batch(k: int, n: int = 7) -> NormBatch:
    rng = np.random.default_rng(200 + k)
    return rng.normal(1.0 + k, 2.0, size=(n, 3, 4)), rng.integers(0, 3, size=n)


def norm_loss(net: NormNet, shard: NormBatch) -> ml.FloatLayer:
    """The batch norm layer first (its statistics do not depend on the weights), used twice."""
    x, y = shard
    h = net.norm(x) + net.norm(x * 3.0 + 1.0)
    return ml.cross_entropy(net.out(ml.reshape(h, (len(y), 12))), y) * float(len(y))


def test_batch_norm_running_statistics_are_the_whole_batchs(ray_session: Any) -> None:
    """Each replica's statistics are pooled: the running statistics are those of one process on the
    whole batch (7 examples in shards of 3 + 2 + 2, 4 values per example and channel, the layer
    used twice a step), on every replica alike."""
    batches = [norm_batch(k) for k in range(5)]
    with DataParallel(build_norm, norm_loss, ml.SGD(0.1), 3) as trainer:
        assert isinstance(trainer.train(batches), Success)
        assert identical(trainer)
        net = build_norm()
        trainer.copy_to(net)
        # Statistics past float64's range: the step fails as one process's does, changing nothing.
        digests = trainer.digests()
        error = trainer.step((batches[0][0] * 1e200, batches[0][1])).failure()
        assert isinstance(error, WorkerError) and isinstance(error.cause, ml.NonFiniteBufferError)
        assert "the buffer 'norm.running_var' (ArrayBuffer(float64 (3,)))" in str(error.cause)
        assert trainer.digests() == digests and trainer.steps == 5
    expected = build_norm()
    for b in batches:
        assert isinstance(ml.train_blocking(norm_loss(expected, b) * (1.0 / 7), ml.SGD(0.1)), Success)
    for name in ("running_mean", "running_var"):
        got, want = getattr(net.norm, name).data, getattr(expected.norm, name).data
        assert np.abs(want - (0.0 if name == "running_mean" else 1.0)).max() > 0.5  # they moved
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


@dataclass(eq=False)
class Tracker(ml.Module):
    """A module whose op stages buffers of its own: the batch's mean (floats) and a count of the
    steps (integers); with ``rows``, the batch's size too (integers that differ between shards)."""

    mean: ml.ArrayBuffer
    steps: ml.ArrayBuffer
    rows: ml.ArrayBuffer

    def __call__(self, x: Any, *, rows: bool = False) -> ml.ArrayLayer:
        return apply_array(TRACK, x, tracker=self, rows=rows)


def _track(xp: Any, x: Any, *, tracker: Tracker, rows: bool) -> Any:
    ml.stage_buffer(tracker.mean, xp.mean(x, axis=0))
    ml.stage_buffer(tracker.steps, ml.staged_data(tracker.steps) + 1)
    if rows:
        ml.stage_buffer(tracker.rows, np.array([x.shape[0]]))
    return x


TRACK = Primitive("track", _track, (lambda xp, d, out, x, **_: d,), cost=lambda *_, **__: -math.inf)


@dataclass
class TrackNet(ml.Module):
    tracker: Tracker
    out: nn.Linear


def build_tracked() -> TrackNet:
    zeros = np.zeros(4)
    tracker = Tracker(
        ml.ArrayBuffer(zeros), ml.ArrayBuffer(np.zeros(1, np.int64)), ml.ArrayBuffer(np.zeros(1, np.int64))
    )
    return TrackNet(tracker, nn.Linear.new(4, 3, seed=1, dtype=np.float64))


def tracked_loss(net: TrackNet, shard: Batch, rows: bool = False) -> ml.FloatLayer:
    x, _, y = shard
    return ml.cross_entropy(net.out(net.tracker(x, rows=rows)), y) * float(len(y))


def rows_loss(net: TrackNet, shard: Batch) -> ml.FloatLayer:
    return tracked_loss(net, shard, rows=True)


def test_a_buffer_a_step_stages_gets_the_replicas_weighted_mean_or_their_one_value(ray_session: Any) -> None:
    """A floating buffer staged by an op of the user's: the replicas' values weighted by their
    shards' sizes (here the whole batch's mean, as one process's); integers: the value every
    replica staged, and a step whose replicas staged different ones fails, changing nothing."""
    batches = [batch(k) for k in range(3)]
    with DataParallel(build_tracked, tracked_loss, ml.SGD(0.1), 3) as trainer:
        assert isinstance(trainer.train(batches), Success)
        assert identical(trainer)
        net = build_tracked()
        trainer.copy_to(net)
    np.testing.assert_allclose(net.tracker.mean.data, batches[-1][0].mean(axis=0), rtol=0, atol=1e-15)
    assert net.tracker.steps.data.tolist() == [3]
    with DataParallel(build_tracked, rows_loss, ml.SGD(0.1), 3) as trainer:
        digests = trainer.digests()
        error = trainer.step(batches[0]).failure()
        assert isinstance(error, WorkerError) and not error.lost
        assert "staged different values for the buffer(s) 'tracker.rows'" in str(error.cause)
        assert trainer.steps == 0 and trainer.digests() == digests


@dataclass
class DropNet(ml.Module):
    w: ml.ArrayWeight
    drop: ml.Dropout


def build_dropped() -> DropNet:
    return DropNet(ml.ArrayWeight(np.zeros((1, 64))), ml.Dropout(0.5, seed=3))


def dropped_loss(net: DropNet, shard: np.ndarray) -> ml.FloatLayer:
    """``w``'s gradient is the sum of the shard's rows' masks (times 2: 1 / (1 - p))."""
    return ml.sum(net.drop(shard) * net.w)


def test_each_replica_draws_its_own_dropout_masks_deterministically(ray_session: Any) -> None:
    """Two workers on one row each: with SGD(1), each of ``w``'s entries moves by the two
    replicas' masks' sum (0, 1 or 2): a 1 is an entry one replica dropped and the other kept. The
    masks are the seed's: a second trainer, and a step run again after one that failed having
    drawn its masks (a non-finite loss), draw the same ones."""
    ones = np.ones((2, 64))
    runs = []
    for fail_first in (False, True):
        with DataParallel(build_dropped, dropped_loss, ml.SGD(1.0), 2) as trainer:
            if fail_first:
                error = trainer.step(np.full((2, 64), np.nan)).failure()
                assert isinstance(error.cause, ml.NonFiniteLossError)
            assert isinstance(trainer.train([ones, ones]), Success)
            assert identical(trainer)
            runs.append(trainer.weights()["w"])
    first = -runs[0]  # two steps: the sum of four masks, each entry 0 or 1
    assert set(np.unique(first).tolist()) <= {0.0, 1.0, 2.0, 3.0, 4.0}
    assert np.any(first % 2 == 1)  # the replicas' masks differ
    np.testing.assert_array_equal(runs[1], runs[0])
