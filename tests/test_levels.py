"""The scheduler's levels (``monadl.do.scheduler``): every graph is run level by level, a level's
calls of equal signature merged into one kernel, its rows gathered for the next level.

The hypothesis tests of test_batching and test_batchable compare random losses with batching on and
off; these pin what a level launches (one kernel per op and level, however many chains or trees), that
dynamic graphs merge too, that merged rows keep their calls' types, what a failing group leaves behind,
and the gradients of the scheduler's own steps (gathers of rows, float rows) against finite
differences."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from batching_check import Gradients, Layer, assert_close, gradients_of
from op_cases import probe
from returns.result import Failure, Success
from test_batching import warm_operations, with_evaluated

import monadl as ml
from examples.tree_lstm import TreeLstm
from monadl import ArrayLayer, ArrayWeight, FloatLayer, FloatWeight
from monadl.data import sst
from monadl.gradcheck import check_gradients


def same_gradients(loss: Layer) -> tuple[Gradients, Gradients]:
    """``loss``'s value and gradients with batching on and off, asserted equal (the same weights get
    a gradient); returns both."""
    merged, alone = gradients_of(loss, True), gradients_of(loss, False)
    assert alone.stats.groups == 0 and merged.stats.groups > 0  # merging happened, and only there
    assert_close(merged.value, alone.value, "loss")
    assert set(merged.gradients) == set(alone.gradients)
    for weight, gradient in alone.gradients.items():
        assert_close(merged.gradients[weight], gradient, f"gradient of {weight!r}")
    return merged, alone


def ladders(w: ArrayWeight, b: ArrayWeight, seed: int = 0) -> FloatLayer:
    """Sixteen independent chains ``sum(tanh(linear(... tanh(linear(x, w, b)) ..., w, b)))``, four of
    each length 1 to 4, built one after the other: a chain's k-th linear is at level 2k - 1."""
    rng = np.random.default_rng(seed)
    terms = []
    for length in (1, 2, 3, 4) * 4:
        h: Any = rng.normal(size=3)
        for _ in range(length):
            h = ml.tanh(ml.linear(h, w, b))
        terms.append(ml.sum(h))
    return ml.add_n(terms)


def test_independent_chains_run_as_one_kernel_per_op_and_level() -> None:
    """Sixteen chains of four lengths (test_batching pins chains of one length): an op of the chains
    launches once per level it is at, however many chains reach that level; ``sum``, whose calls lie
    deeper on average than the chains' ops, waits on the agenda until every chain has ended and runs
    once for all sixteen (DyNet's agenda); the results are the unbatched."""
    rng = np.random.default_rng(1)
    merged, alone = same_gradients(
        ladders(ArrayWeight(rng.normal(size=(3, 3))), ArrayWeight(rng.normal(size=3)))
    )
    assert merged.stats.kinds == {"linear": 4, "tanh": 4, "sum": 1, "add_n": 1}
    assert alone.stats.kinds == {"linear": 40, "tanh": 40, "sum": 16, "add_n": 1}
    assert (merged.stats.groups, merged.stats.merged) == (9, 40 + 40 + 16)


def test_a_weight_used_by_whole_groups_gets_one_delta_per_group_and_one_gradient() -> None:
    """The weights of the ladders are read by one merged linear per level: each group's vjp gives
    them one delta (x, w and b; no x at the first level, where x is a constant), and each weight's
    summed delta is taken once, as without batching, where every call's vjp gives one."""
    rng = np.random.default_rng(2)
    w, b = ArrayWeight(rng.normal(size=(3, 3))), ArrayWeight(rng.normal(size=3))
    merged, alone = same_gradients(ladders(w, b))
    assert merged.stats.vjps["linear"] == 2 + 3 * 3 and merged.stats.backwards["linear"] == 4
    assert alone.stats.vjps["linear"] == 16 * 2 + 24 * 3 and alone.stats.backwards["linear"] == 40
    assert merged.stats.backwards["weight"] == alone.stats.backwards["weight"] == 2
    assert set(merged.gradients) == {w, b}


