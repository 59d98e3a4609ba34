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
from typing import Any, cast

from monadl.dsl.weights import ArrayWeight, FloatWeight
from monadl.nn.buffer import Buffer

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
        children = _children(value, path, caller)
        if children is None or id(value) in visiting:
            continue
        visiting.add(id(value))
        stack.extend(reversed([(f"{path}.{key}" if path else key, child) for key, child in children]))
    return found


def _children(value: object, path: str, caller: str) -> list[tuple[str, object]] | None:
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
