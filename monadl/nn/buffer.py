"""Buffers: state of a module that gradients do not train, found by name and saved in checkpoints.

A step may depend on more than its weights: the generator a :class:`~monadl.nn.Dropout` draws its
masks from (a :class:`GeneratorBuffer`), running statistics (an :class:`ArrayBuffer`). A module
holds its buffers in its fields, as it holds its weights; ``module.buffers()``
(:func:`~monadl.nn.buffers_of`) finds them by dotted name with the rules and in the order
``module.weights()`` follows, and :func:`monadl.save` and :func:`monadl.load` save and load them
with the weights, so that a resumed run draws what the uninterrupted one would have.

A buffer of your own subclasses :class:`Buffer`: a ``kind`` that names its type in a checkpoint,
its state as named NumPy arrays and a little JSON (:meth:`Buffer.state`), a check of a state that
comes from outside (:meth:`Buffer.check_state`: the problem, or None), and the way to put a checked
state in (:meth:`Buffer.load_state`), which must not fail: a load checks every buffer before it
changes any.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from typing import Any, ClassVar, NamedTuple

import numpy as np

from monadl.runtime.versions import COMMIT_LOCK, Version, publish, read
from monadl.typeclasses.backend import (
    NUMPY,
    ShapeError,
    dtype_name,
    is_array,
    namespace,
    to_namespace,
    to_numpy,
)

__all__ = ["JSON", "ArrayBuffer", "Buffer", "BufferState", "GeneratorBuffer"]

JSON = None | bool | int | float | str | list["JSON"] | dict[str, "JSON"]


class BufferState(NamedTuple):
    """A buffer's state: NumPy arrays by name (no ``/`` in a name) and JSON values beside them."""

    arrays: dict[str, np.ndarray[Any, Any]]
    info: dict[str, JSON]


class Buffer(ABC):
    """Non-trainable state of a module that a step depends on (see the module)."""

    __slots__ = ()
    kind: ClassVar[str]
    """The buffer's type as a checkpoint names it: a file's state loads only into its kind."""

    @abstractmethod
    def state(self) -> BufferState:
        """The current state, as arrays that no later change of the buffer changes. A save calls it
        while commits wait (the weights and buffers as of one commit): it must be quick and must
        not commit anything itself."""

    @abstractmethod
    def check_state(self, state: BufferState) -> str | None:
        """None where ``state`` fits this buffer (its arrays' names, shapes and dtypes, its
        values), else the problem, in words."""

    @abstractmethod
    def load_state(self, state: BufferState) -> None:
        """Puts ``state``, which :meth:`check_state` accepted, into the buffer. A load calls it once
        everything in the file was checked and the weights committed: it must not fail."""


class ArrayBuffer(Buffer):
    """An array that gradients do not train (a running mean, a counter): a read-only copy of
    ``data``, an array of bools, integers or floats (NumPy's, or any array API namespace's: a CuPy
    array on a GPU), whose shape and dtype it keeps. ``xp`` and ``device``: the namespace (None:
    ``data``'s own) and device to hold the copy in, as ``module.to(xp, device=device)`` would.

    Its value is versioned as a weight's is (``monadl.runtime.versions``): an op of a training step
    may stage a new value (:func:`monadl.stage_buffer`), committed with the step's weights, all or
    nothing; ``data`` is the newest committed value."""

    __slots__ = ("head",)
    kind = "array"

    def __init__(self, data: np.ndarray[Any, Any], *, xp: Any = None, device: Any = None) -> None:
        checked = _checked_array(data, "ArrayBuffer")
        target = namespace(checked) if xp is None and device is not None else xp
        if target is None or target is np or target is NUMPY:
            copy = _frozen_copy(checked if target is None else to_numpy(checked))
        else:
            copy = to_namespace(checked, target, device)  # (the conversion is the copy)
        self.head = Version(0, copy, None, None)

    @property
    def data(self) -> np.ndarray[Any, Any]:
        """The buffer's array, as last committed (read-only: assign a new array to change it). A
        NumPy array, or one of the namespace the buffer was moved to (``module.to(xp)``)."""
        data: np.ndarray[Any, Any] = read(self.head, None).data
        return data

    @data.setter
    def data(self, value: np.ndarray[Any, Any]) -> None:
        """Commits a copy of ``value``, which must have the buffer's shape and dtype. An array of
        another namespace or device moves the buffer there."""
        _checked_array(value, "ArrayBuffer.data")
        have = self.data
        if tuple(value.shape) != tuple(have.shape) or dtype_name(value) != dtype_name(have):
            raise ShapeError(
                f"{self!r}.data = {dtype_name(value)} array of shape {tuple(value.shape)}: the buffer "
                f"holds {dtype_name(have)} {tuple(have.shape)}"
            )
        self._commit(_frozen_copy(value))

    def _commit(self, data: Any) -> None:
        with COMMIT_LOCK:
            publish([(self, data, None)])

    def state(self) -> BufferState:
        return BufferState({"data": to_numpy(self.data)}, {})

    def check_state(self, state: BufferState) -> str | None:
        if set(state.arrays) != {"data"} or state.info:
            return f"an array buffer's state is one array 'data', not {sorted(state.arrays)} and {state.info}"
        array, have = state.arrays["data"], self.data
        if tuple(array.shape) != tuple(have.shape) or dtype_name(array) != dtype_name(have):
            return (
                f"the model's is {dtype_name(have)} {tuple(have.shape)}, the state holds "
                f"{array.dtype} {array.shape}"
            )
        return None

    def load_state(self, state: BufferState) -> None:
        have: Any = self.data  # (typed NumPy's; of the namespace the buffer was moved to)
        array = state.arrays["data"]
        if isinstance(have, np.ndarray):
            self._commit(_frozen_copy(array))
        else:  # on the model's namespace and device (the conversion is the copy)
            self._commit(to_namespace(array, namespace(have), getattr(have, "device", None)))

    def __repr__(self) -> str:
        data = self.data
        return f"ArrayBuffer({dtype_name(data)} {tuple(data.shape)})"


