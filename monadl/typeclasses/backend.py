"""The array backend: which namespace an op computes with, and the checks on its inputs.

Ops hold no NumPy-only calls: they take ``xp`` from their inputs (the array API standard's
``__array_namespace__``; :mod:`array_api_compat` for arrays that lack it), so the same op code runs
on NumPy, CuPy and array-api-strict. Plain Python floats get :data:`FLOATS`, a namespace with the
few functions the ops use, built on :mod:`math`; so one op definition serves ``FloatLayer`` too.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Sequence
from typing import Any, Final, TypeAlias

import numpy as np
from mypy_extensions import mypyc_attr
from numpy.typing import NDArray

from monadl._compiled import compiled

Array: TypeAlias = NDArray[np.floating[Any]]
IndexArray: TypeAlias = NDArray[np.integer[Any]]
RowIndices: TypeAlias = IndexArray | int | np.integer[Any] | Sequence[int]
"""What ``take_rows`` (and ``w[...]``) takes: an integer array, one integer, or a list of them."""
AnyNDArray: TypeAlias = NDArray[Any]
"""The static type of array data and deltas (NumPy's; CuPy and array-api-strict arrays at run time)."""


@mypyc_attr(native_class=False)  # a compiled subclass of a builtin exception is not a plain one
class ShapeError(ValueError):
    """An op got operands whose shapes do not fit; the message names the op and the shapes."""


class FloatNamespace:
    """The subset of the array API that the ops use, on Python floats."""

    @staticmethod
    def exp(x: float) -> float:
        try:
            return math.exp(x)
        except OverflowError:
            return math.inf

    @staticmethod
    def log(x: float) -> float:
        if x > 0.0:
            return math.log(x)
        return -math.inf if x == 0.0 else math.nan

    @staticmethod
    def sqrt(x: float) -> float:
        return math.sqrt(x) if x >= 0.0 else math.nan

    @staticmethod
    def abs(x: float) -> float:
        return abs(x)

    @staticmethod
    def sign(x: float) -> float:
        return (x > 0.0) - (x < 0.0) + 0.0

    @staticmethod
    def tanh(x: float) -> float:
        return math.tanh(x)

    @staticmethod
    def maximum(x: float, y: float) -> float:
        return x if x >= y else y

    @staticmethod
    def minimum(x: float, y: float) -> float:
        return x if x <= y else y

    @staticmethod
    def where(cond: bool, x: float, y: float) -> float:
        return x if cond else y

    @staticmethod
    def zeros_like(x: float) -> float:
        return 0.0

    @staticmethod
    def sum(x: float) -> float:
        return x


FLOATS: Final = FloatNamespace()


class NumpyNamespace:
    """NumPy's namespace, as the ops see it: the functions they call most go straight to the arrays'
    own methods and the ufuncs (NumPy's module functions ``reshape``, ``take``, ``sum`` ... are
    Python wrappers, a microsecond each on every kernel); every other name is NumPy's."""

    def __getattr__(self, name: str) -> Any:
        return getattr(np, name)

    @staticmethod
    def reshape(x: Any, shape: Any, copy: bool | None = None) -> Any:
        return x.reshape(shape) if copy is None else np.reshape(x, shape, copy=copy)

    @staticmethod
    def take(x: Any, indices: Any, axis: int | None = None) -> Any:
        return x.take(indices, axis=axis)

    @staticmethod
    def permute_dims(x: Any, axes: tuple[int, ...]) -> Any:
        return x.transpose(axes)

    @staticmethod
    def astype(x: Any, dtype: Any, copy: bool = True) -> Any:
        return x.astype(dtype, copy=copy)

    @staticmethod
    def sum(x: Any, axis: Any = None, dtype: Any = None, keepdims: bool = False) -> Any:
        if type(x) is np.ndarray and x.dtype.kind == "f" and dtype is None:
            add: Any = np.add  # (its reduce's overloads do not take a bool keepdims)
            return add.reduce(x, axis=axis, keepdims=keepdims)
        # keepdims as a literal True or False: NumPy's stubs overload sum on it and take no bool.
        return np.sum(x, axis=axis, dtype=dtype, keepdims=True if keepdims else False)


NUMPY: Final = NumpyNamespace()
"""The namespace of NumPy arrays (``xp is NUMPY`` marks NumPy's fast paths)."""

NDARRAY: Final = np.ndarray
"""NumPy's array type, bound once: compiled, ``np.ndarray`` is a lookup in NumPy's module at every
use, and the engine tests a value's type on every kernel."""

NATIVE_MODULE: Final[Any] = importlib.import_module("monadl._native") if compiled() else None
"""``monadl/_native.c``, where it is built (with the compiled engine) and the engine runs compiled;
None otherwise."""
_WRITABLE_OWN: Final[Any] = None if NATIVE_MODULE is None else NATIVE_MODULE.writable_own
"""``monadl/_native.c``'s test, where it is built: compiled, the attributes below are three calls
into NumPy and a flags object made on every delta the backward pass is given."""
_FINITE: Final[Any] = None if NATIVE_MODULE is None else NATIVE_MODULE.finite
_FREEZE: Final[Any] = None if NATIVE_MODULE is None else NATIVE_MODULE.freeze
_ADD_ROW: Final[Any] = None if NATIVE_MODULE is None else NATIVE_MODULE.add_row
_ADD_TO_ROWS: Final[Any] = None if NATIVE_MODULE is None else NATIVE_MODULE.add_to_rows
_MINUS_ZEROS_LIKE: Final[Any] = None if NATIVE_MODULE is None else NATIVE_MODULE.minus_zeros_like
_CONCAT: Final[Any] = None if NATIVE_MODULE is None else NATIVE_MODULE.concat
_SET_FLAG: Final[Any] = None if NATIVE_MODULE is None else NATIVE_MODULE.set_flag
_ANY_SET: Final[Any] = None if NATIVE_MODULE is None else NATIVE_MODULE.any_set
_PUT_ROWS: Final[Any] = None if NATIVE_MODULE is None else NATIVE_MODULE.put_rows
_ADD_ROWS_AT: Final[Any] = None if NATIVE_MODULE is None else NATIVE_MODULE.add_rows_at
_INDEX_ARRAY: Final[Any] = None if NATIVE_MODULE is None else NATIVE_MODULE.index_array


def add_into_row(held: Any, row: int, g: Any) -> None:
    """``held[row] += g``, for a NumPy array ``held`` of two dimensions or more: one loop of
    ``monadl/_native.c`` where it takes the arrays (C-contiguous, of one float dtype, ``g`` of the
    row's shape), else NumPy's view and in-place add (the same additions)."""
    if _ADD_ROW is None or _ADD_ROW(held, row, g) is not True:
        view = held[row]  # added into in place: no store of the row back
        view += g


def put_rows(out: Any, places: Any, data: Any, picks: Any) -> None:
    """``out[places] = data[picks]`` (rows along the first axis), NumPy arrays and index vectors:
    one copy of each row by ``monadl/_native.c`` where it takes them (``out`` C-contiguous, each row
    of ``data`` contiguous, of one float dtype, the indices in range), else NumPy's take and fancy
    assignment (a temporary between)."""
    if _PUT_ROWS is None or _PUT_ROWS(out, places, data, picks) is not True:
        out[places] = data.take(picks, axis=0)


def add_rows_at(held: Any, picks: Any, d: Any, places: Any) -> None:
    """``held[picks] += d[places]`` (``d``'s rows in order where ``places`` is None), NumPy arrays
    and index vectors, ``picks`` distinct: one loop of ``monadl/_native.c`` where it takes them
    (``held`` C-contiguous, each row of ``d`` contiguous, of one float dtype, apart in memory), else
    NumPy's fancy in-place add (the same additions)."""
    if _ADD_ROWS_AT is None or _ADD_ROWS_AT(held, picks, d, places) is not True:
        held[picks] += d if places is None else d[places]


def index_array(values: list[int]) -> Any:
    """``np.asarray(values, dtype=np.intp)`` for a list of Python ints: converted by
    ``monadl/_native.c`` where it is built (NumPy's conversion of a list discovers its dtype and
    shape and converts each element generically)."""
    if _INDEX_ARRAY is not None:
        found = _INDEX_ARRAY(values)
        if found is not None:
            return found
    return np.asarray(values, dtype=np.intp)


def add_to_rows(a: Any, v: Any) -> None:
    """``a += v`` in place, a NumPy array ``a`` and a vector ``v`` of its rows' length (a bias): one
    loop of ``monadl/_native.c`` where it takes the arrays (C-contiguous, of one float dtype), else
    NumPy's in-place add (the same additions)."""
    if _ADD_TO_ROWS is None or _ADD_TO_ROWS(a, v) is not True:
        a += v


def concat_arrays(xp: Any, parts: Sequence[Any], axis: int) -> Any:
    """``xp.concat(parts, axis=axis)``; NumPy arrays of one dtype joined by ``monadl/_native.c``'s
    copy of their bytes where it is built and takes them (the same array: ``np.concatenate``'s
    generic path costs more than the copy on a step's few rows)."""
    if xp is NUMPY and _CONCAT is not None:
        done = _CONCAT(parts, axis)
        if done is not None:
            return done
    return xp.concat(parts, axis=axis)


def set_flag(mask: Any, k: int) -> None:
    """``mask[k] = True`` for a NumPy array of booleans: by ``monadl/_native.c`` where it takes
    them (a C-contiguous writable vector, ``k`` in range), else by NumPy's indexing."""
    if _SET_FLAG is None or _SET_FLAG(mask, k) is not True:
        mask[k] = True


def any_set(mask: Any) -> bool:
    """Whether an element of a NumPy array of booleans is set: read by ``monadl/_native.c`` where it
    takes the mask, else by the ufunc's reduction (``mask.any()`` goes through Python)."""
    if _ANY_SET is not None:
        found: bool | None = _ANY_SET(mask)
        if found is not None:
            return found
    return bool(np.logical_or.reduce(mask, axis=None))


def writable_own(a: Any) -> bool:
    """Whether ``a`` is a writable NumPy array owning its memory (not a view of another's): one its
    holder may write into in place."""
    if _WRITABLE_OWN is not None:
        return _WRITABLE_OWN(a) is True
    return type(a) is NDARRAY and a.base is None and a.flags.writeable


_namespaces: Final[dict[type, Any]] = {}


def namespace_of_type(t: type, example: Any) -> Any:
    """The array namespace of arrays of type ``t`` (cached: the lookup is on every op's path)."""
    xp = _namespaces.get(t)
    if xp is None:
        if t is np.ndarray:
            xp = NUMPY
        elif hasattr(example, "__array_namespace__"):
            xp = example.__array_namespace__()
        else:  # arrays without the standard's attribute (CuPy's)
            import array_api_compat

            xp = array_api_compat.array_namespace(example)
        _namespaces[t] = xp
    return xp


def namespace(*values: Any) -> Any:
    """The namespace to compute ``values`` with: the arrays' namespace, or :data:`FLOATS`."""
    for v in values:
        if type(v) is not float:
            return namespace_of_type(type(v), v)
    return FLOATS


def is_array(x: object) -> bool:
    """True for an array of any array-API library (NumPy, CuPy, array-api-strict)."""
    if hasattr(x, "__array_namespace__"):
        return hasattr(x, "shape") and hasattr(x, "dtype")
    if not hasattr(x, "shape") or not hasattr(x, "dtype"):
        return False  # an int, a slice, a list: what index keys and parameters mostly are
    import array_api_compat  # CuPy's arrays have no __array_namespace__ of their own

    return bool(array_api_compat.is_cupy_array(x))


def is_integer(value: object) -> bool:
    """True for a Python or NumPy integer that is not a bool (a count or a label, not a flag)."""
    return isinstance(value, int | np.integer) and not isinstance(value, bool | np.bool_)


def is_float_array(x: object) -> bool:
    """True for an array of a real floating-point dtype."""
    if isinstance(x, np.ndarray):
        return bool(x.dtype.kind == "f")
    if not is_array(x):
        return False
    xp = namespace_of_type(type(x), x)
    dtype = getattr(x, "dtype", None)
    return bool(xp.isdtype(dtype, "real floating"))


def check_float_array(x: object, where: str) -> None:
    """Raises a TypeError, naming ``where``, unless ``x`` is a floating-point array."""
    if not is_array(x):
        raise TypeError(f"{where}: expected a floating-point array, got {type(x).__name__}")
    if not is_float_array(x):
        dtype = getattr(x, "dtype", "?")
        raise TypeError(f"{where}: expected a floating-point array (float32 or float64), got dtype {dtype}")


def device_of(x: object) -> object:
    """The device an array lives on (``"cpu"`` for NumPy arrays and floats)."""
    if isinstance(x, (float, np.ndarray)):
        return "cpu"
    return getattr(x, "device", "cpu")


_NO_ARGS: Final[dict[str, Any]] = {}


def on_device(xp: Any, like: Any) -> dict[str, Any]:
    """The keyword arguments that make a new array of ``xp`` on the device ``like`` lives on:
    ``xp.zeros(shape, **on_device(xp, like))``. No keyword on NumPy (one device), for floats, or on
    CuPy, whose creation functions make arrays on the current device and take no ``device=``; else
    (array-api-strict, PyTorch through array-api-compat) ``device=like.device``: an array made on
    the default device cannot be combined with one that lives on another."""
    if xp is NUMPY or xp is FLOATS:
        return _NO_ARGS
    device = getattr(like, "device", None)
    if device is None or str(getattr(xp, "__name__", "")).startswith(("cupy", "array_api_compat.cupy")):
        return _NO_ARGS
    return {"device": device}


def host_in(xp: Any, a: Any, like: Any = None) -> Any:
    """``a``, an array an op keeps on the host (NumPy: a lookup's indices, a loss's labels), as an
    array of namespace ``xp`` on the device of ``like`` (the table or logits). Ops keep them on the
    host to stack the ones of merged calls and to check their range, and a table or logits of
    another namespace (a CuPy array on a GPU, array-api-strict) take only arrays of their own."""
    if xp is NUMPY or type(a) is not NDARRAY:
        return a
    return xp.asarray(a, **on_device(xp, like))


def stack_arrays(values: list[Any]) -> Any:
    """Arrays of one shape as the rows of a new one (on NumPy ``array`` of the list: ``stack``
    spends about a microsecond of Python on each array)."""
    first = values[0]
    if type(first) is NDARRAY:
        return np.array(values)
    return namespace(first).stack(values)


def minus_zeros(xp: Any, shape: tuple[int, ...], dtype: Any, like: Any = None) -> Any:
    """An array of -0.0, to sum deltas into: -0.0 is the exact identity of addition, where 0.0 is
    not (``0.0 + -0.0`` is ``0.0``), so an element given one delta holds that delta as it is, a
    -0.0 included. (On NumPy ``empty`` and ``fill``: ``full`` costs more.) ``like``: an array
    whose device it is made on (see :func:`on_device`)."""
    if xp is NUMPY:
        out = np.empty(shape, dtype=dtype)
        out.fill(-0.0)
        return out
    return xp.full(shape, -0.0, dtype=dtype, **on_device(xp, like))


def minus_zeros_like(a: Any) -> Any:
    """:func:`minus_zeros` of ``a``'s shape and dtype, on its device: one call of
    ``monadl/_native.c`` for a NumPy float array where it is built."""
    if _MINUS_ZEROS_LIKE is not None:
        out = _MINUS_ZEROS_LIKE(a)
        if out is not None:
            return out
    return minus_zeros(namespace(a), tuple(a.shape), a.dtype, a)


def unbroadcast(xp: Any, delta: Any, like: Any) -> Any:
    """``delta`` summed back to the shape of ``like`` (broadcasting's vector-Jacobian product).

    ``like`` is the operand's data: a float operand gets a float delta.
    """
    if type(like) is float:
        return delta if type(delta) is float else float(xp.sum(delta))
    shape = like.shape
    dshape = delta.shape
    if dshape == shape:
        return delta
    lead = len(dshape) - len(shape)
    summed_axes = list(range(lead))  # the leading axes, and the 1s of ``like`` that were broadcast
    for i, n in enumerate(shape):  # a loop: a generator costs more (this runs for every bias)
        if n == 1 and dshape[lead + i] != 1:
            summed_axes.append(lead + i)
    axes = tuple(summed_axes)
    if xp is NUMPY and axes:  # the ufunc's reduction (np.sum adds microseconds of Python), and no
        # reshape where the sum has the shape already: a view would keep a gradient from owning
        # its memory (see ``training._handed_over``). Without leading axes, every summed axis is
        # one of ``like``'s own 1s, so keeping them gives its shape (a stacked bias (20, 1, 64)).
        summed = (
            np.add.reduce(delta, axis=axes, keepdims=True) if lead == 0 else np.add.reduce(delta, axis=axes)
        )
        return summed if type(summed) is NDARRAY and summed.shape == shape else np.reshape(summed, shape)
    summed = xp.sum(delta, axis=axes) if axes else delta
    return xp.reshape(summed, shape)


def freeze(data: Any) -> Any:
    """``data``, made read-only where the array library allows it (NumPy). A weight's data is
    replaced, never changed in place, by a training step; forward values and tapes may share it, so
    an accidental in-place change of a prediction must not change the weight."""
    if isinstance(data, np.ndarray):
        if _FREEZE is not None:
            _FREEZE(data)  # (compiled, the flags object below is made for a step's every weight)
        else:
            data.flags.writeable = False
    return data


def finite_by_bits(a: Any) -> bool | None:
    """Whether every element of ``a`` is finite, read from its bits by ``monadl/_native.c`` where
    built, for a C-contiguous NumPy array of float32 or float64; None where it cannot tell (not
    built, or another value)."""
    if _FINITE is None:
        return None
    found: bool | None = _FINITE(a)
    return found


def shape_of(x: object) -> tuple[int, ...] | str:
    """A printable shape: the array's shape, or ``"float"``."""
    if type(x) is float:
        return "float"
    return tuple(getattr(x, "shape", ()))


def dtype_name(array: Any) -> str:
    """An array's dtype by name (``float32``), comparable across namespaces, whose dtype objects
    need not compare equal (array-api-strict's never equal NumPy's)."""
    return str(array.dtype).rsplit(".", 1)[-1]


def to_numpy(array: Any) -> Any:
    """A NumPy array of an array of any namespace (a CuPy array's by ``get``, from the device;
    another's through DLPack, or NumPy's conversion where that is refused); NumPy's as it is."""
    if isinstance(array, np.ndarray):
        return array
    get = getattr(array, "get", None)
    if callable(get):  # CuPy: from the device
        return np.asarray(get())
    try:
        return np.from_dlpack(array)
    except (TypeError, AttributeError, BufferError, RuntimeError):
        return np.asarray(array)


def to_namespace(array: Any, xp: Any, device: Any = None) -> Any:
    """A copy of ``array`` (of any namespace) in the array namespace ``xp``, on ``device`` where
    given (else ``xp``'s default; NumPy's is the host's): through the host, by :func:`to_numpy`.
    The one conversion of ``module.to(xp)``, the builders' ``xp=`` and a checkpoint's load."""
    if xp is np or xp is NUMPY:
        return np.array(to_numpy(array), copy=True)
    host = array if isinstance(array, np.ndarray) else to_numpy(array)
    return xp.asarray(host, copy=True) if device is None else xp.asarray(host, copy=True, device=device)


def matrix_product(a: Any, b: Any) -> Any:
    """``np.dot(a, b)`` of NumPy arrays; for a large product of contiguous matrices,
    ``np.matmul``, the same BLAS call (the same bits; a single row or column stays with
    ``np.dot``, whose matrix-vector call might differ). ``np.dot`` fills its result with zeros
    before BLAS writes it, a pass over it that ``np.matmul`` skips; on small products its dispatch
    costs less. (``np.matmul`` runs a loop of its own, far slower, on a strided operand: those stay
    with ``np.dot``, which copies them.)"""
    if a.ndim == 2 and b.ndim == 2:  # (np.dot of a stack is not np.matmul's: dot's)
        m, n = a.shape[0], b.shape[1]
        if m * n >= _ZEROED and m > 1 and n > 1 and _contiguous(a) and _contiguous(b):
            return np.matmul(a, b)
    return np.dot(a, b)


_ZEROED: Final = 16384
"""The products (elements) from which :func:`matrix_product` calls ``np.matmul``."""


def _contiguous(a: Any) -> bool:
    flags = a.flags
    return bool(flags.c_contiguous or flags.f_contiguous)
