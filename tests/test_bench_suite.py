"""``python -m monadl.bench suite``: the DyNet benchmark suite's tasks run end to end in the smoke form,
the data readers read the real sets' formats, and the peers (DyNet, PyTorch) compute the monadl
models: the same losses and the same Adam steps from the same weights (each where installed)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from child import in_child

from monadl.bench import suite
from monadl.bench import suite_data as data
from monadl.bench.__main__ import main
from monadl.bench.common import torch_available
from monadl.data import sst

HAS_TORCH = torch_available()
HAS_DYNET = suite.dynet_available()
TORCH_TASKS = ("bilstm-tagger", "bilstm-tagger-withchar", "rnnlm-batch")


def _smoke(tmp_path: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[str, dict[str, Any]]:
    out_json, out_png = tmp_path / "suite.json", tmp_path / "suite.png"
    argv = ["suite", "--smoke", "--no-progress", "--json", str(out_json), "--plot", str(out_png), *extra]
    assert main(argv) == 0
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    return capsys.readouterr().out, json.loads(out_json.read_text())


def test_every_task_runs_in_the_smoke_form(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out, found = _smoke(tmp_path, capsys)
    assert found["benchmark"] == "suite" and found["unit"] == "instances/s"
    run = found["run"]
    assert run["batches"] == [1, 4] and run["repeats"] == 3 and set(run["tasks"]) == set(data.TASKS)
    expected = {(task, "monadl", b) for task in data.TASKS for b in (1, 4)}
    if HAS_TORCH:
        expected |= {(task, "torch", b) for task in TORCH_TASKS for b in (1, 4)}
        assert "no figures for treenn" in out
    else:
        assert "torch: not installed" in out
    if HAS_DYNET:
        expected |= {
            (task, impl, b) for task in data.TASKS for impl in ("dynet", "dynet-autobatch") for b in (1, 4)
        }
    else:
        assert "dynet: not installed" in out
    results = found["results"]
    assert {(r["task"], r["implementation"], r["batch"]) for r in results} == expected
    assert len(results) == len(expected)
    for r in results:
        assert 0 < r["low"] <= r["median"] <= r["high"], r
        assert 0 < r["units_low"] <= r["units_median"] <= r["units_high"], r
        assert len(r["samples"]) == 3 and r["instances"] >= 4 and r["units"] >= r["instances"]
        if r["implementation"] == "monadl":
            assert r["learned"] and r["loss_after"] < r["loss_before"], r
    for task in data.TASKS:  # the same weights everywhere: the same initial loss
        for batch in (1, 4):
            starts = [r["loss_before"] for r in results if (r["task"], r["batch"]) == (task, batch)]
            assert max(starts) - min(starts) <= 1e-4 * max(starts), (task, batch, starts)
    assert found["learned"] == (not found["not_learned"]) == all(r["learned"] for r in results)
    others = {
        (r["task"], r["implementation"], r["batch"]) for r in results if r["implementation"] != "monadl"
    }
    assert {(r["task"], r["other"], r["batch"]) for r in found["ratios"]} == others
    assert all(0 < r["low"] <= r["median"] <= r["high"] for r in found["ratios"])
    for word in ["sentences/s", "words/s", "trees/s", "nodes/s", "held-out loss", "batch 4"]:
        assert word in out, word
    assert ("/ dynet autobatch" in out) == HAS_DYNET and ("/ torch eager" in out) == HAS_TORCH


def _write_data(root: Path, *, text: bool) -> None:
    """A small data folder in the shared layout: tags and SST (train only); PTB text if ``text``."""
    tags = root / data.TAGGED_FILE
    tags.parent.mkdir(parents=True)
    rows = [f"the|O Ada|I-PER met|O Bob|I-PER in|O Rome{k}|I-LOC .|O" for k in range(30)]
    tags.write_text("\n".join(rows) + "\n")
    (root / "sst").mkdir()
    sst.write_trees(sst.synthetic_trees(30, seed=1, min_leaves=2, max_leaves=5), root / data.SST_TRAIN)
    if text:
        (root / data.TEXT_TRAIN).parent.mkdir(parents=True)
        (root / data.TEXT_TRAIN).write_text("a b c\nb c a d\n" * 10)
        (root / data.TEXT_HELD_OUT).write_text("a b e\n" * 8)


def test_the_smoke_form_reads_a_data_folder_and_skips_a_task_without_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _write_data(tmp_path / "data", text=False)
    out, found = _smoke(tmp_path, capsys, "--data", str(tmp_path / "data"), "--no-torch", "--no-dynet")
    assert "torch: skipped (--no-torch)" in out and "dynet: skipped (--no-dynet)" in out
    assert "rnnlm-batch: skipped" in out and "ptb-valid.txt not found" in out
    assert set(found["run"]["tasks"]) == {"bilstm-tagger", "bilstm-tagger-withchar", "treenn"}
    assert "last tenth held out" in found["run"]["tasks"]["treenn"]
    assert {r["implementation"] for r in found["results"]} == {"monadl"}
    assert all(r["learned"] for r in found["results"])


def test_the_readers_encode_the_real_sets_formats(tmp_path: Path) -> None:
    root = tmp_path / "data"
    _write_data(root, text=True)
    tagger = data.load_task("bilstm-tagger-withchar", root)
    assert (len(tagger.train), len(tagger.held_out)) == (27, 3)
    assert tagger.sizes["tags"] == 3  # O, I-PER, I-LOC
    sentence = tagger.train[0]
    assert sentence.tags == (0, 1, 0, 1, 0, 2, 0)
    # Seen 27 times each: known; "Rome0" once: unknown, spelled between <*> pads.
    assert all(w != data.UNK for k, w in enumerate(sentence.words) if k != 5)
    assert sentence.words[5] == data.UNK and sentence.spellings[:5] == (None,) * 5
    spelling = sentence.spellings[5]
    assert spelling is not None and spelling[0] == spelling[-1] == data.PAD_CHAR and len(spelling) == 7
    assert (
        data.from_json(tagger.task, json.loads(json.dumps(data.to_json(tagger.task, sentence)))) == sentence
    )

    lm = data.load_task("rnnlm-batch", root)
    assert lm.sizes["words"] == 6  # <s>, <unk>, a b c d
    assert lm.train[0][-1] == data.START and len(lm.train[0]) == 4
    assert lm.held_out[0][2] == data.LM_UNK  # "e" was not seen in training

    trees = data.load_task("treenn", root)
    assert (len(trees.train), len(trees.held_out)) == (27, 3)
    assert trees.units(trees.train[0]) == 2 * len(trees.train[0]) - 1

    bad = tmp_path / "bad.txt"
    bad.write_text("a|O b|O\nc|O d\n")
    with pytest.raises(data.DataError, match=re.escape("line 2: 'd' is not word|TAG")):
        data.read_tagged(bad)
    with pytest.raises(data.Missing, match="not found"):
        data.load_task("rnnlm-batch", tmp_path / "nowhere")
    (root / data.TAGGED_FILE).write_text("\n")
    with pytest.raises(data.DataError, match="no training instances"):
        data.load_task("bilstm-tagger", root)


def test_a_segment_holds_the_same_instances_at_every_batch_size() -> None:
    tagger = data.synthetic_task("bilstm-tagger", smoke=True)
    one, four = suite.plan(tagger, 1, 8, seed=0), suite.plan(tagger, 4, 8, seed=0)
    assert [len(b) for b in one] == [1] * 8 and [len(b) for b in four] == [4, 4]
    assert sorted(i for b in one for i in b) == sorted(i for b in four for i in b)
    lm = data.synthetic_task("rnnlm-batch", smoke=True)
    batches = suite.plan(lm, 4, 8, seed=0)
    lengths = sorted(len(s) for s in lm.train)
    for b in batches:  # runs of the training set sorted by length
        got = sorted(len(lm.train[i]) for i in b)
        assert any(lengths[k : k + 4] == got for k in range(len(lengths) - 3)), got


def _models(task: str) -> tuple[data.TaskData, Any, dict[str, np.ndarray]]:
    found = data.synthetic_task(task, smoke=True)
    vocabulary = sst.Vocabulary.from_trees(found.train) if task == "treenn" else None
    model = suite.monadl_model(found, suite.SMOKE_SIZES, 3, vocabulary)
    return found, model, {name: np.asarray(w.data) for name, w in model.weights().items()}


def _trajectory(model: Any, found: data.TaskData) -> list[float]:
    """Held-out loss, two steps on one batch, held-out loss."""
    batch, held_out = found.train[:4], found.held_out[:4]
    return [model.evaluate(held_out), model.step(batch), model.step(batch), model.evaluate(held_out)]


def _dynet_computes_the_monadl_model(task: str) -> None:
    """Run in a process of its own: DyNet is built with fast math, and importing it sets the CPU's
    flush-to-zero flags for the whole process (later tests' floats would lose their subnormals)."""
    import dynet_config  # type: ignore[import-not-found, import-untyped, unused-ignore]

    dynet_config.set(mem="64", random_seed=1)
    import dynet  # type: ignore[import-not-found, import-untyped, unused-ignore]

    from monadl.bench.suite_dynet import dynet_model

    found, model, params = _models(task)
    expected = _trajectory(model, found)
    assert expected[2] < expected[1]  # the step lowered the batch's loss
    np.testing.assert_allclose(_trajectory(dynet_model(dynet, found, params), found), expected, rtol=1e-4)


@pytest.mark.skipif(not HAS_DYNET, reason="dynet is not installed (pip install dynet38)")
@pytest.mark.parametrize("task", data.TASKS)
def test_the_dynet_models_compute_the_monadl_models(task: str) -> None:
    in_child(_dynet_computes_the_monadl_model, task)


@pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed")
@pytest.mark.parametrize("task", TORCH_TASKS)
def test_the_torch_models_compute_the_monadl_models(task: str) -> None:
    from monadl.bench.suite_torch import torch_model

    found, model, params = _models(task)
    expected = _trajectory(model, found)
    np.testing.assert_allclose(_trajectory(torch_model(found, params), found), expected, rtol=1e-4)
