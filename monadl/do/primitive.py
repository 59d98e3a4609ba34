"""What an op node applies: a :class:`Primitive`, the ops as data.

A primitive is a forward rule, one vector-Jacobian product per input, a cost, checks, and how its
calls merge under dynamic batching (:class:`Batching`, as DyNet's ``autobatch_sig``). The rules are
written against an array namespace ``xp`` taken from the inputs, so they run on NumPy, CuPy,
array-api-strict and, for elementwise ops, Python floats. The library's primitives are declared
by family in ``monadl.dsl.ops`` (``monadl.dsl.ops.registry.declare``, with the library's defaults
for ``fresh`` and ``own``); this module also holds the engine's own sums (:func:`add_n`, and
:data:`ROWS_SUM`, a gathered array's rows summed). It imports nothing of the graph.

A vjp has the signature ``vjp(xp, delta, out, *inputs, **params)`` and returns the delta for its
input. For primitives marked ``broadcasts``, it is summed back to the input's shape afterwards.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np

from monadl.do.stats import kind_number
from monadl.typeclasses.backend import (
    FLOATS,
    NDARRAY,
    NUMPY,
    ShapeError,
    device_of,
    is_float_array,
    namespace,
    on_device,
    shape_of,
    stack_arrays,
    unbroadcast,
)
from monadl.typeclasses.sparse import SparseRows

Rule = Callable[..., Any]

_GENERIC: Final = np.generic


def elementwise_cost(*inputs: Any, **_: Any) -> float:
    """Cost of an elementwise op: the largest operand's number of elements."""
    cost = 1
    for x in inputs:
        if type(x) is not float:
            n = math.prod(x.shape)
            if n > cost:
                cost = n
    return float(cost)


@dataclass(frozen=True)
class FanOut:
    """How calls of a primitive that read one value with different others merge (``linear`` of one
    input with several weights: the gates of an LSTM cell): the inputs ``shared`` are one value for
    all the calls (the same node), the other inputs are each call's own.

    ``forward(xp, *inputs, **params)`` gets each unshared input as a tuple of the calls' values (not
    copied into one array) and gives one result row per call; ``vjps`` give a shared input its delta
    summed over the calls, an unshared one its calls' deltas as the rows of one array. The calls'
    parameters are equal (their whole value is in the signature)."""

    shared: tuple[int, ...]
    forward: Rule
    vjps: tuple[Rule, ...]
    products: dict[int, Rule] = field(default_factory=dict)
    """For an unshared input whose delta is a product of rows (a weight's), the rule giving it as
    ``(left, rights)`` (the call k's delta ``left.T @ rights[k]``; ``left`` None: the rows of
    ``rights[k]`` summed): see :attr:`Primitive.products`."""


