"""``python -m monadl.bench models --smoke``: it runs every workload, reports positive rates, and its
PyTorch peers start from monadl's weights (their first losses agree; the Transformer's agree after a
few steps too). Nothing about speed is asserted: that is for the benchmark's runs."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest

import monadl as ml
from monadl.bench.__main__ import main
from monadl.bench.common import torch_available
from monadl.bench.models import SMOKE_SIZES, Sizes, encoder_workload, mlp_workload, transformer_workload


def test_models_smoke_prints_the_table_and_writes_json(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "models.json"
    assert main(["models", "--smoke", "--repeats", "2", "--json", str(path)]) == 0
    out = capsys.readouterr().out
    assert "warning" not in out
    data = json.loads(path.read_text())
    results = {r["name"]: r for r in data["results"]}
    assert set(results) == {"conv1", "conv2", "cnn", "transformer", "bilstm"}
    for r in results.values():
        assert r["monadl_rate"] > 0 and r["steps"] >= 1
        if torch_available():
            assert len(r["ratios"]) == 2 and all(x > 0 for x in r["ratios"])
            first, peer = r["first_losses"]
            assert math.isclose(first, peer, rel_tol=1e-3)


def test_models_only_and_no_torch(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["models", "--smoke", "--no-torch", "--only", "conv2"]) == 0
    out = capsys.readouterr().out
    assert "conv2" in out and "cnn" not in out.split("steps/s")[1]


def test_the_transformer_peers_train_alike() -> None:
    """At the example's sizes both sides' losses agree, the first (same weights, same windows) and
    those after a few steps (same gradients, clipping and Adam)."""
    torch = pytest.importorskip("torch")
    torch.set_num_threads(1)
    with ml.Executor() as executor:
        workload = transformer_workload(Sizes(), executor, seed=1, torch=True)
        assert workload.torch is not None
        ours = [workload.monadl() for _ in range(3)]
        theirs = [workload.torch() for _ in range(3)]
    assert ours[-1] < ours[0]
    assert ours == pytest.approx(theirs, rel=1e-3)


def test_the_dense_models_run_on_the_cpu_when_named(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "models.json"
    assert main(["models", "--smoke", "--repeats", "1", "--only", "mlp", "encoder", "--json", str(path)]) == 0
    assert "warning" not in capsys.readouterr().out
    data = json.loads(path.read_text())
    assert data["device"] == "cpu" and [r["name"] for r in data["results"]] == ["mlp", "encoder"]
    for r in data["results"]:
        assert (r["must"], r["goal"]) == (0.8, 1.0)


@pytest.mark.parametrize("build", [mlp_workload, encoder_workload])
def test_the_dense_peers_train_alike(build: object) -> None:
    """Both sides' losses agree, the first (same weights, same data) and after a few steps (same
    gradients and Adam), at sizes larger than the smoke's."""
    torch = pytest.importorskip("torch")
    torch.set_num_threads(1)
    sizes = dataclasses.replace(SMOKE_SIZES, dense=(16, 32, 32, 10), dense_batch=8, encoder_width=16)
    with ml.Executor() as executor:
        workload = build(sizes, executor, 2, True)  # type: ignore[operator]
        assert workload.torch is not None
        ours = [workload.monadl() for _ in range(4)]
        theirs = [workload.torch() for _ in range(4)]
    assert ours[-1] < ours[0]
    assert ours == pytest.approx(theirs, rel=1e-3)


def test_no_fused_is_recorded_and_undone(tmp_path: Path) -> None:
    from monadl.dsl import fused

    path = tmp_path / "models.json"
    assert (
        main(["models", "--smoke", "--repeats", "1", "--only", "mlp", "--no-fused", "--json", str(path)]) == 0
    )
    assert json.loads(path.read_text())["fused"] is False and fused.ENABLED
