"""The CIFAR-100 column model (examples/cifar_columns.py) and its benchmark (monadl.bench columns)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

import monadl as ml
from examples.cifar_columns import ColumnNetwork, Variant
from monadl.bench import columns as columns_bench
from monadl.bench.__main__ import main as bench_main
from monadl.bench.columns_numpy import NumpyColumns
from monadl.bench.columns_params import init_params, random_batch
from monadl.data import cifar100


@pytest.fixture(autouse=True)
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Synthetic data sets go to a temporary folder, never to the user's cache."""
    monkeypatch.setenv("MONADL_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.mark.parametrize("variant", ["skip", "noskip"])
@pytest.mark.parametrize("columns", [1, 2])
def test_gradients_equal_the_hand_written_numpy_gradients(variant: Variant, columns: int) -> None:
    params = init_params(columns, hidden=8, seed=3, dtype=np.float64)
    x, coarse, fine_local = random_batch(4, seed=5, dtype=np.float64)
    loss, gradients = ColumnNetwork(params, variant).gradients(x, coarse, fine_local)
    expected_loss, expected = NumpyColumns(params, variant).gradients(x, coarse, fine_local)
    assert loss == pytest.approx(expected_loss, rel=1e-12)
    expected = {name: g for name, g in expected.items() if variant == "noskip" or name in gradients}
    assert set(gradients) == set(expected)
    for name, g in expected.items():
        scale = max(float(np.max(np.abs(g))), 1e-300)
        assert float(np.max(np.abs(gradients[name] - g))) <= 1e-9 * scale, name


def test_skip_and_noskip_give_the_same_gradients_for_the_shared_weights() -> None:
    params = init_params(2, hidden=8, seed=1, dtype=np.float64)
    x, coarse, fine_local = random_batch(4, seed=2, dtype=np.float64)
    skip_loss, skip = ColumnNetwork(params, "skip").gradients(x, coarse, fine_local)
    noskip_loss, noskip = ColumnNetwork(params, "noskip").gradients(x, coarse, fine_local)
    assert skip_loss == noskip_loss
    assert set(skip) < set(noskip)  # skip: only the batch's fine classifier is in the graph
    assert all(name.startswith(("column", "coarse", f"fine{coarse}.")) for name in skip)
    for name, g in skip.items():
        np.testing.assert_array_equal(noskip[name], g, err_msg=name)
    for name in set(noskip) - set(skip):  # the other classifiers ran, and got exactly zero
        assert not np.any(noskip[name]), name


def test_300_steps_on_the_synthetic_data_learn_beyond_the_class_prior() -> None:
    train = cifar100.open_dataset(None, seed=0)
    test = cifar100.open_dataset(None, split="test", seed=0)
    evaluation = list(test.batches(16, seed=1, epochs=1))[:40]
    network = ColumnNetwork(init_params(1, seed=0), "skip", learning_rate=0.01, executor=ml.Executor(1))

    def evaluation_loss() -> float:
        return float(np.mean([network.loss(*b).predict_blocking().unwrap() for b in evaluation]))

    before = evaluation_loss()
    batches = train.batches(16, seed=0, epochs=None)
    for _ in range(300):
        network.step(*next(batches))
    after = evaluation_loss()
    # The loss of a model that knows only the class frequencies (uniform here): ln(20)/20 + ln(5)/5.
    prior_only = math.log(20) / 20 + math.log(5) / 5
    assert after < 0.9 * before
    assert after < prior_only  # it learned from the pixels, not only the class prior


def test_a_failed_step_changes_no_weight() -> None:
    network = ColumnNetwork(init_params(1, hidden=8, seed=0, dtype=np.float64), "skip")
    before = {name: w.data.copy() for name, w in network.weights.items()}
    x, coarse, fine_local = random_batch(4, seed=0, dtype=np.float64)
    with pytest.raises(Exception, match="cross_entropy: label 7 is out of range"):
        network.step(x, coarse, np.array([0, 1, 7, 2]))
    for name, w in network.weights.items():
        np.testing.assert_array_equal(w.data, before[name], err_msg=name)
    with pytest.raises(ValueError, match=r"coarse class must be in 0\.\.19"):
        network.loss(x, 20, fine_local)


def test_the_benchmark_runs_in_a_smoke_form(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out_json, out_png = tmp_path / "columns.json", tmp_path / "columns.png"
    status = bench_main(
        ["columns", "--smoke", "--no-progress", "--no-torch", "--json", str(out_json), "--plot", str(out_png)]
    )
    assert status == 0
    printed = capsys.readouterr().out
    assert "synthetic CIFAR-100" in printed  # every output says which data it used
    assert "x np" in printed  # the monadl / numpy ratios
    run = json.loads(out_json.read_text())
    assert "synthetic" in run["run"]["data"]
    configs = {(r["implementation"], r["columns"], r["pool"], r["variant"]) for r in run["results"]}
    for columns in (1, 2):
        for variant in ("skip", "noskip"):
            assert ("numpy", columns, None, variant) in configs
            assert {("monadl", columns, pool, variant) for pool in (1, 2)} <= configs
    assert all(r["median"] > 0 and r["low"] <= r["median"] <= r["high"] for r in run["results"])
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_benchmark_ratio_is_the_median_of_the_rounds_ratios() -> None:
    def measured(samples: list[float]) -> columns_bench.Measurement:
        ordered = sorted(samples)
        return columns_bench.Measurement(
            "x", 1, None, "skip", ordered[len(ordered) // 2], ordered[0], ordered[-1], 0.0, samples
        )

    # The machine slows down in round 2: both slow together, and their ratio holds.
    fast, slow = measured([100.0, 50.0, 100.0]), measured([50.0, 25.0, 50.0])
    assert columns_bench.ratio(fast, slow) == 2.0
    drifting = measured([100.0, 40.0, 90.0])
    assert columns_bench.ratio(drifting, slow) == pytest.approx(1.8)  # rounds: 2.0, 1.6, 1.8
    unpaired = measured([10.0])
    assert columns_bench.ratio(unpaired, slow) == pytest.approx(10.0 / 50.0)  # no pairs: the medians'


def test_the_benchmark_measures_the_examples_model() -> None:
    from monadl.bench.columns_model import ColumnNetwork as measured

    assert measured is ColumnNetwork


def test_stacked_and_one_by_one_noskip_agree() -> None:
    """noskip runs the 20 classifiers as one stack of batched matmuls; one by one is the same math."""
    params = init_params(1, hidden=8, seed=4, dtype=np.float64)
    x, coarse, fine_local = random_batch(4, seed=6, dtype=np.float64)
    stacked_loss, stacked = ColumnNetwork(params, "noskip").gradients(x, coarse, fine_local)
    loop_loss, loop = ColumnNetwork(params, "noskip", stacked=False).gradients(x, coarse, fine_local)
    assert stacked_loss == pytest.approx(loop_loss, rel=1e-14)
    assert set(stacked) == set(loop)
    for name, g in loop.items():
        np.testing.assert_allclose(stacked[name], g, rtol=1e-12, atol=1e-15, err_msg=name)


def test_the_example_runs_as_a_script(capsys: pytest.CaptureFixture[str]) -> None:
    from examples.cifar_columns import main

    losses = main(["--steps", "5", "--columns", "1", "--learning-rate", "0.01"])
    assert len(losses) == 5 and all(math.isfinite(v) for v in losses)
    assert "data: synthetic CIFAR-100" in capsys.readouterr().out


def test_the_example_plots_its_loss(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    from examples.cifar_columns import main

    path = tmp_path / "curves.png"
    main(["--steps", "60", "--columns", "1", "--batch", "4", "--plot", str(path), "--no-progress"])
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    out = capsys.readouterr().out
    assert "step   50: loss" in out and "step   59: loss" in out and f"plot: {path}" in out
