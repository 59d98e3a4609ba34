"""AdamW and RMSprop against PyTorch's, and their state through checkpoints.

The same small model (a tanh layer and a linear head, float64) is trained for 50 steps by monadl
and by ``torch.optim`` from the same weights on the same batches: every weight, and every part of
the optimizer's state, must agree to 1e-12 relative (the rules' operations round differently from
torch's fused ones by an ulp or so per step). A learning-rate schedule is given to torch by setting
each step's rate by hand, as monadl asks the schedule for it. A checkpoint saved midway resumes to
the same bits as a run never interrupted, and a state that does not fit its optimizer is refused.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from returns.result import Success

import monadl as ml
from monadl import ArrayWeight
from monadl.checkpoint import CheckpointError, from_bytes, to_bytes

STEPS = 50
RTOL = 1e-12


@dataclass
class Net(ml.Module):
    w1: ArrayWeight
    b1: ArrayWeight
    w2: ArrayWeight

    def loss(self, step: int) -> ml.FloatLayer:
        x, y = batch(step)
        return ml.mean((ml.tanh(x @ self.w1 + self.b1) @ self.w2 - y) ** 2.0)


def batch(step: int) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    rng = np.random.default_rng([11, step])
    return rng.standard_normal((8, 3)), rng.standard_normal((8, 2))


def initial() -> dict[str, np.ndarray[Any, Any]]:
    rng = np.random.default_rng(5)
    return {
        "w1": rng.standard_normal((3, 5)),
        "b1": rng.standard_normal(5) * 0.1,
        "w2": rng.standard_normal((5, 2)),
    }


def net() -> Net:
    return Net(**{name: ArrayWeight(value.copy()) for name, value in initial().items()})


def train_monadl(optimizer: Any, steps: range, model: Net | None = None) -> Net:
    model = net() if model is None else model
    for step in steps:
        assert isinstance(model.loss(step).train_blocking(optimizer), Success)
    return model


def train_torch(
    make: Callable[[list[Any]], Any], rate: Callable[[int], float] | None = None
) -> tuple[dict[str, Any], Any]:
    torch = pytest.importorskip("torch")
    params = {name: torch.tensor(value, requires_grad=True) for name, value in initial().items()}
    optimizer = make(list(params.values()))
    for step in range(STEPS):
        x, y = (torch.tensor(a) for a in batch(step))
        optimizer.zero_grad()
        loss = ((torch.tanh(x @ params["w1"] + params["b1"]) @ params["w2"] - y) ** 2).mean()
        loss.backward()
        if rate is not None:
            for group in optimizer.param_groups:
                group["lr"] = rate(step)
        optimizer.step()
    return params, optimizer


def assert_close(got: Any, want: Any, what: str) -> None:
    np.testing.assert_allclose(np.asarray(got), want, rtol=RTOL, atol=1e-14, err_msg=what)


SCHEDULE = ml.StepDecay(0.02, factor=0.5, every=10)

ADAMW_CASES: list[tuple[Any, Callable[[Any], dict[str, Any]], Callable[[int], float] | None]] = [
    (ml.AdamW(), lambda torch: {}, None),  # the defaults are PyTorch's
    (
        ml.AdamW(0.01, beta1=0.8, beta2=0.99, epsilon=1e-6, weight_decay=0.3, amsgrad=True),
        lambda torch: {"lr": 0.01, "betas": (0.8, 0.99), "eps": 1e-6, "weight_decay": 0.3, "amsgrad": True},
        None,
    ),
    (ml.AdamW(SCHEDULE, weight_decay=0.1), lambda torch: {"weight_decay": 0.1}, SCHEDULE),
]


@pytest.mark.parametrize(("ours", "theirs", "rate"), ADAMW_CASES, ids=["defaults", "amsgrad", "schedule"])
def test_adamw_is_torchs_over_50_steps(ours: Any, theirs: Callable[[Any], dict[str, Any]], rate: Any) -> None:
    torch = pytest.importorskip("torch")
    params, optimizer = train_torch(lambda ps: torch.optim.AdamW(ps, **theirs(torch)), rate)
    model = train_monadl(ours, range(STEPS))
    for name, p in params.items():
        weight = getattr(model, name)
        assert_close(weight.data, p.detach().numpy(), name)
        assert weight.optimizer_state is not None
        m, v, v_max, t = weight.optimizer_state[1]
        state = optimizer.state[p]
        assert t == int(state["step"]) == STEPS
        assert_close(m, state["exp_avg"].numpy(), f"{name}: first moment")
        assert_close(v, state["exp_avg_sq"].numpy(), f"{name}: second moment")
        if ours.amsgrad:
            assert_close(v_max, state["max_exp_avg_sq"].numpy(), f"{name}: largest second moment")
        else:
            assert v_max is None


def test_adamw_decay_is_decoupled() -> None:
    """With a zero gradient, AdamW's step is the decay alone (Adam's L2 decay would take an Adam
    step along the data); without decay it is Adam's."""
    data = np.array([2.0, -4.0])
    adamw = ml.AdamW(0.1, weight_decay=0.5)
    new, _ = adamw.update(data, np.zeros(2), adamw.init(data))
    np.testing.assert_array_equal(new, data * (1.0 - 0.1 * 0.5))
    adam, plain = ml.Adam(0.1), ml.AdamW(0.1, weight_decay=0.0)
    g = np.array([0.3, -0.7])
    expected, (m, v, _) = adam.update(data, g, adam.init(data))
    got, state = plain.update(data, g, plain.init(data))
    np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(state[0], m)
    np.testing.assert_array_equal(state[1], v)


