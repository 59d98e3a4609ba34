"""Reference counting: each node's backward runs exactly once per step, with the summed delta.

The counts are the executor's statistics (``RunStats.backwards``: backward passes through a node,
by op; ``RunStats.vjps``: vjp kernels, by op), on a step's forward and backward runs together."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from peak_memory import assert_one_summed_delta

import monadl as ml
from monadl.do.do import Do, Pure
from monadl.do.primitive import Primitive
from monadl.do.stats import Counts, kind_number
from monadl.do.tape import Tape
from monadl.dsl.core.layers import apply_array
from monadl.dsl.ops.operators import MUL


def gradients(loss: ml.FloatLayer) -> tuple[Any, dict[Any, Any], ml.do.RunStats]:
    executor = ml.Executor()
    value, grads = ml.compute_gradients(loss, executor=executor)
    return value, grads, executor.last_stats


@pytest.mark.parametrize("depth", [1, 2, 5, 10, 20, 30])
def test_multiplicative_diamond_chain(depth: int) -> None:
    """y0 = x*w, y_{i+1} = y_i * y_i: 2^depth paths from the loss to w, depth+1 backward calls."""
    w = ml.FloatWeight(1.0)
    x = 1.0
    y = w * x
    for _ in range(depth):
        y = y * y
    loss, grads, stats = gradients(y)
    assert loss == 1.0
    # y = (x*w)^(2^depth): dy/dw = 2^depth * x^(2^depth) * w^(2^depth - 1) = 2^depth at x = w = 1.
    assert grads[w] == 2.0**depth
    assert stats.backwards["mul"] == depth + 1
    # Each delta is computed once however many paths share it: one vjp kernel per (op, input).
    assert stats.vjps["mul"] == 1 + 2 * depth
    assert stats.backwards["weight"] == 1


@pytest.mark.parametrize("depth", [1, 10, 30])
def test_additive_diamond_chain(depth: int) -> None:
    """y0 = x*w, y_{i+1} = y_i + y_i: y = 2^depth * x * w, so dy/dw = 2^depth * x."""
    w = ml.ArrayWeight(np.array([0.5, -1.5]))
    x = np.array([3.0, 2.0])
    y: ml.ArrayLayer = w * x
    for _ in range(depth):
        y = y + y
    loss, grads, stats = gradients(ml.sum(y))
    assert loss == pytest.approx(2.0**depth * float(np.sum(x * w.data)))
    np.testing.assert_array_equal(grads[w], 2.0**depth * x)
    assert stats.backwards["add"] == depth
    assert stats.vjps["add"] == 2 * depth
    assert stats.backwards["mul"] == 1
    assert stats.backwards["sum"] == 1
    assert stats.backwards["weight"] == 1


def test_a_weight_used_k_times_fires_once_with_the_summed_delta() -> None:
    w = ml.FloatWeight(2.0)
    loss = w * 1.0 + w * 2.0 + w * 3.0 + w * w  # d/dw = 1 + 2 + 3 + 2w = 10
    _, grads, stats = gradients(loss)
    assert grads[w] == 10.0
    assert stats.backwards["weight"] == 1


def test_nodes_off_the_path_to_the_loss_give_no_delta() -> None:
    """A node computed but not used by the loss (a dangling consumer) gives its inputs no delta, and
    does not hold up the backward pass of the nodes it consumed: only the nodes on the path to the
    loss run their vjps, each once."""
    w = ml.FloatWeight(3.0)
    shared = w * w
    unused = ml.exp(shared) * 2.0  # consumes `shared`, but the loss ignores it

    @ml.direct
    async def loss_fn() -> ml.FloatLayer:
        await unused  # evaluated (for control flow, say), but not differentiated
        return shared + 1.0

    _, grads, stats = gradients(loss_fn())
    assert grads[w] == 6.0  # d(w*w + 1)/dw
    assert stats.kinds["exp"] == 1 and stats.kinds["mul"] == 2  # all of it ran forward
    assert stats.backwards["mul"] == 1  # `shared`; the dangling `unused` received no delta
    assert "exp" not in stats.backwards and "exp" not in stats.vjps  # its vjp is never built
    assert stats.backwards["weight"] == 1


def test_literal_deltas_are_never_computed() -> None:
    """A literal's backward ignores its delta, so the kernel that would compute it never runs."""
    computed: list[int] = []
    original = MUL.vjps

    w = ml.ArrayWeight(np.ones(3))
    literal = np.full(3, 2.0)

    def recording(i: int) -> Any:
        def vjp(*args: Any) -> Any:
            computed.append(i)
            return original[i](*args)

        return vjp

    prim = Primitive("mul", MUL.forward, (recording(0), recording(1)), True)
    _, grads = ml.compute_gradients(ml.sum(apply_array(prim, w, literal)))
    np.testing.assert_array_equal(grads[w], literal)
    assert computed == [0]  # the weight's delta only; the literal's was never computed


