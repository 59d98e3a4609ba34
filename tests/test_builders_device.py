"""Builders take ``xp=`` and ``device=`` (array-api-strict stands in for a device): every weight and
buffer is built in that namespace from NumPy's draw, a training step there gives the NumPy-built
model's numbers, an assignment of another namespace's array moves a weight or names ``to_device``,
and checkpoints of such a model save and load, onto the model's own namespace."""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from returns.pipeline import is_successful

import monadl as ml
from monadl import nn
from monadl.checkpoint import from_bytes, to_bytes
from monadl.typeclasses.backend import dtype_name

xp: Any = pytest.importorskip("array_api_strict")
STRICT = type(xp.asarray(0.0))

X = np.random.default_rng(0).normal(size=(6, 4))
IDS = np.array([0, 3, 6, 2, 2, 5])
IMAGES = np.random.default_rng(1).normal(size=(2, 2, 5, 5))


def total(layers: list[ml.ArrayLayer]) -> ml.FloatLayer:
    """The mean square of each layer, summed: a loss every weight of the layers feeds."""
    means = [ml.mean(layer * layer) for layer in layers]
    return functools.reduce(operator.add, means)


class Place:
    """array-api-strict on one of its devices: where a case's inputs are put."""

    def __init__(self, device: Any = None) -> None:
        self.device = device

    def asarray(self, array: np.ndarray[Any, Any]) -> Any:
        return xp.asarray(array, device=self.device)


def on(array: np.ndarray[Any, Any], space: Any) -> Any:
    return array if space is np else space.asarray(array)


