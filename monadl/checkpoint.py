"""Checkpoints: a model's weights, their optimizer state and your metadata, in one safetensors file.

``save(path, model, metadata={"step": 20})`` writes every weight of ``model`` (a module, or any
structure :func:`~monadl.nn.weights_of` takes) under its dotted name, with its optimizer state
(Adam's moments and step count, Adagrad's sums, Momentum's velocity) and the optimizer's settings.
``load(path, model)`` puts them back and returns the metadata; training then goes on exactly as it
would have: the same bits as a run that was never interrupted.

The format is safetensors (https://huggingface.co/docs/safetensors): a JSON header and raw arrays,
no pickle, no code run on load. The header's ``"monadl"`` entry describes what the arrays are:
``weight/<name>`` holds a weight's data, ``state/<name>/<k>`` the arrays of its optimizer state.

A save is atomic: written to a temporary file, synced, renamed over ``path``, the directory synced.
A process killed at any moment leaves the old checkpoint or the new one, never a torn file.

A load validates before it changes anything: every name, shape and dtype against the model (a
mismatch names the weight; a missing or unexpected name is an error unless ``partial=True``), and
the file itself (a truncated or malformed file is a :class:`CheckpointError`, never a crash). Then
every weight and its state are committed at once, as a training step's are.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from monadl.data.files import atomic_write_bytes, read_regular_file
from monadl.dsl import optimizers, schedules
from monadl.dsl.weights import FloatWeight
from monadl.nn.module import Weight, weights_of
from monadl.runtime.versions import COMMIT_LOCK, publish, read

__all__ = ["CheckpointError", "from_bytes", "load", "save", "to_bytes"]

FORMAT = 1
_KEY = "monadl"
JSON = None | bool | int | float | str | list["JSON"] | dict[str, "JSON"]


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded into the model: malformed, truncated, of another format,
    or not matching the model's weights (the message names the file and the weight)."""


# ----------------------------------------------------------------------------------------- save


def save(path: str | Path, model: object, *, metadata: Mapping[str, JSON] | None = None) -> None:
    """Writes ``model``'s weights, their optimizer state and ``metadata`` (JSON values: a step, an
    epoch) to ``path``, atomically. The weights are read as one committed state."""
    atomic_write_bytes(Path(path), to_bytes(model, metadata=metadata))


def to_bytes(model: object, *, metadata: Mapping[str, JSON] | None = None) -> bytes:
    """The checkpoint :func:`save` writes, as bytes (to send to another process, say)."""
    from safetensors.numpy import save as encode

    weights = weights_of(model)
    tensors: dict[str, np.ndarray[Any, Any]] = {}
    described: dict[str, Any] = {}
    with COMMIT_LOCK:  # every weight as of the same commit
        versions = {name: read(w.head, None) for name, w in weights.items()}
    for name, weight in weights.items():
        version = versions[name]
        data = version.data
        entry: dict[str, Any] = {"kind": "float" if isinstance(weight, FloatWeight) else "array"}
        tensors[f"weight/{name}"] = np.asarray(data)
        if version.state is not None:
            optimizer, state = version.state
            arrays: list[np.ndarray[Any, Any]] = []
            entry["optimizer"] = _describe_optimizer(optimizer, name)
            entry["state"] = _encode_state(state, arrays, name)
            for k, array in enumerate(arrays):
                tensors[f"state/{name}/{k}"] = array
        described[name] = entry
    header = {"format": FORMAT, "weights": described, "metadata": dict(metadata or {})}
    try:
        text = json.dumps(header, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise TypeError(f"save: metadata must be JSON values (finite numbers): {e}") from None
    encoded: bytes = encode(tensors, metadata={_KEY: text})
    return encoded


def _describe_optimizer(optimizer: Any, weight: str) -> dict[str, Any]:
    """An optimizer as JSON: its class and settings, nested ones (a chain's transformations, a
    learning-rate schedule) described the same way."""
    described = _plain(optimizer, weight)
    if not isinstance(described, dict) or "class" not in described:
        raise TypeError(f"save: the optimizer of {weight!r} ({type(optimizer).__name__}) is not a dataclass")
    return described


def _plain(value: Any, weight: str) -> Any:
    """A setting as JSON: a dataclass as ``{"class", "fields"}``, a tuple as ``{"tuple"}``."""
    cls = type(value)
    if dataclasses.is_dataclass(cls):
        fields = {f.name: _plain(getattr(value, f.name), weight) for f in dataclasses.fields(cls)}
        return {"class": cls.__name__, "fields": fields}
    if isinstance(value, tuple):
        return {"tuple": [_plain(v, weight) for v in value]}
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float) and math.isfinite(value):
        return value
    raise TypeError(f"save: the optimizer of {weight!r} has a setting that is not a JSON value: {value!r}")


