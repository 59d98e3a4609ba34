"""Straight-line runs (``monadl.dsl.straight``): which graphs run as a list of ops, and that they
compute what the executor computes (values, gradients, errors, statistics, memory).

Every op's gradient test (``gradcheck.check_gradients``) and every random DAG of ``test_batching``
also compare the straight-line run with the executor's; these tests cover the rest."""

from __future__ import annotations

import itertools
import threading

import numpy as np
import pytest
from batching_check import assert_close
from cycles import cyclic_garbage
from gradcheck import check_gradients
from peak_memory import assert_one_summed_delta
from returns.result import Failure, Success

import monadl as ml
from monadl import ArrayLayer, ArrayWeight, FloatLayer, FloatWeight
from monadl.dsl.layers import apply_array
from monadl.dsl.primitives import Primitive
from monadl.dsl.straight import program
from monadl.dsl.training import NonFiniteLossError
from monadl.typeclasses.backend import ShapeError
from monadl.typeclasses.sparse import SparseRows

RNG = np.random.default_rng(0)


def model() -> tuple[FloatLayer, list[ArrayWeight | FloatWeight]]:
    """Every kind of node a straight run meets: dense and float weights, a weight used many times,
    broadcasting, an embedding lookup (a sparse gradient), a float op that passes its delta on, a
    node read twice by one op, and nodes off the path to the loss."""
    w = ArrayWeight(RNG.standard_normal((4, 3)))
    b = ArrayWeight(RNG.standard_normal(3))
    table = ArrayWeight(RNG.standard_normal((6, 4)))
    s = FloatWeight(0.7)
    x = RNG.standard_normal((5, 4))
    h = ml.tanh(ml.linear(x + table[np.array([0, 2, 2, 5, 1])], w, b))  # row 2 looked up twice
    unused = ml.exp(h) * s  # computed, off the path to the loss
    logits = h * s + ml.relu(h) * h  # s broadcast; h read by one op twice (through relu and as is)
    loss = ml.cross_entropy(logits, np.array([0, 1, 2, 1, 0])) + s * s + ml.sum(b) * 0.5
    del unused
    return loss, [w, b, table, s]


def on(executor: ml.Executor, loss: FloatLayer) -> tuple[float, dict[ArrayWeight | FloatWeight, object]]:
    value, gradients = ml.compute_gradients(loss, executor=executor)
    return value, dict(gradients)


def test_a_static_graph_runs_straight_with_the_executors_gradients() -> None:
    loss, weights = model()
    straight, taped = ml.Executor(), ml.Executor(planning=False)
    value, gradients = on(straight, loss)
    value_taped, gradients_taped = on(taped, loss)
    assert straight.stats.straight == 1 and taped.stats.straight == 0
    assert straight.stats.kernels > 0  # its ops and vjps are counted as kernel launches
    assert_close(value, value_taped, "loss")
    assert set(gradients) == set(gradients_taped) == set(weights)
    table = weights[2]
    assert type(gradients[table]) is SparseRows and type(gradients_taped[table]) is SparseRows
    assert type(gradients[weights[3]]) is float
    for weight in weights:
        assert_close(gradients[weight], gradients_taped[weight], repr(weight))


def test_straight_gradients_equal_central_finite_differences() -> None:
    x = RNG.standard_normal((3, 4))

    def f(w: ArrayLayer, b: ArrayLayer, s: FloatLayer) -> FloatLayer:
        h = ml.tanh(ml.linear(x, w, b))
        return ml.sum(h * h * s) + ml.mean(ml.log_softmax(h * s)) + s * s

    check_gradients(f, RNG.standard_normal((4, 2)), RNG.standard_normal(2), 0.3)