RMSPROP_CASES: list[tuple[Any, dict[str, Any], Callable[[int], float] | None]] = [
    (ml.RMSprop(), {}, None),  # the defaults are PyTorch's
    (ml.RMSprop(0.005, alpha=0.9, epsilon=1e-6), {"lr": 0.005, "alpha": 0.9, "eps": 1e-6}, None),
    (ml.RMSprop(0.005, momentum=0.9), {"lr": 0.005, "momentum": 0.9}, None),
    (ml.RMSprop(0.005, centered=True), {"lr": 0.005, "centered": True}, None),
    (
        ml.RMSprop(0.002, alpha=0.95, momentum=0.5, centered=True, weight_decay=0.05),
        {"lr": 0.002, "alpha": 0.95, "momentum": 0.5, "centered": True, "weight_decay": 0.05},
        None,
    ),
    (ml.RMSprop(SCHEDULE, momentum=0.3), {"momentum": 0.3}, SCHEDULE),
]


@pytest.mark.parametrize(
    ("ours", "theirs", "rate"),
    RMSPROP_CASES,
    ids=["defaults", "alpha eps", "momentum", "centered", "everything", "schedule"],
)
def test_rmsprop_is_torchs_over_50_steps(ours: Any, theirs: dict[str, Any], rate: Any) -> None:
    torch = pytest.importorskip("torch")
    params, optimizer = train_torch(lambda ps: torch.optim.RMSprop(ps, **theirs), rate)
    model = train_monadl(ours, range(STEPS))
    for name, p in params.items():
        weight = getattr(model, name)
        assert_close(weight.data, p.detach().numpy(), name)
        assert weight.optimizer_state is not None
        square, velocity, mean, t = weight.optimizer_state[1]
        state = optimizer.state[p]
        assert t == int(state["step"]) == STEPS
        assert_close(square, state["square_avg"].numpy(), f"{name}: mean of squares")
        if ours.momentum:
            assert_close(velocity, state["momentum_buffer"].numpy(), f"{name}: velocity")
        else:
            assert velocity is None
        if ours.centered:
            assert_close(mean, state["grad_avg"].numpy(), f"{name}: mean gradient")
        else:
            assert mean is None


