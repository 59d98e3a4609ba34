"""The examples run, print what they claim, and show what they teach.

* ``guess_next_number`` learns to answer 45 to 42, 43, 44.
* ``gated_network``: its four versions compute the same function and all learn; the dynamic ones
  evaluate each gate once per training step, the eager one more often; the applicative version's two
  gates run concurrently on a pool of two (they meet at a two-party barrier), the monadic one's do not.
* The long-running ones (``tree_lstm``, ``cifar_columns``, ``char_lstm``) show a progress bar on a
  terminal (not with ``--no-progress``, not without tqdm), and ``--plot`` without matplotlib is an
  argparse error (exit status 2) before anything runs.
"""

from __future__ import annotations

import importlib
import math
import re
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from returns.result import Failure, Result, Success

import monadl
from examples import gated_network as gn
from examples import guess_next_number
from examples.cifar_columns import ColumnNetwork, Variant
from monadl import ArrayWeight, FloatLayer, FloatWeight, cli
from monadl.bench.columns_params import init_params
from monadl.tape import Tape

DYNAMIC = ["monadic", "applicative", "direct"]  # the versions that choose inside the computation

# ------------------------------------------------------------------------------ guess_next_number


def test_guess_next_number_answers_45(capsys: pytest.CaptureFixture[str]) -> None:
    guess = guess_next_number.main(500)
    assert abs(guess - 45.0) < 0.5
    out = capsys.readouterr().out
    assert "iteration 499" in out
    assert "after training: 42, 43, 44 -> 45.0" in out
    before = float(out.split("before training: 42, 43, 44 -> ")[1].split()[0])
    assert abs(before - 45.0) > 10 * abs(guess - 45.0)  # the question it never trained on


def test_guess_next_number_short_run(capsys: pytest.CaptureFixture[str]) -> None:
    guess = guess_next_number.main(10)
    assert math.isfinite(guess)
    assert abs(guess - 45.0) > abs(guess_next_number.main(100) - 45.0)  # more training, better guess
    assert "42, 43, 44 ->" in capsys.readouterr().out


# ---------------------------------------------------------------------------------- gated_network


def reference(model: gn.Model, x: np.ndarray, target: np.ndarray) -> tuple[float, int]:
    """The gated network in plain NumPy: its loss, and which expert it chose."""
    scores = [1.0 / (1.0 + math.exp(-float(np.sum(x @ w.data)))) for w in model.gates]
    k = 0 if scores[0] > scores[1] else 1
    w, b = model.experts[k]
    output = np.tanh(x @ w.data + b.data) * scores[k]
    return float(np.mean((output - target) ** 2)), k


@pytest.mark.parametrize("seed", [0, 1], ids=["expert0-chosen", "expert1-chosen"])
def test_versions_compute_the_same_function(seed: int) -> None:
    model = gn.Model.new(seed=seed)
    x, target = gn.data()
    expected, chosen = reference(model, x, target)
    assert chosen == seed  # the two seeds cover both branches
    trained = {model.gates[chosen], *model.experts[chosen]}  # the other gate only steered the choice
    first: dict[FloatWeight | ArrayWeight, Any] = {}
    for name, network in gn.VERSIONS.items():
        loss = gn.build_loss(network, model, x, target)
        assert loss.predict_blocking().unwrap() == pytest.approx(expected, rel=1e-12), name
        value, grads = monadl.compute_gradients(gn.build_loss(network, model, x, target))
        assert value == pytest.approx(expected, rel=1e-12), name
        assert set(grads) == trained, name
        first = first or grads
        for weight, g in grads.items():
            np.testing.assert_allclose(g, first[weight], rtol=1e-12, err_msg=name)


class CountingGates:
    """Wraps each gate so that its forward evaluations are counted."""

    def __init__(self) -> None:
        self.counters = (gn.ForwardCounter(), gn.ForwardCounter())

    def __call__(self, i: int, gate: FloatLayer) -> FloatLayer:
        return self.counters[i].wrap(gate)

    @property
    def counts(self) -> tuple[int, int]:
        return self.counters[0].count, self.counters[1].count


