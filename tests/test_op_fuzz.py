"""Every public op, on operands of every kind, random shapes and random static parameters: it
works, or it fails with an error that names it.

Each case makes the op (the call a user writes), runs its forward (``predict_blocking``) and a
step on it (its gradients, or a training step, on the result or on its sum), the op alone or two
of its calls merged. Whatever fails must fail with a ``ShapeError``, ``TypeError`` or
``ValueError`` whose message begins with the op's name (the public name the user called: ``dot``,
not the ``matmul`` it computes), raised where the op is made or returned as the ``Failure`` of the
run: never an ``AttributeError`` of a float that has no ``shape``, a ``KeyError``, or NumPy's own
error that says nothing of the op. A loss or a gradient that is not finite (the values include
infinities and NaN) is the step's documented ``NonFiniteLossError`` or ``NonFiniteGradientError``.

``MONADL_FUZZ_EXAMPLES=20000`` runs that many cases over all the ops, drawn at random instead of
the fixed ones CI runs.
"""

from __future__ import annotations

import inspect
import math
import operator
import os
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from returns.pipeline import is_successful

import monadl
from monadl import (
    ArrayLayer,
    ArrayWeight,
    FloatLayer,
    FloatWeight,
    NonFiniteGradientError,
    NonFiniteLossError,
)
from monadl.dsl.ops import elementwise, linalg, shape
from monadl.typeclasses.backend import is_array

# ---------------------------------------------------------------------------------------- operands


class Witness:
    """A user's own differentiable value (a ``DeepLearning``): its kind shows only when it runs."""

    def __init__(self, forward: Any) -> None:
        self.forward = forward


# Operand kinds: what the ops take, and what they must refuse clearly. Arrays, weights and layers
# come first and more than once: drawn more often, they reach the checks that run with the op.
ARRAY_KINDS = ("array", "array weight", "array layer")
FLOAT_KINDS = ("float", "float weight", "float layer")
KINDS = (
    *ARRAY_KINDS,
    *ARRAY_KINDS,
    *FLOAT_KINDS,
    "array witness",
    "float witness",
    "int",
    "bool",
    "None",
    "str",
    "list",
    "float64 scalar",
    "float32 scalar",
)
# float64 first: the dtype most cases have; the others must be refused (or, float32, work).
DTYPES: tuple[type[Any], ...] = (np.float64, np.float64, np.float32, np.int64, np.bool_, np.complex128)
SIDES = st.integers(0, 3)
SHAPES = st.lists(SIDES, max_size=3).map(tuple)
ROWS = st.lists(st.integers(1, 3), min_size=1, max_size=3).map(tuple)
"""Shapes of at least one axis and one element: a class axis of logits, rows of a table."""
SPECIAL = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e308, -1e308, 1e-310])


def _values(rng: np.random.Generator, shape: tuple[int, ...], dtype: type[Any], special: bool) -> Any:
    """Values of ``shape`` and ``dtype``: small normal ones, or zeros, infinities, NaN and extremes."""
    if special:
        values = rng.choice(SPECIAL, size=shape)
    else:
        values = rng.normal(size=shape) * 2.0
    if dtype is np.complex128:
        return values + 1j * rng.normal(size=shape)
    with np.errstate(all="ignore"):  # inf and NaN as integers: whatever NumPy makes of them
        return np.asarray(values).astype(dtype)


