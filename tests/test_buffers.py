"""Buffers (``ml.ArrayBuffer``, ``ml.GeneratorBuffer``, your own ``ml.Buffer``): state that gradients
do not train, saved and loaded by checkpoints exactly, checked before anything changes."""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_checkpoint import buffer_states, model
from test_checkpoint_integrity import Header, nested, rewrite, weights_of

import monadl as ml

BIT_GENERATORS = [np.random.PCG64, np.random.PCG64DXSM, np.random.SFC64, np.random.Philox, np.random.MT19937]


def state_of(m: Any) -> tuple[dict[str, bytes], dict[str, Any]]:
    return {name: np.asarray(w.data).tobytes() for name, w in ml.weights_of(m).items()}, buffer_states(m)


# --------------------------------------------------------------------------------- the buffers


def test_an_array_buffer_holds_a_read_only_copy_of_its_shape_and_dtype() -> None:
    source = np.arange(3.0)
    buffer = ml.ArrayBuffer(source)
    source[0] = 7.0
    assert buffer.data[0] == 0.0 and not buffer.data.flags.writeable
    buffer.data = np.ones(3)
    np.testing.assert_array_equal(buffer.data, np.ones(3))
    with pytest.raises(
        ml.ShapeError, match=r"float32 array of shape \(3,\): the buffer holds float64 \(3,\)"
    ):
        buffer.data = np.ones(3, dtype=np.float32)
    for bad in (np.array(["a"]), np.ones(2, dtype=complex), [1.0, 2.0]):
        with pytest.raises(
            TypeError, match="ArrayBuffer: expected a NumPy array of bools, integers or floats"
        ):
            ml.ArrayBuffer(bad)  # type: ignore[arg-type]


def test_a_generator_buffer_draws_as_numpy_and_shares_a_given_bit_generator() -> None:
    np.testing.assert_array_equal(ml.GeneratorBuffer(4).random(5), np.random.default_rng(4).random(5))
    given = np.random.default_rng(4)
    shared = ml.GeneratorBuffer(given)
    first = given.random()
    assert shared.random() == np.random.default_rng(4).random(2)[1] != first
    copied = pickle.loads(pickle.dumps(shared))
    assert isinstance(copied, ml.GeneratorBuffer) and copied.random() == shared.random()


# ---------------------------------------------------------------------------- save and load


@pytest.mark.parametrize("bit_generator", BIT_GENERATORS, ids=lambda c: c.__name__)
def test_a_generator_comes_back_drawing_what_it_would_have(bit_generator: type[Any]) -> None:
    saved = ml.GeneratorBuffer(bit_generator(3))
    saved.random(7)
    saved.integers(0, 10, dtype=np.uint32)  # half a 64-bit word kept for the next 32-bit draw
    raw = ml.checkpoint.to_bytes({"g": saved})
    back = ml.GeneratorBuffer(bit_generator(11))
    ml.checkpoint.from_bytes(raw, {"g": back})
    np.testing.assert_array_equal(
        back.integers(0, 2**32, size=5, dtype=np.uint32), saved.integers(0, 2**32, size=5, dtype=np.uint32)
    )
    np.testing.assert_array_equal(back.random(5), saved.random(5))


def test_a_bit_generator_that_cannot_come_back_exactly_is_refused_at_save(tmp_path: Path) -> None:
    class Mine(np.random.PCG64):
        pass

    with pytest.raises(
        TypeError, match=r"save: buffer '1\.generator': .* a .*Mine bit generator cannot be saved"
    ):
        ml.save(tmp_path / "c.safetensors", [model(), ml.Dropout(0.5, seed=np.random.Generator(Mine(0)))])
    assert not list(tmp_path.iterdir())