@pytest.mark.parametrize("depth", [1, 10, 30])
def test_a_diamond_chain_costs_one_vjp_per_op_input(depth: int) -> None:
    """y0 = x*w, y_{i+1} = y_i * y_i: 2^depth paths to w, but each node's delta is summed once."""
    w = ml.FloatWeight(1.0)
    y = w * 1.0
    for _ in range(depth):
        y = y * y
    executor = ml.Executor()
    _, gradients = ml.compute_gradients(y, executor=executor)
    assert gradients[w] == 2.0**depth
    assert executor.last_stats.straight == 1
    assert executor.last_stats.kernels == (depth + 1) + (1 + 2 * depth)  # forward ops, then vjps


def test_a_weight_used_many_times_holds_one_summed_delta() -> None:
    executor = ml.Executor()
    assert_one_summed_delta(executor)
    assert executor.stats.straight == 1


def test_a_failing_step_changes_no_weight_and_names_the_op() -> None:
    w = ArrayWeight(np.ones((3, 2)))
    before = w.data.copy()
    bad = ml.sum(ml.matmul(np.ones((4, 5)), w))  # (4, 5) @ (3, 2)
    executor = ml.Executor()
    result = bad.train_blocking(ml.SGD(0.1), executor=executor)
    assert isinstance(result, Failure)
    error = result.failure()
    assert isinstance(error, ShapeError)
    assert "matmul" in str(error) and "(4, 5)" in str(error) and "(3, 2)" in str(error)
    taped = bad.train_blocking(ml.SGD(0.1), executor=ml.Executor(planning=False))
    assert isinstance(taped, Failure) and str(taped.failure()) == str(error)  # the same error
    nan = ml.sum(w * float("nan"))
    result = nan.train_blocking(ml.SGD(0.1), executor=executor)
    assert isinstance(result, Failure) and isinstance(result.failure(), NonFiniteLossError)
    np.testing.assert_array_equal(w.data, before)
    assert executor.stats.straight == 2


def test_training_and_prediction_run_straight() -> None:
    w = ArrayWeight(np.array([[1.0], [2.0]]))
    x = np.array([[1.0, 1.0], [0.5, -1.0]])
    executor = ml.Executor()
    loss = ml.mean((x @ w - 1.0) ** 2.0)
    assert isinstance(loss.train_blocking(ml.SGD(0.1), executor=executor), Success)
    # d/dw mean((xw - 1)^2) = 2/n x^T (xw - 1) = x^T [2, -2.5] = [[0.75], [4.5]] at w = [[1], [2]]
    np.testing.assert_allclose(w.data, np.array([[1.0], [2.0]]) - 0.1 * np.array([[0.75], [4.5]]))
    prediction = (x @ w).predict_blocking(executor=executor)
    assert isinstance(prediction, Success)
    np.testing.assert_allclose(prediction.unwrap(), x @ w.data)
    assert executor.stats.straight == 2


def test_graphs_that_are_not_static_run_on_the_executor() -> None:
    w = ArrayWeight(np.array([1.0, -2.0]))

    @ml.batchable
    def double(x: ArrayLayer) -> ArrayLayer:
        return x * 2.0

    double(w * 1.0)  # the first call learns the operation's structure
    dynamic = ml.sum(w * 2.0).forward.flat_map(lambda tape: ml.sum(w * tape.data).forward)
    cases: list[tuple[str, FloatLayer, ml.Executor]] = [
        ("a user's flat_map", FloatLayer(dynamic), ml.Executor()),
        ("a batchable call", ml.sum(double(w * 1.0)), ml.Executor()),
        ("planning off", ml.sum(w * w), ml.Executor(planning=False)),
    ]
    for name, loss, executor in cases:
        _, gradients = ml.compute_gradients(loss, executor=executor)
        assert w in gradients, name
        assert executor.stats.straight == 0, name
    assert program(FloatLayer(dynamic).forward) is None


threads: list[str] = []
meeting = threading.Barrier(2, timeout=10)


