"""Batchable operations (``@ml.batchable``, ``monadl.dsl.extend.operation``): a decorated function computes
what the plain function computes, merged or not; its calls merge by signature (the function, the
identity of its non-layer arguments, the rows' shapes and dtypes); weights it is given are shared,
not stacked; and the gradients of a merged run equal central finite differences.

An operation learns the structure of its result on its first call ever, which runs the body
directly; so each operation here is called once (the fixture ``learn_all``) before the calls that
must merge.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from batching_check import Gradients, assert_close, gradients_of
from hypothesis import given, settings
from hypothesis import strategies as st
from op_cases import F64, probe
from returns.result import Failure, Success

import monadl as ml
from monadl import ArrayLayer, ArrayWeight, FloatLayer, FloatWeight
from monadl.gradcheck import check_gradients

RNG = np.random.default_rng(20)
W = ArrayWeight(RNG.normal(size=(3, 3)))
B = ArrayWeight(RNG.normal(size=(3,)))
S = FloatWeight(0.7)


def rows(count: int, shape: tuple[int, ...] = (3,), seed: int = 0) -> list[F64]:
    rng = np.random.default_rng(seed)
    return [rng.normal(size=shape) for _ in range(count)]


# The operations under test, and their plain twins (the same body, undecorated).


def plain_dense(x: ArrayLayer | F64) -> ArrayLayer:
    return ml.tanh(ml.linear(x, W, B))


dense = ml.batchable(plain_dense)


def plain_gates(x: ArrayLayer | F64, h: ArrayLayer | F64) -> tuple[ArrayLayer, ArrayLayer]:
    z = ml.linear(ml.concatenate([x, h], axis=-1), WIDE, B)
    return ml.sigmoid(z) * h, ml.tanh(z)


WIDE = ArrayWeight(RNG.normal(size=(6, 3)))
gates = ml.batchable(plain_gates)


def plain_mix(a: FloatLayer, c: FloatLayer) -> FloatLayer:
    return ml.tanh(a * S + c) * c


mix = ml.batchable(plain_mix)


def plain_with_weight(x: ArrayLayer | F64, w: ArrayWeight) -> ArrayLayer:
    return ml.tanh(ml.linear(x, w, B))


with_weight = ml.batchable(plain_with_weight)


@dataclass(frozen=True)
class Cell:
    """A cell of weights whose node function is a batchable method."""

    w: ArrayWeight
    b: ArrayWeight

    @ml.batchable
    def step(self, x: ArrayLayer | F64) -> ArrayLayer:
        return ml.relu(ml.linear(x, self.w, self.b))


@pytest.fixture(autouse=True)
def learn_all() -> None:
    """Every operation above has had its first call (which learns the structure of its result and
    runs the body directly) before a test builds its graphs."""
    dense(np.ones(3))
    gates(np.ones(3), np.ones(3))
    mix(S * 1.0, S * 2.0)
    with_weight(np.ones(3), W)
    Cell(W, B).step(np.ones(3))


def assert_same(a: Gradients, b: Gradients) -> None:
    assert_close(a.value, b.value, "loss")
    assert set(a.gradients) == set(b.gradients)
    for w, g in b.gradients.items():
        assert_close(a.gradients[w], g, repr(w))


def assert_identical(a: Gradients, b: Gradients) -> None:
    """Bit for bit: the same kernels on the same data."""
    assert a.value == b.value
    assert set(a.gradients) == set(b.gradients)
    for w, g in b.gradients.items():
        np.testing.assert_array_equal(a.gradients[w], g, err_msg=repr(w))


def table(count: int, seed: int = 0) -> ArrayWeight:
    return ArrayWeight(np.random.default_rng(seed).normal(size=(count, 3)))


def table_rows(table: ArrayWeight) -> Iterator[ArrayLayer]:
    """The rows of ``table``, looked up one by one: layers that want a delta."""
    return (ml.take_rows(table, k) for k in range(table.data.shape[0]))


# ------------------------------------------------------------------------ the same as undecorated


def dense_loss(op: Callable[[Any], ArrayLayer], rows: ArrayWeight) -> FloatLayer:
    return ml.add_n([ml.sum(op(x) * probe((3,), k)) for k, x in enumerate(table_rows(rows))])


def test_merged_calls_equal_the_plain_function() -> None:
    xs = table(6)
    merged = gradients_of(dense_loss(dense, xs), batching=True)
    assert merged.stats.kinds["plain_dense"] == 1 and merged.stats.groups >= 1  # one run of the body
    assert merged.stats.kinds["linear"] == 1  # the body's linear: once, on 6 stacked rows
    assert_same(merged, gradients_of(dense_loss(plain_dense, xs), batching=False))


def test_with_batching_off_the_operation_is_the_plain_function_bit_for_bit() -> None:
    xs = table(6)
    off = gradients_of(dense_loss(dense, xs), batching=False)
    assert off.stats.groups == off.stats.merged == 0
    assert_identical(off, gradients_of(dense_loss(plain_dense, xs), batching=False))


def test_a_call_that_merges_with_nobody_runs_alone_as_the_plain_function() -> None:
    x = next(table_rows(table(1)))
    alone = gradients_of(ml.sum(dense(x)), batching=True)
    assert alone.stats.kinds["plain_dense"] == 1 and alone.stats.groups == 0
    assert_identical(alone, gradients_of(ml.sum(plain_dense(x)), batching=False))


def test_the_first_call_ever_is_recorded_as_every_call_is() -> None:
    # The first call learns the result's structure, and is an operation's call like the second:
    # a process's first run launches (and rounds) as every later one does.
    def plain(x: ArrayLayer) -> ArrayLayer:
        return ml.tanh(x) * 2.0

    fresh = ml.batchable(plain)
    first, second = fresh(W * 1.0), fresh(W * 1.0)
    executor = ml.Executor(batching=True)
    for layer in (first, second):
        result = layer.predict_blocking(executor=executor)
        assert isinstance(result, Success)
        np.testing.assert_array_equal(result.unwrap(), np.tanh(W.data) * 2.0)
        assert executor.last_stats.kinds.get(plain.__qualname__, 0) == 1


@pytest.mark.parametrize("executor", ["default", "unbatched", "unreplayed", "pool"])
def test_a_first_run_gives_the_bits_of_every_later_run(executor: str) -> None:
    # A fresh operation (its first call ever in this process) in a graph of calls that merge:
    # the first step's loss and gradients equal, bit for bit, those of the steps after it.
    weight = ArrayWeight(np.random.default_rng(3).normal(size=(3, 3)))

    def plain(x: ArrayLayer | F64) -> ArrayLayer:
        return ml.tanh(ml.linear(x, weight, B))

    fresh = ml.batchable(plain)
    ex = {
        "default": ml.Executor(),
        "unbatched": ml.Executor(batching=False),
        "unreplayed": ml.Executor(replay=False),
        "pool": ml.Executor(2, min_pool_cost=0),
    }[executor]
    xs = rows(8, seed=4)

    def step() -> tuple[float, F64, F64]:
        loss = ml.add_n([ml.sum(fresh(fresh(x)) * fresh(x)) for x in xs])
        value, gradients = ml.compute_gradients(loss, executor=ex)
        return value, np.asarray(gradients[weight]), np.asarray(gradients[B])

    try:
        first = step()
        for _ in range(3):
            later = step()
            assert later[0] == first[0]
            np.testing.assert_array_equal(later[1], first[1])
            np.testing.assert_array_equal(later[2], first[2])
    finally:
        ex.close()


def test_tuple_results_equal_the_plain_function_even_with_an_output_unused() -> None:
    xs, hs = table(5, seed=1), table(5, seed=2)

    def loss(op: Callable[[Any, Any], tuple[ArrayLayer, ArrayLayer]]) -> FloatLayer:
        terms = []
        for k, (x, h) in enumerate(zip(table_rows(xs), table_rows(hs), strict=True)):
            out, z = op(x, h)
            terms.append(ml.sum(out * probe((3,), k)))
            if k % 2:  # the other calls' second output is not on the path to the loss
                terms.append(ml.sum(z))
        return ml.add_n(terms)

    merged = gradients_of(loss(gates), batching=True)
    assert merged.stats.kinds["plain_gates"] == 1
    assert_same(merged, gradients_of(loss(plain_gates), batching=False))


def test_float_layer_results_equal_the_plain_function() -> None:
    def loss(op: Callable[[FloatLayer, FloatLayer], FloatLayer]) -> FloatLayer:
        return ml.add_n([op(S * (0.3 * k), ml.tanh(S * float(k - 2))) for k in range(5)])

    merged = gradients_of(loss(mix), batching=True)
    assert merged.stats.kinds["plain_mix"] == 1
    assert type(merged.value) is float and type(merged.gradients[S]) is float
    assert_same(merged, gradients_of(loss(plain_mix), batching=False))


def test_a_result_that_is_not_a_layer_raises_a_type_error_naming_the_function() -> None:
    @ml.batchable
    def not_a_layer(x: ArrayLayer) -> float:
        return 1.0

    @ml.batchable
    def weight_in_a_tuple(x: ArrayLayer) -> tuple[ArrayLayer, ArrayWeight]:
        return ml.tanh(x), W

    with pytest.raises(TypeError, match=r"batchable .*not_a_layer: must return a layer .* got float"):
        not_a_layer(W * 1.0)
    with pytest.raises(TypeError, match=r"batchable .*weight_in_a_tuple: .* got tuple"):
        weight_in_a_tuple(W * 1.0)


def test_rows_may_be_plain_numpy_arrays() -> None:
    xs = rows(4, (2, 3))  # each call's row is itself a (2, 3) array: stacked to (4, 2, 3)
    merged = gradients_of(ml.add_n([ml.sum(dense(x)) for x in xs]), batching=True)
    assert merged.stats.kinds["plain_dense"] == 1 and merged.stats.groups >= 1
    assert_same(merged, gradients_of(ml.add_n([ml.sum(plain_dense(x)) for x in xs]), batching=False))
    slopes = [1.0 - np.tanh(x @ W.data + B.data) ** 2 for x in xs]
    np.testing.assert_allclose(merged.gradients[B], np.sum(slopes, axis=(0, 1)), rtol=1e-12)


# ------------------------------------------------------------------------------------- signatures


def test_as_a_method_read_from_its_object_a_call_is_the_operations_with_the_object_first() -> None:
    """``cell.step(x)`` (the operation read from its object) records what ``Cell.step(cell, x)``
    does: their calls merge, and the results are the plain function's."""
    cell = Cell(W, B)
    bound = cell.step
    assert repr(bound) == f"<bound batchable(Cell.step) of {cell!r}>"
    xs = rows(4)
    via_object = [ml.sum(cell.step(x) * probe((3,), k)) for k, x in enumerate(xs[:2])]
    via_class = [ml.sum(Cell.step(cell, x) * probe((3,), k + 2)) for k, x in enumerate(xs[2:])]
    loss = ml.add_n(via_object + via_class)
    merged = gradients_of(loss, batching=True)
    assert merged.stats.kinds["Cell.step"] == 1  # the four calls, one launch
    unbound = inspect.unwrap(Cell.step)
    plain = ml.add_n([ml.sum(unbound(cell, x) * probe((3,), k)) for k, x in enumerate(xs)])
    assert_same(merged, gradients_of(plain, batching=False))


