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
from returns.result import Success
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
        ({"a": {"b": 10**4300}}, r"metadata\['a'\]\['b'\] is an int of more than 4300 digits"),
        ({"a": [-(10**5000)]}, r"metadata\['a'\]\[0\] is an int of more than 4300 digits"),
    ],
    ids=[
        "int key",
        "tuple",
        "pairs",
        "set",
        "nan",
        "inf",
        "5000 deep",
        "65 deep",
        "array",
        "4301 digits",
        "5001",
    ],
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
        "digits": [10**4300 - 1, -(10**4300) + 1],  # 4,300 digits: what json reads in every process
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


@pytest.mark.parametrize(
    "number", ["1e999", "-1e999", "1" + "0" * 400 + ".0"], ids=["1e999", "-1e999", "10**400."]
)
@pytest.mark.parametrize("where", ["metadata", "learning rate", "step count"])
@pytest.mark.parametrize("legacy", [False, True], ids=["format2", "format1"])
def test_a_number_json_reads_as_infinity_is_a_checkpoint_error(number: str, where: str, legacy: bool) -> None:
    # Python's json reads a number beyond a float's range as infinity, with no parse_constant call.
    raw = ml.checkpoint.to_bytes(trained(ml.Adam(0.0123)), metadata={"loss": 1.5})
    found = {"metadata": "1.5", "learning rate": "0.0123", "step count": '"int": 2'}[where]
    new = number if where != "step count" else f'"int": {number}'
    refused(
        rewrite(raw, text=lambda t: t.replace(found, new), legacy=legacy),
        rf"<checkpoint bytes>: the checkpoint's description is not exact JSON: {number[:20]}.* is not a "
        "finite number",
    )


@pytest.mark.parametrize("digits", [4301, 5001])
@pytest.mark.parametrize("where", ["metadata", "step count"])
def test_an_int_of_more_than_4300_digits_is_a_checkpoint_error(digits: int, where: str) -> None:
    raw = ml.checkpoint.to_bytes(trained(), metadata={"step": 7})
    found = {"metadata": '"step": 7', "step count": '"int": 2'}[where]
    new = found[:-1] + "1" * digits
    refused(
        rewrite(raw, text=lambda t: t.replace(found, new)),
        rf"the checkpoint's description is not exact JSON: an int of {digits} digits \(more than 4300\)",
    )


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


# ---------------------------------------------------------------- values and settings in range


def batch_norm(seed: int = 0) -> Any:
    """A batch-norm layer whose running statistics a step moved from their start."""
    norm = ml.nn.BatchNorm1d.new(3, dtype=np.float64)
    x = np.random.default_rng(seed).normal(size=(8, 3)) * (seed + 2)
    assert isinstance(ml.sum(norm(x) * x).train_blocking(ml.SGD(0.1)), Success)
    return norm


def statistics(norm: Any) -> tuple[bytes, ...]:
    return tuple(np.asarray(a).tobytes() for a in (norm.running_mean.data, norm.running_var.data))


@pytest.mark.parametrize("allow_non_finite", [False, True])
def test_a_negative_running_variance_is_a_checkpoint_error(allow_non_finite: bool) -> None:
    def negative(tensors: dict[str, np.ndarray[Any, Any]]) -> None:
        tensors["buffer/running_var/data"][1] = -1e-3

    raw = rewrite(ml.checkpoint.to_bytes(batch_norm()), arrays=negative)
    target = batch_norm(seed=5)
    before = statistics(target), np.asarray(target.weight.data).tobytes()
    with pytest.raises(
        ml.CheckpointError,
        match=r"<checkpoint bytes>: buffer 'running_var': its state does not fit it: a running variance "
        r"has a negative entry",
    ):
        ml.checkpoint.from_bytes(raw, target, allow_non_finite=allow_non_finite)
    assert (statistics(target), np.asarray(target.weight.data).tobytes()) == before

    def zero(tensors: dict[str, np.ndarray[Any, Any]]) -> None:  # 0 is a variance: it loads
        tensors["buffer/running_var/data"][1] = 0.0

    ml.checkpoint.from_bytes(rewrite(raw, arrays=zero), target)
    assert target.running_var.data[1] == 0.0
    assert np.isfinite(target(np.ones((2, 3))).predict_blocking().unwrap()).all()


def with_step(raw: bytes, step: int) -> bytes:
    def change(header: Header) -> None:
        for entry in header["weights"].values():
            state = entry["state"]
            if "tuple" in state:
                state["tuple"][-1] = {"int": step}
            else:
                entry["state"] = {"int": step}

    return rewrite(raw, change)


@pytest.mark.parametrize(
    "optimizer", [ml.Adam(0.01), ml.SGD(0.1), ml.Adagrad(0.1), ml.Momentum(0.1)], ids=repr
)
def test_a_step_count_past_2_63_is_a_checkpoint_error_and_one_below_trains(optimizer: Any) -> None:
    raw = ml.checkpoint.to_bytes(trained(optimizer))
    for step in (10**400, 2**63):
        refused(
            with_step(raw, step),
            rf"weight 'w': its optimizer state does not fit its {type(optimizer).__name__}: the step count "
            rf"is an int of {step.bit_length()} bits, more than 2\*\*63 - 1",
        )
    back = model(seed=9)
    ml.checkpoint.from_bytes(with_step(raw, 2**63 - 1), back)
    train(back, optimizer, range(2))  # every update's rule takes such a step count
    assert all(np.isfinite(np.asarray(w.data)).all() for w in back.weights().values())