def test_a_literal_tape_needs_no_delta() -> None:
    tape: Tape[float, float] = Tape(1.0)
    assert not tape.requires_delta
    assert tape.backward(ml.pure(5.0)) is ml.do.UNIT


class Doubled(Tape[Any, Any]):
    """A tape of the user's own (DeepLearning.scala's plugin style): twice its input, whose tape it
    acquires, and to which its backward gives twice its delta. It counts the protocol's calls."""

    requires_delta = True

    def __init__(self, source: Tape[Any, Any], log: list[str]) -> None:
        super().__init__(source.data * 2.0)
        self.source = source
        self.log = log
        source.acquire()

    def acquire(self) -> None:
        self.log.append("acquire")

    def backward(self, delta: Do[Any]) -> Do[None]:
        self.log.append("backward")
        return self.source.backward(delta.map(lambda d: d * 2.0))

    def release(self) -> Do[None]:
        self.log.append("release")
        return self.source.release()


@pytest.mark.parametrize("batching", [False, True])
def test_a_tape_of_the_users_own_is_acquired_once_and_given_one_summed_delta(batching: bool) -> None:
    w = ml.ArrayWeight(np.array([1.0, -2.0]))
    log: list[str] = []
    doubled = ml.ArrayLayer((w * 3.0).forward.map(lambda t: Doubled(t, log)))  # 6 w
    loss = ml.sum(doubled * doubled) + ml.sum(doubled)  # d/dw = (2 * 6w + 1) * 6, read three times
    _, grads = ml.compute_gradients(loss, executor=ml.Executor(batching=batching))
    np.testing.assert_allclose(grads[w], (12.0 * w.data + 1.0) * 6.0)
    assert log == ["acquire", "backward"]  # however many ops read it


def test_a_tape_of_the_users_own_off_the_path_is_released() -> None:
    w = ml.ArrayWeight(np.array([1.0, -2.0]))
    log: list[str] = []
    doubled = ml.ArrayLayer((w * 3.0).forward.map(lambda t: Doubled(t, log)))
    unused = ml.sum(doubled)

    @ml.direct
    async def loss_fn() -> ml.FloatLayer:
        await unused
        return ml.sum(w * w)

    _, grads = ml.compute_gradients(loss_fn())
    np.testing.assert_allclose(grads[w], 2.0 * w.data)
    assert log == ["acquire", "release"]


def test_a_tape_of_a_run_given_back_by_user_code_is_its_node() -> None:
    """A tape handed back by a map (the same object) stands for its node's value: the node runs
    once, and its delta reaches the weight."""
    w = ml.ArrayWeight(np.array([0.5, 2.0]))
    seen: list[Any] = []

    def look(t: Tape[Any, Any]) -> Tape[Any, Any]:
        seen.append(t.data.copy())
        return t

    looked = ml.ArrayLayer((w * w).forward.map(look))
    _, grads, stats = gradients(ml.sum(looked) + ml.sum(looked * 2.0))
    np.testing.assert_allclose(grads[w], 3.0 * 2.0 * w.data)
    assert len(seen) == 1 and stats.kinds["mul"] == 2  # w * w once; looked * 2.0 once


def test_a_constant_root_has_no_gradients() -> None:
    loss = ml.FloatLayer(Pure(Tape(2.5)))
    value, grads = ml.compute_gradients(loss)
    assert value == 2.5 and grads == {}


def test_a_weight_used_many_times_does_not_hold_all_its_deltas_at_once() -> None:
    """The deltas of a node are summed as they are computed, so memory stays near one delta's size
    however many times the weight is used (it was uses x size)."""
    assert_one_summed_delta()


@given(
    first=st.lists(st.integers(0, 40), max_size=30),
    second=st.lists(st.integers(0, 40), max_size=30),
)
def test_counts_added_are_the_counts_of_both(first: list[int], second: list[int]) -> None:
    """``Counts.add`` (a body's counts into its run's, each time it runs) gives the counts that
    tallying both lists into one would, by kind name."""
    names = [f"kind {k}" for k in range(41)]
    numbers = [kind_number(name) for name in names]
    one, two, both = Counts(), Counts(), Counts()
    for k in first:
        one.tally(numbers[k])
        both.tally(numbers[k])
    for k in second:
        two.tally(numbers[k])
        both.tally(numbers[k])
    one.add(two)
    expected = {names[k]: (first + second).count(k) for k in set(first + second)}
    assert one.by_name() == both.by_name() == expected
    assert two.copy().by_name() == {names[k]: second.count(k) for k in set(second)}