RESUMED = [
    ml.AdamW(0.01, weight_decay=0.1, amsgrad=True),
    ml.AdamW(SCHEDULE),
    ml.RMSprop(0.005, momentum=0.9, centered=True, weight_decay=0.01),
    ml.RMSprop(SCHEDULE),
]


@pytest.mark.parametrize("optimizer", RESUMED, ids=repr)
def test_a_checkpoint_resumes_to_the_same_bits(optimizer: Any) -> None:
    straight = train_monadl(optimizer, range(STEPS))
    saved = to_bytes(train_monadl(optimizer, range(20)))
    resumed = Net(**{name: ArrayWeight(np.zeros_like(v)) for name, v in initial().items()})
    from_bytes(saved, resumed)
    assert resumed.w1.optimizer_state is not None and resumed.w1.optimizer_state[0] == optimizer
    train_monadl(optimizer, range(20, STEPS), resumed)
    for name in initial():
        a, b = getattr(straight, name), getattr(resumed, name)
        assert a.data.tobytes() == b.data.tobytes(), name
        assert repr(a.optimizer_state) == repr(b.optimizer_state), name


@pytest.mark.parametrize(
    ("optimizer", "state", "message"),
    [
        (ml.AdamW(), lambda s: s[:3], r"the state is a tuple of 3 items, not a tuple \(first moment"),
        (
            ml.AdamW(amsgrad=True),
            lambda s: (s[0], s[1], -s[2], s[3]),
            "largest second moment has a negative entry",
        ),
        (
            ml.AdamW(),
            lambda s: (s[0], s[1], s[0][:1], s[3]),
            r"largest second moment is a float64 \(1, 5\) ndarray",
        ),
        (ml.RMSprop(), lambda s: (-s[0] - 1.0, *s[1:]), "mean of squares has a negative entry"),
        (
            ml.RMSprop(momentum=0.5),
            lambda s: (s[0], s[1].T, *s[2:]),
            r"velocity is a float64 \(5, 3\) ndarray",
        ),
        (ml.RMSprop(centered=True), lambda s: (*s[:3], -1), "step count is int -1"),
    ],
    ids=[
        "AdamW 3 items",
        "AdamW negative max",
        "AdamW max shape",
        "RMSprop negative",
        "RMSprop velocity",
        "step",
    ],
)
def test_check_state_names_what_does_not_fit(optimizer: Any, state: Any, message: str) -> None:
    model = train_monadl(optimizer, range(3))
    assert model.w1.optimizer_state is not None
    good = model.w1.optimizer_state[1]
    assert optimizer.check_state(good, model.w1.data) is None
    problem = optimizer.check_state(state(good), model.w1.data)
    assert problem is not None and re.search(message, problem), problem


def _edited(raw: bytes, edit: Callable[[dict[str, Any]], None]) -> bytes:
    """The checkpoint ``raw`` with its monadl description changed by ``edit`` (see
    test_optimizer_state, which edits files the same way)."""
    length = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + length])
    described = json.loads(header["__metadata__"]["monadl"])
    sealed = described.pop("sha256", None) is not None
    edit(described)
    if sealed:
        described["sha256"] = hashlib.sha256(json.dumps(described).encode()).hexdigest()
    header["__metadata__"]["monadl"] = json.dumps(described)
    encoded = json.dumps(header).encode()
    encoded += b" " * (-len(encoded) % 8)
    return len(encoded).to_bytes(8, "little") + encoded + raw[8 + length :]