@dataclass
class Counter(ml.Buffer):
    """A buffer of a user's own: a count in the JSON part, a history as an array."""

    count: int
    history: np.ndarray[Any, Any]
    kind = "counter"

    def state(self) -> ml.BufferState:
        return ml.BufferState({"history": self.history.copy()}, {"count": self.count})

    def check_state(self, state: ml.BufferState) -> str | None:
        count = state.info.get("count")
        if set(state.arrays) != {"history"} or type(count) is not int or count < 0:
            return "a count and a history"
        return None

    def load_state(self, state: ml.BufferState) -> None:
        count = state.info["count"]
        assert isinstance(count, int)
        self.count, self.history = count, state.arrays["history"]


def test_a_buffer_of_your_own_comes_back_and_its_check_refuses_what_does_not_fit() -> None:
    raw = ml.checkpoint.to_bytes({"m": model(), "c": Counter(5, np.arange(4))})
    back = Counter(0, np.zeros(1, dtype=np.int64))
    ml.checkpoint.from_bytes(raw, {"m": model(9), "c": back})
    assert back.count == 5 and back.history.tolist() == [0, 1, 2, 3]

    def negative(header: Header) -> None:
        header["buffers"]["c"]["state"]["count"] = -1

    target = {"m": model(9), "c": Counter(0, np.zeros(1, dtype=np.int64))}
    before = state_of(target)
    with pytest.raises(
        ml.CheckpointError, match=r"buffer 'c': its state does not fit it: a count and a history"
    ):
        ml.checkpoint.from_bytes(rewrite(raw, negative), target)
    assert state_of(target) == before  # neither the weights nor the other buffers changed


@pytest.mark.parametrize(
    ("counter", "message"),
    [
        (Counter(1, np.zeros(1)), None),
        (Counter((1, 2), np.zeros(1)), r"buffer 'c': its state's info\['count'\] is a tuple"),  # type: ignore[arg-type]
        (Counter(1, np.array(["x"])), r"buffer 'c': its array 'history' is a <U1 array"),
        (Counter(nested(63), np.zeros(1)), None),
        (Counter(nested(64), np.zeros(1)), r"buffer 'c': its state's info.* nests deeper than 64 levels"),
    ],
    ids=["fits", "tuple", "strings", "63 deep", "64 deep"],
)
def test_a_buffer_state_that_would_not_come_back_equal_is_refused_at_save(
    counter: Counter, message: str | None
) -> None:
    if message is None:
        ml.checkpoint.to_bytes({"c": counter})
        return
    with pytest.raises(TypeError, match=message):
        ml.checkpoint.to_bytes({"c": counter})


def _generator_state(header: Header) -> dict[str, Any]:
    state: dict[str, Any] = header["buffers"]["drop.generator"]["state"]["state"]
    return state


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda h: h["buffers"].pop("stats"),
            r"buffers do not match the model's: missing \['stats'\], unexpected none",
        ),
        (
            lambda h: h["buffers"].update(extra=h["buffers"]["stats"]),
            r"buffers do not match the model's: missing none, unexpected \['extra'\]",
        ),
        (
            lambda h: h["buffers"]["stats"].update(kind="generator"),
            r"buffer 'stats': the model's is of the kind 'array', the file's of the kind 'generator'",
        ),
        (
            lambda h: h["buffers"]["stats"].update(arrays=["other"]),
            r"buffer 'stats': its array 'other' is missing",
        ),
        (lambda h: h["buffers"]["stats"].pop("arrays"), r"buffer 'stats': its description is malformed"),
        (
            lambda h: _generator_state(h).update(bit_generator=["str", "MT19937"]),
            r"buffer 'drop.generator': .*'bit_generator' is 'MT19937', the model's generator's 'PCG64'",
        ),
        (
            lambda h: _generator_state(h)["state"].update(inc=["int", str(2**128)]),
            r"buffer 'drop.generator': .*integer at 'state.inc' is \d+, out of range",
        ),
        (
            lambda h: _generator_state(h).update(has_uint32=["int", "2"]),
            r"buffer 'drop.generator': .*integer at 'has_uint32' is 2, out of range \(below 2\)",
        ),
        (
            lambda h: _generator_state(h)["state"].update(inc=["int", "+12"]),
            r"buffer 'drop.generator': .*integer at 'state.inc' is malformed",
        ),
        (
            lambda h: _generator_state(h)["state"].pop("inc"),
            r"buffer 'drop.generator': its state does not fit it: the state has \['state'\] at 'state'",
        ),
    ],
    ids=[
        "missing",
        "unexpected",
        "kind",
        "array name",
        "entry",
        "bit generator",
        "128 bits",
        "flag",
        "text",
        "key",
    ],
)
def test_a_buffer_that_does_not_fit_is_named_and_nothing_changes(change: Any, message: str) -> None:
    raw = rewrite(ml.checkpoint.to_bytes(model()), change)
    target = model(seed=9)
    before = state_of(target)
    with pytest.raises(ml.CheckpointError, match=rf"<checkpoint bytes>: .*{message}"):
        ml.checkpoint.from_bytes(raw, target)
    assert state_of(target) == before