def test_as_a_method_the_bound_object_is_compared_by_identity() -> None:
    one, other = Cell(W, B), Cell(W, B)
    assert one == other  # equal dataclasses, but two objects: their calls do not merge
    xs = rows(6)

    def loss(cells: list[Cell], step: Callable[[Cell, Any], ArrayLayer]) -> FloatLayer:
        return ml.add_n(
            [
                ml.sum(step(cell, x) * probe((3,), k))
                for k, (cell, x) in enumerate(zip(cells, xs, strict=True))
            ]
        )

    cells = [one, other] * 3
    merged = gradients_of(loss(cells, lambda cell, x: cell.step(x)), batching=True)
    assert merged.stats.kinds["Cell.step"] == 2  # one launch per cell, each of its three calls
    unbound = inspect.unwrap(Cell.step)  # the plain function the decorator wraps
    assert_same(merged, gradients_of(loss(cells, unbound), batching=False))
    assert (
        gradients_of(loss([one] * 6, lambda cell, x: cell.step(x)), batching=True).stats.kinds["Cell.step"]
        == 1
    )


def test_calls_of_different_row_shapes_or_dtypes_do_not_merge() -> None:
    xs: list[Any] = [*rows(2), *rows(2, (2, 3)), np.ones(3, dtype=np.float32), np.zeros(3, dtype=np.float32)]
    merged = gradients_of(ml.add_n([ml.sum(dense(x)) for x in xs]), batching=True)
    assert merged.stats.kinds["plain_dense"] == 3  # (3,), (2, 3) and float32 (3,)
    assert_same(merged, gradients_of(ml.add_n([ml.sum(plain_dense(x)) for x in xs]), batching=False))


