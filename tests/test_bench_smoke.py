"""Smoke tests of ``python -m monadl.bench overhead``: it runs, and reports what it should.

These run the benchmark in a seconds-long form (tiny chains, two repeats, no minimum sample time) and
check the table's and the JSON's shape and that every figure is a positive number. They assert
nothing about speed: speed is for the benchmark's own runs, not for tests.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from monadl import Executor
from monadl.bench import columns, common, overhead
from monadl.bench.__main__ import main

CASES = [
    "elementwise-1x1",
    "elementwise-16x64",
    "matmul-16x64",
    "float",
    "const-1x1",
    "const-16x64",
    "const-matmul-16x64",
]
TITLES = ["elementwise 1x1", "elementwise 16x64", "matmul 16x64 @ 64x64", "float (Python floats)"]
MODES = ["build", "forward", "fwd+bwd", "train"]
HAS_TORCH = importlib.util.find_spec("torch") is not None


def _positive(stats: dict[str, Any]) -> None:
    assert stats["median"] > 0 and stats["min"] > 0
    assert stats["min"] <= stats["median"]
    assert len(stats["samples"]) == 2 and all(s > 0 for s in stats["samples"])
    assert stats["number"] >= 1


def test_overhead_cli_prints_the_table_and_writes_json(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "overhead.json"
    argv = ["overhead", "--chain", "4", "--repeats", "2", "--min-time", "0", "--json", str(path)]
    assert main(argv) == 0
    out = capsys.readouterr().out

    for word in ["monadl", "numpy", "overhead", "ratio", "target:", *TITLES, *MODES]:
        assert word in out
    assert ("torch-numpy" in out) == HAS_TORCH
    if not HAS_TORCH:
        assert "PyTorch: skipped" in out

    data = json.loads(path.read_text())
    assert data["benchmark"] == "overhead" and data["unit"] == "us/op"
    assert data["chain"] == 4 and data["repeats"] == 2
    rows = data["rows"]
    assert [(r["case"], r["mode"]) for r in rows] == [(c, m) for c in CASES for m in MODES]
    for r in rows:
        _positive(r["monadl"])
        if r["mode"] == "build":
            assert r["numpy"] is None and r["overhead_us"] is None and r["ratio"] is None
            continue
        _positive(r["numpy"])
        assert r["overhead_us"] == pytest.approx(r["monadl"]["median"] - r["numpy"]["median"])
        assert r["ratio"] == pytest.approx(r["monadl"]["median"] / r["numpy"]["median"])
        assert r["ratio"] > 0
        if HAS_TORCH:
            _positive(r["torch"])
        else:
            assert r["torch"] is None
    assert [t["case"] for t in data["target"]["results"]] == CASES


def test_overhead_selected_case_without_torch() -> None:
    report = overhead.run_overhead(chain=3, repeats=2, min_time=0.0, cases=["float"], use_torch=False)
    assert [(r.case, r.mode) for r in report.rows] == [("float", m) for m in MODES]
    assert report.torch_note is not None and "--no-torch" in report.torch_note
    table = overhead.format_table(report)
    assert "float (Python floats)" in table and "torch-numpy" not in table


def test_the_check_catches_a_wrong_baseline() -> None:
    case = overhead.make_case("elementwise-16x64", 4)
    weight = case.weights[0]
    assert isinstance(weight.data, np.ndarray)
    weight.data = weight.data * 2.0  # monadl now computes other math than the NumPy baseline
    with Executor(workers=1) as executor, pytest.raises(AssertionError, match="differs from NumPy"):
        overhead.check_case(case, executor)


def test_overhead_profile_prints_the_top_functions(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["overhead", "--profile", "elementwise-16x64", "--chain", "4", "--profile-calls", "2"]
    assert main([*argv, "--profile-top", "5"]) == 0
    out = capsys.readouterr().out
    assert "cProfile: monadl fwd+bwd of elementwise-16x64" in out
    assert "tottime" in out


def test_distributed_quick_run_reports_every_figure(
    ray_session: Any, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path, png = tmp_path / "distributed.json", tmp_path / "distributed.png"
    argv = ["distributed", "--quick", "--no-progress", "--json", str(path), "--plot", str(png)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    for words in ["plain process", "ray, 1 worker", "ray, 2 workers", "speedup", "overhead", "driver bytes"]:
        assert words in out
    assert png.stat().st_size > 0

    data = json.loads(path.read_text())
    assert data["benchmark"] == "distributed"
    assert data["run"]["plain_step_ms"] > 0 and data["run"]["batch_size"] == 8
    rows = data["throughput"]["rows"]
    assert [r["workers"] for r in rows] == [0, 1, 2]
    for r in rows:
        for key in ["steps_per_s", "low", "high", "samples_per_s", "step_ms", "speedup", "efficiency"]:
            assert r[key] > 0
        assert r["samples_per_s"] == pytest.approx(r["steps_per_s"] * 8)
        assert len(r["samples"]) == 2 and all(s > 0 for s in r["samples"])
        if r["workers"]:
            assert r["compute_ms"] > 0 and r["apply_ms"] > 0 and r["overhead_ms"] > 0
            assert r["efficiency"] == pytest.approx(r["speedup"] / r["workers"])
    assert data["overhead"]["gradient_bytes"] == 2**20 and data["overhead"]["target_ms"] == 5.0
    overhead = data["overhead"]["rows"]
    assert [(o["workers"], o["reduction"]) for o in overhead] == [
        (w, r) for w in (1, 2) for r in ("tree", "driver")
    ]
    for o in overhead:
        assert o["overhead_ms"] > 0 and o["step_ms"] > 0 and o["steps"] == 6
    sent = data["driver_bytes"]["rows"]
    assert [(b["workers"], b["reduction"]) for b in sent] == [
        (w, r) for w in (2, 4) for r in ("tree", "driver")
    ]
    assert all(b["driver_bytes"] > 0 for b in sent)


def test_without_tqdm_the_benchmarks_show_no_bar_and_raise_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    # tqdm comes with the bench extra, not with `pip install monadl`: a bar is then left out.
    monkeypatch.setitem(sys.modules, "tqdm", None)
    progress = common.Progress(3, True, "a benchmark")
    assert progress.bar is None
    progress.start("a configuration")
    progress.advance()
    progress.close()
    assert list(columns._progress([(1, "skip"), (2, "noskip")], True)) == [(1, "skip"), (2, "noskip")]


def test_columns_takes_a_batch_larger_than_the_default_synthetic_classes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The synthetic set has 250 samples per coarse class by default; a batch of 256 (all of one
    class) makes it larger rather than stopping."""
    monkeypatch.setenv("MONADL_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "columns.json"
    argv = ["columns", "--batch", "256", "--columns", "1", "--pools", "1", "--variants", "skip"]
    argv += ["--hidden", "8", "--steps", "1", "--repeats", "1", "--warmup", "0", "--no-torch"]
    assert main([*argv, "--no-progress", "--json", str(out)]) == 0
    run = json.loads(out.read_text())["run"]
    assert run["batch"] == 256 and "synthetic" in run["data"]
    data = columns.open_data(argparse.Namespace(data=None, seed=0, batch=256))
    assert data.class_counts().min() >= 256 and data.num_batches(256) >= 20
    small = columns.open_data(argparse.Namespace(data=None, seed=0, batch=16))
    assert small.class_counts().max() == 250  # the default set, where it suffices
    capsys.readouterr()


def test_columns_refuses_a_batch_the_given_data_cannot_supply_naming_the_largest(tmp_path: Path) -> None:
    from monadl.data import cifar100

    cifar100.write_synthetic_cifar100(tmp_path / "small", per_fine_class=3, seed=1)  # 15 per class
    with pytest.raises(SystemExit, match=r"--batch 16 is more than the data supplies.*--batch 15 or less"):
        columns.open_data(argparse.Namespace(data=str(tmp_path / "small"), seed=0, batch=16))
    assert columns.open_data(argparse.Namespace(data=str(tmp_path / "small"), seed=0, batch=15))
