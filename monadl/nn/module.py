"""Modules: a model's weights and buffers collected, named and typed (in the manner of equinox).

A :class:`Module` is an ordinary class, usually a dataclass, whose fields hold weights, buffers
(state that gradients do not train: :mod:`monadl.nn.buffer`), other modules, and lists, tuples or
dicts of them. ``module.weights()`` finds every weight, depth first in the order of the fields (a
dataclass's declared order, else the order the attributes were set), and names it by its path:
``"cells.0.i.w"``. The order and the names are stable: checkpoints, gradient clipping and
comparisons rely on them. Other values in fields (numbers, arrays, functions, an executor) are
skipped. A weight reachable by two paths (shared between two layers) is listed once, under the
first. ``module.buffers()`` finds every buffer by the same walk and the same rules:
``"drop.generator"``.

Anything that takes a module takes such a structure too: ``weights_of([encoder, decoder])``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Self, cast

import numpy as np

from monadl.dsl.core.weights import ArrayWeight, FloatWeight
from monadl.nn.buffer import ArrayBuffer, Buffer
from monadl.runtime.versions import COMMIT_LOCK, publish, read
from monadl.typeclasses.backend import dtype_name, freeze, is_array, to_namespace
from monadl.typeclasses.sparse import SparseRows

Weight = FloatWeight | ArrayWeight


class Module:
    """A model's base class. Subclass it as a dataclass whose fields are weights, buffers, modules,
    and lists, tuples or dicts of them::

        @dataclass
        class Affine(ml.Module):
            w: ml.ArrayWeight
            b: ml.ArrayWeight

            def __call__(self, x: ml.ArrayLayer) -> ml.ArrayLayer:
                return ml.linear(x, self.w, self.b)
    """

    def weights(self) -> dict[str, Weight]:
        """Every weight of the module by its dotted name, in a stable order (see the module)."""
        return weights_of(self)

    def buffers(self) -> dict[str, Buffer]:
        """Every buffer of the module by its dotted name, in a stable order (see the module)."""
        return buffers_of(self)

    def parameter_count(self, *, trainable_only: bool = False) -> int:
        """The number of scalars in the module's weights (see :func:`parameter_count`)."""
        return parameter_count(self, trainable_only=trainable_only)

    def summary(self) -> str:
        """A table of the module's weights and buffers (see :func:`summary`)."""
        return summary(self)

    def to(self, xp: Any, *, device: Any = None) -> Self:
        """Moves the module's weights, their optimizer state and its buffers to the array namespace
        ``xp`` (on ``device``), in one commit (see :func:`to_device`); returns the module."""
        to_device(self, xp, device=device)
        return self


def weights_of(structure: object) -> dict[str, Weight]:
    """The weights of a module, a weight, or a list, tuple or dict of them, by dotted name (a lone
    weight is named by its ``name``, else ``"weight"``)."""
    if isinstance(structure, (FloatWeight, ArrayWeight)):
        return {structure.name or "weight": structure}
    return cast("dict[str, Weight]", _leaves(structure, (FloatWeight, ArrayWeight), "weights_of"))


def buffers_of(structure: object) -> dict[str, Buffer]:
    """The buffers of a module, a buffer, or a list, tuple or dict of them, by dotted name (a lone
    buffer is named ``"buffer"``), found as :func:`weights_of` finds weights."""
    if isinstance(structure, Buffer):
        return {"buffer": structure}
    return cast("dict[str, Buffer]", _leaves(structure, (Buffer,), "buffers_of"))


def _leaves(structure: object, leaf: tuple[type, ...], caller: str) -> dict[str, object]:
    """The values of the types ``leaf`` in ``structure``, by path, each listed once."""
    found: dict[str, object] = {}
    named: set[int] = set()
    # Depth first, iteratively: (path, value) pairs, the next to visit last.
    stack: list[tuple[str, object]] = [("", structure)]
    visiting: set[int] = set()  # containers already expanded (a module that refers back to its parent)
    while stack:
        path, value = stack.pop()
        if isinstance(value, leaf):
            if id(value) not in named:
                named.add(id(value))
                found[path] = value
            continue
        children = children_of(value, path, caller)
        if children is None or id(value) in visiting:
            continue
        visiting.add(id(value))
        stack.extend(reversed([(f"{path}.{key}" if path else key, child) for key, child in children]))
    return found


def children_of(value: object, path: str, caller: str) -> list[tuple[str, object]] | None:
    """The named children of a container (None: not one)."""
    if isinstance(value, Module):
        cls: Any = type(value)
        if dataclasses.is_dataclass(cls):
            return [(f.name, getattr(value, f.name)) for f in dataclasses.fields(cls)]
        return list(vars(value).items())
    if isinstance(value, (list, tuple)):
        return [(str(i), child) for i, child in enumerate(value)]
    if isinstance(value, dict):
        children = []
        for key, child in value.items():
            if not isinstance(key, (str, int)) or isinstance(key, bool):
                raise TypeError(f"{caller}: a dict's keys must be str or int, got {key!r} at {path!r}")
            name = str(key)
            if not name or "." in name:
                raise ValueError(
                    f"{caller}: a dict key must be non-empty and hold no '.', got {key!r} at {path!r}"
                )
            children.append((name, child))
        return children
    return None