@pytest.mark.parametrize("name", list(gn.VERSIONS))
def test_gate_evaluations_per_training_step(name: str) -> None:
    model = gn.Model.new()
    x, target = gn.data()
    gates = CountingGates()
    for _ in range(3):
        before = gates.counts
        gn.train_step(gn.VERSIONS[name], model, x, target, monadl.SGD(0.5), gates)
        per_step = (gates.counts[0] - before[0], gates.counts[1] - before[1])
        if name == "eager":
            assert sorted(per_step) == [1, 2]  # both predicted, then the chosen one again in training
        else:
            assert per_step == (1, 1)


def test_every_version_learns_the_same_way() -> None:
    trained = {name: gn.train_version(network, 60) for name, network in gn.VERSIONS.items()}
    eager = trained["eager"]
    for name, run in trained.items():
        before, after = run.held_out
        assert after < 0.2 * before, name
        np.testing.assert_allclose(run.losses, eager.losses, rtol=1e-9, err_msg=name)
        np.testing.assert_allclose(run.held_out, eager.held_out, rtol=1e-9, err_msg=name)


def test_the_held_out_batches_are_never_trained_on_and_of_the_same_function() -> None:
    training = [gn.data(draw=k) for k in range(100)]
    held_out = [gn.data(draw=k, held_out=True) for k in range(gn.HELD_OUT)]
    np.testing.assert_array_equal(training[0][0], gn.data()[0])  # the first batch is data()'s
    seen = {x.tobytes() for x, _ in training}
    assert not any(x.tobytes() in seen for x, _ in held_out)
    # One map m for all: target = 0.5 tanh(x @ m), so m solves arctanh(2 target) = x @ m.
    xs = np.concatenate([x for x, _ in training[:3] + held_out[:3]])
    targets = np.concatenate([t for _, t in training[:3] + held_out[:3]])
    m = np.linalg.lstsq(xs, np.arctanh(2 * targets), rcond=None)[0]
    np.testing.assert_allclose(xs @ m, np.arctanh(2 * targets), atol=1e-9)


def test_gated_network_main_prints_the_losses(capsys: pytest.CaptureFixture[str]) -> None:
    losses = gn.main(steps=40)
    assert set(losses) == set(gn.VERSIONS)
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].split() == list(gn.VERSIONS)
    before = [float(v) for v in lines[1].removeprefix("held-out, before").split()]
    after = next(line for line in lines if line.startswith("held-out, after"))
    assert all(a < b for a, b in zip(map(float, after.split()[2:]), before, strict=True))
    assert "training, step 39" in out
    assert "eager        3" in out and "direct       2  (gate0 1, gate1 1)" in out


# ---------------------------------------------------------------------------------- concurrency


def at_barrier(gate: FloatLayer, barrier: threading.Barrier) -> FloatLayer:
    """``gate``, but its forward ends with a kernel that waits at ``barrier`` (on a pool thread if
    the executor has one: the cost is far above any threshold)."""

    def meet(tape: Tape[float, float]) -> Tape[float, float]:
        barrier.wait()
        return tape

    return FloatLayer(gate.forward.map_kernel(meet, cost=1e9))


def train_with_barrier(
    name: str, workers: int, barrier: threading.Barrier
) -> tuple[gn.Model, Result[float, Exception]]:
    model = gn.Model.new()
    x, target = gn.data()
    loss = gn.build_loss(gn.VERSIONS[name], model, x, target, lambda i, gate: at_barrier(gate, barrier))
    with monadl.Executor(workers=workers, min_pool_cost=0) as executor:
        result = loss.train_blocking(monadl.SGD(0.5), executor=executor)
    return model, result


@pytest.mark.parametrize("name", ["applicative", "direct"])
def test_independent_gates_run_concurrently_on_a_pool_of_two(name: str) -> None:
    # Each gate's kernel waits for the other's at a two-party barrier: the step can only succeed if
    # both kernels are running at the same time.
    _, result = train_with_barrier(name, 2, threading.Barrier(2, timeout=5))
    assert isinstance(result, Success)
    expected = gn.build_loss(gn.VERSIONS[name], gn.Model.new(), *gn.data()).predict_blocking().unwrap()
    assert result.unwrap() == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("name", DYNAMIC)
def test_a_sequential_executor_runs_the_same_program(name: str) -> None:
    _, result = train_with_barrier(name, 1, threading.Barrier(1, timeout=5))
    assert isinstance(result, Success)