Build = Callable[[dict[str, Any]], Any]
Forward = Callable[[Any, Any], ml.FloatLayer]
# Each builder (float64: the NumPy and the generic kernels sum in different orders) and a loss of
# the model on the inputs (``space``: where the inputs are put).
CASES: dict[str, tuple[Build, Forward]] = {
    "Linear": (
        lambda kw: nn.Linear.new(4, 3, seed=1, dtype=np.float64, **kw),
        lambda m, s: total([m(on(X, s))]),
    ),
    "Linear(init)": (
        lambda kw: nn.Linear.new(4, 3, seed=1, dtype=np.float64, init=nn.init.orthogonal, **kw),
        lambda m, s: total([m(on(X, s))]),
    ),
    "MLP": (
        lambda kw: nn.MLP.new([4, 5, 3], seed=1, dtype=np.float64, **kw),
        lambda m, s: ml.cross_entropy(m(on(X, s)), IDS % 3),
    ),
    "Embedding": (
        lambda kw: nn.Embedding.new(7, 3, seed=1, dtype=np.float64, **kw),
        lambda m, s: total([m(IDS)]),
    ),
    "Conv1d": (
        lambda kw: nn.Conv1d.new(2, 3, 3, seed=1, dtype=np.float64, **kw),
        lambda m, s: total([m(on(IMAGES[:, :, 0, :], s))]),
    ),
    "Conv2d": (
        lambda kw: nn.Conv2d.new(2, 3, 2, stride=2, seed=1, dtype=np.float64, **kw),
        lambda m, s: total([m(on(IMAGES, s))]),
    ),
    "LayerNorm": (
        lambda kw: nn.LayerNorm.new(4, dtype=np.float64, **kw),
        lambda m, s: total([m(on(X, s)) * on(X, s)]),
    ),
    "BatchNorm1d": (
        lambda kw: nn.BatchNorm1d.new(4, dtype=np.float64, **kw),
        lambda m, s: total([m(on(X, s)) * on(X, s)]),
    ),
    "BatchNorm2d": (
        lambda kw: nn.BatchNorm2d.new(2, dtype=np.float64, **kw),
        lambda m, s: total([m(on(IMAGES, s)) * on(IMAGES, s)]),
    ),
    "MultiHeadAttention": (
        lambda kw: nn.MultiHeadAttention.new(4, 2, seed=1, dtype=np.float64, **kw),
        lambda m, s: total([m(on(X, s), causal=True)]),
    ),
    "TransformerEncoderLayer": (
        lambda kw: nn.TransformerEncoderLayer.new(4, 2, 8, seed=1, dtype=np.float64, **kw),
        lambda m, s: total([m(on(X, s))]),
    ),
    "LSTMCell": (
        lambda kw: nn.LSTMCell.new(4, 3, seed=1, dtype=np.float64, **kw),
        lambda m, s: total(list(m(on(X, s), *m.zeros_state(rows=6)))),
    ),
    "GRUCell": (
        lambda kw: nn.GRUCell.new(4, 3, seed=1, dtype=np.float64, **kw),
        lambda m, s: total([m(on(X, s), m.zeros_state(rows=6))]),
    ),
    "TreeLSTMCell": (
        lambda kw: nn.TreeLSTMCell.new(4, 3, seed=1, dtype=np.float64, **kw),
        lambda m, s: total(list(m.compose(*m.leaf(on(X[0], s)), *m.leaf(on(X[1], s))))),
    ),
    "LSTM": (
        lambda kw: nn.LSTM.new(4, 3, bidirectional=True, seed=1, dtype=np.float64, **kw),
        lambda m, s: total([h for steps in m([on(X, s), on(X[:2], s)]).outputs for h in steps]),
    ),
    "GRU": (
        lambda kw: nn.GRU.new(4, 3, layers=2, seed=1, dtype=np.float64, **kw),
        lambda m, s: total([h for steps in m([on(X, s), on(X[:3], s)]).outputs for h in steps]),
    ),
    "ConvTranspose2d": (
        lambda kw: nn.ConvTranspose2d.new(
            2, 4, 3, stride=2, padding=1, output_padding=1, groups=2, seed=1, dtype=np.float64, **kw
        ),
        lambda m, s: total([m(on(IMAGES, s))]),
    ),
    "GroupNorm": (
        lambda kw: nn.GroupNorm.new(1, 2, dtype=np.float64, **kw),
        lambda m, s: total([m(on(IMAGES, s)) * on(IMAGES, s)]),
    ),
    "RMSNorm": (
        lambda kw: nn.RMSNorm.new(4, dtype=np.float64, **kw),
        lambda m, s: total([m(on(X, s)) * on(X, s)]),
    ),
    "TransformerDecoderLayer": (
        lambda kw: nn.TransformerDecoderLayer.new(4, 2, 8, seed=1, dtype=np.float64, **kw),
        lambda m, s: total([m(on(X, s), on(X[:4], s), memory_mask=np.ones((6, 4), dtype=bool))]),
    ),
    "Sequential": (  # padding, pooling, flattening and a linear layer over the images
        lambda kw: nn.Sequential(
            nn.Conv2d.new(2, 3, 2, seed=1, dtype=np.float64, **kw),
            lambda h: ml.pad(h, (1, 0, 0, 1), mode="reflect"),
            nn.AdaptiveAvgPool2d((3, 2)),
            nn.Flatten(),
            nn.Linear.new(18, 2, seed=2, dtype=np.float64, **kw),
        ),
        lambda m, s: total([m(on(IMAGES, s))]),
    ),
}


def host(array: Any) -> np.ndarray[Any, Any]:
    return np.asarray(np.from_dlpack(array))


def arrays_of(model: Any) -> dict[str, Any]:
    """Every weight's data and every array buffer's, by name."""
    found = {f"weight {name}": w.data for name, w in ml.weights_of(model).items()}
    for name, buffer in ml.buffers_of(model).items():
        if isinstance(buffer, ml.ArrayBuffer):
            found[f"buffer {name}"] = buffer.data
    return found


def train_step(model: Any, forward: Forward, space: Any) -> float:
    result = forward(model, space).train_blocking(ml.Adam(0.05))
    assert is_successful(result), result
    value: float = result.unwrap()
    return value


