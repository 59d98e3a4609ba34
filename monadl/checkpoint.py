"""Checkpoints: a model's weights, their optimizer state, its buffers and your metadata, in one
safetensors file.

``save(path, model, metadata={"step": 20})`` writes every weight of ``model`` (a module, or any
structure :func:`~monadl.nn.weights_of` takes) under its dotted name, with its optimizer state
(Adam's moments and step count, Adagrad's sums, Momentum's velocity) and the optimizer's settings,
and every buffer (:func:`~monadl.nn.buffers_of`: state that gradients do not train, a dropout
layer's generator) under its own. ``load(path, model)`` puts them back and returns the metadata;
training then goes on exactly as it would have: the same bits as a run that was never interrupted.
The buffers are read as the weights are, as of one commit; a training step running in another
thread while a save reads them may have drawn from a generator already, so save between steps.

The format is safetensors (https://huggingface.co/docs/safetensors): a JSON header and raw arrays,
no pickle, no code run on load. The header's ``"monadl"`` entry describes what the arrays are:
``weight/<name>`` holds a weight's data, ``state/<name>/<k>`` the arrays of its optimizer state,
``buffer/<name>/<key>`` those of a buffer's state (its ``kind`` and JSON part are in the entry
``"buffers"``).

A model of another array namespace (CuPy on a GPU, array-api-strict) saves as a NumPy one: its
arrays are copied to the host, so a file is the same whichever namespace wrote it. A load checks the
file's arrays on the host, then puts each on the namespace and device of the model's own weight or
buffer: a file written on the CPU loads onto a model built with ``xp=cupy`` or moved there.

What is saved is what is loaded. Metadata are JSON values that come back equal: dicts with str
keys, lists, str, int (of 4,300 digits at most: what Python's json reads), bool, None and finite
floats, nested at most :data:`MAX_DEPTH` (64) deep; a tuple, a set, a non-str key, NaN or a longer
int is refused at save (a ``TypeError`` naming its key path), not changed into something else. An
optimizer is saved by its settings, each of the type its class declares, so its classes must be
monadl's: a learning-rate schedule must be one of :mod:`monadl.dsl.learning.schedules`' classes
(``Constant``, ``StepDecay``, ``CosineDecay``, ``LinearWarmup``); a plain function trains, but
``save`` refuses it, naming the weight and the schedule.

A save is atomic: written to a temporary file, synced, renamed over ``path``, the directory synced.
A process killed at any moment leaves the old checkpoint or the new one, never a torn file, and an
exception (a ``KeyboardInterrupt`` too) leaves no temporary file behind.

A load validates before it changes anything: every name, shape and dtype against the model (a
mismatch names the weight; a missing or unexpected name is an error unless ``partial=True``), and
the file itself: a SHA-256 digest of the description and of every array, written at save, is checked
(a flipped bit is an error, not another model), NaN and infinite values in the weights, their
optimizer state or the buffers are refused unless ``allow_non_finite=True``, and a truncated,
malformed or too deeply nested file is a :class:`CheckpointError` naming the file and the problem,
never a crash. So is a number the description's JSON reads as infinity (``1e999``) or an int of more
than 4,300 digits, and an optimizer whose settings are not all there (a default would stand in for
the one saved) or not of the types its class declares; each optimizer checks its state
(:meth:`~monadl.dsl.learning.optimizers.adam.Adam.check_state`: step counts from 0 to ``2**63 - 1``, second
moments and sums of squares >= 0). Buffers are checked the same way (a buffer of another kind, or
whose state its :meth:`~monadl.nn.Buffer.check_state` refuses, such as batch norm's running variance
with a negative entry, is an error naming it). Files written before digests existed (format 1) still
load, unverified (their Momentum and Adam, written before ``lazy`` existed, load as not lazy), and
files written before buffers were saved (formats 1 and 2) load with the model's buffers left as they
are. Then every weight and its state are committed at once, as a training step's are, and the
buffers loaded.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn, cast

import numpy as np

from monadl.data.files import atomic_write_bytes, read_regular_file
from monadl.dsl.core.weights import FloatWeight
from monadl.dsl.learning import optimizers, schedules
from monadl.dsl.learning.optimizers import adagrad, adam, clipping, sgd
from monadl.nn.buffer import JSON, Buffer, BufferState
from monadl.nn.module import Weight, buffers_of, moved_to, weights_of
from monadl.runtime.versions import COMMIT_LOCK, publish, read
from monadl.typeclasses.backend import dtype_name, is_array, namespace, to_numpy

__all__ = ["MAX_DEPTH", "CheckpointError", "from_bytes", "load", "save", "to_bytes"]

FORMAT = 3
"""The format written; format 2 (no buffers) and format 1 (no buffers, no digests) are still read."""
_FORMATS = (1, 2, 3)
_BUFFERS = 3
"""The first format with the entry ``"buffers"``."""
_KEY = "monadl"
_DIGEST_ENTRY = "sha256"
"""The description's last entry (format 2 on): the SHA-256 of its JSON text without it. It is inside
the one metadata entry of safetensors' header, whose entries a writer orders at random, so that
one model's checkpoint is the same bytes from every process."""
MAX_DEPTH = 64
"""How deeply metadata values (and an optimizer's description) may nest lists and dicts: deep
enough for any real use, shallow enough that no walk of a file's description can overflow the
stack."""
_HEADER_DEPTH = MAX_DEPTH + 3  # the description's own levels: itself, "weights", a weight's entry
_MAX_INT_DIGITS = 4300
"""The most digits an int of a description may have: Python's default limit on converting an int
to or from text (``sys.get_int_max_str_digits``), under which every process reads the file back."""
_INT_BOUND = 10**_MAX_INT_DIGITS
MetadataValue = None | bool | int | float | str | Sequence["MetadataValue"] | Mapping[str, "MetadataValue"]
"""A metadata value :func:`save` takes: a JSON value, typed read-only so that a ``list[float]`` or a
``dict[str, int]`` is one (``list`` and ``dict`` are invariant). A tuple, also a ``Sequence``, is
refused when saved: it would come back a list."""


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded into the model: malformed, truncated, damaged (a digest
    that does not match), of another format, or not matching the model's weights or buffers (the
    message names the file and the weight or buffer)."""


# ----------------------------------------------------------------------------------------- save


def save(path: str | Path, model: object, *, metadata: Mapping[str, MetadataValue] | None = None) -> None:
    """Writes ``model``'s weights, their optimizer state, its buffers and ``metadata`` (JSON values:
    a step, an epoch) to ``path``, atomically. The weights are read as one committed state. Raises
    ``TypeError`` for metadata, an optimizer or a buffer's state that would not come back as
    saved."""
    atomic_write_bytes(Path(path), to_bytes(model, metadata=metadata))


def to_bytes(model: object, *, metadata: Mapping[str, MetadataValue] | None = None) -> bytes:
    """The checkpoint :func:`save` writes, as bytes (to send to another process, say)."""
    from safetensors.numpy import save as encode

    checked = _checked_metadata(metadata)  # before reading the weights: a refusal costs nothing
    weights = weights_of(model)
    buffers = buffers_of(model)
    tensors: dict[str, np.ndarray[Any, Any]] = {}
    described: dict[str, Any] = {}
    with COMMIT_LOCK:  # every weight and buffer as of the same commit
        versions = {name: read(w.head, None) for name, w in weights.items()}
        states = {name: _buffer_state(name, b) for name, b in buffers.items()}
    for name, weight in weights.items():
        version = versions[name]
        data = version.data
        entry: dict[str, Any] = {"kind": "float" if isinstance(weight, FloatWeight) else "array"}
        tensors[f"weight/{name}"] = _contiguous(
            np.asarray(data) if isinstance(data, float) else to_numpy(data)
        )
        if version.state is not None:
            optimizer, state = version.state
            arrays: list[np.ndarray[Any, Any]] = []
            entry["optimizer"] = _describe_optimizer(optimizer, name)
            entry["state"] = _encode_state(state, arrays, name, 1)
            for k, array in enumerate(arrays):
                tensors[f"state/{name}/{k}"] = _contiguous(array)
        if _depth(entry) > MAX_DEPTH + 1:
            raise TypeError(f"save: the optimizer of {name!r} nests deeper than {MAX_DEPTH} levels")
        described[name] = entry
    described_buffers: dict[str, Any] = {}
    for name, buffer in buffers.items():
        state = states[name]
        for key, array in state.arrays.items():
            tensors[f"buffer/{name}/{key}"] = _contiguous(array)
        described_buffers[name] = {"kind": buffer.kind, "arrays": sorted(state.arrays), "state": state.info}
    digests = {key: _digest(array) for key, array in tensors.items()}
    header = {
        "format": FORMAT,
        "weights": described,
        "buffers": described_buffers,
        "metadata": checked,
        "digests": digests,
    }
    encoded: bytes = encode(tensors, metadata={_KEY: sealed(header)})
    return encoded


def _buffer_state(name: str, buffer: Buffer) -> BufferState:
    """A buffer's state, refused (``TypeError`` naming the buffer) where it would not load back as
    it is: arrays of another type or with a name that is not one, a JSON part that is not JSON."""
    try:
        state = buffer.state()
    except (TypeError, ValueError) as e:
        raise TypeError(f"save: buffer {name!r}: {e}") from e
    if not isinstance(buffer.kind, str) or not isinstance(state, BufferState):
        raise TypeError(f"save: buffer {name!r}: its kind must be a str and its state a BufferState")
    if not isinstance(state.arrays, dict) or not isinstance(state.info, dict):
        raise TypeError(f"save: buffer {name!r}: its state's arrays and info must be dicts")
    arrays = {}
    for key, array in sorted(state.arrays.items()):
        if not isinstance(key, str) or not key or "/" in key:
            raise TypeError(
                f"save: buffer {name!r}: an array's name must be a non-empty str without '/', not {key!r}"
            )
        if not isinstance(array, np.ndarray) or array.dtype.kind not in "biuf":
            what = f"a {array.dtype} array" if isinstance(array, np.ndarray) else f"a {type(array).__name__}"
            raise TypeError(
                f"save: buffer {name!r}: its array {key!r} is {what}, not one of bools, integers or floats"
            )
        arrays[key] = array

    def refuse(where: str, problem: str) -> NoReturn:
        raise TypeError(f"save: buffer {name!r}: {where} {problem}")

    _check_json(state.info, "its state's info", 1, refuse)
    return BufferState(arrays, state.info)


def sealed(header: dict[str, Any]) -> str:
    """A description's JSON text (format 2 on): ``header`` with its own digest as its last entry."""
    text = json.dumps(header, allow_nan=False)  # checked at save: cannot fail
    return json.dumps({**header, _DIGEST_ENTRY: _text_digest(text)}, allow_nan=False)