@dataclass(frozen=True)
class Batching:
    """How calls of a primitive merge into one call on stacked rows (dynamic batching).

    Each input of a merged call is either *stacked* (the calls' values become the rows of one array,
    row k the k-th call's) or *shared* (one value for all the calls: a weight, or a float constant,
    whose delta is then summed once per group instead of once per call)."""

    shared: tuple[int, ...] = ()
    """Inputs that must be shared (a weight, a float constant or one computed value read whole by
    every call), such as ``linear``'s weight or ``take_rows``' table."""
    row_params: tuple[str, ...] = ()
    """Parameters stacked like inputs (arrays of one shape per call), such as ``take_rows``' indices."""
    elementwise: bool = False
    """Any input may be shared. Stacked inputs are padded to a common rank (``(n, 1, ..., *shape)``),
    so that each row broadcasts against the others as its call did."""
    axis: bool = False
    """The op has an ``axis`` parameter (default ``axis_default``), shifted past the row axis."""
    axis_default: Any = None
    scalar: str = "never"
    """When a call's result is a Python float: ``"inputs"`` (when all inputs are floats),
    ``"reduce"`` (a reduction over all axes without ``keepdims``), ``"always"`` or ``"never"``."""
    forward: Rule | None = None
    """A forward of its own on stacked rows, giving one result row per call (default: ``forward``)."""
    vjps: tuple[Rule, ...] | None = None
    """The vjps on stacked rows, if ``forward`` is its own."""
    fan: FanOut | None = None
    """How calls that merged with nothing else merge when they share an input (None: they do not)."""
    mergeable: Callable[..., bool] | None = None
    """Whether a call may merge, given its inputs' ranks (a float's is 0; default: always), for an
    op whose stacked rows would mean something else: ``matmul`` with a ``b`` of more than two axes,
    whose own leading axes would meet the rows' axis. (Ranks, not values: a row of a merged value
    is known without making it.)"""
    check_merged: Callable[[tuple[Any, ...], dict[str, Any]], None] | None = None
    """One check of the per-run parameters of merged calls, instead of each call's ``check_values``
    (for ops with ``row_params``, whose calls' values differ): given the first call's inputs and the
    merged parameters (``row_params`` stacked, the other per-run ones listed by call), it raises if any
    call's check would. It only saves time: on an error the calls are checked one by one, so the
    error names its call."""
    sums_rows: bool = False
    """The op is an n-ary sum (``add_n``): rows of one group among its operands are summed as one
    gathered array, not one by one."""
    joins_rows: bool = False
    """The op joins arrays along their first axis (``concatenate``): rows of groups among its
    operands are gathered, not taken out one by one."""
    stacks_rows: bool = False
    """The op stacks arrays along a new first axis (``stack``): rows of groups among its operands
    are gathered, not taken out one by one."""


ELEMENTWISE: Final = Batching(elementwise=True, scalar="inputs")