def test_a_tree_lstm_batch_runs_with_one_cell_launch_per_level() -> None:
    warm_operations()  # an operation's first call runs alone (it learns its results)
    trees = sst.synthetic_trees(6, seed=2, min_leaves=3, max_leaves=9)
    vocabulary = sst.Vocabulary.from_trees(trees)
    model = TreeLstm(len(vocabulary), embedding=4, hidden=5, seed=1, dtype=np.float64)
    merged, alone = same_gradients(model.loss(trees, vocabulary.index))
    # Leaves are one level; an inner node's level is set by its deepest child: one launch of the
    # inner cell per level of the tallest tree, however many trees.
    kinds = merged.stats.kinds
    assert kinds["TreeLSTMCell.leaf"] == 1 and kinds["take_rows"] == 1
    height = max(t.height() for t in trees)
    assert kinds["TreeLSTMCell.compose"] == height < alone.stats.kinds["TreeLSTMCell.compose"]
    assert merged.stats.kernels < alone.stats.kernels / 5


def test_the_gates_of_a_cell_fan_out_into_one_kernel_with_the_unbatched_gradients() -> None:
    """Five gates read one input, each with weights of its own; the fifth gate's result is unused
    (not part of the graph). The 16 calls' body runs once, its four gates as one kernel; every used
    gate's weights get the unbatched gradient, the unused one's none."""
    rng = np.random.default_rng(3)
    gates = [(ArrayWeight(rng.normal(size=(6, 2))), ArrayWeight(rng.normal(size=2))) for _ in range(5)]

    @ml.batchable
    def cell(left: ml.AnyArray, right: ml.AnyArray) -> ArrayLayer:
        both = ml.concatenate([left, right], axis=-1)
        a, b, c, d, _ = (ml.tanh(ml.linear(both, w, bias)) for w, bias in gates)
        return a * b + c * d

    xs = [(rng.normal(size=3), rng.normal(size=3)) for _ in range(16)]
    cell(*xs[0])  # the operation's first call learns its results
    merged, alone = same_gradients(ml.add_n([ml.sum(cell(left, right)) for left, right in xs]))
    assert merged.stats.kinds["linear"] == 1 and alone.stats.kinds["linear"] == 16 * 4
    assert set(merged.gradients) == {w for gate in gates[:4] for w in gate}


def test_merged_rows_keep_their_calls_types_a_float_bias_and_0d_weights() -> None:
    """A fan's float biases get float gradients and stay floats after a step; merged rows of 0-d
    arrays are 0-d arrays (not NumPy scalars), forward and backward, as their calls alone give."""
    rng = np.random.default_rng(5)
    gates = [(ArrayWeight(rng.normal(size=(6, 2))), FloatWeight(0.1 * j)) for j in range(3)]

    @ml.batchable
    def cell(left: ml.AnyArray, right: ml.AnyArray) -> ArrayLayer:
        both = ml.concatenate([left, right], axis=-1)
        a, b, c = (ml.tanh(ml.linear(both, w, bias)) for w, bias in gates)
        return a * b + c

    xs = [(rng.normal(size=3), rng.normal(size=3)) for _ in range(16)]
    cell(*xs[0])
    loss = ml.add_n([ml.sum(cell(left, right)) for left, right in xs])
    executor = ml.Executor()
    _, gradients = ml.compute_gradients(loss, executor=executor)
    assert executor.last_stats.kinds["linear"] == 1 and executor.last_stats.merged >= 16
    assert all(type(gradients[bias]) is float for _, bias in gates)
    assert isinstance(ml.train_blocking(loss, ml.SGD(0.1), executor=executor), Success)
    assert all(type(bias.data) is float for _, bias in gates)

    ws = [ArrayWeight(np.array(0.1 * k)) for k in range(16)]
    doubled = [ml.tanh(w) * np.array(2.0) for w in ws]
    seen: list[Any] = []

    @ml.direct
    async def total() -> FloatLayer:
        seen.extend(await ml.parallel(*doubled))  # the merged muls' rows, as user code sees them
        return ml.add_n([ml.sum(d) for d in doubled])

    executor = ml.Executor()
    _, gradients = ml.compute_gradients(total(), executor=executor)
    assert executor.last_stats.kinds["mul"] == 1  # the 16 muls of 0-d rows: one group
    assert len(seen) == 16 and all(type(x) is np.ndarray and x.shape == () for x in seen)
    assert all(type(gradients[w]) is np.ndarray and gradients[w].shape == () for w in ws)


def test_tree_lstm_root_scores_merge_and_equal_unbatched() -> None:
    warm_operations()
    trees = sst.synthetic_trees(8, seed=4, min_leaves=2, max_leaves=7)
    vocabulary = sst.Vocabulary.from_trees(trees)
    merged_model, alone_model = (
        TreeLstm(
            len(vocabulary), embedding=3, hidden=4, seed=3, dtype=np.float64, executor=ml.Executor(batching=b)
        )
        for b in (True, False)
    )
    merged = merged_model.predict_roots(trees, vocabulary.index)
    assert merged_model.executor is not None
    assert merged_model.executor.last_stats.kinds["TreeLSTMCell.compose"] == max(t.height() for t in trees)
    assert_close(merged, alone_model.predict_roots(trees, vocabulary.index), "root scores")


