"""A worker that hangs in a data-parallel step (``monadl.distributed``): the step fails within its
timeout as a lost worker's, the hung worker is killed, restarted and restored, and the trainer stays
usable (``save``, ``digests``, the next step), after Ctrl-C too.

Each test runs under an alarm (:func:`bounded`), so that a hang in the driver fails it instead of
blocking the run; leaving the trainer's ``with`` block kills every worker, the hung one included."""

from __future__ import annotations

import _thread
import os
import signal
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
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
from monadl.distributed import STEP_TIMEOUT_FACTOR, DataParallel, WorkerError, WorkerUnavailableError

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


def committed(path: Path, batches: list[Batch], make: Callable[[], Net] = build) -> None:
    """Checks that the checkpoint at ``path`` holds the weights of a run on ``batches`` (loaded
    into a model ``make()`` gives)."""
    net = make()
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


# ----------------------------------------------------------------------------------------- requests

REPLY = 2.0  # the tests' reply_timeout_s: a request here takes well under a tenth of it


class Probe(ml.Buffer):
    """A buffer whose state (read by ``save``, ``copy_to`` and ``digests``) hangs for ever, or kills
    its process, while a file in ``folder`` says so: ``hang`` every time, ``hang-once`` and
    ``die-once`` once (the first process to read it takes it); and whose loading (``load``, a
    restore) does so once for ``load-hang-once`` and ``load-die-once``."""

    kind = "test-probe"

    def __init__(self, folder: str) -> None:
        self.folder = Path(folder)

    def state(self) -> ml.BufferState:
        if (self.folder / "hang").exists():
            threading.Event().wait()
        self._act("")
        return ml.BufferState({}, {})

    def check_state(self, state: ml.BufferState) -> str | None:
        return None if not state.arrays and not state.info else "a probe has no state"

    def load_state(self, state: ml.BufferState) -> None:
        self._act("load-")

    def _act(self, prefix: str) -> None:
        if _take(self.folder / f"{prefix}hang-once"):
            threading.Event().wait()
        if _take(self.folder / f"{prefix}die-once"):
            os.kill(os.getpid(), signal.SIGKILL)


def _take(path: Path) -> bool:
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    return True


@dataclass
class ProbedNet(Net):
    probe: Probe


@dataclass(frozen=True)
class BuildProbed:
    folder: str

    def __call__(self) -> ProbedNet:
        net = build()
        return ProbedNet(net.table, net.hidden, net.out, net.gain, Probe(self.folder))


def probed_trainer(folder: Path, workers: int = 2) -> DataParallel[Any, Any]:
    return DataParallel(
        BuildProbed(str(folder)), loss, ml.Adam(0.01), workers, reply_timeout_s=REPLY, restart_timeout_s=60.0
    )


@contextmanager
def stopped(pid: int, seconds: float) -> Iterator[None]:
    """The process ``pid`` stopped (SIGSTOP) for ``seconds``. (Stopped for good, it would hang the
    driver as long, but Ray would take longer to kill it: it lets a process exit on its own first.)"""
    os.kill(pid, signal.SIGSTOP)
    timer = threading.Timer(seconds, _go_on, (pid,))
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        _go_on(pid)


def _go_on(pid: int) -> None:
    with suppress(ProcessLookupError):
        os.kill(pid, signal.SIGCONT)


def test_a_stopped_worker_is_replaced_within_the_reply_timeout(ray_session: Any, tmp_path: Path) -> None:
    """A worker that does not answer (its process stopped past the deadline) is killed, restarted
    and restored after ``reply_timeout_s``, and the call answers from the committed state: each
    call in turn, with a worker it reads stopped (``save``, ``copy_to`` and ``weights`` read worker
    0; ``digests`` and ``pids`` every worker)."""
    batches = [batch(k) for k in range(2)]
    expected = reference(batches, ml.Adam(0.01))
    with bounded(), probed_trainer(tmp_path) as trainer:
        assert isinstance(trainer.train(batches), Success)
        digests = trainer.digests()
        for call, rank in [("digests", 1), ("pids", 0), ("weights", 0)]:
            pids = trainer.pids()
            started = time.perf_counter()
            with stopped(pids[rank], REPLY + 2.0):
                answer = getattr(trainer, call)()
            assert REPLY <= time.perf_counter() - started < REPLY + 30.0, call
            new_pids = trainer.pids()
            assert [new != old for new, old in zip(new_pids, pids, strict=True)] == [
                k == rank for k in range(2)
            ]
            assert trainer.digests() == digests and trainer.steps == 2
            if call == "digests":
                assert answer == digests
            elif call == "pids":
                assert answer == new_pids
            else:
                assert set(answer) == set(expected.weights())
        assert_close(trainer, expected)


