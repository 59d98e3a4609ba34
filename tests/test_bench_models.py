"""``python -m monadl.bench models --smoke``: it runs every workload, reports positive rates, and its
PyTorch peers start from monadl's weights (their first losses agree). Nothing about speed is
asserted: that is for the benchmark's runs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from monadl.bench.__main__ import main
from monadl.bench.common import torch_available


def test_models_smoke_prints_the_table_and_writes_json(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "models.json"
    assert main(["models", "--smoke", "--repeats", "2", "--json", str(path)]) == 0
    out = capsys.readouterr().out
    assert "warning" not in out
    data = json.loads(path.read_text())
    results = {r["name"]: r for r in data["results"]}
    assert {"conv1", "conv2", "cnn", "bilstm"} <= set(results)
    assert ("transformer" in results) != ("transformer  skipped" in out)
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