class Primitive:
    """One differentiable primitive: ``forward(xp, *inputs, **params)`` and its ``vjps``.

    ``broadcasts``: the vjps' results are summed back to their inputs' shapes. ``passes``: every vjp
    is the identity (a sum): a float input's delta is the output's, without a kernel. ``saves``:
    ``forward`` returns ``(output, saved)`` and the vjps get ``saved`` in place of the output (work
    shared by forward and backward is done once). ``check``: raises for inputs of shapes or types
    the op cannot take (run once per structure); ``check_values``: the checks that read values (a
    label's range), run at every run. ``per_run``: the parameters that are data rather than
    structure (indices, labels): only their types and shapes are part of a program's structure.
    ``batch`` says how calls merge under dynamic batching (None: they do not). ``fresh``: every vjp
    gives a new array or a view (never another array it was given), so a gradient it gives may be
    overwritten by an optimizer (the library's own primitives). ``own``: one of the library's own
    primitives, whose forward raises ``ValueError`` only where NumPy finds the operands' shapes do
    not fit: that is reported as a ``ShapeError`` naming the op and the shapes. Another
    primitive's exceptions (a user's) reach the caller as they are. ``products``: for an input whose
    delta is a product of rows (a weight's, ``x.T @ d``), the rule ``(xp, d, saved, *inputs,
    **params) -> (left, right)`` giving its factors (``left`` None: ``right``'s rows summed: a
    bias), or None where it is not one; a backward pass adds up a weight's products over all the
    calls of a step and multiplies once (``monadl.tape.backward``). ``shape_rule``: the result's
    static shape, dtype and namespace from the inputs' (``(shape, dtype, xp)`` each) and the
    parameters, or None (see ``monadl.dsl.core.shapes``): a layer's ``.shape`` and ``.dtype``.
    ``context``: the forward behaves by the run it is part of (its mode, a random stream, buffer
    updates it stages): it receives the run's :class:`~monadl.do.context.RunContext` as the keyword
    argument ``ctx``; its calls do not merge (no ``batch``).
    ``joint_vjp``: one rule ``(xp, delta, out, *inputs, **params)`` giving every input's delta at
    once (a sequence, one an input), in place of ``vjps`` (then ``()``), for an op whose deltas share
    their work (a recurrent cell's gates: every delta a product of the same activations) or whose
    number of inputs varies (a recurrent layer's, by its directions): a backward pass runs it once
    per application, or once per merged group on the stacked rows, when the first input's delta is
    asked for (see :class:`JointDeltas`). An op whose merged calls have vjps of their own
    (``Batching.vjps``) takes none."""

    def __init__(
        self,
        name: str,
        forward: Rule,
        vjps: tuple[Rule, ...],
        broadcasts: bool = False,
        passes: bool = False,
        saves: bool = False,
        cost: Callable[..., float] = elementwise_cost,
        check: Callable[..., None] | None = None,
        batch: Batching | None = None,
        *,
        check_values: Callable[..., None] | None = None,
        per_run: tuple[str, ...] = (),
        fresh: bool = False,
        own: bool = False,
        products: dict[int, Rule] | None = None,
        shape_rule: Rule | None = None,
        context: bool = False,
        joint_vjp: Rule | None = None,
    ) -> None:
        if context and batch is not None:
            raise ValueError(
                f"{name}: a primitive given the run's context does not merge (batch must be None)"
            )
        self.name = name
        self.number = kind_number(name)  # (the run's counts by kind)
        self.forward = forward
        self.vjps = vjps
        self.broadcasts = broadcasts
        self.passes = passes
        self.saves = saves
        self.cost = cost
        self.check = check
        self.check_values = check_values
        self.batch = batch
        self.per_run = per_run
        self.fresh = fresh
        self.own = own
        self.products = products or {}
        self.shape_rule = shape_rule
        self.context = context
        self.joint_vjp = joint_vjp
        if joint_vjp is not None and (vjps or (batch is not None and batch.vjps is not None)):
            raise ValueError(
                f"{name}: a joint vjp replaces the vjps, the merged calls' (Batching.vjps) too: give neither"
            )

    def __repr__(self) -> str:
        return f"Primitive({self.name})"

    def signature_items(self, key: list[Any], params: dict[str, Any]) -> bool:
        """Appends the static parameters (those that must be equal for two applications to merge, or
        for one's compiled program to replay for the other) to a signature's or a static graph's
        ``key`` flat: their number, then each name and value, a per-run one's ``value_key`` (a
        batch's signatures are compared once per ready row, and nested pairs cost more to compare
        than the values they hold). False where a value is unhashable: such calls do not merge
        (their values' ``==`` may not even be a truth value: an array's), and their programs are
        not kept."""
        key.append(len(params))
        if not params:
            return True
        per_run = self.per_run
        for name, value in params.items():
            key.append(name)
            if name in per_run:
                key.append(value_key(value))
                continue
            try:
                hash(value)
            except TypeError:
                return False
            key.append(value)
        return True

    def stack_params(self, calls: list[dict[str, Any]], base: dict[str, Any]) -> dict[str, Any]:
        """The parameters of merged calls (``calls``: each call's): ``base`` (the first call's,
        ``axis`` shifted past the rows), the per-row ones stacked as rows (None where the calls'
        are None), the other per-run ones listed (None where every call's is None)."""
        spec = self.batch
        assert spec is not None
        params = {**base}
        for name in spec.row_params:
            rows = [call[name] for call in calls]
            # None (an absent mask) keys apart from an array: merged calls' are all None or none
            params[name] = None if rows[0] is None else stack_arrays(rows)
        for name in self.per_run:
            if name not in spec.row_params:
                column = [call[name] for call in calls]
                params[name] = None if all(v is None for v in column) else column
        return params

    def run(
        self, datas: tuple[Any, ...], params: dict[str, Any], checked: bool, ctx: Any = None
    ) -> tuple[Any, Any, Any]:
        """This primitive applied to its inputs' data: the array namespace, the result, and what it
        saves for its vjps (the result itself if it saves nothing). ``checked``: run ``check`` (a
        program replayed for inputs of the same structure skips it; ``check_values`` always runs).
        ``ctx``: the run's context, given to the forward of a ``context`` primitive. Errors name the
        op and the shapes."""
        d0 = datas[0]
        xp = NUMPY if type(d0) is NDARRAY else namespace(*datas)
        if checked:
            if len(datas) > 1 and (xp is not NUMPY or not all(type(d) in _HOST for d in datas)):
                check_devices(self.name, datas)
            if self.check is not None:
                self.check(*datas, **params)
        if self.check_values is not None:
            self.check_values(*datas, **params)
        if self.context:
            if ctx is None:
                raise RuntimeError(f"{self.name}: run without a run context (the engine gives it one)")
            params = {**params, "ctx": ctx}  # (the forward's alone: checks and vjps take none)
        try:
            out = call_forward(self.forward, xp, datas, params)
        except ValueError as e:
            if isinstance(e, ShapeError) or not self.own:
                raise
            shapes = " and ".join(str(shape_of(d)) for d in datas)
            raise ShapeError(f"{self.name}: operands of shapes {shapes} do not fit: {e}") from e
        except ArithmeticError:  # a float divided by zero, or overflowing: an array gives inf or nan
            if xp is not FLOATS:
                raise
            out = as_float_arrays(self.forward, (), datas, params)
        saved: Any = None
        if self.saves:
            out, saved = out
        if type(out) is not NDARRAY:  # (the common case first: compiled, ``complex`` is looked up)
            if type(out) is complex:  # a negative float to a fractional power: an array gives nan
                out = as_float_arrays(self.forward, (), datas, params)
                if self.saves:
                    out, saved = out
            # NumPy turns 0-d results into scalars (np.float64): keep array data an array.
            elif isinstance(out, _GENERIC):
                out = np.asarray(out)
        return xp, out, saved if self.saves else out

    def delta(
        self,
        i: int,
        xp: Any,
        datas: tuple[Any, ...],
        saved: Any,
        delta: Any,
        params: dict[str, Any],
        dense: bool,
        exact: bool = False,
    ) -> Any:
        """The delta of input ``i`` of an application (inputs' data ``datas``; ``saved``: what it
        saved, or its result), given the result's ``delta``, dense (the backward pass makes a
        looked-up result's delta dense once for all its inputs). ``dense``: the input takes dense
        deltas only (not a ``SparseRows``). ``exact``: the input is a NumPy array of the result's
        shape, so a broadcasting op's delta for it needs no sum (known from an earlier run)."""
        rule = self.vjps[i]
        try:
            g = call_vjp(rule, xp, delta, saved, datas, params)
        except ArithmeticError:  # as in run: floats as arrays compute them
            if xp is not FLOATS:
                raise
            g = as_float_arrays(rule, (delta, saved), datas, params)
        if type(g) is not NDARRAY and type(g) is complex:
            g = as_float_arrays(rule, (delta, saved), datas, params)
        return self.finish_delta(i, xp, g, datas, dense, exact)

    def joint_deltas(
        self, xp: Any, datas: Sequence[Any], saved: Any, delta: Any, params: dict[str, Any]
    ) -> Sequence[Any]:
        """Every input's delta by the joint vjp (the op has one), as it gives them: each made an
        input's delta by :meth:`finish_delta` or :meth:`finish_merged`."""
        rule = self.joint_vjp
        assert rule is not None
        deltas: Sequence[Any] = call_vjp(rule, xp, delta, saved, datas, params)
        if len(deltas) != len(datas):
            raise ShapeError(f"{self.name}: the joint vjp gave {len(deltas)} deltas for {len(datas)} inputs")
        return deltas

    def finish_delta(self, i: int, xp: Any, g: Any, datas: tuple[Any, ...], dense: bool, exact: bool) -> Any:
        """Input ``i``'s delta ``g``, as a vjp gave it, made its delta (see :meth:`delta`): a user's
        checked, summed back where the op broadcasts, made dense where the input wants it."""
        if not self.own:  # a user's vjp: its result checked before anything adds it up
            check_delta(self.name, i, g, datas[i], self.broadcasts)
        if self.broadcasts and not exact:
            g = unbroadcast(xp, g, datas[i])
        elif dense and type(g) is SparseRows:
            g = g.to_dense(xp)
        return np.asarray(g) if type(g) is not NDARRAY and isinstance(g, _GENERIC) else g

    def merged_delta(
        self,
        i: int,
        rule: Rule,
        rows: int,
        shape: tuple[int, ...] | None,
        xp: Any,
        delta: Any,
        saved: Any,
        datas: list[Any],
        params: dict[str, Any],
    ) -> Any:
        """Input ``i``'s delta of merged calls, by ``rule`` on their stacked ``delta``: summed back to
        the input's (padded) shape (a shared input's over the group's ``rows``, where the op does
        not broadcast), and reshaped to ``shape`` (unpadded), a user's rule's result checked first."""
        return self.finish_merged(i, call_vjp(rule, xp, delta, saved, datas, params), rows, shape, xp, datas)

    def finish_merged(
        self, i: int, g: Any, rows: int, shape: tuple[int, ...] | None, xp: Any, datas: Sequence[Any]
    ) -> Any:
        """Input ``i``'s delta ``g`` of merged calls, as a vjp gave it, made its delta (see
        :meth:`merged_delta`)."""
        if not self.own:
            check_delta(self.name, i, g, datas[i], self.broadcasts, rows)
        if self.broadcasts:
            g = unbroadcast(xp, g, datas[i])
        elif rows and type(g) is not float and len(g.shape) > len(datas[i].shape):
            g = xp.sum(g, axis=0)
        if shape is not None:
            g = xp.reshape(g, shape)
        return g