@pytest.mark.parametrize("what", ["hang-once", "die-once"])
def test_a_worker_that_hangs_or_dies_while_answering_is_restored_and_asked_again(
    ray_session: Any, tmp_path: Path, what: str
) -> None:
    """The first worker asked for its state hangs in it, or its process dies: it is restored and
    asked again (``save``, ``copy_to`` and ``digests`` in turn); one that does so loading a
    checkpoint is restored, and every replica loads it (``load``). No exception of Ray's comes
    out."""
    batches = [batch(k) for k in range(2)]
    expected = reference(batches, ml.Adam(0.01))
    with bounded(), probed_trainer(tmp_path) as trainer:
        assert isinstance(trainer.train(batches), Success)
        digests = trainer.digests()
        for call in ("save", "copy_to", "digests", "load"):
            pids = trainer.pids()
            marker = tmp_path / (f"load-{what}" if call == "load" else what)
            marker.touch()
            if call == "save":
                trainer.save(tmp_path / "saved.safetensors")
            elif call == "copy_to":
                net = BuildProbed(str(tmp_path))()
                trainer.copy_to(net)
                for name, weight in expected.weights().items():
                    np.testing.assert_allclose(net.weights()[name].data, weight.data, rtol=0, atol=1e-12)
            elif call == "digests":
                assert trainer.digests() == digests
            else:
                trainer.load(tmp_path / "saved.safetensors")
            assert not marker.exists()
            assert sum(new != old for new, old in zip(trainer.pids(), pids, strict=True)) == 1, call
            assert trainer.digests() == digests and trainer.steps == 2
        assert isinstance(trainer.step(batch(2)), Success)
        assert identical(trainer)
    committed(tmp_path / "saved.safetensors", batches, BuildProbed(str(tmp_path)))


def test_a_worker_that_hangs_again_after_its_restore_is_named(ray_session: Any, tmp_path: Path) -> None:
    """Every replica hangs in its state: restored from the checkpoint, they hang again, and
    ``digests`` names the worker and the call; once they no longer hang, the trainer goes on."""
    batches = [batch(k) for k in range(3)]
    with bounded(), probed_trainer(tmp_path) as trainer:
        assert isinstance(trainer.train(batches[:2]), Success)
        digests = trainer.digests()
        trainer.save(tmp_path / "saved.safetensors")
        (tmp_path / "hang").touch()
        started = time.perf_counter()
        message = r"DataParallel\.digests: worker 0 of 2 did not answer"
        with pytest.raises(WorkerUnavailableError, match=message) as caught:
            trainer.digests()
        assert 2 * REPLY <= time.perf_counter() - started < 2 * REPLY + 30.0
        assert (caught.value.worker, caught.value.call) == (0, "digests")
        assert isinstance(caught.value.cause, TimeoutError)
        (tmp_path / "hang").unlink()
        assert trainer.digests() == digests and trainer.steps == 2
        assert isinstance(trainer.train(batches[2:]), Success)
        assert identical(trainer)
        assert_close(trainer, reference(batches, ml.Adam(0.01)))


class ComingBack:
    """Stands in for the trainer's ``_answers``: worker 0's reads answer Ray's
    ``ActorUnavailableError`` (a worker Ray is restarting) ``times`` times, then as they are."""

    def __init__(self, trainer: DataParallel[Any, Any], times: int, hung_first: bool = False) -> None:
        import ray

        self.answers = trainer._answers  # the seam the test injects the error at
        self.error = ray.exceptions.ActorUnavailableError("worker 0 is restarting", None)
        self.left = times
        self.hung_first = hung_first

    def __call__(self, ranks: list[int], refs: list[Any], timeout: float) -> list[Any]:
        answers = self.answers(ranks, refs, timeout)
        if self.hung_first and 0 in ranks and timeout == REPLY:
            self.hung_first = False  # (a worker that did not answer: the read waited its timeout)
            time.sleep(timeout)
            answers[ranks.index(0)] = TimeoutError(f"worker 0 did not answer within {timeout:g} s")
        elif self.left and 0 in ranks and timeout == REPLY:
            self.left -= 1
            answers[ranks.index(0)] = self.error
        return answers


