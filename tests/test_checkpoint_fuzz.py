"""A fuzzer of checkpoint loads: valid checkpoints (Adam's state, SGD's, a chain's with Momentum,
Adagrad's, buffers: a generator, batch norm's running statistics), damaged or rewritten, must load
exactly as saved or be a ``CheckpointError`` naming the file, never another exception, never other
values, and a refused load changes nothing.

Two kinds of change: damage (bytes flipped in the header or the arrays, a truncation, a wrong header
length, bytes appended), which must load the original values or be refused; and rewrites, files
someone wrote with a wrong description or wrong values, sealed with matching digests or as format 1:
values of the wrong type, keys dropped, deep nesting, arrays of another dtype or shape, NaN; numbers
out of range in the description's text (``1e999``, which JSON reads as infinity, ints of thousands
of digits), optimizer settings dropped or of another type, step counts out of range, array entries
out of range (a negative variance or second moment, NaN statistics). A rewritten file must be
refused, or load what it says: the loaded model saves again to the same description and arrays,
every optimizer setting of its declared kind, and where everything loaded is finite, predictions are
finite and a training step succeeds (or, where a setting was rewritten, fails only as non-finite).
And metadata (ints of up to 5,001 digits, NaN, tuples, sets among it) saves and loads back equal or
is a ``TypeError`` at save naming its key. ``MONADL_CHECKPOINT_FUZZ_EXAMPLES=5000`` runs that many
random examples of each test (CI runs a fixed 100); ``pytest -s`` prints the outcomes."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import os
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from returns.result import Failure, Success
from safetensors.numpy import load as decode
from safetensors.numpy import save as encode
from test_checkpoint import buffer_states, model

import monadl as ml
from monadl import ArrayWeight
from monadl.nn import BatchNorm1d

EXAMPLES = int(os.environ.get("MONADL_CHECKPOINT_FUZZ_EXAMPLES", "0"))
"""Examples per test for an exploratory run (random ones); 0: CI's fixed 100."""
FUZZ_SETTINGS = settings(
    max_examples=EXAMPLES or 100,
    deadline=None,
    derandomize=not EXAMPLES,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
OUTCOMES: Counter[str] = Counter()
Arrays = dict[str, np.ndarray[Any, Any]]
Snapshot = tuple[dict[str, bytes], dict[str, str], dict[str, Any]]


@dataclasses.dataclass
class Normed(ml.Module):
    """A model with batch norm: its running statistics are buffers a load must check."""

    w: ArrayWeight
    norm: BatchNorm1d

    def loss(self, step: int) -> ml.FloatLayer:
        x = np.random.default_rng(step).normal(size=(6, 3))
        h = ml.tanh(self.norm(ml.linear(x, self.w, 0.5)))
        return ml.mean(h * h)


def normed(seed: int = 0) -> Normed:
    return Normed(ArrayWeight.normal((3, 2), seed=seed), BatchNorm1d.new(2, dtype=np.float64))


BASES: dict[str, tuple[Callable[..., Any], Callable[[], ml.Optimizer]]] = {
    "adam": (model, lambda: ml.Adam(ml.CosineDecay(0.02, steps=40))),
    "sgd": (model, lambda: ml.SGD(0.1)),
    "momentum": (
        model,
        lambda: ml.chain(
            ml.clip_by_global_norm(1.0),
            ml.Momentum(ml.LinearWarmup(0.05, 4, then=ml.StepDecay(0.05, every=3)), lazy=True),
        ),
    ),
    "norm": (normed, lambda: ml.Adagrad(ml.Constant(0.1))),
}
"""The valid checkpoints the fuzz starts from: a model, and the optimizer it was trained with."""
OPTIMIZERS = st.sampled_from(sorted(BASES))


@functools.cache
def base(optimizer: str) -> tuple[bytes, Snapshot, dict[str, Any]]:
    """A valid checkpoint, the state it holds and its metadata."""
    build, make = BASES[optimizer]
    m = build()
    for step in range(2):
        assert isinstance(m.loss(step).train_blocking(make()), Success)
    metadata: dict[str, Any] = {"step": 2, "note": "x", "losses": [1.5, 0.25], "run": {"seed": 0}}
    return ml.checkpoint.to_bytes(m, metadata=metadata), snapshot(m), metadata


def snapshot(m: Any) -> Snapshot:
    weights = m.weights()
    return (
        {name: np.asarray(w.data).tobytes() for name, w in weights.items()},
        {name: repr(w.optimizer_state) for name, w in weights.items()},
        buffer_states(m),
    )


def parts(raw: bytes) -> tuple[Arrays, dict[str, Any]]:
    length = int.from_bytes(raw[:8], "little")
    described = json.loads(json.loads(raw[8 : 8 + length])["__metadata__"]["monadl"])
    return {k: np.array(v) for k, v in decode(raw).items()}, described


PLACEHOLDER = "\x00nested\x00"


def seal(tensors: Arrays, header: Any, legacy: bool, deep: str = "") -> bytes:
    """A file as a writer would make it of ``header`` (its digests, if any, kept as they are);
    ``deep``: the JSON text that replaces the placeholder (nesting deeper than ``json.dumps`` goes,
    a number it would not write)."""
    if not legacy and isinstance(header, dict):  # its digest made anew, of its text without it
        header = {k: v for k, v in header.items() if k != "sha256"}
        inner = json.dumps(header).replace(json.dumps(PLACEHOLDER), deep)
        header["sha256"] = hashlib.sha256(inner.encode("utf-8", "surrogatepass")).hexdigest()
    text = json.dumps(header)  # NaN is written as NaN: the loader must refuse it
    text = text.replace(json.dumps(PLACEHOLDER), deep)
    encoded: bytes = encode(tensors, metadata={"monadl": text})
    return encoded


def paths(value: Any, at: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every place in a JSON value (``()`` the value itself)."""
    yield at
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        yield from paths(item, (*at, key))


def nest(value: Any, depth: int, as_dict: bool) -> str:
    """``value`` in ``depth`` lists or dicts, as JSON text."""
    return ('{"k": ' if as_dict else "[") * depth + json.dumps(value) + ("}" if as_dict else "]") * depth


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_subnormal=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6,
)


def damage(data: st.DataObject, raw: bytes) -> bytes:
    """``raw`` damaged as storage or a transfer might: flips, truncation, a wrong length."""
    out = bytearray(raw)
    length = int.from_bytes(raw[:8], "little")
    how = data.draw(st.sampled_from(["flip", "flip header", "flip data", "truncate", "length", "append"]))
    OUTCOMES[f"damage: {how}"] += 1
    if how == "truncate":
        return bytes(out[: data.draw(st.integers(0, len(out) - 1))])
    if how == "length":
        new = data.draw(st.integers(0, 2**64 - 1) | st.integers(max(length - 64, 0), length + 64))
        out[:8] = new.to_bytes(8, "little")
        return bytes(out)
    if how == "append":
        return bytes(out) + data.draw(st.binary(min_size=1, max_size=16))
    lo, hi = {"flip": (0, len(out)), "flip header": (8, 8 + length), "flip data": (8 + length, len(out))}[how]
    for _ in range(data.draw(st.integers(1, 4))):
        out[data.draw(st.integers(lo, hi - 1))] ^= data.draw(st.integers(1, 255))
    return bytes(out)


def rewrite(data: st.DataObject, raw: bytes) -> bytes:
    """``raw``'s description or arrays changed and sealed again: a wrong file, not a damaged one."""
    tensors, header = parts(raw)
    legacy = data.draw(st.booleans())
    if legacy:
        header["format"] = 1
        header.pop("digests", None)
        header.pop("buffers", None)
    how = data.draw(st.sampled_from(["replace", "drop", "nest", "array"]))
    OUTCOMES[f"rewrite: {how}{' (format 1)' if legacy else ''}"] += 1
    if how == "array":
        name = data.draw(st.sampled_from(sorted(tensors)))
        change = data.draw(st.sampled_from(["drop", "float32", "int64", "reshape", "nan", "inf", "extra"]))
        if change == "drop":
            del tensors[name]
        elif change in ("float32", "int64"):
            tensors[name] = tensors[name].astype(change)
        elif change == "reshape":
            tensors[name] = tensors[name].reshape(-1, 1)
        elif change == "extra":
            tensors[f"{name}x"] = tensors[name]
        elif tensors[name].size:
            tensors[name] = tensors[name].copy()
            tensors[name].reshape(-1)[0] = np.nan if change == "nan" else np.inf
        if not legacy and data.draw(st.booleans()):  # digests of the new arrays: else a mismatch
            header["digests"] = {k: _digest(v) for k, v in tensors.items()}
        return seal(tensors, header, legacy)
    at = data.draw(st.sampled_from(list(paths(header))))
    parent: Any = None if not at else _get(header, at[:-1])
    key: Any = at[-1] if at else None
    if how == "drop" and isinstance(parent, dict):
        del parent[key]
    elif how == "drop" and isinstance(parent, list):
        parent.pop(key)
    else:
        old, deep = _get(header, at), ""
        if how == "nest":
            depth = data.draw(st.sampled_from([1, 2, 62, 63, 64, 65, 66, 67, 68, 900, 3000, 100_000]))
            new: Any = PLACEHOLDER
            deep = nest(old, depth, data.draw(st.booleans()))
        else:
            new = data.draw(JSON_VALUES)
        if parent is None:
            header = new
        else:
            parent[key] = new
        return seal(tensors, header, legacy, deep)
    return seal(tensors, header, legacy)


NUMBERS = [
    "1e999",
    "-1e999",
    "1e400",
    "1" + "0" * 400 + ".0",
    "1e-400",
    "1e308",
    "-1",
    "0",
    "-0.0",
    "0.5",
    str(2**63 - 1),
    str(2**63),
    str(10**400),
    "7" * 4300,
    "7" * 4301,
    "-" + "9" * 5000,
]
"""Numbers as a description's text may hold them: past a float's range (JSON reads them as infinity)
and below it (0.0), ints past 64 bits and past the 4,300 digits Python's json reads, ordinary ones."""
SETTINGS = [
    "yes",
    "",
    1,
    0,
    -1,
    True,
    False,
    None,
    0.5,
    -1.0,
    0.0,
    40.0,
    2**63,
    [],
    {},
    [0.1],
    {"tuple": []},
    {"class": "Constant", "fields": {"value": 0.1}},
    {"class": "ClipByValue", "fields": {"limit": 1.0}},
    {"class": "SGD", "fields": {"learning_rate": 0.1, "weight_decay": 0.0}},
    {"class": "Adam", "fields": {}},
]
"""Values an optimizer's (or schedule's) setting may be rewritten to: of every JSON type, in and out
of each setting's range, other classes of monadl's."""
STEPS: list[Any] = [-1, 0, 2**63 - 1, 2**63, 10**400]
STEP_STATES: list[Any] = [{"value": None}, {"value": True}, {"float": 0}, {"int": "3"}]
ENTRIES = [-1.0, -1e-3, -0.0, 0.0, 2.5, np.nan, np.inf, -np.inf]
"""Values an array's entry may be rewritten to: negative ones (a variance, a second moment or a sum
of squares must not be), zeros, an ordinary one, non-finite ones."""


def places(header: Any, test: Callable[[Any], bool]) -> list[tuple[Any, ...]]:
    """The paths of the description's values for which ``test`` holds."""
    return [at for at in paths(header) if test(_get(header, at))]


def step_counts(header: Any) -> list[tuple[Any, ...]]:
    """The paths of the step counts of the weights' optimizer states (SGD's state is one)."""
    found: list[tuple[Any, ...]] = []
    for name, entry in header["weights"].items():
        state = entry.get("state")
        if isinstance(state, dict) and "tuple" in state:
            found.append(("weights", name, "state", "tuple", len(state["tuple"]) - 1))
        elif isinstance(state, dict):
            found.append(("weights", name, "state"))
    return found


def out_of_range(data: st.DataObject, raw: bytes) -> tuple[bytes, str]:
    """``raw`` with one thing out of range, sealed again (or as format 1): a number of the
    description's text, an optimizer setting dropped or changed, a step count, an array's entry.
    Also the kind of change."""
    tensors, header = parts(raw)
    legacy = data.draw(st.booleans())
    if legacy:
        header["format"] = 1
        header.pop("digests", None)
        header.pop("buffers", None)
    how = data.draw(st.sampled_from(["number", "setting", "step", "entry"]))
    OUTCOMES[f"out of range: {how}{' (format 1)' if legacy else ''}"] += 1
    if how == "number":
        numbers = places(header, lambda v: isinstance(v, (int, float)) and not isinstance(v, bool))
        at = data.draw(st.sampled_from(numbers))
        parent = _get(header, at[:-1])
        parent[at[-1]] = PLACEHOLDER
        return seal(tensors, header, legacy, data.draw(st.sampled_from(NUMBERS))), how
    if how == "setting":
        fields = places(header, lambda v: isinstance(v, dict) and set(v) == {"class", "fields"})
        settings_ = _get(header, data.draw(st.sampled_from(fields)))["fields"]
        name = data.draw(st.sampled_from(sorted(settings_)))
        change = data.draw(st.sampled_from(["drop", "change", "add"]))
        if change == "drop":
            del settings_[name]
        elif change == "change":
            settings_[name] = data.draw(st.sampled_from(SETTINGS))
        else:
            settings_[f"{name}_"] = settings_[name]
        return seal(tensors, header, legacy), how
    if how == "step":
        at = data.draw(st.sampled_from(step_counts(header)))
        parent = _get(header, at[:-1])
        new = data.draw(st.sampled_from(STEPS).map(lambda n: {"int": n}) | st.sampled_from(STEP_STATES))
        parent[at[-1]] = new
        return seal(tensors, header, legacy), how
    floats = sorted(k for k, v in tensors.items() if v.dtype.kind == "f" and v.size)
    buffers = [k for k in floats if k.startswith("buffer/")]  # (fewer than the rest: drawn as often)
    drawn_from_buffers: bool = bool(buffers) and data.draw(st.booleans())
    among = buffers if drawn_from_buffers else floats
    key = data.draw(st.sampled_from(among))
    tensors[key] = tensors[key].copy()
    tensors[key].reshape(-1)[data.draw(st.integers(0, tensors[key].size - 1))] = data.draw(
        st.sampled_from(ENTRIES)
    )
    if not legacy:
        header["digests"] = {k: _digest(v) for k, v in tensors.items()}
    return seal(tensors, header, legacy), how


def _digest(array: np.ndarray[Any, Any]) -> str:
    return hashlib.sha256(f"{array.dtype.str}{array.shape}".encode() + array.tobytes()).hexdigest()


def _get(value: Any, at: tuple[Any, ...]) -> Any:
    for key in at:
        value = value[key]
    return value


def attempt(
    raw: bytes, allow_non_finite: bool, optimizer: str = "adam"
) -> tuple[str, dict[str, Any] | None, Snapshot, Any]:
    """Loads ``raw`` into a model of other values: the outcome, the metadata, the model's state
    (a refused load must leave the state it had) and the model."""
    target = BASES[optimizer][0](seed=9)
    before = snapshot(target)
    try:
        metadata = ml.checkpoint.from_bytes(raw, target, allow_non_finite=allow_non_finite)
    except ml.CheckpointError as e:
        assert str(e).startswith("<checkpoint bytes>: "), e  # names the file
        assert snapshot(target) == before, "a refused load changed the model"
        return "refused", None, before, target
    except RecursionError as e:  # (stated: the exception that motivated this fuzzer)
        pytest.fail(f"RecursionError, not a CheckpointError: {e}")
    return "loaded", metadata, snapshot(target), target


# ------------------------------------------------------------------- what a loaded file must be


def resolved(raw: bytes) -> dict[str, Any]:
    """What a checkpoint says, its arrays put in place of their numbers: per weight its data and
    optimizer (state arrays as dtype, shape and bytes), per buffer its kind, info and arrays. Files
    of format 1 have no buffers and were written before ``lazy`` (so none is lazy)."""
    tensors, header = parts(raw)

    def array(key: str) -> Any:
        a = tensors.get(key)
        return None if a is None else (a.dtype.str, a.shape, a.tobytes())

    def state(value: Any, name: str) -> Any:
        if isinstance(value, dict) and len(value) == 1:
            ((kind, item),) = value.items()
            if kind in ("array", "float") and type(item) is int:
                return (kind, array(f"state/{name}/{item}"))
            if kind == "tuple" and isinstance(item, list):
                return ("tuple", [state(v, name) for v in item])
        return value

    def lazy_default(value: Any) -> Any:  # format 1: a Momentum or Adam without lazy was not lazy
        if isinstance(value, dict):
            value = {k: lazy_default(v) for k, v in value.items()}
            if value.get("class") in ("Momentum", "Adam") and isinstance(value.get("fields"), dict):
                value["fields"] = {"lazy": False, **value["fields"]}
        elif isinstance(value, list):
            value = [lazy_default(v) for v in value]
        return value

    weights = {
        name: {
            "kind": entry.get("kind"),
            "data": array(f"weight/{name}"),
            "optimizer": lazy_default(entry.get("optimizer"))
            if header["format"] == 1
            else entry.get("optimizer"),
            # (a load ignores a state without its optimizer, as it ignores keys and arrays that
            # nothing names: what is compared is what a load reads)
            "state": state(entry.get("state"), name) if "optimizer" in entry else None,
        }
        for name, entry in header["weights"].items()
    }
    buffers = {
        name: (entry["kind"], entry["state"], {k: array(f"buffer/{name}/{k}") for k in entry["arrays"]})
        for name, entry in header.get("buffers", {}).items()
    }
    return {"weights": weights, "buffers": buffers, "metadata": header["metadata"]}


def kind(value: object) -> str:
    """A setting's kind, as the checks below name it."""
    if value is None:
        return "None"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "int" if isinstance(value, int) else "float"
    if isinstance(value, tuple):
        return "tuple"
    if callable(value):
        return "schedule"
    return "transform" if hasattr(value, "transform") else "optimizer" if hasattr(value, "update") else "?"


SETTING_KINDS = {
    "learning_rate": {"int", "float", "schedule"},
    "lazy": {"bool"},
    "steps": {"int"},
    "every": {"int"},
    "then": {"schedule", "None"},
    "transforms": {"tuple"},
    "optimizer": {"optimizer"},
}
"""The kinds each setting of monadl's optimizers and schedules takes; any other setting is a number."""


def settings_problem(value: Any) -> str | None:
    """What is wrong with a loaded optimizer's settings (each of its kind, recursively), if anything."""
    for field in dataclasses.fields(value):
        setting = getattr(value, field.name)
        allowed = SETTING_KINDS.get(field.name, {"int", "float"})
        if kind(setting) not in allowed:
            return f"{type(value).__name__}.{field.name} is {setting!r}, not one of {sorted(allowed)}"
        items = setting if isinstance(setting, tuple) else (setting,)
        for item in items:
            if field.name == "transforms" and kind(item) != "transform":
                return f"{type(value).__name__}.transforms holds {item!r}"
            if dataclasses.is_dataclass(item):
                problem = settings_problem(item)
                if problem is not None:
                    return problem
    return None


def finite(target: Any) -> bool:
    """Whether every value the model holds (weights, optimizer states, buffers' arrays) is finite."""
    values: list[Any] = []
    for w in target.weights().values():
        values.append(w.data)
        state = w.optimizer_state
        stack = [state[1]] if state is not None else []
        while stack:
            item = stack.pop()
            if isinstance(item, tuple):
                stack.extend(item)
            else:
                values.append(item)
    for buffer in ml.buffers_of(target).values():
        values.extend(buffer.state().arrays.values())
    return all(
        bool(np.isfinite(np.asarray(v, dtype=np.float64)).all())
        for v in values
        if isinstance(v, (float, np.ndarray)) and np.asarray(v).dtype.kind == "f"
    )


NON_FINITE = (ml.NonFiniteLossError, ml.NonFiniteGradientError)


def check_loaded(raw: bytes, target: Any, metadata: dict[str, Any], settings_changed: bool) -> None:
    """A rewritten file that loaded loaded what it says, values a run can go on from: ``target``
    saves again to what ``raw`` describes, its optimizers' settings are of their kinds, and where
    all it holds is finite, it predicts finite values and trains a step (a step may fail as
    non-finite only where ``settings_changed``: a rate of 1e308 is a setting, not a fault)."""
    again = resolved(ml.checkpoint.to_bytes(target, metadata=metadata))
    said = resolved(raw)
    if not said["buffers"]:  # (a file of format 1: the model's buffers were left as they were)
        again["buffers"] = {}
    assert again == said, "what loaded is not what the file says"
    optimizers = [w.optimizer_state[0] for w in target.weights().values() if w.optimizer_state is not None]
    for optimizer in optimizers:
        problem = settings_problem(optimizer)
        assert problem is None, f"a setting loaded of another kind: {problem}"
    if not finite(target):
        OUTCOMES["loaded: non-finite, allowed"] += 1
        return
    predicted = target.loss(0).predict_blocking()
    assert isinstance(predicted, Success) and math.isfinite(predicted.unwrap()), f"prediction: {predicted}"
    step = target.loss(1).train_blocking(optimizers[0] if optimizers else ml.SGD(0.1))
    if isinstance(step, Failure):
        OUTCOMES[f"loaded, then a step failed: {type(step.failure()).__name__}"] += 1
        assert settings_changed and isinstance(step.failure(), NON_FINITE), (
            f"a step failed: {step.failure()!r}"
        )


# ------------------------------------------------------------------------------------- the tests


@FUZZ_SETTINGS
@given(data=st.data(), optimizer=OPTIMIZERS, allow_non_finite=st.booleans())
def test_a_damaged_checkpoint_loads_as_saved_or_is_a_checkpoint_error(
    data: st.DataObject, optimizer: str, allow_non_finite: bool
) -> None:
    raw, saved, metadata = base(optimizer)
    damaged = damage(data, raw)
    outcome, loaded, state, _ = attempt(damaged, allow_non_finite, optimizer)
    OUTCOMES[f"damaged: {outcome}{' (unchanged bytes)' if damaged == raw else ''}"] += 1
    if outcome == "loaded":  # only a change of no meaning (JSON whitespace, say) may load
        assert state == saved, "a damaged checkpoint loaded other values"
        assert loaded == metadata and repr(loaded) == repr(metadata)


@FUZZ_SETTINGS
@given(data=st.data(), optimizer=OPTIMIZERS, allow_non_finite=st.booleans())
def test_a_rewritten_checkpoint_loads_what_it_says_or_is_a_checkpoint_error(
    data: st.DataObject, optimizer: str, allow_non_finite: bool
) -> None:
    raw, _, _ = base(optimizer)
    rewritten = rewrite(data, raw)
    outcome, loaded, _, target = attempt(rewritten, allow_non_finite, optimizer)
    OUTCOMES[f"rewritten: {outcome}"] += 1
    if loaded is not None:
        check_loaded(rewritten, target, loaded, settings_changed=True)


@FUZZ_SETTINGS
@given(data=st.data(), optimizer=OPTIMIZERS, allow_non_finite=st.booleans())
def test_a_checkpoint_with_a_value_out_of_range_loads_what_it_says_or_is_a_checkpoint_error(
    data: st.DataObject, optimizer: str, allow_non_finite: bool
) -> None:
    raw, _, _ = base(optimizer)
    rewritten, how = out_of_range(data, raw)
    outcome, loaded, _, target = attempt(rewritten, allow_non_finite, optimizer)
    OUTCOMES[f"out of range: {how}: {outcome}"] += 1
    if loaded is not None:
        check_loaded(rewritten, target, loaded, settings_changed=how in ("number", "setting"))


def digits(count: int, sign: int) -> int:
    """An int of ``count`` digits (metadata loads back ints of 4,300 at most)."""
    value: int = sign * (10**count - 1)
    return value


def containers(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.text(max_size=3), inner, max_size=3)
        | st.tuples(inner)
        | st.sets(st.integers(), max_size=2)
    )


METADATA = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.builds(digits, st.sampled_from([19, 4300, 4301, 5001]), st.sampled_from([1, -1]))
    | st.floats()
    | st.text(max_size=4),
    containers,
    max_leaves=5,
)


@FUZZ_SETTINGS
@given(metadata=st.dictionaries(st.text(max_size=3), METADATA, max_size=3))
def test_metadata_saves_and_loads_back_equal_or_is_a_type_error_naming_its_key(
    metadata: dict[str, Any],
) -> None:
    try:
        raw = ml.checkpoint.to_bytes(model(), metadata=metadata)
    except TypeError as e:
        assert str(e).startswith("save: metadata"), e
        OUTCOMES["metadata: refused at save"] += 1
        return
    back = ml.checkpoint.from_bytes(raw, model(9))
    assert back == metadata and repr(back) == repr(metadata)
    OUTCOMES["metadata: saved and loaded equal"] += 1


def test_print_the_outcomes() -> None:
    # Last in the file: the counts of the fuzz tests above (shown with ``pytest -s``).
    sys.stderr.write(
        "\ncheckpoint fuzz outcomes: " + json.dumps(dict(sorted(OUTCOMES.items())), indent=1) + "\n"
    )
