"""Recurrent layers over whole sequences: :class:`LSTM` and :class:`GRU`, uni- or bidirectional and
stacked, over a list of sequences of any lengths (DyNet's ``transduce``, PyTorch's ``nn.LSTM`` and
``nn.GRU`` over a packed batch).

There is no padding and no mask. Each sequence is a list of steps, each anything an op takes of
shape (inputs,) (an array, a weight, a layer: an embedding lookup), or a 2-D array (length, inputs)
of data whose rows are the steps. Layer ``k + 1`` reads, at each step, layer ``k``'s outputs of
both directions concatenated, forward first.

An :class:`LSTM` runs each layer, both directions and every sequence, as one op
(:func:`~monadl.dsl.packed_lstm.packed_lstm`, as PyTorch's ``nn.LSTM`` over a packed batch): its
cells' arithmetic on stacked rows, one time step after another, with a hand-written backward
pass. Its steps' outputs are one lookup each in the layer's result, and those lookups merge under
dynamic batching. A :class:`GRU` calls its cells once per step of every sequence and direction:
the cells' calls are batchable operations, so dynamic batching merges the calls of one step across
the sequences (a short sequence simply stops taking part), and the elementwise work of the two
directions, which have the same number of calls at each step, merges too.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import numpy as np

from monadl.dsl.layers import AnyArray, ArrayLayer
from monadl.dsl.ops import concatenate, stack, take_rows
from monadl.dsl.packed_lstm import packed_lstm
from monadl.dsl.weights import ArrayWeight
from monadl.nn.gru import GRUCell
from monadl.nn.init import Initializer
from monadl.nn.linear import Seed, generator
from monadl.nn.lstm import LSTMCell
from monadl.nn.module import Module

S = TypeVar("S")  # a cell's state: (h, c) for an LSTM, h for a GRU
C = TypeVar("C", LSTMCell, GRUCell)

Steps = Sequence[AnyArray] | Any
"""One sequence: a list of steps of shape (inputs,), or a 2-D array (length, inputs) of data."""

LSTMState = tuple[ArrayLayer, ArrayLayer]
"""An LSTM's state ``(h, c)``, each (hidden,)."""


@dataclass(frozen=True)
class SequenceOutput(Generic[S]):
    """What a sequence layer gives for a list of sequences, in their order.

    ``outputs[s][t]``: the last layer's output at step ``t`` of sequence ``s``, shape (hidden,), or
    (2 hidden,) if bidirectional (the forward direction's ``h``, then the backward's). ``states[s]``:
    the final state of each layer and direction, at index ``layer * directions + direction`` (the
    order of PyTorch's ``h_n``); the forward direction's after the last step, the backward's after
    the first. A state is ``(h, c)`` for an :class:`LSTM`, ``h`` for a :class:`GRU`.
    """

    outputs: list[list[ArrayLayer]]
    states: list[list[S]]


def _cells_check(name: str, forward: Sequence[Any], backward: Sequence[Any]) -> None:
    if not forward:
        raise ValueError(f"{name}: needs one layer at least, got no forward cells")
    if backward and len(backward) != len(forward):
        raise ValueError(
            f"{name}: needs as many backward cells as forward ones (or none), "
            f"got {len(forward)} forward and {len(backward)} backward"
        )
    hidden = forward[0].hidden
    for layer, cells in enumerate(zip(forward, backward or forward, strict=True)):
        inputs = forward[0].inputs if layer == 0 else (2 if backward else 1) * hidden
        for cell in cells:
            if (cell.inputs, cell.hidden) != (inputs, hidden):
                raise ValueError(
                    f"{name}: layer {layer}'s cells need (inputs, hidden) ({inputs}, {hidden}), "
                    f"got ({cell.inputs}, {cell.hidden})"
                )


def _steps(name: str, inputs: int, index: int, sequence: Steps) -> list[AnyArray]:
    """The steps of ``sequence``, checked where their shapes are known (arrays and weights)."""
    shape = None if isinstance(sequence, ArrayLayer) else getattr(sequence, "shape", None)
    if shape is not None:
        if len(shape) != 2 or shape[1] != inputs:
            raise ValueError(
                f"{name}: sequence {index} is an array of shape {tuple(shape)}, "
                f"not (length, {inputs}) (a list of sequences takes [array] for one)"
            )
        # ``[t, ...]``: the array API's index names every axis (array-api-strict refuses ``[t]``)
        rows: Any = sequence
        steps: list[AnyArray] = [rows[t, ...] for t in range(int(shape[0]))]
    elif isinstance(sequence, (list, tuple)):
        steps = list(sequence)
    else:
        raise TypeError(
            f"{name}: sequence {index} must be a list of steps or a 2-D array (length, {inputs}), "
            f"got {type(sequence).__name__}"
        )
    if not steps:
        raise ValueError(f"{name}: sequence {index} is empty (every sequence needs one step at least)")
    for t, step in enumerate(steps):
        if isinstance(step, ArrayLayer):
            continue  # (its static shape would be worked out for nothing: the cell's call checks it)
        data = step.data if isinstance(step, ArrayWeight) else step
        step_shape = getattr(data, "shape", None)
        if step_shape is not None and tuple(step_shape) != (inputs,):
            raise ValueError(
                f"{name}: step {t} of sequence {index} has shape {tuple(step_shape)}, not ({inputs},)"
            )
    return steps


