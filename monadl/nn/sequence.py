"""Recurrent layers over whole sequences: :class:`LSTM` and :class:`GRU`, uni- or bidirectional and
stacked, over a list of sequences of any lengths (DyNet's ``transduce``, PyTorch's ``nn.LSTM`` and
``nn.GRU`` over a packed batch).

There is no padding and no mask. Each sequence is a list of steps, each anything an op takes of
shape (inputs,) (an array, a weight, a layer: an embedding lookup), or a 2-D array (length, inputs)
of data whose rows are the steps. Layer ``k + 1`` reads, at each step, layer ``k``'s outputs of
both directions concatenated, forward first.

Each layer, both directions and every sequence, runs as one op (as PyTorch's ``nn.LSTM`` and
``nn.GRU`` over a packed batch): :func:`~monadl.dsl.ops.packed_lstm.packed_lstm` or
:func:`~monadl.dsl.ops.packed_gru.packed_gru`, the cells' arithmetic on stacked rows, one time step
after another, with a hand-written backward pass. The cells hold the weights (their names and
checkpoints are the cells'). A layer's steps' outputs are one lookup each in its result, and those
lookups merge under dynamic batching. Give a layer all the sequences of a batch in one call:
separate calls of it are separate ops, which do not merge. (A model that calls a cell itself, one
step at a time, has its calls merged by dynamic batching instead: the cells are batchable
operations.)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import numpy as np

from monadl.dsl.core.layers import AnyArray, ArrayLayer
from monadl.dsl.core.weights import ArrayWeight
from monadl.dsl.ops.packed_gru import packed_gru
from monadl.dsl.ops.packed_lstm import packed_lstm
from monadl.dsl.ops.selection import take_rows
from monadl.dsl.ops.shape import stack
from monadl.nn.gru import GRUCell
from monadl.nn.init import Initializer
from monadl.nn.linear import Seed, generator, positive
from monadl.nn.lstm import LSTMCell
from monadl.nn.module import Module
from monadl.typeclasses.backend import Array, check_float_array, is_array

S = TypeVar("S")  # a cell's state: (h, c) for an LSTM, h for a GRU
C = TypeVar("C", LSTMCell, GRUCell)

Steps = Sequence[AnyArray] | Array
"""One sequence: a list of steps of shape (inputs,), or a 2-D array (length, inputs) of data (a
NumPy array, or another namespace's: their types are no NumPy array's, and are taken at run time)."""

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


def _steps(name: str, inputs: int, index: int, sequence: object) -> list[AnyArray]:
    """The steps of ``sequence`` (a :data:`Steps`, checked here for untyped callers), checked where
    their shapes are known (arrays and weights)."""
    shape = None if isinstance(sequence, ArrayLayer) else getattr(sequence, "shape", None)
    if shape is not None:
        if len(shape) != 2 or shape[1] != inputs:
            raise ValueError(
                f"{name}: sequence {index} is an array of shape {tuple(shape)}, "
                f"not (length, {inputs}) (a list of sequences takes [array] for one)"
            )
        _floats(f"{name}: sequence {index}", sequence)
        # ``[t, ...]``: the array API's index names every axis (array-api-strict refuses ``[t]``)
        rows: Any = sequence
        steps: list[AnyArray] = [rows[t, ...] for t in range(int(shape[0]))]
        if steps:
            return steps
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
        _floats(f"{name}: step {t} of sequence {index}", data)
    return steps


def _floats(where: str, data: object) -> None:
    """A TypeError naming the layer (``where``) for an array of integers or booleans, which the
    layer's first op (``stack``) would report under its own name."""
    if type(data) is np.ndarray:
        if data.dtype.kind != "f":
            check_float_array(data, where)
    elif is_array(data):
        check_float_array(data, where)