class JointDeltas:
    """The deltas of one application (or merged group) of a primitive with a ``joint_vjp`` whose
    inputs' deltas are asked for on a pool's threads, one each: worked out once, by the first asked
    for, under a lock; the others wait and read theirs. :meth:`delta` and :meth:`merged_delta` are
    :meth:`Primitive.delta`'s and :meth:`Primitive.merged_delta`'s stand-ins in a backward pass
    (where one thread asks for them all, it works them out itself: ``Primitive.joint_deltas``)."""

    def __init__(self, prim: Primitive) -> None:
        self.prim = prim
        self.lock = threading.Lock()
        self.deltas: Sequence[Any] | None = None

    def delta(
        self,
        i: int,
        xp: Any,
        datas: tuple[Any, ...],
        saved: Any,
        delta: Any,
        params: dict[str, Any],
        dense: bool,
        exact: bool = False,
    ) -> Any:
        """Input ``i``'s delta, as :meth:`Primitive.delta` gives it."""
        return self.prim.finish_delta(
            i, xp, self.work_out(xp, datas, saved, delta, params)[i], datas, dense, exact
        )

    def merged_delta(
        self,
        i: int,
        rule: Rule | None,
        rows: int,
        shape: tuple[int, ...] | None,
        xp: Any,
        delta: Any,
        saved: Any,
        datas: list[Any],
        params: dict[str, Any],
    ) -> Any:
        """Input ``i``'s delta of merged calls, as :meth:`Primitive.merged_delta` gives it (``rule``:
        unused, the joint vjp's part for input ``i``)."""
        g = self.work_out(xp, datas, saved, delta, params)[i]
        return self.prim.finish_merged(i, g, rows, shape, xp, datas)

    def work_out(
        self, xp: Any, datas: Sequence[Any], saved: Any, delta: Any, params: dict[str, Any]
    ) -> Sequence[Any]:
        """Every input's delta: the joint vjp's, run by the first caller."""
        deltas = self.deltas
        if deltas is None:
            with self.lock:
                deltas = self.deltas
                if deltas is None:
                    deltas = self.deltas = self.prim.joint_deltas(xp, datas, saved, delta, params)
        return deltas


