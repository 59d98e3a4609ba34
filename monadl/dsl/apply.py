"""Applying a primitive to tapes: the forward kernel and the reference-counted backward.

``apply_primitive`` turns a :class:`~monadl.dsl.primitives.Primitive` and the forward computations
of its operands into the forward computation of the result:

1. a ``FLAT`` bind waits for the operands' tapes (independently: concurrently when they are big),
   then, on the interpreter's thread, acquires them and registers the new tape with the step;
2. a ``Kernel`` computes the data (inline, or on the pool if its cost is worth it).

The result's backward (once, with the summed delta) makes one lazy vjp kernel per input that wants
a delta; inputs that are literals are skipped, so their vjp kernels are never built or run.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any, cast

import numpy as np

from monadl.do.do import FLAT, KERNEL_MAP, Bind, Do, PrivateBind, PrivateKernel, Pure, run_unit
from monadl.dsl.base import Differentiable
from monadl.dsl.batching import OP_BATCHER
from monadl.dsl.primitives import Primitive
from monadl.tape.batch import BatchGroup, release_member
from monadl.tape.shared import SharedTape, _current_step
from monadl.tape.tape import Tape
from monadl.typeclasses.backend import (
    FLOATS,
    ShapeError,
    check_float_array,
    device_of,
    is_array,
    namespace,
    shape_of,
    unbroadcast,
)
from monadl.typeclasses.deep_learning import DeepLearning
from monadl.typeclasses.monoid import SUM
from monadl.typeclasses.sparse import SparseRows


class OpTape(SharedTape[Any, Any]):
    """The tape of one application of a primitive."""

    __slots__ = ("args", "cost", "group", "index", "params", "prim", "saved", "xp")
    sparse_deltas = True
    """Its vjp densifies a SparseRows delta itself; other tapes get dense deltas (see :meth:`vjp`)."""

    def __init__(
        self, prim: Primitive, params: dict[str, Any], inputs: tuple[Tape[Any, Any], ...], fanout: int
    ) -> None:
        # SharedTape's fields, set here rather than through super().__init__: this is every op's path.
        self.data = None
        self.inputs = inputs
        self.fanout = fanout  # its backward reads its delta once per input that wants one
        self._count = 0
        self._deltas = None
        self._fired = False
        self.prim = prim
        self.params = params
        self.xp: Any = None
        self.args: tuple[Any, ...] = ()  # the inputs' data, once computed
        self.saved: Any = None  # what a primitive that saves keeps for its vjps
        self.cost = -1.0
        self.group: BatchGroup | None = None  # set when it was computed as a row of a merged op
        self.index = 0

    @property
    def affinity(self) -> object:
        """The worker this op's kernels prefer (``monadl.do.workers``): its first weight's, so a
        weight's forward and backward kernels run on one core, where its data is in cache."""
        for t in self.inputs:
            weight = getattr(t, "weight", None)
            if weight is not None:
                return id(weight)
        return None

    def estimate_cost(self) -> float:
        """The op's cost (asked for only by an executor with a pool), computed once."""
        if self.cost < 0.0:
            try:
                self.cost = self.prim.cost(*[t.data for t in self.inputs], **self.params)  # before compute()
            except Exception:  # noqa: BLE001 - inputs the op rejects: run inline, its check says how
                self.cost = 0.0
        return self.cost

    def compute(self) -> OpTape:
        """The forward kernel: computes ``data`` from the inputs' data."""
        datas = self.args = tuple([t.data for t in self.inputs])
        self.xp, self.data, self.saved = forward_data(self.prim, self.params, datas)
        return self

    def vjp(self, i: int, delta: Any) -> Any:
        """The delta of input ``i``, given this tape's delta (a kernel)."""
        prim = self.prim
        saved = self.saved if prim.saves else self.data
        dense = not getattr(self.inputs[i], "sparse_deltas", False)  # a tape of the user's own
        return input_delta(prim, self.params, self.xp, self.args, saved, delta, i, dense)

    def _sum(self, deltas: Sequence[Do[Any]]) -> Do[Any]:
        return SUM.sum_lazy(deltas, self.estimate_cost)

    def _last_release(self) -> Do[None]:
        if self.group is not None:
            done = release_member(self, self.group, self.index)
            if done is not None:
                return done
        return SharedTape._last_release(self)

    def _fire(self) -> Do[None]:
        if self.group is None:
            return SharedTape._fire(self)
        return self.group.fired(self.index, self.take_deltas())  # a merged op: backward merged too

    def _backward(self, delta: Do[Any]) -> Do[None]:
        parts: list[Do[None]] = []
        cost = self.estimate_cost
        passes = self.prim.passes and type(self.data) is float
        for i, t in enumerate(self.inputs):
            if t.requires_delta:
                if passes and type(t.data) is float:  # its delta is this delta: no kernel for it
                    parts.append(t.backward(delta))
                    continue
                vjp = functools.partial(self.vjp, i)
                # Memoised unless one computation only will read it (it may feed several vjps).
                shared = cast("SharedTape[Any, Any]", t)  # requires_delta: a shared tape
                kind = PrivateBind if shared.sole_reader() else Bind
                parts.append(t.backward(kind((delta,), vjp, KERNEL_MAP, cost)))
        return run_unit(parts, private=True)  # returned to the one fire that runs it


