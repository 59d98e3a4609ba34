"""Checkpoints refuse what they cannot give back exactly: damaged, non-finite or too deeply nested
files are a ``CheckpointError`` naming the file and the problem; metadata or schedules that would
not come back as saved are a ``TypeError`` at save; a save interrupted anywhere leaves no file."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import load as decode
from safetensors.numpy import save as encode
from test_checkpoint import buffer_states, model, same, train

import monadl as ml

Header = dict[str, Any]


def parts(raw: bytes) -> tuple[dict[str, np.ndarray[Any, Any]], Header, dict[str, str]]:
    """A checkpoint's arrays, its monadl description (parsed) and safetensors' metadata."""
    length = int.from_bytes(raw[:8], "little")
    entries: dict[str, str] = json.loads(raw[8 : 8 + length])["__metadata__"]
    return decode(raw), json.loads(entries["monadl"]), entries


def rewrite(
    raw: bytes,
    change: Callable[[Header], object] = lambda h: None,
    *,
    text: Callable[[str], str] = lambda t: t,
    legacy: bool = False,
    arrays: Callable[[dict[str, np.ndarray[Any, Any]]], object] = lambda t: None,
) -> bytes:
    """``raw`` with its description changed (and its arrays), sealed again as ``to_bytes`` would: a
    file someone wrote, not a damaged one. ``legacy``: as the format 1 of before digests."""
    tensors, header, _ = parts(raw)
    tensors = {k: np.array(v) for k, v in tensors.items()}
    arrays(tensors)
    change(header)
    if legacy:
        header["format"] = 1
        header.pop("digests", None)
        header.pop("buffers", None)
    else:
        header["digests"] = {k: digest(v) for k, v in tensors.items()}
    header.pop("sha256", None)
    described = text(json.dumps(header))
    if not legacy:  # its digest, of the text without it, as the last entry
        described = described[:-1] + f', "sha256": "{hashlib.sha256(described.encode()).hexdigest()}"}}'
    encoded: bytes = encode(tensors, metadata={"monadl": described})
    return encoded


def digest(array: np.ndarray[Any, Any]) -> str:
    """An array's digest as format 2 has it: the SHA-256 of its dtype, shape and bytes."""
    return hashlib.sha256(f"{array.dtype.str}{array.shape}".encode() + array.tobytes()).hexdigest()


def trained(optimizer: ml.Optimizer | None = None, steps: int = 2) -> Any:
    m = model()
    train(m, optimizer or ml.Adam(0.01), range(steps))
    return m


def weights_of(m: Any) -> dict[str, bytes]:
    return {name: np.asarray(w.data).tobytes() for name, w in m.weights().items()}


def refused(raw: bytes, match: str, **options: bool) -> None:
    """Loading ``raw`` is a CheckpointError matching ``match`` and changes nothing."""
    target = model(seed=9)
    before = weights_of(target), buffer_states(target)
    with pytest.raises(ml.CheckpointError, match=match):
        ml.checkpoint.from_bytes(raw, target, **options)
    assert (weights_of(target), buffer_states(target)) == before


def nested(depth: int) -> Any:
    value: Any = 0
    for _ in range(depth):
        value = [value]
    return value


# ------------------------------------------------------------------------------- deep nesting


@pytest.mark.parametrize("legacy", [False, True], ids=["format2", "format1"])
@pytest.mark.parametrize("where", ["metadata", "state", "optimizer"])
def test_a_deeply_nested_description_is_a_checkpoint_error(where: str, legacy: bool) -> None:
    def deepen(header: Header) -> None:
        entry = header["weights"]["w"]
        if where == "metadata":
            header["metadata"]["deep"] = nested(900)
        elif where == "state":
            state: Any = {"int": 0}
            for _ in range(450):
                state = {"tuple": [state]}
            entry["state"] = state
        else:
            entry["optimizer"]["fields"]["learning_rate"] = nested(900)

    raw = rewrite(ml.checkpoint.to_bytes(trained()), deepen, legacy=legacy)
    refused(
        raw, r"<checkpoint bytes>: the checkpoint's description nests (deeper than \d+ levels|too deeply)"
    )


