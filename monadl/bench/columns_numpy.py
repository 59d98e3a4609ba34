"""The CIFAR-100 column model by hand in NumPy: forward, backward and SGD, as fast as plain NumPy goes.

This is the floor of doing the model's math from Python: every array an op writes is preallocated
once (per batch size) and written in place (``out=``), so a training step allocates almost nothing
beyond a few tiny index temporaries. That matters more than it seems: large arrays freshly allocated
every step (the weight gradients) are returned to the OS by glibc when freed and page-faulted back in
on the next step, which cost a hand-written NumPy version of this model more than half its speed (from
1,140 to 420 steps/s at 4 columns, as measured on the benchmark's machine). Matrix products are
``np.dot(a, b, out=...)`` (a little faster than ``np.matmul`` at these small sizes), bias gradients
``np.dot(ones, delta, out=...)`` (faster than ``sum(axis=0)``), ReLU masks preallocated booleans.

The parameters live in one flat buffer, and their gradients in another of the same layout (each
parameter a view, aligned to 64 bytes): the columns and the coarse classifier first, then the 20 fine
classifiers one after the other. ``step`` seeds the backward pass with the learning rate instead of 1,
so the gradient buffers receive ``lr * grad`` directly, and the SGD update ``p -= lr * grad`` is a
single in-place subtraction over the flat buffer (noskip) or over two slices of it (skip: the shared
part and fine classifier ``c``): one pass over memory instead of two, ~10% of a step at 4 columns.

Variants (see ``columns_params`` for the model):

``skip``    only fine classifier ``c`` runs; only the columns', the coarse classifier's and its
            parameters get gradients and are updated.
``noskip``  all 20 fine classifiers run forward and backward. Their logits are stacked (20, B, 5),
            so the log-softmax, the losses and the output deltas of all 20 are computed in one go; the
            delta of classifier ``j != c`` is ``0.0 *`` its usual delta, which then runs through its
            whole backward pass: its gradients are exactly zero, its parameters are updated by them
            (values unchanged), and the work is really done.

The loss is the spec's: ``CE(logits, labels, K) = -sum(onehot * log_softmax(logits)) / (B * K)``,
``loss = CE(coarse, [c] * B, 20) + CE(fine_c, fine_local, 5)`` (+ ``0.0 * CE(fine_j, ...)`` for the
other ``j`` in noskip). BLAS threading is the caller's business.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from monadl.bench.columns_params import (
    COARSE_CLASSES,
    COARSE_PARAMS,
    COLUMN_PARAMS,
    FINE_CLASSES,
    FINE_PARAMS,
    FINE_PER_COARSE,
    check_batch,
    check_params,
)

Variant = Literal["skip", "noskip"]
VARIANTS: tuple[Variant, ...] = ("skip", "noskip")

_ALIGN_BYTES = 64


def _aligned_zeros(n: int, dtype: np.dtype[np.floating]) -> np.ndarray:
    """A zeroed 1-D array of ``n`` elements whose data starts on a 64-byte boundary."""
    pad = _ALIGN_BYTES // dtype.itemsize
    raw = np.zeros(n + pad, dtype=dtype)
    start = (-raw.ctypes.data % _ALIGN_BYTES) // dtype.itemsize
    return raw[start : start + n]


class _Workspace:
    """Every activation, delta and scratch array of one step, for one batch size."""

    def __init__(self, batch: int, n_columns: int, hidden: int, n_fine: int, dtype: np.dtype[np.floating]):
        b, h = batch, hidden

        def buf(*shape: int) -> np.ndarray:
            return np.zeros(shape, dtype=dtype)

        self.rows = np.arange(b)
        self.ones = np.ones(b, dtype=dtype)  # bias gradients as ones @ delta: faster than sum(axis=0)
        # columns: relu outputs of both layers (the masks of the backward are taken from them)
        self.col1 = [buf(b, h) for _ in range(n_columns)]
        self.col2 = [buf(b, h) for _ in range(n_columns)]
        self.h = buf(b, h)
        self.dh = buf(b, h)
        self.dh_part = buf(b, h)
        self.d2 = buf(b, h)
        self.d1 = buf(b, h)
        self.mask = np.zeros((b, h), dtype=bool)
        # coarse classifier: logits, then shifted logits, exps, sums, softmax delta
        self.coarse_logits = buf(b, COARSE_CLASSES)
        self.coarse_exp = buf(b, COARSE_CLASSES)
        self.coarse_max = buf(b, 1)
        self.coarse_sum = buf(b, 1)
        self.coarse_delta = buf(b, COARSE_CLASSES)
        # the running fine classifiers, stacked: relu outputs, logits and everything of their losses
        self.fine1 = buf(n_fine, b, h)
        self.fine2 = buf(n_fine, b, h)
        self.fine_logits = buf(n_fine, b, FINE_PER_COARSE)
        self.fine_exp = buf(n_fine, b, FINE_PER_COARSE)
        self.fine_max = buf(n_fine, b, 1)
        self.fine_sum = buf(n_fine, b, 1)
        self.fine_delta = buf(n_fine, b, FINE_PER_COARSE)
        self.fine_ce = buf(n_fine)
        self.fine_scale = buf(n_fine, 1, 1)


class NumpyColumns:
    """The column model in hand-written NumPy: ``step`` trains on a batch, ``gradients`` only computes.

    ``params`` (as made by ``init_params``, float32 or float64) are copied; the model's current values
    are ``self.params``, a dict of live views into its flat parameter buffer (do not resize them).
    """

    def __init__(self, params: dict[str, np.ndarray], variant: Variant, learning_rate: float = 1e-4):
        if variant not in VARIANTS:
            raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
        self.n_columns, self.hidden, self.dtype = check_params(params)
        self.variant: Variant = variant
        self.learning_rate = float(learning_rate)

        # the flat layout: each parameter at an offset aligned to 64 bytes, in params' canonical order
        align = _ALIGN_BYTES // self.dtype.itemsize
        names = [f"column{i}.{p}" for i in range(self.n_columns) for p in COLUMN_PARAMS]
        names += [f"coarse.{p}" for p in COARSE_PARAMS]
        fine_names = [[f"fine{j}.{p}" for p in FINE_PARAMS] for j in range(FINE_CLASSES)]
        offsets: dict[str, int] = {}
        end = 0
        self._fine_bounds: list[tuple[int, int]] = []
        for name in names:
            offsets[name], end = end, -(-(end + params[name].size) // align) * align
        shared_end = end
        for group in fine_names:
            start = end
            for name in group:
                offsets[name], end = end, -(-(end + params[name].size) // align) * align
            self._fine_bounds.append((start, end))
        self._flat = _aligned_zeros(end, self.dtype)
        self._grad_flat = _aligned_zeros(end, self.dtype)
        self._shared = slice(0, shared_end)

        self.params: dict[str, np.ndarray] = {}
        self._grads: dict[str, np.ndarray] = {}
        for name in names + [n for group in fine_names for n in group]:
            shape = params[name].shape
            lo, hi = offsets[name], offsets[name] + params[name].size
            self.params[name] = self._flat[lo:hi].reshape(shape)
            self.params[name][...] = params[name]
            self._grads[name] = self._grad_flat[lo:hi].reshape(shape)

        def tup(prefix: str, ps: tuple[str, ...], d: dict[str, np.ndarray]) -> tuple[np.ndarray, ...]:
            return tuple(d[f"{prefix}.{p}"] for p in ps)

        self._columns = [tup(f"column{i}", COLUMN_PARAMS, self.params) for i in range(self.n_columns)]
        self._column_grads = [tup(f"column{i}", COLUMN_PARAMS, self._grads) for i in range(self.n_columns)]
        self._coarse = tup("coarse", COARSE_PARAMS, self.params)
        self._coarse_grads = tup("coarse", COARSE_PARAMS, self._grads)
        self._fine = [tup(f"fine{j}", FINE_PARAMS, self.params) for j in range(FINE_CLASSES)]
        self._fine_grads = [tup(f"fine{j}", FINE_PARAMS, self._grads) for j in range(FINE_CLASSES)]
        self._shared_names = names
        self._fine_names = fine_names
        self._workspaces: dict[int, _Workspace] = {}

    # ----------------------------------------------------------------------------------- public

    def step(self, x: np.ndarray, c: int, fine_local: np.ndarray) -> float:
        """One SGD step on the batch; returns its loss (before the update)."""
        # The backward is seeded with lr instead of 1, so the gradient buffers get lr * grad, and the
        # update is one in-place subtraction (a single pass over memory instead of two).
        loss = self._forward_backward(x, c, fine_local, seed=self.learning_rate)
        flat, grad = self._flat, self._grad_flat
        if self.variant == "noskip":
            np.subtract(flat, grad, out=flat)
        else:
            lo, hi = self._fine_bounds[c]
            for part in (self._shared, slice(lo, hi)):
                np.subtract(flat[part], grad[part], out=flat[part])
        return loss

    def gradients(self, x: np.ndarray, c: int, fine_local: np.ndarray) -> tuple[float, dict[str, np.ndarray]]:
        """The batch's loss and the gradients (copies) of every parameter that gets one; no update.

        skip: the columns', the coarse classifier's and fine classifier ``c``'s parameters. noskip:
        every parameter (the other fine classifiers' gradients are exactly zero).
        """
        loss = self._forward_backward(x, c, fine_local, seed=1.0)
        names = list(self._shared_names)
        for j in range(FINE_CLASSES) if self.variant == "noskip" else (c,):
            names += self._fine_names[j]
        return loss, {name: self._grads[name].copy() for name in names}

    def loss(self, x: np.ndarray, c: int, fine_local: np.ndarray) -> float:
        """The batch's loss, forward only (noskip runs all 20 fine classifiers)."""
        ws, x, fine_local = self._prepare(x, c, fine_local)
        return self._forward(ws, x, c, fine_local)

    # ---------------------------------------------------------------------------------- private

    def _prepare(
        self, x: np.ndarray, c: int, fine_local: np.ndarray
    ) -> tuple[_Workspace, np.ndarray, np.ndarray]:
        x = np.asarray(x)
        fine_local = np.asarray(fine_local)
        check_batch(x, c, fine_local)
        if x.dtype != self.dtype:
            x = x.astype(self.dtype)
        batch = len(x)
        ws = self._workspaces.get(batch)
        if ws is None:
            n_fine = FINE_CLASSES if self.variant == "noskip" else 1
            ws = self._workspaces[batch] = _Workspace(batch, self.n_columns, self.hidden, n_fine, self.dtype)
        return ws, x, fine_local

    def _running(self, c: int) -> range | tuple[int]:
        """The fine classifiers that run: all 20 (noskip) or ``c`` (skip), in stacking order."""
        return range(FINE_CLASSES) if self.variant == "noskip" else (c,)

    def _forward(self, ws: _Workspace, x: np.ndarray, c: int, fine_local: np.ndarray) -> float:
        """Fills the workspace's activations and softmax parts; returns the loss."""
        batch = len(x)
        h = ws.h
        for i, (w1, b1, w2, b2) in enumerate(self._columns):
            a1, a2 = ws.col1[i], ws.col2[i]
            np.dot(x, w1, out=a1)
            np.add(a1, b1, out=a1)
            np.maximum(a1, 0, out=a1)
            np.dot(a1, w2, out=a2)
            np.add(a2, b2, out=a2)
            np.maximum(a2, 0, out=a2)
            if i == 0:
                np.copyto(h, a2)
            else:
                np.add(h, a2, out=h)

        cw, cb = self._coarse
        logits = ws.coarse_logits
        np.dot(h, cw, out=logits)
        np.add(logits, cb, out=logits)
        # stable log-softmax: logits - max - log(sum(exp(logits - max))); only the label's entry counts
        np.max(logits, axis=1, keepdims=True, out=ws.coarse_max)
        np.subtract(logits, ws.coarse_max, out=logits)  # logits now holds the shifted logits
        np.exp(logits, out=ws.coarse_exp)
        np.sum(ws.coarse_exp, axis=1, keepdims=True, out=ws.coarse_sum)
        log_sum = np.log(ws.coarse_sum[:, 0])
        coarse_ce = -float(np.sum(logits[:, c] - log_sum)) / (batch * COARSE_CLASSES)

        for k, j in enumerate(self._running(c)):
            fw1, fb1, fw2, fb2, fw3, fb3 = self._fine[j]
            f1, f2, fl = ws.fine1[k], ws.fine2[k], ws.fine_logits[k]
            np.dot(h, fw1, out=f1)
            np.add(f1, fb1, out=f1)
            np.maximum(f1, 0, out=f1)
            np.dot(f1, fw2, out=f2)
            np.add(f2, fb2, out=f2)
            np.maximum(f2, 0, out=f2)
            np.dot(f2, fw3, out=fl)
            np.add(fl, fb3, out=fl)
        shifted = ws.fine_logits
        np.max(shifted, axis=2, keepdims=True, out=ws.fine_max)
        np.subtract(shifted, ws.fine_max, out=shifted)
        np.exp(shifted, out=ws.fine_exp)
        np.sum(ws.fine_exp, axis=2, keepdims=True, out=ws.fine_sum)
        log_sums = np.log(ws.fine_sum[:, :, 0])  # (n_fine, B)
        picked = shifted[:, ws.rows, fine_local]  # (n_fine, B): each sample's label's shifted logit
        np.sum(picked - log_sums, axis=1, out=ws.fine_ce)
        np.multiply(ws.fine_ce, -1.0 / (batch * FINE_PER_COARSE), out=ws.fine_ce)
        # the loss weights: 1 for classifier c, 0.0 for the others (noskip)
        scale = ws.fine_scale[:, 0, 0]
        if self.variant == "noskip":
            scale[...] = 0.0
            scale[c] = 1.0
        else:
            scale[0] = 1.0
        fine_ce = float(np.sum(scale * ws.fine_ce))
        return coarse_ce + fine_ce

    def _forward_backward(self, x: np.ndarray, c: int, fine_local: np.ndarray, seed: float) -> float:
        """Runs the forward and the backward pass, filling the gradients of the running parameters.

        The gradients are those of ``seed * loss``: 1 for the gradients, the learning rate for a step.
        """
        ws, x, fine_local = self._prepare(x, c, fine_local)
        loss = self._forward(ws, x, c, fine_local)
        batch = len(x)
        h, dh, dh_part, d1, d2, mask, ones = ws.h, ws.dh, ws.dh_part, ws.d1, ws.d2, ws.mask, ws.ones

        # coarse: d logits = seed * (softmax - onehot) / (B * 20)
        delta = ws.coarse_delta
        np.divide(ws.coarse_exp, ws.coarse_sum, out=delta)
        delta[:, c] -= 1.0
        np.multiply(delta, seed / (batch * COARSE_CLASSES), out=delta)
        cw, _ = self._coarse
        gcw, gcb = self._coarse_grads
        np.dot(h.T, delta, out=gcw)
        np.dot(ones, delta, out=gcb)
        np.dot(delta, cw.T, out=dh)

        # fine: d logits = seed * weight * (softmax - onehot) / (B * 5), weight 0.0 for all but c (noskip)
        np.multiply(ws.fine_scale, seed / (batch * FINE_PER_COARSE), out=ws.fine_scale)
        fdelta = ws.fine_delta
        np.divide(ws.fine_exp, ws.fine_sum, out=fdelta)
        fdelta[:, ws.rows, fine_local] -= 1.0
        np.multiply(fdelta, ws.fine_scale, out=fdelta)
        for k, j in enumerate(self._running(c)):
            fw1, _, fw2, _, fw3, _ = self._fine[j]
            gw1, gb1, gw2, gb2, gw3, gb3 = self._fine_grads[j]
            f1, f2, d3 = ws.fine1[k], ws.fine2[k], fdelta[k]
            np.dot(f2.T, d3, out=gw3)
            np.dot(ones, d3, out=gb3)
            np.dot(d3, fw3.T, out=d2)
            np.greater(f2, 0, out=mask)
            np.multiply(d2, mask, out=d2)
            np.dot(f1.T, d2, out=gw2)
            np.dot(ones, d2, out=gb2)
            np.dot(d2, fw2.T, out=d1)
            np.greater(f1, 0, out=mask)
            np.multiply(d1, mask, out=d1)
            np.dot(h.T, d1, out=gw1)
            np.dot(ones, d1, out=gb1)
            np.dot(d1, fw1.T, out=dh_part)
            np.add(dh, dh_part, out=dh)

        # columns: each gets the whole of dh (h is their sum)
        for i, (_, _, w2, _) in enumerate(self._columns):
            gw1, gb1, gw2, gb2 = self._column_grads[i]
            a1, a2 = ws.col1[i], ws.col2[i]
            np.greater(a2, 0, out=mask)
            np.multiply(dh, mask, out=d2)
            np.dot(a1.T, d2, out=gw2)
            np.dot(ones, d2, out=gb2)
            np.dot(d2, w2.T, out=d1)
            np.greater(a1, 0, out=mask)
            np.multiply(d1, mask, out=d1)
            np.dot(x.T, d1, out=gw1)
            np.dot(ones, d1, out=gb1)
        return loss