@pytest.mark.parametrize(
    ("optimizer", "message"),
    [
        (ml.AdamW(amsgrad=True), r"weight 'w1': .*AdamW: the state is a tuple of 3 items"),
        (ml.RMSprop(momentum=0.5), r"weight 'w1': .*RMSprop: the state is a tuple of 3 items"),
    ],
    ids=["AdamW", "RMSprop"],
)
def test_a_checkpoint_whose_state_does_not_fit_is_refused_and_changes_nothing(
    optimizer: Any, message: str
) -> None:
    def drop_one(described: dict[str, Any]) -> None:
        state = described["weights"]["w1"]["state"]
        state["tuple"] = state["tuple"][:3]

    raw = _edited(to_bytes(train_monadl(optimizer, range(3))), drop_one)
    target = train_monadl(optimizer, range(5))
    before = [(np.asarray(w.data).tobytes(), repr(w.optimizer_state)) for w in target.weights().values()]
    with pytest.raises(CheckpointError, match=message):
        from_bytes(raw, target)
    after = [(np.asarray(w.data).tobytes(), repr(w.optimizer_state)) for w in target.weights().values()]
    assert after == before


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"beta1": 1.0}, "betas must be in"),
        ({"weight_decay": -0.1}, "weight_decay must be >= 0"),
        ({"epsilon": -1.0}, "epsilon must be >= 0"),
    ],
)
def test_adamw_settings_are_checked(settings: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ml.AdamW(**settings)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"alpha": 1.5}, "alpha must be in"),
        ({"momentum": 1.0}, "momentum must be in"),
        ({"learning_rate": 0.0}, "learning_rate must be > 0"),
        ({"epsilon": -1.0}, "epsilon must be >= 0"),
    ],
)
def test_rmsprop_settings_are_checked(settings: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ml.RMSprop(**settings)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_adamw_on_a_large_tables_sparse_gradient_is_its_dense_rule_bit_for_bit(dtype: Any) -> None:
    """A table over 32k elements is updated a chunk of rows at a time, from a sparse gradient's
    rows without a dense gradient: the same bits as the rule on the dense gradient, written out."""
    from monadl.dsl.learning.optimizers.adam import adam_rule
    from monadl.typeclasses.sparse import SparseRows

    rng = np.random.default_rng(4)
    shape = (3000, 16)
    data = rng.standard_normal(shape).astype(dtype)
    adamw = ml.AdamW(0.01, weight_decay=0.1)
    state = adamw.init(data)
    expected, m, v = data, state[0], state[1]
    for t in range(1, 4):
        indices = np.concatenate([rng.integers(0, 3000, 40), [2999, 2999, 0]])
        gradient = SparseRows(indices, rng.standard_normal((43, 16)).astype(dtype), shape)
        data, state = adamw.update(data, gradient, state)
        decayed = expected * (1.0 - 0.01 * 0.1)
        expected, m, v = adam_rule(decayed, gradient.to_dense(), m, v, 0.9, 0.999, t, 0.01, 1e-8)
    assert data.dtype == dtype and state[2] is None and state[3] == 3
    for got, want in ((data, expected), (state[0], m), (state[1], v)):
        assert got.tobytes() == np.asarray(want, dtype=dtype).tobytes()


@pytest.mark.parametrize(
    ("optimizer", "setting", "value", "message"),
    [
        (ml.RMSprop(0.01), "alpha", 2.0, r"settings do not make a RMSprop: alpha must be in \[0, 1\]"),
        (ml.RMSprop(0.01), "centered", 1, r"setting RMSprop.centered is 1, not a bool"),
        (ml.AdamW(), "amsgrad", "yes", r"setting AdamW.amsgrad is 'yes', not a bool"),
        (ml.AdamW(), "epsilon", -1.0, r"settings do not make a AdamW: epsilon must be >= 0"),
    ],
    ids=["alpha", "centered", "amsgrad", "epsilon"],
)
def test_a_checkpoint_with_a_setting_out_of_range_is_refused(
    optimizer: Any, setting: str, value: Any, message: str
) -> None:
    def change(described: dict[str, Any]) -> None:
        described["weights"]["w1"]["optimizer"]["fields"][setting] = value

    raw = _edited(to_bytes(train_monadl(optimizer, range(2))), change)
    with pytest.raises(CheckpointError, match=rf"weight 'w1': its optimizer's {message}"):
        from_bytes(raw, net())
