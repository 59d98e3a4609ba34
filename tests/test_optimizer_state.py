"""Optimizer states: checked where they come from a file, and a weight's type kept by its updates.

A checkpoint's optimizer must be one of monadl's, and its state must fit it and the weight
(``check_state``), else the load is a ``CheckpointError`` that names the weight and changes nothing.
Every update keeps a weight's type, shape and dtype (a 0-d array stays one: NumPy's arithmetic
would make it a scalar). ``Adam(lazy=True)`` is PyTorch's ``SparseAdam``.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from returns.result import Success

import monadl as ml
from monadl import ArrayWeight, FloatWeight
from monadl.checkpoint import CheckpointError, from_bytes, to_bytes
from monadl.typeclasses.sparse import SparseRows


@dataclass
class Model(ml.Module):
    w: ArrayWeight
    s: FloatWeight

    def loss(self, step: int) -> ml.FloatLayer:
        x = np.random.default_rng(step).normal(size=(4, 3))
        h = ml.tanh(ml.matmul(x, self.w)) * self.s
        return ml.mean(h * h)


def _model(seed: int = 0) -> Model:
    return Model(ArrayWeight.normal((3, 2), seed=seed), FloatWeight(0.8))


def _trained(optimizer: Any, steps: int = 9) -> Model:
    m = _model()
    for step in range(steps):
        assert isinstance(m.loss(step).train_blocking(optimizer), Success)
    return m


def _edited(raw: bytes, edit: Callable[[dict[str, Any]], None]) -> bytes:
    """The checkpoint ``raw`` with its monadl description changed by ``edit`` (the safetensors
    format: an 8-byte little-endian header length, the JSON header, then the arrays' bytes)."""
    length = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + length])
    described = json.loads(header["__metadata__"]["monadl"])
    sealed = described.pop("sha256", None) is not None
    edit(described)
    if sealed:  # the description's digest, made anew (of its text without it)
        described["sha256"] = hashlib.sha256(json.dumps(described).encode()).hexdigest()
    header["__metadata__"]["monadl"] = json.dumps(described)
    encoded = json.dumps(header).encode()
    encoded += b" " * (-len(encoded) % 8)  # safetensors pads its header to 8 bytes
    return len(encoded).to_bytes(8, "little") + encoded + raw[8 + length :]


def _snapshot(m: Model) -> list[tuple[bytes, str]]:
    return [(np.asarray(w.data).tobytes(), repr(w.optimizer_state)) for w in m.weights().values()]


ADAM_SETTINGS = {
    "learning_rate": 0.01,
    "beta1": 0.9,
    "beta2": 0.999,
    "epsilon": 1e-8,
    "weight_decay": 0.0,
    "lazy": False,
}
"""Every setting of an Adam, as a file describes it (a file missing one is refused)."""


def _entry(name: str, key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(described: dict[str, Any]) -> None:
        described["weights"][name][key] = value

    return edit


def _state_items(name: str, change: Callable[[list[Any]], Any]) -> Callable[[dict[str, Any]], None]:
    def edit(described: dict[str, Any]) -> None:
        state = described["weights"][name]["state"]
        state["tuple"] = change(state["tuple"])

    return edit


def test_a_valid_file_resumes_adam_at_its_step() -> None:
    m = _trained(ml.Adam(0.01))
    target = _model(seed=4)
    from_bytes(_edited(to_bytes(m), lambda d: None), target)  # the reassembly changes nothing
    assert target.w.optimizer_state is not None and target.w.optimizer_state[1][2] == 9
    assert isinstance(target.loss(9).train_blocking(ml.Adam(0.01)), Success)
    assert target.w.optimizer_state[1][2] == 10


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (_entry("w", "optimizer", "x"), r"weight 'w': its optimizer's description is malformed"),
        (_entry("w", "optimizer", None), r"weight 'w': its optimizer's description is malformed"),
        (
            _entry("w", "optimizer", {"class": "Constant", "fields": {"value": 0.1}}),
            r"weight 'w': its optimizer's description is malformed",
        ),
        (
            _entry("w", "optimizer", {"tuple": [{"class": "Adam", "fields": ADAM_SETTINGS}]}),
            r"weight 'w': its optimizer's description is malformed",
        ),
        (
            _state_items("w", lambda items: items[:2]),
            r"weight 'w': .*Adam: the state is a tuple of 2 items, not a tuple \(first moment, "
            r"second moment, step count\)",
        ),
        (_entry("w", "state", {"int": 9}), r"weight 'w': .*Adam: the state is int 9, not a tuple"),
        (
            _state_items("w", lambda items: [*items[:2], {"int": -1}]),
            r"weight 'w': .*Adam: the step count is int -1, not an int >= 0",
        ),
        (
            _state_items("w", lambda items: [*items[:2], {"value": True}]),
            r"weight 'w': .*Adam: the step count is bool True",
        ),
        (
            _state_items("w", lambda items: [items[2], items[1], items[0]]),
            r"weight 'w': .*Adam: its first moment is int 9",
        ),
        (
            _state_items("s", lambda items: [items[2], items[1], items[2]]),
            r"weight 's': .*Adam: its first moment is int 9, not a float like the weight",
        ),
    ],
    ids=[
        "a string",
        "null",
        "a schedule",
        "a tuple",
        "2 items",
        "an int",
        "negative step",
        "bool step",
        "an int moment",
        "an int moment of a float",
    ],
)
def test_a_malformed_optimizer_or_state_is_refused_and_changes_nothing(
    edit: Callable[[dict[str, Any]], None], message: str
) -> None:
    raw = _edited(to_bytes(_trained(ml.Adam(0.01))), edit)
    target = _trained(ml.SGD(0.1), steps=2)
    before = _snapshot(target)
    with pytest.raises(CheckpointError, match=message):
        from_bytes(raw, target)
    assert _snapshot(target) == before


