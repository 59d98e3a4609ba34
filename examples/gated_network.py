"""A gated network, four ways: the dynamic-network example of the DeepLearning.scala 2 paper.

Two gates score the input; the network runs only the expert whose gate scores higher and scales its
output by that score. The choice depends on a value computed by the network itself, so the graph is
dynamic. The four versions compute the same function; they differ in when the gates run:

* ``eager``: predicts both scores first (two separate runs), chooses in Python, then builds the loss,
  whose training step evaluates the chosen gate once more: three gate evaluations per step.
* ``monadic``: ``gate0.forward.flat_map(...)`` chooses from the forward data inside the computation;
  the chosen gate's tape is the one the loss later uses, so each gate runs once per step. The
  nested ``flat_map`` is a sequencing point: gate1 starts only after gate0 has finished.
* ``applicative``: ``monadl.gather(gate0.forward, gate1.forward).flat_map(...)``: the two scores are
  independent, so the executor may compute them concurrently, then chooses.
* ``direct``: the same as ``applicative``, written as an ``async def`` that awaits
  ``monadl.parallel(gate0, gate1)``.

Each version takes the gate and expert layers as arguments, so a caller can wrap a gate (to count its
evaluations, as ``main`` does) without touching the network. Each is trained with SGD on a fresh
small batch of a fixed random function every step, and ``main`` prints its loss on held-out batches
before and after.

Run it: ``python examples/gated_network.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

import monadl
from monadl import Array, ArrayLayer, ArrayWeight, FloatLayer
from monadl.tape import Tape

Network = Callable[[FloatLayer, FloatLayer, ArrayLayer, ArrayLayer], ArrayLayer]
"""A version of the network: (gate0, gate1, expert0, expert1) -> output."""


def eager(gate0: FloatLayer, gate1: FloatLayer, expert0: ArrayLayer, expert1: ArrayLayer) -> ArrayLayer:
    s0 = gate0.predict_blocking().unwrap()  # a run of its own
    s1 = gate1.predict_blocking().unwrap()  # another one
    return expert0 * gate0 if s0 > s1 else expert1 * gate1  # the loss will run the chosen gate again


def monadic(gate0: FloatLayer, gate1: FloatLayer, expert0: ArrayLayer, expert1: ArrayLayer) -> ArrayLayer:
    def choose(t0: Tape[float, float], t1: Tape[float, float]) -> monadl.Do[Tape[Array, Array]]:
        chosen = expert0 * gate0 if t0.data > t1.data else expert1 * gate1
        return chosen.forward  # reuses the gate's tape evaluated above: same node, same run

    return ArrayLayer(gate0.forward.flat_map(lambda t0: gate1.forward.flat_map(lambda t1: choose(t0, t1))))


def applicative(gate0: FloatLayer, gate1: FloatLayer, expert0: ArrayLayer, expert1: ArrayLayer) -> ArrayLayer:
    def choose(tapes: tuple[Tape[float, float], Tape[float, float]]) -> monadl.Do[Tape[Array, Array]]:
        t0, t1 = tapes
        chosen = expert0 * gate0 if t0.data > t1.data else expert1 * gate1
        return chosen.forward

    return ArrayLayer(monadl.gather(gate0.forward, gate1.forward).flat_map(choose))


@monadl.direct
async def direct(
    gate0: FloatLayer, gate1: FloatLayer, expert0: ArrayLayer, expert1: ArrayLayer
) -> ArrayLayer:
    s0, s1 = await monadl.parallel(gate0, gate1)
    return expert0 * gate0 if s0 > s1 else expert1 * gate1


VERSIONS: dict[str, Network] = {
    "eager": eager,
    "monadic": monadic,
    "applicative": applicative,
    "direct": direct,
}


@dataclass
class Model:
    """The trainable weights: one vector per gate, one dense layer per expert."""

    gates: tuple[ArrayWeight, ArrayWeight]
    experts: tuple[tuple[ArrayWeight, ArrayWeight], tuple[ArrayWeight, ArrayWeight]]

    @staticmethod
    def new(inputs: int = 3, outputs: int = 2, seed: int = 0) -> Model:
        # float64 (not the default float32): the versions' losses are compared with one another and
        # with a NumPy reference to 1e-9 and closer, below float32's rounding.
        rng = np.random.default_rng(seed)
        f64 = np.float64
        g0, g1 = (ArrayWeight.normal([inputs], std=0.5, seed=rng, dtype=f64) for _ in range(2))
        e0, e1 = (
            (
                ArrayWeight.normal([inputs, outputs], seed=rng, dtype=f64),
                ArrayWeight.zeros([outputs], dtype=f64),
            )
            for _ in range(2)
        )
        return Model((g0, g1), (e0, e1))

    def gate(self, i: int, x: Array) -> FloatLayer:
        """Gate ``i``'s score for the batch ``x``: ``sigmoid(sum(x @ w))``."""
        return monadl.sigmoid(monadl.sum(monadl.matmul(x, self.gates[i])))

    def expert(self, i: int, x: Array) -> ArrayLayer:
        """Expert ``i``'s output for the batch ``x``: ``tanh(x @ w + b)``."""
        w, b = self.experts[i]
        return monadl.tanh(monadl.matmul(x, w) + b)