def test_a_row_argument_that_is_not_a_float_array_is_a_type_error_naming_the_function() -> None:
    dense(W * 1.0)  # not the first call: the operation has learnt its results
    with pytest.raises(TypeError, match="plain_dense: expected a floating-point array"):
        dense(np.ones(3, dtype=np.int64))


def test_keyword_arguments_are_part_of_the_signature() -> None:
    def plain(x: ArrayLayer | F64, *, scale: float) -> ArrayLayer:
        return ml.tanh(ml.linear(x, W, B)) * scale

    scaled = ml.batchable(plain)
    calls = [(x, 1.0 if k % 3 else 2.0) for k, x in enumerate(rows(6))]

    def loss(op: Callable[..., ArrayLayer]) -> FloatLayer:
        return ml.add_n([ml.sum(op(x, scale=scale) * probe((3,), k)) for k, (x, scale) in enumerate(calls)])

    scaled(W * 1.0, scale=1.0)  # the first call learns
    merged = gradients_of(loss(scaled), batching=True)
    assert merged.stats.kinds[plain.__qualname__] == 2  # scale 1.0 and scale 2.0
    assert_same(merged, gradients_of(loss(plain), batching=False))


def test_plain_values_of_different_types_do_not_merge_even_when_equal() -> None:
    def plain(x: ArrayLayer | F64, scale: float | int | bool) -> ArrayLayer:
        y = ml.tanh(ml.linear(x, W, B))
        return y * 2.0 if type(scale) is bool else y * float(scale)  # True, 1 and 1.0 are equal

    typed = ml.batchable(plain)
    scales: list[float | int | bool] = [True, 1, 1.0, True, 1, 1.0]

    def loss(op: Callable[..., ArrayLayer]) -> FloatLayer:
        return ml.add_n(
            [ml.sum(op(x, s) * probe((3,), k)) for k, (x, s) in enumerate(zip(rows(6), scales, strict=True))]
        )

    typed(W * 1.0, 1.0)  # the first call learns
    merged = gradients_of(loss(typed), batching=True)
    assert merged.stats.kinds[plain.__qualname__] == 3  # bool, int and float: three signatures
    assert_same(merged, gradients_of(loss(plain), batching=False))


