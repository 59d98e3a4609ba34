"""A whole GRU layer over a batch of sequences as one op: :func:`packed_gru`, the op under
:class:`monadl.nn.GRU` (see :mod:`monadl.dsl.ops.packed_lstm`, whose scheme it follows: the batch
packed by time step, every step's input projection in one product, one product by the hidden
weights per step for both directions, and the same loop in reverse for the deltas).

Its operands are the inputs ``x`` (every sequence's steps, one after another: (N, inputs)) and, per
direction, a :class:`~monadl.nn.GRUCell`'s weights ``r``, ``z`` (each (inputs + hidden, hidden), the
input's rows first), ``n_x`` (inputs, hidden) and ``n_h`` (hidden, hidden), then their biases in
the same order. Its result is every step's output, (N, D * hidden) (each direction's ``h``, the
forward one's first); a sequence's final state is its last step's output in the forward direction
and its first step's in the backward one. The values are the cells': the same arithmetic, summed in
another order.
"""

from __future__ import annotations

from typing import Any, Final

from monadl.dsl.core.layers import AnyArray, ArrayLayer
from monadl.dsl.ops.activations import sigmoid_of
from monadl.dsl.ops.packing import (
    PER_DIRECTION,
    apply_layer,
    check_steps,
    layer_op,
    packed_deltas,
    packed_rows,
    packing,
    previous_steps,
    unpacked_rows,
)
from monadl.dsl.ops.shape_rules import Info, promoted
from monadl.typeclasses.backend import ShapeError, shape_of

__all__ = ["packed_gru"]


def _joined(xp: Any, weights: tuple[Any, ...], inputs: int, directions: int) -> tuple[Any, ...]:
    """Each direction's gates joined (the reset, update and candidate parts side by side): ``W_x``
    (D, inputs, 3 hidden), ``W_h`` (D, hidden, 3 hidden), the input side's biases (D, 1, 3 hidden)
    and the candidate's hidden bias (D, 1, hidden)."""
    wx, wh, bx, bh = [], [], [], []
    for d in range(directions):
        r, z, n_x, n_h, b_r, b_z, b_nx, b_nh = weights[PER_DIRECTION * d : PER_DIRECTION * (d + 1)]
        wx.append(xp.concat([r[:inputs, :], z[:inputs, :], n_x], axis=1))
        wh.append(xp.concat([r[inputs:, :], z[inputs:, :], n_h], axis=1))
        bx.append(xp.reshape(xp.concat([b_r, b_z, b_nx], axis=0), (1, -1)))
        bh.append(xp.reshape(b_nh, (1, -1)))
    return xp.stack(wx), xp.stack(wh), xp.stack(bx), xp.stack(bh)


def _forward(xp: Any, x: Any, *weights: Any, lengths: tuple[int, ...]) -> tuple[Any, tuple[Any, ...]]:
    directions = len(weights) // PER_DIRECTION
    layout = packing(lengths)
    w_x, w_h, b_x, b_nh = _joined(xp, weights, x.shape[1], directions)
    hidden = w_h.shape[1]
    xs = packed_rows(xp, x, layout, directions)  # (D, N, inputs)
    pre = xp.matmul(xs, w_x) + b_x  # every step's input side: (D, N, 3 hidden)
    hs: list[Any] = []
    acts: list[tuple[Any, Any, Any]] = []
    h = None
    for t, n in enumerate(layout.batch):
        g = pre[:, layout.offsets[t] : layout.offsets[t] + n, :]
        if h is None:  # h = 0: its products are 0, the candidate's hidden side is its bias
            rz = sigmoid_of(xp, g[..., : 2 * hidden])
            n_h = b_nh + xp.zeros_like(rz[..., :hidden])
        else:
            gh = xp.matmul(h[:, :n, :], w_h)
            rz = sigmoid_of(xp, g[..., : 2 * hidden] + gh[..., : 2 * hidden])
            n_h = gh[..., 2 * hidden :] + b_nh
        candidate = xp.tanh(g[..., 2 * hidden :] + rz[..., :hidden] * n_h)
        z = rz[..., hidden:]
        h = (1.0 - z) * candidate if h is None else (1.0 - z) * candidate + z * h[:, :n, :]
        hs.append(h)
        acts.append((rz, n_h, candidate))
    h_all = xp.concat(hs, axis=1)  # (D, N, hidden), packed
    return unpacked_rows(xp, h_all, layout, False), (xs, w_x, w_h, h_all, acts)


