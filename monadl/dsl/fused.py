"""Fused elementwise kernels for CuPy arrays, the hand-written ones for NumPy arrays, and reading
many device values at once.

On a GPU, a rule written with array operators (Adam's update, GELU's slope) runs one kernel per
operator, each reading and writing a whole temporary array: a dozen passes over memory where one
would do. A :class:`Kernel` is such a rule written once as one kernel: a few assignments in the
common subset of CUDA C++ and Python, which :func:`on_cupy` arrays run as one
``cupy.ElementwiseKernel``. The callers (``optimizers``, the op families in ``monadl.dsl.ops``) take the
fused path only for CuPy arrays of one float dtype; NumPy, array-api-strict and every other
namespace keep their rules as written.

A kernel's text is checked when it is made (:meth:`Kernel.check`): names of its inputs, scalars and
earlier assignments, the operators ``+ - * /``, parentheses, the functions ``sqrt``, ``exp`` and
``tanh``, and number literals only as ``T(0.5)``, T being the arrays' float type. So every operation
rounds in the arrays' type, as NumPy's and CuPy's operators do with a Python float operand, and the
same text means the same arithmetic in both languages: :meth:`Kernel.emulate` runs it with NumPy,
and the tests run the CUDA source itself through a stand-in CuPy that reads it back, comparing the
results with the rules it replaces bit for bit, with no GPU. The CUDA build contracts no
``a * b + c`` into a fused multiply-add (``--fmad=false``): each operation rounds as the operator
it replaces does. Only the library functions (``exp``, ``tanh``) may round differently from
NumPy's, by an ulp or two, as CuPy's own do.

On NumPy arrays, the rules the optimizers, the recurrent cells and the cross-entropy of labels run
most run as loops of ``monadl/_native.c`` (:data:`NATIVE`) where the engine is compiled: each the
same IEEE operations in the same order as the NumPy rule it replaces (the cells' forwards with
NumPy's own exp and tanh loops, the cross-entropy with its exp, log1p and sums), so the results are
the same bits; the callers keep the rule for every other case
(:func:`native_takes`, :func:`native_forward` and :func:`native_deltas` say which).

:func:`all_true` and :func:`sum_on_devices` read the values of many device scalars (a step's
finite checks, a global norm's sums of squares) with one synchronisation per device, where
``bool()`` or ``float()`` on each would wait for the device once per weight.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from monadl.typeclasses.backend import NATIVE_MODULE, namespace

NATIVE: Any = NATIVE_MODULE
"""``monadl/_native.c``'s kernels, where they are built (with the compiled engine) and it runs
compiled; None otherwise. (Not ``Final``: compiled, this module would read a copy taken at import,
and the tests set it to None to run the NumPy rules.)"""


def native_takes(*arrays: Any) -> bool:
    """Whether the native kernels are loaded and read ``arrays`` as they are: C-contiguous, aligned
    NumPy arrays (not 0-d) of one shape and one float32 or float64 dtype in the machine's byte
    order."""
    return NATIVE is not None and bool(NATIVE.takes(*arrays))


def native_forward(cell: str, *operands: Any) -> tuple[Any, Any] | None:
    """The forward of a recurrent cell's rule (``"lstm_c"``, ``"tree_lstm_c"``, ``"lstm_h"``,
    ``"gru_h"``) by the kernels: ``(result, t)``, ``t`` the sigmoids and the tanh it saves, as
    blocks of one array; None where the kernels are not loaded or do not take ``operands``
    (:func:`native_takes`), or NumPy's exp and tanh loops were not found (the caller runs its
    rule)."""
    done: tuple[Any, Any] | None = None if NATIVE is None else NATIVE.cell_forward(cell, *operands)
    return done


def native_deltas(cell: str, d: Any, saved: Any, *operands: Any) -> tuple[Any, ...] | None:
    """The joint vjp of a recurrent cell's rule (those of :func:`native_forward`) by the kernels:
    every operand's delta, an array of its own; None where the kernels are not loaded or do not
    take ``d`` (which may be strided: a C-ordered copy is read) and ``operands``, or ``saved`` is
    not the forward's arrays of their shape and dtype (one array of blocks, or a tuple)."""
    done: tuple[Any, ...] | None = None if NATIVE is None else NATIVE.cell_deltas(cell, d, saved, *operands)
    return done


ENABLED = True
"""Whether CuPy arrays take the fused kernels (``False``: the rules as written, one kernel per
operator: what ``bench models --no-fused`` measures the kernels against)."""

_FUNCTIONS = {"sqrt": np.sqrt, "exp": np.exp, "tanh": np.tanh}
_NAME = re.compile(r"[A-Za-z][A-Za-z0-9]*")
_TOKEN = re.compile(r"\s*(?:(T\(\s*[0-9][0-9.e+-]*\s*\))|([A-Za-z][A-Za-z0-9]*)|([-+*/(),]))")
_RESERVED = {"i", "n", "T", *_FUNCTIONS}  # CuPy's index and size, the type, the functions
_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