def _contiguous(array: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """``array`` in C order, its shape kept (``np.ascontiguousarray`` makes a 0-d array 1-d)."""
    return array if array.flags.c_contiguous else array.copy(order="C")


def _digest(array: np.ndarray[Any, Any]) -> str:
    """The SHA-256 of an array's dtype, shape and bytes (SHA-256 over BLAKE2b: faster where the CPU
    has SHA instructions, as x86 and ARM servers do)."""
    h = hashlib.sha256(f"{array.dtype.str}{array.shape}".encode())
    h.update(_contiguous(array).reshape(-1).view(np.uint8).data)  # the bytes in place, not a copy
    return h.hexdigest()


def _text_digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def _checked_metadata(metadata: Mapping[str, MetadataValue] | None) -> dict[str, JSON]:
    """``metadata`` as a dict, refused (``TypeError`` naming the key path) where something would not
    come back equal from the file: a JSON object has str keys, has no tuple, set or NaN."""
    if metadata is None:
        return {}
    if not isinstance(metadata, Mapping):
        raise TypeError(f"save: metadata must be a mapping of str keys, not a {type(metadata).__name__}")
    checked = dict(metadata)
    _check_json(checked, "metadata", 0, _refuse_at_save)
    return cast(dict[str, JSON], checked)  # (only lists and dicts passed the check)


def _refuse_at_save(where: str, problem: str) -> NoReturn:
    raise TypeError(f"save: {where} {problem}; metadata must be JSON values that load back equal")


def _check_json(value: object, where: str, level: int, refuse: Any) -> None:
    """Calls ``refuse(where, problem)`` unless ``value`` is JSON that comes back from a file equal to
    itself, nested at most ``MAX_DEPTH`` deep below ``level`` 0 (the metadata mapping)."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return  # (a subclass of str comes back as one, equal)
    if isinstance(value, int):
        if abs(value) >= _INT_BOUND:
            refuse(
                where, f"is an int of more than {_MAX_INT_DIGITS} digits, which Python's json does not read"
            )
        return  # (a subclass of int comes back as one, equal)
    if isinstance(value, float):
        if not math.isfinite(value):
            refuse(where, f"is {value!r}, which JSON has no exact form for")
        return
    if isinstance(value, (dict, list)):
        if level > MAX_DEPTH:
            refuse(where, f"nests deeper than {MAX_DEPTH} levels of lists and dicts")
        if isinstance(value, list):
            for k, item in enumerate(value):
                _check_json(item, f"{where}[{k}]", level + 1, refuse)
            return
        for key, item in value.items():
            if not isinstance(key, str):
                refuse(where, f"has a key {key!r} that is not a str (it would come back as a str)")
            _check_json(item, f"{where}[{key!r}]", level + 1, refuse)
        return
    if isinstance(value, tuple):
        refuse(where, "is a tuple (it would come back as a list): use a list")
    refuse(where, f"is a {type(value).__name__}, not a JSON value")


def _depth(value: object) -> int:
    """How deeply lists and dicts nest in ``value`` (0 for a scalar), found without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        deepest = max(deepest, level)
        stack.extend((child, level + 1) for child in children)
    return deepest


def _describe_optimizer(optimizer: Any, weight: str) -> dict[str, Any]:
    """An optimizer as JSON: its class and settings, nested ones (a chain's transformations, a
    learning-rate schedule) described the same way."""
    described = _plain(optimizer, weight, 1)
    if not isinstance(described, dict) or "class" not in described:
        raise TypeError(f"save: the optimizer of {weight!r} ({type(optimizer).__name__}) is not a dataclass")
    return described


def _plain(value: Any, weight: str, level: int) -> Any:
    """A setting as JSON: a dataclass as ``{"class", "fields"}``, a tuple as ``{"tuple"}``."""
    if level > MAX_DEPTH:
        raise TypeError(f"save: the optimizer of {weight!r} nests deeper than {MAX_DEPTH} levels")
    cls = type(value)
    if dataclasses.is_dataclass(cls):
        if _OPTIMIZERS.get(cls.__name__) is not cls:  # a load could not make it again
            raise TypeError(
                f"save: the optimizer of {weight!r} holds a {cls.__qualname__}, which is not one of "
                "monadl's optimizers, transformations or schedules: a checkpoint names no code of "
                "its own"
            )
        fields = {}
        for name, hint in _settings(cls).items():
            setting = getattr(value, name)
            if not _fits(setting, hint):  # a load would refuse it
                raise TypeError(
                    f"save: the optimizer of {weight!r} has the setting {cls.__name__}.{name} = "
                    f"{_brief(setting)}, not {_type_name(hint)}"
                )
            fields[name] = _plain(setting, weight, level + 1)
        return {"class": cls.__name__, "fields": fields}
    if isinstance(value, tuple):
        return {"tuple": [_plain(v, weight, level + 1) for v in value]}
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= _INT_BOUND:
        raise TypeError(
            f"save: the optimizer of {weight!r} has an int of more than {_MAX_INT_DIGITS} digits, "
            "which Python's json does not read"
        )
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float) and math.isfinite(value):
        return value
    if callable(value):
        raise TypeError(
            f"save: the optimizer of {weight!r} has the schedule {value!r}, a plain function: a "
            "checkpoint stores a schedule by its settings, so a saved schedule must be one of "
            "monadl's schedule classes (ml.Constant, ml.StepDecay, ml.CosineDecay, ml.LinearWarmup)"
        )
    raise TypeError(f"save: the optimizer of {weight!r} has a setting that is not a JSON value: {value!r}")