# ------------------------------------------------------------------------------- dynamic graphs


def test_a_graph_with_flat_maps_of_its_own_merges_as_it_runs() -> None:
    """Eight two-layer chains, four of whose second layers a flat_map reveals only once their first
    layer ran: the revealed ops are placed at the levels after it, and merge with the static
    chains' ops of the same level."""
    rng = np.random.default_rng(6)
    w, b = ArrayWeight(rng.normal(size=(3, 3))), ArrayWeight(rng.normal(size=3))

    def second(h: ArrayLayer) -> ArrayLayer:
        return ml.tanh(ml.linear(h, w, b))

    def revealed(h: ArrayLayer) -> ArrayLayer:
        return ArrayLayer(h.forward.flat_map(lambda _: second(h).forward))

    firsts = [ml.tanh(ml.linear(rng.normal(size=3), w, b)) for _ in range(8)]
    terms = [ml.sum(revealed(h) if k % 2 else second(h)) for k, h in enumerate(firsts)]
    merged, alone = same_gradients(ml.add_n(terms))
    assert merged.stats.kinds == {"linear": 2, "tanh": 2, "sum": 1, "add_n": 1}
    assert merged.stats.merged == 8 * 5 and alone.stats.kinds["linear"] == 16
    assert set(merged.gradients) == {w, b}


def test_an_operation_whose_body_has_a_flat_map_gives_the_same_results() -> None:
    """The 16 calls' body runs once on their stacked rows, its flat_map included (a nested run of
    the same loop): its tanh launches once, and the results are those of the calls alone."""
    w = ArrayWeight(np.array([0.5, -1.0, 2.0]))

    @ml.batchable
    def cell(x: ml.AnyArray) -> ArrayLayer:
        scaled = ml.tanh(x * w)
        return ArrayLayer(scaled.forward.flat_map(lambda t: (scaled * 2.0).forward))

    xs = [np.full(3, 0.1 * k) for k in range(16)]
    cell(xs[0])  # the operation's first call learns its results
    merged, alone = same_gradients(ml.add_n([ml.sum(cell(x)) for x in xs]))
    assert merged.stats.kinds["tanh"] == 1 and alone.stats.kinds["tanh"] == 16
    assert merged.stats.merged >= 16


# -------------------------------------------------------------------------------------- failures


@pytest.mark.parametrize("bad", [1, 16], ids=["one call of its own", "a whole group"])
def test_a_shape_error_at_a_level_names_the_call_and_changes_nothing(bad: int) -> None:
    """Linears of 16 rows, ``bad`` of which do not fit ``w``: a call of another shape is another
    signature (it runs alone); calls of one shape that all fail merge, and the group's error is a
    call's own, with its shapes (4,) and (3, 2), not the stacked (16, 4). No weight changes."""
    w, b = ArrayWeight(np.ones((3, 2))), ArrayWeight(np.zeros(2))
    xs = [np.ones(3)] * (16 - bad) + [np.ones(4)] * bad
    xs = xs[8:] + xs[:8]  # the bad ones in the middle
    loss = ml.add_n([ml.sum(ml.linear(x, w, b)) for x in xs])
    before = (w.data.copy(), b.data.copy())
    executor = ml.Executor()
    result = loss.train_blocking(ml.SGD(0.1), executor=executor)
    assert isinstance(result, Failure) and isinstance(result.failure(), ml.ShapeError)
    message = str(result.failure())
    assert "linear" in message and "(4,)" in message and "(3, 2)" in message and "16" not in message
    # The 15 calls that fit ran as one group; a group whose check fails launches nothing.
    assert executor.last_stats.merged == (15 if bad == 1 else 0)
    np.testing.assert_array_equal(w.data, before[0])
    np.testing.assert_array_equal(b.data, before[1])


# ------------------------------------------------------- gathers and rows, by their gradients


