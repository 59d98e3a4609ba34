"""The recurrent cells' fused gate ops, ``lstm_c``, ``lstm_h``, ``tree_lstm_c`` and ``gru_h``
(monadl.dsl.ops.recurrent):
values against the elementwise ops they replace, gradients against finite differences, merged
calls against calls on their own, errors, and the cells built on them."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from batching_check import merged_and_alone
from op_cases import predict

import monadl as ml
from monadl import ArrayWeight, FloatLayer, nn
from monadl.do.primitive import ELEMENTWISE, Batching, Primitive
from monadl.dsl.core.layers import apply_array
from monadl.dsl.ops import recurrent


def uniform(seed: int, *shape: int) -> np.ndarray[Any, np.dtype[np.float64]]:
    return np.random.default_rng(seed).uniform(-3.0, 3.0, shape)


def sigmoid(x: Any) -> Any:
    return 1.0 / (1.0 + np.exp(-x))


@pytest.mark.parametrize("shape", [(5,), (3, 5), (2, 3, 4)])
def test_the_values_are_the_cells_arithmetic(shape: tuple[int, ...]) -> None:
    i, f, u, c, o = (uniform(k, *shape) for k in range(5))
    c_next = sigmoid(i) * np.tanh(u) + sigmoid(f) * c
    np.testing.assert_allclose(predict(ml.lstm_c(i, f, u, c)), c_next, rtol=1e-14, atol=1e-15)
    np.testing.assert_allclose(predict(ml.lstm_h(o, c_next)), sigmoid(o) * np.tanh(c_next), rtol=1e-14)


def test_the_dtype_is_kept() -> None:
    i, f, u, c = (uniform(k, 2, 3).astype(np.float32) for k in range(4))
    value = np.asarray(predict(ml.lstm_h(i, ml.lstm_c(i, f, u, c))))
    assert value.dtype == np.float32
    assert ml.lstm_c(i, f, u, c).shape == (2, 3) and ml.lstm_c(i, f, u, c).dtype == np.float32


@pytest.mark.parametrize("memory", [(3, 4), (4,)])
def test_the_gradients_are_finite_differences(memory: tuple[int, ...]) -> None:
    probe_c, probe_h = uniform(9, 3, 4), uniform(10, 3, 4)

    def loss(i: ArrayWeight, f: ArrayWeight, u: ArrayWeight, o: ArrayWeight, c: ArrayWeight) -> FloatLayer:
        c_next = ml.lstm_c(i, f, u, c)
        # both outputs read, and c' read twice (by the loss and by lstm_h): its deltas add
        return ml.sum(c_next * probe_c) + ml.sum(ml.lstm_h(o, c_next) * probe_h)

    ml.check_gradients(loss, *(uniform(20 + k, 3, 4) for k in range(4)), uniform(30, *memory))


def test_merged_calls_equal_calls_on_their_own() -> None:
    """The steps of several sequences through one cell: the cell's calls and its fused ops merge
    across the sequences; values and gradients equal the unmerged run's."""

    def loss() -> FloatLayer:
        cell = nn.LSTMCell.new(3, 4, seed=1, dtype=np.float64)
        sequences = [[uniform(40 + 10 * s + t, 3) for t in range(2 + s)] for s in range(4)]
        terms = []
        for s, steps in enumerate(sequences):
            h, c = cell.zeros_state()
            for x in steps:
                h, c = cell(x, h, c)
            terms.append(ml.sum(h * uniform(60 + s, 4)) + ml.sum(c * uniform(70 + s, 4)))
        return ml.add_n(terms)

    merged, alone = merged_and_alone(loss)
    assert merged.stats.merged > 0 and alone.stats.merged == 0
    for op in ("lstm_c", "lstm_h"):
        assert merged.stats.kinds.get(op, 0) < alone.stats.kinds[op], op
        # one joint vjp per merged group or call alone, whatever its inputs' number
        for run in (merged, alone):
            assert run.stats.vjps[op] == run.stats.backwards[op], (op, run.stats)


def test_a_joint_vjp_goes_with_merging_but_not_with_merged_vjps_of_its_own() -> None:
    """A primitive's joint vjp replaces its vjps, those of its merged calls too: an elementwise
    batching (the op's own rule on stacked rows) takes it; a batching with vjps of its own does not."""
    rule = recurrent._h_deltas
    assert Primitive("ok", recurrent._h_forward, (), saves=True, batch=ELEMENTWISE, joint_vjp=rule).batch
    with pytest.raises(ValueError, match=r"joint vjp replaces the vjps, .* give neither"):
        Primitive("vjps", recurrent._h_forward, (rule,), saves=True, joint_vjp=rule)
    own = Batching(elementwise=True, forward=recurrent._h_forward, vjps=(rule, rule))
    with pytest.raises(ValueError, match=r"the merged calls' \(Batching\.vjps\) too"):
        Primitive("own", recurrent._h_forward, (), saves=True, batch=own, joint_vjp=rule)