@pytest.mark.parametrize(
    ("name", "workers"),
    [("applicative", 1), ("direct", 1), ("monadic", 1), ("monadic", 2)],
    ids=["applicative-1-worker", "direct-1-worker", "monadic-1-worker", "monadic-2-workers"],
)
def test_gates_in_sequence_never_meet(name: str, workers: int) -> None:
    # With one worker everything runs inline, one kernel after the other; with flat_map, gate1 only
    # starts once gate0 is done. Either way the first gate waits alone and the barrier breaks, which
    # shows that the success above came from concurrency. The failed step changes no weight.
    model_before = gn.Model.new()
    model, result = train_with_barrier(name, workers, threading.Barrier(2, timeout=0.3))
    assert isinstance(result, Failure)
    assert isinstance(result.failure(), threading.BrokenBarrierError)
    for before, after in zip(
        [*model_before.gates, *(w for e in model_before.experts for w in e)],
        [*model.gates, *(w for e in model.experts for w in e)],
        strict=True,
    ):
        np.testing.assert_array_equal(after.data, before.data)


# ------------------------------------------------------- held-out metrics: cifar_columns, tree_lstm


def _relu(a: np.ndarray) -> np.ndarray:
    relu: np.ndarray = np.maximum(a, 0.0)
    return relu


@pytest.mark.parametrize("variant", ["skip", "noskip"])
def test_column_network_predicts_and_scores_as_numpy_does(variant: Variant) -> None:
    params = init_params(2, hidden=8, seed=3, dtype=np.float64)
    network = ColumnNetwork(params, variant)
    rng = np.random.default_rng(5)
    batches = [(rng.random((6, 3072)), coarse, rng.integers(0, 5, 6)) for coarse in (0, 7, 19)]
    right_coarse = right_fine = 0
    for x, coarse, fine_local in batches:
        p = params
        h = sum(
            _relu(
                _relu(x @ p[f"column{i}.w1"] + p[f"column{i}.b1"]) @ p[f"column{i}.w2"] + p[f"column{i}.b2"]
            )
            for i in range(2)
        )
        coarse_scores = h @ p["coarse.w"] + p["coarse.b"]
        f = _relu(
            _relu(h @ p[f"fine{coarse}.w1"] + p[f"fine{coarse}.b1"]) @ p[f"fine{coarse}.w2"]
            + p[f"fine{coarse}.b2"]
        )
        fine_scores = f @ p[f"fine{coarse}.w3"] + p[f"fine{coarse}.b3"]
        got = network.predict(x, coarse)
        np.testing.assert_allclose(got[0], coarse_scores, rtol=1e-12)
        np.testing.assert_allclose(got[1], fine_scores, rtol=1e-12)
        coarse_right = coarse_scores.argmax(axis=1) == coarse
        right_coarse += int(coarse_right.sum())
        right_fine += int((coarse_right & (fine_scores.argmax(axis=1) == fine_local)).sum())
    assert network.accuracy(batches) == (right_coarse / 18, right_fine / 18)
    with pytest.raises(ValueError, match="accuracy: needs at least one image"):
        network.accuracy([])


def _floats_after(out: str, prefix: str) -> list[float]:
    """The decimal numbers (not the counts) on the line of ``out`` that starts with ``prefix``."""
    line = next(line for line in out.splitlines() if line.startswith(prefix))
    return [float(number) for number in re.findall(r"\d+\.\d+", line.removeprefix(prefix))]


@pytest.mark.usefixtures("cache_dir")
def test_cifar_columns_learns_what_it_measures_on_held_out_images(capsys: pytest.CaptureFixture[str]) -> None:
    from examples.cifar_columns import main

    main(["--steps", "300", "--columns", "1", "--no-progress"])  # the default learning rate
    out = capsys.readouterr().out
    assert "held out: synthetic CIFAR-100 test.bin (1,000 records" in out
    before = _floats_after(out, "held-out accuracy before training:")
    after = _floats_after(out, "held-out accuracy after 300 steps:")
    assert before[0] < 0.1 and before[1] < 0.03  # coarse of 20, fine of 100: chance
    assert after[0] > 2 * before[0] and after[1] > 2 * before[1]