def call_forward(rule: Rule, xp: Any, inputs: Sequence[Any], params: dict[str, Any]) -> Any:
    """``rule(xp, *inputs, **params)``. Written out for up to five inputs and no parameters (most
    ops; a recurrent cell's rule takes four or five), and for up to three and an ``axis`` alone (a
    cell's ``[x; h]``): compiled, the general call builds a list, a tuple and a dict on every
    kernel, and a tuple's items are read directly where a sequence's are read by a call each."""
    if not params:
        args = inputs if isinstance(inputs, tuple) else tuple(inputs)
        n = len(args)
        if n == 1:
            return rule(xp, args[0])
        if n == 2:
            return rule(xp, args[0], args[1])
        if n == 3:
            return rule(xp, args[0], args[1], args[2])
        if n == 4:
            return rule(xp, args[0], args[1], args[2], args[3])
        if n == 5:
            return rule(xp, args[0], args[1], args[2], args[3], args[4])
    elif len(params) == 1 and "axis" in params:  # (concatenate's, a reduction's: by its name)
        axis = params["axis"]
        args = inputs if isinstance(inputs, tuple) else tuple(inputs)
        n = len(args)
        if n == 1:
            return rule(xp, args[0], axis=axis)
        if n == 2:
            return rule(xp, args[0], args[1], axis=axis)
        if n == 3:
            return rule(xp, args[0], args[1], args[2], axis=axis)
    return rule(xp, *inputs, **params)