@pytest.mark.parametrize(
    ("batching", "workers", "min_pool_cost", "runs_expected"),
    [
        (True, 1, 1e5, 1),  # one merged group, on the pass's thread
        (False, 1, 1e5, 3),  # three applications
        (True, 2, 6.0, 1),  # a group (of cost 12) on the pool: each input's delta asked on a thread
        (False, 2, 0.0, 3),  # each application on the pool, the same
    ],
)
def test_a_joint_vjp_runs_once_per_application_or_group(
    batching: bool, workers: int, min_pool_cost: float, runs_expected: int
) -> None:
    """Both inputs of each application (or merged group) get their deltas from one run of the joint
    vjp, on the pass's thread or on a pool (where each input's delta is asked for on a thread of its
    own), and they are the finite differences'. (Three applications to rows of 4 of the same
    weights; an op's elementwise cost is its size.)"""
    runs: list[int] = []

    def counted(xp: Any, d: Any, saved: Any, o: Any, c: Any) -> tuple[Any, ...]:
        runs.append(1)
        return recurrent._h_deltas(xp, d, saved, o, c)

    prim = Primitive("h", recurrent._h_forward, (), True, saves=True, batch=ELEMENTWISE, joint_vjp=counted)
    rng = np.random.default_rng(runs_expected + workers)
    probes = [rng.uniform(-1.0, 1.0, 4) for _ in range(3)]

    def loss(o: ArrayWeight, c: ArrayWeight) -> FloatLayer:
        # three applications to rows of the same weights: merged into one group where batching is on
        return ml.add_n([ml.sum(apply_array(prim, o[k], c[k]) * probes[k]) for k in range(3)])

    o_data, c_data = rng.uniform(-2.0, 2.0, (3, 4)), rng.uniform(-2.0, 2.0, (3, 4))
    with ml.Executor(workers, min_pool_cost=min_pool_cost, batching=batching) as executor:
        runs.clear()
        ml.compute_gradients(loss(ArrayWeight(o_data), ArrayWeight(c_data)), executor=executor)
        assert len(runs) == runs_expected
        ml.check_gradients(loss, o_data, c_data, executor=executor)


def test_the_cell_equals_its_elementwise_form() -> None:
    """``LSTMCell``'s step (on the fused ops) against the same arithmetic in plain NumPy, values and
    the gradients of every weight."""
    cell = nn.LSTMCell.new(3, 4, seed=2, dtype=np.float64)
    x, h0, c0 = uniform(80, 2, 3), uniform(81, 2, 4), uniform(82, 2, 4)
    h, c = cell(x, h0, c0)
    probe = uniform(83, 2, 4)
    value, gradients = ml.compute_gradients(ml.sum(h * probe) + ml.sum(c))
    xh = np.concatenate([x, h0], axis=-1)
    pre = {name: xh @ gate.w.data + gate.b.data for name, gate in vars(cell).items() if gate.b is not None}
    c_ref = sigmoid(pre["i"]) * np.tanh(pre["u"]) + sigmoid(pre["f"]) * c0
    h_ref = sigmoid(pre["o"]) * np.tanh(c_ref)
    assert value == pytest.approx(float(np.sum(h_ref * probe) + np.sum(c_ref)), rel=1e-13)
    # the output gate's weight: d(sum(h * probe))/d(W_o) = xh.T @ (probe * tanh(c) * s'(o))
    so = sigmoid(pre["o"])
    expected = xh.T @ (probe * np.tanh(c_ref) * so * (1.0 - so))
    np.testing.assert_allclose(gradients[cell.o.w], expected, rtol=1e-12, atol=1e-14)


def test_errors_name_the_op() -> None:
    with pytest.raises(ml.ShapeError, match=r"lstm_c: operands of shapes \(2, 3\) and \(2, 4\)"):
        predict(ml.lstm_c(uniform(1, 2, 3), uniform(2, 2, 4), uniform(3, 2, 3), uniform(4, 2, 3)))
    with pytest.raises(TypeError, match=r"lstm_h: expected an array .* for o"):
        ml.lstm_h("o", uniform(1, 3))  # type: ignore[arg-type]