@pytest.mark.parametrize(
    ("optimizer", "edit", "message"),
    [
        (ml.SGD(0.1), _entry("w", "state", {"int": -3}), r"'w': .*SGD: the step count is int -3"),
        (ml.SGD(0.1), _entry("w", "state", {"tuple": []}), r"'w': .*SGD: the step count is a tuple"),
        (
            ml.Momentum(0.1),
            _state_items("w", lambda items: items[:1]),
            r"'w': .*Momentum: the state is a tuple of 1 items, not a tuple \(velocity, step count\)",
        ),
        (
            ml.Adagrad(0.1),
            _state_items("w", lambda items: [items[0], {"int": -1}]),
            r"'w': .*Adagrad: the step count is int -1",
        ),
        (
            ml.chain(ml.clip_by_value(1.0), ml.Adam(0.01)),
            _state_items("w", lambda items: [*items[:2], {"int": -2}]),
            r"'w': .*Chain: the step count is int -2",
        ),
    ],
    ids=["SGD negative", "SGD tuple", "Momentum 1 item", "Adagrad negative", "Chain negative"],
)
def test_every_optimizer_checks_its_state_on_load(
    optimizer: Any, edit: Callable[[dict[str, Any]], None], message: str
) -> None:
    raw = _edited(to_bytes(_trained(optimizer, steps=3)), edit)
    target = _model(seed=2)
    before = _snapshot(target)
    with pytest.raises(CheckpointError, match=message):
        from_bytes(raw, target)
    assert _snapshot(target) == before


ALL = [
    ml.SGD(0.1),
    ml.SGD(0.1, weight_decay=0.01),
    ml.Momentum(0.1),
    ml.Momentum(0.1, weight_decay=0.01, lazy=True),
    ml.Adam(0.1),
    ml.Adam(0.1, weight_decay=0.01, lazy=True),
    ml.Adagrad(0.1),
    ml.Adagrad(0.1, weight_decay=0.01),
    ml.chain(ml.clip_by_global_norm(1.0), ml.Adam(0.1)),
    ml.AdamW(0.1),
    ml.AdamW(0.1, weight_decay=0.1, amsgrad=True),
    ml.RMSprop(0.1),
    ml.RMSprop(0.1, momentum=0.9, centered=True, weight_decay=0.01),
]


@pytest.mark.parametrize("optimizer", ALL, ids=repr)
@pytest.mark.parametrize(
    "data",
    [np.ones((4, 2)), np.array(0.5), np.ones(3, dtype=np.float32), 0.5],
    ids=["2-d", "0-d", "float32", "float"],
)
def test_initial_and_updated_states_are_valid(optimizer: Any, data: Any) -> None:
    state = optimizer.init(data)
    assert optimizer.check_state(state, data) is None
    for k in range(3):
        data, state = optimizer.update(data, data * 0.5 - 0.25 * k, state)
        assert optimizer.check_state(state, data) is None


