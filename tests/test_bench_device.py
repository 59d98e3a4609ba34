"""The benchmarks' ``--device`` plumbing, on array-api-strict (a CPU namespace standing in for a
device) and, where CuPy finds a GPU, on CUDA: the models' arrays live where the option says, the
hand-written NumPy baseline stays out, and every benchmark runs there end to end (tiny sizes; no
figure is judged: speed is for the benchmarks' own runs). And ``scripts/device-check.sh`` where
there is no GPU: it skips the GPU steps saying why, and keeps to its time budget."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import array_api_strict as xps
import numpy as np
import pytest

import monadl as ml
from monadl.bench import models, overhead
from monadl.bench.__main__ import main
from monadl.bench.common import DEVICES, Device


def _cuda() -> bool:
    if importlib.util.find_spec("cupy") is None:
        return False
    import cupy

    try:
        return int(cupy.cuda.runtime.getDeviceCount()) > 0
    except Exception:  # noqa: BLE001 - CUDARuntimeError: no driver
        return False


DEVICE_NAMES = ["array-api-strict"] + (["cuda"] if _cuda() else [])
HAS_TORCH = importlib.util.find_spec("torch") is not None
STRICT_ARRAY = type(xps.asarray(0.0))


def test_an_unknown_device_is_refused_naming_the_choices() -> None:
    with pytest.raises(ValueError, match="device must be one of"):
        Device("tpu")
    assert DEVICES == ("cpu", "cuda", "array-api-strict")


@pytest.mark.skipif(_cuda(), reason="CuPy finds a GPU here")
def test_cuda_without_a_gpu_says_why() -> None:
    with pytest.raises(RuntimeError, match="--device cuda"):
        Device("cuda")


@pytest.mark.parametrize("name", DEVICE_NAMES)
def test_put_get_round_trip_and_weights_move(name: str) -> None:
    device = Device(name)
    host = np.arange(6.0).reshape(2, 3)
    on_device = device.put(host)
    assert not isinstance(on_device, np.ndarray)
    np.testing.assert_array_equal(device.get(on_device), host)
    w = ml.ArrayWeight(host)
    device.move_weights([w])
    assert type(w.data) is type(on_device)
    loss, grads = ml.compute_gradients(ml.sum(w * w))
    assert loss == pytest.approx(float((host * host).sum()))
    np.testing.assert_array_equal(device.get(grads[w]), 2 * host)


def test_a_weight_with_optimizer_state_refuses_to_move() -> None:
    w = ml.ArrayWeight(np.ones(3))
    ml.train_blocking(ml.sum(w * w), ml.Adam(0.1))
    moved: Any = xps.asarray(np.ones(3))
    with pytest.raises(ValueError, match="optimizer state"):
        w.data = moved
    assert isinstance(w.data, np.ndarray)


def test_a_moved_weight_keeps_its_dtype_check() -> None:
    w = ml.ArrayWeight(np.ones(3))
    narrower: Any = xps.asarray(np.ones(3, dtype=np.float32))
    with pytest.raises(ml.ShapeError, match="float32"):
        w.data = narrower


@pytest.mark.parametrize("name", DEVICE_NAMES)
def test_overhead_cases_run_on_the_device(name: str) -> None:
    device = Device(name)
    case = overhead.make_case("matmul-16x64", 3, device=device)
    assert all(not isinstance(w.data, np.ndarray) for w in case.weights)
    with ml.Executor(1) as executor:
        overhead.check_case(case, executor)  # monadl's values and gradients equal the baseline's


@pytest.mark.parametrize("name", DEVICE_NAMES)
def test_overhead_runs_on_the_device(name: str, tmp_path: Path) -> None:
    out = tmp_path / "overhead.json"
    argv = ["overhead", "--device", name, "--chain", "3", "--repeats", "1", "--min-time", "0"]
    assert main([*argv, "--case", "const-1x1", "--case", "float", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["environment"]["device"].startswith(name)
    assert {row["case"] for row in report["rows"]} == {"const-1x1"}  # no arrays, no device: float left out


@pytest.mark.parametrize("name", DEVICE_NAMES)
def test_columns_runs_on_the_device_without_the_numpy_baseline(name: str, tmp_path: Path) -> None:
    out = tmp_path / "columns.json"
    argv = ["columns", "--device", name, "--columns", "1", "--pools", "1", "2", "--steps", "2"]
    argv += ["--repeats", "2", "--warmup", "1", "--no-progress", "--json", str(out)]
    assert main(argv) == 0
    run = json.loads(out.read_text())
    implementations = {r["implementation"] for r in run["results"]}
    assert "numpy" not in implementations and "monadl" in implementations
    assert ("torch" in implementations) == HAS_TORCH
    assert {r["pool"] for r in run["results"] if r["implementation"] == "monadl"} == {1, 2}


@pytest.mark.parametrize("name", DEVICE_NAMES)
def test_treelstm_runs_on_the_device_with_workers(name: str, tmp_path: Path, capsys: Any) -> None:
    out = tmp_path / "treelstm.json"
    argv = ["treelstm", "--device", name, "--batches", "2", "--workers", "1", "2", "--trees", "2"]
    argv += ["--repeats", "1", "--warmup", "2", "--pool", "8", "--embedding", "8", "--hidden", "8"]
    argv += ["--min-leaves", "2", "--max-leaves", "4", "--no-progress", "--json", str(out)]
    assert main(argv) == 0
    run = json.loads(out.read_text())
    implementations = {r["implementation"] for r in run["results"]}
    assert {"monadl", "monadl@2", "monadl-unbatched"} <= implementations
    assert not any(i.startswith("dynet") for i in implementations)
    assert "dynet: skipped on --device" in capsys.readouterr().out


@pytest.mark.parametrize("name", DEVICE_NAMES)
def test_suite_runs_on_the_device(name: str, tmp_path: Path) -> None:
    out = tmp_path / "suite.json"
    argv = [
        "suite",
        "--device",
        name,
        "--smoke",
        "--tasks",
        "rnnlm-batch",
        "--batches",
        "4",
        "--repeats",
        "1",
    ]
    assert main([*argv, "--no-progress", "--no-dynet", "--json", str(out)]) == 0
    run = json.loads(out.read_text())
    assert run["run"]["device"].startswith(name)
    monadl = [r for r in run["results"] if r["implementation"] == "monadl"]
    assert monadl and all(r["learned"] for r in monadl)


@pytest.mark.parametrize("name", DEVICE_NAMES)
def test_models_runs_every_workload_on_the_device(name: str, tmp_path: Path, capsys: Any) -> None:
    out = tmp_path / "models.json"
    assert main(["models", "--device", name, "--smoke", "--repeats", "1", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "warning" not in printed  # both sides' first losses agree
    report = json.loads(out.read_text())
    assert report["device"].startswith(name)
    results = {r["name"]: r for r in report["results"]}
    assert set(results) == set(models.TARGETS)  # the dense models too, off the CPU
    for r in results.values():
        assert r["monadl_rate"] > 0
        assert (len(r["ratios"]) == 1) == HAS_TORCH
        if name == "cuda":
            assert (r["must"], r["goal"]) == models.CUDA_TARGETS


@pytest.mark.parametrize("name", DEVICE_NAMES)
@pytest.mark.parametrize("workload", sorted(models.TARGETS))
def test_a_models_workload_trains_there(name: str, workload: str) -> None:
    """The monadl side's weights and their updates stay on the device, step after step."""
    device = Device(name)
    sizes = models.SMOKE_SIZES
    with ml.Executor() as executor:
        options = (sizes, executor, 0, False)
        built: models.Workload
        if workload in ("conv1", "conv2"):
            built = models.conv_workload(int(workload[-1]), *options, device)
        elif workload == "bilstm":
            built = models.bilstm_workload(*options, True, device)
        else:
            built = getattr(models, f"{workload}_workload")(*options, device)
        losses = [built.monadl() for _ in range(2)]
    assert all(np.isfinite(losses)) and built.weights
    for weight in built.weights:
        assert type(weight.data) is type(device.put(np.zeros(1))), weight


SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "device-check.sh"


def _device_check(out: Path, **env: str) -> tuple[int, str]:
    """``scripts/device-check.sh out`` with ``env`` (the engine as it is: no build), its exit status
    and its summary (also its stdout)."""
    environment = dict(os.environ, PYTHON=sys.executable, DEVICE_CHECK_BUILD="0") | env
    done = subprocess.run(
        ["bash", str(SCRIPT), str(out)], env=environment, capture_output=True, text=True, timeout=300
    )
    summary = (out / "summary.txt").read_text()
    assert done.stdout.strip() == summary.strip()
    assert (out / "logs.tar.gz").is_file() and not (out / "logs").exists()
    return done.returncode, summary


@pytest.mark.skipif(_cuda(), reason="a GPU is here: the GPU steps would run")
def test_the_device_check_skips_the_gpu_steps_saying_why_and_writes_one_summary(tmp_path: Path) -> None:
    only = "environment models-cuda treelstm-cuda columns-pool treelstm-pool"
    status, summary = _device_check(tmp_path, DEVICE_CHECK_SMOKE="1", DEVICE_CHECK_ONLY=only)
    assert status == 0, summary
    assert "GPU: none (no GPU here: CuPy " in summary and "build: skipped (DEVICE_CHECK_BUILD=0)" in summary
    assert f"engine: {'compiled' if ml.compiled() else 'pure Python'}" in summary
    for step in ("tests", "models-cuda", "treelstm-cuda", "treelstm-cuda-256"):
        assert f"\n{step}: skipped, no GPU here: CuPy " in summary, step
    for step in ("environment", "columns-pool", "treelstm-pool"):
        assert f"\n{step}: ok, " in summary, step
    assert "columns-pool-wide: skipped, not in DEVICE_CHECK_ONLY" in summary
    assert "CIFAR columns on the CPU, batch 16" in summary and "Tree-LSTM on the CPU" in summary
    assert "2 workers:" in summary  # the pool's ratios, from the JSON the steps wrote
    assert {p.name for p in tmp_path.glob("*.json")} == {"columns-pool.json", "treelstm-pool.json"}