def _encode_state(state: Any, arrays: list[np.ndarray[Any, Any]], weight: str, level: int) -> Any:
    """An optimizer state (tuples of arrays, floats and ints) as JSON, its arrays appended to
    ``arrays``: floats go as 0-d float64 arrays, so that they come back bit for bit."""
    if level > MAX_DEPTH:
        raise TypeError(f"save: the optimizer state of {weight!r} nests deeper than {MAX_DEPTH} levels")
    if isinstance(state, tuple):
        return {"tuple": [_encode_state(item, arrays, weight, level + 1) for item in state]}
    if isinstance(state, bool) or state is None:
        return {"value": state}
    if isinstance(state, int):
        if abs(state) >= _INT_BOUND:
            raise TypeError(
                f"save: the optimizer state of {weight!r} holds an int of more than {_MAX_INT_DIGITS} digits"
            )
        return {"int": state}
    if isinstance(state, float):
        arrays.append(np.asarray(state, dtype=np.float64))
        return {"float": len(arrays) - 1}
    if is_array(state):  # NumPy's, or another namespace's (a CuPy moment), through the host
        arrays.append(to_numpy(state))
        return {"array": len(arrays) - 1}
    raise TypeError(f"save: the optimizer state of {weight!r} holds a {type(state).__name__}")