def test_check_state_names_wrong_arrays_and_values() -> None:
    data = np.zeros((4, 2))
    adam = ml.Adam(0.1)
    m, v, _ = adam.init(data)
    assert "first moment is a float32 (4, 2) ndarray, not a float64 (4, 2) ndarray" in str(
        adam.check_state((m.astype(np.float32), v, 0), data)
    )
    assert "second moment is a float64 (2, 4) ndarray" in str(adam.check_state((m, v.T, 0), data))
    assert "second moment has a negative entry" in str(adam.check_state((m, v - 1.0, 0), data))
    assert "step count is float 9.0" in str(adam.check_state((m, v, 9.0), data))
    assert "sum of squared gradients has a negative entry" in str(
        ml.Adagrad(0.1).check_state((data - 1.0, 2), data)
    )
    assert "velocity is a float64 (1,) ndarray, not a float like the weight" in str(
        ml.Momentum(0.1).check_state((np.zeros(1), 2), 0.5)
    )
    # NaN is a diverged run's state, not a malformed one (a checkpoint's load has its own policy).
    assert adam.check_state((m + math.nan, v, 0), data) is None
    # A 0-d weight's state saved as floats (by earlier versions, whose results were NumPy scalars).
    assert adam.check_state((0.25, 0.5, 3), np.array(1.0)) is None
    assert ml.SGD(0.1).check_state(None, data) is None  # earlier versions' SGD state


@pytest.mark.parametrize("optimizer", ALL, ids=repr)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_a_0d_weight_stays_a_0d_array_of_its_dtype(optimizer: Any, dtype: Any) -> None:
    data = np.array(1.5, dtype=dtype)
    state = optimizer.init(data)
    for k in range(4):
        gradient = (
            np.array(0.5 - 0.3 * k, dtype=dtype) if k % 2 else 0.5 - 0.3 * k
        )  # a 0-d delta may be a float
        data, state = optimizer.update(data, gradient, state)
        assert type(data) is np.ndarray and data.shape == () and data.dtype == dtype
        for part in state if isinstance(state, tuple) else ():
            if part is not None and not isinstance(part, int):  # (None: a part not in use)
                assert type(part) is np.ndarray and part.shape == () and part.dtype == dtype


@pytest.mark.parametrize("optimizer", ALL, ids=repr)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_training_keeps_a_0d_weights_type_shape_and_dtype(optimizer: Any, dtype: Any) -> None:
    w = ArrayWeight(np.array(1.5, dtype=dtype))
    for _ in range(3):
        assert isinstance(ml.sum(w * w).train_blocking(optimizer), Success)
        assert type(w.data) is np.ndarray and w.data.shape == () and w.data.dtype == dtype


@pytest.mark.parametrize("optimizer", ALL, ids=repr)
def test_float32_weights_stay_float32(optimizer: Any) -> None:
    data = np.random.default_rng(1).standard_normal((6, 2)).astype(np.float32)
    state = optimizer.init(data)
    gradients: list[Any] = [
        data * np.float32(0.1),
        SparseRows(np.array([4, 1, 4]), np.ones((3, 2), dtype=np.float32), data.shape),
    ]
    for gradient in gradients * 2:
        data, state = optimizer.update(data, gradient, state)
        assert type(data) is np.ndarray and data.dtype == np.float32 and data.shape == (6, 2)
        assert optimizer.check_state(state, data) is None


def test_lazy_adam_is_torchs_sparse_adam() -> None:
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(7)
    table = rng.standard_normal((10, 4))
    batches = [rng.integers(0, 10, size=6) for _ in range(8)]  # repeated rows add; some untouched
    scales = [rng.standard_normal((6, 4)) for _ in range(8)]

    w = ArrayWeight(table, optimizer=ml.Adam(0.05, lazy=True))
    for rows, scale in zip(batches, scales, strict=True):
        assert isinstance(ml.train_blocking(ml.sum(ml.take_rows(w, rows) * scale)), Success)

    embedding = torch.nn.Embedding.from_pretrained(torch.tensor(table), freeze=False, sparse=True)
    adam = torch.optim.SparseAdam(embedding.parameters(), lr=0.05, betas=(0.9, 0.999), eps=1e-8)
    for rows, scale in zip(batches, scales, strict=True):
        adam.zero_grad()
        (embedding(torch.tensor(rows)) * torch.tensor(scale)).sum().backward()
        adam.step()
    expected = embedding.weight.detach().numpy()
    state = adam.state[embedding.weight]

    assert w.optimizer_state is not None
    m, v, t = w.optimizer_state[1]
    assert t == state["step"] == 8
    np.testing.assert_allclose(w.data, expected, rtol=1e-15, atol=1e-15)
    np.testing.assert_allclose(m, state["exp_avg"].numpy(), rtol=1e-15, atol=1e-15)
    np.testing.assert_allclose(v, state["exp_avg_sq"].numpy(), rtol=1e-15, atol=1e-15)
    untouched = sorted(set(range(10)) - {int(r) for rows in batches for r in rows})
    np.testing.assert_array_equal(w.data[untouched], table[untouched])