@pytest.mark.skipif(_cuda(), reason="a GPU is here: the GPU steps would run")
def test_the_device_check_stops_a_step_at_the_budget_and_says_so(tmp_path: Path) -> None:
    # A step starts with 15 s left at least: the steps before it may take up to 9 s on a busy
    # machine. Its bench never ends (an interpreter that runs the rest as the real one does), so
    # the step outlasts the budget however fast the machine is.
    python = tmp_path / "bin" / "python"
    python.parent.mkdir()
    python.write_text(
        '#!/bin/sh\nif [ "$1" = -m ] && [ "$2" = monadl.bench ]; then exec sleep 600; fi\n'
        f'exec "{sys.executable}" "$@"\n'
    )
    python.chmod(0o755)
    budget = 24
    status, summary = _device_check(
        tmp_path / "out",
        PYTHON=str(python),
        DEVICE_CHECK_BUDGET=str(budget),
        DEVICE_CHECK_ONLY="columns-pool-wide",
    )
    assert status == 1, summary
    assert "columns-pool-wide: TIMED OUT after " in summary
    assert "treelstm-pool: skipped, " in summary  # not in DEVICE_CHECK_ONLY, or the budget spent
    total = int(summary.split("total: ")[1].split(" s")[0])
    assert total <= budget + 6  # the step's kill grace, and the summary's own work


def test_the_device_summary_reads_the_gpu_runs_and_flags_disagreeing_peers(tmp_path: Path) -> None:
    import importlib.util as util

    spec = util.spec_from_file_location("device_summary", SCRIPT.parent / "device_summary.py")
    assert spec is not None and spec.loader is not None
    summary: Any = util.module_from_spec(spec)
    spec.loader.exec_module(summary)
    model = {"name": "mlp", "what": "1024-4096-4096-1000, batch 512", "monadl_rate": 100.0}
    model |= {"torch_rate": 200.0, "ratio": 0.5, "ratios": [0.5, 0.4, 0.6], "must": 0.8}
    model |= {"first_losses": [6.9, 7.2]}
    (tmp_path / "models-cuda.json").write_text(
        json.dumps({"compiled": True, "device": "cuda: NVIDIA H200", "results": [model]})
    )

    def tree(impl: str, samples: list[float], agrees: bool | None) -> dict[str, Any]:
        found = {"implementation": impl, "phase": "train", "batch": 64, "median": samples[1]}
        return found | {"samples": samples, "agrees": agrees}

    run = {"device": "cuda: NVIDIA H200", "batches": [64], "compiled": True}
    results = [tree("monadl", [300.0, 360.0, 330.0], None), tree("torch", [20.0, 24.0, 22.0], True)]
    results.append(tree("torch-levels", [600.0, 600.0, 300.0], False))
    (tmp_path / "treelstm-cuda.json").write_text(json.dumps({"run": run, "results": results}))
    lines = summary.lines(tmp_path)
    assert lines[0] == "bench models on cuda: NVIDIA H200 (compiled engine), monadl / torch there:"
    assert "0.50x [0.40-0.60] (must 0.8x)" in lines[1] and "first losses differ" in lines[2]
    assert "Tree-LSTM on cuda: NVIDIA H200 (compiled engine)" in lines[3]
    # Paired by round: 300/20, 360/24, 330/22 -> 15x; 0.5, 0.6, 1.1 -> 0.6x.
    assert "torch eager 24.0: 15.00x; torch by level 600.0: 0.60x" in lines[4]
    assert "torch-levels at train batch 64 differs" in lines[5]


