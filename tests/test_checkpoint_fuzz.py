"""A fuzzer of checkpoint loads: valid checkpoints (Adam's state, SGD's, buffers), damaged or rewritten, must
load exactly as saved or be a ``CheckpointError`` naming the file, never another exception, never
other values, and a refused load changes nothing.

Two kinds of change: damage (bytes flipped in the header or the arrays, a truncation, a wrong header
length, bytes appended), which must load the original values or be refused; and rewrites, files
someone wrote with a wrong description (values of the wrong type, keys dropped, deep nesting, arrays
of another dtype or shape, NaN), sealed with matching digests or as format 1, which must load or be
refused, never crash. ``MONADL_CHECKPOINT_FUZZ_EXAMPLES=5000`` runs that many random examples of
each (CI runs a fixed 200); ``pytest -s`` prints the outcomes."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import sys
from collections import Counter
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.numpy import load as decode
from safetensors.numpy import save as encode
from test_checkpoint import buffer_states, model, train

import monadl as ml

EXAMPLES = int(os.environ.get("MONADL_CHECKPOINT_FUZZ_EXAMPLES", "0"))
"""Examples per test for an exploratory run (random ones); 0: CI's fixed 200."""
FUZZ_SETTINGS = settings(
    max_examples=EXAMPLES or 200,
    deadline=None,
    derandomize=not EXAMPLES,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
OUTCOMES: Counter[str] = Counter()
Arrays = dict[str, np.ndarray[Any, Any]]
Snapshot = tuple[dict[str, bytes], dict[str, str], dict[str, Any]]


@functools.cache
def base(optimizer: str) -> tuple[bytes, Snapshot, dict[str, Any]]:
    """A valid checkpoint, the state it holds and its metadata."""
    m = model()
    train(m, ml.Adam(ml.CosineDecay(0.02, steps=40)) if optimizer == "adam" else ml.SGD(0.1), range(2))
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
    ``deep``: the JSON text that replaces the placeholder (deeper than ``json.dumps`` can go)."""
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
            header["digests"] = {
                k: hashlib.sha256(f"{v.dtype.str}{v.shape}".encode() + v.tobytes()).hexdigest()
                for k, v in tensors.items()
            }
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


def _get(value: Any, at: tuple[Any, ...]) -> Any:
    for key in at:
        value = value[key]
    return value


def attempt(raw: bytes, allow_non_finite: bool) -> tuple[str, dict[str, Any] | None, Snapshot]:
    """Loads ``raw`` into a model of other values: the outcome, the metadata and the model's state
    (a refused load must leave the state it had)."""
    target = model(seed=9)
    before = snapshot(target)
    try:
        metadata = ml.checkpoint.from_bytes(raw, target, allow_non_finite=allow_non_finite)
    except ml.CheckpointError as e:
        assert str(e).startswith("<checkpoint bytes>: "), e  # names the file
        assert snapshot(target) == before, "a refused load changed the model"
        return "refused", None, before
    except RecursionError as e:  # (stated: the exception that motivated this fuzzer)
        pytest.fail(f"RecursionError, not a CheckpointError: {e}")
    return "loaded", metadata, snapshot(target)


@FUZZ_SETTINGS
@given(data=st.data(), optimizer=st.sampled_from(["adam", "sgd"]), allow_non_finite=st.booleans())
def test_a_damaged_checkpoint_loads_as_saved_or_is_a_checkpoint_error(
    data: st.DataObject, optimizer: str, allow_non_finite: bool
) -> None:
    raw, saved, metadata = base(optimizer)
    damaged = damage(data, raw)
    outcome, loaded, state = attempt(damaged, allow_non_finite)
    OUTCOMES[f"damaged: {outcome}{' (unchanged bytes)' if damaged == raw else ''}"] += 1
    if outcome == "loaded":  # only a change of no meaning (JSON whitespace, say) may load
        assert state == saved, "a damaged checkpoint loaded other values"
        assert loaded == metadata and repr(loaded) == repr(metadata)


@FUZZ_SETTINGS
@given(data=st.data(), optimizer=st.sampled_from(["adam", "sgd"]), allow_non_finite=st.booleans())
def test_a_rewritten_checkpoint_loads_or_is_a_checkpoint_error(
    data: st.DataObject, optimizer: str, allow_non_finite: bool
) -> None:
    raw, _, _ = base(optimizer)
    outcome, loaded, _ = attempt(rewrite(data, raw), allow_non_finite)
    OUTCOMES[f"rewritten: {outcome}"] += 1
    if loaded is not None:  # what loads is metadata that could have been saved
        ml.checkpoint.to_bytes(model(), metadata=loaded)


def test_print_the_outcomes() -> None:
    # Last in the file: the counts of the two fuzz tests above (shown with ``pytest -s``).
    sys.stderr.write(
        "\ncheckpoint fuzz outcomes: " + json.dumps(dict(sorted(OUTCOMES.items())), indent=1) + "\n"
    )
