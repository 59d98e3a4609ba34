"""Replay: an executor keeps the record of a static graph's first run (ops on weights and constants
only) as a compiled program and replays it for later runs of equal structure. Which graphs are
replayed, and that a replay computes what the scheduler computes (values, gradients, errors,
statistics, memory), on one thread and on a pool.

Every op's gradient test (``monadl.check_gradients``) and the random DAGs of ``test_batching``
also compare replayed gradients with interpreted ones; these tests cover the rest."""

from __future__ import annotations

import functools
import itertools
import math
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from batching_check import assert_close
from cycles import cyclic_garbage
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy.typing import NDArray
from peak_memory import assert_one_summed_delta
from returns.result import Failure, Success

import monadl as ml
from monadl import ArrayLayer, ArrayWeight, FloatLayer, FloatWeight
from monadl.do import delay
from monadl.do.executor import structure_of
from monadl.do.primitive import Primitive, value_key
from monadl.do.tape import Tape
from monadl.dsl.core.layers import apply_array
from monadl.gradcheck import ATOL, RTOL, gradients_of, numerical_gradients
from monadl.runtime import versions
from monadl.typeclasses.backend import ShapeError
from monadl.typeclasses.sparse import SparseRows

Weight = ArrayWeight | FloatWeight
Weights = tuple[ArrayWeight, ArrayWeight, ArrayWeight, FloatWeight]
Gradients = tuple[float, dict[Weight, Any]]
X = np.random.default_rng(0).standard_normal((5, 4))
ROWS = np.array([0, 2, 2, 5, 1])  # row 2 looked up twice
LABELS = np.array([0, 1, 2, 1, 0])


def weights() -> Weights:
    """``w``, ``b``, an embedding ``table`` and a float ``s``: the same values at every call."""
    rng = np.random.default_rng(1)
    w, b, table = rng.standard_normal((4, 3)), rng.standard_normal(3), rng.standard_normal((6, 4))
    return ArrayWeight(w), ArrayWeight(b), ArrayWeight(table), FloatWeight(0.7)


def model(
    w: ArrayWeight,
    b: ArrayWeight,
    table: ArrayWeight,
    s: FloatWeight,
    *,
    x: NDArray[np.float64] = X,
    rows: NDArray[np.int64] = ROWS,
    labels: NDArray[np.int64] = LABELS,
) -> FloatLayer:
    """Every kind of step a replay meets: dense and float weights, a weight used many times,
    broadcasting, a lookup (a sparse gradient, per-run indices), per-run labels, an op on a
    constant alone (no delta wanted), a float op that passes its delta on, a node read twice."""
    h = ml.tanh(ml.linear(ml.exp(x * 0.1) + table[rows], w, b))
    logits = h * s + ml.relu(h) * h  # s broadcast; h read by relu and by the mul
    return ml.cross_entropy(logits, labels) + s * s + ml.sum(b) * 0.5


def on(executor: ml.Executor, loss: FloatLayer) -> Gradients:
    value, gradients = ml.compute_gradients(loss, executor=executor)
    return value, dict(gradients)


def assert_identical(a: Gradients, b: Gradients) -> None:
    """The same loss and gradients, bit for bit, of the same types."""
    assert a[0] == b[0]
    assert set(a[1]) == set(b[1])
    for weight, ga in a[1].items():
        gb = b[1][weight]
        assert type(ga) is type(gb), weight
        if isinstance(ga, SparseRows):
            np.testing.assert_array_equal(ga.indices, gb.indices)
            ga, gb = ga.values, gb.values
        np.testing.assert_array_equal(ga, gb, err_msg=repr(weight))


def test_a_static_graph_is_replayed_with_the_interpreted_gradients_bit_for_bit() -> None:
    """The second run of a structure (a new graph on the same weights) is replayed: it does what
    the first run did (launches, backward passes, vjps) and gives its loss and gradients bit for
    bit, as does an executor that never replays (a sparse gradient stays sparse, a float a float)."""
    ws = weights()
    executor, interpreter = ml.Executor(), ml.Executor(replay=False)
    first = on(executor, model(*ws))
    interpreted = executor.last_stats
    replayed = on(executor, model(*ws))
    assert interpreted.replayed == 0 and interpreted.kernels > 0 and interpreted.vjps["linear"] == 3
    again = executor.last_stats
    assert again.replayed == 1 and again != interpreted
    again.replayed = 0
    assert again == interpreted  # the same launches, merges, backward passes and vjps, by kind
    never = [on(interpreter, model(*ws)) for _ in range(2)]
    assert interpreter.stats.replayed == 0
    assert type(first[1][ws[2]]) is SparseRows and type(first[1][ws[3]]) is float
    for other in (replayed, *never):
        assert_identical(first, other)