@pytest.mark.usefixtures("cache_dir")
def test_tree_lstm_prints_the_dev_accuracy_before_training_and_learns(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from examples.tree_lstm import main

    main(["--trees", "100", "--epochs", "2", "--hidden", "32", "--embedding", "32", "--no-progress"])
    out = capsys.readouterr().out
    before = _floats_after(out, "before training: dev root accuracy")
    after = _floats_after(out, "epoch 1: loss")[-2:]
    assert after[0] > before[0] and after[1] > before[1]  # fine-grained, binary


# ------------------------------------------------------------ progress bars and plots (monadl.cli)

LONG_EXAMPLES = {
    "tree_lstm": ["--trees", "4", "--epochs", "1", "--batch", "2", "--hidden", "4", "--embedding", "4"],
    "cifar_columns": ["--steps", "2", "--columns", "1", "--batch", "4"],
    "char_lstm": ["--epochs", "1", "--hidden", "8", "--embedding", "4", "--sample", "0"],
}


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Synthetic data sets go to a temporary folder, never to the user's cache."""
    monkeypatch.setenv("MONADL_CACHE_DIR", str(tmp_path / "cache"))


def example_main(name: str) -> Callable[[list[str]], list[float]]:
    main: Callable[[list[str]], list[float]] = importlib.import_module(f"examples.{name}").main
    return main


def test_no_progress_bar_off_a_terminal() -> None:
    assert not cli.on_terminal()  # pytest captures stdout and stderr
    assert cli.Progress(10, desc="training", unit="trees").bar is None


def test_a_progress_bar_shows_the_rate_and_the_loss(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("tqdm")
    monkeypatch.setattr(cli, "on_terminal", lambda: True)
    assert cli.Progress(10, desc="training", unit="trees", enabled=False).bar is None  # --no-progress
    with cli.Progress(10, desc="training", unit="trees") as progress:
        progress.update(4, loss=0.25)
        shown = str(progress.bar)
        progress.write("a line past the bar")
    assert shown.startswith("training:  40%") and "4/10" in shown
    assert "trees/s" in shown and "loss 0.25" in shown
    captured = capsys.readouterr()
    assert captured.out == "a line past the bar\n" and "training:" in captured.err


def test_without_tqdm_there_is_no_bar_and_no_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cli, "on_terminal", lambda: True)
    monkeypatch.setitem(sys.modules, "tqdm", None)  # import tqdm raises ImportError
    with cli.Progress(10, desc="training", unit="trees") as progress:
        assert progress.bar is None
        progress.update(4, loss=0.25)
        progress.write("a line")
    assert capsys.readouterr() == ("a line\n", "")


@pytest.mark.usefixtures("cache_dir")
@pytest.mark.parametrize("name", list(LONG_EXAMPLES))
def test_the_long_examples_show_a_bar_on_a_terminal_unless_told_not_to(
    name: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("tqdm")
    monkeypatch.setattr(cli, "on_terminal", lambda: True)
    unit = {"tree_lstm": "trees/s", "cifar_columns": "images/s", "char_lstm": "chars/s"}[name]
    example_main(name)(LONG_EXAMPLES[name])
    assert unit in capsys.readouterr().err
    example_main(name)([*LONG_EXAMPLES[name], "--no-progress"])
    assert unit not in capsys.readouterr().err


@pytest.mark.parametrize("name", list(LONG_EXAMPLES))
def test_plot_without_matplotlib_is_an_error_before_anything_runs(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    with pytest.raises(SystemExit) as exited:
        example_main(name)([*LONG_EXAMPLES[name], "--plot", str(tmp_path / "curves.png")])
    assert exited.value.code == 2
    captured = capsys.readouterr()
    assert "argument --plot: needs matplotlib, which is not installed" in captured.err
    assert captured.out == ""  # no data made, nothing trained
    assert not (tmp_path / "curves.png").exists()


def test_plot_into_a_missing_folder_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    with pytest.raises(SystemExit) as exited:
        example_main("char_lstm")([*LONG_EXAMPLES["char_lstm"], "--plot", str(tmp_path / "no" / "c.png")])
    assert exited.value.code == 2
    assert "argument --plot: the folder" in capsys.readouterr().err


def test_plot_curves_writes_a_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    path = tmp_path / "curves.png"
    steps = list(range(100))
    cli.plot_curves(
        path,
        "a title",
        "step",
        {"loss": {"per step": (steps, [1.0 / (1 + s) for s in steps]), "mean": ([0, 99], [1.0, 0.1])}},
    )
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