def test_partial_loads_the_buffers_the_file_and_the_model_share() -> None:
    saved = model()
    saved.drop.generator.random(3)
    raw = ml.checkpoint.to_bytes({"m": saved, "c": ml.ArrayBuffer(np.ones(1))})
    kept = ml.ArrayBuffer(np.zeros(1))
    target = {"m": model(9), "d": kept}
    before = state_of(target)
    with pytest.raises(
        ml.CheckpointError, match=r"buffers do not match the model's: missing \['d'\], unexpected \['c'\]"
    ):
        ml.checkpoint.from_bytes(raw, target)
    assert state_of(target) == before
    ml.checkpoint.from_bytes(raw, target, partial=True)
    assert buffer_states(target["m"]) == buffer_states(saved)
    assert kept.data.tolist() == [0.0]


def test_an_array_buffer_of_another_shape_or_non_finite_values_is_refused() -> None:
    m = model()
    raw = ml.checkpoint.to_bytes(m)
    target = model(seed=9)
    target.stats = ml.ArrayBuffer(np.zeros(3))
    with pytest.raises(
        ml.CheckpointError,
        match=r"buffer 'stats': .*the model's is float64 \(3,\), the state holds float64 \(2,\)",
    ):
        ml.checkpoint.from_bytes(raw, target)
    m.stats.data = np.array([np.nan, 1.0])
    raw = ml.checkpoint.to_bytes(m)
    with pytest.raises(
        ml.CheckpointError, match=r"buffer 'stats': its array 'data' holds NaN or infinite values"
    ):
        ml.checkpoint.from_bytes(raw, model(9))
    back = model(9)
    ml.checkpoint.from_bytes(raw, back, allow_non_finite=True)
    assert np.isnan(back.stats.data[0])


def test_a_file_of_format_2_loads_and_leaves_the_buffers_as_they_are() -> None:
    saved = model()
    saved.drop.generator.random(3)

    def format_2(header: Header) -> None:
        header["format"] = 2
        del header["buffers"]

    def without_buffers(tensors: dict[str, Any]) -> None:
        for key in [k for k in tensors if k.startswith("buffer/")]:
            del tensors[key]

    raw = rewrite(ml.checkpoint.to_bytes(saved, metadata={"step": 1}), format_2, arrays=without_buffers)
    back = model(seed=9)
    assert ml.checkpoint.from_bytes(raw, back) == {"step": 1}
    assert weights_of(back) == weights_of(saved)
    assert buffer_states(back) == buffer_states(model(seed=9))
    with_buffers = rewrite(ml.checkpoint.to_bytes(saved), lambda h: h.update(format=2))  # (format 2 has none)
    with pytest.raises(ml.CheckpointError, match=r"has the entries \['buffers', 'digests', 'format'"):
        ml.checkpoint.from_bytes(with_buffers, model(9))