@pytest.mark.parametrize("device", [None, "device1"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_builder_with_xp_builds_there_and_trains_as_on_numpy(case: str, device: str | None) -> None:
    """On the default device and on another one: every array a kernel makes (a padding, a delta's
    zeros, a label's one-hot, an initial state) is made where its operands live."""
    build, forward = CASES[case]
    where = xp.Device(device) if device is not None else xp.Device("CPU_DEVICE")
    there, here = build({"xp": xp, "device": where}), build({})
    built = arrays_of(there)
    assert built.keys() == arrays_of(here).keys()
    for name, array in built.items():
        assert type(array) is STRICT, f"{case}: {name} is a {type(array).__name__}"
        assert array.device == where, f"{case}: {name} is on {array.device}"
        assert dtype_name(array) == dtype_name(arrays_of(here)[name]), name
        np.testing.assert_array_equal(host(array), arrays_of(here)[name], err_msg=f"{case}: {name}")
    assert train_step(there, forward, Place(where)) == pytest.approx(train_step(here, forward, np), abs=1e-6)
    for name, array in arrays_of(there).items():
        assert type(array) is STRICT, f"{case}: {name} left the namespace in the step"
        assert array.device == where, f"{case}: {name} left the device in the step"
        np.testing.assert_allclose(host(array), arrays_of(here)[name], rtol=0, atol=1e-6, err_msg=name)


def test_the_default_stays_numpy_float32_and_the_same_draw() -> None:
    numpy_built, strict_built = nn.MLP.new([3, 4, 2], seed=5), nn.MLP.new([3, 4, 2], seed=5, xp=xp)
    for a, b in zip(numpy_built.weights().values(), strict_built.weights().values(), strict=True):
        assert type(a.data) is np.ndarray and not a.data.flags.writeable
        assert a.data.dtype == np.float32 and dtype_name(b.data) == "float32"
        np.testing.assert_array_equal(host(b.data), a.data)


def test_device_places_weights_and_buffers_on_it() -> None:
    device = xp.Device("device1")
    norm = nn.BatchNorm1d.new(3, xp=xp, device=device)
    layer = nn.Linear.new(4, 3, xp=xp, device=device)
    for array in (*arrays_of(norm).values(), *arrays_of(layer).values()):
        assert array.device == device
    assert ml.ArrayWeight.normal((2, 2), xp=xp, device=device).data.device == device
    assert ml.ArrayBuffer(np.zeros(2), xp=xp, device=device).data.device == device


def test_weight_constructors_and_initialisers_take_xp() -> None:
    drawn = nn.init.kaiming_uniform((3, 4), seed=2, dtype=np.float64, xp=xp)
    assert type(drawn) is STRICT
    np.testing.assert_array_equal(host(drawn), nn.init.kaiming_uniform((3, 4), seed=2, dtype=np.float64))
    for init in (nn.init.xavier_uniform, nn.init.xavier_normal, nn.init.kaiming_normal, nn.init.orthogonal):
        np.testing.assert_array_equal(host(init((3, 4), seed=1, xp=xp)), init((3, 4), seed=1))
    normal = ml.ArrayWeight.normal((3, 2), seed=4, xp=xp)
    np.testing.assert_array_equal(host(normal.data), ml.ArrayWeight.normal((3, 2), seed=4).data)
    assert type(ml.ArrayWeight.zeros((2,), xp=xp).data) is STRICT
    # A strict array given to the constructor without xp stays strict; xp=np brings it to the host.
    strict = xp.asarray([1.0, 2.0])
    assert type(ml.ArrayWeight(strict).data) is STRICT
    assert type(ml.ArrayWeight(strict, xp=np).data) is np.ndarray
    assert type(ml.ArrayWeight(np.ones(2), xp=xp).data) is STRICT


def test_assigning_another_namespace_moves_the_weight_or_names_to_device() -> None:
    w = ml.ArrayWeight(np.zeros((3, 2)))
    w.data = xp.ones((3, 2), dtype=xp.float64)  # before training: a move
    assert type(w.data) is STRICT
    w.data = np.full((3, 2), 2.0)
    assert type(w.data) is np.ndarray and w.data.tolist() == [[2.0, 2.0]] * 3
    with pytest.raises(ml.ShapeError, match=r"= float32 array of shape \(3, 2\): the weight holds float64"):
        w.data = xp.ones((3, 2), dtype=xp.float32)
    assert is_successful(ml.sum(w * w).train_blocking(ml.Adam(0.1)))
    with pytest.raises(ValueError, match=r"has optimizer state.*module\.to\(xp.*ml\.to_device") as raised:
        w.data = xp.ones((3, 2), dtype=xp.float64)
    assert "array_api_strict" in str(raised.value) and "numpy" in str(raised.value)
    assert type(w.data) is np.ndarray
    ml.to_device(w, xp)  # what the message says: the state moves with the weight
    assert type(w.data) is STRICT and w.optimizer_state is not None
    assert type(w.optimizer_state[1][0]) is STRICT


class Model(ml.Module):
    def __init__(self, **where: Any) -> None:
        self.body = nn.MLP.new([4, 5, 3], seed=1, dtype=np.float64, **where)
        self.norm = nn.BatchNorm1d.new(3, dtype=np.float64, **where)

    def __call__(self, x: Any) -> ml.ArrayLayer:
        return self.norm(self.body(x))


def loss_of(model: Model, space: Any) -> ml.FloatLayer:
    return ml.cross_entropy(model(on(X, space)), IDS % 3)


def test_a_checkpoint_of_a_strict_model_saves_and_loads_onto_the_models_namespace() -> None:
    trained, reference = Model(xp=xp), Model()
    for model, space in ((trained, xp), (reference, np)):
        for _ in range(2):
            train_step(model, lambda m, s: loss_of(m, s), space)
    blob = to_bytes(trained, metadata={"step": 2})
    # onto a fresh strict model: weights, Adam's state and the running statistics, all strict
    resumed = Model(xp=xp, device=xp.Device("device1"))
    assert from_bytes(blob, resumed) == {"step": 2}
    for name, array in arrays_of(resumed).items():
        assert type(array) is STRICT and array.device == xp.Device("device1"), name
        np.testing.assert_array_equal(host(array), host(arrays_of(trained)[name]), err_msg=name)
    for name, weight in resumed.weights().items():
        state = weight.optimizer_state
        assert state is not None and state[1][2] == 2, name
        assert type(state[1][0]) is STRICT and state[1][0].device == xp.Device("device1"), name
    # the file is the NumPy model's, to 1e-6: onto a NumPy model, it trains on as the reference
    on_host = Model()
    from_bytes(blob, on_host)
    for name, array in arrays_of(on_host).items():
        assert type(array) is np.ndarray, name
        np.testing.assert_allclose(array, arrays_of(reference)[name], rtol=0, atol=1e-6, err_msg=name)
    step = train_step(on_host, lambda m, s: loss_of(m, s), np)
    assert step == pytest.approx(train_step(reference, lambda m, s: loss_of(m, s), np), abs=1e-6)
    # and a NumPy model's file loads onto a strict model
    back = Model(xp=xp)
    from_bytes(to_bytes(reference), back)
    for name, array in arrays_of(back).items():
        assert type(array) is STRICT, name
        np.testing.assert_array_equal(host(array), arrays_of(reference)[name], err_msg=name)


def test_a_checkpoint_refuses_another_dtype_by_name_on_any_namespace() -> None:
    blob = to_bytes(nn.Linear.new(4, 3, dtype=np.float64))
    with pytest.raises(ml.CheckpointError, match=r"the model's is float32 \(4, 3\), the file holds float64"):
        from_bytes(blob, nn.Linear.new(4, 3, xp=xp))