def _traced_forward(xp: object, x: np.ndarray, fail: bool = False, meet: bool = False) -> np.ndarray:
    threads.append(threading.current_thread().name)
    if fail:
        raise ArithmeticError("traced: failed on purpose")
    if meet:  # returns only once another kernel meets it: both run at the same time
        meeting.wait()
    return x * 3.0


def _traced_vjp(
    xp: object, d: np.ndarray, o: np.ndarray, x: np.ndarray, fail: bool = False, meet: bool = False
) -> np.ndarray:
    threads.append(threading.current_thread().name)
    return d * 3.0


TRACED = Primitive("traced", _traced_forward, (_traced_vjp,))
"""``3 x``, noting the thread each of its kernels ran on."""


def test_with_a_pool_the_costly_kernels_run_on_it_with_the_same_results() -> None:
    loss, weights = model()
    w = weights[0]
    loss = loss + ml.sum(apply_array(TRACED, ml.tanh(w)) * w)  # a kernel whose thread is known
    taped = ml.Executor(planning=False)
    value_taped, gradients_taped = on(taped, loss)
    threads.clear()
    with ml.Executor(2, min_pool_cost=0.0) as pool:  # every kernel costs enough
        value, gradients = on(pool, loss)
        assert pool.stats.straight == 1
    # on a worker, or on the caller, which runs the kernels no worker has started while it waits
    assert len(threads) == 2 and all(n.startswith("monadl-") or n == "MainThread" for n in threads)
    assert_close(value, value_taped, "loss")
    assert set(gradients) == set(gradients_taped)
    for weight in weights:
        assert_close(gradients[weight], gradients_taped[weight], repr(weight))


def test_with_a_pool_independent_costly_kernels_run_at_the_same_time() -> None:
    """Two kernels that return only once both run: on a worker and on the waiting caller, or on two
    workers. Run one after the other (a caller taking back both), they would never return."""
    w1, w2 = ArrayWeight(np.ones(3)), ArrayWeight(np.full(3, 2.0))
    loss = ml.sum(apply_array(TRACED, w1, meet=True)) + ml.sum(apply_array(TRACED, w2, meet=True))
    meeting.reset()
    threads.clear()
    with ml.Executor(2, min_pool_cost=0.0) as pool:
        value, gradients = on(pool, loss)
        assert pool.stats.straight == 1
    assert value == pytest.approx(27.0)
    np.testing.assert_array_equal(gradients[w1], np.full(3, 3.0))
    np.testing.assert_array_equal(gradients[w2], np.full(3, 3.0))
    assert len(set(threads[:2])) == 2, threads  # the two forwards, on two threads


def test_a_kernel_failing_on_the_pool_fails_the_step_and_changes_nothing() -> None:
    w = ArrayWeight(np.array([1.0, -2.0]))
    loss = ml.sum(apply_array(TRACED, w * 2.0, fail=True)) + ml.sum(ml.tanh(w) * ml.exp(w))
    with ml.Executor(2, min_pool_cost=0.0) as pool:
        result = loss.train_blocking(ml.SGD(0.1), executor=pool)
        assert isinstance(result, Failure) and "failed on purpose" in str(result.failure())
        np.testing.assert_array_equal(w.data, [1.0, -2.0])
        fine = ml.sum(ml.tanh(w) * ml.exp(w)).train_blocking(ml.SGD(0.1), executor=pool)
        assert isinstance(fine, Success)  # the pool is still usable
        assert pool.stats.straight == 2


def test_a_kernel_failing_on_the_pool_leaves_no_reference_cycles() -> None:
    w = ArrayWeight(np.array([1.0, -2.0]))
    bad = ml.sum(apply_array(TRACED, w * 2.0, fail=True)) + ml.sum(ml.tanh(w) * ml.exp(w))
    with ml.Executor(2, min_pool_cost=0.0) as pool:
        assert isinstance(ml.sum(ml.tanh(w)).train_blocking(ml.SGD(0.1), executor=pool), Success)
        for _ in range(5):  # the failing kernel runs on a worker or on the waiting caller
            garbage = cyclic_garbage(lambda: bad.train_blocking(ml.SGD(0.1), executor=pool))
            assert garbage == [], garbage[:20]
        assert pool.stats.straight == 6


