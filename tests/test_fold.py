"""Planned batching (``monadl.dsl.fold``): a visible graph run level by level, merged as a whole.

The hypothesis tests of test_batching and test_batchable compare every loss planned, merged as it
runs and unbatched; these pin what a plan launches, when it is (not) used, and its failures."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import pytest
from batching_check import assert_close, gradients_of
from gradcheck import check_gradients, probe
from returns.result import Failure, Success
from test_batching import chains

import monadl as ml
from examples.tree_lstm import TreeLstm
from monadl import ArrayLayer, ArrayWeight, FloatLayer
from monadl.data import sst
from monadl.do.do import FLAT, MAP, Bind, Do, Pure
from monadl.dsl import fold
from monadl.dsl import primitives as P
from monadl.dsl.apply import _Build
from monadl.dsl.operation import _item
from monadl.tape.tape import Tape


def planned_value(layer: Any, executor: ml.Executor) -> Any:
    result = layer.predict_blocking(executor=executor)
    assert isinstance(result, Success), result
    return result.unwrap()


def test_independent_chains_run_as_one_kernel_per_op() -> None:
    loss, w, b, xs = chains(32)
    expected = sum(float(np.sum(np.tanh(x @ w.data + b.data))) for x in xs)
    executor = ml.Executor()
    assert planned_value(loss, executor) == pytest.approx(expected, rel=1e-12)
    stats = executor.last_stats
    assert stats.planned == 1
    # One launch per level: the 32 linears, tanhs and sums; and the add_n of the 32 rows as one sum.
    assert stats.kinds == {"linear": 1, "tanh": 1, "sum": 2}
    assert stats.kernels == 4 and stats.groups == 3 and stats.merged == 96


def test_a_weight_used_by_a_whole_group_gets_one_tape_and_one_delta() -> None:
    loss, w, b, _ = chains(16)
    planned, unbatched = gradients_of(loss, True), gradients_of(loss, False)
    assert planned.stats.planned == 1 and unbatched.stats.planned == 0
    for weight in (w, b):
        assert_close(planned.gradients[weight], unbatched.gradients[weight], "gradient")


def test_a_tree_lstm_batch_is_planned_with_one_cell_launch_per_level() -> None:
    trees = sst.synthetic_trees(6, seed=2, min_leaves=3, max_leaves=9)
    vocabulary = sst.Vocabulary.from_trees(trees)
    model = TreeLstm(len(vocabulary), embedding=4, hidden=5, seed=1, dtype=np.float64)
    model.loss(trees[:1], vocabulary.index)  # an operation's first call runs alone (it learns its results)
    planned = gradients_of(model.loss(trees, vocabulary.index), True)
    unbatched = gradients_of(model.loss(trees, vocabulary.index), False)
    assert planned.stats.planned == 1
    assert_close(planned.value, unbatched.value, "loss")
    for weight, gradient in unbatched.gradients.items():
        assert_close(planned.gradients[weight], gradient, "gradient")
    kinds = planned.stats.kinds
    # Leaves are one level; an inner node's level is set by its deepest child: at most one launch
    # of the inner cell per level of the tallest tree, however many trees.
    assert kinds["Cell.leaf_cell"] == 1 and kinds["take_rows"] == 1
    assert kinds["Cell.inner_cell"] <= 2 * max(t.height() for t in trees)
    assert planned.stats.kernels < unbatched.stats.kernels / 5


def test_the_gates_of_a_cell_fan_out_into_one_kernel_with_the_unbatched_gradients() -> None:
    """Five gates read one input, each with weights of its own that the walk meets after the first
    gate's; the fifth gate's result is unused. A level's gates are one kernel forward and one per
    input backward, every used gate's weights get the unbatched gradient, the unused one's none."""
    rng = np.random.default_rng(3)
    gates = [(ArrayWeight(rng.normal(size=(6, 2))), ArrayWeight(rng.normal(size=2))) for _ in range(5)]

    @ml.batchable
    def cell(left: ml.AnyArray, right: ml.AnyArray) -> ArrayLayer:
        both = ml.concatenate([left, right], axis=-1)
        a, b, c, d, _ = (ml.tanh(ml.linear(both, w, bias)) for w, bias in gates)
        return a * b + c * d

    def loss() -> FloatLayer:
        return ml.add_n([ml.sum(cell(rng.normal(size=3) * 1.0, rng.normal(size=3))) for _ in range(16)])

    loss()  # the operation's first call learns its results
    state = rng.bit_generator.state
    planned = gradients_of(loss(), True)
    rng.bit_generator.state = state
    unbatched = gradients_of(loss(), False)
    assert planned.stats.planned == 1
    assert planned.stats.kinds["linear"] == 1  # the 16 calls' five gates: one launch
    assert_close(planned.value, unbatched.value, "loss")
    assert set(planned.gradients) == set(unbatched.gradients) == {w for gate in gates[:4] for w in gate}
    for weight, gradient in unbatched.gradients.items():
        assert_close(planned.gradients[weight], gradient, "gradient")


def test_merged_rows_keep_their_calls_types_a_float_bias_and_0d_weights() -> None:
    """A fan's float biases get float gradients and stay floats after a step; merged rows of 0-d
    arrays are 0-d arrays (not NumPy scalars), forward and backward, as their calls alone give."""
    rng = np.random.default_rng(5)
    gates = [(ArrayWeight(rng.normal(size=(6, 2))), ml.FloatWeight(0.1 * j)) for j in range(3)]

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
    assert executor.stats.planned == 1
    assert all(type(gradients[bias]) is float for _, bias in gates)
    assert isinstance(ml.train_blocking(loss, ml.SGD(0.1), executor=executor), Success)
    assert all(type(bias.data) is float for _, bias in gates)

    ws = [ArrayWeight(np.array(0.1 * k)) for k in range(16)]
    scalars = ml.add_n([ml.sum(ml.tanh(w) * np.array(2.0)) for w in ws])
    executor = ml.Executor()
    _, gradients = ml.compute_gradients(scalars, executor=executor)
    assert executor.stats.planned == 1 and executor.stats.kinds["mul"] == 1
    assert all(type(gradients[w]) is np.ndarray and gradients[w].shape == () for w in ws)


def test_tree_lstm_root_scores_are_planned_and_equal() -> None:
    trees = sst.synthetic_trees(8, seed=4, min_leaves=2, max_leaves=7)
    vocabulary = sst.Vocabulary.from_trees(trees)
    planned_model, unbatched_model = (
        TreeLstm(
            len(vocabulary), embedding=3, hidden=4, seed=3, dtype=np.float64, executor=ml.Executor(batching=b)
        )
        for b in (True, False)
    )
    planned_model.predict_roots(trees, vocabulary.index)  # the operations' first calls run alone
    planned = planned_model.predict_roots(trees, vocabulary.index)
    assert planned_model.executor is not None and planned_model.executor.last_stats.planned == 1
    assert_close(planned, unbatched_model.predict_roots(trees, vocabulary.index), "root scores")


def test_a_chain_is_not_planned_and_later_runs_are_not_walked() -> None:
    x = ArrayWeight(np.full(3, 0.5))
    layer: Any = x
    for _ in range(10):
        layer = ml.tanh(layer) * 0.9
    narrow = ml.sum(layer).forward
    executor = ml.Executor()
    assert fold._levels(narrow) is None  # nothing to merge
    walked = []
    for _ in range(8):
        walked.append(fold._narrow.get(executor, [0])[0] == 0)
        assert fold.run_planned(executor, narrow) is None
    assert walked == [True, False, True, False, False, True, False, False]  # skips 1, 2, 4, ...
    wide, *_ = chains(16)
    while fold._narrow[executor][0]:
        assert fold.run_planned(executor, wide.forward) is None  # skipped, even though wide
    assert fold.run_planned(executor, wide.forward) is not None
    assert executor not in fold._narrow  # a planned graph resets the skips


def test_a_graph_with_a_flat_map_of_its_own_is_not_planned() -> None:
    xs = [ArrayWeight(np.full(2, float(k))) for k in range(4)]
    dynamic = [ml.sum(x) for x in xs[:2]]
    dynamic.append(FloatLayer(ml.sum(xs[2]).forward.flat_map(lambda t: ml.sum(xs[3]).forward)))
    loss = ml.add_n(dynamic)
    assert fold.run_planned(ml.Executor(), loss.forward) is None
    planned = gradients_of(loss, True)
    assert planned.stats.planned == 0 and planned.value == pytest.approx(2.0 + 2.0 * 3.0)


def test_an_operation_whose_body_has_a_flat_map_runs_unplanned_with_the_same_results() -> None:
    """A plan records an operation's body on stacked rows into its program, which holds ops only:
    a body with a flat_map fails the plan, and the step runs merged as it runs, with equal results."""
    w = ArrayWeight(np.array([0.5, -1.0, 2.0]))

    @ml.batchable
    def cell(x: ml.AnyArray) -> ArrayLayer:
        scaled = ml.tanh(x * w)
        return ArrayLayer(scaled.forward.flat_map(lambda t: (scaled * 2.0).forward))

    xs = [np.full(3, 0.1 * k) for k in range(16)]
    cell(xs[0])  # the operation's first call learns its results
    loss = ml.add_n([ml.sum(cell(x)) for x in xs])
    assert fold._levels(loss.forward) is not None  # wide: a plan is tried
    planned, unbatched = gradients_of(loss, True), gradients_of(loss, False)
    assert planned.stats.planned == 0 and planned.stats.merged > 0
    assert_close(planned.value, unbatched.value, "loss")
    assert_close(planned.gradients[w], unbatched.gradients[w], "gradient")


def test_the_walk_takes_ops_calls_and_projections_only_in_their_own_modes() -> None:
    leaves: list[Do[Any]] = [Pure(Tape(np.full(2, float(k)))) for k in range(20)]
    ops: list[Do[Any]] = [Bind((leaf,), _Build(P.tanh, {}), FLAT) for leaf in leaves]
    root: Do[Any] = Bind(tuple(ops), _Build(P.add_n(len(ops)), {}), FLAT)
    levels = fold._levels(root)
    assert levels is not None and [len(level) for level in levels] == [20, 20, 1]
    # The same graph with one op as a map, or a projection as a flat map: not a plan's graph.
    odd_ones: list[Do[Any]] = [
        Bind((leaves[0],), _Build(P.tanh, {}), MAP),
        Bind((ops[0],), functools.partial(_item, 0), FLAT),
    ]
    for odd in odd_ones:
        assert fold._levels(Bind((*ops[1:], odd), _Build(P.add_n(len(ops)), {}), FLAT)) is None


def test_planning_can_be_switched_off() -> None:
    loss, *_ = chains(8)
    executor = ml.Executor(planning=False)
    planned_value(loss, executor)
    assert executor.last_stats.planned == 0 and executor.last_stats.groups > 0  # merged as it ran


def test_a_shape_error_in_a_planned_group_names_the_call_and_changes_nothing() -> None:
    w, b = ArrayWeight(np.ones((3, 2))), ArrayWeight(np.zeros(2))
    xs = [np.ones(3)] * 7 + [np.ones(4)] + [np.ones(3)] * 8  # the eighth call does not fit w
    loss = ml.add_n([ml.sum(ml.linear(x, w, b)) for x in xs])
    before = w.data.copy()
    executor = ml.Executor()
    assert fold._levels(loss.forward) is not None  # a plan would run it: its group fails, then
    result = loss.train_blocking(ml.SGD(0.1), executor=executor)  # the unplanned run names the call
    assert isinstance(result, Failure)
    assert "linear" in str(result.failure()) and "(4,)" in str(result.failure())
    np.testing.assert_array_equal(w.data, before)


def test_a_failed_plan_counts_no_kernels_of_its_own() -> None:
    w, b = ArrayWeight(np.ones((3, 2))), ArrayWeight(np.zeros(2))
    xs = [np.ones(3)] * 12 + [np.ones(4)]
    loss = ml.add_n([ml.sum(ml.linear(x, w, b)) for x in xs])
    executor = ml.Executor()
    with pytest.raises(ValueError, match="linear"):
        fold.run_planned(executor, loss.forward)
    assert executor.stats.kernels == 0 and executor.stats.planned == 0


def test_a_plan_gives_the_roots_value_and_then_the_weights_gradients() -> None:
    loss, w, b, xs = chains(16)
    planned = fold.run_planned(ml.Executor(), loss.forward)
    assert planned is not None
    assert planned.value == pytest.approx(sum(float(np.sum(np.tanh(x @ w.data + b.data))) for x in xs))
    gradients = planned.gradients(1.0)
    unbatched = gradients_of(loss, False)
    assert set(gradients) == {w, b}
    for weight in (w, b):
        assert_close(gradients[weight], unbatched.gradients[weight], "gradient")


# ------------------------------------------------------------------- the plan's own ops, by gradients


def test_gather_gradients_equal_central_finite_differences() -> None:
    """Rows of two tables, one row taken twice (its deltas add), into one array of five rows."""

    def loss(a: ArrayWeight, b: ArrayWeight) -> FloatLayer:
        params = {
            "positions": (np.array([0, 3, 4]), np.array([1, 2])),
            "rows": (np.array([2, 0, 2]), np.array([1, 0])),
            "unique": (False, True),
            "size": 5,
        }
        gathered = fold._apply(fold._gather_rule(2), [a, b], params)
        return ml.sum(ml.tanh(gathered) * probe((5, 3), 1))

    rng = np.random.default_rng(7)
    check_gradients(loss, rng.normal(size=(3, 3)), rng.normal(size=(2, 3)))


def test_float_row_gradient_equals_central_finite_differences() -> None:
    def loss(s: ml.FloatWeight) -> FloatLayer:
        row = fold._apply(fold._FLOAT_ROW, [s * s], {"dtype": np.float64})
        return ml.sum(ml.tanh(row) * np.array([0.7]))

    (g,) = check_gradients(loss, 0.3)
    assert type(g) is float  # a float weight's delta stays a float