def _sequences(name: str, inputs: int, sequences: Sequence[Steps]) -> list[list[AnyArray]]:
    """The steps of every sequence of ``sequences``, checked."""
    if isinstance(sequences, (str, bytes)) or not isinstance(sequences, (list, tuple)):
        what = (
            f"an array of shape {tuple(sequences.shape)}"
            if hasattr(sequences, "shape")
            else (type(sequences).__name__)
        )
        raise TypeError(f"{name}: takes a list of sequences, got {what} (pass [x] for one sequence)")
    return [_steps(name, inputs, s, sequence) for s, sequence in enumerate(sequences)]


def _transduce(
    name: str,
    forward: Sequence[C],
    backward: Sequence[C],
    sequences: Sequence[Steps],
    step: Callable[[C, AnyArray, S], tuple[ArrayLayer, S]],
    zeros: Callable[[C], S],
) -> SequenceOutput[S]:
    """Every layer and direction of cells over every sequence (see the module)."""
    xs: list[Sequence[AnyArray]] = list(_sequences(name, forward[0].inputs, sequences))
    directions = [forward, backward] if backward else [forward]
    states: list[list[S]] = [[] for _ in sequences]
    outputs: list[list[ArrayLayer]] = []
    for layer in range(len(forward)):
        runs: list[list[list[ArrayLayer]]] = []  # per direction, per sequence, per step
        for d, cells in enumerate(directions):
            cell = cells[layer]
            initial = zeros(cell)  # one zero state per cell, shared by the sequences
            run = []
            for s, steps in enumerate(xs):
                state = initial
                hs = []
                for x in steps if d == 0 else reversed(steps):
                    h, state = step(cell, x, state)
                    hs.append(h)
                run.append(hs if d == 0 else hs[::-1])
                states[s].append(state)
            runs.append(run)
        if len(runs) == 1:
            outputs = runs[0]
        else:
            outputs = [
                [concatenate([f, b]) for f, b in zip(fs, bs, strict=True)]
                for fs, bs in zip(runs[0], runs[1], strict=True)
            ]
        xs = list[Sequence[AnyArray]](outputs)
    return SequenceOutput(outputs, states)


def _packed(
    forward: Sequence[LSTMCell], backward: Sequence[LSTMCell], sequences: Sequence[Steps]
) -> SequenceOutput[LSTMState]:
    """Every layer of an LSTM over every sequence, each layer (both directions) one
    :func:`~monadl.dsl.packed_lstm.packed_lstm` op."""
    steps = _sequences("LSTM", forward[0].inputs, sequences)
    if not steps:
        return SequenceOutput([], [])
    lengths = tuple(len(s) for s in steps)
    starts = [sum(lengths[:s]) for s in range(len(lengths))]
    total = sum(lengths)
    x: AnyArray = stack([step for s in steps for step in s])
    hidden = forward[0].hidden
    states: list[list[LSTMState]] = [[] for _ in lengths]
    out = x
    for layer in range(len(forward)):
        cells = [forward[layer], backward[layer]] if backward else [forward[layer]]
        out = packed_lstm(x, lengths, *_lstm_weights(cells))
        for s, (start, n) in enumerate(zip(starts, lengths, strict=True)):
            for d, at in enumerate([start + n - 1, start][: len(cells)]):
                part = slice(d * hidden, (d + 1) * hidden)
                states[s].append((out[at, part], out[total + s, part]))
        x = out[:total]
    outputs = [
        [take_rows(out, start + t) for t in range(n)] for start, n in zip(starts, lengths, strict=True)
    ]
    return SequenceOutput(outputs, states)


def _lstm_weights(cells: Sequence[LSTMCell]) -> list[ArrayWeight]:
    """Each cell's gates' weights, then their biases, in the order i, f, o, u."""
    weights: list[ArrayWeight] = []
    for cell in cells:
        gates = (cell.i, cell.f, cell.o, cell.u)
        weights += [gate.w for gate in gates]
        weights += [gate.b for gate in gates if gate.b is not None]
    return weights


def _lstm_step(cell: LSTMCell, x: AnyArray, state: LSTMState) -> tuple[ArrayLayer, LSTMState]:
    h, c = cell(x, *state)
    return h, (h, c)


def _gru_step(cell: GRUCell, x: AnyArray, state: ArrayLayer) -> tuple[ArrayLayer, ArrayLayer]:
    h = cell(x, state)
    return h, h


def _directions(bidirectional: bool) -> int:
    return 2 if bidirectional else 1


