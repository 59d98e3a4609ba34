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

from monadl.do.primitive import Primitive
from monadl.dsl.layers import AnyArray, ArrayLayer, apply_array
from monadl.dsl.packing import indices, packing
from monadl.dsl.primitives import sigmoid_of
from monadl.typeclasses.backend import ShapeError, on_device, shape_of

__all__ = ["packed_lstm"]

GATES: Final = 4  # i, f, o, u: the three sigmoid gates first, so one sigmoid takes them at once


def _joined(xp: Any, weights: tuple[Any, ...], inputs: int, directions: int) -> tuple[Any, Any, Any]:
    """Each direction's gates joined: ``W_x`` (D, inputs, 4 hidden), ``W_h`` (D, hidden, 4 hidden)
    and the biases (D, 1, 4 hidden)."""
    wx, wh, b = [], [], []
    for d in range(directions):
        ws = weights[2 * GATES * d : 2 * GATES * d + GATES]
        bs = weights[2 * GATES * d + GATES : 2 * GATES * (d + 1)]
        w = xp.concat(ws, axis=1)
        wx.append(w[:inputs, :])
        wh.append(w[inputs:, :])
        b.append(xp.reshape(xp.concat(bs, axis=0), (1, -1)))
    return xp.stack(wx), xp.stack(wh), xp.stack(b)


def _forward(xp: Any, x: Any, *weights: Any, lengths: tuple[int, ...]) -> tuple[Any, list[Any]]:
    directions = len(weights) // (2 * GATES)
    inputs = x.shape[1]
    layout = packing(lengths)
    w_x, w_h, bias = _joined(xp, weights, inputs, directions)
    hidden = w_h.shape[1]
    reads = indices(xp, x, layout.forward, layout.backward)[:directions]
    xs = xp.stack([xp.take(x, r, axis=0) for r in reads])  # (D, N, inputs), packed
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
    rows = indices(xp, x, layout.forward_rows, layout.backward_rows)[:directions]
    (last,) = indices(xp, x, layout.last)
    out = xp.concat(
        [
            xp.concat([xp.take(h_all[d, ...], rows[d], axis=0) for d in range(directions)], axis=1),
            xp.concat([xp.take(c_all[d, ...], last, axis=0) for d in range(directions)], axis=1),
        ],
        axis=0,
    )
    # the vjps' shared work is done once, by the first of them: its result is kept in the last slot
    return out, [xs, w_x, w_h, h_all, c_all, acts, None]


