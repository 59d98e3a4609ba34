"""Adam and AdamW: :class:`Adam` (L2 weight decay; dense, lazy as PyTorch's SparseAdam, or in chunks
of a large NumPy weight) and :class:`AdamW` (decoupled weight decay, ``amsgrad``), with their fused
CuPy kernel and :func:`adam_rule`, the dense rule as written."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from monadl.dsl.fused import Kernel, on_cupy
from monadl.dsl.learning.optimizers import native
from monadl.dsl.learning.optimizers.base import (
    check_betas,
    check_epsilon,
    check_learning_settings,
    contiguous_numpy_of_one_kind,
    decay_parts,
    keep_array,
    lazy_rows,
    rate_at_step,
    summed_rows,
    with_rows,
    with_weight_decay,
)
from monadl.dsl.learning.optimizers.checks import array_problem, parts_problem, step_problem
from monadl.dsl.learning.schedules import LearningRate
from monadl.typeclasses.backend import namespace
from monadl.typeclasses.sparse import SparseRows, dense


@functools.cache
def _adam_kernel(decay: str) -> Kernel:
    """``adam_rule`` as one kernel; ``decay``: "" (none), "l2" (Adam's, added to the gradient) or
    "decoupled" (AdamW's: the data shrunk first, by the scalar ``shrink``)."""
    scalars: tuple[str, ...] = ("b1", "c1", "b2", "c2", "k1", "k2", "rate", "eps")
    first: tuple[str, ...] = ()
    g, d = "g", "d"
    if decay == "l2":
        wd, first, g = decay_parts(True)
        scalars += wd
    elif decay == "decoupled":
        scalars, first, d = (*scalars, "shrink"), ("dd = d * shrink",), "dd"
    body = (
        *first,
        f"mnew = b1 * m + c1 * {g}",
        f"vnew = b2 * v + c2 * ({g} * {g})",
        "mhat = mnew / k1",
        "vhat = vnew / k2",
        f"dnew = {d} - rate * mhat / (sqrt(vhat) + eps)",
    )
    return Kernel(f"adam{decay}", ("d", "g", "m", "v"), scalars, ("dnew", "mnew", "vnew"), body)


def _fused_adam(
    data: Any,
    g: Any,
    m: Any,
    v: Any,
    b1: float,
    b2: float,
    t: int,
    rate: float,
    epsilon: float,
    decay: tuple[str, float] | None,
) -> tuple[Any, ...]:
    """Adam's (or AdamW's) dense update of CuPy arrays in one kernel: ``(new data, m, v)``.
    ``decay``: ``("l2", weight decay)``, ``("decoupled", shrink)`` or None."""
    scalars = (b1, 1.0 - b1, b2, 1.0 - b2, 1.0 - b1**t, 1.0 - b2**t, rate, epsilon)
    kernel = _adam_kernel("" if decay is None else decay[0])
    return kernel((data, g, m, v), scalars if decay is None else (*scalars, decay[1]))


@dataclass(frozen=True)
class Adam:
    """Adam (Kingma and Ba 2015), with bias correction. State: the first and second moments and
    the step count. ``lazy``: a sparse gradient updates its rows only (as PyTorch's SparseAdam)."""

    learning_rate: LearningRate = 0.001
    beta1: float = 0.9
    beta2: float = 0.999
    epsilon: float = 1e-8
    weight_decay: float = 0.0
    lazy: bool = False

    def __post_init__(self) -> None:
        check_learning_settings(self.learning_rate, self.weight_decay)
        check_betas(self.beta1, self.beta2)
        check_epsilon(self.epsilon)

    def init(self, data: Any) -> tuple[Any, Any, int]:
        return keep_array(data * 0.0, data), keep_array(data * 0.0, data), 0

    def check_state(self, state: object, data: Any) -> str | None:
        """What is wrong with ``state`` for a weight holding ``data`` (None if nothing): it must be
        ``(first moment, second moment, step count)``, the moments of the weight's shape and dtype
        (lazy or not), the second one >= 0."""
        problem = parts_problem(state, ("first moment", "second moment", "step count"))
        if problem is not None or not isinstance(state, tuple):
            return problem
        return (
            array_problem("first moment", state[0], data)
            or array_problem("second moment", state[1], data, non_negative=True)
            or step_problem(state[2])
        )

    def update(
        self, data: Any, gradient: Any, state: tuple[Any, Any, int]
    ) -> tuple[Any, tuple[Any, Any, int]]:
        m, v, t = state
        rate = rate_at_step(self.learning_rate, t)
        t += 1
        b1, b2 = self.beta1, self.beta2
        if type(gradient) is np.ndarray and not self.weight_decay:  # the commonest: to the kernel
            done = native.adam(data, gradient, m, v, b1, b2, t, rate, self.epsilon)
            if done is not None:  # (else the rule below, as for any gradient)
                return done[0], (done[1], done[2], t)
        sparse = lazy_rows(gradient, data, self.weight_decay) if self.lazy else None
        if sparse is not None:  # torch.optim.SparseAdam's operations, in its order (its bits)
            xp, rows, g = sparse
            m_rows, v_rows = m[rows], v[rows]
            m_rows = m_rows + (1.0 - b1) * (g - m_rows)
            v_rows = v_rows + (1.0 - b2) * (g * g - v_rows)
            step_size = rate * math.sqrt(1.0 - b2**t) / (1.0 - b1**t)
            new_rows = data[rows] - step_size * (m_rows / (v_rows**0.5 + self.epsilon))
            m, v = with_rows(xp, m, rows, m_rows), with_rows(xp, v, rows, v_rows)
            return with_rows(xp, data, rows, new_rows), (m, v, t)
        if type(gradient) is SparseRows and not self.weight_decay:
            done = _adam_of_rows(data, gradient, m, v, b1, b2, t, rate, self.epsilon)
            if done is not None:
                return done[0], (done[1], done[2], t)
        g = dense(gradient)
        if on_cupy(data, g, m, v):
            wd = self.weight_decay
            decay = ("l2", wd) if wd else None
            new, m, v = _fused_adam(data, g, m, v, b1, b2, t, rate, self.epsilon, decay)
            return new, (m, v, t)
        g = with_weight_decay(g, data, self.weight_decay)
        done = _adam_on_numpy(data, g, m, v, b1, b2, t, rate, self.epsilon)
        if done is not None:
            return done[0], (done[1], done[2], t)
        new, m, v = adam_rule(data, g, m, v, b1, b2, t, rate, self.epsilon)
        return keep_array(new, data), (keep_array(m, data), keep_array(v, data), t)


_CHUNK = 1 << 15
"""Elements an update computes at a time: its dozen passes stay in the cache, where a large table
(an embedding) would stream each of them through memory."""


def _same_arrays(*arrays: Any) -> bool:
    """Whether these are NumPy arrays of one shape and dtype, contiguous, of more than a chunk
    (then updated in chunks)."""
    return contiguous_numpy_of_one_kind(*arrays) and arrays[0].size > _CHUNK


def _adam_on_numpy(
    data: Any,
    g: Any,
    m: Any,
    v: Any,
    b1: float,
    b2: float,
    t: int,
    rate: float,
    epsilon: float,
    rows: Any = None,
) -> tuple[Any, Any, Any] | None:
    """Adam's rule on NumPy arrays in one pass (``native.adam``) or, where that is not built, in
    chunks of a large weight (``_adam_in_chunks``): ``(new data, m, v)``, the rule's bits; None
    where neither applies (``adam_rule`` then). ``rows``: ``g`` holds a sparse gradient's rows."""
    done = native.adam(data, g, m, v, b1, b2, t, rate, epsilon, rows)
    if done is None and (_same_arrays(data, m, v) if rows is not None else _same_arrays(data, g, m, v)):
        done = _adam_in_chunks(data, g, m, v, b1, b2, t, rate, epsilon, rows)
    return done


def _adam_of_rows(
    data: Any, gradient: SparseRows, m: Any, v: Any, b1: float, b2: float, t: int, rate: float, epsilon: float
) -> tuple[Any, Any, Any] | None:
    """:func:`_adam_on_numpy` of a sparse gradient's summed rows, without a dense gradient; None
    where its rows are not a NumPy array of the data's dtype."""
    summed = summed_rows(gradient)
    if summed is None or type(summed[2]) is not np.ndarray or summed[2].dtype != data.dtype:
        return None
    return _adam_on_numpy(data, summed[2], m, v, b1, b2, t, rate, epsilon, summed[1])


def adam_rule(
    data: Any, g: Any, m: Any, v: Any, b1: float, b2: float, t: int, rate: float, epsilon: float
) -> Any:
    """Adam's dense rule as written, on any arrays: ``(new data, m, v)`` (what the chunked NumPy
    path equals bit for bit)."""
    m = b1 * m + (1.0 - b1) * g
    v = b2 * v + (1.0 - b2) * (g * g)
    m_hat = m / (1.0 - b1**t)
    v_hat = v / (1.0 - b2**t)
    return data - rate * m_hat / (v_hat**0.5 + epsilon), m, v


def _adam_in_chunks(
    data: Any,
    g: Any,
    m: Any,
    v: Any,
    b1: float,
    b2: float,
    t: int,
    rate: float,
    epsilon: float,
    rows: Any = None,
) -> tuple[Any, Any, Any]:
    """Adam's dense rule on NumPy arrays, the same operations in the same order (so the same bits),
    a chunk of rows at a time into fresh arrays: ``(new data, m, v)``. With ``rows`` (sorted,
    distinct), ``g`` is a sparse gradient's summed rows there, every other row's gradient +0.0: a
    chunk of such rows adds that +0.0 to ``b1 * m`` and ``b2 * v`` without computing it, and no
    dense gradient is made (an embedding table's update, whose batch touched few of its rows)."""
    new, m_new, v_new = np.empty_like(data), np.empty_like(m), np.empty_like(v)
    flat = [x.reshape(-1) for x in (data, m, v, new, m_new, v_new)]
    count, width = data.shape[0], math.prod(data.shape[1:])
    per = max(1, _CHUNK // width)  # rows per chunk
    c1, c2 = 1.0 - b1**t, 1.0 - b2**t
    a = np.empty(min(count, per) * width, dtype=data.dtype)
    b = np.empty_like(a)
    if rows is None:
        dense_g = g.reshape(-1)
    else:
        g_rows = g.reshape(g.shape[0], width)
        bounds = np.searchsorted(rows, np.arange(0, count + per, per))
        chunk_g = np.empty_like(a)
    for k, first in enumerate(range(0, count, per)):
        last = min(first + per, count)
        start, end = first * width, last * width
        d_, m_, v_, new_, mn, vn = (x[start:end] for x in flat)
        ta, tb = a[: end - start], b[: end - start]
        if rows is None:
            g_ = dense_g[start:end]
        elif bounds[k] < bounds[k + 1]:  # rows of this chunk have a gradient: made dense here
            g_ = chunk_g[: end - start]
            g_.fill(0.0)
            lo, hi = bounds[k], bounds[k + 1]
            g_.reshape(last - first, width)[rows[lo:hi] - first] = g_rows[lo:hi]
        else:
            g_ = None
        np.multiply(m_, b1, out=mn)  # m = b1 * m + (1 - b1) * g
        if g_ is None:
            np.add(mn, 0.0, out=mn)
            np.multiply(v_, b2, out=vn)  # v = b2 * v + (1 - b2) * (g * g)
            np.add(vn, 0.0, out=vn)
        else:
            np.multiply(g_, 1.0 - b1, out=ta)
            np.add(mn, ta, out=mn)
            np.multiply(g_, g_, out=ta)
            np.multiply(ta, 1.0 - b2, out=ta)
            np.multiply(v_, b2, out=vn)
            np.add(vn, ta, out=vn)
        np.divide(mn, c1, out=ta)  # m_hat
        np.divide(vn, c2, out=tb)  # v_hat
        np.sqrt(tb, out=tb)
        np.add(tb, epsilon, out=tb)
        np.multiply(ta, rate, out=ta)  # rate * m_hat / (v_hat ** 0.5 + epsilon)
        np.divide(ta, tb, out=ta)
        np.subtract(d_, ta, out=new_)
    return new, m_new, v_new


@dataclass(frozen=True)
class AdamW:
    """AdamW (Loshchilov and Hutter 2019): Adam with decoupled weight decay, as
    ``torch.optim.AdamW`` (its defaults too). Each update first shrinks the data, ``data * (1 -
    learning_rate * weight_decay)``, then takes Adam's step on the gradient alone: the decay is not
    in the moments, where :class:`Adam`'s ``weight_decay`` (L2) puts it. ``amsgrad``: the step
    divides by the largest second moment so far (Reddi et al. 2018). State: the first and second
    moments, the largest second moment (None until ``amsgrad`` needs it) and the step count.

    A sparse gradient gives bit for bit what its dense equivalent gives (the decay touches every
    row, so there is no lazy form); without ``amsgrad``, a large NumPy weight's update reads the
    sparse rows as Adam's does, without making a dense gradient."""

    learning_rate: LearningRate = 0.001
    beta1: float = 0.9
    beta2: float = 0.999
    epsilon: float = 1e-8
    weight_decay: float = 0.01
    amsgrad: bool = False

    def __post_init__(self) -> None:
        check_learning_settings(self.learning_rate, self.weight_decay)
        check_betas(self.beta1, self.beta2)
        check_epsilon(self.epsilon)

    def init(self, data: Any) -> tuple[Any, Any, Any, int]:
        return keep_array(data * 0.0, data), keep_array(data * 0.0, data), None, 0

    def check_state(self, state: object, data: Any) -> str | None:
        """What is wrong with ``state`` for a weight holding ``data`` (None if nothing): it must be
        ``(first moment, second moment, largest second moment or None, step count)``, the moments
        of the weight's shape and dtype, the second ones >= 0."""
        names = ("first moment", "second moment", "largest second moment", "step count")
        problem = parts_problem(state, names)
        if problem is not None or not isinstance(state, tuple):
            return problem
        return (
            array_problem("first moment", state[0], data)
            or array_problem("second moment", state[1], data, non_negative=True)
            or (None if state[2] is None else array_problem(names[2], state[2], data, non_negative=True))
            or step_problem(state[3])
        )

    def update(
        self, data: Any, gradient: Any, state: tuple[Any, Any, Any, int]
    ) -> tuple[Any, tuple[Any, Any, Any, int]]:
        m, v, v_max, t = state
        rate = rate_at_step(self.learning_rate, t)
        t += 1
        b1, b2 = self.beta1, self.beta2
        if not self.amsgrad and on_cupy(data, m, v) and on_cupy(data, g := dense(gradient)):
            shrink = ("decoupled", 1.0 - rate * self.weight_decay) if self.weight_decay else None
            new, m, v = _fused_adam(data, g, m, v, b1, b2, t, rate, self.epsilon, shrink)
            return new, (m, v, v_max, t)
        decayed = keep_array(data * (1.0 - rate * self.weight_decay), data) if self.weight_decay else data
        if not self.amsgrad:
            sparse = type(gradient) is SparseRows
            done = _adam_of_rows(decayed, gradient, m, v, b1, b2, t, rate, self.epsilon) if sparse else None
            if done is None:
                g = dense(gradient)
                done = _adam_on_numpy(decayed, g, m, v, b1, b2, t, rate, self.epsilon)
                if done is None:
                    new, m, v = adam_rule(decayed, g, m, v, b1, b2, t, rate, self.epsilon)
                    return keep_array(new, data), (keep_array(m, data), keep_array(v, data), v_max, t)
            return done[0], (done[1], done[2], v_max, t)
        g = dense(gradient)
        m = keep_array(b1 * m + (1.0 - b1) * g, data)
        v = keep_array(b2 * v + (1.0 - b2) * (g * g), data)
        v_max = keep_array(_maximum(v if v_max is None else v_max, v), data)
        new = decayed - rate * (m / (1.0 - b1**t)) / ((v_max / (1.0 - b2**t)) ** 0.5 + self.epsilon)
        return keep_array(new, data), (m, v, v_max, t)


def _maximum(a: Any, b: Any) -> Any:
    """The elementwise maximum of two arrays of one namespace, or of two floats."""
    if isinstance(a, float):
        return b if b > a else a
    return namespace(a).maximum(a, b)