def test_nesting_deeper_than_json_parses_is_a_checkpoint_error() -> None:
    raw = rewrite(
        ml.checkpoint.to_bytes(trained()),
        text=lambda t: t.replace(
            '"metadata": {}', '"metadata": {"d": ' + "[" * 100_000 + "]" * 100_000 + "}"
        ),
    )
    refused(raw, r"nests (too deeply|deeper)")


# ------------------------------------------------------------------------------ exact metadata


@pytest.mark.parametrize(
    ("metadata", "message"),
    [
        ({1: "x"}, r"metadata has a key 1 that is not a str"),
        ({"a": (1, 2)}, r"metadata\['a'\] is a tuple"),
        ({"a": [("k", 1)]}, r"metadata\['a'\]\[0\] is a tuple"),
        ({"a": {"b": {1, 2}}}, r"metadata\['a'\]\['b'\] is a set"),
        ({"a": float("nan")}, r"metadata\['a'\] is nan"),
        ({"a": [float("-inf")]}, r"metadata\['a'\]\[0\] is -inf"),
        ({"a": nested(5000)}, r"metadata\['a'\](\[0\])+ nests deeper than 64 levels"),
        ({"a": nested(65)}, r"nests deeper than 64 levels"),
        ({"a": np.ones(2)}, r"metadata\['a'\] is a ndarray, not a JSON value"),
    ],
    ids=["int key", "tuple", "pairs", "set", "nan", "inf", "5000 deep", "65 deep", "array"],
)
def test_metadata_that_would_not_come_back_equal_is_refused_at_save(
    metadata: dict[Any, Any], message: str, tmp_path: Path
) -> None:
    path = tmp_path / "c.safetensors"
    ml.save(path, model(), metadata={"v": "old"})
    with pytest.raises(TypeError, match=message):
        ml.save(path, model(1), metadata=metadata)
    assert [p.name for p in tmp_path.iterdir()] == [path.name]
    assert ml.load(path, model(9)) == {"v": "old"}


def test_json_metadata_comes_back_equal_and_of_the_same_types() -> None:
    metadata: dict[str, Any] = {
        "step": 2**80,
        "flags": [True, False, None],
        "rate": -0.0,
        "tiny": 5e-324,
        "text": "é\u2028\x00",
        "": {"nested": nested(63)},
        "deep": nested(64),
        "pairs": [["a", 1], ["b", 2]],
    }
    back = ml.checkpoint.from_bytes(ml.checkpoint.to_bytes(model(), metadata=metadata), model(9))
    assert back == metadata and repr(back) == repr(metadata)


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
@pytest.mark.parametrize("legacy", [False, True], ids=["format2", "format1"])
def test_a_non_finite_number_in_the_description_is_a_checkpoint_error(constant: str, legacy: bool) -> None:
    raw = rewrite(
        ml.checkpoint.to_bytes(model(), metadata={"loss": 1.5}),
        text=lambda t: t.replace("1.5", constant),
        legacy=legacy,
    )
    refused(raw, rf"the checkpoint's description is not exact JSON: {constant} is not a finite number")


def test_a_key_given_twice_is_a_checkpoint_error() -> None:
    raw = rewrite(
        ml.checkpoint.to_bytes(model(), metadata={"a": 1, "b": 2}), text=lambda t: t.replace('"b"', '"a"')
    )
    refused(raw, r"an object has a key twice")


# ---------------------------------------------------------------------------------- integrity