def square_loss(output: ArrayLayer, target: Array) -> FloatLayer:
    difference = output - target
    return monadl.mean(difference * difference)


class ForwardCounter:
    """Counts how often a layer's forward is evaluated."""

    def __init__(self) -> None:
        self.count = 0

    def wrap(self, layer: FloatLayer) -> FloatLayer:
        """``layer``, counted: ``map`` runs once each time a run evaluates this node."""

        def counted(tape: Tape[float, float]) -> Tape[float, float]:
            self.count += 1
            return tape

        return FloatLayer(layer.forward.map(counted))


HELD_OUT = 16
"""Batches of the held-out loss."""


def data(
    seed: int = 1, batch: int = 4, inputs: int = 3, outputs: int = 2, *, draw: int = 0, held_out: bool = False
) -> tuple[Array, Array]:
    """A small batch and its target, ``0.5 * tanh(x @ m)``: ``m`` is a random map fixed by ``seed``,
    the inputs ``x`` batch ``draw`` of the training batches (``held_out``: of the held-out ones)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch, inputs))
    mapping = rng.standard_normal((inputs, outputs))
    if draw or held_out:
        x = np.random.default_rng([seed, int(held_out), draw]).standard_normal((batch, inputs))
    return x, 0.5 * np.tanh(x @ mapping)


def held_out_loss(network: Network, model: Model) -> float:
    """The mean loss of ``network`` over the ``HELD_OUT`` held-out batches, never trained on."""
    batches = [data(draw=k, held_out=True) for k in range(HELD_OUT)]
    losses = [build_loss(network, model, x, target).predict_blocking().unwrap() for x, target in batches]
    return float(np.mean(losses))


def build_loss(
    network: Network,
    model: Model,
    x: Array,
    target: Array,
    wrap_gate: Callable[[int, FloatLayer], FloatLayer] = lambda i, gate: gate,
) -> FloatLayer:
    """The loss of ``network`` on ``x``; ``wrap_gate(i, gate)`` may replace gate ``i`` (to count it)."""
    gate0, gate1 = (wrap_gate(i, model.gate(i, x)) for i in range(2))
    return square_loss(network(gate0, gate1, model.expert(0, x), model.expert(1, x)), target)


def train_step(
    network: Network,
    model: Model,
    x: Array,
    target: Array,
    optimizer: monadl.Optimizer,
    wrap_gate: Callable[[int, FloatLayer], FloatLayer] = lambda i, gate: gate,
) -> float:
    """One training step. The loss is built anew: ``eager`` chooses while building it. (The other
    versions choose when it runs, so for them one loss built once could be trained again and again.)"""
    loss: float = build_loss(network, model, x, target, wrap_gate).train_blocking(optimizer).unwrap()
    return loss


class Trained(NamedTuple):
    """A version's training: its losses, how often each gate ran, and its held-out loss before and
    after."""

    losses: list[float]
    gate_runs: tuple[int, int]
    held_out: tuple[float, float]


def train_version(network: Network, steps: int) -> Trained:
    """Trains ``network`` from fresh weights, one training batch a step."""
    model = Model.new()
    before = held_out_loss(network, model)
    optimizer = monadl.SGD(learning_rate=0.5)
    counters = (ForwardCounter(), ForwardCounter())
    losses = [
        train_step(network, model, *data(draw=step), optimizer, lambda i, gate: counters[i].wrap(gate))
        for step in range(steps)
    ]
    return Trained(losses, (counters[0].count, counters[1].count), (before, held_out_loss(network, model)))


def main(steps: int = 100) -> dict[str, list[float]]:
    """Trains each version from the same initial weights; prints, side by side, the held-out loss
    before and after training and the training loss along the way."""
    results = {name: train_version(network, steps) for name, network in VERSIONS.items()}

    def row(label: str, values: list[float]) -> None:
        print(f"{label:<20}" + "".join(f"{value:13.6f}" for value in values))

    print(f"{'':<20}" + "".join(f"{name:>13}" for name in results))
    row("held-out, before", [r.held_out[0] for r in results.values()])
    for step in [*range(0, steps - 1, max(steps // 5, 1)), steps - 1]:
        row(f"training, step {step}", [r.losses[step] for r in results.values()])
    row("held-out, after", [r.held_out[1] for r in results.values()])
    print(f"(held-out: the mean loss over {HELD_OUT} batches never trained on)")
    print("gate forward evaluations per step:")
    for name, r in results.items():
        n0, n1 = r.gate_runs
        print(f"  {name:12} {(n0 + n1) / steps:g}  (gate0 {n0 / steps:.3g}, gate1 {n1 / steps:.3g})")
    return {name: r.losses for name, r in results.items()}


if __name__ == "__main__":
    main()