def _stack(
    name: str,
    cell: type[C],
    inputs: int,
    hidden: int,
    layers: int,
    bidirectional: bool,
    seed: Seed,
    dtype: type[np.floating[Any]],
    init: Initializer | None,
    xp: Any,
    device: Any,
) -> tuple[list[C], list[C]]:
    """The forward and backward cells of a ``name.new``, drawn by ``cell.new`` from one generator,
    layer by layer, the forward cell before the backward one."""
    if layers < 1:
        raise ValueError(f"{name}.new: layers must be 1 or more, got {layers}")
    rng = generator(seed)
    forward: list[C] = []
    backward: list[C] = []
    for layer in range(layers):
        n = inputs if layer == 0 else _directions(bidirectional) * hidden
        forward.append(cell.new(n, hidden, seed=rng, dtype=dtype, init=init, xp=xp, device=device))
        if bidirectional:
            backward.append(cell.new(n, hidden, seed=rng, dtype=dtype, init=init, xp=xp, device=device))
    return forward, backward


class _Stacked(Module, Generic[C]):
    """What :class:`LSTM` and :class:`GRU` share: the sizes their cells give. Each declares the
    fields itself, so that its signature names its own cell type."""

    forward_cells: list[C]
    backward_cells: list[C]

    @property
    def inputs(self) -> int:
        return self.forward_cells[0].inputs

    @property
    def hidden(self) -> int:
        return self.forward_cells[0].hidden

    @property
    def layers(self) -> int:
        return len(self.forward_cells)

    @property
    def bidirectional(self) -> bool:
        return bool(self.backward_cells)


@dataclass(frozen=True, eq=False)
class LSTM(_Stacked[LSTMCell]):
    """A stacked, optionally bidirectional LSTM over a list of sequences of any lengths (see the
    module): ``lstm(sequences)`` is a :class:`SequenceOutput` of states ``(h, c)``. Layer ``k`` of
    the forward direction is ``forward_cells[k]``, of the backward one ``backward_cells[k]`` (no
    backward cells: unidirectional); each an :class:`LSTMCell` from zeros. Each layer runs as one
    op over the whole batch (see the module): the cells' values and gradients, but for the order of
    the sums."""

    forward_cells: list[LSTMCell]
    backward_cells: list[LSTMCell]

    def __post_init__(self) -> None:
        _cells_check("LSTM", self.forward_cells, self.backward_cells)

    @classmethod
    def new(
        cls,
        inputs: int,
        hidden: int,
        *,
        layers: int = 1,
        bidirectional: bool = False,
        seed: Seed = 0,
        dtype: type[np.floating[Any]] = np.float32,
        init: Initializer | None = None,
        xp: Any = np,
        device: Any = None,
    ) -> LSTM:
        """Cells drawn by :meth:`LSTMCell.new` from one generator, layer by layer, the forward
        cell before the backward one (``xp`` and ``device`` as :meth:`~monadl.nn.Linear.new`'s)."""
        forward, backward = _stack(
            "LSTM", LSTMCell, inputs, hidden, layers, bidirectional, seed, dtype, init, xp, device
        )
        return cls(forward, backward)

    def __call__(self, sequences: Sequence[Steps]) -> SequenceOutput[LSTMState]:
        """Every step's output and the final states of ``sequences`` (see :class:`SequenceOutput`)."""
        return _packed(self.forward_cells, self.backward_cells, sequences)


@dataclass(frozen=True, eq=False)
class GRU(_Stacked[GRUCell]):
    """A stacked, optionally bidirectional GRU over a list of sequences of any lengths (see the
    module): ``gru(sequences)`` is a :class:`SequenceOutput` of states ``h``. Its cells are
    :class:`GRUCell` s, laid out as :class:`LSTM`'s."""

    forward_cells: list[GRUCell]
    backward_cells: list[GRUCell]

    def __post_init__(self) -> None:
        _cells_check("GRU", self.forward_cells, self.backward_cells)

    @classmethod
    def new(
        cls,
        inputs: int,
        hidden: int,
        *,
        layers: int = 1,
        bidirectional: bool = False,
        seed: Seed = 0,
        dtype: type[np.floating[Any]] = np.float32,
        init: Initializer | None = None,
        xp: Any = np,
        device: Any = None,
    ) -> GRU:
        """Cells drawn by :meth:`GRUCell.new` from one generator, as :meth:`LSTM.new` draws."""
        forward, backward = _stack(
            "GRU", GRUCell, inputs, hidden, layers, bidirectional, seed, dtype, init, xp, device
        )
        return cls(forward, backward)

    def __call__(self, sequences: Sequence[Steps]) -> SequenceOutput[ArrayLayer]:
        """Every step's output and the final states of ``sequences`` (see :class:`SequenceOutput`)."""
        return _transduce(
            "GRU",
            self.forward_cells,
            self.backward_cells,
            sequences,
            _gru_step,
            GRUCell.zeros_state,
        )