def test_a_flipped_byte_anywhere_in_an_array_is_a_checkpoint_error_naming_it() -> None:
    raw = ml.checkpoint.to_bytes(trained(), metadata={"step": 2})
    length = int.from_bytes(raw[:8], "little")
    layout = json.loads(raw[8 : 8 + length])
    for key, entry in layout.items():
        if key == "__metadata__":
            continue
        begin, end = entry["data_offsets"]
        for at in {begin, (begin + end) // 2, end - 1}:
            damaged = bytearray(raw)
            damaged[8 + length + at] ^= 0x01
            kind, _, rest = key.partition("/")
            name, _, k = rest.rpartition("/") if kind != "weight" else (rest, "", "")
            what = {
                "weight": f"weight '{rest}'",
                "state": rf"weight '{name}': its optimizer state \(array {k}\)",
                "buffer": f"buffer '{name}': its array '{k}'",
            }[kind]
            refused(bytes(damaged), rf"{what} does not match its digest: the file is damaged")


def test_a_changed_number_in_the_description_is_a_checkpoint_error() -> None:
    # Adam's step count and the metadata are JSON in the header: a digit changed there is caught too.
    raw = ml.checkpoint.to_bytes(trained(steps=2), metadata={"step": 2})
    text_at = raw.index(b'\\"int\\": 2')
    damaged = bytearray(raw)
    damaged[text_at + len(b'\\"int\\": ')] = ord("3")
    refused(bytes(damaged), r"the checkpoint's description does not match its digest: the file is damaged")


def test_a_file_without_its_digests_is_refused_unless_of_format_1() -> None:
    raw = ml.checkpoint.to_bytes(trained())
    tensors, header, _ = parts(raw)
    del header["sha256"]
    refused(encode(tensors, metadata={"monadl": json.dumps(header)}), r"has no digest of its description")

    def without(key: str, inner: str | None = None) -> Callable[[str], str]:
        def drop(text: str) -> str:  # after the digests were made
            header = json.loads(text)
            del (header if inner is None else header[inner])[key]
            return json.dumps(header)

        return drop

    entries = r"\['buffers', 'format', 'metadata', 'weights'\]"
    refused(rewrite(raw, text=without("digests")), rf"has the entries {entries}")
    refused(rewrite(raw, text=without("weight/w", "digests")), r"digests do not name its arrays")


def test_a_checkpoint_of_format_1_still_loads() -> None:
    saved = trained(ml.chain(ml.clip_by_global_norm(0.5), ml.Adam(ml.CosineDecay(0.02, steps=40))))
    raw = rewrite(ml.checkpoint.to_bytes(saved, metadata={"step": 2}), legacy=True)
    assert b"digest" not in raw
    back = model(seed=9)
    assert ml.checkpoint.from_bytes(raw, back) == {"step": 2}
    assert weights_of(back) == weights_of(saved)
    assert buffer_states(back) == buffer_states(model(seed=9))  # none in the file: left as they were


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_non_finite_weights_are_refused_unless_allowed(value: float, tmp_path: Path) -> None:
    m = model()
    m.w.data = np.where(np.arange(6).reshape(3, 2) == 4, value, m.w.data)
    ml.save(tmp_path / "c.safetensors", m)  # a diverged run's state can be saved, to look into it
    refused(
        (tmp_path / "c.safetensors").read_bytes(),
        r"weight 'w' holds NaN or infinite values \(load\(\.\.\., allow_non_finite=True\) loads them\)",
    )
    back = model(seed=9)
    ml.load(tmp_path / "c.safetensors", back, allow_non_finite=True)
    same(m, back)


@pytest.mark.parametrize("legacy", [False, True], ids=["format2", "format1"])
def test_non_finite_optimizer_state_is_refused_unless_allowed(legacy: bool) -> None:
    def poison(tensors: dict[str, np.ndarray[Any, Any]]) -> None:
        tensors["state/b/0"] = np.full_like(tensors["state/b/0"], np.nan)

    raw = rewrite(ml.checkpoint.to_bytes(trained()), arrays=poison, legacy=legacy)
    refused(raw, r"weight 'b': its optimizer state \(array 0\) holds NaN or infinite values")
    back = model(seed=9)
    ml.checkpoint.from_bytes(raw, back, allow_non_finite=True)
    assert back.b.optimizer_state is not None and "nan" in repr(back.b.optimizer_state)


# ----------------------------------------------------------------------------------- schedules


@dataclass(frozen=True)
class Halving:
    initial: float

    def __call__(self, step: int) -> float:
        return self.initial * 0.5**step


@pytest.mark.parametrize(
    ("schedule", "message"),
    [
        (
            lambda step: 0.01,
            r"the optimizer of 'w' has the schedule <function .*>, a plain function: .* must be one of "
            r"monadl's schedule classes \(ml\.Constant, ml\.StepDecay",
        ),
        (Halving(0.01), r"the optimizer of 'w' holds a Halving, which is not one of monadl's"),
    ],
    ids=["function", "own dataclass"],
)
def test_a_schedule_that_cannot_be_saved_is_a_clear_error_at_save(
    schedule: Any, message: str, tmp_path: Path
) -> None:
    path = tmp_path / "c.safetensors"
    ml.save(path, model(), metadata={"v": "old"})
    m = model()
    train(m, ml.Adam(schedule), range(2))  # it trains: only a save needs its settings
    with pytest.raises(TypeError, match=message):
        ml.save(path, m)
    assert [p.name for p in tmp_path.iterdir()] == [path.name]
    assert ml.load(path, model(9)) == {"v": "old"}


# ------------------------------------------------------------------------- interrupted saves

STEPS = ["open", "write", "fchmod", "fsync", "close", "replace"]


@pytest.mark.parametrize("after", [False, True], ids=["before", "after"])
@pytest.mark.parametrize("step", STEPS)
def test_an_interrupt_at_any_step_of_a_save_leaves_no_temporary_file(
    step: str, after: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "c.safetensors"
    ml.save(path, model(), metadata={"v": "old"})
    real = getattr(os, step)
    fired: list[bool] = []
    leaked: list[int] = []

    def interrupted(*args: Any, **kwargs: Any) -> Any:
        if fired:
            return real(*args, **kwargs)
        fired.append(True)
        if after:
            result = real(*args, **kwargs)
            if step == "open":
                leaked.append(result)
        elif step == "close":
            leaked.append(args[0])
        raise KeyboardInterrupt

    monkeypatch.setattr(os, step, interrupted)
    with pytest.raises(KeyboardInterrupt):
        ml.save(path, model(1), metadata={"v": "new"})
    monkeypatch.undo()
    for fd in leaked:
        os.close(fd)
    assert fired
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary file left
    replaced = step == "replace" and after
    assert ml.load(path, model(9)) == {"v": "new" if replaced else "old"}


def test_one_model_is_the_same_bytes_from_every_process() -> None:
    """safetensors orders its metadata entries at random in each process: the description and its
    digest are one entry, so that replicas (``DataParallel.digests``) and reruns compare equal."""
    import subprocess
    import sys

    script = (
        "import hashlib, numpy as np, monadl as ml\n"
        "w = ml.ArrayWeight(np.arange(6.0).reshape(2, 3))\n"
        "drop, stats = ml.Dropout(0.5, seed=3), ml.ArrayBuffer(np.ones(2))\n"
        "ml.train_blocking(ml.sum(drop(w) * w), ml.Adam(0.1))\n"
        "model = {'w': w, 'drop': drop, 'stats': stats, 'more': ml.GeneratorBuffer(np.random.MT19937(1))}\n"
        "print(hashlib.sha256(ml.checkpoint.to_bytes(model, metadata={'step': 1})).hexdigest())\n"
    )
    command = [sys.executable, "-c", script]
    runs = {subprocess.run(command, capture_output=True, text=True, check=True).stdout for _ in range(4)}
    assert len(runs) == 1