def with_settings(raw: bytes, change: Callable[[dict[str, Any]], object], legacy: bool = False) -> bytes:
    """``raw`` with ``change`` applied to the settings (``fields``) of each weight's optimizer."""

    def apply(header: Header) -> None:
        for entry in header["weights"].values():
            change(entry["optimizer"]["fields"])

    return rewrite(raw, apply, legacy=legacy)


@pytest.mark.parametrize("legacy", [False, True], ids=["format2", "format1"])
@pytest.mark.parametrize("setting", ["learning_rate", "beta2", "lazy"])
def test_an_optimizer_setting_missing_from_the_file_is_a_checkpoint_error(setting: str, legacy: bool) -> None:
    raw = ml.checkpoint.to_bytes(trained(ml.Adam(0.01, beta2=0.99, lazy=True)))
    damaged = with_settings(raw, lambda fields: fields.pop(setting), legacy)
    if legacy and setting == "lazy":  # format 1 was written before ``lazy``, when none was lazy
        back = model(seed=9)
        ml.checkpoint.from_bytes(damaged, back)
        assert back.w.optimizer_state is not None and back.w.optimizer_state[0] == ml.Adam(0.01, beta2=0.99)
        return
    refused(
        damaged, rf"weight '\w+': its optimizer's settings are not those of Adam: missing \['{setting}'\]"
    )


@pytest.mark.parametrize(
    ("optimizer", "path", "value", "message"),
    [
        (ml.Adam(0.01), ["lazy"], "yes", r"Adam\.lazy is 'yes', not a bool"),
        (ml.Adam(0.01), ["lazy"], 1, r"Adam\.lazy is 1, not a bool"),
        (ml.Adam(0.01), ["epsilon"], None, r"Adam\.epsilon is None, not a float"),
        (
            ml.Adam(0.01),
            ["weight_decay"],
            10**400,
            r"Adam\.weight_decay is 10+\.\.\. \(401 characters\), not a float",
        ),
        (ml.Adam(0.01), ["beta1"], "0.9", r"Adam\.beta1 is '0\.9', not a float"),
        (ml.Adam(0.01), ["learning_rate"], True, r"Adam\.learning_rate is True, not a float or a Schedule"),
        (
            ml.Adam(0.01),
            ["learning_rate"],
            {"class": "ClipByValue", "fields": {"limit": 1.0}},
            r"Adam\.learning_rate is ClipByValue\(limit=1\.0\), not a float or a Schedule",
        ),
        (
            ml.SGD(ml.CosineDecay(0.1, 40)),
            ["learning_rate", "fields", "steps"],
            40.0,
            r"CosineDecay\.steps is 40\.0, not an int that converts",
        ),
        (
            ml.SGD(ml.LinearWarmup(0.1, 4)),
            ["learning_rate", "fields", "then"],
            5,
            r"LinearWarmup\.then is 5, not a Schedule or None",
        ),
        (
            ml.SGD(ml.LinearWarmup(0.1, 4)),
            ["learning_rate", "fields", "steps"],
            10**400,
            r"LinearWarmup\.steps is 10+\.\.\. \(401 characters\), not an int that converts to a float",
        ),
        (
            ml.chain(ml.clip_by_value(1.0), ml.SGD(0.1)),
            ["transforms", "tuple", 0],
            {"class": "Constant", "fields": {"value": 1.0}},
            r"Chain\.transforms is \(Constant\(value=1\.0\),\), not a tuple of GradientTransforms",
        ),
        (ml.Adam(0.01), ["epsilon"], -1e-8, r"do not make a Adam: epsilon must be >= 0, got -1e-08"),
        (ml.Adagrad(0.1), ["epsilon"], -1.0, r"do not make a Adagrad: epsilon must be >= 0, got -1\.0"),
    ],
    ids=[
        "lazy str",
        "lazy int",
        "epsilon None",
        "weight decay past a float",
        "beta1 str",
        "rate bool",
        "rate transform",
        "steps float",
        "then int",
        "warm-up steps past a float",
        "transforms schedule",
        "Adam epsilon < 0",
        "Adagrad epsilon < 0",
    ],
)
def test_an_optimizer_setting_of_another_type_or_range_is_a_checkpoint_error(
    optimizer: Any, path: list[Any], value: Any, message: str
) -> None:
    def change(fields: dict[str, Any]) -> None:
        where: Any = fields
        for key in path[:-1]:
            where = where[key]
        where[path[-1]] = value

    refused(
        with_settings(ml.checkpoint.to_bytes(trained(optimizer)), change),
        rf"weight '\w+': its optimizer's (setting )?.*{message}",
    )


@pytest.mark.parametrize(
    ("optimizer", "message"),
    [
        (ml.Adam(0.01, lazy="yes"), r"Adam\.lazy = 'yes', not a bool"),  # type: ignore[arg-type]
        (ml.Momentum(0.1, lazy=1), r"Momentum\.lazy = 1, not a bool"),  # type: ignore[arg-type]
    ],
    ids=["str", "int"],
)
def test_an_optimizer_setting_of_another_type_is_a_type_error_at_save(optimizer: Any, message: str) -> None:
    m = model()
    train(m, optimizer, range(1))  # it trains: only its description would not load
    with pytest.raises(TypeError, match=rf"save: the optimizer of 'w' has the setting {message}"):
        ml.checkpoint.to_bytes(m)


@pytest.mark.parametrize("cls", [ml.Adam, ml.Adagrad])
def test_a_negative_epsilon_or_a_nan_weight_decay_is_refused_when_made(cls: Any) -> None:
    with pytest.raises(ValueError, match=r"epsilon must be >= 0, got -1e-08"):
        cls(0.01, epsilon=-1e-8)
    with pytest.raises(ValueError, match=r"weight_decay must be >= 0, got nan"):
        cls(0.01, weight_decay=float("nan"))