# ----------------------------------------------------------------------------------------- load


def load(
    path: str | Path, model: object, *, partial: bool = False, allow_non_finite: bool = False
) -> dict[str, JSON]:
    """Puts the weights, optimizer states and buffers of the checkpoint at ``path`` into ``model``
    and returns its metadata (a file without buffers, of format 1 or 2, leaves the model's as they
    are). ``partial``: load the weights and buffers the file and the model have in common (else a
    missing or unexpected name is an error). ``allow_non_finite``: load NaN or infinite
    values in the weights, optimizer states and buffers (else they are a :class:`CheckpointError`: a
    diverged run's file, not one to resume). Nothing changes unless everything fits."""
    path = Path(path)
    return _load(read_regular_file(path), str(path), model, partial, allow_non_finite)


def from_bytes(
    data: bytes, model: object, *, partial: bool = False, allow_non_finite: bool = False
) -> dict[str, JSON]:
    """:func:`load` from the bytes of a checkpoint (as :func:`to_bytes` gives them)."""
    return _load(data, "<checkpoint bytes>", model, partial, allow_non_finite)


def _load(
    raw: bytes, path: str, model: object, partial: bool, allow_non_finite: bool = False
) -> dict[str, JSON]:
    weights = weights_of(model)
    buffers = buffers_of(model)
    header, tensors = _read(raw, path, allow_non_finite)
    saved = header["weights"]
    _match(path, "weights", weights, saved, partial)
    saved_buffers: dict[str, Any] = header.get("buffers", {})
    if "buffers" in header:  # (a file of an earlier format has none: the model's stay as they are)
        _match(path, "buffers", buffers, saved_buffers, partial)
    legacy = header["format"] == 1
    writes = []
    for name, weight in weights.items():
        if name in saved:
            writes.append((weight, *_restore(path, name, weight, saved[name], tensors, legacy)))
    loads = [
        (buffer, _restore_buffer(path, name, buffer, saved_buffers[name], tensors))
        for name, buffer in buffers.items()
        if name in saved_buffers
    ]
    with COMMIT_LOCK:
        publish(writes)
    for buffer, state in loads:  # checked: cannot fail (and free to commit, out of the lock)
        buffer.load_state(state)
    metadata: dict[str, JSON] = header["metadata"]
    return metadata