@st.composite
def operands(
    draw: st.DrawFn,
    like: tuple[int, ...] | None = None,
    kinds: Sequence[str] = KINDS,
    fit: bool = False,
    shapes: st.SearchStrategy[tuple[int, ...]] = SHAPES,
) -> tuple[Any, tuple[int, ...]]:
    """An operand of one of ``kinds``, and its shape: ``like``'s half of the time (operands that
    fit reach further than shapes drawn apart), else one of ``shapes``. ``fit``: an array operand
    (of ``kinds``), of a floating-point dtype and ``like``'s shape, that the op should take."""
    kind = draw(st.sampled_from([k for k in kinds if k in ARRAY_KINDS] if fit else kinds))
    shape: tuple[int, ...] = like if like is not None and (fit or draw(st.booleans())) else draw(shapes)
    special = draw(st.integers(0, 7)) == 7
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    floating = np.float64 if draw(st.integers(0, 3)) else np.float32
    scalar = draw(
        st.floats(allow_nan=True, allow_infinity=True, allow_subnormal=False)
        if special
        else st.floats(-3.0, 3.0, allow_subnormal=False)
    )
    value: Any
    if kind == "array":
        value = _values(rng, shape, floating if fit else draw(st.sampled_from(DTYPES)), special)
    elif kind == "array weight":
        value = ArrayWeight(_values(rng, shape, floating, special))
    elif kind == "array layer":
        value = ArrayWeight(_values(rng, shape, floating, special)) * 1.0
    elif kind == "array witness":
        value = Witness(ArrayWeight(_values(rng, shape, floating, special)).forward)
    elif kind == "float":
        value, shape = scalar, ()
    elif kind == "float weight":
        value, shape = FloatWeight(scalar), ()
    elif kind == "float layer":
        value, shape = FloatWeight(scalar) * 1.0, ()
    elif kind == "float witness":
        value, shape = Witness(FloatWeight(scalar).forward), ()
    elif kind == "int":
        value, shape = draw(st.integers(-3, 3)), ()
    elif kind == "bool":
        value, shape = draw(st.booleans()), ()
    elif kind == "None":
        value = None
    elif kind == "str":
        value = draw(st.sampled_from(["", "a", "1.0"]))
    elif kind == "list":
        value = [float(v) for v in rng.normal(size=shape[0] if shape else 2)]
    elif kind == "float64 scalar":
        value, shape = np.float64(scalar), ()
    else:
        assert kind == "float32 scalar", kind
        with np.errstate(all="ignore"):
            value, shape = np.float32(scalar), ()
    note(f"operand: {kind} of shape {shape}")  # in the report of a failing case
    return value, shape


def _axes(ndim: int, fit: bool = False) -> st.SearchStrategy[Any]:
    """An ``axis``: in range, out of range or negative, a tuple of them (repeats included), or not
    an axis at all; ``fit``: one in range."""
    if fit:
        return st.integers(-ndim, ndim - 1) if ndim else st.just(0)
    one = st.integers(-ndim - 2, ndim + 1)
    return st.one_of(
        one,
        st.lists(one, max_size=3).map(tuple),
        st.sampled_from([None, 1.0, "0", True, [0], (0.5,), np.int64(0), np.bool_(False)]),
    )


def _indices(rows: int, fit: bool = False) -> st.SearchStrategy[Any]:
    """Row indices: in range or not (negative, past the end), of any integer array's shape, or of
    the wrong kind (floats, bools, weights, None); ``fit``: integers in range."""
    if fit:
        row = st.integers(0, max(rows - 1, 0))
        return st.one_of(
            row,
            st.lists(row, max_size=4),
            hnp.arrays(
                np.int64, hnp.array_shapes(min_dims=0, max_dims=2, min_side=0, max_side=3), elements=row
            ),
        )
    index = st.integers(-rows - 2, rows + 2)
    integer_arrays = st.tuples(
        st.lists(SIDES, max_size=2).map(tuple), st.sampled_from([np.int64, np.int32, np.uint8, np.uint64])
    ).flatmap(
        lambda shape_dtype: st.lists(
            st.integers(0 if shape_dtype[1] in (np.uint8, np.uint64) else -rows - 2, rows + 2),
            min_size=math.prod(shape_dtype[0]),
            max_size=math.prod(shape_dtype[0]),
        ).map(lambda v: np.array(v, dtype=shape_dtype[1]).reshape(shape_dtype[0]))
    )
    return st.one_of(
        index,
        st.lists(index, max_size=4),
        integer_arrays,
        st.sampled_from(
            [
                0.5,
                1.0,
                True,
                None,
                "0",
                [0.0, 1.0],
                [],
                (0, 1),
                np.int64(0),
                np.float64(0.0),
                np.array([0.0, 1.0]),
                np.array([True, False]),
                2**70,
                slice(0, 1),
            ]
        ),
        st.builds(FloatWeight, st.just(0.0)),
    )