def test_static_zero_and_minus_zero_do_not_merge() -> None:
    def plain(x: ArrayLayer | F64, scale: float) -> ArrayLayer:
        return ml.tanh(ml.linear(x, W, B)) * scale

    scaled = ml.batchable(plain)
    xs = [ArrayWeight(x) for x in rows(6)]
    outs = [scaled(x * 1.0, -0.0 if k % 2 else 0.0) for k, x in enumerate(xs)]
    loss = ml.sum(ml.concatenate(outs))
    executor, alone = ml.Executor(batching=True), ml.Executor(batching=False)
    forward = ml.concatenate(outs).predict_blocking(executor=executor).unwrap()
    assert executor.stats.kinds[plain.__qualname__] == 2  # one group per zero (0.0 == -0.0 in Python)
    expected = ml.concatenate(outs).predict_blocking(executor=alone).unwrap()
    assert np.array_equal(np.signbit(forward), np.signbit(expected))
    assert np.all(forward == 0.0) and np.any(np.signbit(forward)) and not np.all(np.signbit(forward))
    gradients = ml.compute_gradients(loss, executor=executor)[1]
    for x, g in ml.compute_gradients(loss, executor=alone)[1].items():
        assert np.array_equal(np.signbit(gradients[x]), np.signbit(g)), (gradients[x], g)