def _match(
    path: str, what: str, model: Mapping[str, object], saved: Mapping[str, Any], partial: bool
) -> None:
    """Refuses a file whose weights (or buffers: ``what``) are not the model's, unless ``partial``."""
    missing = [name for name in model if name not in saved]
    unexpected = [name for name in saved if name not in model]
    if (missing or unexpected) and not partial:
        which = (
            "checkpoint does not match the model"
            if what == "weights"
            else f"checkpoint's {what} do not match the model's"
        )
        raise CheckpointError(
            f"{path}: the {which}: "
            f"missing {missing or 'none'}, unexpected {unexpected or 'none'} (load(..., partial=True) "
            f"loads the {what} they share)"
        )


def _read(
    raw: bytes, path: str, allow_non_finite: bool = False
) -> tuple[dict[str, Any], dict[str, np.ndarray[Any, Any]]]:
    """The checkpoint's header and arrays, validated as a whole (``path`` names it in errors): its
    digests, its structure and depth, and (unless ``allow_non_finite``) its values."""
    from safetensors.numpy import load as decode

    try:
        tensors: dict[str, np.ndarray[Any, Any]] = decode(raw)
        entries = _metadata_of(raw)
    except Exception as e:  # noqa: BLE001 - safetensors' own errors, a torn header's JSON, ...
        raise CheckpointError(f"{path}: not a readable safetensors file ({type(e).__name__}: {e})") from None
    text = entries.get(_KEY)
    if not isinstance(text, str):
        raise CheckpointError(f"{path}: a safetensors file, but not a monadl checkpoint (no {_KEY!r} entry)")
    header = _parse(text, path)
    form = header.get("format") if isinstance(header, dict) else header
    if not isinstance(header, dict) or type(form) is not int or form not in _FORMATS:
        raise CheckpointError(f"{path}: a checkpoint of another format ({form!r}, not one of {_FORMATS})")
    if _depth(header) > _HEADER_DEPTH:  # before anything walks it recursively
        raise CheckpointError(
            f"{path}: the checkpoint's description nests deeper than {_HEADER_DEPTH} levels"
        )
    if form >= 2:
        digest = header.pop(_DIGEST_ENTRY, None)
        if digest is None:
            raise CheckpointError(
                f"{path}: the checkpoint has no digest of its description (format {form} has one)"
            )
        if digest != _text_digest(json.dumps(header, allow_nan=False)):
            raise CheckpointError(
                f"{path}: the checkpoint's description does not match its digest: the file is damaged"
            )
    keys = (
        {"format", "weights", "metadata"}
        | ({"digests"} if form >= 2 else set())
        | ({"buffers"} if form >= _BUFFERS else set())
    )
    if set(header) != keys:
        raise CheckpointError(
            f"{path}: the checkpoint's description has the entries {sorted(header)}, not {sorted(keys)}"
        )
    if not isinstance(header["weights"], dict) or not isinstance(header["metadata"], dict):
        raise CheckpointError(f"{path}: the checkpoint's description has no weights or metadata")
    if not isinstance(header.get("buffers", {}), dict):
        raise CheckpointError(f"{path}: the checkpoint's description has no buffers")

    def refuse(where: str, problem: str) -> NoReturn:
        raise CheckpointError(f"{path}: the checkpoint's {where} {problem}")

    _check_json(header["metadata"], "metadata", 0, refuse)
    if form >= 2:
        _verify(header["digests"], tensors, path)
    if not allow_non_finite:
        for key, array in tensors.items():
            if np.issubdtype(array.dtype, np.inexact) and not np.isfinite(array).all():
                raise CheckpointError(
                    f"{path}: {_tensor_name(key)} holds NaN or infinite values "
                    "(load(..., allow_non_finite=True) loads them)"
                )
    return header, tensors