def _deltas(xp: Any, d: Any, saved: list[Any], x: Any, *weights: Any, lengths: tuple[int, ...]) -> list[Any]:
    """Every operand's delta (backpropagation through time), worked out once per delta ``d``."""
    cached = saved[-1]
    if cached is not None and cached[0] is d:
        return cached[1]  # type: ignore[no-any-return]
    xs, w_x, w_h, h_all, c_all, acts = saved[:-1]
    directions, n_rows = xs.shape[0], xs.shape[1]
    hidden = w_h.shape[1]
    layout = packing(lengths)
    reads = indices(xp, x, layout.forward, layout.backward)[:directions]
    (order,) = indices(xp, x, layout.order)
    # the outputs' deltas, packed: (D, N, hidden); the final memories', in sorted order: (D, S, hidden)
    dh_out = xp.stack(
        [xp.take(d[:n_rows, dd * hidden : (dd + 1) * hidden], reads[dd], axis=0) for dd in range(directions)]
    )
    dc_final = xp.stack(
        [xp.take(d[n_rows:, dd * hidden : (dd + 1) * hidden], order, axis=0) for dd in range(directions)]
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
    # each step's previous h, packed (zeros before the first step)
    h_prev = xp.concat(
        [xp.zeros((directions, layout.batch[0], hidden), dtype=h_all.dtype, **on_device(xp, h_all))]
        + [
            h_all[:, layout.offsets[t - 1] : layout.offsets[t - 1] + n, :]
            for t, n in enumerate(layout.batch)
            if t
        ],
        axis=1,
    )
    d_wx = xp.matmul(xp.matrix_transpose(xs), dg_all)  # (D, inputs, 4 hidden)
    d_wh = xp.matmul(xp.matrix_transpose(h_prev), dg_all)  # (D, hidden, 4 hidden)
    d_b = xp.sum(dg_all, axis=1)  # (D, 4 hidden)
    dxs = xp.matmul(dg_all, xp.matrix_transpose(w_x))  # (D, N, inputs), packed
    rows = indices(xp, x, layout.forward_rows, layout.backward_rows)[:directions]
    dx = xp.take(dxs[0, ...], rows[0], axis=0)
    if directions == 2:
        dx = dx + xp.take(dxs[1, ...], rows[1], axis=0)
    deltas = [dx]
    for dd in range(directions):
        gates = [slice(k * hidden, (k + 1) * hidden) for k in range(GATES)]
        deltas += [xp.concat([d_wx[dd, :, k], d_wh[dd, :, k]], axis=0) for k in gates]
        deltas += [d_b[dd, k] for k in gates]
    saved[-1] = (d, deltas)  # one assignment: a vjp on another thread sees the pair or nothing
    return deltas


def _vjp(k: int) -> Any:
    def vjp(xp: Any, d: Any, saved: list[Any], *inputs: Any, lengths: tuple[int, ...]) -> Any:
        return _deltas(xp, d, saved, *inputs, lengths=lengths)[k]

    return vjp


def _check(x: Any, *weights: Any, lengths: tuple[int, ...]) -> None:
    if len(weights) not in (2 * GATES, 4 * GATES):
        raise ShapeError(f"packed_lstm: takes 8 weights a direction, got {len(weights)}")
    first, bias = weights[0], weights[GATES]
    if type(first) is float or type(bias) is float or first.ndim != 2 or bias.shape != first.shape[1:]:
        raise ShapeError(
            f"packed_lstm: a gate's weight must be (inputs + hidden, hidden) and its bias (hidden,), "
            f"got {shape_of(first)} and {shape_of(bias)}"
        )
    hidden = first.shape[1]
    inputs = first.shape[0] - hidden
    for k, w in enumerate(weights):
        want = (inputs + hidden, hidden) if k % (2 * GATES) < GATES else (hidden,)
        if tuple(getattr(w, "shape", ())) != want:
            raise ShapeError(f"packed_lstm: gate array {k} must be {want} as the first, got {shape_of(w)}")
    if type(x) is float or x.ndim != 2 or x.shape[1] != inputs:
        raise ShapeError(
            f"packed_lstm: the steps must be (steps, {inputs}) for these cells, got {shape_of(x)}"
        )
    if not lengths or min(lengths) < 1 or sum(lengths) != x.shape[0]:
        raise ShapeError(
            f"packed_lstm: lengths {list(lengths)} do not add up to the {x.shape[0]} steps of {shape_of(x)}"
        )


def _cost(x: Any, *weights: Any, **_: Any) -> float:
    """Multiplications and additions of the products: each step's gates, in each direction."""
    return float(2 * x.shape[0] * GATES * weights[0].size * (len(weights) // (2 * GATES)))


# One primitive a number of directions (one vjp an operand); its calls never merge: each is a whole
# layer over a batch already.
PACKED_LSTM: Final = {
    n: Primitive(
        "packed_lstm",
        _forward,
        tuple(_vjp(k) for k in range(1 + n)),
        saves=True,
        cost=_cost,
        check=_check,
        fresh=True,
        own=True,
    )
    for n in (2 * GATES, 4 * GATES)
}


def packed_lstm(x: AnyArray, lengths: tuple[int, ...], *weights: AnyArray) -> ArrayLayer:
    """One LSTM layer, one or two directions, over ``len(lengths)`` sequences whose steps are the
    rows of ``x`` one sequence after another; ``weights`` are each direction's ``w_i, w_f, w_o, w_u,
    b_i, b_f, b_o, b_u``. Gives every step's output, then each sequence's final memories (see the
    module)."""
    prim = PACKED_LSTM.get(len(weights))
    if prim is None:
        raise ValueError(f"packed_lstm: takes 8 weights a direction, got {len(weights)}")
    return apply_array(prim, x, *weights, lengths=tuple(int(n) for n in lengths))
