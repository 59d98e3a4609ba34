"""The fused CuPy kernels (``monadl.dsl.fused``) without a GPU, and a step's device reads.

A stand-in ``cupy`` module (an ndarray subclass, and an ``ElementwiseKernel`` that reads back the
CUDA text it is given and runs it with NumPy) takes the place of CuPy: an optimizer's update and an
activation's rule take their fused branch on its arrays, and must give the NumPy rule's values bit
for bit (the kernels do the same operations in the same order, each in the arrays' type). Without
CuPy, and for NumPy or array-api-strict arrays, no fused branch is taken.

A step's finite checks and a global norm's sums, off NumPy, are read from the device once per
step, not once per weight: counted on array-api-strict, where ``bool()`` and ``float()`` of an
array are those reads.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable, Iterator
from typing import Any

import array_api_strict as xps
import numpy as np
import pytest
from returns.pipeline import is_successful

import monadl as ml
from monadl.dsl import fused
from monadl.dsl.learning.training import commit_gradients
from monadl.dsl.ops import activations
from monadl.dsl.ops.activations import SIGMOID, TANH, sigmoid_of


class FakeCupyArray(np.ndarray):
    """The stand-in CuPy's arrays."""


def _fake(x: Any) -> Any:
    return np.asarray(x).copy().view(FakeCupyArray)


class FakeKernel:
    """``cupy.ElementwiseKernel`` on the CPU: the parameter lists and the CUDA body it is given,
    read back and run with NumPy (a ``T name = ...;`` temporary, an ``out = ...;`` output)."""

    made: list[str] = []  # noqa: RUF012 - the kernels made, by name, in order

    def __init__(self, in_params: str, out_params: str, operation: str, name: str, **options: Any) -> None:
        assert options == {"options": ("--fmad=false",)}
        self.inputs = [self._param(p) for p in in_params.split(", ")]
        self.outputs = [self._param(p) for p in out_params.split(", ")]
        self.statements = []
        for line in operation.splitlines():
            assert line.endswith(";"), line
            statement = line[:-1].removeprefix("T ")
            assert statement.partition(" = ")[0] in self.outputs or line.startswith("T "), line
            self.statements.append(statement)
        FakeKernel.made.append(name)

    @staticmethod
    def _param(text: str) -> str:
        kind, name = text.split()
        assert kind == "T", text
        return name

    def __call__(self, *args: Any) -> Any:
        assert len(args) == len(self.inputs)
        kind = next(a for a in args if isinstance(a, FakeCupyArray)).dtype.type
        for a in args:  # the scalars are given in the arrays' type, the arrays are of it
            assert type(a) is kind or (type(a) is FakeCupyArray and a.dtype.type is kind), type(a)
        values: dict[str, Any] = {"T": kind, "sqrt": np.sqrt, "exp": np.exp, "tanh": np.tanh}
        values.update((name, np.asarray(a)) for name, a in zip(self.inputs, args, strict=True))
        for statement in self.statements:
            target, _, expression = statement.partition(" = ")
            values[target] = eval(expression, {"__builtins__": {}}, values)
        shape = np.broadcast_shapes(*(np.shape(a) for a in args))
        out = [_fake(np.broadcast_to(np.asarray(values[n], dtype=kind), shape)) for n in self.outputs]
        return tuple(out) if len(out) > 1 else out[0]