def _sequences(name: str, inputs: int, sequences: object) -> list[list[AnyArray]]:
    """The steps of every sequence of ``sequences``, checked."""
    if isinstance(sequences, (str, bytes)) or not isinstance(sequences, (list, tuple)):
        what = (
            f"an array of shape {tuple(sequences.shape)}"
            if hasattr(sequences, "shape")
            else (type(sequences).__name__)
        )
        raise TypeError(f"{name}: takes a list of sequences, got {what} (pass [x] for one sequence)")
    return [_steps(name, inputs, s, sequence) for s, sequence in enumerate(sequences)]


def _packed(
    name: str,
    forward: Sequence[C],
    backward: Sequence[C],
    sequences: Sequence[Steps],
    layer_op: Callable[..., ArrayLayer],
    state: Callable[[ArrayLayer, int, int, slice], S],
) -> SequenceOutput[S]:
    """Every layer of cells over every sequence, each layer (both directions) one ``layer_op``
    (``packed_lstm`` or ``packed_gru``) on the cells' weights; ``state(out, at, final, part)``: a
    direction's final state in the layer's result ``out``, from its output at row ``at`` (and for an
    LSTM, its memories at row ``final``), the direction's columns ``part``."""
    steps = _sequences(name, forward[0].inputs, sequences)
    if not steps:
        return SequenceOutput([], [])
    lengths = tuple(len(s) for s in steps)
    starts = [sum(lengths[:s]) for s in range(len(lengths))]
    total = sum(lengths)
    x: AnyArray = stack([step for s in steps for step in s])
    hidden = forward[0].hidden
    states: list[list[S]] = [[] for _ in lengths]
    out = x
    for layer in range(len(forward)):
        cells = [forward[layer], backward[layer]] if backward else [forward[layer]]
        out = layer_op(x, lengths, *[w for cell in cells for w in _cell_weights(cell)])
        for s, (start, n) in enumerate(zip(starts, lengths, strict=True)):
            for d, at in enumerate([start + n - 1, start][: len(cells)]):
                states[s].append(state(out, at, total + s, slice(d * hidden, (d + 1) * hidden)))
        x = out[:total] if isinstance(cells[0], LSTMCell) else out  # (an LSTM's final memories after)
    outputs = [
        [take_rows(out, start + t) for t in range(n)] for start, n in zip(starts, lengths, strict=True)
    ]
    return SequenceOutput(outputs, states)


def _cell_weights(cell: LSTMCell | GRUCell) -> list[ArrayWeight]:
    """A cell's gates' weights, then their biases: an LSTM's in the order i, f, o, u, a GRU's r, z,
    n_x, n_h."""
    gates = (
        (cell.i, cell.f, cell.o, cell.u)
        if isinstance(cell, LSTMCell)
        else (cell.r, cell.z, cell.n_x, cell.n_h)
    )
    return [gate.w for gate in gates] + [gate.b for gate in gates if gate.b is not None]


def _lstm_state(out: ArrayLayer, at: int, final: int, part: slice) -> LSTMState:
    return out[at, part], out[final, part]


def _gru_state(out: ArrayLayer, at: int, final: int, part: slice) -> ArrayLayer:
    return out[at, part]


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
    inputs, hidden = positive(f"{name}.new", "inputs", inputs), positive(f"{name}.new", "hidden", hidden)
    rng = generator(seed, f"{name}.new")
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
        return _packed("LSTM", self.forward_cells, self.backward_cells, sequences, packed_lstm, _lstm_state)


@dataclass(frozen=True, eq=False)
class GRU(_Stacked[GRUCell]):
    """A stacked, optionally bidirectional GRU over a list of sequences of any lengths (see the
    module): ``gru(sequences)`` is a :class:`SequenceOutput` of states ``h``. Its cells are
    :class:`GRUCell` s, laid out as :class:`LSTM`'s, each layer one op as an LSTM's."""

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
        return _packed("GRU", self.forward_cells, self.backward_cells, sequences, packed_gru, _gru_state)