def test_a_merged_group_off_the_losss_path_gives_its_weights_no_gradient() -> None:
    """A group computed in the run whose rows are all off the loss's path gives no weight a
    gradient, as its calls alone give none: neither on its own (``v``'s linears), nor when its rows
    are gathered, beside rows on the path, into a later group (``u``'s linears, whose tanhs merge
    with those of ``w``'s)."""
    rng = np.random.default_rng(8)
    v, u, w = (ArrayWeight(rng.normal(size=(3, 3))) for _ in range(3))
    xs = [rng.normal(size=3) for _ in range(4)]
    on_path = [ml.sum(ml.tanh(ml.linear(x, w, 0.0))) for x in xs]
    own = [ml.sum(ml.linear(x, v, 0.0)) for x in xs]
    gathered = [ml.sum(ml.tanh(ml.linear(x, u, 0.0))) for x in xs]
    merged, _ = same_gradients(with_evaluated(ml.add_n(on_path), own + gathered))
    assert merged.stats.kinds["linear"] == 3 and merged.stats.kinds["tanh"] == 1  # 8 tanhs, one group
    assert set(merged.gradients) == {w}


@ml.batchable
def squash(x: ml.AnyArray, c: ArrayWeight) -> ArrayLayer:
    return ml.tanh(ml.linear(x, c, 0.0))


def test_calls_off_the_losss_path_give_their_inputs_no_gradient() -> None:
    """Eight calls of one operation run as one group on rows gathered from two groups of linears:
    ``w``'s rows go to the four calls on the loss's path, ``u``'s to the four off it. The body's
    backward gives the whole stacked input a delta; only the rows of the calls that got one go on,
    so ``u`` gets no gradient, as without batching."""
    rng = np.random.default_rng(10)
    c, u, w = (ArrayWeight(rng.normal(size=(3, 3))) for _ in range(3))
    xs = [rng.normal(size=3) for _ in range(4)]
    squash(xs[0], c)  # the operation's first call learns its results
    on_path = [ml.sum(squash(ml.linear(x, w, 0.0), c)) for x in xs]
    off_path = [ml.sum(squash(ml.linear(x, u, 0.0), c)) for x in xs]
    merged, _ = same_gradients(with_evaluated(ml.add_n(on_path), off_path))
    assert merged.stats.kinds["squash"] == 1 and merged.stats.kinds["linear"] == 2 + 1
    assert set(merged.gradients) == {c, w}


def test_gathered_rows_of_two_groups_have_the_gradients_of_finite_differences() -> None:
    """Two groups of lookups (rows 2 and 0 of ``a``, 1 and 0 of ``b``) are read by one group of
    tanhs in a shuffled order, ``a``'s row 2 twice (its two deltas add): one gather of both groups'
    rows. (``a``'s row 1 is read by none: its gradient is zero.)"""

    def loss(a: ArrayWeight, b: ArrayWeight) -> FloatLayer:
        rows_a = [ml.take_rows(a, r) for r in range(3)]
        rows_b = [ml.take_rows(b, r) for r in range(2)]
        read = [rows_a[2], rows_b[1], rows_a[0], rows_a[2], rows_b[0]]
        return ml.add_n([ml.sum(ml.tanh(x) * probe((3,), k)) for k, x in enumerate(read)])

    rng = np.random.default_rng(7)
    check_gradients(loss, rng.normal(size=(3, 3)), rng.normal(size=(2, 3)))
    executor = ml.Executor()
    ml.compute_gradients(loss(ArrayWeight(np.ones((3, 3))), ArrayWeight(np.ones((2, 3)))), executor=executor)
    assert executor.last_stats.kinds == {"take_rows": 2, "tanh": 1, "mul": 1, "sum": 1, "add_n": 1}


def test_float_rows_have_the_gradients_of_finite_differences() -> None:
    """Merged sums give float rows: one read on its own (a row taken out), the others by a later
    group, with a float weight shared by that group (its gradient stays a float)."""

    def loss(a: ArrayWeight, s: FloatWeight) -> FloatLayer:
        sums = [ml.sum(ml.take_rows(a, r) * probe((3,), r)) for r in range(4)]
        scaled = [ml.tanh(t * s) for t in (sums[3], sums[1], sums[2], sums[1])]
        return ml.add_n([*scaled, ml.exp(sums[0] * 0.5)])

    rng = np.random.default_rng(9)
    (_, g) = check_gradients(loss, rng.normal(size=(4, 3)), 0.7)
    assert type(g) is float  # a float weight's delta stays a float
    executor = ml.Executor()
    ml.compute_gradients(loss(ArrayWeight(np.ones((4, 3))), FloatWeight(0.7)), executor=executor)
    assert executor.last_stats.kinds["sum"] == 1 and executor.last_stats.kinds["tanh"] == 1