def _encode_state(state: Any, arrays: list[np.ndarray[Any, Any]], weight: str) -> Any:
    """An optimizer state (tuples of arrays, floats and ints) as JSON, its arrays appended to
    ``arrays``: floats go as 0-d float64 arrays, so that they come back bit for bit."""
    if isinstance(state, tuple):
        return {"tuple": [_encode_state(item, arrays, weight) for item in state]}
    if isinstance(state, bool) or state is None:
        return {"value": state}
    if isinstance(state, int):
        return {"int": state}
    if isinstance(state, float):
        arrays.append(np.asarray(state, dtype=np.float64))
        return {"float": len(arrays) - 1}
    if isinstance(state, np.ndarray):
        arrays.append(state)
        return {"array": len(arrays) - 1}
    raise TypeError(f"save: the optimizer state of {weight!r} holds a {type(state).__name__}")


# ----------------------------------------------------------------------------------------- load


def load(path: str | Path, model: object, *, partial: bool = False) -> dict[str, JSON]:
    """Puts the weights and optimizer states of the checkpoint at ``path`` into ``model`` and
    returns its metadata. ``partial``: load the weights the file and the model have in common
    (else a missing or unexpected name is an error). Nothing changes unless everything fits."""
    path = Path(path)
    return _load(read_regular_file(path), str(path), model, partial)


def from_bytes(data: bytes, model: object, *, partial: bool = False) -> dict[str, JSON]:
    """:func:`load` from the bytes of a checkpoint (as :func:`to_bytes` gives them)."""
    return _load(data, "<checkpoint bytes>", model, partial)


def _load(raw: bytes, path: str, model: object, partial: bool) -> dict[str, JSON]:
    weights = weights_of(model)
    header, tensors = _read(raw, path)
    saved = header["weights"]
    missing = [name for name in weights if name not in saved]
    unexpected = [name for name in saved if name not in weights]
    if (missing or unexpected) and not partial:
        raise CheckpointError(
            f"{path}: the checkpoint does not match the model: "
            f"missing {missing or 'none'}, unexpected {unexpected or 'none'} (load(..., partial=True) "
            "loads the weights they share)"
        )
    writes = []
    for name, weight in weights.items():
        if name in saved:
            writes.append((weight, *_restore(path, name, weight, saved[name], tensors)))
    with COMMIT_LOCK:
        publish(writes)
    metadata: dict[str, JSON] = header["metadata"]
    return metadata


def _read(raw: bytes, path: str) -> tuple[dict[str, Any], dict[str, np.ndarray[Any, Any]]]:
    """The checkpoint's header and arrays, validated as a whole (``path`` names it in errors)."""
    from safetensors.numpy import load as decode

    try:
        tensors: dict[str, np.ndarray[Any, Any]] = decode(raw)
        text = _metadata_of(raw).get(_KEY)
    except Exception as e:  # noqa: BLE001 - safetensors' own errors, a torn header's JSON, ...
        raise CheckpointError(f"{path}: not a readable safetensors file ({type(e).__name__}: {e})") from None
    if text is None:
        raise CheckpointError(f"{path}: a safetensors file, but not a monadl checkpoint (no {_KEY!r} entry)")
    try:
        header = json.loads(text)
    except ValueError as e:
        raise CheckpointError(f"{path}: the checkpoint's description is not JSON: {e}") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise CheckpointError(
            f"{path}: a checkpoint of another format ({_get(header, 'format')!r}, not {FORMAT})"
        )
    if not isinstance(header.get("weights"), dict) or not isinstance(header.get("metadata"), dict):
        raise CheckpointError(f"{path}: the checkpoint's description has no weights or metadata")
    return header, tensors


def _get(header: object, key: str) -> object:
    return header.get(key) if isinstance(header, dict) else header


def _metadata_of(raw: bytes) -> dict[str, str]:
    """The safetensors header's ``__metadata__`` (the format: an 8-byte little-endian length, then
    that much JSON)."""
    length = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + length])
    metadata = header.get("__metadata__", {})
    if not isinstance(metadata, dict):
        raise ValueError("__metadata__ is not an object")
    return metadata