def test_replayed_gradients_equal_central_finite_differences() -> None:
    """The replayed run's gradients (a program compiled from the first run, on new weights of the
    same values) equal the first run's bit for bit and central finite differences."""
    x = np.random.default_rng(2).standard_normal((3, 4))

    def f(w: ArrayLayer, b: ArrayLayer, s: FloatLayer) -> FloatLayer:
        h = ml.tanh(ml.linear(x, w, b))
        return ml.sum(h * h * s) + ml.mean(ml.log_softmax(h * s)) + s * s

    rng = np.random.default_rng(3)
    inputs = (rng.standard_normal((4, 2)), rng.standard_normal(2), 0.3)
    executor = ml.Executor()
    _, first = gradients_of(f, inputs, executor=executor)
    _, replayed = gradients_of(f, inputs, executor=executor)
    assert executor.last_stats.replayed == 1
    for a, r, n in zip(first, replayed, numerical_gradients(f, inputs), strict=True):
        np.testing.assert_array_equal(r, a)
        np.testing.assert_allclose(r, n, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("depth", [1, 10, 30])
def test_a_diamond_chain_costs_one_vjp_per_op_input(depth: int) -> None:
    """y0 = w*1, y_{i+1} = y_i * y_i: 2^depth paths to w, but each node's delta is summed before its
    vjps run once, on the interpreted and on the replayed run."""
    w = FloatWeight(1.0)
    executor = ml.Executor()
    for run in range(2):
        y = w * 1.0
        for _ in range(depth):
            y = y * y
        _, gradients = ml.compute_gradients(y, executor=executor)
        stats = executor.last_stats
        assert gradients[w] == 2.0**depth and stats.replayed == run
        assert stats.kinds == {"mul": depth + 1}
        assert stats.backwards == {"mul": depth + 1, "weight": 1}
        assert stats.vjps == {"mul": 1 + 2 * depth}  # w * 1.0: one (a constant wants none); y * y: two
        assert stats.kernels == (depth + 1) + (1 + 2 * depth)


def test_a_weight_used_many_times_holds_one_summed_delta() -> None:
    """Peak memory near one delta for a weight used 40 times, interpreted and replayed."""
    executor = ml.Executor()
    assert_one_summed_delta(executor)
    assert_one_summed_delta(executor)  # a new graph of the same structure
    assert executor.last_stats.replayed == 1 and executor.last_stats.backwards["weight"] == 1


def test_a_failing_step_changes_no_weight_and_names_the_op() -> None:
    """A shape error is the op's own (with and without replay), and a failed run keeps no program:
    the same bad graph fails again, interpreted."""
    w = ArrayWeight(np.ones((3, 2)))
    bad = ml.sum(ml.matmul(np.ones((4, 5)), w))  # (4, 5) @ (3, 2)
    executor = ml.Executor()
    result = bad.train_blocking(ml.SGD(0.1), executor=executor)
    assert isinstance(result, Failure)
    error = result.failure()
    assert isinstance(error, ShapeError)
    assert "matmul" in str(error) and "(4, 5)" in str(error) and "(3, 2)" in str(error)
    again = bad.train_blocking(ml.SGD(0.1), executor=executor)
    assert isinstance(again, Failure) and str(again.failure()) == str(error)
    assert executor.stats.replayed == 0
    never = bad.train_blocking(ml.SGD(0.1), executor=ml.Executor(replay=False))
    assert isinstance(never, Failure) and str(never.failure()) == str(error)
    np.testing.assert_array_equal(w.data, np.ones((3, 2)))


def test_a_replayed_step_that_fails_changes_no_weight_and_names_the_op() -> None:
    """A replay skips the shape checks, not the checks of values: a row index or a label out of
    range in a replayed run fails that step with the op's own error (the one an executor that never
    replays gives), as does a NaN loss; no weight changes, and the program serves the next run."""
    ws = weights()
    executor = ml.Executor()
    assert isinstance(model(*ws).train_blocking(ml.SGD(0.1), executor=executor), Success)
    before = [np.copy(w.data) for w in ws]
    nan_x = X.copy()
    nan_x[0, 0] = np.nan
    cases: list[tuple[dict[str, Any], type[Exception], str]] = [
        ({"rows": np.array([0, 2, 6, 5, 1])}, ShapeError, "take_rows: row index 6 is out of range"),
        ({"labels": np.array([0, 1, 3, 1, 0])}, ValueError, "cross_entropy: label 3 is out of range"),
        ({"x": nan_x}, ml.NonFiniteLossError, "not finite"),
    ]
    for change, kind, message in cases:
        result = model(*ws, **change).train_blocking(ml.SGD(0.1), executor=executor)
        assert executor.last_stats.replayed == 1, change
        assert isinstance(result, Failure) and isinstance(result.failure(), kind), result
        assert message in str(result.failure())
        never = model(*weights(), **change).train_blocking(ml.SGD(0.1), executor=ml.Executor(replay=False))
        assert isinstance(never, Failure) and str(never.failure()) == str(result.failure())
        for w, data in zip(ws, before, strict=True):
            np.testing.assert_array_equal(w.data, data)
    assert isinstance(model(*ws).train_blocking(ml.SGD(0.1), executor=executor), Success)
    assert executor.last_stats.replayed == 1


def test_training_and_prediction_are_replayed() -> None:
    """Training steps and predictions (each its own structure) replay from their second run, on
    the weight's data of that run."""
    w = ArrayWeight(np.array([[1.0], [2.0]]))
    x = np.array([[1.0, 1.0], [0.5, -1.0]])
    executor = ml.Executor()
    expected = w.data.copy()
    for run in range(3):
        loss = ml.mean((x @ w - 1.0) ** 2.0)
        assert isinstance(loss.train_blocking(ml.SGD(0.1), executor=executor), Success)
        assert executor.last_stats.replayed == int(run > 0)
        expected = expected - 0.1 * (2.0 / len(x)) * x.T @ (x @ expected - 1.0)  # d/dw mean((xw - 1)^2)
        np.testing.assert_allclose(w.data, expected, rtol=1e-12)
    for run in range(2):
        prediction = (x @ w).predict_blocking(executor=executor)
        assert executor.last_stats.replayed == run
        assert isinstance(prediction, Success)
        np.testing.assert_allclose(prediction.unwrap(), x @ w.data, rtol=1e-12)


def test_graphs_that_are_not_static_are_never_replayed() -> None:
    """User code in the graph (a flat_map, a batchable call, a direct-style coroutine, a delay),
    or an executor with replay off: every run is interpreted, with the right gradients each time."""
    w = ArrayWeight(np.array([1.0, -2.0]))

    @ml.batchable
    def double(x: ArrayLayer) -> ArrayLayer:
        return x * 2.0

    @ml.direct
    async def direct_style() -> FloatLayer:
        total = await ml.sum(w)  # -1.0, as data: no delta goes through it
        return ml.sum(w * total)

    def flat_mapped() -> FloatLayer:
        return FloatLayer(ml.sum(w * 2.0).forward.flat_map(lambda tape: ml.sum(w * tape.data).forward))

    def delayed() -> FloatLayer:
        return ml.sum(w * ArrayLayer(delay(lambda: Tape(np.array([3.0, 4.0])))))

    cases: list[tuple[str, Callable[[], FloatLayer], ml.Executor, list[float]]] = [
        ("a flat_map", flat_mapped, ml.Executor(), [-2.0, -2.0]),  # the constant sum(2w)
        ("a batchable call", lambda: ml.sum(double(w * 1.0)), ml.Executor(), [2.0, 2.0]),
        ("a coroutine", direct_style, ml.Executor(), [-1.0, -1.0]),
        ("a delay", delayed, ml.Executor(), [3.0, 4.0]),
        ("replay off", lambda: ml.sum(w * w), ml.Executor(replay=False), [2.0, -4.0]),
    ]
    for name, loss, executor, expected in cases:
        for _ in range(3):
            _, gradients = ml.compute_gradients(loss(), executor=executor)
            np.testing.assert_array_equal(gradients[w], expected, err_msg=name)
        assert executor.stats.replayed == 0, name


def test_a_change_of_structure_is_not_replayed_from_the_wrong_program() -> None:
    """A run that differs in shape, dtype, a float constant or an op is interpreted (and right); one
    that differs only in data (a weight, an array constant's values) replays, on its own data."""
    executor = ml.Executor()
    x3 = np.array([0.5, -1.0, 2.0])

    def check(w: ArrayWeight, c: float, x: NDArray[Any], f: str, replayed: int) -> None:
        op, d = (ml.tanh, lambda y: 1.0 - np.tanh(y) ** 2) if f == "tanh" else (ml.sigmoid, _dsigmoid)
        _, gradients = ml.compute_gradients(ml.sum(op(w * c) * x), executor=executor)
        assert executor.last_stats.replayed == replayed, (w, c, f)
        assert set(gradients) == {w}
        gradient = gradients[w]
        assert gradient.dtype == w.data.dtype
        np.testing.assert_allclose(gradient, c * d(w.data * c) * x, rtol=1e-6)

    w3 = ArrayWeight(np.array([1.0, -2.0, 0.5]))
    check(w3, 2.0, x3, "tanh", 0)
    check(w3, 2.0, x3, "tanh", 1)
    check(ArrayWeight(np.array([1.0, -2.0, 0.5, 0.1])), 2.0, np.ones(4), "tanh", 0)  # a shape
    w32 = ArrayWeight(np.array([1.0, -2.0, 0.5], dtype=np.float32))
    check(w32, 2.0, x3.astype(np.float32), "tanh", 0)  # a dtype
    check(w3, 3.0, x3, "tanh", 0)  # a float constant
    check(w3, 2.0, x3, "sigmoid", 0)  # an op
    check(ArrayWeight(np.array([0.3, 0.2, -0.1])), 2.0, x3, "tanh", 1)  # another weight
    check(w3, 2.0, np.array([4.0, 5.0, -6.0]), "tanh", 1)  # another constant of the same kind


def test_an_executor_stops_looking_for_programs_of_graphs_that_keep_changing_and_looks_again() -> None:
    """After ``MISSES`` runs in a row of new structures (a model whose graph follows its data), an
    executor no longer works out structures, so a graph run again is not replayed at first; every
    ``RETRY`` runs it looks again, and a graph that stopped changing is replayed again from then on.
    Every run computes the same gradients either way."""
    executor = ml.Executor()
    w = ArrayWeight(np.array([0.5, -1.0]))

    def chain(n: int) -> FloatLayer:
        x: ArrayLayer = w * 1.0
        for _ in range(n):
            x = ml.tanh(x)
        return ml.sum(x)

    def run(n: int) -> int:
        _, gradients = ml.compute_gradients(chain(n), executor=executor)
        expected = np.ones(2)
        y = w.data
        for _ in range(n):  # the chain rule through n tanhs, from the inside out
            y = np.tanh(y)
            expected = expected * (1.0 - y**2)
        np.testing.assert_allclose(gradients[w], expected, rtol=1e-12)
        return executor.last_stats.replayed

    assert [run(n) for n in range(1, executor.MISSES + 1)] == [0] * executor.MISSES
    again = [run(3) for _ in range(2 * executor.RETRY)]
    assert again[:2] == [0, 0]  # (an executor that always looks replays the second run)
    first = again.index(1)  # the run after the first look again
    assert first <= executor.RETRY + 1 and again[first - 1] == 0
    assert again[first:] == [1] * (len(again) - first)


def _dsigmoid(y: NDArray[Any]) -> NDArray[Any]:
    s = 1.0 / (1.0 + np.exp(-y))
    return np.asarray(s * (1.0 - s))


def test_each_replay_reads_the_weights_current_data() -> None:
    """Five Adam steps replayed from the second, and five on an executor that never replays: the
    same losses and weights, bit for bit, after every step (a program keeps no run's data)."""
    replaying, interpreted = weights(), weights()
    executors = ml.Executor(), ml.Executor(replay=False)
    optimizers = ml.Adam(0.05), ml.Adam(0.05)
    for step in range(5):
        losses = [
            model(*ws).train_blocking(optimizer, executor=executor)
            for ws, executor, optimizer in zip((replaying, interpreted), executors, optimizers, strict=True)
        ]
        assert isinstance(losses[0], Success) and losses[0] == losses[1]
        assert executors[0].last_stats.replayed == int(step > 0)
        for a, b in zip(replaying, interpreted, strict=True):
            np.testing.assert_array_equal(a.data, b.data)
    assert executors[1].stats.replayed == 0
    assert not np.array_equal(replaying[0].data, weights()[0].data)  # the steps moved the weights


threads: list[str] = []
meeting = threading.Barrier(2, timeout=10)


def _traced_forward(xp: object, x: NDArray[Any], fail: bool = False, meet: bool = False) -> NDArray[Any]:
    threads.append(threading.current_thread().name)
    if fail:
        raise ArithmeticError("traced: failed on purpose")
    if meet:  # returns only once another kernel meets it: both run at the same time
        meeting.wait()
    return x * 3.0


def _traced_vjp(
    xp: object, d: NDArray[Any], o: NDArray[Any], x: NDArray[Any], fail: bool = False, meet: bool = False
) -> NDArray[Any]:
    threads.append(threading.current_thread().name)
    if meet:
        meeting.wait()
    return d * 3.0


TRACED = Primitive("traced", _traced_forward, (_traced_vjp,), cost=lambda *_, **__: 1e9)
"""``3 x``, noting the thread each of its kernels ran on; it costs 1e9 (the other ops, a few)."""


@pytest.mark.parametrize("min_pool_cost", [0.0, 1e6, 1e12])
def test_with_a_pool_costly_kernels_run_on_it_with_the_same_results(min_pool_cost: float) -> None:
    """On a pool of two, interpreted and replayed: kernels of cost min_pool_cost or more (all at 0,
    the traced ones at 1e6, none at 1e12) run on a worker or on the waiting caller, cheaper ones on
    the caller (the traced forward's and vjp's threads are checked); the loss and gradients are a
    sequential executor's (to rounding: deltas from the pool are summed as they arrive)."""
    ws = weights()

    def loss() -> FloatLayer:
        return model(*ws) + ml.sum(apply_array(TRACED, ml.tanh(ws[0])) * ws[0])

    expected = on(ml.Executor(replay=False), loss())
    with ml.Executor(2, min_pool_cost=min_pool_cost) as pool:
        for run in range(2):
            threads.clear()
            value, gradients = on(pool, loss())
            assert pool.last_stats.replayed == run
            assert len(threads) == 2  # the traced forward and vjp
            if min_pool_cost > 1e9:
                assert threads == ["MainThread"] * 2
            else:
                assert all(n.startswith("monadl-") or n == "MainThread" for n in threads), threads
            assert_close(value, expected[0], "loss")
            assert set(gradients) == set(expected[1])
            for weight, gradient in expected[1].items():
                assert_close(gradients[weight], gradient, repr(weight))


CHEAP = Primitive("cheap", lambda xp, x: x * 1.0, (lambda xp, d, o, x: d,))
"""``x``, run inline (no batching: it stays a step of its own between the traced ones)."""


def test_with_a_pool_independent_costly_kernels_run_at_the_same_time() -> None:
    """Two forward kernels, then two vjps, that return only once both of a pair run: on a worker and
    on the waiting caller, or on two workers; interpreted, and replayed. Run one after the other,
    they would never return; nor would they if the cheap step recorded between them waited for more
    than the slots it reads."""
    w1, w2, w3 = ArrayWeight(np.ones(3)), ArrayWeight(np.full(3, 2.0)), ArrayWeight(np.ones(3))
    with ml.Executor(2, min_pool_cost=1e6) as pool:  # the traced kernels only
        for run in range(2):
            loss = ml.sum(apply_array(TRACED, w1, meet=True)) + ml.sum(apply_array(CHEAP, w3))
            loss = loss + ml.sum(apply_array(TRACED, w2, meet=True))
            meeting.reset()
            threads.clear()
            value, gradients = on(pool, loss)
            assert pool.last_stats.replayed == run
            assert value == pytest.approx(30.0)
            np.testing.assert_array_equal(gradients[w1], np.full(3, 3.0))
            np.testing.assert_array_equal(gradients[w2], np.full(3, 3.0))
            np.testing.assert_array_equal(gradients[w3], np.ones(3))
            assert len(threads) == 4 and len(set(threads[:2])) == len(set(threads[2:])) == 2, threads


def _failing(w: ArrayWeight) -> FloatLayer:
    return ml.sum(apply_array(TRACED, w * 2.0, fail=True)) + ml.sum(ml.tanh(w) * ml.exp(w))


def _lookup(table: ArrayWeight, w: ArrayWeight, rows: list[int]) -> FloatLayer:
    return ml.sum(ml.tanh(table[np.array(rows)] * w))


def test_a_kernel_failing_on_the_pool_fails_the_step_and_changes_nothing() -> None:
    """Every kernel on the pool: a failing kernel (interpreted) and a lookup out of range (replayed)
    fail their steps with their own errors and change no weight; the pool stays usable."""
    w, table = ArrayWeight(np.array([1.0, -2.0])), ArrayWeight(np.ones((3, 2)))
    with ml.Executor(2, min_pool_cost=0.0) as pool:
        result = _failing(w).train_blocking(ml.SGD(0.1), executor=pool)
        assert isinstance(result, Failure) and "failed on purpose" in str(result.failure())
        np.testing.assert_array_equal(w.data, [1.0, -2.0])
        assert isinstance(_lookup(table, w, [0, 2]).train_blocking(ml.SGD(0.1), executor=pool), Success)
        before = w.data.copy(), table.data.copy()
        result = _lookup(table, w, [0, 3]).train_blocking(ml.SGD(0.1), executor=pool)
        assert pool.last_stats.replayed == 1
        assert isinstance(result, Failure) and isinstance(result.failure(), ShapeError)
        assert "take_rows: row index 3" in str(result.failure())
        np.testing.assert_array_equal(w.data, before[0])
        np.testing.assert_array_equal(table.data, before[1])
        assert isinstance(_lookup(table, w, [2, 1]).train_blocking(ml.SGD(0.1), executor=pool), Success)
        assert pool.last_stats.replayed == 1
        assert not np.array_equal(w.data, before[0])


def test_a_kernel_failing_on_the_pool_leaves_no_reference_cycles() -> None:
    """Failed steps on the pool, interpreted (a failing kernel) and replayed (a lookup out of
    range), leave nothing to the cyclic garbage collector."""
    w, table = ArrayWeight(np.array([1.0, -2.0])), ArrayWeight(np.ones((3, 2)))
    with ml.Executor(2, min_pool_cost=0.0) as pool:
        assert isinstance(_lookup(table, w, [0, 1]).train_blocking(ml.SGD(0.1), executor=pool), Success)
        for bad in (_failing(w), _lookup(table, w, [0, 5])):
            for _ in range(5):  # the failing kernel runs on a worker or on the waiting caller
                garbage = cyclic_garbage(functools.partial(bad.train_blocking, ml.SGD(0.1), executor=pool))
                assert garbage == [], garbage[:20]
        assert pool.stats.replayed == 5


EXECUTORS: dict[str, Callable[[], ml.Executor]] = {
    "replayed": ml.Executor,
    "replayed on a pool": lambda: ml.Executor(2, min_pool_cost=0.0),
    "interpreted": lambda: ml.Executor(replay=False),
    "unbatched": lambda: ml.Executor(batching=False, replay=False),
}


def gradients_on(path: str, loss: Callable[[], FloatLayer]) -> dict[Weight, Any]:
    """``loss()``'s gradients on a fresh executor of ``path``; where it replays, those of the second
    run, checked to be a replay."""
    with EXECUTORS[path]() as executor:
        for _ in range(1 + executor.replay):
            gradients = on(executor, loss())[1]
        assert executor.last_stats.replayed == executor.replay
    return gradients


@pytest.mark.parametrize("order", list(itertools.permutations(range(3))))
@pytest.mark.parametrize("path", sorted(EXECUTORS))
def test_a_sum_of_deltas_of_mixed_types_is_summed_in_the_widest_type_in_any_order(
    order: tuple[int, ...], path: str
) -> None:
    """A float32 weight used with float64 and float32 arrays: its deltas are summed in float64
    whatever their order (a running sum added into in place used to keep the type of the first two
    and cast the float64 delta down), and its gradient comes in its own dtype, float32."""
    x64, x32 = np.array([0.1, 0.2, 0.3]), np.array([1.0, 2.0, 3.0], dtype=np.float32)
    w = ArrayWeight(np.ones(3, dtype=np.float32))

    def loss() -> FloatLayer:
        terms = [ml.sum(w * x64), ml.sum(w * x32), ml.sum(w * (x32 * 2.0))]
        return terms[order[0]] + terms[order[1]] + terms[order[2]]

    gradient = gradients_on(path, loss)[w]
    assert isinstance(gradient, np.ndarray) and gradient.dtype == np.float32
    np.testing.assert_array_equal(gradient, (x64 + 3.0 * x32.astype(np.float64)).astype(np.float32))


@pytest.mark.parametrize("path", sorted(EXECUTORS))
def test_gradients_never_share_memory(path: str) -> None:
    """Two weights' gradients may be one delta, or views of one (a reshape, a lookup): each comes
    back with memory of its own, so changing one in place cannot change the other."""
    w1, w2 = ArrayWeight(np.ones((3, 1))), ArrayWeight(np.ones(3))
    t1, t2 = ArrayWeight(np.ones((4, 2))), ArrayWeight(np.ones((4, 2)))
    rows = np.array([0, 3])

    def loss() -> FloatLayer:
        dense = ml.sum(ml.tanh(ml.reshape(w1, (3,)) + w2) * np.array([1.0, 2.0, 3.0]))
        return dense + ml.sum(ml.tanh(t1[rows] + t2[rows]))

    gradients = gradients_on(path, loss)
    g1, g2, s1, s2 = gradients[w1], gradients[w2], gradients[t1], gradients[t2]
    assert isinstance(g1, np.ndarray) and isinstance(g2, np.ndarray)
    assert isinstance(s1, SparseRows) and isinstance(s2, SparseRows)
    assert not np.shares_memory(g1, g2) and not np.shares_memory(s1.values, s2.values)
    before = g1.copy()
    g2 *= 0.0
    np.testing.assert_array_equal(g1, before)


@pytest.mark.parametrize("min_pool_cost", [0.0, 1e5])
def test_with_a_pool_a_bad_operand_is_a_shape_error_not_a_crash_of_the_cost(min_pool_cost: float) -> None:
    """With a pool, an op's cost is asked before it runs; for operands the op rejects, that must
    not raise first: the op's own check names the problem, at every run (none is replayed)."""
    w = ArrayWeight(np.ones(3))  # 1-d: linear's cost reads w.shape[1]
    bad = ml.sum(ml.linear(np.ones((2, 3)), w, ArrayWeight(np.zeros(2))))
    with ml.Executor(2, min_pool_cost=min_pool_cost) as pool:
        for _ in range(2):
            result = bad.train_blocking(ml.SGD(0.1), executor=pool)
            assert isinstance(result, Failure) and isinstance(result.failure(), ShapeError), result
            assert "linear" in str(result.failure()) and "(3,)" in str(result.failure())
        assert pool.stats.replayed == 0


def test_the_same_graph_run_again_is_replayed_and_a_weight_keeps_its_shape() -> None:
    """A graph run again (the same object, as a training loop over a fixed loss runs it) replays
    without being walked; a weight cannot be given data of another shape or dtype (a ShapeError
    naming the weight, and nothing changes), so a replay never meets one."""
    w = ArrayWeight(np.ones((4, 3)))
    loss = ml.sum(ml.tanh(X @ w))
    executor = ml.Executor()
    first = on(executor, loss)
    again = on(executor, loss)
    assert executor.last_stats.replayed == 1
    assert_identical(first, again)
    for wrong in (np.ones((4, 2)), np.ones((4, 3), dtype=np.float32)):
        with pytest.raises(
            ShapeError, match=r"ArrayWeight\(shape=\(4, 3\).*the weight holds float64 \(4, 3\)"
        ):
            w.data = wrong
    np.testing.assert_array_equal(w.data, np.ones((4, 3)))
    w.data = np.full((4, 3), 2.0)
    value, _ = on(executor, loss)
    assert executor.last_stats.replayed == 1
    assert value == pytest.approx(float(np.sum(np.tanh(X @ w.data))))


def test_a_weight_whose_kind_a_commit_changed_is_not_replayed_with_the_old_program() -> None:
    """A commit may give a weight data of another type, shape or dtype (a module moved to another
    array namespace does; ``data =`` refuses it, so the test commits directly): the graph's next run
    works out its structure again and computes with the new data, in its dtype."""
    w = ArrayWeight(np.ones((4, 3)))
    loss = ml.sum(ml.tanh(X @ w))
    executor = ml.Executor()
    on(executor, loss)
    on(executor, loss)
    assert executor.last_stats.replayed == 1
    before = versions.last_reshape()
    changed = np.full((4, 3), 0.5, dtype=np.float32)
    with versions.COMMIT_LOCK:
        versions.publish([(w, changed, None)])
    assert versions.last_reshape() > before
    value, gradients = on(executor, loss)
    assert executor.last_stats.replayed == 0
    assert value == pytest.approx(float(np.sum(np.tanh(X @ changed))), rel=1e-6)
    assert gradients[w].dtype == np.float32
    on(executor, loss)  # the new structure's program, kept and replayed
    assert executor.last_stats.replayed == 1


def test_a_runs_structure_is_of_the_weights_as_of_its_snapshot() -> None:
    """A run's structure (its program's key) describes its weights as the run reads them, as of its
    snapshot: a commit that changes a weight's kind after the snapshot was taken (another thread's)
    does not give the run a key of the new kind over the old data. A structure's check against a
    later snapshot skips the weights while no commit between changed a kind, and compares them
    where one did (of another weight: they hold, from then on without a look)."""
    w = ArrayWeight(np.ones((4, 3)))
    other = ArrayWeight(np.ones(2))
    loss = ml.sum(ml.tanh(X @ w))
    assert loss.graph is not None
    taken = versions.snapshot()
    old = value_key(w.data)
    changed = np.full((4, 3), 0.5, dtype=np.float32)
    with versions.COMMIT_LOCK:
        versions.publish([(w, changed, None)])
    structure = structure_of(loss.graph, loss.row, taken)
    assert structure is not None and structure.weights == [old]
    assert structure.holds_at(taken) and not structure.holds_at(versions.snapshot())
    newer = structure_of(loss.graph, loss.row, versions.snapshot())
    assert newer is not None and newer.weights == [value_key(changed)]
    assert not newer.holds_at(taken)  # an older run's snapshot: the old kind
    read_at = newer.number
    with versions.COMMIT_LOCK:  # new values of the same kinds: the check need not look
        versions.publish([(w, np.zeros((4, 3), dtype=np.float32), None)])
    assert newer.holds_at(versions.snapshot()) and newer.number == read_at
    with versions.COMMIT_LOCK:  # another weight's kind changed: looked at, they hold
        versions.publish([(other, np.ones(3), None)])
    now = versions.snapshot()
    assert newer.holds_at(now) and newer.number == now.number > read_at


KIND_SAMPLES: list[Any] = [
    1.0,
    np.zeros(3),
    np.zeros(4),
    np.zeros((3, 1)),
    np.zeros(3, dtype=np.float32),
    np.zeros((), dtype=np.float32),
    np.zeros(3).view(np.ndarray)[:],  # a view: another object, the same kind
]


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(KIND_SAMPLES), st.sampled_from(KIND_SAMPLES))
def test_a_commit_counts_as_a_change_of_kind_exactly_when_a_weight_kind_changes(old: Any, new: Any) -> None:
    """``last_reshape`` moves at a commit iff it gives a weight data whose value key (type, shape,
    dtype) differs from its data's before: the check a replay skips while the count holds."""
    weights = [FloatWeight(1.0) for _ in range(2)]
    with versions.COMMIT_LOCK:
        versions.publish([(weight, old, None) for weight in weights])
        before = versions.last_reshape()
        versions.publish([(weights[0], old, None), (weights[1], new, None)])
    changed = value_key(old) != value_key(new)
    assert (versions.last_reshape() != before) == changed