def test_calls_given_different_weights_do_not_merge() -> None:
    other = ArrayWeight(RNG.normal(size=(3, 3)))
    calls = [(x, W if k % 2 else other) for k, x in enumerate(rows(6))]
    merged = gradients_of(ml.add_n([ml.sum(with_weight(x, w)) for x, w in calls]), batching=True)
    assert merged.stats.kinds["plain_with_weight"] == 2
    assert_same(
        merged, gradients_of(ml.add_n([ml.sum(plain_with_weight(x, w)) for x, w in calls]), batching=False)
    )


def test_calls_with_their_rows_at_other_places_do_not_merge() -> None:
    # minus(x, W) and minus(W, x) have equal statics and rows: merged, the second would compute
    # the first's function of its arguments.
    @ml.batchable
    def minus(a: ArrayLayer | ArrayWeight | F64, b: ArrayLayer | ArrayWeight) -> ArrayLayer:
        return a - b

    minus(np.ones((3, 3)), W)  # its first call
    xs = [ml.take_rows(table(4), [k, k, k]) for k in range(4)]  # (3, 3) rows that want a delta
    calls = [minus(x, W) if k % 2 else minus(W, x) for k, x in enumerate(xs)]
    plain = [x - W if k % 2 else W - x for k, x in enumerate(xs)]

    def loss(values: list[ArrayLayer]) -> FloatLayer:
        return ml.add_n([ml.sum(v * probe((3, 3), k)) for k, v in enumerate(values)])

    merged = gradients_of(loss(calls), batching=True)
    assert merged.stats.kinds[minus.__qualname__] == 2  # one merged call of each order
    assert_same(merged, gradients_of(loss(plain), batching=False))


def _scale_of(s: object) -> float:
    """A distinct factor for each static argument of ``test_calls_share_...`` (each type its own)."""
    if s is None:
        return 5.0
    if isinstance(s, ArrayWeight):
        return float(np.sum(s.data))
    if type(s) is bool:
        return 2.0 if s else 3.0
    if type(s) is int:
        return float(s) + 0.25
    assert type(s) is float
    return s


_SHARED_FLOAT = 0.5  # one float object, passed again and again
_OTHER = ArrayWeight(RNG.normal(size=(3,)))
_STATICS: list[object] = [None, True, False, 0, 1, 2, _SHARED_FLOAT, W, _OTHER, 0.0, -0.0, float("nan")]


@settings(max_examples=80, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.one_of(
                st.sampled_from(
                    [None, True, False, 0, 1, 2, _SHARED_FLOAT, W, _OTHER, 0.0, -0.0, float("nan")]
                ),
                # new float objects, equal or not to an earlier one (0.5 again, as another object)
                st.sampled_from(["0.5", "-0.0", "0.0", "1.5", "nan"]).map(float),
            ),
            st.sampled_from(["row, static", "static, row", "row, row"]),
        ),
        min_size=1,
        max_size=8,
    )
)
def test_calls_with_the_static_arguments_of_the_last_one_compute_their_own(
    calls: list[tuple[object, str]],
) -> None:
    # A call whose static arguments are those of the operation's last call shares its record (its
    # Call); any other static argument, or a row where it had none (or none where it had one), is
    # a call of its own. Each call's result is the plain function's on its own arguments.
    def plain(a: Any, b: Any) -> ArrayLayer:
        if isinstance(b, (ArrayLayer, np.ndarray)):
            if isinstance(a, (ArrayLayer, np.ndarray)):
                return ml.tanh(a) * b
            a, b = b, a
        result: ArrayLayer = ml.tanh(a) * _scale_of(b)
        return result

    scaled = ml.batchable(plain)
    scaled(np.ones(3), None)  # its first call
    xs = [ml.take_rows(table(2 * len(calls), seed=3), k) for k in range(2 * len(calls))]
    outs, expected = [], []
    for k, (s, form) in enumerate(calls):
        x, y = xs[2 * k], xs[2 * k + 1]
        args = {"row, static": (x, s), "static, row": (s, x), "row, row": (x, y)}[form]
        outs.append(scaled(*args))
        expected.append(plain(*args))
    for batching in (True, False):
        got = ml.concatenate(outs).predict_blocking(executor=ml.Executor(batching=batching)).unwrap()
        want = ml.concatenate(expected).predict_blocking(executor=ml.Executor(batching=False)).unwrap()
        np.testing.assert_array_equal(got, want)  # (NaN where NaN)
        assert np.array_equal(np.signbit(got), np.signbit(want))