EXECUTORS = {
    "straight": lambda: ml.Executor(),
    "merged": lambda: ml.Executor(planning=False),
    "unbatched": lambda: ml.Executor(batching=False, planning=False),
}


@pytest.mark.parametrize("order", list(itertools.permutations(range(3))))
@pytest.mark.parametrize("path", sorted(EXECUTORS))
def test_a_sum_of_deltas_of_mixed_types_has_the_widest_type_in_any_order(
    order: tuple[int, ...], path: str
) -> None:
    """A float32 weight used with float64 and float32 arrays: its gradient is float64 whatever the
    order its deltas are summed in (a running sum added into in place used to keep the type of the
    first two and cast the float64 delta down)."""
    x64, x32 = np.array([0.1, 0.2, 0.3]), np.array([1.0, 2.0, 3.0], dtype=np.float32)
    w = ArrayWeight(np.ones(3, dtype=np.float32))
    terms = [ml.sum(w * x64), ml.sum(w * x32), ml.sum(w * (x32 * 2.0))]
    loss = terms[order[0]] + terms[order[1]] + terms[order[2]]
    _, gradients = ml.compute_gradients(loss, executor=EXECUTORS[path]())
    gradient = gradients[w]
    assert isinstance(gradient, np.ndarray) and gradient.dtype == np.float64
    np.testing.assert_allclose(gradient, x64 + 3.0 * x32.astype(np.float64), rtol=1e-7)


@pytest.mark.parametrize("path", sorted(EXECUTORS))
def test_gradients_never_share_memory(path: str) -> None:
    """Two weights' gradients may be one delta, or views of one (a reshape, a lookup): each comes
    back with memory of its own, so changing one in place cannot change the other."""
    w1, w2 = ArrayWeight(np.ones((3, 1))), ArrayWeight(np.ones(3))
    t1, t2 = ArrayWeight(np.ones((4, 2))), ArrayWeight(np.ones((4, 2)))
    rows = np.array([0, 3])
    loss = ml.sum(ml.tanh(ml.reshape(w1, (3,)) + w2) * np.array([1.0, 2.0, 3.0]))
    loss = loss + ml.sum(ml.tanh(t1[rows] + t2[rows]))
    _, gradients = ml.compute_gradients(loss, executor=EXECUTORS[path]())
    g1, g2, s1, s2 = gradients[w1], gradients[w2], gradients[t1], gradients[t2]
    assert isinstance(g1, np.ndarray) and isinstance(g2, np.ndarray)
    assert isinstance(s1, SparseRows) and isinstance(s2, SparseRows)
    assert not np.shares_memory(g1, g2) and not np.shares_memory(s1.values, s2.values)
    before = g1.copy()
    g2 *= 0.0
    np.testing.assert_array_equal(g1, before)


@pytest.mark.parametrize("planning", [True, False])
def test_with_a_pool_a_bad_operand_is_a_shape_error_not_a_crash_of_the_cost(planning: bool) -> None:
    """With a pool, an op's cost is asked before it runs; for operands the op rejects, that must
    not raise first: the op's own check names the problem."""
    w = ArrayWeight(np.ones(3))  # 1-d: linear's cost reads w.shape[1]
    bad = ml.sum(ml.linear(np.ones((2, 3)), w, ArrayWeight(np.zeros(2))))
    with ml.Executor(2, planning=planning) as pool:
        result = bad.train_blocking(ml.SGD(0.1), executor=pool)
    assert isinstance(result, Failure) and isinstance(result.failure(), ShapeError), result
    assert "linear" in str(result.failure()) and "(3,)" in str(result.failure())
