"""A worker that hangs in a data-parallel step (``monadl.distributed``): the step fails within its
timeout as a lost worker's, the hung worker is killed, restarted and restored, and the trainer stays
usable (``save``, ``digests``, the next step), after Ctrl-C too.

Each test runs under an alarm (:func:`bounded`), so that a hang in the driver fails it instead of
blocking the run; leaving the trainer's ``with`` block kills every worker, the hung one included."""

from __future__ import annotations

import _thread
import signal
import statistics
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import numpy as np
import pytest
from returns.result import Success
from test_distributed import (
    SLOW,
    Batch,
    Net,
    assert_close,
    batch,
    build,
    identical,
    loss,
    marked,
    reference,
)

import monadl as ml
from monadl.distributed import STEP_TIMEOUT_FACTOR, DataParallel, WorkerError

HANG = 4444.0  # an input value that makes the loss block for ever (once: see HangOnce)
TIMEOUT = 3.0  # the tests' step_timeout_s: the steps here take well under a tenth of it
LIMIT = 120  # seconds a test here may run: each takes about a tenth of it


@contextmanager
def bounded(seconds: int = LIMIT) -> Iterator[None]:
    """Fails the test where its body runs past ``seconds``. The alarm raises ``KeyboardInterrupt``,
    the one exception Ray's blocking calls let through (they go on waiting past another)."""
    rang = False

    def ring(signum: int, frame: FrameType | None) -> None:
        nonlocal rang
        rang = True
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, ring)
    signal.alarm(seconds)
    try:
        yield
    except KeyboardInterrupt:
        if rang:
            pytest.fail(f"the test ran past {seconds} s")
        raise
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@dataclass(frozen=True)
class HangOnce:
    """A loss that blocks for ever the first time it sees a hanging example (a file marks that it
    did, so that the restarted worker computes normally)."""

    marker: str

    def __call__(self, net: Net, shard: Batch) -> ml.FloatLayer:
        if np.any(shard[0] == HANG) and not Path(self.marker).exists():
            Path(self.marker).touch()
            threading.Event().wait()
        return loss(net, shard)


@dataclass(frozen=True)
class Sleepy:
    """A loss that takes at least ``seconds``."""

    seconds: float

    def __call__(self, net: Net, shard: Batch) -> ml.FloatLayer:
        time.sleep(self.seconds)
        return loss(net, shard)


def committed(path: Path, batches: list[Batch]) -> None:
    """Checks that the checkpoint at ``path`` holds the weights of a run on ``batches``."""
    net = build()
    ml.load(path, net)
    expected = reference(batches, ml.Adam(0.01)).weights()
    for name, weight in net.weights().items():
        np.testing.assert_allclose(
            np.asarray(weight.data), np.asarray(expected[name].data), rtol=0, atol=1e-12
        )


@pytest.mark.parametrize(
    ("workers", "reduction", "row", "rank"),
    [
        # 7 examples in shards of 2 + 2 + 2 + 1: worker 3 hangs; worker 2 waits on it to reduce,
        # worker 0 on worker 2, and the others on worker 0's total.
        (4, "tree", 6, 3),
        (2, "driver", 1, 0),  # 4 + 3: worker 0 hangs, the driver waits on its gradients
    ],
)
def test_a_hung_worker_fails_the_step_in_time_and_is_restored(
    ray_session: Any, tmp_path: Path, workers: int, reduction: Any, row: int, rank: int
) -> None:
    batches = [batch(k) for k in range(4)]
    batches[2] = marked(batches[2], row, HANG)
    marker = tmp_path / "hung"
    with (
        bounded(),
        DataParallel(
            build, HangOnce(str(marker)), ml.Adam(0.01), workers, reduction=reduction, step_timeout_s=TIMEOUT
        ) as trainer,
    ):
        assert isinstance(trainer.train(batches[:2]), Success)
        digests, pids = trainer.digests(), trainer.pids()
        timeout = trainer.step_timeout
        assert timeout is not None and timeout >= TIMEOUT
        started = time.perf_counter()
        error = trainer.step(batches[2]).failure()
        seconds = time.perf_counter() - started
        assert marker.exists()
        assert timeout <= seconds < timeout + 30.0  # the deadline, then a restart and a restore
        assert isinstance(error, WorkerError) and error.lost and (error.worker, error.step) == (rank, 3)
        assert isinstance(error.cause, TimeoutError)
        assert f"step 3 did not finish within {timeout:g} s" in str(error.cause)
        assert f"worker {rank} hung" in str(error.cause)
        # Nothing applied; the hung worker is a new process, the others are the same.
        assert trainer.steps == 2 and trainer.digests() == digests
        assert [pid != old for pid, old in zip(trainer.pids(), pids, strict=True)] == [
            k == rank for k in range(workers)
        ]
        trainer.save(tmp_path / "after.safetensors")
        assert isinstance(trainer.train(batches[2:]), Success)
        assert identical(trainer)
        assert_close(trainer, reference(batches, ml.Adam(0.01)))
    committed(tmp_path / "after.safetensors", batches[:2])