def tree_c_reference(i: Any, f_left: Any, f_right: Any, u: Any, c_left: Any, c_right: Any) -> Any:
    return sigmoid(i) * np.tanh(u) + sigmoid(f_left) * c_left + sigmoid(f_right) * c_right


@pytest.mark.parametrize("shape", [(5,), (3, 5), (2, 3, 4)])
def test_tree_lstm_c_is_the_nodes_arithmetic(shape: tuple[int, ...]) -> None:
    parts = [uniform(130 + k, *shape) for k in range(6)]
    value = predict(ml.tree_lstm_c(*parts))
    np.testing.assert_allclose(value, tree_c_reference(*parts), rtol=1e-14, atol=1e-15)
    assert ml.tree_lstm_c(*parts).shape == shape
    assert np.asarray(predict(ml.tree_lstm_c(*(p.astype(np.float32) for p in parts)))).dtype == np.float32


@pytest.mark.parametrize("seed", range(4))
def test_tree_lstm_c_gradients_are_finite_differences(seed: int) -> None:
    """Random gates and memories (a child's memory broadcast from one row in half the draws), both
    outputs of a node read: c by the loss and by ``lstm_h``, so its deltas add."""
    rng = np.random.default_rng(140 + seed)
    memory = (4,) if seed % 2 else (3, 4)
    probe_c, probe_h = rng.uniform(-2.0, 2.0, (3, 4)), rng.uniform(-2.0, 2.0, (3, 4))

    def loss(*parts: ArrayWeight) -> FloatLayer:
        i, f_left, f_right, u, o, c_left, c_right = parts
        c = ml.tree_lstm_c(i, f_left, f_right, u, c_left, c_right)
        return ml.sum(c * probe_c) + ml.sum(ml.lstm_h(o, c) * probe_h)

    gates = [rng.uniform(-3.0, 3.0, (3, 4)) for _ in range(5)]
    ml.check_gradients(loss, *gates, rng.uniform(-3.0, 3.0, memory), rng.uniform(-3.0, 3.0, (3, 4)))


def tree_cell_loss(cell: nn.TreeLSTMCell, words: list[Any], probe: Any) -> FloatLayer:
    """Leaves of ``words``, composed left to right; the root's h and c, probed."""
    h, c = cell.leaf(words[0])
    for x in words[1:]:
        h, c = cell.compose(h, c, *cell.leaf(x))
    return ml.sum(h * probe) + ml.sum(c)


def test_the_tree_cell_equals_its_elementwise_form() -> None:
    """``TreeLSTMCell`` (on the fused ops) against the same arithmetic in plain NumPy: a three-word
    tree's value, and for a node of two leaves the gradients of its gates' weights and biases, each
    a closed form of the NumPy forward."""
    cell = nn.TreeLSTMCell.new(3, 4, seed=5, dtype=np.float64)
    words, probe = [uniform(150 + k, 3) for k in range(3)], uniform(160, 4)

    def affine(gate: nn.Linear, x: Any) -> Any:
        assert gate.b is not None
        return x @ gate.w.data + gate.b.data

    def leaf(x: Any) -> tuple[Any, Any]:
        c = affine(cell.leaf_c, x)
        return sigmoid(affine(cell.leaf_o, x)) * np.tanh(c), c

    def compose(left: tuple[Any, Any], right: tuple[Any, Any]) -> tuple[Any, Any, dict[str, Any]]:
        e = np.concatenate([left[0], right[0]])
        pre = {g: affine(getattr(cell, g), e) for g in ("i", "f_left", "f_right", "o", "u")}
        c = tree_c_reference(pre["i"], pre["f_left"], pre["f_right"], pre["u"], left[1], right[1])
        return sigmoid(pre["o"]) * np.tanh(c), c, pre

    h, c, _ = compose(leaf(words[0]), leaf(words[1]))
    h, c, _ = compose((h, c), leaf(words[2]))
    value = predict(tree_cell_loss(cell, words, probe))
    assert value == pytest.approx(float(np.sum(h * probe) + np.sum(c)), rel=1e-13)

    _, gradients = ml.compute_gradients(tree_cell_loss(cell, words[:2], probe))
    left, right = leaf(words[0]), leaf(words[1])
    h, c, pre = compose(left, right)
    e = np.concatenate([left[0], right[0]])
    so, si, sf_l, sf_r = (sigmoid(pre[g]) for g in ("o", "i", "f_left", "f_right"))
    tu = np.tanh(pre["u"])
    dc = probe * so * (1.0 - np.tanh(c) ** 2) + 1.0  # through h, and the loss's own sum of c
    closed = {
        "o": probe * np.tanh(c) * so * (1.0 - so),
        "i": dc * tu * si * (1.0 - si),
        "f_left": dc * left[1] * sf_l * (1.0 - sf_l),
        "f_right": dc * right[1] * sf_r * (1.0 - sf_r),
        "u": dc * si * (1.0 - tu**2),
    }
    for g, d in closed.items():
        gate = getattr(cell, g)
        np.testing.assert_allclose(gradients[gate.w], np.outer(e, d), rtol=1e-12, atol=1e-14, err_msg=g)
        np.testing.assert_allclose(gradients[gate.b], d, rtol=1e-12, atol=1e-14, err_msg=g)


