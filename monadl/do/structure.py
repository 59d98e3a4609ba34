"""The structure of a static graph: what decides whether a compiled program can be replayed for it.

A graph of ops on weights and constants only (``Apply``, ``Variable``, ``Pure(Tape(x))``; no node of
the monad's own, no batchable call) has a *key*: its ops in the order of a depth-first walk, each
with its primitive, the static part of its parameters and the places of its inputs; its weights'
and constants' value kinds (type, shape, dtype); its float constants' values (they decide merges).
Two graphs of equal keys run the same steps. Its *bindings* are the nodes whose values a replay
reads from the graph at hand: its weights, its constants, and the ops with per-run parameters (a
lookup's indices, a loss's labels), in walk order; a program's steps name them by position.

The walk here computes both and nothing else (it runs for every run of a static graph, replayed
or not); the scheduler uses the bindings' positions when it interprets the graph.
"""

from __future__ import annotations

from typing import Any, Final, cast

from monadl.do.do import APPLY, PURE, VARIABLE, Apply, Do, Pure, Variable
from monadl.do.primitive import float_key, value_key
from monadl.do.values import Tape
from monadl.do.versions import data_of

_MARK: Final[Do[Any]] = Pure(None)  # on the walk's stack: the node below it has had its sources walked


class Structure:
    """A static graph's key and bindings (see the module); ``index``: a bound node's position."""

    def __init__(self, key: tuple[Any, ...], nodes: list[Do[Any]], index: dict[Do[Any], int]) -> None:
        self.key = key
        self.nodes = nodes
        self.index = index


def structure_of(root: Do[Any]) -> Structure | None:
    """``root``'s graph's structure, or None if it is not static (a node of another kind met)."""
    order: dict[Do[Any], int] = {}  # a node's position in the key
    key: list[Any] = []
    nodes: list[Do[Any]] = []
    index: dict[Do[Any], int] = {}
    stack: list[Do[Any]] = [root]
    while stack:
        node = stack.pop()
        if node is _MARK:
            apply = cast(Apply, stack.pop())
            pkey = apply.prim.static_key(apply.params)
            if pkey is None:  # an unhashable parameter: no key
                return None
            places = []
            for s in apply.sources:
                places.append(order[s])
            order[apply] = len(key)
            key.append((apply.prim, pkey, tuple(places)))
            if apply.prim.per_run:
                index[apply] = len(nodes)
                nodes.append(apply)
            continue
        if node in order:
            continue
        kind = node.kind
        if kind == APPLY:
            order[node] = -1  # being walked
            stack.append(node)
            stack.append(_MARK)
            sources = node.sources
            for i in range(len(sources) - 1, -1, -1):  # walked in order
                s = sources[i]
                if s not in order:
                    stack.append(s)
        elif kind == VARIABLE:
            order[node] = len(key)
            key.append(("v", value_key(data_of(cast(Variable, node).weight, None))))
            index[node] = len(nodes)
            nodes.append(node)
        elif kind == PURE:
            value = cast(Pure[Any], node).value
            if type(value) is not Tape:
                return None
            data = value.data
            order[node] = len(key)
            key.append(("f", float_key(data)) if type(data) is float else ("c", value_key(data)))
            index[node] = len(nodes)
            nodes.append(node)
        else:
            return None
    return Structure(tuple(key), nodes, index)
