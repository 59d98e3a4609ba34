"""Straight-line runs: a static graph on a sequential executor, as a list of ops.

The executor interprets a ``Do`` node by node: fibers, lazy deltas, reference-counted tapes. That is
what lets it run independent sub-graphs on a pool, look through ``flat_map``s and data-dependent
control flow, and merge equal calls as it goes. A graph that is visible before it runs and runs on
one thread needs none of it: ops on weights and constants only (no ``flat_map`` of the user's, no
``@batchable`` calls, no tapes of the user's own), on an executor without a pool. Such a graph (the
CIFAR column model, most feed-forward models) is run here as a list in the order of a depth-first
walk, forward, then backward in reverse order:

* forward, each op computes exactly what its tape would (``apply.forward_data``: the same checks,
  the same errors naming the op and the shapes);
* backward, a node's delta is the sum of its consumers' deltas, its vjps (``apply.input_delta``)
  run only for the inputs on a path to a weight, and a weight's gradient is its summed delta;

so the results are the executor's, without its per-node bookkeeping (measured on the column model:
see the README's "Straight-line runs"). ``Executor(planning=False)`` turns this off, with planned
batching (``monadl.dsl.fold``).
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Any

from monadl.do.batching import RunStats
from monadl.do.collector import gc_paused
from monadl.do.do import BIND, DELAY, FLAT, PRIVATE, PURE, Do
from monadl.do.executor import Executor
from monadl.dsl.apply import _Build, forward_data, input_delta
from monadl.dsl.weights import _WeightState
from monadl.tape.tape import Tape
from monadl.typeclasses.sparse import add, add_into

_WEIGHT_FORWARD = _WeightState._tape  # a weight's forward: Delay(weight._tape)


class Program:
    """A walked graph and, once :meth:`forward` ran, its nodes' values.

    Node ``k`` (in the walk's post-order: inputs before their consumers, the root last) is a
    constant (``ops[k]`` None, ``weights[k]`` None), a weight (``weights[k]``), or an op
    (``ops[k]``, a ``_Build``, of ``inputs[k]``, its input nodes)."""

    __slots__ = ("datas", "inputs", "kernels", "ops", "saved", "weights", "xps")

    def __init__(self) -> None:
        self.ops: list[_Build | None] = []
        self.inputs: list[tuple[int, ...]] = []
        self.weights: list[Any] = []
        self.datas: list[Any] = []
        self.saved: list[Any] = []  # what an op saved for its vjps, or its result
        self.xps: list[Any] = []
        self.kernels = 0

    def forward(self) -> Any:
        """Runs the ops in order; returns the root's value."""
        ops, inputs, datas, saved, xps = self.ops, self.inputs, self.datas, self.saved, self.xps
        for k, build in enumerate(ops):
            if build is None:
                continue
            prim = build.prim
            xps[k], datas[k], s = forward_data(prim, build.params, tuple([datas[i] for i in inputs[k]]))
            saved[k] = s if prim.saves else datas[k]
            self.kernels += 1
        return datas[-1]

    def backward(self, seed: Any) -> dict[Any, Any]:
        """Backpropagates ``seed`` (the root's delta); returns every weight's summed delta."""
        ops, inputs, datas, weights = self.ops, self.inputs, self.datas, self.weights
        n = len(ops)
        wanted = [False] * n  # on a path to a weight: its delta is computed
        for k, build in enumerate(ops):
            if build is None:
                wanted[k] = weights[k] is not None
            else:
                for i in inputs[k]:
                    if wanted[i]:
                        wanted[k] = True
                        break
        # A node's delta so far, summed as its consumers give them (so a weight used many times
        # holds one sum, not all its deltas), and whether that sum is a fresh value of our own
        # (else it may be another node's delta too, and is not added into in place).
        deltas: list[Any] = [None] * n
        owned = [False] * n
        deltas[n - 1] = seed
        gradients: dict[Any, Any] = {}
        for k in range(n - 1, -1, -1):
            delta = deltas[k]
            if delta is None or not wanted[k]:
                continue
            deltas[k] = None
            build = ops[k]
            if build is None:  # a weight (used once or more: one node)
                weight = weights[k]
                held_gradient = gradients.get(weight)
                gradients[weight] = delta if held_gradient is None else add(held_gradient, delta)
                continue
            prim = build.prim
            args = tuple([datas[i] for i in inputs[k]])
            passes = prim.passes and type(datas[k]) is float
            for j, i in enumerate(inputs[k]):
                if not wanted[i]:
                    continue
                if passes and type(args[j]) is float:  # its delta is this delta: no kernel for it
                    g = delta
                else:
                    g = input_delta(prim, build.params, self.xps[k], args, self.saved[k], delta, j, False)
                    self.kernels += 1
                held = deltas[i]
                if held is None:
                    deltas[i] = g
                elif owned[i]:
                    deltas[i] = add_into(held, g)
                else:
                    deltas[i] = add(held, g)
                    owned[i] = True
        return gradients


def program(root: Do[Any]) -> Program | None:
    """``root``'s graph as a :class:`Program`, or None at the first node of a kind it cannot hold
    (then the executor runs the graph, and nothing has run)."""
    prog = Program()
    index: dict[Do[Any], int] = {}  # node -> its position; -1 while its inputs are being walked
    ops, inputs, weights, datas = prog.ops, prog.inputs, prog.weights, prog.datas
    stack: list[Any] = [root]  # nodes to walk, and (node,) once their inputs are walked
    while stack:
        item = stack.pop()
        if type(item) is tuple:
            node = item[0]
            index[node] = len(ops)
            ops.append(node.f)
            inputs.append(tuple([index[s] for s in node.sources]))
            weights.append(None)
            datas.append(None)
            continue
        if item in index:
            continue
        tag = item.tag & ~PRIVATE
        if tag == PURE:
            tape = item.value
            if type(tape) is not Tape:  # a tape of the user's own, or an executor's
                return None
            data = tape.data
            weight = None
        elif tag == DELAY:
            thunk = item.thunk
            if getattr(thunk, "__func__", None) is not _WEIGHT_FORWARD:
                return None
            weight = thunk.__self__
            data = weight.data
        elif tag == BIND and item.mode == FLAT and type(item.f) is _Build:
            index[item] = -1
            stack.append((item,))
            for source in reversed(item.sources):  # walked in order
                if source not in index:
                    stack.append(source)
            continue
        else:
            return None
        index[item] = len(ops)
        ops.append(None)
        inputs.append(())
        weights.append(weight)
        datas.append(data)
    n = len(ops)
    prog.saved = [None] * n
    prog.xps = [None] * n
    return prog


def straight_line(executor: Executor) -> bool:
    """Whether ``executor`` runs static graphs in a straight line: it plans, and has no pool."""
    return executor.planning and executor.workers == 1


def record_stats(executor: Executor, prog: Program) -> None:
    """Counts a straight-line run in ``executor``'s statistics (its kernels: ops and vjps run)."""
    stats = RunStats(kernels=prog.kernels, straight=1)
    executor.last_stats = stats
    executor.stats.add(stats)


def paused(executor: Executor) -> AbstractContextManager[None]:
    """The executor's garbage-collector pause, for a straight-line run (as for its own runs)."""
    return gc_paused() if executor.pause_gc else nullcontext()