def _parse(text: str, path: str) -> Any:
    """The description's JSON, refused where it has no exact meaning: NaN or infinity (Python's
    ``json`` accepts them), a key given twice (the last would win silently)."""

    def no_constant(name: str) -> NoReturn:
        raise ValueError(f"{name} is not a finite number")

    def finite(text: str) -> float:
        value = float(text)
        if not math.isfinite(value):  # a float's range exceeded (1e999) is infinity to Python
            shown = text if len(text) <= 30 else f"{text[:20]}... ({len(text)} characters)"
            raise ValueError(f"{shown} is not a finite number")
        return value

    def bounded(text: str) -> int:
        digits = len(text) - text.startswith("-")
        if digits > _MAX_INT_DIGITS:
            raise ValueError(f"an int of {digits} digits (more than {_MAX_INT_DIGITS})")
        return int(text)

    def an_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        value = dict(pairs)
        if len(value) != len(pairs):
            raise ValueError("an object has a key twice")
        return value

    try:
        return json.loads(
            text,
            parse_constant=no_constant,
            parse_float=finite,
            parse_int=bounded,
            object_pairs_hook=an_object,
        )
    except RecursionError:
        raise CheckpointError(f"{path}: the checkpoint's description nests too deeply") from None
    except ValueError as e:
        raise CheckpointError(f"{path}: the checkpoint's description is not exact JSON: {e}") from None


def _verify(digests: Any, tensors: dict[str, np.ndarray[Any, Any]], path: str) -> None:
    """Every array of the file matches the digest written for it at save, and each has one."""
    if not isinstance(digests, dict) or set(digests) != set(tensors):
        raise CheckpointError(f"{path}: the checkpoint's digests do not name its arrays: the file is damaged")
    for key, array in tensors.items():
        if digests[key] != _digest(array):
            raise CheckpointError(
                f"{path}: {_tensor_name(key)} does not match its digest: the file is damaged"
            )