def _shape_for(shape: tuple[int, ...]) -> st.SearchStrategy[Any]:
    """A ``shape`` for ``reshape``: of the operand's size (one side maybe -1) or not, with negative
    sides, or not a shape at all."""
    size = math.prod(shape)
    fitting = st.permutations([*shape, 1]).map(tuple)
    unknown = fitting.map(lambda s: (-1, *s[1:]))
    return st.one_of(
        fitting,
        unknown,
        st.lists(st.integers(-2, 4), max_size=4).map(tuple),
        st.just((size,)),
        st.sampled_from([12, "ab", None, [2.0], (1.5,), (True,), (-1, -1)]),
    )


def _permutation(ndim: int) -> st.SearchStrategy[Any]:
    """``axes`` for ``transpose``: a permutation (negatives included), anything else, or None."""
    return st.one_of(
        st.none(),
        st.permutations(range(ndim)).map(tuple),
        st.permutations(range(-ndim, 0)).map(tuple),
        st.lists(st.integers(-ndim - 1, ndim + 1), max_size=4).map(tuple),
        st.sampled_from(["01", 1, [0.0], (None,)]),
    )


def _targets(logits_shape: tuple[int, ...], fit: bool = False) -> st.SearchStrategy[Any]:
    """Targets of ``cross_entropy``: probabilities of the logits' shape, integer labels of its rows'
    shape (in range or not), arrays of other shapes and dtypes, or no array at all; ``fit``:
    labels in range or probabilities."""
    rows = logits_shape[:-1]
    classes = logits_shape[-1] if logits_shape else 1
    labels = st.lists(
        st.integers(0, classes - 1) if fit else st.integers(-1, classes),
        min_size=math.prod(rows),
        max_size=math.prod(rows),
    ).map(lambda v: np.array(v, dtype=np.int64).reshape(rows))
    probabilities = st.integers(0, 2**16).map(
        lambda seed: np.random.default_rng(seed).dirichlet(np.ones(max(classes, 1)), size=rows)[..., :classes]
    )
    if fit:
        return st.one_of(labels, probabilities)
    return st.one_of(
        labels,
        probabilities,
        operands(kinds=("array",)).map(lambda operand: operand[0]),
        st.sampled_from([[0, 1], 0, 0.5, None, np.array(1, dtype=np.int64)]),
    )


# --------------------------------------------------------------------------------------- the cases


@dataclass(frozen=True)
class Case:
    """An op applied to drawn operands and parameters: ``build()`` makes it (again, on the same
    operands, for a merged pair); its errors must name ``name``. ``witness``: an operand is a
    user's own value, of a kind known only when it runs (so the layer made may be an ArrayLayer
    of a float)."""

    name: str
    build: Callable[[], Any]
    witness: bool


Draw = Callable[[st.DataObject], Case]


