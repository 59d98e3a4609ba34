"""examples/cnn.py: it trains on the synthetic set, prints a held-out accuracy every epoch, and the
loss falls (small sizes: seconds)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import monadl as ml
from examples import cnn


def test_cnn_learns_and_reports_held_out_accuracy(capsys: pytest.CaptureFixture[str]) -> None:
    history = cnn.main(
        [
            "--epochs",
            "2",
            "--batch",
            "16",
            "--channels",
            "4",
            "--train-size",
            "320",
            "--test-size",
            "100",
            "--no-progress",
        ]
    )
    out = capsys.readouterr().out
    assert "held-out accuracy before training" in out
    assert out.count("held-out accuracy ") == 3  # before, and after each epoch
    assert len(history) == 2
    assert history[1][0] < history[0][0]  # the loss falls
    assert all(0.0 <= accuracy <= 1.0 for _, accuracy in history)


def test_cnn_plot_needs_an_existing_folder(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cnn.main(["--plot", str(tmp_path / "missing" / "curves.png"), "--epochs", "1"])
    assert exit_info.value.code == 2


def test_the_example_holds_its_model() -> None:
    """A reader of examples/cnn.py sees the model: it is defined there, not imported."""
    assert cnn.CNN.__module__ == cnn.__name__
    source = Path(cnn.__file__).read_text(encoding="utf-8")
    assert "class CNN(ml.Module):" in source and "monadl.bench" not in source.split('"""', 2)[2]


@pytest.mark.parametrize(("channels", "seed"), [(4, 0), (3, 7)])
def test_the_benchmark_measures_the_examples_model(channels: int, seed: int) -> None:
    """``python -m monadl.bench models`` measures the package's copy of the model: the same weights
    from a seed, the same logits, the same step."""
    from monadl.bench import models
    from monadl.bench.cnn_model import CLASSES, CNN

    assert vars(models)["CNN"] is CNN and CLASSES == cnn.CLASSES
    mine, measured = cnn.CNN.new(channels, seed=seed), CNN.new(channels, seed=seed)
    ours, theirs = mine.weights(), measured.weights()
    assert list(ours) == list(theirs)
    for name, weight in ours.items():
        other = theirs[name]
        assert np.asarray(weight.data).dtype == np.asarray(other.data).dtype == np.float32, name
        np.testing.assert_array_equal(weight.data, other.data, err_msg=name)
    rng = np.random.default_rng(seed)
    images = rng.random((5, 3, 32, 32), dtype=np.float32)
    labels = rng.integers(0, CLASSES, size=5)
    np.testing.assert_array_equal(
        ml.predict_blocking(mine(images)).unwrap(), ml.predict_blocking(measured(images)).unwrap()
    )
    for model in (mine, measured):
        ml.cross_entropy(model(images), labels).train_blocking(ml.Adam(1e-2)).unwrap()
    for name, weight in ours.items():
        np.testing.assert_array_equal(weight.data, theirs[name].data, err_msg=name)