def test_the_device_summary_reads_the_cpu_suites_runs(tmp_path: Path) -> None:
    import importlib.util as util

    spec = util.spec_from_file_location("device_summary", SCRIPT.parent / "device_summary.py")
    assert spec is not None and spec.loader is not None
    summary: Any = util.module_from_spec(spec)
    spec.loader.exec_module(summary)
    folder = tmp_path / "logs" / "cpu"  # where device-check.sh has scripts/cpu-suite.sh write
    folder.mkdir(parents=True)

    def suite(task: str, batch: int, losses: dict[str, float], ratios: dict[str, float]) -> None:
        run = {"tasks": {task: "its data"}, "batches": [batch], "machine": "x86_64, 16 CPUs"}
        results = [
            {"task": task, "batch": batch, "implementation": k, "loss_after": v} for k, v in losses.items()
        ]
        found = [
            {"task": task, "batch": batch, "other": k, "median": v, "low": v - 0.1, "high": v + 0.1}
            for k, v in ratios.items()
        ]
        (folder / f"suite-{task}-{batch}.json").write_text(
            json.dumps({"run": run, "results": results, "ratios": found})
        )

    suite("treenn", 64, {"monadl": 1.5, "dynet-autobatch": 1.5001}, {"dynet-autobatch": 0.96, "dynet": 2.13})
    suite("bilstm-tagger", 16, {"monadl": 0.38, "dynet": 0.40}, {"torch": 0.79, "dynet-autobatch": 0.48})
    (folder / "suite-rnnlm-batch-1.log").write_text("")  # ran out of time: a log, no JSON
    (folder / "suite-treenn-64.log").write_text("")

    def tree(impl: str, samples: list[float]) -> dict[str, Any]:
        return {
            "implementation": impl,
            "phase": "train",
            "batch": 64,
            "median": sorted(samples)[1],
            "samples": samples,
        }

    results = [tree("monadl", [600.0, 660.0, 500.0]), tree("torch-levels", [800.0, 600.0, 1000.0])]
    tree_run = {"run": {"batches": [64]}, "results": results}
    (folder / "treelstm-64.json").write_text(json.dumps(tree_run))
    lines = summary.lines(tmp_path)
    assert lines[0].startswith("DyNet's suite on the CPU") and "x86_64, 16 CPUs" in lines[0]
    # By task name, the peers in a fixed order whatever the file's; a loss that is not monadl's
    # (beyond 1e-3, relative) is named under its configuration.
    assert (
        lines[1]
        == "  bilstm-tagger at 16: DyNet with autobatching 0.48 [0.38-0.58]; PyTorch eager 0.79 [0.69-0.89]"
    )
    assert lines[2] == "    held-out loss after: monadl 0.3800, dynet 0.4000"
    assert lines[3] == "  treenn at 64: DyNet with autobatching 0.96 [0.86-1.06]; DyNet 2.13 [2.03-2.23]"
    assert lines[4] == "  rnnlm-batch-1: no result (out of time or failed: its log)"
    # Paired by round: 600/800, 660/600, 500/1000 -> 0.75, 1.10, 0.50.
    assert (
        lines[5]
        == "Tree-LSTM on the CPU, train batch 64: monadl 600 trees/s; torch by level 0.75 [0.50-1.10]"
    )
    assert len(lines) == 6