def test_a_tree_of_calls_of_equal_static_arguments_keeps_one_record_of_them() -> None:
    # A Tree-LSTM's cells: one Call kept for all of them (freed at once with the graph), not one
    # per call; a call of other static arguments gets its own.
    from monadl.do.graph import CALL

    cell = Cell(W, B)
    outs = [cell.step(x) for x in table_rows(table(6))]
    outs.append(Cell(W, B).step(outs[0]))  # an equal cell, but another object: its own signature
    graph = outs[0].graph
    assert graph is not None
    assert all(o.graph is graph and graph.tags[o.row] == CALL for o in outs)
    calls = [graph.objs[o.row] for o in outs]
    assert len(calls) == 7 and len({id(c) for c in calls}) == 2


def test_weights_given_as_arguments_are_shared_not_stacked() -> None:
    xs = rows(8)
    loss = ml.add_n([ml.sum(with_weight(x, W)) for x in xs])
    merged = gradients_of(loss, batching=True)
    assert merged.stats.kinds["plain_with_weight"] == 1
    # The body ran once: one vjp gave W its delta, one gave B (the rows are constants: none for them).
    assert merged.stats.vjps["linear"] == 2 and merged.stats.backwards["weight"] == 2
    alone = gradients_of(loss, batching=False)
    assert alone.stats.vjps["linear"] == 2 * 8  # one per call and weight
    assert alone.stats.backwards["weight"] == 2  # each weight's summed delta, once
    assert_same(merged, alone)
    slopes = [1.0 - np.tanh(x @ W.data + B.data) ** 2 for x in xs]
    expected = sum(np.outer(x, d) for x, d in zip(xs, slopes, strict=True))
    np.testing.assert_allclose(merged.gradients[W], expected, rtol=1e-12)


# ------------------------------------------------------------------------- gradients of a merged run


@pytest.fixture
def batching_executor() -> Iterator[ml.Executor]:
    """A fresh default executor with batching on (the gradient checker runs on the default)."""
    previous = ml.default_executor()  # made now if it was not yet, so that it can be put back
    executor = ml.Executor(batching=True)
    ml.set_default_executor(executor)
    try:
        yield executor
    finally:
        ml.set_default_executor(previous)


def test_gradients_of_merged_calls_equal_central_finite_differences(batching_executor: ml.Executor) -> None:
    def loss(table: ArrayWeight, w: ArrayWeight, s: FloatWeight) -> FloatLayer:
        terms = []
        for k in range(4):
            x = ml.take_rows(table, k)
            out, z = gates(x, with_weight(x, w))  # two merged operations, one feeding the other
            terms.append(ml.sum(out * probe((3,), k)) + ml.sum(z) * s)
            terms.append(mix(s * (0.2 * k), ml.sum(z)))
        return ml.add_n(terms)

    rng = np.random.default_rng(5)
    check_gradients(loss, rng.normal(size=(4, 3)), rng.normal(size=(3, 3)), 0.4)
    kinds = batching_executor.stats.kinds
    # The gradients' two runs (the second to check a replay) and the checker's two forward runs per
    # input element (4 * 3 + 3 * 3 + 1) each ran every operation once, on the four calls merged.
    runs = 2 + 2 * (4 * 3 + 3 * 3 + 1)
    assert kinds["plain_gates"] == kinds["plain_with_weight"] == kinds["plain_mix"] == runs, kinds
    assert batching_executor.stats.groups >= 3 * runs