@dataclass(frozen=True)
class Kernel:
    """An elementwise rule as one kernel: ``inputs`` (arrays, broadcast together), ``scalars``
    (numbers, given in the arrays' type), ``outputs`` (fresh arrays) and ``body``, assignments
    ``"name = expression"`` in order; a name that is not an output is a temporary."""

    name: str
    inputs: tuple[str, ...]
    scalars: tuple[str, ...]
    outputs: tuple[str, ...]
    body: tuple[str, ...]

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        """Raises ``ValueError`` naming the kernel and the statement where the text leaves the
        subset that CUDA C++ and Python read alike (see the module), or an output is never set."""
        known = set(self.inputs) | set(self.scalars)
        for name in (*self.inputs, *self.scalars, *self.outputs):
            if not _NAME.fullmatch(name) or name in _RESERVED:
                raise ValueError(f"kernel {self.name}: {name!r} cannot name a value")
        for statement in self.body:
            target, equals, expression = statement.partition(" = ")
            if not equals or not _NAME.fullmatch(target) or target in _RESERVED or target in known:
                raise ValueError(f"kernel {self.name}: {statement!r} must assign a new name")
            rest = expression
            while rest.strip():
                match = _TOKEN.match(rest)
                word = match.group(2) if match else None
                if match is None or (word is not None and word not in known and word not in _FUNCTIONS):
                    raise ValueError(f"kernel {self.name}: {statement!r}: cannot read {rest.strip()!r}")
                rest = rest[match.end() :]
            known.add(target)
        missing = [name for name in self.outputs if name not in known]
        if missing:
            raise ValueError(f"kernel {self.name}: the outputs {missing} are never set")

    def source(self) -> str:
        """The body as CUDA C++: a temporary is declared of type T."""
        lines = []
        for statement in self.body:
            target = statement.partition(" = ")[0]
            lines.append(f"{'' if target in self.outputs else 'T '}{statement};")
        return "\n".join(lines)

    def __call__(self, arrays: Sequence[Any], scalars: Sequence[float]) -> tuple[Any, ...]:
        """The outputs for CuPy ``arrays`` (one float dtype: :func:`on_cupy`) and ``scalars``."""
        kernel = _COMPILED.get(self)
        if kernel is None:
            kernel = _COMPILED[self] = _compile(self)
        kind = arrays[0].dtype.type
        results = kernel(*arrays, *(kind(s) for s in scalars))
        return tuple(results) if isinstance(results, tuple) else (results,)

    def emulate(self, arrays: Sequence[Any], scalars: Sequence[float]) -> tuple[Any, ...]:
        """The outputs computed from the same text with NumPy (arrays of one float dtype): each
        operation in the arrays' type, as the CUDA kernel computes it."""
        kind = np.asarray(arrays[0]).dtype.type
        values: dict[str, Any] = {"T": kind, **_FUNCTIONS}
        values.update(zip(self.inputs, (np.asarray(a) for a in arrays), strict=True))
        values.update(zip(self.scalars, (kind(s) for s in scalars), strict=True))
        for statement in self.body:
            target, _, expression = statement.partition(" = ")
            values[target] = eval(expression, {"__builtins__": {}}, values)  # the checked text
        shape = np.broadcast_shapes(*(np.shape(a) for a in arrays))
        return tuple(
            np.broadcast_to(np.asarray(values[name], dtype=kind), shape).copy() for name in self.outputs
        )


_COMPILED: dict[Kernel, Any] = {}


def _compile(kernel: Kernel) -> Any:
    import cupy

    return cupy.ElementwiseKernel(
        ", ".join(f"T {name}" for name in (*kernel.inputs, *kernel.scalars)),
        ", ".join(f"T {name}" for name in kernel.outputs),
        kernel.source(),
        f"monadl_{kernel.name}",
        options=("--fmad=false",),
    )


def on_cupy(*arrays: Any) -> bool:
    """Whether ``arrays`` are all CuPy arrays of one float dtype (float32 or float64): then a
    :class:`Kernel` runs them. False, without importing CuPy, wherever CuPy was not imported."""
    cupy = sys.modules.get("cupy")
    if cupy is None or not ENABLED:
        return False
    kind = cupy.ndarray
    first = arrays[0]
    if type(first) is not kind or first.dtype not in _FLOATS:
        return False
    for a in arrays:
        if type(a) is not kind or a.dtype != first.dtype:
            return False
    return True


def _groups(values: Sequence[Any]) -> list[list[int]]:
    """The indices of ``values`` (device arrays) by namespace and device, in order."""
    keys: list[tuple[Any, Any]] = []
    groups: list[list[int]] = []
    for k, value in enumerate(values):
        key = (namespace(value), getattr(value, "device", None))
        for j, seen in enumerate(keys):
            if seen[0] is key[0] and seen[1] == key[1]:
                groups[j].append(k)
                break
        else:
            keys.append(key)
            groups.append([k])
    return groups


def all_true(flags: Sequence[Any]) -> bool:
    """Whether every one of ``flags`` (0-d boolean arrays, on any devices) is true, read with one
    synchronisation per namespace and device."""
    for group in _groups(flags):
        xp = namespace(flags[group[0]])
        if not bool(xp.all(xp.stack([flags[k] for k in group]))):
            return False
    return True


def sum_on_devices(values: Sequence[Any]) -> float:
    """The sum of ``values`` (0-d float arrays, on any devices) as a Python float, read with one
    synchronisation per namespace and device (each device's values are added there first)."""
    result = 0.0
    for group in _groups(values):
        xp = namespace(values[group[0]])
        result += float(xp.sum(xp.stack([values[k] for k in group])))
    return result