def _checked_array(data: object, where: str) -> Any:
    if isinstance(data, np.ndarray):
        if data.dtype.kind in "biuf":
            return data
    elif is_array(data) and dtype_name(data).startswith(("bool", "int", "uint", "float")):
        return data
    what = f"{dtype_name(data)} array" if is_array(data) else type(data).__name__
    raise TypeError(
        f"{where}: expected a NumPy array of bools, integers or floats (or such an array of another "
        f"array API namespace), got a {what}"
    )


def _frozen_copy(data: Any) -> Any:
    if isinstance(data, np.ndarray):
        copy = np.array(data, copy=True, order="C")
        copy.flags.writeable = False
        return copy
    return namespace(data).asarray(data, copy=True)


_BIT_GENERATORS = {
    cls.__name__: cls
    for cls in (np.random.PCG64, np.random.PCG64DXSM, np.random.SFC64, np.random.Philox, np.random.MT19937)
}
"""The bit generators whose state a :class:`GeneratorBuffer` saves and loads exactly: NumPy's own,
their state made of names, integers and arrays."""
_INT_LIMITS = {"has_uint32": 2, "uinteger": 2**32, "pos": 625, "buffer_pos": 5}
"""Exclusive upper bounds of the integers in NumPy's states that index or flag (NumPy's setter
takes any value, and an index out of range would read outside the generator's arrays); any other
integer is a 128-bit word at most."""
_DECIMAL = re.compile(r"0|[1-9][0-9]{0,38}")


class GeneratorBuffer(np.random.Generator, Buffer):
    """A NumPy random ``Generator`` whose state is a buffer: draws advance it, a checkpoint saves it.
    ``seed`` is what ``np.random.default_rng`` takes: an int (a PCG64 generator, as
    ``default_rng(seed)`` gives), a ``Generator`` or a ``BitGenerator``, whose bit generator this
    one then shares.

    The state saved is the bit generator's (``bit_generator.state``), for NumPy's PCG64 (the
    default), PCG64DXSM, SFC64, Philox and MT19937; its 128-bit integers are written as decimal
    text, exactly. The ``SeedSequence`` that ``spawn`` uses is not state of the stream, and not
    saved."""

    kind = "generator"

    def __init__(self, seed: int | np.random.Generator | np.random.BitGenerator | None = 0) -> None:
        super().__init__(np.random.default_rng(seed).bit_generator)

    def state(self) -> BufferState:
        generator = self.bit_generator
        if _BIT_GENERATORS.get(type(generator).__name__) is not type(generator):
            raise TypeError(
                f"GeneratorBuffer: the state of a {type(generator).__qualname__} bit generator cannot "
                f"be saved exactly: only NumPy's {', '.join(_BIT_GENERATORS)} can"
            )
        with generator.lock:  # as of one moment, not in the middle of another thread's draw
            state = generator.state
        arrays: dict[str, np.ndarray[Any, Any]] = {}
        return BufferState(arrays, {"state": _encode(state, "", arrays)})

    def check_state(self, state: BufferState) -> str | None:
        try:
            decoded = self._decoded(state)
        except _Refused as e:
            return str(e)
        scratch = type(self.bit_generator)()
        try:
            scratch.state = decoded
        except (TypeError, ValueError, OverflowError) as e:
            return f"NumPy refuses the state ({type(e).__name__}: {e})"
        if not _equal(scratch.state, decoded):
            return "NumPy does not keep the state as given"
        return None

    def load_state(self, state: BufferState) -> None:
        decoded = self._decoded(state)
        generator = self.bit_generator
        with generator.lock:
            generator.state = decoded

    def _decoded(self, state: BufferState) -> dict[str, Any]:
        """The bit generator state ``state`` holds, of the form of this generator's own."""
        if set(state.info) != {"state"}:
            raise _Refused(f"a generator's state is described by 'state' alone, not {sorted(state.info)}")
        used: set[str] = set()
        decoded = _decode(state.info["state"], self.bit_generator.state, state.arrays, used, "")
        if used != set(state.arrays):
            raise _Refused(f"the state has arrays it does not use: {sorted(set(state.arrays) - used)}")
        if not isinstance(decoded, dict):  # (the form is a dict: so is what matched it)
            raise _Refused("the state is not a mapping")
        return decoded

    def __reduce__(self) -> tuple[Any, ...]:
        return (GeneratorBuffer, (self.bit_generator,))  # (a plain Generator's would lose the class)

    def __repr__(self) -> str:
        return f"GeneratorBuffer({type(self.bit_generator).__name__})"