def call_vjp(
    rule: Rule, xp: Any, delta: Any, saved: Any, inputs: Sequence[Any], params: dict[str, Any]
) -> Any:
    """``rule(xp, delta, saved, *inputs, **params)``, written out as ``call_forward``."""
    if not params:
        args = inputs if isinstance(inputs, tuple) else tuple(inputs)
        n = len(args)
        if n == 1:
            return rule(xp, delta, saved, args[0])
        if n == 2:
            return rule(xp, delta, saved, args[0], args[1])
        if n == 3:
            return rule(xp, delta, saved, args[0], args[1], args[2])
        if n == 4:
            return rule(xp, delta, saved, args[0], args[1], args[2], args[3])
        if n == 5:
            return rule(xp, delta, saved, args[0], args[1], args[2], args[3], args[4])
    elif len(params) == 1 and "axis" in params:
        axis = params["axis"]
        args = inputs if isinstance(inputs, tuple) else tuple(inputs)
        n = len(args)
        if n == 1:
            return rule(xp, delta, saved, args[0], axis=axis)
        if n == 2:
            return rule(xp, delta, saved, args[0], args[1], axis=axis)
        if n == 3:
            return rule(xp, delta, saved, args[0], args[1], args[2], axis=axis)
    return rule(xp, delta, saved, *inputs, **params)


def check_delta(name: str, i: int, delta: Any, like: Any, broadcasts: bool, rows: int = 0) -> None:
    """Raises a ShapeError naming op ``name`` and its input ``i`` unless ``delta`` (a vjp's result)
    can be that input's delta: a float for a float input; for an array, a floating-point array (or
    sparse rows) of the input's shape, or, for an op that ``broadcasts`` (its deltas are summed
    back), one that broadcasts to it; ``rows``: a shared input of merged calls, whose delta may also
    have a leading axis of that many rows. The library's own vjps are checked against finite
    differences by its tests instead."""
    what = _delta_problem(delta, like, broadcasts, rows)
    if what is not None:
        raise ShapeError(f"{name}: the vjp of input {i} gave {what}, not a delta of {shape_of(like)}")


