"""Modules: a model's weights collected, named and typed (in the manner of equinox).

A :class:`Module` is an ordinary class, usually a dataclass, whose fields hold weights, other
modules, and lists, tuples or dicts of them. ``module.weights()`` finds every weight, depth first in
the order of the fields (a dataclass's declared order, else the order the attributes were set), and
names it by its path: ``"cells.0.i.w"``. The order and the names are stable: checkpoints, gradient
clipping and comparisons rely on them. Other values in fields (numbers, arrays, functions, an
executor) are not weights and are skipped. A weight reachable by two paths (shared between two
layers) is listed once, under the first.

Anything that takes a module takes such a structure too: ``weights_of([encoder, decoder])``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from monadl.dsl.weights import ArrayWeight, FloatWeight

Weight = FloatWeight | ArrayWeight


class Module:
    """A model's base class. Subclass it as a dataclass whose fields are weights, modules, and
    lists, tuples or dicts of them::

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


def weights_of(structure: object) -> dict[str, Weight]:
    """The weights of a module, a weight, or a list, tuple or dict of them, by dotted name (a lone
    weight is named by its ``name``, else ``"weight"``)."""
    found: dict[str, Weight] = {}
    if isinstance(structure, (FloatWeight, ArrayWeight)):
        found[structure.name or "weight"] = structure
        return found
    named: set[int] = set()
    # Depth first, iteratively: (path, value) pairs, the next to visit last.
    stack: list[tuple[str, object]] = [("", structure)]
    visiting: set[int] = set()  # containers already expanded (a module that refers back to its parent)
    while stack:
        path, value = stack.pop()
        if isinstance(value, (FloatWeight, ArrayWeight)):
            if id(value) not in named:
                named.add(id(value))
                found[path] = value
            continue
        children = _children(value, path)
        if children is None or id(value) in visiting:
            continue
        visiting.add(id(value))
        stack.extend(reversed([(f"{path}.{key}" if path else key, child) for key, child in children]))
    return found


def _children(value: object, path: str) -> list[tuple[str, object]] | None:
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
                raise TypeError(f"weights_of: a dict's keys must be str or int, got {key!r} at {path!r}")
            name = str(key)
            if not name or "." in name:
                raise ValueError(
                    f"weights_of: a dict key must be non-empty and hold no '.', got {key!r} at {path!r}"
                )
            children.append((name, child))
        return children
    return None
