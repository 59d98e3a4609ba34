"""The LSTM cell (Hochreiter and Schmidhuber, 1997, with a forget gate): :class:`LSTMCell`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from monadl.dsl.core.layers import AnyArray, ArrayLayer
from monadl.dsl.core.weights import ArrayWeight
from monadl.dsl.extend.operation import batchable
from monadl.dsl.ops.elementwise import lift_array
from monadl.dsl.ops.recurrent import lstm_c, lstm_h
from monadl.dsl.ops.shape import concatenate
from monadl.nn.init import Initializer
from monadl.nn.linear import Linear, Seed, generator, positive
from monadl.nn.module import Module
from monadl.typeclasses.backend import Array, namespace, on_device


@dataclass(frozen=True, eq=False)
class LSTMCell(Module):
    """One step of an LSTM: from an input ``x`` (inputs,) and the state ``(h, c)`` (hidden,) each,
    the next state ``(h', c')``. Each gate is a :class:`Linear` of ``[x; h]``, shape
    (inputs + hidden, hidden), the input's rows first::

        i = sigmoid(W_i [x; h] + b_i)       input gate
        f = sigmoid(W_f [x; h] + b_f)       forget gate
        o = sigmoid(W_o [x; h] + b_o)       output gate
        u = tanh(W_u [x; h] + b_u)          candidate memory
        c' = i * u + f * c                  h' = o * tanh(c')

    The initial state is zeros (:meth:`zeros_state`). A call is a batchable operation: the calls of
    one step across a batch of sequences merge into one run on stacked rows (a call may also take
    rows itself: ``x`` (n, inputs), ``h`` and ``c`` (n, hidden)).
    """

    i: Linear
    f: Linear
    o: Linear
    u: Linear

    def __post_init__(self) -> None:
        shapes = {(gate.inputs, gate.outputs) for gate in (self.i, self.f, self.o, self.u)}
        if len(shapes) != 1 or any(gate.b is None for gate in (self.i, self.f, self.o, self.u)):
            raise ValueError(f"LSTMCell: the four gates need one shape and a bias each, got {shapes}")

    @classmethod
    def new(
        cls,
        inputs: int,
        hidden: int,
        *,
        seed: Seed = 0,
        dtype: type[np.floating[Any]] = np.float32,
        init: Initializer | None = None,
        xp: Any = np,
        device: Any = None,
    ) -> LSTMCell:
        """Gates drawn by :meth:`Linear.new` in the order i, f, o, u (by ``init`` if given, each
        gate's (inputs + hidden, hidden) matrix), zero biases but the forget gate's, 1.0: the cell
        keeps its memory at first, which helps gradients flow through long sequences (Gers et al.
        2000; Jozefowicz et al. 2015). ``xp`` and ``device`` as :meth:`Linear.new`'s."""
        inputs, hidden = (
            positive("LSTMCell.new", "inputs", inputs),
            positive("LSTMCell.new", "hidden", hidden),
        )
        rng = generator(seed, "LSTMCell.new")
        shared: dict[str, Any] = {"seed": rng, "dtype": dtype, "init": init, "xp": xp, "device": device}
        # The forget gate gets no zero bias: it would be replaced by ones.
        i, f, o, u = (Linear.new(inputs + hidden, hidden, bias=gate != 1, **shared) for gate in range(4))
        f = Linear(f.w, ArrayWeight(np.ones((hidden,), dtype=dtype), xp=xp, device=device))
        return cls(i, f, o, u)

    @property
    def inputs(self) -> int:
        return self.i.inputs - self.hidden

    @property
    def hidden(self) -> int:
        return self.i.outputs

    def zeros_state(self, rows: int | None = None) -> tuple[ArrayLayer, ArrayLayer]:
        """The initial state ``(h, c)``: zeros of shape (hidden,), or (rows, hidden), of the weights'
        dtype and array type."""
        w = self.i.w.data
        if rows is not None and (isinstance(rows, bool) or not isinstance(rows, int) or rows < 0):
            raise ValueError(
                f"{type(self).__name__}.zeros_state: rows must be an int of 0 or more, got {rows!r}"
            )
        shape = (self.hidden,) if rows is None else (rows, self.hidden)
        xp = namespace(w)
        zeros: Array = xp.zeros(shape, dtype=w.dtype, **on_device(xp, w))
        return lift_array(zeros), lift_array(zeros)

    @batchable
    def __call__(self, x: AnyArray, h: AnyArray, c: AnyArray) -> tuple[ArrayLayer, ArrayLayer]:
        """The next state ``(h', c')``."""
        xh = concatenate([x, h], axis=-1)  # [x; h], shared by the four gates (axis -1: rows merge)
        # the gates' activations and products fused: 2 kernels forward, 6 vjps (monadl.dsl.ops.recurrent)
        c_next = lstm_c(self.i(xh), self.f(xh), self.u(xh), c)
        return lstm_h(self.o(xh), c_next), c_next
