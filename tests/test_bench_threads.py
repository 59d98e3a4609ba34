"""``python -m monadl.bench threads``: it runs, reports positive figures, and its two-thread step
does the one-thread step's work. Nothing about speed is asserted: that is for the benchmark's runs."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

from monadl.bench.__main__ import main
from monadl.bench.threads import Columns, Worker, step_one_thread, step_two_threads, steps_two_threads_apart


def test_threads_cli_prints_the_ceiling_and_writes_json(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "threads.json"
    argv = [
        "threads",
        "--columns",
        "3",
        "--hidden",
        "8",
        "--steps",
        "2",
        "--repeats",
        "3",
        "--json",
        str(path),
    ]
    assert main(argv) == 0
    out = capsys.readouterr().out
    for words in [
        "round trip to a worker thread and back",
        "3 columns' heavy kernels",
        "two threads / one",
        "apart",
    ]:
        assert words in out
    data = json.loads(path.read_text())
    assert (data["columns"], data["batch"], data["hidden"]) == (3, 16, 8)
    assert len(data["speedups"]) == 3 and all(r > 0 for r in data["speedups"])
    assert data["speedup"] == statistics.median(data["speedups"])
    for key in ["round_trip_us", "one_thread_us", "two_threads_us", "apart_us", "apart_speedup"]:
        assert data[key] > 0
    assert data["cpus"] >= 1


@pytest.mark.parametrize("columns", [1, 2, 5])
def test_two_threads_do_the_work_of_one(columns: int) -> None:
    one, two, apart = Columns(columns, 4, 8), Columns(columns, 4, 8), Columns(columns, 4, 8)
    before = [w.copy() for w in one.weights]
    worker = Worker()
    try:
        with threadpool_limits(limits=1, user_api="blas"):  # one BLAS thread: the same sums
            for _ in range(3):
                step_one_thread(one)
                step_two_threads(two, worker)
            steps_two_threads_apart(apart, worker, 3)
    finally:
        worker.close()
    for k, w0 in enumerate(before):
        assert not np.array_equal(one.weights[k], w0)  # every column was updated
        for other in (two, apart):
            np.testing.assert_array_equal(other.weights[k], one.weights[k])
            np.testing.assert_array_equal(other.outputs[k], one.outputs[k])


@pytest.mark.parametrize("option", ["columns", "batch", "hidden", "steps", "repeats"])
def test_threads_cli_rejects_nonpositive_sizes(option: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["threads", f"--{option}", "0"])
    assert exited.value.code == 2  # argparse's usage error, naming the option
    assert f"argument --{option}: expected a positive integer, got 0" in capsys.readouterr().err


def test_a_failed_job_is_raised_and_the_worker_goes_on() -> None:
    worker = Worker()
    ran: list[str] = []

    def fail() -> None:
        raise ValueError("job failed")

    try:
        with pytest.raises(ValueError, match="job failed"):
            worker.call(fail, lambda: ran.append("meanwhile"))

        def fail_here() -> None:
            raise KeyError("meanwhile failed")

        with pytest.raises(KeyError, match="meanwhile failed"):
            worker.call(lambda: ran.append("job"), fail_here)
        worker.call(lambda: ran.append("again"), lambda: None)  # in step: no result left over
    finally:
        worker.close()
    assert ran == ["meanwhile", "job", "again"]