def _deltas(
    xp: Any, d: Any, saved: tuple[Any, ...], x: Any, *weights: Any, lengths: tuple[int, ...]
) -> list[Any]:
    """Every operand's delta (backpropagation through time)."""
    xs, w_x, w_h, h_all, acts = saved
    directions = xs.shape[0]
    hidden = w_h.shape[1]
    layout = packing(lengths)
    dh_out = packed_deltas(xp, d, layout, directions, hidden)
    w_h_t = xp.matrix_transpose(w_h)
    zeros = xp.zeros_like(dh_out[:, : len(lengths), :])
    dh_next = zeros  # the delta each sequence's next step gives back to h
    dgx: list[Any] = []
    dgh: list[Any] = []
    for t in range(len(layout.batch) - 1, -1, -1):
        n = layout.batch[t]
        rz, n_h, candidate = acts[t]
        r, z = rz[..., :hidden], rz[..., hidden:]
        previous = layout.offsets[t - 1]
        h_prev = h_all[:, previous : previous + n, :] if t else xp.zeros_like(z)
        dh = dh_out[:, layout.offsets[t] : layout.offsets[t] + n, :] + dh_next[:, :n, :]
        d_candidate = dh * (1.0 - z) * (1.0 - candidate * candidate)  # its pre-activation's
        d_rz = xp.concat([d_candidate * n_h, dh * (h_prev - candidate)], axis=-1) * rz * (1.0 - rz)
        dgx.append(xp.concat([d_rz, d_candidate], axis=-1))
        dgh.append(xp.concat([d_rz, d_candidate * r], axis=-1))
        if t:
            dh_next = dh * z + xp.matmul(dgh[-1], w_h_t)
            if layout.batch[t - 1] > n:  # sequences whose last step is t - 1 join
                dh_next = xp.concat([dh_next, zeros[:, n : layout.batch[t - 1], :]], axis=1)
    dgx_all, dgh_all = xp.concat(dgx[::-1], axis=1), xp.concat(dgh[::-1], axis=1)  # (D, N, 3 hidden)
    d_wx = xp.matmul(xp.matrix_transpose(xs), dgx_all)  # (D, inputs, 3 hidden)
    d_wh = xp.matmul(xp.matrix_transpose(previous_steps(xp, h_all, layout)), dgh_all)  # (D, hidden, 3 hidden)
    d_bx = xp.sum(dgx_all, axis=1)  # (D, 3 hidden)
    d_bnh = xp.sum(dgh_all[..., 2 * hidden :], axis=1)  # (D, hidden)
    deltas = [unpacked_rows(xp, xp.matmul(dgx_all, xp.matrix_transpose(w_x)), layout, True)]
    reset, update, candidate = (slice(k * hidden, (k + 1) * hidden) for k in range(3))
    for k in range(directions):
        deltas += [xp.concat([d_wx[k, :, g], d_wh[k, :, g]], axis=0) for g in (reset, update)]
        deltas += [d_wx[k, :, candidate], d_wh[k, :, candidate]]
        deltas += [d_bx[k, reset], d_bx[k, update], d_bx[k, candidate], d_bnh[k, :]]
    return deltas


def _check(x: Any, *weights: Any, lengths: tuple[int, ...]) -> None:
    if len(weights) not in (PER_DIRECTION, 2 * PER_DIRECTION):
        raise ShapeError(f"packed_gru: takes {PER_DIRECTION} weights a direction, got {len(weights)}")
    n_x, n_h = weights[2], weights[3]
    if type(n_x) is float or type(n_h) is float or n_x.ndim != 2 or n_h.ndim != 2:
        raise ShapeError(
            f"packed_gru: n_x must be (inputs, hidden) and n_h (hidden, hidden), "
            f"got {shape_of(n_x)} and {shape_of(n_h)}"
        )
    inputs, hidden = n_x.shape
    wants = ((inputs + hidden, hidden),) * 2 + ((inputs, hidden), (hidden, hidden)) + ((hidden,),) * 4
    for k, w in enumerate(weights):
        want = wants[k % PER_DIRECTION]
        if tuple(getattr(w, "shape", ())) != want:
            raise ShapeError(f"packed_gru: gate array {k} must be {want} as n_x's, got {shape_of(w)}")
    check_steps("packed_gru", x, inputs, lengths)


def _cost(x: Any, *weights: Any, **_: Any) -> float:
    """Multiplications and additions of the products: each step's gates, in each direction."""
    inputs, hidden = weights[2].shape
    return float(2 * x.shape[0] * 3 * (inputs + hidden) * hidden * (len(weights) // PER_DIRECTION))


def _shape_rule(x: Info, *weights: Info, lengths: tuple[int, ...]) -> Info:
    """(N, inputs) and D directions' gates -> (N, D hidden)."""
    directions = len(weights) // 8
    return (x[0][0], directions * weights[-1][0][0]), *promoted(x, *weights)


PACKED_GRU: Final = layer_op("packed_gru", _forward, _deltas, _cost, _check, _shape_rule)


def packed_gru(x: AnyArray, lengths: tuple[int, ...], *weights: AnyArray) -> ArrayLayer:
    """One GRU layer, one or two directions, over ``len(lengths)`` sequences whose steps are the
    rows of ``x`` one sequence after another; ``weights`` are each direction's ``r, z, n_x, n_h``
    weights, then their biases. Gives every step's output (see the module)."""
    return apply_layer(PACKED_GRU, x, lengths, weights)