# ------------------------------------------------------------ calls that cannot merge as rows

_MODES: dict[str, Callable[[], ml.Executor]] = {
    "merged": ml.Executor,
    "unbatched": lambda: ml.Executor(batching=False),
}


@ml.batchable
def _scaled(a: FloatLayer, x: ArrayLayer) -> ArrayLayer:
    return x * a  # a float row against a vector row: they broadcast per call, not stacked


@pytest.mark.parametrize("mode", _MODES)
@pytest.mark.parametrize("calls", [4, 5])  # 4 calls of 4-vectors: stacked, they would broadcast wrongly
def test_calls_whose_rows_differ_in_rank_give_their_own_results(mode: str, calls: int) -> None:
    s = FloatWeight(1.0)
    xs = [np.arange(4.0) + i for i in range(calls)]
    loss = ml.add_n([ml.sum(_scaled(s * float(i), ml.lift_array(xs[i]))) for i in range(calls)])
    value, gradients = ml.compute_gradients(loss, executor=_MODES[mode]())
    expected = sum(float(i * xs[i].sum()) for i in range(calls))
    assert value == pytest.approx(expected, rel=1e-12)
    assert gradients[s] == pytest.approx(expected, rel=1e-12)  # linear in s, at s = 1


@ml.batchable
def _total(x: ArrayLayer) -> FloatLayer:
    return ml.sum(ml.tanh(x))  # over every axis: on stacked rows, the rows' axis too


@pytest.mark.parametrize("mode", ["merged"])
def test_a_body_that_reduces_the_rows_away_is_named(mode: str) -> None:
    _total(ml.lift_array(np.zeros(3)))  # its first call learns the result's structure: not a call node
    loss = ml.add_n([_total(ml.lift_array(np.full(3, float(i)))) for i in range(6)])
    result = loss.predict_blocking(executor=_MODES[mode]())
    assert isinstance(result, Failure)
    assert str(result.failure()) == (
        "batchable _total: run once on the stacked rows of 6 calls, its body gave result 0 of shape "
        "float, not 6 rows: the body must keep a leading axis of rows (reduce and concatenate along "
        "axis=-1, not over every axis)"
    )
    unbatched = loss.predict_blocking(executor=_MODES["unbatched"]()).unwrap()  # each call alone: fine
    assert unbatched == pytest.approx(sum(3 * np.tanh(float(i)) for i in range(6)), rel=1e-12)


# Bodies whose ops would mix the calls' rows when run once on them stacked. Each keeps the shape of
# a row (3 calls of (3,) vectors: ``mean(axis=0)`` of the stack is a (3,) array, which splits into
# 3 rows), so only the ops themselves tell: the group is refused, naming the op. ``x[0]`` is a
# lookup of row 0 (``take_rows``).
_MIX = ml.ArrayWeight(np.linspace(-1.0, 1.0, 3))


@ml.batchable
def _mean_over_axis_0(x: ArrayLayer) -> ArrayLayer:
    return ml.mean(ml.tanh(x * _MIX), axis=0)


@ml.batchable
def _first_entry(x: ArrayLayer) -> ArrayLayer:
    return ml.tanh(x * _MIX)[0]


@ml.batchable
def _times_a_matrix(x: ArrayLayer) -> ArrayLayer:
    return ml.sum(x * np.ones((3, 3)), axis=-1)


@ml.batchable
def _mean_over_the_last_axis(x: ArrayLayer) -> ArrayLayer:
    return ml.mean(ml.tanh(x * _MIX), axis=-1)


@ml.batchable
def _last_entry(x: ArrayLayer) -> ArrayLayer:
    return ml.tanh(x * _MIX)[..., -1]


def _loss_of(body: Callable[[ArrayLayer], ArrayLayer]) -> FloatLayer:
    return ml.add_n([ml.sum(body(ml.lift_array(np.array([0.1, 0.2, 0.3]) * (i + 1)))) for i in range(3)])