def _nested_structure(loss: ArrayLayer | FloatLayer) -> tuple[Any, ...]:
    """A graph's structure written out nested, an entry a row (the primitive, its parameters as
    name-value pairs and its inputs' entries; a weight's or a constant's kind), to compare the
    executor's flat key against."""
    graph = loss.graph
    assert graph is not None
    rows = graph.postorder(loss.row, static=True)
    assert rows is not None
    order: dict[int, int] = {}
    entries: list[Any] = []
    for r in rows:
        obj = graph.objs[r]
        if isinstance(obj, Primitive):
            params = graph.params[r]
            pairs = tuple((k, value_key(v) if k in obj.per_run else v) for k, v in params.items())
            inputs = tuple(order[graph.args[k]] for k in range(graph.starts[r], graph.starts[r + 1]))
            entries.append((obj, pairs, inputs))
        elif type(obj) is float:
            entries.append(("f", obj, math.copysign(1.0, obj)))
        elif isinstance(obj, ArrayWeight):
            entries.append(("v", value_key(obj.data)))
        else:  # an array constant
            entries.append(("c", value_key(obj)))
        order[r] = len(entries) - 1
    return tuple(entries)


Steps = list[tuple[str, list[int], float]]

# A program: each step an op on earlier values (its index picks them, modulo how many there are).
STRUCTURE_STEPS = st.lists(
    st.tuples(
        st.sampled_from(["tanh", "scale", "add", "cat", "take"]),
        st.lists(st.integers(0, 7), min_size=1, max_size=3),
        st.sampled_from([2.0, 0.5, 0.0, -0.0]),
    ),
    min_size=1,
    max_size=6,
)