def test_ctrl_c_during_a_hung_step_leaves_the_trainer_usable(ray_session: Any, tmp_path: Path) -> None:
    """Interrupted while worker 1 hangs and worker 0 waits on it to reduce, the trainer saves, hashes
    and steps: the first of these waits out the step's deadline and restores the hung worker."""
    batches = [batch(k) for k in range(3)]
    batches[1] = marked(batches[1], 5, HANG)  # worker 1's shard (4 + 3)
    marker = tmp_path / "hung"
    with (
        bounded(),
        DataParallel(build, HangOnce(str(marker)), ml.Adam(0.01), 2, step_timeout_s=TIMEOUT) as trainer,
    ):
        assert isinstance(trainer.step(batches[0]), Success)
        digests, pids = trainer.digests(), trainer.pids()
        timeout = trainer.step_timeout
        assert timeout is not None
        timer = threading.Timer(0.5, _thread.interrupt_main)
        timer.start()
        started = time.perf_counter()
        with pytest.raises(KeyboardInterrupt):
            trainer.step(batches[1])
        timer.join()
        assert time.perf_counter() - started < timeout  # at once, not at the deadline
        assert marker.exists()
        trainer.save(tmp_path / "interrupted.safetensors")
        assert time.perf_counter() - started < timeout + 30.0
        assert trainer.steps == 1 and trainer.digests() == digests
        assert trainer.pids()[0] == pids[0] and trainer.pids()[1] != pids[1]
        assert isinstance(trainer.train(batches[1:]), Success)
        assert identical(trainer)
        assert_close(trainer, reference(batches, ml.Adam(0.01)))
    committed(tmp_path / "interrupted.safetensors", batches[:1])


def test_the_timeout_grows_with_the_steps_times(ray_session: Any) -> None:
    """Steps of half a second give a timeout of 10 times that: a 2-second step is not taken as a
    hang, though the floor is 1 second."""
    with bounded(), DataParallel(build, Sleepy(0.5), ml.SGD(0.1), 1, step_timeout_s=1.0) as trainer:
        assert trainer.step_timeout == 1.0
        seconds = []
        for k in range(3):
            assert isinstance(trainer.step(batch(k)), Success)
            assert trainer.last_stats is not None
            seconds.append(trainer.last_stats.seconds)
        assert trainer.step_timeout == max(1.0, STEP_TIMEOUT_FACTOR * statistics.median(seconds))
        assert isinstance(trainer.step(marked(batch(3), 0, SLOW)), Success)  # 2.5 s
        assert trainer.steps == 4


def test_the_step_timeout_has_a_default_and_is_checked(ray_session: Any) -> None:
    with DataParallel(build, loss, ml.SGD(0.1), 1) as trainer:
        assert trainer.step_timeout == 300.0
    with DataParallel(build, loss, ml.SGD(0.1), 1, step_timeout_s=None) as trainer:
        assert trainer.step_timeout is None
        assert isinstance(trainer.step(batch(0)), Success)
        assert trainer.step_timeout is None
    for bad in (0, -1.0, float("nan"), float("inf"), True):
        with pytest.raises(ValueError, match=rf"step_timeout_s must be a positive number .*got {bad!r}"):
            DataParallel(build, loss, ml.SGD(0.1), 1, step_timeout_s=bad)