def _restore(
    path: str, name: str, weight: Weight, entry: Any, tensors: dict[str, np.ndarray[Any, Any]]
) -> tuple[Any, Any]:
    """The data and optimizer state the checkpoint holds for ``weight``, checked against it."""

    def bad(problem: str) -> CheckpointError:
        return CheckpointError(f"{path}: weight {name!r}: {problem}")

    if not isinstance(entry, dict):
        raise bad("its description is not an object")
    array = tensors.get(f"weight/{name}")
    if array is None:
        raise bad("its data is missing from the file")
    current = read(weight.head, None)
    if isinstance(weight, FloatWeight):
        if entry.get("kind") != "float" or array.shape != () or array.dtype != np.float64:
            raise bad(f"the model's is a float, the file holds {array.dtype} {array.shape}")
        data: Any = float(array)
    else:
        have = current.data
        if entry.get("kind") != "array" or array.shape != tuple(have.shape) or array.dtype != have.dtype:
            kind = " (a float weight)" if entry.get("kind") == "float" else ""
            raise bad(
                f"the model's is {have.dtype} {tuple(have.shape)}, "
                f"the file holds {array.dtype} {tuple(array.shape)}{kind}"
            )
        data = _frozen(np.array(array, copy=True))
    if "optimizer" not in entry:
        return data, None
    optimizer = _rebuild_optimizer(entry["optimizer"], bad)
    state = _decode_state(entry.get("state"), tensors, f"state/{name}/", bad)
    _check_state(state, data, bad)
    return data, (optimizer, state)


def _check_state(state: Any, data: Any, bad: Any) -> None:
    """An optimizer state's arrays are of the weight's shape and dtype (moments, sums, velocities:
    every state of monadl's optimizers)."""
    if isinstance(state, tuple):
        for item in state:
            _check_state(item, data, bad)
    elif isinstance(state, np.ndarray) and (
        isinstance(data, float) or state.shape != data.shape or state.dtype != data.dtype
    ):
        raise bad(f"its optimizer state holds a {state.dtype} {state.shape} array, not of the weight's")


def _frozen(array: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    array.flags.writeable = False
    return array


_OPTIMIZERS: dict[str, type] = {
    cls.__name__: cls
    for module in (optimizers, schedules)
    for cls in vars(module).values()
    if isinstance(cls, type) and dataclasses.is_dataclass(cls) and cls.__module__ == module.__name__
}
"""The classes a checkpoint may name: monadl's optimizers, transformations and schedules (a file
names no code of its own to run)."""


def _rebuild_optimizer(described: Any, bad: Any) -> Any:
    """The optimizer a checkpoint describes, made from its settings."""
    if isinstance(described, dict) and set(described) == {"tuple"} and isinstance(described["tuple"], list):
        return tuple(_rebuild_optimizer(item, bad) for item in described["tuple"])
    if not isinstance(described, dict) or set(described) != {"class", "fields"}:
        if described is None or isinstance(described, (bool, int, float, str)):
            return described
        raise bad("its optimizer's description is malformed")
    fields = described["fields"]
    cls = _OPTIMIZERS.get(str(described["class"]))
    if cls is None or not isinstance(fields, dict):
        known = ", ".join(_OPTIMIZERS)
        raise bad(f"its optimizer names {described['class']!r}, not one of monadl's ({known})")
    try:
        return cls(**{name: _rebuild_optimizer(value, bad) for name, value in fields.items()})
    except (TypeError, ValueError) as e:
        raise bad(f"its optimizer's settings do not make a {cls.__name__}: {e}") from None


def _decode_state(encoded: Any, tensors: dict[str, np.ndarray[Any, Any]], prefix: str, bad: Any) -> Any:
    if not isinstance(encoded, dict) or len(encoded) != 1:
        raise bad("its optimizer state's description is malformed")
    ((kind, value),) = encoded.items()
    if kind == "tuple" and isinstance(value, list):
        return tuple(_decode_state(item, tensors, prefix, bad) for item in value)
    if kind == "value" and (value is None or isinstance(value, bool)):
        return value
    if kind == "int" and isinstance(value, int) and not isinstance(value, bool):
        return value
    if kind in ("float", "array") and isinstance(value, int) and not isinstance(value, bool):
        array = tensors.get(f"{prefix}{value}")
        if array is None:
            raise bad(f"its optimizer state's array {value} is missing from the file")
        if kind == "float":
            if array.shape != () or array.dtype != np.float64:
                raise bad("its optimizer state's float is not a float64 scalar")
            return float(array)
        return np.array(array, copy=True)
    raise bad(f"its optimizer state's description is malformed ({kind!r})")
