"""Reference counting: each node's backward runs exactly once per step, with the summed delta."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from peak_memory import assert_one_summed_delta

import monadl as ml
from monadl.dsl.apply import OpTape
from monadl.dsl.weights import WeightTape
from monadl.tape.shared import SharedTape
from monadl.tape.tape import Tape


@pytest.fixture(autouse=True)
def executor_path() -> Iterator[None]:
    """These tests are about tapes: their steps run on the executor, where tapes are made (a static
    graph would otherwise run as a list of ops, ``monadl.dsl.straight``: see tests/test_straight)."""
    previous = ml.set_default_executor(ml.Executor(planning=False))
    yield
    ml.set_default_executor(previous)


@pytest.fixture
def backward_calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[Counter[str]]:
    """Counts backward runs per op name (and 'weight'), by wrapping the tapes' ``_backward``."""
    calls: Counter[str] = Counter()
    op_backward = OpTape._backward
    weight_backward = WeightTape._backward
    op_vjp = OpTape.vjp

    def counting_vjp(self: OpTape, i: int, delta: Any) -> Any:
        calls[f"{self.prim.name} vjp"] += 1
        return op_vjp(self, i, delta)

    def counting_op(self: OpTape, delta: ml.Do[Any]) -> ml.Do[None]:
        calls[self.prim.name] += 1
        return op_backward(self, delta)

    def counting_weight(self: WeightTape, delta: ml.Do[Any]) -> ml.Do[None]:
        calls["weight"] += 1
        return weight_backward(self, delta)

    monkeypatch.setattr(OpTape, "_backward", counting_op)
    monkeypatch.setattr(OpTape, "vjp", counting_vjp)
    monkeypatch.setattr(WeightTape, "_backward", counting_weight)
    yield calls


@pytest.mark.parametrize("depth", [1, 2, 5, 10, 20, 30])
def test_multiplicative_diamond_chain(backward_calls: Counter[str], depth: int) -> None:
    """y0 = x*w, y_{i+1} = y_i * y_i: 2^depth paths from the loss to w, depth+1 backward calls."""
    w = ml.FloatWeight(1.0)
    x = 1.0
    y = w * x
    for _ in range(depth):
        y = y * y
    loss, gradients = ml.compute_gradients(y)
    assert loss == 1.0
    # y = (x*w)^(2^depth): dy/dw = 2^depth * x^(2^depth) * w^(2^depth - 1) = 2^depth at x = w = 1.
    assert gradients[w] == 2.0**depth
    assert backward_calls["mul"] == depth + 1
    # Each delta is computed once however many paths share it: one vjp kernel per (op, input).
    assert backward_calls["mul vjp"] == 1 + 2 * depth
    assert backward_calls["weight"] == 1


@pytest.mark.parametrize("depth", [1, 10, 30])
def test_additive_diamond_chain(backward_calls: Counter[str], depth: int) -> None:
    """y0 = x*w, y_{i+1} = y_i + y_i: y = 2^depth * x * w, so dy/dw = 2^depth * x."""
    w = ml.ArrayWeight(np.array([0.5, -1.5]))
    x = np.array([3.0, 2.0])
    y: ml.ArrayLayer = w * x
    for _ in range(depth):
        y = y + y
    loss, gradients = ml.compute_gradients(ml.sum(y))
    assert loss == pytest.approx(2.0**depth * float(np.sum(x * w.data)))
    np.testing.assert_array_equal(gradients[w], 2.0**depth * x)
    assert backward_calls["add"] == depth
    assert backward_calls["add vjp"] == 2 * depth
    assert backward_calls["mul"] == 1
    assert backward_calls["sum"] == 1
    assert backward_calls["weight"] == 1


def test_a_weight_used_k_times_fires_once_with_the_summed_delta(backward_calls: Counter[str]) -> None:
    w = ml.FloatWeight(2.0)
    loss = w * 1.0 + w * 2.0 + w * 3.0 + w * w  # d/dw = 1 + 2 + 3 + 2w = 10
    _, gradients = ml.compute_gradients(loss)
    assert gradients[w] == 10.0
    assert backward_calls["weight"] == 1


def test_nodes_off_the_path_to_the_loss_still_release_their_inputs(
    backward_calls: Counter[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A node computed but not used by the loss (a dangling consumer) must not block the backward
    pass of the nodes it consumed: every tape fires exactly once, and only the tapes on the path to
    the loss build vjps."""
    fired: Counter[int] = Counter()
    fire = SharedTape._fire

    def counting_fire(self: SharedTape[Any, Any]) -> ml.Do[None]:
        fired[id(self)] += 1
        return fire(self)

    monkeypatch.setattr(SharedTape, "_fire", counting_fire)
    w = ml.FloatWeight(3.0)
    shared = w * w
    unused = ml.exp(shared) * 2.0  # consumes `shared`, but the loss ignores it

    @ml.direct
    async def loss_fn() -> ml.FloatLayer:
        await unused  # evaluated (for control flow, say), but not differentiated
        return shared + 1.0

    _, gradients = ml.compute_gradients(loss_fn())
    assert gradients[w] == 6.0  # d(w*w + 1)/dw
    assert sorted(fired.values()) == [1] * 5  # w, shared, exp, unused, and the loss's add
    assert backward_calls["mul"] == 1  # `shared`; the dangling `unused` received no delta
    assert backward_calls["exp"] == 0  # no delta reached it: its vjp is never built
    assert backward_calls["weight"] == 1


def test_literal_deltas_are_never_computed() -> None:
    """A literal's backward ignores its delta, so the kernel that would compute it never runs."""
    computed: list[int] = []
    original = ml.dsl.primitives.mul.vjps

    w = ml.ArrayWeight(np.ones(3))
    literal = np.full(3, 2.0)

    def recording(i: int) -> Callable[..., Any]:
        def vjp(*args: Any) -> Any:
            computed.append(i)
            return original[i](*args)

        return vjp

    prim = ml.dsl.primitives.Primitive(
        "mul", ml.dsl.primitives.mul.forward, (recording(0), recording(1)), True
    )
    from monadl.dsl.layers import apply_array

    _, gradients = ml.compute_gradients(ml.sum(apply_array(prim, w, literal)))
    np.testing.assert_array_equal(gradients[w], literal)
    assert computed == [0]  # the weight's delta only; the literal's was never computed


def test_a_tape_released_more_often_than_acquired_is_an_error() -> None:
    tape = WeightTape(ml.FloatWeight(1.0), None)
    tape.acquire()
    tape.release()
    with pytest.raises(RuntimeError, match="released more often than acquired"):
        tape.release()


def test_a_literal_tape_needs_no_delta() -> None:
    tape: Tape[float, float] = Tape(1.0)
    assert not tape.requires_delta
    assert tape.backward(ml.pure(5.0)) is ml.do.UNIT


def test_a_weight_used_many_times_does_not_hold_all_its_deltas_at_once() -> None:
    """The deltas of a shared tape are summed as they are computed (a left fold), so memory stays
    near one delta's size however many times the weight is used (it was uses x size)."""
    assert_one_summed_delta()  # on the default executor: the executor's path (see executor_path)