def _call(name: str, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Case:
    flat = [y for x in args for y in (x if isinstance(x, (list, tuple)) else (x,))]
    return Case(name, lambda: function(*args, **kwargs), any(isinstance(x, Witness) for x in flat))


def _unary(name: str) -> Draw:
    op = getattr(monadl, name)
    return lambda data: _call(name, op, data.draw(operands())[0])


# Each case draws ``fit`` first: half the cases have operands and parameters the op should take
# (array operands of shapes that fit, axes and indices in range), so that they reach the op's run
# and its vjps; the other half, anything.


def _binary(name: str) -> Draw:
    op = getattr(monadl, name)

    def draw(data: st.DataObject) -> Case:
        fit = data.draw(st.booleans())
        a, shape = data.draw(operands(fit=fit))
        b, _ = data.draw(operands(like=shape, fit=fit))
        return _call(name, op, a, b)

    return draw


def _matrix_pair(name: str, op: Callable[[Any, Any], Any]) -> Draw:
    """``op(a, b)`` of a matrix product: ``b``'s first or next-to-last side is often ``a``'s last."""

    def draw(data: st.DataObject) -> Case:
        fit = data.draw(st.booleans())
        a, shape = data.draw(operands(fit=fit, shapes=ROWS if fit else SHAPES))
        k = shape[-1] if shape else 1
        b_shape = data.draw(st.sampled_from([(k,), (k, 2), (2, k, 3)]))
        b, _ = data.draw(operands(like=b_shape, fit=fit))
        return _call(name, op, a, b)

    return draw


def _linear(data: st.DataObject) -> Case:
    fit = data.draw(st.booleans())
    x, shape = data.draw(operands(fit=fit, shapes=ROWS if fit else SHAPES))
    k = shape[-1] if shape else 1
    w, w_shape = data.draw(operands(like=(k, 2), fit=fit))
    b_shape = data.draw(st.sampled_from([w_shape[1:], ()]))
    b, _ = data.draw(operands(like=b_shape, fit=fit))
    return _call("linear", monadl.linear, x, w, b)


def _reduction(name: str) -> Draw:
    op = getattr(monadl, name)

    def draw(data: st.DataObject) -> Case:
        fit = data.draw(st.booleans())
        x, shape = data.draw(operands(fit=fit))
        kwargs: dict[str, Any] = {}
        if data.draw(st.booleans()):
            kwargs["axis"] = data.draw(_axes(len(shape), fit and bool(shape)))
        if data.draw(st.booleans()):
            keepdims = [False, True, np.bool_(True)] if fit else [False, True, 1, None, np.bool_(True)]
            kwargs["keepdims"] = data.draw(st.sampled_from(keepdims))
        return _call(name, op, x, **kwargs)

    return draw


def _softmax(name: str) -> Draw:
    op = getattr(monadl, name)

    def draw(data: st.DataObject) -> Case:
        fit = data.draw(st.booleans())
        x, shape = data.draw(operands(fit=fit, shapes=ROWS if fit else SHAPES))
        if data.draw(st.booleans()):
            return _call(name, op, x)
        return _call(name, op, x, axis=data.draw(_axes(len(shape), fit)))

    return draw


def _sequence(data: st.DataObject, fit: bool) -> tuple[list[Any] | Any, tuple[int, ...]]:
    """The operands of ``add_n`` or ``concatenate``, and the first one's shape: a list (or a tuple)
    of one to four operands of related shapes (sometimes none), or one operand where the list
    should be."""
    if not fit and data.draw(st.integers(0, 7)) == 0:
        return data.draw(operands())
    first, shape = data.draw(operands(fit=fit, shapes=ROWS if fit else SHAPES))
    xs = [first]
    for _ in range(data.draw(st.integers(0, 3))):
        related = shape if not shape or data.draw(st.booleans()) else (data.draw(SIDES), *shape[1:])
        xs.append(data.draw(operands(like=related, fit=fit))[0])
    if not fit and data.draw(st.integers(0, 7)) == 0:
        xs = xs[:0]
    return (tuple(xs) if data.draw(st.booleans()) else xs), shape


def _add_n(data: st.DataObject) -> Case:
    return _call("add_n", monadl.add_n, _sequence(data, data.draw(st.booleans()))[0])


def _concatenate(data: st.DataObject) -> Case:
    fit = data.draw(st.booleans())
    xs, shape = _sequence(data, fit)
    if data.draw(st.booleans()):
        return _call("concatenate", monadl.concatenate, xs)
    return _call("concatenate", monadl.concatenate, xs, axis=data.draw(_axes(len(shape), fit)))


def _reshape(data: st.DataObject) -> Case:
    x, shape = data.draw(operands(fit=data.draw(st.booleans())))
    return _call("reshape", monadl.reshape, x, data.draw(_shape_for(shape)))


def _transpose(data: st.DataObject) -> Case:
    x, shape = data.draw(operands(fit=data.draw(st.booleans())))
    axes = data.draw(_permutation(len(shape)))
    if axes is None and data.draw(st.booleans()):
        return _call("transpose", monadl.transpose, x)
    return _call("transpose", monadl.transpose, x, axes)


def _take_rows(data: st.DataObject) -> Case:
    fit = data.draw(st.booleans())
    table, shape = data.draw(operands(fit=fit, shapes=ROWS if fit else SHAPES))
    return _call("take_rows", monadl.take_rows, table, data.draw(_indices(shape[0] if shape else 1, fit)))


def _sections(length: int, fit: bool) -> st.SearchStrategy[Any]:
    """``sections_or_indices`` of ``split`` for an axis of ``length``: a number of sections that
    divides it, or indices (unsorted, negative, past the end); or anything, sections that do not
    divide it and no sections at all included."""
    divisors = [k for k in range(1, max(length, 1) + 1) if length % k == 0]
    indices = st.lists(st.integers(-length - 1, length + 1), max_size=3)
    if fit:
        return st.one_of(st.sampled_from(divisors), indices, indices.map(tuple))
    return st.one_of(
        st.integers(-1, 4),
        indices,
        st.sampled_from([1.5, None, "2", True, (1.0,), [True], np.int64(2), np.array([1, 2]), np.ones(2)]),
    )


def _split(data: st.DataObject) -> Case:
    fit = data.draw(st.booleans())
    x, shape = data.draw(operands(fit=fit, shapes=ROWS if fit else SHAPES))
    axis = data.draw(_axes(len(shape), fit))
    length = shape[axis] if type(axis) is int and -len(shape) <= axis < len(shape) else 2
    sections = data.draw(_sections(length, fit))
    piece = data.draw(st.integers(0, 3))  # the piece returned (the last, if there are fewer)

    def build() -> ArrayLayer:
        pieces = monadl.split(x, sections, axis=axis)
        return pieces[min(piece, len(pieces) - 1)]

    return Case("split", build, isinstance(x, Witness))


def _stack(data: st.DataObject) -> Case:
    fit = data.draw(st.booleans())
    if not fit and data.draw(st.integers(0, 7)) == 0:  # one operand where the list should be
        return _call("stack", monadl.stack, data.draw(operands())[0])
    first, shape = data.draw(operands(fit=fit))
    xs = [first]
    for _ in range(data.draw(st.integers(0 if fit else -1, 3))):
        xs.append(data.draw(operands(like=shape, fit=fit))[0])
    if len(xs) == 1 and not fit and data.draw(st.booleans()):
        xs = []
    axis = data.draw(_axes(len(shape) + 1, fit))
    return _call("stack", monadl.stack, tuple(xs) if data.draw(st.booleans()) else xs, axis=axis)


def _cross_entropy(data: st.DataObject) -> Case:
    fit = data.draw(st.booleans())
    logits, shape = data.draw(operands(fit=fit, shapes=ROWS if fit else SHAPES))
    return _call("cross_entropy", monadl.cross_entropy, logits, data.draw(_targets(shape, fit)))


# The ops this fuzz covers (checked below): those of the elementwise, shape and linear algebra
# families, and :data:`OTHERS` (the other families' ops have their rows in test_bad_input_table).
OPS: dict[str, Draw] = {
    "abs": _unary("abs"),
    "add_n": _add_n,
    "concatenate": _concatenate,
    "cross_entropy": _cross_entropy,
    "dot": _matrix_pair("dot", monadl.dot),
    "exp": _unary("exp"),
    "lift": _unary("lift"),
    "lift_array": _unary("lift_array"),
    "lift_float": _unary("lift_float"),
    "linear": _linear,
    "log": _unary("log"),
    "log_softmax": _softmax("log_softmax"),
    "matmul": _matrix_pair("matmul", monadl.matmul),
    "maximum": _binary("maximum"),
    "mean": _reduction("mean"),
    "minimum": _binary("minimum"),
    "relu": _unary("relu"),
    "reshape": _reshape,
    "sigmoid": _unary("sigmoid"),
    "softmax": _softmax("softmax"),
    "split": _split,
    "sqrt": _unary("sqrt"),
    "stack": _stack,
    "sum": _reduction("sum"),
    "take_rows": _take_rows,
    "tanh": _unary("tanh"),
    "transpose": _transpose,
}

OURS = ("array weight", "array layer", "float weight", "float layer")
"""Kinds whose operators are the library's (a weight or a layer): one side of an operator is one."""


def _operator(name: str, function: Callable[[Any, Any], Any]) -> Draw:
    """``a <op> b`` with a weight or a layer on a random side (the other side anything)."""

    def draw(data: st.DataObject) -> Case:
        ours, shape = data.draw(operands(kinds=OURS))
        other, _ = data.draw(operands(like=shape))
        if data.draw(st.booleans()):
            return _call(name, function, ours, other)
        return _call(name, function, other, ours)

    return draw


def _matmul_operator(data: st.DataObject) -> Case:
    """``a @ b`` with an array weight or layer on a random side."""
    fit = data.draw(st.booleans())
    ours_first = data.draw(st.booleans())
    first_kinds = ("array weight", "array layer") if ours_first else KINDS
    a, shape = data.draw(operands(kinds=first_kinds, fit=fit, shapes=ROWS if fit else SHAPES))
    k = shape[-1] if shape else 1
    b_shape = data.draw(st.sampled_from([(k,), (k, 2), (2, k, 3)]))
    second_kinds = KINDS if ours_first else ("array weight", "array layer")
    b, _ = data.draw(operands(like=b_shape, kinds=second_kinds, fit=fit))
    return _call("matmul", operator.matmul, a, b)


def _basic_index(shape: tuple[int, ...], fit: bool) -> st.SearchStrategy[Any]:
    """A key of basic indexing (``x[:, 1:3]``, ``x[..., -1]``, ``x[None]``): ints in range or
    not, slices of any bounds and steps, None, one ``...`` or two; ``fit``: one that fits ``shape``
    (ints in range, no more than its axes, steps not 0)."""
    bound = st.one_of(st.none(), st.integers(-5, 5))
    step = st.sampled_from([None, 1, 2, -1, -2] if fit else [None, 1, -1, 3, 0, 1.5, np.int64(2)])
    slices = st.builds(slice, bound, bound, step)
    if fit:
        entries = [st.one_of(slices, st.integers(-n, n - 1) if n else slices, st.none()) for n in shape]
        key = st.tuples(*entries).flatmap(
            lambda es: st.integers(0, len(es)).map(lambda k: (*es[:k], Ellipsis, *es[k:])) | st.just(es)
        )
        return st.one_of(key, slices, st.just(Ellipsis))
    bad = st.sampled_from([1.5, "a", True, [0], np.array([0]), np.float64(1.0)])
    entry = st.one_of(st.integers(-4, 4), slices, st.none(), st.just(Ellipsis), bad)
    return st.one_of(
        st.one_of(slices, st.just(Ellipsis)),
        st.lists(entry, max_size=5).map(tuple),
        st.tuples(st.lists(entry, max_size=3), bad).map(
            lambda entries_bad: (*entries_bad[0], entries_bad[1])
        ),
    )


def _index_name(key: Any) -> str:
    """The op ``layer[key]`` is: ``take_rows`` (rows: an int of 0 or more, a list, an array; and
    anything else, None alone included), or ``getitem`` (basic indexing: a tuple, a slice, ...,
    a negative int)."""
    if isinstance(key, (tuple, slice)) or key is Ellipsis:
        return "getitem"
    integer = isinstance(key, (int, np.integer)) and not isinstance(key, (bool, np.bool_))
    return "getitem" if integer and key < 0 else "take_rows"


def _indexing(data: st.DataObject) -> Case:
    # Only array layers and weights can be indexed: mypy rejects ``float_layer[0]`` (the typing
    # snippet float_layer_indexed), and Python reports it as "not subscriptable".
    fit = data.draw(st.booleans())
    table, shape = data.draw(operands(kinds=("array weight", "array layer"), shapes=ROWS if fit else SHAPES))
    if data.draw(st.booleans()):
        key = data.draw(_basic_index(shape, fit))
    else:
        key = data.draw(_indices(shape[0] if shape else 1, fit))
    return _call(_index_name(key), operator.getitem, table, key)


# The operators of layers and weights, named by their ops.
OPERATORS: dict[str, Draw] = {
    "+": _operator("add", operator.add),
    "-": _operator("sub", operator.sub),
    "*": _operator("mul", operator.mul),
    "/": _operator("div", operator.truediv),
    "**": _operator("pow", operator.pow),
    "@": _matmul_operator,
    "-x": lambda data: _call("neg", operator.neg, data.draw(operands(kinds=OURS))[0]),
    "[]": _indexing,
}

# --------------------------------------------------------------------------------------- outcomes

CLEAR = (TypeError, ValueError, IndexError)  # ShapeError is a ValueError; IndexError, if named
EXECUTORS = {batching: monadl.Executor(batching=batching) for batching in (False, True)}


class BadError(AssertionError):
    """An op failed with an error that does not name it, or of a kind it must not raise."""


def _clear(name: str, error: BaseException, where: str) -> str:
    """The kind of a clear error of op ``name`` (its type's name); a BadError for any other."""
    message = str(error)
    if isinstance(error, (NonFiniteLossError, NonFiniteGradientError)):  # the step's own checks
        return type(error).__name__
    if isinstance(error, CLEAR) and message.startswith(f"{name}:"):  # NumPy's never begin so
        return type(error).__name__
    raise BadError(f"{name}, {where}: {type(error).__module__}.{type(error).__qualname__}: {message}") from (
        error if isinstance(error, Exception) else None
    )


def outcome(case: Case, merged: bool, train: bool, batching: bool) -> str:
    """Makes ``case``'s op (twice, and their sum, if ``merged``), runs it and a step on it: "ok",
    or the type of the clear error it failed with. Raises BadError for an error that is not."""
    executor = EXECUTORS[batching]
    with np.errstate(all="ignore"), warnings.catch_warnings():
        # NumPy's floating-point warnings are IEEE's inf and NaN; any other warning is a bug.
        warnings.simplefilter("error")
        try:
            layer = case.build()
            if merged:  # the same op twice, ready together: their calls merge (when batching)
                layer = layer + case.build()
        except Exception as error:  # noqa: BLE001 - every error is judged
            return _clear(case.name, error, "made")
        if not isinstance(layer, (FloatLayer, ArrayLayer)):
            raise BadError(f"{case.name} made a {type(layer).__name__}, not a layer")
        result = layer.predict_blocking(executor=executor)
        if not is_successful(result):
            return _clear(case.name, result.failure(), "forward")
        value = result.unwrap()
        if isinstance(layer, FloatLayer) and type(value) is not float:
            raise BadError(f"{case.name}: a FloatLayer's value is a {type(value).__name__}")
        if isinstance(layer, ArrayLayer) and not is_array(value) and not case.witness:
            raise BadError(f"{case.name}: an ArrayLayer's value is a {type(value).__name__}")
        if isinstance(layer, FloatLayer):
            loss = layer
        elif type(value) is float:  # an op of a user's float value, made as an array (see Case)
            loss = FloatLayer(layer.forward)  # type: ignore[arg-type]
        else:
            loss = monadl.sum(layer)
        if train:
            step = loss.train_blocking(monadl.SGD(0.01), executor=executor)
            if not is_successful(step):
                return _clear(case.name, step.failure(), "training step")
        else:
            try:
                monadl.compute_gradients(loss, executor=executor)
            except Exception as error:  # noqa: BLE001 - every error is judged
                return _clear(case.name, error, "gradients")
    return "ok"


# ------------------------------------------------------------------------------------------ tests

FUZZ = {**OPS, **OPERATORS}
EXAMPLES = int(os.environ.get("MONADL_FUZZ_EXAMPLES", "0"))
"""Examples over all the ops for an exploratory run (random ones); 0: CI's fixed ones."""
FUZZ_SETTINGS = settings(
    max_examples=max(EXAMPLES // len(FUZZ), 1) if EXAMPLES else 100,
    deadline=None,
    derandomize=not EXAMPLES,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)


OTHERS = {"cross_entropy", "log_softmax", "mean", "relu", "sigmoid", "softmax", "sum", "take_rows", "tanh"}
"""The ops of other families this fuzz covers."""


def test_the_fuzz_covers_every_public_op() -> None:
    # The families' ops are exported, and each has an entry here: a new op without one fails.
    covered = set(elementwise.__all__) | set(shape.__all__) | set(linalg.__all__)
    families = {m.__name__ for m in (elementwise, shape, linalg)}
    exported = {
        name for name in monadl.__all__ if getattr(getattr(monadl, name), "__module__", None) in families
    }
    assert exported == covered, exported ^ covered
    assert set(OPS) == covered | OTHERS, set(OPS) ^ (covered | OTHERS)
    assert all(inspect.isfunction(getattr(monadl, name)) for name in OPS)


@pytest.mark.parametrize("name", sorted(FUZZ))
@FUZZ_SETTINGS
@given(data=st.data(), merged=st.booleans(), train=st.booleans(), batching=st.booleans())
def test_an_op_works_or_names_itself(
    name: str, data: st.DataObject, merged: bool, train: bool, batching: bool
) -> None:
    case = FUZZ[name](data)
    note(f"{case.name}: merged={merged}, train={train}, batching={batching}")
    outcome(case, merged, train, batching)
