"""The Tree-LSTM example (examples/tree_lstm.py): its loss is Tai et al.'s, its gradients equal finite
differences, it is stack-safe on a degenerate tree, it learns, and a failed step changes nothing.

Trees are built by hand with ``monadl.data.trees.Tree``; only the test of ``main`` uses
``monadl.data.sst`` (and is skipped without it).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from cycles import cyclic_garbage

import monadl as ml
from examples.tree_lstm import TreeLstm, WordId
from monadl.data.trees import Tree

WORDS = {"good": 1, "bad": 2, "movie": 3}  # any other word is unknown: id 0


def word_id(word: str) -> int:
    return WORDS.get(word, 0)


def leaf(word: str, label: int = 2) -> Tree:
    return Tree(label, word=word)


def node(label: int, left: Tree, right: Tree) -> Tree:
    return Tree(label, left=left, right=right)


# ((good movie) (the (bad movie))): four leaves, three inner nodes, an unknown word, every label.
TINY = node(
    3,
    node(4, leaf("good", 3), leaf("movie")),
    node(1, leaf("the"), node(0, leaf("bad", 1), leaf("movie"))),
)


def tiny_model(seed: int = 0) -> TreeLstm:
    return TreeLstm(4, embedding=2, hidden=3, seed=seed, dtype=np.float64)


# --------------------------------------------------------------------------- the loss, in NumPy


def reference_loss(model: TreeLstm, tree: Tree, word_id: WordId) -> float:
    """Tai et al.'s constituency Tree-LSTM and its loss at every node, in plain NumPy (recursive:
    the tree is small)."""
    p = {name: np.asarray(weight.data) for name, weight in model.weights().items()}

    def sigmoid(x: np.ndarray) -> np.ndarray:
        return np.asarray(1.0 / (1.0 + np.exp(-x)))

    def affine(name: str, x: np.ndarray) -> np.ndarray:
        return np.asarray(x @ p[f"{name}.w"] + p[f"{name}.b"])

    total = 0.0

    def state(t: Tree) -> tuple[np.ndarray, np.ndarray]:
        nonlocal total
        if t.word is not None:
            x = p["embeddings"][word_id(t.word)]
            c = affine("leaf_c", x)
            h = sigmoid(affine("leaf_o", x)) * np.tanh(c)
        else:
            assert t.left is not None and t.right is not None
            (hl, cl), (hr, cr) = state(t.left), state(t.right)
            children = np.concatenate([hl, hr])
            i, fl, fr, o = (sigmoid(affine(g, children)) for g in ("i", "f_left", "f_right", "o"))
            c = i * np.tanh(affine("u", children)) + fl * cl + fr * cr
            h = o * np.tanh(c)
        logits = affine("classifier", h)
        total += float(np.log(np.sum(np.exp(logits))) - logits[t.label])
        return h, c

    state(tree)
    return total


def test_the_loss_is_the_papers_at_every_node() -> None:
    model = tiny_model()
    other = node(2, leaf("movie", 2), leaf("good", 4))
    value = model.loss([TINY, other], word_id).predict_blocking().unwrap()
    expected = reference_loss(model, TINY, word_id) + reference_loss(model, other, word_id)
    assert value == pytest.approx(expected, rel=1e-12)


# ---------------------------------------------------------------------------------- gradients


def test_gradients_of_every_weight_equal_central_finite_differences() -> None:
    model = tiny_model(seed=1)
    trees = [TINY, node(0, leaf("bad", 0), leaf("unknown", 2))]
    weights = model.weights
    _, gradients = ml.compute_gradients(model.loss(trees, word_id))
    assert set(gradients) == set(weights.values())  # every weight takes part

    def loss_at(weight: ml.ArrayWeight, index: tuple[int, ...], value: float) -> float:
        held = weight.data
        moved = held.copy()
        moved[index] = value
        weight.data = moved
        try:
            result: float = model.loss(trees, word_id).predict_blocking().unwrap()
        finally:
            weight.data = held
        return result

    eps = 1e-5
    for name, weight in weights.items():
        analytic = np.asarray(gradients[weight])
        assert analytic.shape == weight.data.shape, name
        # The three largest entries: there the relative error is well defined.
        for flat in np.argsort(-np.abs(analytic), axis=None)[:3]:
            index = tuple(int(k) for k in np.unravel_index(flat, analytic.shape))
            x = float(weight.data[index])
            numeric = (loss_at(weight, index, x + eps) - loss_at(weight, index, x - eps)) / (2 * eps)
            a = float(analytic[index])
            assert abs(a - numeric) <= 1e-6 * max(abs(a), abs(numeric)), (name, index, a, numeric)


# ------------------------------------------------------------------------------ a deep tree


def test_a_degenerate_tree_2000_levels_deep_runs_without_recursion_error() -> None:
    depth = 2000
    tree = leaf("good", 3)
    for k in range(depth):  # ((((good movie) movie) movie) ...): a left spine
        tree = node(3, tree, leaf("movie" if k % 2 else "bad", 2))
    assert tree.height() == depth
    model = TreeLstm(4, embedding=2, hidden=2, dtype=np.float64)
    value, gradients = ml.compute_gradients(model.loss([tree], word_id))  # forward and backward
    assert math.isfinite(value) and value > 0.0
    assert set(gradients) == set(model.weights().values())
    assert 0 <= model.predict(tree, word_id) < 5


# ----------------------------------------------------------------------------------- learning


def sentiment_trees() -> list[Tree]:
    """Small sentences whose every label is set by one word: a subtree with ``good`` is 4, with
    ``bad`` 0, else 2. The other words are fillers, ``movie`` and unknown ones."""
    fillers = ["the", "movie", "was", "movie", "plot"]
    rng = np.random.default_rng(0)
    trees = []
    for k in range(8):
        key = "good" if k % 2 else "bad"
        words = [fillers[int(j)] for j in rng.integers(0, len(fillers), 3)]
        words.insert(int(rng.integers(0, 4)), key)
        nodes = [(leaf(w, 4 if w == "good" else 0 if w == "bad" else 2), w == key) for w in words]
        while len(nodes) > 1:  # random bracketing
            j = int(rng.integers(0, len(nodes) - 1))
            (a, has_a), (b, has_b) = nodes[j], nodes[j + 1]
            has = has_a or has_b
            nodes[j : j + 2] = [(node((4 if key == "good" else 0) if has else 2, a, b), has)]
        trees.append(nodes[0][0])
    return trees


def test_training_on_a_small_learnable_set_lowers_the_loss_and_fits_it() -> None:
    trees = sentiment_trees()
    model = TreeLstm(4, embedding=8, hidden=8, seed=0, dtype=np.float64)
    before = model.loss(trees, word_id).predict_blocking().unwrap() / len(trees)
    losses = [model.step(trees[:4], word_id) + model.step(trees[4:], word_id) for _ in range(25)]
    after = model.loss(trees, word_id).predict_blocking().unwrap() / len(trees)
    assert losses[-1] < losses[0]
    assert after < 0.25 * before
    assert model.accuracy(trees, word_id) == (1.0, 1.0)
    assert [model.predict(t, word_id) for t in trees] == [t.label for t in trees]


def test_accuracy_is_fine_grained_and_binary_without_neutral_roots() -> None:
    # Root scores fixed by hand: the accuracy's arithmetic, apart from the network.
    scores = {
        0: [0.0, 2.0, 0.0, 0.0, 0.0],  # predicts 1: fine wrong, binary right (negative)
        4: [0.0, 0.0, 0.0, 0.0, 3.0],  # right both ways
        2: [0.0, 0.0, 3.0, 0.0, 0.0],  # fine right; a neutral root: not in the binary accuracy
        3: [0.0, 0.0, 1.0, 0.9, 0.9],  # predicts 2: fine wrong; p(3) + p(4) > p(0) + p(1): positive
        1: [0.0, 0.0, 0.0, 2.0, 0.0],  # predicts 3: wrong both ways
    }

    class FixedScores(TreeLstm):
        def predict_roots(self, trees: Sequence[Tree], word_id: WordId) -> np.ndarray:
            return np.asarray([scores[tree.label] for tree in trees])

    model = FixedScores(4, embedding=2, hidden=2)
    trees = [leaf("movie", label) for label in scores]
    assert model.accuracy(trees, word_id) == (2 / 5, 3 / 4)
    assert model.predict(trees[3], word_id) == 2
    fine, binary = model.accuracy([leaf("movie", 2)], word_id)
    assert fine == 1.0 and math.isnan(binary)


# ------------------------------------------------------------------------------- failed steps


def test_a_failed_step_changes_no_weight_and_no_optimizer_state() -> None:
    model = tiny_model()
    model.step([TINY], word_id)  # every weight now has optimizer state
    weights = model.weights()
    data = {name: np.array(w.data, copy=True) for name, w in weights.items()}
    states = {name: w.optimizer_state for name, w in weights.items()}

    def out_of_range(word: str) -> int:
        return 4 if word == "bad" else word_id(word)  # row 4 of a table of 4 rows

    with pytest.raises(ml.ShapeError, match="out of range"):
        model.step([node(2, leaf("good"), leaf("movie")), TINY], out_of_range)
    with pytest.raises(ValueError, match="label 7 is out of range"):
        model.step([node(7, leaf("good"), leaf("movie"))], word_id)
    for name, weight in weights.items():
        np.testing.assert_array_equal(weight.data, data[name], err_msg=name)
        assert weight.optimizer_state is states[name], name
    assert math.isfinite(model.step([TINY], word_id))  # and the model still trains


# -------------------------------------------------------------------------------------- main


def test_main_trains_on_synthetic_trees(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("monadl.data.sst")
    from examples import tree_lstm

    losses = tree_lstm.main(
        ["--trees", "12", "--epochs", "2", "--batch", "4", "--hidden", "8", "--embedding", "8"]
    )
    assert len(losses) == 2 and all(math.isfinite(loss) for loss in losses)
    out = capsys.readouterr().out
    assert out.startswith("data: synthetic")
    assert "epoch 1: loss" in out and "dev root accuracy" in out


def test_main_plots_the_learning_curves(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("monadl.data.sst")
    pytest.importorskip("matplotlib")
    from examples import tree_lstm

    path = tmp_path / "curves.png"
    tree_lstm.main(["--trees", "8", "--epochs", "2", "--batch", "4", "--hidden", "4", "--plot", str(path)])
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"plot: {path}" in capsys.readouterr().out


# ------------------------------------------------------------------------------ the module


def test_the_model_is_a_module_of_monadl_nn_parts_with_the_weights_names_of_old() -> None:
    model = tiny_model()
    assert isinstance(model, ml.Module) and isinstance(model.cell, ml.nn.TreeLSTMCell)
    assert isinstance(model.classifier, ml.nn.Linear)
    gates = ["leaf_c", "leaf_o", "i", "f_left", "f_right", "o", "u", "classifier"]
    names = ["embeddings", *(f"{gate}.{p}" for gate in gates for p in "wb")]
    assert list(model.weights()) == list(ml.weights_of(model)) == names
    assert model.weights() == dict(model.weights)  # the mapping of old, for the benchmark's peers
    assert model.weights()["leaf_c.w"] is model.cell.leaf_c.w


def test_a_checkpoint_resumes_training_bit_for_bit(tmp_path: Path) -> None:
    trees = sentiment_trees()
    straight, resumed = tiny_model(seed=2), tiny_model(seed=2)
    for model in (straight, resumed):
        model.step(trees[:4], word_id)
    ml.save(tmp_path / "model.safetensors", resumed, metadata={"steps": 1})
    resumed = tiny_model(seed=5)  # other weights, no optimizer state: the checkpoint restores both
    assert ml.load(tmp_path / "model.safetensors", resumed) == {"steps": 1}
    assert straight.step(trees[4:], word_id) == resumed.step(trees[4:], word_id)
    for name, weight in straight.weights().items():
        np.testing.assert_array_equal(np.asarray(weight.data), np.asarray(resumed.weights()[name].data))


@pytest.mark.parametrize("batching", [True, False])
def test_a_step_and_a_prediction_leave_no_reference_cycles(batching: bool) -> None:
    """A batch's graph (batchable calls, their projections, the layers they read) and its run are
    freed when the step ends, not by the garbage collector: a cycle among them made every step's
    end collect the whole batch (a tenth of a step's time, measured on the benchmark)."""
    trees = [
        Tree(3, left=Tree(4, word="good"), right=Tree(2, left=Tree(1, word="bad"), right=Tree(2, word="a"))),
        Tree(1, left=Tree(0, word="bad"), right=Tree(2, word="movie")),
    ]
    model = TreeLstm(5, embedding=3, hidden=4, dtype=np.float64, executor=ml.Executor(batching=batching))
    model.step(trees, word_id)  # the operations' first calls, outside the measured part

    def step_and_predict() -> None:
        model.step(trees, word_id)
        model.predict_roots(trees, word_id)

    assert cyclic_garbage(step_and_predict) == []