def parameter_count(structure: object, *, trainable_only: bool = False) -> int:
    """The number of scalars in the weights of a module (or a structure of them: see
    :func:`weights_of`): a float weight counts 1, an array weight its size. Buffers are not
    parameters. ``trainable_only``: frozen weights (``trainable = False``) are left out."""
    total = 0
    for weight in weights_of(structure).values():
        if trainable_only and not weight.trainable:
            continue
        total += _count(weight)
    return total


def _count(weight: Weight) -> int:
    data = weight.data
    return 1 if isinstance(data, float) else math.prod(tuple(data.shape))


def summary(structure: object) -> str:
    """A table of a module's weights and buffers: each one's dotted name, kind, shape, dtype and
    number of scalars, then the total of the parameters (and of the trainable ones)::

        name  kind    shape   dtype    count
        w     weight  (4, 3)  float32     12
        b     weight  (3,)    float32      3
        total: 15 parameters (15 trainable)
    """
    rows = [("name", "kind", "shape", "dtype", "count")]
    for name, weight in weights_of(structure).items():
        data = weight.data
        kind = "weight" if weight.trainable else "frozen"
        if isinstance(data, float):
            rows.append((name, kind, "float", "float64", "1"))
        else:
            rows.append((name, kind, str(tuple(data.shape)), dtype_name(data), str(_count(weight))))
    for name, buffer in buffers_of(structure).items():
        array = getattr(buffer, "data", None)
        if array is not None and hasattr(array, "shape"):
            size = str(math.prod(tuple(array.shape)))
            rows.append((name, "buffer", str(tuple(array.shape)), dtype_name(array), size))
        else:
            rows.append((name, "buffer", "-", "-", "-"))
    widths = [max(len(row[k]) for row in rows) for k in range(5)]
    lines = [
        "  ".join(
            cell.rjust(widths[k]) if k == 4 else cell.ljust(widths[k]) for k, cell in enumerate(row)
        ).rstrip()
        for row in rows
    ]
    total, trainable = parameter_count(structure), parameter_count(structure, trainable_only=True)
    lines.append(f"total: {total} parameters ({trainable} trainable)")
    return "\n".join(lines)


def to_device(structure: object, xp: Any, *, device: Any = None) -> None:
    """Moves every weight of a module (or a structure of them), its optimizer state and every
    array buffer to the array namespace ``xp`` (``numpy``, ``cupy``, ``array_api_strict``, any
    array API namespace), on ``device`` where given (else ``xp``'s default), in one commit: a
    prediction or a step beside it sees every weight before the move or every one after. Shapes,
    dtypes and values are kept; the optimizer continues where it was (Adam's moments and step
    count move with the weight). A random generator buffer (dropout's) stays on the host: its masks
    are copied to the array's device when drawn."""
    writes: list[tuple[Any, Any, Any]] = []
    with COMMIT_LOCK:
        for weight in weights_of(structure).values():
            version = read(weight.head, None)
            data = version.data
            if not isinstance(data, float):
                data = freeze(moved_to(data, xp, device))
            state = version.state
            if state is not None:
                optimizer, held = state
                state = (optimizer, moved_to(held, xp, device))
            writes.append((weight, data, state))
        for buffer in buffers_of(structure).values():
            if isinstance(buffer, ArrayBuffer):
                moved = moved_to(buffer.data, xp, device)
                if isinstance(moved, np.ndarray):
                    moved.flags.writeable = False
                writes.append((buffer, moved, None))
        publish(writes)


def moved_to(value: Any, xp: Any, device: Any = None) -> Any:
    """``value`` with every array in it (an optimizer state: tuples, lists and dicts of arrays and
    numbers) copied to ``xp`` (on ``device``) by :func:`~monadl.typeclasses.backend.to_namespace`."""
    if isinstance(value, tuple):
        items = [moved_to(item, xp, device) for item in value]
        return type(value)(*items) if hasattr(value, "_fields") else tuple(items)
    if isinstance(value, list):
        return [moved_to(item, xp, device) for item in value]
    if isinstance(value, dict):
        return {key: moved_to(item, xp, device) for key, item in value.items()}
    if isinstance(value, SparseRows):
        return SparseRows(
            moved_to(value.indices, xp, device), moved_to(value.values, xp, device), value.shape
        )
    return to_namespace(value, xp, device) if is_array(value) else value
