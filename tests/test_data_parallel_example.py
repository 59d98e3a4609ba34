"""The data-parallel example (examples/data_parallel.py): two Ray workers train the Tree-LSTM as one
process does on the same batches, a run resumes from its checkpoint, and Ctrl-C leaves a checkpoint
of exactly the steps it reports, exits with status 130 and stops the workers.

The in-process tests share the session's Ray cluster (``ray_session``, tests/conftest.py); the
Ctrl-C test runs the example as a script, which starts a cluster of its own.

Two workers and one process agree to 1e-12 in float64 (relative, and absolute for values near
zero), not bit for bit: the sum over the global batch is added in another order (each shard's sum,
then the shards' sums), and dynamic batching merges a shard's nodes into other, smaller matrix
products than the whole batch's. Here the losses agree to about 4e-16 relative, and the weights and
Adagrad's sums of squares to about 2e-13 absolute, at least 20 times inside the bound.
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any, NamedTuple

import numpy as np
import pytest

import monadl as ml
from examples.tree_lstm import TreeLstm
from monadl import cli
from monadl.data import sst

ROOT = Path(__file__).resolve().parent.parent

# A small run: 12 synthetic trees, 4 per step, 3 steps an epoch; float64, to compare to 1e-12.
TREES, BATCH, SIZE = 12, 4, 8
ARGS = [
    *("--trees", str(TREES), "--batch-size", str(BATCH), "--hidden", str(SIZE), "--embedding", str(SIZE)),
    *("--dtype", "float64", "--workers", "2", "--no-progress"),
]
TOLERANCE = 1e-12
"""Between two workers and one process, relative and absolute (see the module's documentation)."""


def reference(steps: int, trees: int = TREES, batch: int = BATCH) -> tuple[list[float], TreeLstm]:
    """One process's run of the example's first ``steps`` steps: its losses and its model."""
    from examples.data_parallel import epoch_batches

    train = sst.open_dataset(None, seed=0, sizes={"train": trees, "dev": max(trees // 4, 1)})["train"]
    vocabulary = sst.Vocabulary.from_trees(train)
    model = TreeLstm(len(vocabulary), SIZE, SIZE, seed=0, dtype=np.float64)
    per_epoch = math.ceil(len(train) / batch)
    batches = [b for epoch in range(-(-steps // per_epoch)) for b in epoch_batches(train, batch, 0, epoch)]
    losses = [model.step(b, vocabulary.index) for b in batches[:steps]]
    return losses, model


def assert_checkpoint_is(path: Path, model: TreeLstm, steps: int, tmp_path: Path) -> None:
    """The checkpoint at ``path`` holds ``model``'s weights and Adagrad state, to 1e-12, after
    ``steps`` steps."""
    from safetensors.numpy import load_file

    expected = tmp_path / "reference.safetensors"
    ml.save(expected, model)
    saved, wanted = load_file(str(path)), load_file(str(expected))
    assert sorted(saved) == sorted(wanted) and any(name.startswith("state/") for name in saved)
    for name, array in wanted.items():
        assert saved[name].dtype == np.float64, name
        np.testing.assert_allclose(saved[name], array, rtol=TOLERANCE, atol=TOLERANCE, err_msg=name)
    fresh = TreeLstm(len(model.embeddings.data), SIZE, SIZE, seed=9, dtype=np.float64)
    assert ml.load(path, fresh)["step"] == steps


# ------------------------------------------------------------------------------------ in process


class Run(NamedTuple):
    losses: list[float]
    checkpoint: Path
    out: str


@pytest.fixture(scope="module")
def two_epochs(ray_session: Any, tmp_path_factory: pytest.TempPathFactory) -> Run:
    """The example's run of two epochs on two workers, saved at the end."""
    from examples import data_parallel

    path = tmp_path_factory.mktemp("two_epochs") / "model.safetensors"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        losses = data_parallel.main([*ARGS, "--epochs", "2", "--save", str(path)])
    return Run(losses, path, out.getvalue())


def test_two_workers_train_as_one_process_does(two_epochs: Run, tmp_path: Path) -> None:
    assert len(two_epochs.losses) == 6 and all(math.isfinite(loss) for loss in two_epochs.losses)
    expected, model = reference(6)
    np.testing.assert_allclose(two_epochs.losses, expected, rtol=TOLERANCE, atol=TOLERANCE)
    assert_checkpoint_is(two_epochs.checkpoint, model, 6, tmp_path)
    out = two_epochs.out
    assert out.startswith("data: synthetic")
    assert "workers: 2 Ray actors" in out and "3 steps per epoch" in out
    assert "epoch 1: loss" in out and "dev root accuracy" in out
    assert f"checkpoint: {two_epochs.checkpoint}" in out


def test_a_resumed_run_is_the_run_that_never_stopped_bit_for_bit(
    two_epochs: Run, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from examples import data_parallel

    path = tmp_path / "model.safetensors"
    first = data_parallel.main([*ARGS, "--epochs", "1", "--save", str(path)])
    rest = data_parallel.main([*ARGS, "--epochs", "2", "--resume", str(path), "--save", str(path)])
    assert "resumed: " in capsys.readouterr().out
    assert len(first) == 3 and len(rest) == 3  # the second run starts at epoch 1
    assert first + rest == two_epochs.losses
    assert path.read_bytes() == two_epochs.checkpoint.read_bytes()


def test_a_progress_bar_shows_trees_per_second_and_plot_draws_the_curves(
    ray_session: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("tqdm")
    pytest.importorskip("matplotlib")
    from examples import data_parallel

    monkeypatch.setattr(cli, "on_terminal", lambda: True)
    plot = tmp_path / "curves.png"
    on_terminal = [arg for arg in ARGS if arg != "--no-progress"]
    assert len(data_parallel.main([*on_terminal, "--epochs", "1", "--plot", str(plot)])) == 3
    captured = capsys.readouterr()
    assert "epoch 0" in captured.err and "trees/s" in captured.err  # (too fast a run to draw its loss)
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f"plot: {plot}" in captured.out


def test_resuming_with_another_batch_size_is_an_error_before_ray_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from examples import data_parallel

    path = tmp_path / "model.safetensors"
    _, model = reference(1)
    ml.save(path, model, metadata={"trees": TREES, "batch_size": BATCH, "seed": 0, "step": 1})
    with pytest.raises(SystemExit) as stopped:
        data_parallel.main([*ARGS, "--batch-size", "3", "--resume", str(path)])
    assert stopped.value.code == 2
    assert "is not a checkpoint of this example with these trees, --batch-size" in capsys.readouterr().err


def test_more_workers_than_the_clusters_cpus_is_an_error_not_a_wait(
    ray_session: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    from examples import data_parallel

    cpus = int(ray_session.cluster_resources()["CPU"])
    with pytest.raises(SystemExit) as stopped:
        data_parallel.main([*ARGS, "--workers", str(cpus + 1)])
    assert stopped.value.code == 2
    assert f"the Ray cluster has {cpus} CPUs, and each worker takes one" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------- Ctrl-C


class Lines:
    """A process's output, line by line, read by a thread: waiting for a line has a deadline."""

    def __init__(self, stream: IO[str]) -> None:
        self.seen: list[str] = []
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, args=(stream,), daemon=True).start()

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            self._lines.put(line)
        self._lines.put(None)

    def wait_for(self, prefix: str, deadline: float) -> str:
        """The first line from here on that starts with ``prefix``."""
        while True:
            try:
                line = self._lines.get(timeout=max(deadline - time.monotonic(), 0.0))
            except queue.Empty:
                raise AssertionError(f"no line {prefix!r} in time; output:\n{''.join(self.seen)}") from None
            if line is None:
                raise AssertionError(f"the output ended before {prefix!r}:\n{''.join(self.seen)}")
            self.seen.append(line)
            if line.startswith(prefix):
                return line


def running(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie (one that has exited, not yet reaped)."""
    stat = Path(f"/proc/{pid}/stat")
    if Path("/proc/self/stat").exists():
        try:
            return stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except OSError:
            return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def workers_of(line: str) -> list[int]:
    """The process ids in ``workers: 2 Ray actors, processes 123 456; ...``."""
    return [int(pid) for pid in line.split("processes ", 1)[1].split(";", 1)[0].split()]


def test_ctrl_c_saves_the_committed_steps_exits_130_and_stops_the_workers(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    path = tmp_path / "model.safetensors"
    # 16 trees, 4 per step: 4 steps an epoch; epochs enough that it is interrupted in one.
    command: Sequence[str] = [
        sys.executable,
        str(ROOT / "examples" / "data_parallel.py"),
        *ARGS,
        *("--trees", "16", "--epochs", "1000", "--save", str(path)),
    ]
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # a group of its own, as a terminal's foreground job
        cwd=tmp_path,
    )
    try:
        assert process.stdout is not None
        lines = Lines(process.stdout)
        deadline = time.monotonic() + 120  # Ray's start, and the workers'
        workers = workers_of(lines.wait_for("workers: ", deadline))
        assert len(workers) == 2
        lines.wait_for("epoch 0: ", deadline)  # 4 steps committed, the fifth or a checkpoint in flight
        os.killpg(process.pid, signal.SIGINT)  # Ctrl-C on a terminal: its whole foreground group
        committed = int(lines.wait_for("interrupted: ", time.monotonic() + 60).split()[1])
        assert process.wait(timeout=60) == 130
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)
    assert committed >= 4
    assert f"{committed} steps committed; checkpoint: {path}" in lines.seen[-1]
    _, model = reference(committed, trees=16)
    assert_checkpoint_is(path, model, committed, tmp_path)
    deadline = time.monotonic() + 30
    while any(running(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in workers if running(pid)], "the workers outlived the example"