@pytest.mark.parametrize(("times", "hung_first"), [(3, False), (1000, False), (0, True)])
def test_a_worker_ray_says_is_coming_back_is_asked_until_the_reply_timeout(
    ray_session: Any, tmp_path: Path, times: int, hung_first: bool
) -> None:
    """Ray's transient ``ActorUnavailableError`` (a restarted worker not back yet) is not the
    worker's failure: the read asks again until ``reply_timeout_s`` has passed (then it names the
    worker and the call), counted from the restore where the worker first did not answer
    (``hung_first``: killed and restarted, Ray answers for it that way itself for a while)."""
    with bounded(), probed_trainer(tmp_path) as trainer:
        assert isinstance(trainer.train([batch(0)]), Success)
        digests = trainer.digests()
        trainer._answers = ComingBack(trainer, times, hung_first)  # type: ignore[method-assign]
        started = time.perf_counter()
        if times < 1000:  # (then the worker answers within the timeout)
            assert trainer.digests() == digests
        else:
            with pytest.raises(WorkerUnavailableError, match=r"DataParallel\.digests: worker 0 of 2"):
                trainer.digests()
            assert time.perf_counter() - started >= REPLY
        assert trainer.steps == 1


def test_a_killed_worker_is_restored_though_its_old_process_answers(ray_session: Any, tmp_path: Path) -> None:
    """Ray kills asynchronously: a worker's old process can still answer the survey that follows
    its kill. The restore waits for the new process (another incarnation) and restores it, each
    time, rather than take the old one for a survivor and leave the new one unrestored."""
    with bounded(), probed_trainer(tmp_path) as trainer:
        assert isinstance(trainer.train([batch(0)]), Success)
        digests = trainer.digests()
        for _ in range(3):
            before, actor = trainer._incarnations[0], trainer._actors[0]
            trainer._kill([0])
            assert trainer._recover() == [0]
            assert trainer._incarnations[0] != before
            assert trainer._actors[0] is actor  # (Ray's restart, not a new actor)
            assert trainer.digests() == digests and trainer.steps == 1


def test_a_killed_worker_whose_process_goes_on_answering_is_replaced(
    ray_session: Any, tmp_path: Path
) -> None:
    """A worker taken as killed whose process still answers as before when the restart timeout
    has passed (the kill never landed) is replaced by a new actor and restored from the others."""
    trainer = DataParallel(
        BuildProbed(str(tmp_path)), loss, ml.Adam(0.01), 2, reply_timeout_s=REPLY, restart_timeout_s=3.0
    )
    with bounded(), trainer:
        assert isinstance(trainer.train([batch(0)]), Success)
        digests = trainer.digests()
        before, actor = trainer._incarnations[0], trainer._actors[0]
        trainer._killed[0] = before  # as _kill records it, but the process is not killed
        started = time.perf_counter()
        assert trainer._recover() == [0]
        assert time.perf_counter() - started >= 3.0
        assert trainer._actors[0] is not actor and trainer._incarnations[0] != before
        assert trainer.digests() == digests and trainer.steps == 1


def slow_build() -> Net:
    """A model whose building outlasts the tests' start timeout."""
    time.sleep(60.0)
    return build()


def test_a_worker_that_does_not_start_within_the_start_timeout_is_an_error(ray_session: Any) -> None:
    """A new worker gets ``start_timeout_s`` (not the restart timeout) to start: one still building
    its model then is an error naming the worker and the timeout, raised without waiting longer."""
    started = time.perf_counter()
    with pytest.raises(RuntimeError, match=r"worker 0 did not start within 1 s"):
        DataParallel(slow_build, loss, ml.SGD(0.1), 1, restart_timeout_s=600.0, start_timeout_s=1.0)
    assert time.perf_counter() - started < 30.0


def test_the_reply_restart_and_start_timeouts_are_checked() -> None:
    bad: Any
    for bad in (0, -1.0, float("nan"), None):
        message = rf"must be a positive number of seconds, got {bad!r}"
        with pytest.raises(ValueError, match=f"reply_timeout_s {message}"):
            DataParallel(build, loss, ml.SGD(0.1), 1, reply_timeout_s=bad)
        with pytest.raises(ValueError, match=f"restart_timeout_s {message}"):
            DataParallel(build, loss, ml.SGD(0.1), 1, restart_timeout_s=bad)
        with pytest.raises(ValueError, match=f"start_timeout_s {message}"):
            DataParallel(build, loss, ml.SGD(0.1), 1, start_timeout_s=bad)