def _delta_problem(delta: Any, like: Any, broadcasts: bool, rows: int) -> str | None:
    if delta is None:
        return "None"
    if type(like) is float:
        if type(delta) is float or (getattr(delta, "shape", None) == () and is_float_array(delta)):
            return None
        if broadcasts and is_float_array(delta):
            return None  # summed to a float
        return f"a {type(delta).__name__} of shape {shape_of(delta)}"
    if type(delta) is float:
        return None if broadcasts else "a float"
    if type(delta) is SparseRows:
        return None if tuple(delta.shape) == tuple(like.shape) else f"sparse rows of shape {delta.shape}"
    if not is_float_array(delta):
        dtype = getattr(delta, "dtype", None)
        return f"a {type(delta).__name__}" + ("" if dtype is None else f" of dtype {dtype}")
    shape, wanted = tuple(delta.shape), tuple(like.shape)
    if shape == wanted or (rows and shape == (rows, *wanted)):
        return None
    lead = len(shape) - len(wanted)
    if broadcasts and lead >= 0 and all(w in (1, s) for w, s in zip(wanted, shape[lead:], strict=True)):
        return None
    return f"an array of shape {shape}"


def value_key(value: Any) -> Hashable:
    """A value's part of a signature or a program's structure: ``float`` for a Python float, else
    its type, shape and dtype (for an array; its type alone for anything else)."""
    kind = type(value)
    if kind is float:
        return float
    if kind is NDARRAY:
        return (kind, value.shape, value.dtype)
    if kind is tuple or kind is int or kind is str or value is None:  # (no failed attribute lookup)
        return (kind,)
    shape = getattr(value, "shape", None)
    if shape is None:
        return (kind,)
    return (kind, tuple(shape), value.dtype)


def float_key(x: float) -> Hashable:
    """A float's part of a signature, where calls merge only on equal floats (a shared constant, a
    static argument): the float itself, but 0.0 and -0.0, equal in Python, kept apart
    (``2.0 * -0.0`` is ``-0.0``, and NumPy's ``1 / -0.0`` is ``-inf``: merged, one call would get
    the other's). A NaN keys as itself: calls given different NaN objects do not merge."""
    return x if x else (x, math.copysign(1.0, x))


_HOST: Final = (NDARRAY, float)
"""The types of data that live on the host: NumPy's arrays and Python's floats."""


def check_devices(name: str, datas: tuple[Any, ...]) -> None:
    """Raises a ValueError naming the op if its operands live on different devices."""
    devices = {str(device_of(d)) for d in datas if type(d) is not float}
    if len(devices) > 1:
        raise ValueError(f"{name}: operands live on different devices: {', '.join(sorted(devices))}")


def as_float_arrays(
    rule: Rule, first: tuple[Any, ...], datas: tuple[Any, ...], params: dict[str, Any]
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


# ------------------------------------------------------------------------------ the engine's sums


def _sum_forward(xp: Any, *xs: Any) -> Any:
    total = xs[0]
    for x in xs[1:]:
        total = total + x  # left to right, as the chain of additions it replaces
    return total


def _identity_vjp(xp: Any, d: Any, o: Any, *xs: Any) -> Any:
    return d


_sums: Final[dict[int, Primitive]] = {}


def add_n(n: int) -> Primitive:
    """The sum of ``n`` operands (one primitive per arity): one op for a long sum, such as a loss
    summed over the nodes of a tree, instead of a chain of ``n - 1`` additions that must run one
    after another. Rows of merged groups among its operands are summed as gathered arrays."""
    prim = _sums.get(n)
    if prim is None:
        prim = _sums[n] = Primitive(
            "add_n",
            _sum_forward,
            (_identity_vjp,) * n,
            broadcasts=True,
            passes=True,
            batch=Batching(elementwise=True, scalar="inputs", sums_rows=True),
            fresh=True,
            own=True,
        )
    return prim


def _sum_rows_forward(xp: Any, x: Any, scalar: bool) -> Any:
    return float(xp.sum(x)) if scalar else xp.sum(x, axis=0)


def _sum_rows_vjp(xp: Any, d: Any, o: Any, x: Any, scalar: bool) -> Any:
    return xp.broadcast_to(xp.asarray(d, dtype=x.dtype, **on_device(xp, x)), x.shape)


ROWS_SUM: Final = Primitive("add_n", _sum_rows_forward, (_sum_rows_vjp,), fresh=True, own=True)
"""The sum of a gathered array's rows (a float for a vector of floats): an ``add_n`` of rows."""
