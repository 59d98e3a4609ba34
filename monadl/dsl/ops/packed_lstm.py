"""A whole LSTM layer over a batch of sequences as one op: :func:`packed_lstm`, the op under
:class:`monadl.nn.LSTM`.

Written as cell calls, a layer over a batch of sentences is a few thousand nodes a step (each
cell call's concatenation, gates and fused arithmetic, for every word and direction); dynamic
batching merges them into one run per time step, but every node still costs the engine its
bookkeeping, and that, not the arithmetic, is most of such a step. This op does what PyTorch's
``nn.LSTM`` does over a packed batch (and cuDNN's RNN): the sequences sorted by length, so that
those still running at step ``t`` are the first ``n_t``; every step's input projection
``x W_x + b`` of both directions in one product before the loop; at each step one product by
``W_h`` for both directions and the gates' arithmetic, on stacked rows; and backward, the same
loop in reverse (backpropagation through time), then one product each for the input's delta and
the weights'. The two directions step together: at step ``t`` the forward direction reads
position ``t`` of each running sequence and the backward one position ``length - 1 - t``.

Its operands are the inputs ``x`` (every sequence's steps, one after another: (N, inputs)) and,
per direction, the four gates' weights and biases of an :class:`~monadl.nn.LSTMCell` (gates
``i, f, o, u``, each weight (inputs + hidden, hidden), the input's rows first). Its result is one
array of N + S rows (S sequences) of D * hidden (D directions): row ``r < N`` is step ``r``'s
output (each direction's ``h``, the forward one's first), row ``N + s`` sequence ``s``'s final
memories ``c`` (the forward direction's after its last step, the backward one's after its first).
The values are the cells': the same arithmetic, summed in another order.
"""

from __future__ import annotations

from typing import Any, Final

from monadl.dsl.core.layers import AnyArray, ArrayLayer
from monadl.dsl.ops.activations import sigmoid_of
from monadl.dsl.ops.packing import (
    PER_DIRECTION,
    apply_layer,
    check_steps,
    indices,
    layer_op,
    packed_deltas,
    packed_rows,
    packing,
    previous_steps,
    unpacked_rows,
)
from monadl.dsl.ops.shape_rules import Info, promoted
from monadl.typeclasses.backend import ShapeError, shape_of

__all__ = ["packed_lstm"]

GATES: Final = 4  # i, f, o, u: the three sigmoid gates first, so one sigmoid takes them at once


def _joined(xp: Any, weights: tuple[Any, ...], inputs: int, directions: int) -> tuple[Any, Any, Any]:
    """Each direction's gates joined: ``W_x`` (D, inputs, 4 hidden), ``W_h`` (D, hidden, 4 hidden)
    and the biases (D, 1, 4 hidden)."""
    wx, wh, b = [], [], []
    for d in range(directions):
        ws = weights[PER_DIRECTION * d : PER_DIRECTION * d + GATES]
        bs = weights[PER_DIRECTION * d + GATES : PER_DIRECTION * (d + 1)]
        w = xp.concat(ws, axis=1)
        wx.append(w[:inputs, :])
        wh.append(w[inputs:, :])
        b.append(xp.reshape(xp.concat(bs, axis=0), (1, -1)))
    return xp.stack(wx), xp.stack(wh), xp.stack(b)


def _forward(xp: Any, x: Any, *weights: Any, lengths: tuple[int, ...]) -> tuple[Any, tuple[Any, ...]]:
    directions = len(weights) // PER_DIRECTION
    layout = packing(lengths)
    w_x, w_h, bias = _joined(xp, weights, x.shape[1], directions)
    hidden = w_h.shape[1]
    xs = packed_rows(xp, x, layout, directions)  # (D, N, inputs)
    pre = xp.matmul(xs, w_x) + bias  # every step's input projection: (D, N, 4 hidden)
    hs: list[Any] = []
    cs: list[Any] = []
    acts: list[tuple[Any, Any, Any]] = []
    h = c = None
    for t, n in enumerate(layout.batch):
        g = pre[:, layout.offsets[t] : layout.offsets[t] + n, :]
        if h is not None:
            g = g + xp.matmul(h[:, :n, :], w_h)
        s = sigmoid_of(xp, g[..., : 3 * hidden])  # i, f, o
        u = xp.tanh(g[..., 3 * hidden :])
        c = (
            s[..., :hidden] * u
            if c is None
            else s[..., :hidden] * u + s[..., hidden : 2 * hidden] * c[:, :n, :]
        )
        tc = xp.tanh(c)
        h = s[..., 2 * hidden :] * tc
        hs.append(h)
        cs.append(c)
        acts.append((s, u, tc))
    h_all, c_all = xp.concat(hs, axis=1), xp.concat(cs, axis=1)  # (D, N, hidden), packed
    (last,) = indices(xp, x, layout.last)
    finals = xp.concat([xp.take(c_all[d, ...], last, axis=0) for d in range(directions)], axis=1)
    out = xp.concat([unpacked_rows(xp, h_all, layout, False), finals], axis=0)
    return out, (xs, w_x, w_h, h_all, c_all, acts)