def _structure_program(steps: Steps, w: ArrayWeight, v: ArrayWeight) -> FloatLayer:
    """The graph of ``steps`` over two weights of shape (3,): every value of that shape."""
    values: list[ArrayLayer] = [w + 0.0, v + 0.0]
    for op, picks, c in steps:
        picked = [values[i % len(values)] for i in picks]
        if op == "tanh":
            values.append(ml.tanh(picked[0]))
        elif op == "scale":
            values.append(picked[0] * c)
        elif op == "add":
            values.append(picked[0] + picked[-1])
        elif op == "cat":  # 1 to 3 inputs, back to shape (3,)
            values.append(ml.take_rows(ml.concatenate(picked, axis=0), [0, 1, 2]))
        else:  # a per-run parameter: rows of the value's own length
            values.append(ml.take_rows(picked[0], [picks[0] % 3, 0, 2]))
    return ml.sum(values[-1])


@settings(max_examples=200, deadline=None)
@given(STRUCTURE_STEPS, st.data(), st.booleans())
def test_a_static_graphs_flat_key_is_equal_exactly_when_its_structure_is(
    first: Steps, data: st.DataObject, float32: bool
) -> None:
    """The executor keys a static graph's program by one flat tuple: two graphs' keys are equal iff
    their structures written out nested are (their ops, parameters and wiring; their weights' and
    constants' kinds; their float constants, 0.0 apart from -0.0), whatever ops of how many inputs
    they chain. Drawn as a program and another: the same program (another graph), or the program
    with one step's op, inputs or constant redrawn, or a program of its own; a weight of either
    float type."""
    second = list(first)
    change = data.draw(st.sampled_from(["none", "op", "inputs", "constant", "other"]))
    k = data.draw(st.integers(0, len(first) - 1))
    op, picks, c = first[k]
    if change == "op":
        second[k] = (data.draw(st.sampled_from(["tanh", "scale", "add", "cat", "take"])), picks, c)
    elif change == "inputs":
        second[k] = (op, data.draw(st.lists(st.integers(0, 7), min_size=1, max_size=3)), c)
    elif change == "constant":
        second[k] = (op, picks, data.draw(st.sampled_from([2.0, 0.5, 0.0, -0.0])))
    elif change == "other":
        second = data.draw(STRUCTURE_STEPS)
    dtype = np.float32 if float32 else np.float64
    w, v = ArrayWeight(np.ones(3)), ArrayWeight(np.full(3, 2.0, dtype=dtype))
    taken = versions.snapshot()
    a, b = _structure_program(first, w, v), _structure_program(second, w, v)
    assert a.graph is not None and b.graph is not None
    key_a, key_b = structure_of(a.graph, a.row, taken), structure_of(b.graph, b.row, taken)
    assert key_a is not None and key_b is not None
    assert (key_a.key == key_b.key) == (_nested_structure(a) == _nested_structure(b))
    if change == "none":
        assert key_a.key == key_b.key and hash(key_a.key) == hash(key_b.key)


def test_a_static_graphs_key_tells_apart_wirings_that_visit_the_same_rows() -> None:
    """Two graphs whose rows come in the same order, of the same ops, but read other inputs
    (``q + p`` and ``q + q``, where ``q = tanh(p)``): their keys differ, the inputs' places being
    part of them; the same wiring again keys equal."""
    w = ArrayWeight(np.ones(3))
    taken = versions.snapshot()

    def graph(second_input_is_p: bool) -> FloatLayer:
        p = ml.tanh(w)
        q = ml.tanh(p)
        return ml.sum(q + (p if second_input_is_p else q))

    keys = []
    for choice in (True, False, True):
        loss = graph(choice)
        assert loss.graph is not None
        structure = structure_of(loss.graph, loss.row, taken)
        assert structure is not None
        keys.append(structure.key)
    assert keys[0] != keys[1] and keys[0] == keys[2]