def forward_data(prim: Primitive, params: dict[str, Any], datas: tuple[Any, ...]) -> tuple[Any, Any, Any]:
    """``prim`` applied to its inputs' data: the array namespace, the result, and what the
    primitive saves for its vjps (None if it saves nothing). Errors name the op and the shapes."""
    d0 = datas[0]
    xp = np if type(d0) is np.ndarray else namespace(*datas)
    if xp is not np and len(datas) > 1:
        _check_devices(prim.name, datas)
    if prim.check is not None:
        prim.check(*datas, **params)
    try:
        out = prim.forward(xp, *datas, **params)
    except ValueError as e:
        shapes = " and ".join(str(shape_of(d)) for d in datas)
        raise ShapeError(f"{prim.name}: operands of shapes {shapes} do not fit: {e}") from e
    except ArithmeticError:  # a float divided by zero, or overflowing: an array gives inf or nan
        if xp is not FLOATS:
            raise
        out = _as_float_arrays(prim.forward, (), datas, params)
    if type(out) is complex:  # a negative float to a fractional power: an array gives nan
        out = _as_float_arrays(prim.forward, (), datas, params)
    saved = None
    if prim.saves:
        out, saved = out
    # NumPy turns 0-d results into scalars (np.float64): keep array data an array.
    return xp, np.asarray(out) if isinstance(out, np.generic) else out, saved


def input_delta(
    prim: Primitive,
    params: dict[str, Any],
    xp: Any,
    datas: tuple[Any, ...],
    saved: Any,
    delta: Any,
    i: int,
    dense: bool,
) -> Any:
    """The delta of input ``i`` of an application of ``prim`` (inputs' data ``datas``; ``saved``:
    what it saved, or its result), given the result's ``delta``. ``dense``: the input takes dense
    deltas only (not a ``SparseRows``)."""
    if type(delta) is SparseRows:  # this op's output was looked up (take_rows): the rules want dense
        delta = delta.to_dense(xp)
    try:
        g = prim.vjps[i](xp, delta, saved, *datas, **params)
    except ArithmeticError:  # as in forward_data: floats as arrays compute them
        if xp is not FLOATS:
            raise
        g = _as_float_arrays(prim.vjps[i], (delta, saved), datas, params)
    if type(g) is complex:
        g = _as_float_arrays(prim.vjps[i], (delta, saved), datas, params)
    if prim.broadcasts:
        g = unbroadcast(xp, g, datas[i])
    elif type(g) is SparseRows and dense:
        g = g.to_dense(xp)
    return np.asarray(g) if isinstance(g, np.generic) else g


def _as_float_arrays(
    rule: Any, first: tuple[Any, ...], datas: tuple[Any, ...], params: dict[str, Any]
) -> Any:
    """``rule`` on Python floats computed as 0-d float64 arrays compute it (IEEE: ``1 / 0`` is inf,
    ``(-1) ** 0.5`` nan, without a warning), where Python's own float arithmetic raises (division
    by zero, overflow) or gives a complex number; so a ``FloatLayer`` gives what an array of one
    element gives, and the op's result stays a float."""
    as_array = [np.float64(v) if type(v) is float else v for v in (*first, *datas)]
    with np.errstate(all="ignore"):
        out = rule(np, *as_array, **params)
    return tuple(_plain(o) for o in out) if type(out) is tuple else _plain(out)


def _plain(value: Any) -> Any:
    return float(value) if isinstance(value, np.generic | np.ndarray) and np.ndim(value) == 0 else value


def _check_devices(name: str, datas: Sequence[Any]) -> None:
    devices = {str(device_of(d)) for d in datas if type(d) is not float}
    if len(devices) > 1:
        raise ValueError(f"{name}: operands live on different devices: {', '.join(sorted(devices))}")


class _Build:
    """The interpreter-thread step of an op's forward: acquire inputs, make and register the tape."""

    __slots__ = ("params", "prim")

    def __init__(self, prim: Primitive, params: dict[str, Any]) -> None:
        self.prim = prim
        self.params = params

    def __call__(self, *tapes: Tape[Any, Any]) -> Do[OpTape]:
        fanout = 0
        for t in tapes:
            if t.requires_delta:
                t.acquire()
                fanout += 1
        tape = OpTape(self.prim, self.params, tapes, fanout)
        step = _current_step.get()
        if step is not None:
            step.tapes.append(tape)
        return PrivateKernel(tape.compute, (), tape.estimate_cost, OP_BATCHER)


def forward_of(x: object, where: str) -> Do[Tape[Any, Any]]:
    """The forward computation of an operand: a layer's or weight's, or a literal's constant tape.

    Raises a TypeError naming ``where`` for anything that is not a float, a floating-point array,
    a weight or a layer.
    """
    if isinstance(x, Differentiable):
        return x.forward
    if type(x) is np.ndarray and x.dtype.kind == "f":  # the common constant, without the general checks
        return Pure(Tape(x))
    if isinstance(x, (float, int)) and not isinstance(x, bool):
        return Pure(Tape(float(x)))
    if is_array(x):
        check_float_array(x, where)
        return Pure(Tape(x))
    if isinstance(x, DeepLearning):  # a user's own differentiable type
        return x.forward
    raise TypeError(
        f"{where}: expected a float, a floating-point array, a weight or a layer, got {type(x).__name__}"
    )


def apply_primitive(
    prim: Primitive, operands: Sequence[object], params: dict[str, Any]
) -> Do[Tape[Any, Any]]:
    """The forward computation of ``prim`` applied to ``operands`` (see the module's docstring)."""
    sources = []
    for x in operands:  # a loop, not a comprehension (a call of its own in Python 3.11): every op
        sources.append(forward_of(x, prim.name))
    return Bind(tuple(sources), _Build(prim, params), FLAT)