class _Refused(Exception):
    """A state that does not fit (its message says why)."""


def _encode(value: object, where: str, arrays: dict[str, np.ndarray[Any, Any]]) -> JSON:
    """A bit generator's state as JSON: a dict as an object, an int as ``["int", decimal text]``
    (exact at any size, in any JSON reader), a str as ``["str", s]``, an array as
    ``["array", name]``, the array put in ``arrays`` under its dotted path."""
    if isinstance(value, dict):
        return {
            str(key): _encode(item, f"{where}.{key}" if where else str(key), arrays)
            for key, item in value.items()
        }
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return ["int", str(int(value))]
    if isinstance(value, str):
        return ["str", value]
    if isinstance(value, np.ndarray):
        arrays[where] = np.array(value, copy=True, order="C")
        return ["array", where]
    raise TypeError(f"GeneratorBuffer: the bit generator's state holds a {type(value).__name__} at {where!r}")


def _decode(
    encoded: object, form: object, arrays: dict[str, np.ndarray[Any, Any]], used: set[str], where: str
) -> Any:
    """The state ``encoded`` describes, checked against ``form`` (the generator's current state):
    the same keys, names and arrays' shapes and dtypes, integers in range."""
    at = f" at {where!r}" if where else ""
    if isinstance(form, dict):
        if not isinstance(encoded, dict) or set(encoded) != set(form):
            keys = sorted(encoded) if isinstance(encoded, dict) else type(encoded).__name__
            raise _Refused(f"the state has {keys}{at}, the model's generator {sorted(form)}")
        return {
            key: _decode(encoded[key], form[key], arrays, used, f"{where}.{key}" if where else key)
            for key in form
        }
    if not isinstance(encoded, list) or len(encoded) != 2 or not isinstance(encoded[1], str):
        raise _Refused(f"the state's value{at} is malformed")
    tag, text = encoded
    if isinstance(form, str):
        if tag != "str" or text != form:
            raise _Refused(f"the state{at} is {text!r}, the model's generator's {form!r}")
        return text
    if isinstance(form, np.ndarray):
        array = arrays.get(text) if tag == "array" else None
        if array is None:
            raise _Refused(f"the state's array{at} is missing")
        if array.shape != form.shape or array.dtype != form.dtype:
            raise _Refused(
                f"the state's array{at} is {array.dtype} {array.shape}, the model's generator's "
                f"{form.dtype} {form.shape}"
            )
        used.add(text)
        return np.array(array, copy=True)
    if tag != "int" or not _DECIMAL.fullmatch(text):
        raise _Refused(f"the state's integer{at} is malformed")
    value = int(text)
    limit = _INT_LIMITS.get(where.rpartition(".")[2], 2**128)
    if value >= limit:
        raise _Refused(f"the state's integer{at} is {value}, out of range (below {limit})")
    return value


def _equal(a: object, b: object) -> bool:
    """Whether two bit generator states are the same (arrays compared by value)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return set(a) == set(b) and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        return a.dtype == b.dtype and np.array_equal(a, b)
    return type(a) is type(b) and a == b
