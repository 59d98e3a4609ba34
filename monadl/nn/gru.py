"""The gated recurrent unit (Cho et al., 2014): :class:`GRUCell`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from monadl.dsl.core.layers import AnyArray, ArrayLayer
from monadl.dsl.extend.operation import batchable
from monadl.dsl.ops.elementwise import lift_array
from monadl.dsl.ops.recurrent import gru_h
from monadl.dsl.ops.shape import concatenate
from monadl.nn.init import Initializer
from monadl.nn.linear import Linear, Seed, generator, positive
from monadl.nn.module import Module
from monadl.typeclasses.backend import Array, namespace, on_device


@dataclass(frozen=True, eq=False)
class GRUCell(Module):
    """One step of a GRU: from an input ``x`` (inputs,) and the state ``h`` (hidden,), the next
    state ``h'``. The equations are PyTorch's ``nn.GRUCell``'s (the reset gate ``r`` applies to the
    hidden part of the candidate after its matrix product)::

        r  = sigmoid(W_r [x; h] + b_r)                      reset gate
        z  = sigmoid(W_z [x; h] + b_z)                      update gate
        n  = tanh(W_nx x + b_nx + r * (W_nh h + b_nh))      candidate
        h' = (1 - z) * n + z * h

    ``W_r`` and ``W_z`` are PyTorch's ``W_ir``, ``W_hr`` (and ``W_iz``, ``W_hz``) stacked into one
    (inputs + hidden, hidden) matrix, the input's rows first, and ``b_r`` is its ``b_ir + b_hr`` (one
    bias: the same function). The initial state is zeros (:meth:`zeros_state`). A call is a
    batchable operation: the calls of one step across a batch of sequences merge.
    """

    r: Linear  # (inputs + hidden, hidden)
    z: Linear  # (inputs + hidden, hidden)
    n_x: Linear  # (inputs, hidden)
    n_h: Linear  # (hidden, hidden)

    def __post_init__(self) -> None:
        hidden = self.n_h.outputs
        expected = [
            (self.n_x.inputs + hidden, hidden),
            (self.n_x.inputs + hidden, hidden),
            (self.n_x.inputs, hidden),
            (hidden, hidden),
        ]
        gates = (self.r, self.z, self.n_x, self.n_h)
        shapes = [(gate.inputs, gate.outputs) for gate in gates]
        if shapes != expected or any(gate.b is None for gate in gates):
            raise ValueError(
                f"GRUCell: r, z, n_x, n_h need shapes {expected} and a bias each, got shapes {shapes}"
            )

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
    ) -> GRUCell:
        """Gates drawn by :meth:`Linear.new` in the order r, z, n_x, n_h (by ``init`` if given);
        zero biases. ``xp`` and ``device`` as :meth:`Linear.new`'s."""
        inputs, hidden = positive("GRUCell.new", "inputs", inputs), positive("GRUCell.new", "hidden", hidden)
        rng = generator(seed, "GRUCell.new")
        shared: dict[str, Any] = {"seed": rng, "dtype": dtype, "init": init, "xp": xp, "device": device}
        r, z = (Linear.new(inputs + hidden, hidden, **shared) for _ in range(2))
        n_x = Linear.new(inputs, hidden, **shared)
        n_h = Linear.new(hidden, hidden, **shared)
        return cls(r, z, n_x, n_h)

    @property
    def inputs(self) -> int:
        return self.n_x.inputs

    @property
    def hidden(self) -> int:
        return self.n_h.outputs

    def zeros_state(self, rows: int | None = None) -> ArrayLayer:
        """The initial state ``h``: zeros of shape (hidden,), or (rows, hidden), of the weights'
        dtype and array type."""
        w = self.n_h.w.data
        if rows is not None and (isinstance(rows, bool) or not isinstance(rows, int) or rows < 0):
            raise ValueError(
                f"{type(self).__name__}.zeros_state: rows must be an int of 0 or more, got {rows!r}"
            )
        shape = (self.hidden,) if rows is None else (rows, self.hidden)
        xp = namespace(w)
        zeros: Array = xp.zeros(shape, dtype=w.dtype, **on_device(xp, w))
        return lift_array(zeros)

    @batchable
    def __call__(self, x: AnyArray, h: AnyArray) -> ArrayLayer:
        """The next state ``h'``."""
        xh = concatenate([x, h], axis=-1)  # axis -1: merged calls' rows stay apart
        # the gates' activations and the blend fused: 1 kernel forward, 5 vjps (monadl.dsl.ops.recurrent)
        return gru_h(self.r(xh), self.z(xh), self.n_x(x), self.n_h(h), h)
