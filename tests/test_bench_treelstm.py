"""``python -m monadl.bench treelstm``: it runs end to end in its smoke form, and its peers compute the
example's model.

The smoke runs check the table's, the JSON's and the plot's shape and that every figure is a positive
number; nothing about speed. The peers (PyTorch, DyNet) must give the example's loss, root scores
and (torch) Adagrad step from the same weights; each is skipped where it is not installed. Dynamic batching
must launch fewer kernels than batching off, for the same root scores.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from child import in_child
from threadpoolctl import threadpool_info

import monadl as ml
from monadl.bench import treelstm as bench
from monadl.bench.__main__ import main
from monadl.bench.common import blas_libraries, torch_available
from monadl.bench.treelstm_model import TreeLstm
from monadl.bench.treelstm_torch import TorchLevelTreeLstm, TorchTreeLstm
from monadl.data import sst
from monadl.data.trees import Tree
from monadl.do.graph import recording, swap_recording

HAS_TORCH = torch_available()
HAS_DYNET = bench.dynet_available()


def _trees(count: int = 6, seed: int = 1) -> tuple[list[Tree], sst.Vocabulary]:
    trees = sst.synthetic_trees(count, seed=seed, min_leaves=2, max_leaves=7)
    return trees, sst.Vocabulary.from_trees(trees)


def _model(vocabulary: sst.Vocabulary, **options: Any) -> TreeLstm:
    return TreeLstm(len(vocabulary), 8, 6, seed=3, dtype=np.float64, **options)


@pytest.fixture
def reference() -> Iterator[ml.Executor]:
    """The executor of the example's reference values: every kernel on its own (no batching)."""
    with ml.Executor(1, batching=False) as executor:
        yield executor


def _params(model: Any) -> dict[str, np.ndarray]:
    return {name: np.asarray(weight.data).copy() for name, weight in model.weights.items()}


def _root_scores(model: Any, trees: list[Tree], vocabulary: sst.Vocabulary) -> np.ndarray:
    return np.stack([model.root_logits(tree, vocabulary.index) for tree in trees])