def test_tree_lstm_c_merged_calls_equal_calls_on_their_own() -> None:
    """Several trees through one cell: the nodes of one height merge across the trees, and so do
    their fused ops; values and gradients equal the unmerged run's."""

    def loss() -> FloatLayer:
        cell = nn.TreeLSTMCell.new(3, 4, seed=4, dtype=np.float64)
        return ml.add_n(
            [
                tree_cell_loss(
                    cell, [uniform(180 + 10 * t + k, 3) for k in range(2 + t)], uniform(190 + t, 4)
                )
                for t in range(3)
            ]
        )

    merged, alone = merged_and_alone(loss)
    assert merged.stats.merged > 0 and alone.stats.merged == 0
    for op in ("tree_lstm_c", "lstm_h"):
        assert merged.stats.kinds.get(op, 0) < alone.stats.kinds[op], op


def test_tree_lstm_c_errors_name_the_op() -> None:
    good = uniform(1, 2, 3)
    with pytest.raises(ml.ShapeError, match=r"tree_lstm_c: operands of shapes"):
        predict(ml.tree_lstm_c(good, good, good, good, good, uniform(2, 2, 4)))
    with pytest.raises(TypeError, match=r"tree_lstm_c: expected an array .* for f_right"):
        ml.tree_lstm_c(good, good, "f", good, good, good)  # type: ignore[arg-type]


def gru_reference(r: Any, z: Any, n_x: Any, n_h: Any, h: Any) -> Any:
    return (1.0 - sigmoid(z)) * np.tanh(n_x + sigmoid(r) * n_h) + sigmoid(z) * h


@pytest.mark.parametrize("shape", [(5,), (3, 5), (2, 3, 4)])
def test_gru_h_is_the_cells_arithmetic(shape: tuple[int, ...]) -> None:
    parts = [uniform(90 + k, *shape) for k in range(5)]
    np.testing.assert_allclose(predict(ml.gru_h(*parts)), gru_reference(*parts), rtol=1e-14, atol=1e-15)
    assert ml.gru_h(*parts).shape == shape


@pytest.mark.parametrize("state", [(3, 4), (4,)])
def test_gru_h_gradients_are_finite_differences(state: tuple[int, ...]) -> None:
    probe_h = uniform(11, 3, 4)

    def loss(
        r: ArrayWeight, z: ArrayWeight, n_x: ArrayWeight, n_h: ArrayWeight, h: ArrayWeight
    ) -> FloatLayer:
        return ml.sum(ml.gru_h(r, z, n_x, n_h, h) * probe_h)

    ml.check_gradients(loss, *(uniform(100 + k, 3, 4) for k in range(4)), uniform(110, *state))


def test_gru_merged_calls_equal_calls_on_their_own() -> None:
    def loss() -> FloatLayer:
        cell = nn.GRUCell.new(3, 4, seed=3, dtype=np.float64)
        terms = []
        for s in range(4):
            h = cell.zeros_state()
            for t in range(2 + s):
                h = cell(uniform(120 + 10 * s + t, 3), h)
            terms.append(ml.sum(h * uniform(170 + s, 4)))
        return ml.add_n(terms)

    merged, alone = merged_and_alone(loss)
    assert merged.stats.merged > 0 and alone.stats.merged == 0
    assert merged.stats.kinds.get("gru_h", 0) < alone.stats.kinds["gru_h"]


def test_gru_h_errors_name_the_op() -> None:
    good = uniform(1, 2, 3)
    with pytest.raises(ml.ShapeError, match=r"gru_h: operands of shapes"):
        predict(ml.gru_h(good, good, good, uniform(2, 2, 4), good))
    with pytest.raises(TypeError, match=r"gru_h: expected an array .* for n_h"):
        ml.gru_h(good, good, good, "n_h", good)  # type: ignore[arg-type]