def _tensor_name(key: str) -> str:
    """An array of the file as its errors name it: ``weight 'w'``, its optimizer state's, a buffer's."""
    kind, _, rest = key.partition("/")
    if kind == "weight":
        return f"weight {rest!r}"
    if kind == "state" and "/" in rest:
        name, _, k = rest.rpartition("/")
        return f"weight {name!r}: its optimizer state (array {k})"
    if kind == "buffer" and "/" in rest:
        name, _, k = rest.rpartition("/")
        return f"buffer {name!r}: its array {k!r}"
    return f"the array {key!r}"


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
    path: str,
    name: str,
    weight: Weight,
    entry: Any,
    tensors: dict[str, np.ndarray[Any, Any]],
    legacy: bool,
) -> tuple[Any, Any]:
    """The data and optimizer state the checkpoint holds for ``weight``, checked against it
    (``legacy``: a file of format 1)."""

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
        if (
            entry.get("kind") != "array"
            or array.shape != tuple(have.shape)
            or array.dtype.name != dtype_name(have)
        ):
            kind = " (a float weight)" if entry.get("kind") == "float" else ""
            raise bad(
                f"the model's is {dtype_name(have)} {tuple(have.shape)}, "
                f"the file holds {array.dtype} {tuple(array.shape)}{kind}"
            )
        data = _frozen(np.array(array, copy=True))
    if "optimizer" not in entry:
        return _placed(data, current.data), None
    optimizer = _rebuild_optimizer(entry["optimizer"], bad, legacy)
    # A schedule, a tuple or a bare value would be taken for the weight's optimizer, and its next
    # step would restart the state (another kind) or fail: only monadl's optimizers are.
    if not isinstance(optimizer, optimizers.OPTIMIZER_CLASSES):
        raise bad("its optimizer's description is malformed (not one of monadl's optimizers)")
    state = _decode_state(entry.get("state"), tensors, f"state/{name}/", bad)
    _check_state(state, data, bad)
    problem = optimizer.check_state(state, data)
    if problem is not None:
        raise bad(f"its optimizer state does not fit its {type(optimizer).__name__}: {problem}")
    return _placed(data, current.data), (optimizer, _placed(state, current.data))


def _placed(value: Any, like: Any) -> Any:
    """``value``, checked on the host, on the namespace and device of the model's weight data
    ``like`` (a CuPy model's on its GPU), by the conversion ``module.to(xp)`` makes."""
    if isinstance(like, (float, np.ndarray)):
        return value
    return moved_to(value, namespace(like), getattr(like, "device", None))


def _restore_buffer(
    path: str, name: str, buffer: Buffer, entry: Any, tensors: dict[str, np.ndarray[Any, Any]]
) -> BufferState:
    """The state the checkpoint holds for ``buffer``, checked by it."""

    def bad(problem: str) -> CheckpointError:
        return CheckpointError(f"{path}: buffer {name!r}: {problem}")

    if not isinstance(entry, dict) or set(entry) != {"kind", "arrays", "state"}:
        raise bad("its description is malformed")
    kind, keys, info = entry["kind"], entry["arrays"], entry["state"]
    if kind != buffer.kind:
        raise bad(f"the model's is of the kind {buffer.kind!r}, the file's of the kind {kind!r}")
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys) or len(set(keys)) != len(keys):
        raise bad("its list of arrays is malformed")
    if not isinstance(info, dict):
        raise bad("its state's info is not an object")
    arrays = {}
    for key in keys:
        array = tensors.get(f"buffer/{name}/{key}")
        if array is None:
            raise bad(f"its array {key!r} is missing from the file")
        arrays[key] = np.array(array, copy=True)
    state = BufferState(arrays, info)
    problem = buffer.check_state(state)
    if problem is not None:
        raise bad(f"its state does not fit it: {problem}")
    return state


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
    for module in (sgd, adam, adagrad, clipping, schedules)
    for cls in vars(module).values()
    if isinstance(cls, type) and dataclasses.is_dataclass(cls) and cls.__module__ == module.__name__
}
"""The classes a checkpoint may name: monadl's optimizers, transformations and schedules (a file
names no code of its own to run)."""