@pytest.mark.parametrize(
    ("body", "op"),
    [
        (_mean_over_axis_0, "mean(axis=0)"),
        (_first_entry, "take_rows (which reads its operand 0 whole)"),
        (_times_a_matrix, "mul of operands of ranks (2, 2)"),
    ],
)
def test_a_body_whose_op_mixes_rows_of_the_right_shape_is_refused_naming_the_op(
    body: Callable[[ArrayLayer], ArrayLayer], op: str
) -> None:
    loss = _loss_of(body)
    result = loss.predict_blocking(executor=_MODES["merged"]())
    assert isinstance(result, Failure)
    assert f"its body's {op} mixes them" in str(result.failure())
    assert isinstance(loss.predict_blocking(executor=_MODES["unbatched"]()), Success)  # each call alone: fine


@pytest.mark.parametrize("body", [_mean_over_the_last_axis, _last_entry])
def test_a_body_that_keeps_the_rows_gives_batched_what_its_calls_give_alone(
    body: Callable[[ArrayLayer], ArrayLayer],
) -> None:
    loss = _loss_of(body)
    merged = loss.predict_blocking(executor=_MODES["merged"]()).unwrap()
    assert merged == pytest.approx(loss.predict_blocking(executor=_MODES["unbatched"]()).unwrap(), rel=1e-12)


# A weight read only inside a body has its own optimizer: it is among the step's weights and trains by
# that optimizer, as it does without @batchable.


@pytest.mark.parametrize(
    "own",
    [ml.SGD(0.5), ml.Adam(0.1), ml.Adagrad(0.3), ml.Momentum(0.2, 0.9)],
    ids=lambda o: type(o).__name__,
)
@pytest.mark.parametrize("decorated", [True, False], ids=["batchable", "plain"])
def test_a_weight_with_its_own_optimizer_inside_a_body_is_moved_by_that_optimizer(
    own: Any, decorated: bool
) -> None:
    rng = np.random.default_rng(3)
    inner = ArrayWeight(rng.normal(size=(3, 3)), optimizer=own)
    outer = ArrayWeight(rng.normal(size=(3,)))
    xs = rows(4)

    def cell(x: ArrayLayer | F64) -> ArrayLayer:
        return ml.tanh(ml.linear(x, inner, np.zeros(3)))

    body = ml.batchable(cell) if decorated else cell
    default = ml.SGD(0.05)
    for _ in range(2):
        loss = ml.sum(ml.concatenate([body(x) * outer for x in xs], axis=-1))
        _, grads = ml.compute_gradients(loss)
        held = inner.optimizer_state
        state = own.init(inner.data) if held is None else held[1]
        expected_inner, _ = own.update(inner.data, grads[inner], state)
        expected_outer = outer.data - 0.05 * grads[outer]
        assert isinstance(ml.train_blocking(loss, default), Success)
        np.testing.assert_allclose(inner.data, expected_inner, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(outer.data, expected_outer, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("batching", [True, False], ids=["batching on", "batching off"])
def test_a_body_is_recorded_once_per_signature_and_replayed_as_documented(batching: bool) -> None:
    ran: list[int] = []

    def counted(x: ArrayLayer | F64) -> ArrayLayer:
        ran.append(1)  # Python in the body: runs when a signature is recorded, not per call
        return ml.tanh(x * 2.0)

    op = ml.batchable(counted)
    executor = ml.Executor(batching=batching)
    xs = rows(3)
    for _ in range(3):
        value = predict_with(ml.concatenate([op(x) for x in xs], axis=-1), executor)
        np.testing.assert_allclose(value, np.tanh(np.concatenate(xs) * 2.0))
    first = len(ran)
    for _ in range(3):
        predict_with(ml.concatenate([op(x) for x in xs], axis=-1), executor)
    assert len(ran) == first  # replayed: the body's Python ran for none of these calls
    predict_with(op(rows(1, shape=(5,))[0]), executor)  # a new signature is recorded
    assert len(ran) > first


def predict_with(layer: ArrayLayer, executor: ml.Executor) -> Any:
    result = layer.predict_blocking(executor=executor)
    assert isinstance(result, Success)
    return result.unwrap()