def _deltas(
    xp: Any, d: Any, saved: tuple[Any, ...], x: Any, *weights: Any, lengths: tuple[int, ...]
) -> list[Any]:
    """Every operand's delta (backpropagation through time)."""
    xs, w_x, w_h, h_all, c_all, acts = saved
    directions, steps = xs.shape[0], xs.shape[1]
    hidden = w_h.shape[1]
    layout = packing(lengths)
    dh_out = packed_deltas(xp, d, layout, directions, hidden)
    # the final memories' deltas, the sequences in sorted order: (D, S, hidden)
    (order,) = indices(xp, x, layout.order)
    dc_final = xp.stack(
        [xp.take(d[steps:, k * hidden : (k + 1) * hidden], order, axis=0) for k in range(directions)]
    )
    w_h_t = xp.matrix_transpose(w_h)
    dh_first = xp.zeros_like(dc_final)
    dh_next, dc_next = dh_first, dc_final  # the deltas each sequence's next step gives back to h and c
    dgs: list[Any] = []
    for t in range(len(layout.batch) - 1, -1, -1):
        n = layout.batch[t]
        o = layout.offsets[t]
        s, u, tc = acts[t]
        si, sf, so = s[..., :hidden], s[..., hidden : 2 * hidden], s[..., 2 * hidden :]
        dh = dh_out[:, o : o + n, :] + dh_next[:, :n, :]
        dc = dc_next[:, :n, :] + dh * so * (1.0 - tc * tc)
        # the sigmoid gates' deltas at once (a step's cost is its number of kernels, not their size)
        c_prev = c_all[:, layout.offsets[t - 1] : layout.offsets[t - 1] + n, :] if t else xp.zeros_like(dc)
        d_sigmoids = xp.concat([dc * u, dc * c_prev, dh * tc], axis=-1) * s * (1.0 - s)
        dg = xp.concat([d_sigmoids, dc * si * (1.0 - u * u)], axis=-1)
        dgs.append(dg)
        if t:
            dh_next = xp.matmul(dg, w_h_t)
            dc_next = dc * sf
            if layout.batch[t - 1] > n:  # sequences whose last step is t - 1 join, with their
                joined = slice(n, layout.batch[t - 1])  # final memories' deltas
                dh_next = xp.concat([dh_next, dh_first[:, joined, :]], axis=1)
                dc_next = xp.concat([dc_next, dc_final[:, joined, :]], axis=1)
    dg_all = xp.concat(dgs[::-1], axis=1)  # (D, N, 4 hidden), packed
    d_wx = xp.matmul(xp.matrix_transpose(xs), dg_all)  # (D, inputs, 4 hidden)
    d_wh = xp.matmul(xp.matrix_transpose(previous_steps(xp, h_all, layout)), dg_all)  # (D, hidden, 4 hidden)
    d_b = xp.sum(dg_all, axis=1)  # (D, 4 hidden)
    deltas = [unpacked_rows(xp, xp.matmul(dg_all, xp.matrix_transpose(w_x)), layout, True)]
    for dd in range(directions):
        gates = [slice(k * hidden, (k + 1) * hidden) for k in range(GATES)]
        deltas += [xp.concat([d_wx[dd, :, k], d_wh[dd, :, k]], axis=0) for k in gates]
        deltas += [d_b[dd, k] for k in gates]
    return deltas


def _check(x: Any, *weights: Any, lengths: tuple[int, ...]) -> None:
    if len(weights) not in (PER_DIRECTION, 2 * PER_DIRECTION):
        raise ShapeError(f"packed_lstm: takes {PER_DIRECTION} weights a direction, got {len(weights)}")
    first, bias = weights[0], weights[GATES]
    if type(first) is float or type(bias) is float or first.ndim != 2 or bias.shape != first.shape[1:]:
        raise ShapeError(
            f"packed_lstm: a gate's weight must be (inputs + hidden, hidden) and its bias (hidden,), "
            f"got {shape_of(first)} and {shape_of(bias)}"
        )
    hidden = first.shape[1]
    inputs = first.shape[0] - hidden
    for k, w in enumerate(weights):
        want = (inputs + hidden, hidden) if k % PER_DIRECTION < GATES else (hidden,)
        if tuple(getattr(w, "shape", ())) != want:
            raise ShapeError(f"packed_lstm: gate array {k} must be {want} as the first, got {shape_of(w)}")
    check_steps("packed_lstm", x, inputs, lengths)


def _cost(x: Any, *weights: Any, **_: Any) -> float:
    """Multiplications and additions of the products: each step's gates, in each direction."""
    return float(2 * x.shape[0] * GATES * weights[0].size * (len(weights) // PER_DIRECTION))


def _shape_rule(x: Info, *weights: Info, lengths: tuple[int, ...]) -> Info:
    """(N, inputs) and D directions' gates -> (N + S, D hidden)."""
    directions = len(weights) // 8
    return (x[0][0] + len(lengths), directions * weights[-1][0][0]), *promoted(x, *weights)


PACKED_LSTM: Final = layer_op("packed_lstm", _forward, _deltas, _cost, _check, _shape_rule)


def packed_lstm(x: AnyArray, lengths: tuple[int, ...], *weights: AnyArray) -> ArrayLayer:
    """One LSTM layer, one or two directions, over ``len(lengths)`` sequences whose steps are the
    rows of ``x`` one sequence after another; ``weights`` are each direction's ``w_i, w_f, w_o, w_u,
    b_i, b_f, b_o, b_u``. Gives every step's output, then each sequence's final memories (see the
    module)."""
    return apply_layer(PACKED_LSTM, x, lengths, weights)