def _rebuild_optimizer(described: Any, bad: Any, legacy: bool) -> Any:
    """The optimizer a checkpoint describes, made from its settings: every setting of its class
    given, each of the type the class declares (``legacy``: a file of format 1, written before
    ``lazy`` existed, whose optimizers were not lazy)."""
    if isinstance(described, dict) and set(described) == {"tuple"} and isinstance(described["tuple"], list):
        return tuple(_rebuild_optimizer(item, bad, legacy) for item in described["tuple"])
    if not isinstance(described, dict) or set(described) != {"class", "fields"}:
        if described is None or isinstance(described, (bool, int, float, str)):
            return described
        raise bad("its optimizer's description is malformed")
    fields = described["fields"]
    cls = _OPTIMIZERS.get(str(described["class"]))
    if cls is None or not isinstance(fields, dict):
        known = ", ".join(_OPTIMIZERS)
        raise bad(f"its optimizer names {_brief(described['class'])}, not one of monadl's ({known})")
    hints = _settings(cls)
    if legacy and "lazy" in hints:
        fields = {"lazy": False, **fields}
    if set(fields) != set(hints):  # (a default would silently stand for a setting the file lost)
        missing, unknown = sorted(set(hints) - set(fields)), sorted(set(fields) - set(hints))
        raise bad(
            f"its optimizer's settings are not those of {cls.__name__}: missing {missing or 'none'}, "
            f"unknown {[_brief(name) for name in unknown] or 'none'}"
        )
    settings = {name: _rebuild_optimizer(value, bad, legacy) for name, value in fields.items()}
    for name, setting in settings.items():
        if not _fits(setting, hints[name]):
            raise bad(
                f"its optimizer's setting {cls.__name__}.{name} is {_brief(setting)}, "
                f"not {_type_name(hints[name])}"
            )
    try:
        return cls(**settings)
    except (TypeError, ValueError) as e:
        raise bad(f"its optimizer's settings do not make a {cls.__name__}: {e}") from None


@functools.cache
def _settings(cls: type) -> dict[str, Any]:
    """The settings of one of monadl's optimizer, transformation or schedule classes (its
    dataclass fields, all of them arguments of its constructor), each with its declared type."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _fits(value: object, hint: Any) -> bool:
    """Whether a setting is of the type ``hint`` its class declares: an int is a float (as in
    Python's typing), and either only where it converts to a float; a bool is neither; a protocol
    (a schedule, an optimizer) is any value with the protocol's methods."""
    args = typing.get_args(hint)
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        return any(_fits(value, arm) for arm in args)
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int or hint is float:  # (an int past a float's range fails every rule using it)
        if isinstance(value, int) and not isinstance(value, bool):
            return _is_float(value)
        return hint is float and isinstance(value, float)
    if typing.get_origin(hint) is tuple:  # (``tuple[X, ...]``: the one kind of tuple a setting is)
        return isinstance(value, tuple) and all(_fits(item, args[0]) for item in value)
    if typing.Protocol in getattr(hint, "__mro__", ()):
        return all(callable(getattr(value, name, None)) for name in _methods(hint))
    return isinstance(value, hint)


def _is_float(value: int) -> bool:
    """Whether an int converts to a float (else every rule that computes with it fails)."""
    try:
        float(value)
    except OverflowError:
        return False
    return True


def _methods(protocol: type) -> list[str]:
    """The methods a protocol declares (``__call__`` a schedule's)."""
    return [
        name
        for name, member in vars(protocol).items()
        if callable(member) and (name == "__call__" or not name.startswith("_"))
    ]


def _type_name(hint: Any) -> str:
    """A declared type in words, as errors name it: ``a float or a Schedule``."""
    args = typing.get_args(hint)
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        return " or ".join(_type_name(arm) for arm in args)
    if hint is type(None):
        return "None"
    if typing.get_origin(hint) is tuple:
        return f"a tuple of {_type_name(args[0])[2:].lstrip()}s"
    if hint is int:
        return "an int that converts to a float"
    name = getattr(hint, "__name__", str(hint))
    return f"{'an' if name[:1] in 'AEIOUaeiou' else 'a'} {name}"


def _brief(value: object) -> str:
    """``value``'s repr as an error message shows it: shortened where long."""
    try:
        text = repr(value)
    except ValueError:  # an int too long for Python to write in decimal
        return f"a {type(value).__name__} too long to show"
    return text if len(text) <= 60 else f"{text[:50]}... ({len(text)} characters)"


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