def _smoke(tmp_path: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[str, dict[str, Any]]:
    out_json, out_png = tmp_path / "treelstm.json", tmp_path / "treelstm.png"
    argv = ["treelstm", "--smoke", "--no-progress", "--json", str(out_json), "--plot", str(out_png), *extra]
    assert main(argv) == 0
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    return capsys.readouterr().out, json.loads(out_json.read_text())


def test_the_benchmark_runs_in_a_smoke_form(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out, data = _smoke(tmp_path, capsys)
    run = data["run"]
    assert data["benchmark"] == "treelstm" and data["unit"] == "trees/s"
    assert run["batches"] == [1, 4] and run["repeats"] == 3 and run["hidden"] == 16
    for word in ["trees/s", "monadl batched", "train", "infer", "batch 1", "batch 4", "recording"]:
        assert word in out, word

    expected = {"monadl", "monadl-unbatched"}
    if HAS_TORCH:
        expected |= {"torch", "torch-levels"}
    else:
        assert "torch: not installed" in out
    if HAS_DYNET:
        expected |= {"dynet", "dynet-autobatch"}
    else:
        assert "dynet: not installed" in out
    results = data["results"]
    found = {(r["implementation"], r["phase"], r["batch"]) for r in results}
    assert found == {(impl, phase, batch) for impl in expected for phase in bench.PHASES for batch in (1, 4)}
    assert len(results) == len(found)
    for r in results:
        assert 0 < r["low"] <= r["median"] <= r["high"], r
        assert len(r["samples"]) == 3 and r["trees"] >= 4
        if r["implementation"] == "monadl" and r["phase"] == "train":
            assert r["record_us"] > 0
        if r["implementation"].startswith("monadl"):
            assert r["kernels"] > 0 and r["bound"] > 0 and r["ratio"] == r["kernels"] / r["bound"]
        else:
            assert r["kernels"] is None and r["record_us"] is None
        # Every implementation's first result is monadl batched's (the same model, weights, batch).
        assert r["agrees"] is (None if r["implementation"] == "monadl" else True), r
        assert (r["first_loss"] is not None) == (r["phase"] == "train"), r
    assert "warning" not in out
    assert f"BLAS: {run['blas']}" in out  # NumPy's BLAS and the kernels that ran its products named
    for lib in threadpool_info():
        if lib["user_api"] == "blas" and "numpy" in lib["filepath"]:
            assert f"{lib['internal_api']} {lib['version']}" in run["blas"]
            assert lib.get("architecture", "") in run["blas"]
    assert ("torch eager" in out) == HAS_TORCH
    assert ("torch by level" in out) == HAS_TORCH
    assert ("dynet autobatch" in out) == HAS_DYNET


def test_the_smoke_form_reads_sst_and_caps_the_unbatched_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "sst"
    folder.mkdir()
    for split, seed in zip(sst.SPLITS, range(3), strict=True):
        sst.write_trees(
            sst.synthetic_trees(5, seed=seed, min_leaves=2, max_leaves=5), folder / f"{split}.txt"
        )
    out, data = _smoke(
        tmp_path, capsys, "--data", str(folder), "--max-unbatched", "1", "--no-torch", "--no-dynet"
    )
    assert "SST train split" in data["run"]["data"] and "SST train split" in out
    assert "torch: skipped (--no-torch)" in out and "dynet: skipped (--no-dynet)" in out
    found = {(r["implementation"], r["batch"]) for r in data["results"]}
    assert {("monadl", 1), ("monadl", 4), ("monadl-unbatched", 1)} <= found
    assert ("monadl-unbatched", 4) not in found
    assert "monadl unbatched: skipped at batch [4] (above --max-unbatched 1)" in out


@pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed")
def test_no_torch_eager_keeps_the_level_batched_peer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, data = _smoke(tmp_path, capsys, "--no-torch-eager", "--no-dynet", "--phases", "train")
    assert "torch eager: skipped (--no-torch-eager)" in out
    found = {r["implementation"] for r in data["results"]}
    assert "torch-levels" in found and "torch" not in found
    assert "torch by level" in out and "torch eager" not in out.split("skipped (--no-torch-eager)")[1]


def test_a_segment_holds_at_least_the_trees_asked_for_in_distinct_batches() -> None:
    pool, _ = _trees(10)
    batches = bench.segment(pool, 4, 9)
    assert [len(b) for b in batches] == [4, 4, 4]
    assert batches[0] == pool[:4] and batches[2] == [*pool[8:], *pool[:2]]  # the pool, cycled
    assert bench.segment(pool, 16, 9) == [[pool[k % 10] for k in range(16)]]  # at least one step

    calls: list[int] = []
    rates = bench.trees_per_second(lambda b: calls.append(len(b)), batches, warmup=5, repeats=3)
    assert calls == [4, 4] + [4] * 9  # warm-up: ceil(5 / 4) steps; then 3 segments of 3 steps
    assert len(rates) == 3 and all(r > 0 for r in rates)


def test_interleaved_runs_time_one_segment_of_each_in_turn() -> None:
    pool, _ = _trees(10)
    batches = bench.segment(pool, 4, 8)  # two steps a segment
    calls: list[str] = []
    runs = [lambda b, name=name: calls.append(name) for name in ("a", "b", "c")]
    rates = bench.interleaved_trees(runs, batches, warmup=5, repeats=3)
    warm = ["a", "a", "b", "b", "c", "c"]  # each warmed up first: ceil(5 / 4) steps
    assert calls == warm + ["a", "a", "b", "b", "c", "c"] * 3
    assert [len(r) for r in rates] == [3, 3, 3] and all(x > 0 for r in rates for x in r)


@pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed")
def test_the_torch_peer_computes_the_example(reference: ml.Executor) -> None:
    trees, vocabulary = _trees()
    model = _model(vocabulary, executor=reference)
    peer = TorchTreeLstm(_params(model))
    expected = model.loss(trees, vocabulary.index).predict_blocking(executor=reference).unwrap() / len(trees)
    assert peer.loss(trees, vocabulary.index) == pytest.approx(expected, rel=1e-12)
    np.testing.assert_allclose(
        peer.predict_roots(trees, vocabulary.index), _root_scores(model, trees, vocabulary), rtol=1e-12
    )
    assert peer.step(trees, vocabulary.index) == pytest.approx(model.step(trees, vocabulary.index), rel=1e-12)
    after = peer.numpy_params()
    for name, weight in model.weights.items():  # the same Adagrad step, 0.1 for the embeddings
        np.testing.assert_allclose(after[name], np.asarray(weight.data), rtol=1e-9, atol=1e-12, err_msg=name)


@pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed")
def test_the_level_batched_torch_peer_computes_the_example(reference: ml.Executor) -> None:
    """The strong peer: the example's loss, root scores and Adagrad step, a batch at a time by
    height; a tree twice in a batch counts twice."""
    trees, vocabulary = _trees(8)
    trees = [*trees, trees[0]]
    model = _model(vocabulary, executor=reference)
    peer = TorchLevelTreeLstm(_params(model))
    assert peer.numpy_params().keys() == _params(model).keys()
    for name, array in peer.numpy_params().items():
        np.testing.assert_array_equal(array, _params(model)[name], err_msg=name)
    expected = model.loss(trees, vocabulary.index).predict_blocking(executor=reference).unwrap() / len(trees)
    assert peer.loss(trees, vocabulary.index) == pytest.approx(expected, rel=1e-12)
    np.testing.assert_allclose(
        peer.predict_roots(trees, vocabulary.index), _root_scores(model, trees, vocabulary), rtol=1e-12
    )
    for _ in range(2):
        assert peer.step(trees, vocabulary.index) == pytest.approx(
            model.step(trees, vocabulary.index), rel=1e-12
        )
    after = peer.numpy_params()
    for name, weight in model.weights.items():
        np.testing.assert_allclose(after[name], np.asarray(weight.data), rtol=1e-9, atol=1e-12, err_msg=name)
    with pytest.raises(ValueError, match="missing parameters"):
        TorchLevelTreeLstm({})


def _dynet_peer_computes_the_example() -> None:
    """Run in a process of its own: DyNet is built with fast math, and importing it sets the CPU's
    flush-to-zero flags for the whole process (later tests' floats would lose their subnormals)."""
    import dynet_config  # type: ignore[import-not-found, import-untyped, unused-ignore]

    dynet_config.set(mem="64", random_seed=1)
    import dynet  # type: ignore[import-not-found, import-untyped, unused-ignore]

    with ml.Executor(1, batching=False) as reference:
        trees, vocabulary = _trees()
        model = _model(vocabulary, executor=reference)
        peer = bench.DynetTreeLstm(dynet, _params(model))  # DyNet computes in float32
        expected = model.loss(trees, vocabulary.index).predict_blocking(executor=reference).unwrap() / len(
            trees
        )
        assert peer.loss(trees, vocabulary.index) == pytest.approx(expected, rel=1e-5)
        np.testing.assert_allclose(
            peer.predict_roots(trees, vocabulary.index),
            _root_scores(model, trees, vocabulary),
            rtol=1e-4,
            atol=1e-5,
        )
        before = peer.predict_roots(trees, vocabulary.index)
        assert peer.step(trees, vocabulary.index) == pytest.approx(expected, rel=1e-5)
        assert not np.allclose(peer.predict_roots(trees, vocabulary.index), before)  # it trained


@pytest.mark.skipif(not HAS_DYNET, reason="dynet is not installed (pip install dynet38)")
def test_the_dynet_peer_computes_the_example() -> None:
    in_child(_dynet_peer_computes_the_example)


def test_batching_launches_fewer_kernels_and_the_ratio_is_against_the_depth_bound(
    reference: ml.Executor,
) -> None:
    trees, vocabulary = _trees(8)
    args = argparse.Namespace(embedding=8, hidden=6, seed=0, warmup=1, repeats=1)
    batches = bench.segment(trees, 8, 8)
    impls = ("monadl", "monadl-unbatched")
    results = []
    for phase in bench.PHASES:
        word_id = vocabulary.index
        results += bench.measure_together(len(vocabulary), word_id, impls, phase, batches, {}, args)
    assert [(m.implementation, m.phase) for m in results] == [(i, p) for p in bench.PHASES for i in impls]
    bench.add_bounds(results)
    by = {(m.implementation, m.phase): m for m in results}
    height = max(tree.height() for tree in trees)
    kinds = by["monadl", "infer"].kinds
    assert kinds and sum(kinds.values()) > 0
    # The bound's kinds are the model's (a run merged as it runs), not the plan's own gathers.
    model_kinds = by["monadl", "infer"].model_kinds
    assert model_kinds and {"linear", "tree_lstm_c", "lstm_h"} <= set(model_kinds)
    assert "gather" not in model_kinds
    for (impl, phase), m in by.items():
        assert m.kernels is not None and m.kernels > 0 and m.height == height
        assert m.bound == len(model_kinds) * (height + 1)
        assert m.ratio == pytest.approx(m.kernels / m.bound)
        if impl == "monadl-unbatched":
            assert m.merged == 0, phase
    assert (by["monadl", "infer"].merged or 0) > 0
    for phase in bench.PHASES:
        batched, unbatched = by["monadl", phase].kernels, by["monadl-unbatched", phase].kernels
        assert batched is not None and unbatched is not None and batched < unbatched, phase

    # The batched inference gives the unbatched one's scores.
    with ml.Executor(1, batching=True) as on, ml.Executor(1, batching=False) as off:
        scores = [_model(vocabulary, executor=ex).predict_roots(trees, vocabulary.index) for ex in (on, off)]
    np.testing.assert_allclose(scores[0], scores[1], rtol=1e-10)
    expected = _root_scores(_model(vocabulary, executor=reference), trees, vocabulary)
    np.testing.assert_allclose(scores[0], expected, rtol=1e-10)


def test_the_recording_figure_records_each_batch_into_a_graph_of_its_own() -> None:
    """As a training step does (its run takes the graph from the thread): each batch's recording
    starts from an empty graph, and none is left on the thread's after the timing."""
    sizes: list[int] = []

    class Counting(TreeLstm):
        def loss(self, trees: Sequence[Tree], word_id: Callable[[str], int]) -> ml.FloatLayer:
            sizes.append(len(recording()))  # the rows on the thread's graph before this batch's
            return super().loss(trees, word_id)

    trees, vocabulary = _trees(count=8)
    model = Counting(len(vocabulary), 8, 6, seed=3, dtype=np.float64)
    swap_recording(None)  # (what earlier tests recorded on this thread is not this test's)
    assert bench._record_us(model, [trees[:4], trees[4:]], vocabulary.index, 2) > 0
    assert sizes == [0, 0, 0, 0] and len(recording()) == 0


def test_the_blas_report_says_when_the_environment_chose_openblass_kernels(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    openblas = [i for i in threadpool_info() if i["internal_api"] == "openblas" and i.get("architecture")]
    if not openblas:
        pytest.skip("no OpenBLAS reporting its kernels is loaded")
    monkeypatch.setenv("OPENBLAS_CORETYPE", "Prescott")  # read by OpenBLAS when it loads: nothing changes now
    assert f"({openblas[0]['architecture']}, as OPENBLAS_CORETYPE=Prescott asks)" in blas_libraries()
    monkeypatch.delenv("OPENBLAS_CORETYPE")
    assert f"({openblas[0]['architecture']})" in blas_libraries()
