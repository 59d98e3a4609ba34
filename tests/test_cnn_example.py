"""examples/cnn.py: it trains on the synthetic set, prints a held-out accuracy every epoch, and the
loss falls (small sizes: seconds)."""

from __future__ import annotations

from pathlib import Path

import pytest

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


def test_the_benchmark_measures_the_examples_model() -> None:
    from monadl.bench import models
    from monadl.bench.cnn_model import CNN as measured

    assert measured is cnn.CNN
    assert vars(models)["CNN"] is measured  # the models benchmark's, not a copy