@pytest.fixture
def fake_cupy(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The stand-in CuPy in ``sys.modules``; yields the names of the kernels made."""
    module = types.ModuleType("cupy")
    module.ndarray = FakeCupyArray  # type: ignore[attr-defined]
    module.ElementwiseKernel = FakeKernel  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "cupy", module)
    monkeypatch.setattr(fused, "_COMPILED", {})
    FakeKernel.made = []
    yield FakeKernel.made


RNG = np.random.default_rng(0)


def _arrays(dtype: Any, shape: tuple[int, ...] = (3, 5)) -> tuple[Any, Any]:
    return RNG.normal(size=shape).astype(dtype), RNG.normal(size=shape).astype(dtype)


def _same(a: Any, b: Any) -> None:
    """Equal values of equal type (both None, both ints, or arrays equal bit for bit)."""
    if a is None or isinstance(a, int):
        assert a == b
        return
    assert type(a) is FakeCupyArray and a.dtype == b.dtype and a.shape == b.shape
    np.testing.assert_array_equal(np.asarray(a), b, strict=True)


def _state_as_fake(state: Any) -> Any:
    if isinstance(state, tuple):
        return tuple(_state_as_fake(s) for s in state)
    return _fake(state) if isinstance(state, np.ndarray) else state


OPTIMIZERS: list[Any] = [
    ml.SGD(0.1),
    ml.SGD(0.1, weight_decay=0.01),
    ml.Momentum(0.1, 0.9),
    ml.Momentum(0.1, 0.9, weight_decay=0.01),
    ml.Adam(0.01),
    ml.Adam(0.01, weight_decay=0.01),
    ml.AdamW(0.01),
    ml.AdamW(0.01, weight_decay=0.0),
    ml.Adagrad(0.1),
    ml.Adagrad(0.1, weight_decay=0.01),
    *(
        ml.RMSprop(0.01, centered=centered, momentum=momentum, weight_decay=wd)
        for centered in (False, True)
        for momentum in (0.0, 0.9)
        for wd in (0.0, 0.01)
    ),
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("optimizer", OPTIMIZERS, ids=repr)
def test_a_fused_update_is_the_rule_bit_for_bit(optimizer: Any, dtype: Any, fake_cupy: list[str]) -> None:
    data, gradient = _arrays(dtype)
    state = optimizer.init(data)
    for _ in range(3):  # from the first update (momentum's velocity, RMSprop's mean made) on
        expected_data, expected_state = optimizer.update(data, gradient, state)
        made = len(fake_cupy)
        new, new_state = optimizer.update(_fake(data), _fake(gradient), _state_as_fake(state))
        assert len(fake_cupy) <= max(made, 1) + 1  # a kernel made at most once per variant
        _same(new, expected_data)
        for mine, theirs in zip(
            new_state if isinstance(new_state, tuple) else (new_state,),
            expected_state if isinstance(expected_state, tuple) else (expected_state,),
            strict=True,
        ):
            _same(mine, theirs)
        data, state = expected_data, expected_state
        gradient = RNG.normal(size=data.shape).astype(dtype)
    assert fake_cupy, "the fused branch was taken"


def test_a_chain_clips_then_runs_the_fused_update(fake_cupy: list[str]) -> None:
    optimizer = ml.chain(ml.clip_by_value(0.5), ml.Adam(0.01))
    data, gradient = _arrays(np.float32)
    (clipped,) = optimizer.transform_gradients([gradient])
    expected, _ = optimizer.update(data, clipped, optimizer.init(data))
    new, _ = optimizer.update(_fake(data), _fake(clipped), _state_as_fake(optimizer.init(data)))
    _same(new, expected)
    assert fake_cupy == ["monadl_adam"]


def test_amsgrad_and_sparse_gradients_keep_their_rules(fake_cupy: list[str]) -> None:
    data, gradient = _arrays(np.float64)
    amsgrad = ml.AdamW(0.01, amsgrad=True)
    new, _ = amsgrad.update(_fake(data), _fake(gradient), _state_as_fake(amsgrad.init(data)))
    np.testing.assert_array_equal(np.asarray(new), amsgrad.update(data, gradient, amsgrad.init(data))[0])
    assert fake_cupy == []


ACTIVATIONS: list[tuple[str, Callable[..., Any], Callable[..., Any]]] = [
    ("sigmoid", lambda xp, x: sigmoid_of(xp, x), lambda xp, d, o, x: SIGMOID.vjps[0](xp, d, o, x)),
    ("tanh", lambda xp, x: TANH.forward(xp, x), lambda xp, d, o, x: TANH.vjps[0](xp, d, o, x)),
    ("gelu", activations._gelu, activations._gelu_vjp),
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(("name", "forward", "vjp"), ACTIVATIONS, ids=[a[0] for a in ACTIVATIONS])
def test_a_fused_activation_is_the_rule_bit_for_bit(
    name: str, forward: Any, vjp: Any, dtype: Any, fake_cupy: list[str]
) -> None:
    x, d = _arrays(dtype, (4, 6))
    x *= 4.0  # into both tails
    from monadl.typeclasses.backend import NUMPY

    out = forward(NUMPY, x)
    generic: Any = types.SimpleNamespace(exp=np.exp, tanh=np.tanh)  # a namespace that is not NUMPY
    mine = forward(generic, _fake(x))
    expected_vjp = vjp(NUMPY, d, out, x)
    mine_vjp = vjp(generic, _fake(d), _fake(out), _fake(x))
    for have, want in ((mine, out), (mine_vjp, expected_vjp)):
        assert type(have) is FakeCupyArray, name
        np.testing.assert_array_equal(np.asarray(have), want, strict=True)
    fused_forward = name != "tanh"  # tanh's forward is one operation already
    assert len(fake_cupy) == 1 + fused_forward


def test_numpy_strict_and_floats_take_no_fused_branch(fake_cupy: list[str]) -> None:
    x = np.linspace(-3.0, 3.0, 5)
    strict = xps.asarray(x)
    assert not fused.on_cupy(x) and not fused.on_cupy(strict) and not fused.on_cupy(1.5)
    assert not fused.on_cupy(_fake(x), x)  # one array not CuPy's
    assert not fused.on_cupy(_fake(x), _fake(x.astype(np.float32)))  # two dtypes
    assert not fused.on_cupy(_fake(x.astype(np.float16)))
    assert fused.on_cupy(_fake(x), _fake(x))
    adam = ml.Adam(0.1)
    for data in (x, strict):
        adam.update(data, data, adam.init(data))
    sigmoid_of(xps, strict)
    activations._gelu(xps, strict)
    assert fake_cupy == []


def test_fusion_turned_off_runs_the_rules(fake_cupy: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fused, "ENABLED", False)
    data, gradient = _arrays(np.float32)
    adam = ml.Adam(0.01)
    new, _ = adam.update(_fake(data), _fake(gradient), _state_as_fake(adam.init(data)))
    np.testing.assert_array_equal(np.asarray(new), adam.update(data, gradient, adam.init(data))[0])
    assert not fused.on_cupy(_fake(data)) and fake_cupy == []


def test_without_cupy_nothing_is_fused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "cupy", raising=False)
    x = np.ones(3)
    assert not fused.on_cupy(x) and not fused.on_cupy(_fake(x))
    assert "cupy" not in sys.modules


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (("y = 0.5 * x",), "cannot read"),  # a literal rounds in double in C++: T(0.5)
        (("y = x + z",), "cannot read"),  # an unknown name
        (("y = pow(x, T(2))",), "cannot read"),  # a function the NumPy reading lacks
        (("x = T(1.0)",), "must assign a new name"),  # an input overwritten
        (("t = x",), "never set"),
    ],
)
def test_a_kernel_outside_the_shared_subset_is_refused(body: tuple[str, ...], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        fused.Kernel("k", ("x",), (), ("y",), body)


def test_the_source_declares_temporaries_and_emulate_runs_it() -> None:
    kernel = fused.Kernel("k", ("x", "y"), ("a",), ("z",), ("t = a * x", "z = t + y / T(2.0)"))
    assert kernel.source() == "T t = a * x;\nz = t + y / T(2.0);"
    x, y = np.array([1.0, 2.0], np.float32), np.array([[4.0], [6.0]], np.float32)
    (z,) = kernel.emulate((x, y), (3.0,))
    assert z.dtype == np.float32 and z.shape == (2, 2)
    np.testing.assert_array_equal(z, np.float32(3.0) * x + y / np.float32(2.0))


# --------------------------------------------------------------------------- reads from the device


class Reads:
    """Counts ``bool()`` and ``float()`` of array-api-strict arrays: a read from the device."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        kind = type(xps.asarray(0.0))
        for name in ("__bool__", "__float__"):
            original = getattr(kind, name)

            def counted(array: Any, *args: Any, _original: Any = original) -> Any:
                self.count += 1
                return _original(array, *args)

            monkeypatch.setattr(kind, name, counted)


def _strict_weights(count: int) -> list[ml.ArrayWeight]:
    arrays: list[Any] = [xps.asarray(RNG.normal(size=(2, 3))) for _ in range(count)]
    return [ml.ArrayWeight(a, name=f"w{k}") for k, a in enumerate(arrays)]


def _loss(weights: list[ml.ArrayWeight]) -> ml.FloatLayer:
    return ml.add_n([ml.sum(w * w) for w in weights])


def _updates_reads(monkeypatch: pytest.MonkeyPatch, count: int, optimizer: Any) -> int:
    weights = _strict_weights(count)
    _, gradients = ml.compute_gradients(_loss(weights))
    reads = Reads(monkeypatch)
    commit_gradients(gradients, optimizer)
    monkeypatch.undo()
    return reads.count


@pytest.mark.parametrize(
    "optimizer", [ml.SGD(0.1), ml.Adam(0.1), ml.chain(ml.clip_by_global_norm(1.0), ml.Adam(0.1))]
)
def test_a_step_off_numpy_reads_the_device_once_whatever_its_weights(
    monkeypatch: pytest.MonkeyPatch, optimizer: Any
) -> None:
    few, many = _updates_reads(monkeypatch, 2, optimizer), _updates_reads(monkeypatch, 7, optimizer)
    assert few == many <= 2  # the finite checks, and the global norm where clipped


def _failed_step(on: Callable[[Any], Any]) -> tuple[str, list[ml.ArrayWeight], list[Any]]:
    """A step whose gradients of w2 and w3 are not finite (sqrt's at 0, one entry of six each),
    the weights' arrays made by ``on``: the error's message, the weights, their arrays before."""
    rows = [RNG.normal(size=(2, 3)) for _ in range(2)] + [np.arange(6.0).reshape(2, 3)] * 2
    weights = [ml.ArrayWeight(on(r), name=f"w{k}") for k, r in enumerate(rows)]
    loss = ml.add_n([ml.sum(w * w) for w in weights[:2]] + [ml.sum(ml.sqrt(w)) for w in weights[2:]])
    before = [w.data for w in weights]
    result = loss.train_blocking(ml.SGD(0.1))
    assert not is_successful(result)
    error = result.failure()
    assert isinstance(error, ml.NonFiniteGradientError)
    return str(error), weights, before


@pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning")  # sqrt's gradient at 0
def test_the_weight_that_is_not_finite_is_named_as_on_numpy_and_nothing_changes() -> None:
    expected, _, _ = _failed_step(np.asarray)
    message, weights, before = _failed_step(xps.asarray)
    named = [w.name for w in weights if f"name='{w.name}'" in message]
    assert named == [w.name for w in weights if f"name='{w.name}'" in expected] and len(named) == 1
    assert "1 of 6 entries" in message and "its gradient is not finite" in message
    assert all(w.data is b for w, b in zip(weights, before, strict=True))


def test_a_global_norm_off_numpy_is_read_once_and_equals_numpys(monkeypatch: pytest.MonkeyPatch) -> None:
    host = [RNG.normal(size=(3, 4)) for _ in range(5)]
    expected = ml.global_norm(host)
    reads = Reads(monkeypatch)
    assert ml.global_norm([xps.asarray(g) for g in host]) == pytest.approx(expected, rel=1e-14)
    assert reads.count == 1
    assert fused.all_true([xps.asarray(True), xps.asarray(False)]) is False
    assert fused.all_true([xps.asarray(True)] * 3) is True
