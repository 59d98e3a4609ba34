"""A table of bad inputs, rows for every public op and layer: what each gives.

Each row is one op (a name of ``monadl.__all__``, or ``nn.X`` for a layer of ``monadl.nn``) given
one bad input: a wrong dtype, a wrong rank, an empty batch, a zero-length sequence, NaN, a mask of
the wrong shape, a negative or oversized padding or kernel. Its expected outcome is either

- :class:`Raises`: an error of that type whose message starts with the op's name and says what is
  wrong, raised where it says (``made``: by the call that makes the op; ``run``: as the run's
  ``Failure``, and then by the layer's ``.shape`` too, which never gives a shape for a graph that
  cannot run); or
- :class:`Gives`: a documented result, compared with what NumPy or PyTorch give, whose gradients
  (of its sum) have their weights' shapes, or a ``NonFiniteLossError`` where the result is not
  finite.

Nothing else passes: an exception from inside NumPy, an error that names another op, a value the
row does not document. ``test_every_public_op_and_layer_has_rows`` fails when a new public op or
layer has no row (or is not listed in :data:`NOT_OPS`, with why it takes no bad input of these
kinds), so the table stays complete.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import pytest
from returns.pipeline import is_successful
from returns.result import Result

import monadl as ml
from monadl import ArrayLayer, ArrayWeight, FloatLayer, FloatWeight, NonFiniteLossError, ShapeError, nn

# ------------------------------------------------------------------------------------- outcomes


@dataclass(frozen=True)
class Raises:
    """An error of type ``kind`` whose message starts with ``message``, raised ``when``."""

    kind: type[Exception]
    message: str
    when: Literal["made", "run"]


@dataclass(frozen=True)
class Gives:
    """A documented result: ``check(value)`` holds (``why`` says where it is documented).
    ``gradients``: the gradients of its sum are checked too (``compute_gradients`` runs in training
    mode: a prediction's result may have none)."""

    check: Callable[[Any], bool]
    why: str
    gradients: bool = True


@dataclass(frozen=True)
class Row:
    op: str
    case: str
    build: Callable[[], object]
    expect: Raises | Gives

    def __str__(self) -> str:
        return f"{self.op}: {self.case}"


def made(kind: type[Exception], message: str) -> Raises:
    return Raises(kind, message, "made")


def run(message: str, kind: type[Exception] = ShapeError) -> Raises:
    return Raises(kind, message, "run")


def empty(*shape: int) -> Gives:
    """An empty result of ``shape``: an op over no elements gives none (as NumPy, PyTorch)."""
    return Gives(lambda v: np.shape(v) == shape and np.size(v) == 0, f"an empty result of shape {shape}")


def nan(*shape: int) -> Gives:
    """NaN in, NaN out: a NaN input is not refused (it is data), and it reaches the result."""
    return Gives(lambda v: np.shape(v) == shape and bool(np.isnan(v).any()), f"NaN propagates, shape {shape}")


def equal(expected: Callable[[], Any], why: str) -> Gives:
    return Gives(
        lambda v: np.allclose(v, expected(), equal_nan=True) and np.shape(v) == np.shape(expected()), why
    )


# ------------------------------------------------------------------------------------- operands


def W(*shape: int, fill: float = 1.0) -> ArrayWeight:
    return ArrayWeight(np.full(shape, fill))


def NAN(*shape: int) -> ArrayWeight:
    return W(*shape, fill=np.nan)


def ints(*shape: int) -> Any:
    return np.ones(shape, dtype=np.int64)


def bools(*shape: int) -> Any:
    return np.ones(shape, dtype=bool)


def F(*shape: int) -> Any:
    return np.ones(shape, dtype=np.float32)


untyped: Any = ml  # calls whose arguments the annotations reject: the rows check run time


def bad(x: object) -> Any:
    """``x`` typed ``Any``: mypy rejects these operands statically; the rows check run time."""
    return x


FLOATS = "expected a floating-point array (float32 or float64), got dtype"
ANY = "expected a float, a floating-point array, a weight or a layer, got"
ARRAY = "expected an array layer, array weight or floating-point array"

ROWS: list[Row] = []


def rows(op: str, *cases: tuple[str, Callable[[], object], Raises | Gives]) -> None:
    ROWS.extend(Row(op, case, build, expect) for case, build, expect in cases)


# ------------------------------------------------------------------- elementwise ops, activations


def _unary(name: str, op: Callable[[Any], Any]) -> None:
    rows(
        name,
        ("int64 array", lambda: op(ints(3, 4)), made(TypeError, f"{name}: {FLOATS} int64")),
        ("bool array", lambda: op(bools(3)), made(TypeError, f"{name}: {FLOATS} bool")),
        ("complex array", lambda: op(np.ones(3, complex)), made(TypeError, f"{name}: {FLOATS} complex128")),
        ("a string", lambda: op("abc"), made(TypeError, f"{name}: {ANY} str")),
        ("None", lambda: op(None), made(TypeError, f"{name}: {ANY} NoneType")),
        ("empty batch", lambda: op(W(0, 4)), empty(0, 4)),
        ("no features", lambda: op(W(3, 0)), empty(3, 0)),
        ("NaN", lambda: op(NAN(2, 3)), nan(2, 3)),
    )


_UNARY: dict[str, Callable[[Any], Any]] = {
    "abs": ml.abs,
    "exp": ml.exp,
    "log": ml.log,
    "relu": ml.relu,
    "sigmoid": ml.sigmoid,
    "sqrt": ml.sqrt,
    "tanh": ml.tanh,
    "softplus": ml.softplus,
    "silu": ml.silu,
    "gelu": ml.gelu,
    "leaky_relu": ml.leaky_relu,
    "elu": ml.elu,
    "clip": lambda x: ml.clip(x, -1.0, 1.0),
    "lift": ml.lift,
    "lift_array": ml.lift_array,
}
for _name, _op in _UNARY.items():
    _unary(_name, _op)

_LIFT_FLOAT = "lift_float: expected a float, float weight or float layer"
rows(
    "lift_float",
    ("an array", lambda: untyped.lift_float(np.ones(3)), made(TypeError, _LIFT_FLOAT)),
    ("a string", lambda: untyped.lift_float("abc"), made(TypeError, _LIFT_FLOAT)),
    ("NaN", lambda: ml.lift_float(math.nan), Gives(math.isnan, "NaN propagates")),
)
rows(
    "leaky_relu",
    ("slope a string", lambda: untyped.leaky_relu(W(3), "a"), made(TypeError, "leaky_relu: negative_slope")),
)
rows("elu", ("alpha None", lambda: untyped.elu(W(3), None), made(TypeError, "elu: alpha")))
rows(
    "clip",
    (
        "lo above hi",
        lambda: ml.clip(W(3), 1.0, -1.0),
        made(ValueError, "clip: needs lo <= hi, got lo 1.0 and hi -1.0"),
    ),
    ("lo NaN", lambda: ml.clip(W(3), math.nan, 1.0), made(ValueError, "clip: needs lo <= hi, got lo nan")),
)


def _binary(name: str, prim: str, op: Callable[[Any, Any], Any]) -> None:
    rows(
        name,
        (
            "shapes that do not broadcast",
            lambda: op(W(3, 4), W(5)),
            run(f"{prim}: operands of shapes (3, 4) and (5,)"),
        ),
        ("int64 operand", lambda: op(W(3), ints(3)), made(TypeError, f"{prim}: {FLOATS} int64")),
        ("a list", lambda: op(W(3), bad([1.0, 2.0, 3.0])), made(TypeError, f"{prim}: {ANY} list")),
        ("empty batch", lambda: op(W(0, 3), W(3)), empty(0, 3)),
        (
            "empty against 2 rows",
            lambda: op(W(0, 3), W(2, 3)),
            run(f"{prim}: operands of shapes (0, 3) and (2, 3)"),
        ),
        ("NaN", lambda: op(NAN(3), W(3)), nan(3)),
    )


_binary("maximum", "maximum", ml.maximum)
_binary("minimum", "minimum", ml.minimum)
_binary("operator +", "add", lambda a, b: a + b)
_binary("operator -", "sub", lambda a, b: a - b)
_binary("operator *", "mul", lambda a, b: a * b)
_binary("operator /", "div", lambda a, b: a / b)
_binary("operator **", "pow", lambda a, b: a**b)

rows(
    "add_n",
    ("no operands", lambda: ml.add_n([]), made(ValueError, "add_n: needs at least one operand")),
    ("not a list", lambda: untyped.add_n(W(3)), made(TypeError, "add_n: expected a list or a tuple")),
    (
        "shapes that do not broadcast",
        lambda: ml.add_n([W(3), W(4)]),
        run("add_n: operands of shapes (3,) and (4,)"),
    ),
    ("int64 operand", lambda: untyped.add_n([W(3), ints(3)]), made(TypeError, f"add_n: {FLOATS} int64")),
    ("empty batch", lambda: ml.add_n([W(0, 3), W(0, 3)]), empty(0, 3)),
    ("NaN", lambda: ml.add_n([W(3), NAN(3)]), nan(3)),
)
_CONDITION = "where: condition must be a boolean array"
rows(
    "where",
    ("a float condition", lambda: untyped.where(np.ones(3), W(3), W(3)), made(TypeError, _CONDITION)),
    ("an int condition", lambda: untyped.where(ints(3), W(3), W(3)), made(TypeError, _CONDITION)),
    ("a list condition", lambda: untyped.where([True, False, True], W(3), W(3)), made(TypeError, _CONDITION)),
    (
        "a condition of the wrong shape",
        lambda: ml.where(bools(5), W(3), W(3)),
        run("where: operands of shapes (3,) and (3,) and (5,) do not fit"),
    ),
    (
        "operands that do not broadcast",
        lambda: ml.where(bools(3), W(3), W(4)),
        run("where: operands of shapes (3,) and (4,) and (3,) do not fit"),
    ),
    (
        "int64 operand",
        lambda: untyped.where(bools(3), ints(3), W(3)),
        made(TypeError, f"where: {FLOATS} int64"),
    ),
    ("empty batch", lambda: ml.where(bools(0), W(0), W(0)), empty(0)),
    ("NaN", lambda: ml.where(bools(3), NAN(3), W(3)), nan(3)),
)

# ------------------------------------------------------------------------ products and shapes


def _product(name: str, prim: str, op: Callable[[Any, Any], Any]) -> None:
    rows(
        name,
        (
            "inner sides differ",
            lambda: op(W(3, 4), W(5, 2)),
            run(f"{prim}: shapes (3, 4) and (5, 2) are not aligned"),
        ),
        (
            "vectors of two lengths",
            lambda: op(W(3), W(4)),
            run(f"{prim}: shapes (3,) and (4,) are not aligned"),
        ),
        (
            "a 0-d operand",
            lambda: op(W(), W(3)),
            run(f"{prim}: operands must be arrays of at least 1 dimension"),
        ),
        (
            "batch axes that do not broadcast",
            lambda: op(W(2, 3, 4), W(3, 4, 2)),
            run(f"{prim}: operands of shapes (2, 3, 4) and (3, 4, 2) do not fit"),
        ),
        ("int64 operand", lambda: op(W(3, 4), ints(4, 2)), made(TypeError, f"{prim}: {FLOATS} int64")),
        ("empty batch", lambda: op(W(0, 4), W(4, 2)), empty(0, 2)),
        (
            "no inner side",
            lambda: op(W(3, 0), W(0, 2)),
            equal(lambda: np.zeros((3, 2)), "a sum of nothing is 0"),
        ),
        ("NaN", lambda: op(NAN(3, 4), W(4, 2)), nan(3, 2)),
    )


_product("matmul", "matmul", ml.matmul)
_product("dot", "dot", ml.dot)
_product("operator @", "matmul", lambda a, b: a @ b)

_W2 = "linear: needs x of at least 1 dimension and a 2-d w"
rows(
    "linear",
    (
        "x and w not aligned",
        lambda: ml.linear(W(2, 3), W(4, 5), W(5)),
        run("linear: shapes (2, 3) and (4, 5) are not"),
    ),
    (
        "a bias of another size",
        lambda: ml.linear(W(2, 3), W(3, 5), W(4)),
        run("linear: bias of shape (4,) does not fit"),
    ),
    (
        "a 2-d bias",
        lambda: ml.linear(W(2, 3), W(3, 5), W(2, 5)),
        run("linear: bias of shape (2, 5) does not fit"),
    ),
    ("a 1-d w", lambda: ml.linear(W(2, 3), W(3), 0.0), run(f"{_W2}, got (2, 3) and (3,)")),
    ("a 0-d x", lambda: ml.linear(W(), W(3, 5), 0.0), run(f"{_W2}, got () and (3, 5)")),
    (
        "int64 bias",
        lambda: untyped.linear(W(2, 3), W(3, 5), ints(5)),
        made(TypeError, f"linear: {FLOATS} int64"),
    ),
    (
        "a float w",
        lambda: untyped.linear(W(2, 3), 0.5, 0.0),
        made(TypeError, f"linear: {ARRAY} for w, got float"),
    ),
    ("empty batch", lambda: ml.linear(W(0, 3), W(3, 5), W(5)), empty(0, 5)),
    ("NaN", lambda: ml.linear(NAN(2, 3), W(3, 5), W(5)), nan(2, 5)),
)
_RESHAPE = "reshape: cannot reshape an array of shape"
rows(
    "reshape",
    ("another size", lambda: ml.reshape(W(3, 4), (5, 2)), run(f"{_RESHAPE} (3, 4) to (5, 2)")),
    ("-1 that does not divide", lambda: ml.reshape(W(3, 4), (5, -1)), run(f"{_RESHAPE} (3, 4) to (5, -1)")),
    ("-1 over no elements", lambda: ml.reshape(W(0, 3), (-1, 0)), run(f"{_RESHAPE} (0, 3) to (-1, 0)")),
    (
        "two -1",
        lambda: ml.reshape(W(3, 4), (-1, -1)),
        made(ValueError, "reshape: shape (-1, -1) has more than one"),
    ),
    (
        "a negative side",
        lambda: ml.reshape(W(3, 4), (-2, -6)),
        made(ValueError, "reshape: shape (-2, -6) has a negative"),
    ),
    (
        "a float side",
        lambda: untyped.reshape(W(3, 4), (1.5, 8)),
        made(TypeError, "reshape: shape must be a sequence"),
    ),
    ("int64 array", lambda: untyped.reshape(ints(3, 4), (12,)), made(TypeError, f"reshape: {FLOATS} int64")),
    ("empty batch", lambda: ml.reshape(W(0, 4), (0, 2, 2)), empty(0, 2, 2)),
    ("NaN", lambda: ml.reshape(NAN(2, 3), (6,)), nan(6)),
)
_AXES = "do not fit an array of shape (3, 4)"
rows(
    "transpose",
    ("an axis out of range", lambda: ml.transpose(W(3, 4), (0, 3)), run(f"transpose: axes (0, 3) {_AXES}")),
    ("an axis twice", lambda: ml.transpose(W(3, 4), (0, 0)), run(f"transpose: axes (0, 0) {_AXES}")),
    ("too many axes", lambda: ml.transpose(W(3, 4), (0, 1, 2)), run(f"transpose: axes (0, 1, 2) {_AXES}")),
    (
        "axes not ints",
        lambda: untyped.transpose(W(3, 4), (1, None)),
        made(TypeError, "transpose: axes must be"),
    ),
    ("int64 array", lambda: untyped.transpose(ints(3, 4)), made(TypeError, f"transpose: {FLOATS} int64")),
    ("empty batch", lambda: ml.transpose(W(0, 4)), empty(4, 0)),
    ("NaN", lambda: ml.transpose(NAN(2, 3)), nan(3, 2)),
)
_JOINED = "cannot be joined along axis"
rows(
    "concatenate",
    ("nothing", lambda: ml.concatenate([]), made(ValueError, "concatenate: needs at least one array")),
    (
        "one array, not a list",
        lambda: untyped.concatenate(W(3)),
        made(TypeError, "concatenate: expected a list"),
    ),
    (
        "sides differ off the axis",
        lambda: ml.concatenate([W(3, 4), W(3, 5)]),
        run("concatenate: arrays of shapes [(3, 4), (3, 5)] differ off axis 0"),
    ),
    (
        "ranks differ",
        lambda: ml.concatenate([W(3, 4), W(3)]),
        run(f"concatenate: arrays of shapes [(3, 4), (3,)] {_JOINED}"),
    ),
    (
        "an axis out of range",
        lambda: ml.concatenate([W(3, 4), W(3, 4)], axis=2),
        run(f"concatenate: arrays of shapes [(3, 4), (3, 4)] {_JOINED} 2"),
    ),
    (
        "0-d arrays",
        lambda: ml.concatenate([W(), W()]),
        run(f"concatenate: arrays of shapes [(), ()] {_JOINED} 0"),
    ),
    (
        "int64 array",
        lambda: untyped.concatenate([W(3), ints(3)]),
        made(TypeError, f"concatenate: {FLOATS} int64"),
    ),
    ("empty batches", lambda: ml.concatenate([W(0, 4), W(0, 4)]), empty(0, 4)),
    ("NaN", lambda: ml.concatenate([NAN(2), W(2)]), nan(4)),
)
rows(
    "stack",
    ("nothing", lambda: ml.stack([]), made(ValueError, "stack: needs at least one array")),
    ("shapes differ", lambda: ml.stack([W(3), W(4)]), run("stack: arrays of shapes [(3,), (4,)] differ")),
    ("an axis out of range", lambda: ml.stack([W(3), W(3)], axis=2), run("stack: axis 2 is out of range")),
    (
        "a negative axis out of range",
        lambda: ml.stack([W(3), W(3)], axis=-3),
        run("stack: axis -3 is out of range"),
    ),
    ("int64 array", lambda: untyped.stack([W(3), ints(3)]), made(TypeError, f"stack: {FLOATS} int64")),
    ("empty batches", lambda: ml.stack([W(0), W(0)]), empty(2, 0)),
    ("NaN", lambda: ml.stack([NAN(2), W(2)]), nan(2, 2)),
)
_SECTIONS = "split: the number of sections must be positive"
rows(
    "split",
    (
        "sections that do not divide",
        lambda: ml.split(W(5), 2)[0],
        run("split: 2 sections do not divide axis 0"),
    ),
    ("no sections", lambda: ml.split(W(5), 0), made(ValueError, f"{_SECTIONS}, got 0")),
    ("negative sections", lambda: ml.split(W(5), -1), made(ValueError, f"{_SECTIONS}, got -1")),
    (
        "an axis out of range",
        lambda: ml.split(W(4), 2, axis=1)[0],
        run("split: axis 1 is out of range for shape (4,)"),
    ),
    ("a 0-d array", lambda: ml.split(W(), 1)[0], run("split: axis 0 is out of range for shape ()")),
    ("indices past the end", lambda: ml.split(W(4), [2, 9])[2], empty(0)),  # numpy.split's pieces
    (
        "sections a string",
        lambda: untyped.split(W(4), "2"),
        made(TypeError, "split: sections_or_indices must be"),
    ),
    ("int64 array", lambda: untyped.split(ints(4), 2), made(TypeError, f"split: {FLOATS} int64")),
    ("empty batch", lambda: ml.split(W(0, 4), 2, axis=1)[0], empty(0, 2)),
    ("NaN", lambda: ml.split(NAN(4), 2)[1], nan(2)),
)

# ----------------------------------------------------------------------------------- reductions


def _reduction(name: str, op: Callable[..., Any], of_nothing: Raises | Gives) -> None:
    rows(
        name,
        ("int64 array", lambda: op(ints(3, 4)), made(TypeError, f"{name}: {FLOATS} int64")),
        ("a float", lambda: op(0.5), made(TypeError, f"{name}: {ARRAY}, got float 0.5")),
        (
            "an axis out of range",
            lambda: op(W(3, 4), 5),
            run(f"{name}: axis 5 is out of range for shape (3, 4)"),
        ),
        ("an axis twice", lambda: op(W(3, 4), (1, -1)), run(f"{name}: axes (1, -1) repeat an axis")),
        (
            "a float axis",
            lambda: op(W(3, 4), 1.0),
            made(TypeError, f"{name}: axis must be an int or a tuple"),
        ),
        (
            "keepdims an int",
            lambda: op(W(3, 4), 0, keepdims=1),
            made(TypeError, f"{name}: keepdims must be a bool"),
        ),
        ("everything of an empty batch", lambda: op(W(0, 4)), of_nothing),
        ("along the rows of an empty batch", lambda: op(W(0, 4), 1), empty(0)),
        ("NaN", lambda: op(NAN(2, 3), 1), nan(2)),
    )


_OF_NOTHING = "cannot reduce an empty axis of shape (0, 4) (axis None)"
_NO_FREEDOM = "0 elements along axis None of shape (0, 4) leave no degrees of freedom"
_reduction("sum", ml.sum, Gives(lambda v: v == 0.0, "a sum of nothing is 0"))
_reduction(
    "mean", ml.mean, Gives(math.isnan, "the mean of nothing is NaN (its docstring; NumPy's, PyTorch's)")
)
_reduction("max", ml.max, run(f"max: {_OF_NOTHING}"))
_reduction("min", ml.min, run(f"min: {_OF_NOTHING}"))
_reduction("logsumexp", ml.logsumexp, run(f"logsumexp: {_OF_NOTHING}"))
_reduction("var", ml.var, run(f"var: {_NO_FREEDOM}"))
_reduction("std", ml.std, run(f"std: {_NO_FREEDOM}"))
rows(
    "var",
    (
        "correction a string",
        lambda: untyped.var(W(3), correction="1"),
        made(TypeError, "var: correction must be"),
    ),
    (
        "every degree corrected",
        lambda: ml.var(W(3), correction=3.0),
        run("var: 3 elements along axis None of shape (3,)"),
    ),
)


def _index_of(name: str, op: Callable[..., Any]) -> None:
    rows(
        name,
        (
            "complex array",
            lambda: op(np.ones(3, complex)),
            made(TypeError, f"{name}: expected an array of real numbers"),
        ),
        (
            "objects",
            lambda: op(np.array([1.0, "a"], dtype=object)),
            made(TypeError, f"{name}: expected an array of real"),
        ),
        (
            "a string",
            lambda: op("abc"),
            made(TypeError, f"{name}: expected an array, array weight or array layer, got str"),
        ),
        (
            "an empty array",
            lambda: op(W(0, 4)),
            made(ShapeError, f"{name}: cannot take the index of an empty axis"),
        ),
        (
            "a 0-d array",
            lambda: op(W()),
            made(ShapeError, f"{name}: expected an array of at least 1 dimension"),
        ),
        (
            "an axis out of range",
            lambda: op(W(3, 4), 5),
            made(ShapeError, f"{name}: axis 5 is out of range for shape (3, 4)"),
        ),
        (
            "a layer that cannot run",
            lambda: op(W(3, 4) @ W(5, 2)),
            made(ShapeError, "matmul: shapes (3, 4) and (5, 2)"),
        ),
        (
            "int64 array",
            lambda: op(np.array([1, 3, 2])),
            equal(lambda: op(np.array([1.0, 3.0, 2.0])), "NumPy's index"),
        ),
        (
            "NaN",
            lambda: op(np.array([1.0, np.nan, 3.0])),
            equal(
                lambda: np.array(1),
                "NaN counts as the largest and the smallest (the docstring; NumPy's, PyTorch's)",
            ),
        ),
    )


_index_of("argmax", ml.argmax)
_index_of("argmin", ml.argmin)

# --------------------------------------------------------------------------- softmax and losses


def _softmax(name: str, op: Callable[..., Any]) -> None:
    rows(
        name,
        ("int64 array", lambda: op(ints(3, 4)), made(TypeError, f"{name}: {FLOATS} int64")),
        ("a 0-d array", lambda: op(W()), run(f"{name}: axis -1 is out of range for shape ()")),
        (
            "an axis out of range",
            lambda: op(W(3, 4), 5),
            run(f"{name}: axis 5 is out of range for shape (3, 4)"),
        ),
        ("an axis a string", lambda: op(W(3, 4), "a"), made(TypeError, f"{name}: axis must be an int")),
        ("empty batch", lambda: op(W(0, 4)), empty(0, 4)),
        ("no classes", lambda: op(W(3, 0)), empty(3, 0)),  # PyTorch's
        ("NaN", lambda: op(NAN(2, 3)), nan(2, 3)),
    )


_softmax("softmax", ml.softmax)
_softmax("log_softmax", ml.log_softmax)

_TARGETS = "cross_entropy: targets of shape"
_LABEL = "cross_entropy: label"
rows(
    "cross_entropy",
    (
        "labels of the wrong rank",
        lambda: ml.cross_entropy(W(3, 4), ints(3, 4, 5)),
        run(f"{_TARGETS} (3, 4, 5) do not fit"),
    ),
    (
        "float labels",
        lambda: ml.cross_entropy(W(3, 4), np.zeros(3)),
        run(f"{_TARGETS} (3,) do not fit logits of shape (3, 4)"),
    ),
    (
        "a label out of range",
        lambda: ml.cross_entropy(W(3, 4), np.array([0, 4, 1])),
        run(f"{_LABEL} 4 is out", ValueError),
    ),
    (
        "a negative label",
        lambda: ml.cross_entropy(W(3, 4), np.array([0, -1, 1])),
        run(f"{_LABEL} -1 is out", ValueError),
    ),
    (
        "one int label out of range",
        lambda: ml.cross_entropy(W(4), 7),
        run(f"{_LABEL} 7 is out of range", ValueError),
    ),
    (
        "0-d logits",
        lambda: ml.cross_entropy(W(), ints()),
        run("cross_entropy: logits must have a class axis"),
    ),
    (
        "empty batch",
        lambda: ml.cross_entropy(W(0, 4), ints(0)),
        run("cross_entropy: logits of shape (0, 4) are empty"),
    ),
    (
        "no classes",
        lambda: ml.cross_entropy(W(3, 0), ints(3)),
        run("cross_entropy: logits of shape (3, 0) are empty"),
    ),
    (
        "targets a list",
        lambda: untyped.cross_entropy(W(3, 4), [0, 1, 2]),
        made(TypeError, "cross_entropy: expected an"),
    ),
    (
        "int64 logits",
        lambda: untyped.cross_entropy(ints(3, 4), ints(3)),
        made(TypeError, f"cross_entropy: {FLOATS} int64"),
    ),
    (
        "uint8 labels",
        lambda: ml.cross_entropy(W(3, 4), np.zeros(3, np.uint8)),
        equal(lambda: math.log(4.0), "any ints"),
    ),
    ("NaN logits", lambda: ml.cross_entropy(NAN(3, 4), ints(3)), Gives(math.isnan, "NaN propagates")),
)

# ------------------------------------------------------------------------------------ selection

_ROW = "take_rows: row index"
rows(
    "take_rows",
    (
        "a row out of range",
        lambda: ml.take_rows(W(3, 4), [5]),
        run(f"{_ROW} 5 is out of range for a table of shape (3, 4)"),
    ),
    (
        "a negative row",
        lambda: ml.take_rows(W(3, 4), [-1]),
        run(f"{_ROW} -1 is out of range for a table of shape (3, 4)"),
    ),
    (
        "float indices",
        lambda: untyped.take_rows(W(3, 4), np.array([0.5])),
        made(TypeError, "take_rows: expected integer"),
    ),
    (
        "bool indices",
        lambda: untyped.take_rows(W(3, 4), np.array([True])),
        made(TypeError, "take_rows: expected integer"),
    ),
    ("a 0-d table", lambda: ml.take_rows(W(), [0]), run("take_rows: cannot index rows of a 0-d array")),
    (
        "an empty table",
        lambda: ml.take_rows(W(0, 4), [0]),
        run(f"{_ROW} 0 is out of range for a table of shape (0, 4)"),
    ),
    (
        "int64 table",
        lambda: untyped.take_rows(ints(3, 4), [0]),
        made(TypeError, f"take_rows: {FLOATS} int64"),
    ),
    ("no indices", lambda: ml.take_rows(W(3, 4), np.zeros(0, np.int64)), empty(0, 4)),
    ("NaN", lambda: ml.take_rows(NAN(3, 4), [1]), nan(1, 4)),
)
_ALONG = "take_along_axis:"
rows(
    "take_along_axis",
    (
        "an index out of range",
        lambda: ml.take_along_axis(W(3, 4), np.array([[5]]), axis=1),
        run(f"{_ALONG} index 5 is out of range for axis 1 of x of shape (3, 4)"),
    ),
    (
        "a negative index",
        lambda: ml.take_along_axis(W(3, 4), np.array([[-1]]), axis=1),
        run(f"{_ALONG} index -1 is out"),
    ),
    (
        "indices of another rank",
        lambda: ml.take_along_axis(W(3, 4), np.array([1]), axis=1),
        run(f"{_ALONG} indices of shape (1,) must have the rank of x of shape (3, 4)"),
    ),
    (
        "indices that do not broadcast",
        lambda: ml.take_along_axis(W(3, 4), np.zeros((2, 1), np.int64), axis=1),
        run(f"{_ALONG} indices of shape (2, 1) do not broadcast against x"),
    ),
    (
        "an axis out of range",
        lambda: ml.take_along_axis(W(3, 4), np.array([[0]]), axis=3),
        run(f"{_ALONG} axis 3 is out"),
    ),
    (
        "float indices",
        lambda: untyped.take_along_axis(W(3, 4), np.array([[0.5]])),
        made(TypeError, f"{_ALONG} expected"),
    ),
    (
        "a 0-d x",
        lambda: ml.take_along_axis(W(), np.zeros((), np.int64), axis=0),
        run(f"{_ALONG} x must have an axis"),
    ),
    ("no indices", lambda: ml.take_along_axis(W(3, 4), np.zeros((3, 0), np.int64), axis=1), empty(3, 0)),
    ("NaN", lambda: ml.take_along_axis(NAN(3, 4), np.zeros((3, 1), np.int64), axis=1), nan(3, 1)),
)
_OUT = "is out of range for axis"
rows(
    "indexing",
    ("a row out of range", lambda: W(3, 4)[3], run(f"{_ROW} 3 is out of range for a table of shape (3, 4)")),
    ("from the end, out of range", lambda: W(3, 4)[-5], run(f"getitem: index -5 {_OUT} 0 of shape (3, 4)")),
    ("an axis out of range", lambda: W(3, 4)[:, 9], run(f"getitem: index 9 {_OUT} 1 of shape (3, 4)")),
    (
        "too many indices",
        lambda: W(3, 4)[0, 0, 0],
        run("getitem: 3 indices are too many for an array of shape (3, 4)"),
    ),
    ("arrays out of range", lambda: W(3, 4)[np.array([0]), np.array([7])], run(f"getitem: index 7 {_OUT} 1")),
    (
        "a mask of the wrong shape",
        lambda: W(3, 4)[np.array([True, False])],
        made(ShapeError, "getitem: a boolean mask"),
    ),
    ("a float", lambda: W(3)[bad(1.5)], made(TypeError, "take_rows: expected integer indices, got float")),
    (
        "a float in a tuple",
        lambda: W(3, 4)[0, bad(1.5)],
        made(TypeError, "getitem: expected ints, slices, None or ..."),
    ),
    (
        "two ellipses",
        lambda: W(3, 4)[..., ...],
        made(ValueError, "getitem: an index can have only one ellipsis"),
    ),
    ("a zero step", lambda: W(3, 4)[::0], made(ValueError, "getitem: slice step cannot be zero")),
    ("a row of a 0-d array", lambda: W()[0], run("take_rows: cannot index rows of a 0-d array")),
    ("an empty slice", lambda: W(3, 4)[:, 2:1], empty(3, 0)),
    ("NaN", lambda: NAN(3, 4)[1:], nan(2, 4)),
)

# -------------------------------------------------------------------------------- normalisation

rows(
    "batch_norm",
    (
        "gamma of another size",
        lambda: ml.batch_norm(W(4, 3), W(4), W(3)),
        run("batch_norm: gamma must have shape (3,)"),
    ),
    (
        "a 1-d input",
        lambda: ml.batch_norm(W(3), W(3), W(3)),
        run("batch_norm: expected an input of 2 or 3 or 4 or 5"),
    ),
    (
        "a float input",
        lambda: untyped.batch_norm(0.5, W(3), W(3)),
        made(TypeError, "batch_norm: x must be an array"),
    ),
    (
        "eps negative",
        lambda: ml.batch_norm(W(4, 3), W(3), W(3), eps=-1.0),
        made(ValueError, "batch_norm: eps must be"),
    ),
    (
        "eps a string",
        lambda: untyped.batch_norm(W(4, 3), W(3), W(3), eps="a"),
        made(TypeError, "batch_norm: eps must be a float, got str 'a'"),
    ),
    (
        "int64 input",
        lambda: untyped.batch_norm(ints(4, 3), W(3), W(3)),
        made(TypeError, f"batch_norm: {FLOATS} int64"),
    ),
    ("empty batch", lambda: ml.batch_norm(W(0, 3), W(3), W(3)), empty(0, 3)),
    ("NaN", lambda: ml.batch_norm(NAN(4, 3), W(3), W(3)), nan(4, 3)),
)
_EPS = "layer_norm: eps must be a positive float"
rows(
    "layer_norm",
    (
        "a weight of another size",
        lambda: ml.layer_norm(W(4, 3), W(4), W(3)),
        run("layer_norm: weight of shape (4,) does"),
    ),
    (
        "a 2-d weight",
        lambda: ml.layer_norm(W(4, 3), W(4, 3)),
        run("layer_norm: weight of shape (4, 3) does not fit"),
    ),
    ("a 0-d input", lambda: ml.layer_norm(W()), run("layer_norm: x must have a feature axis, got shape ()")),
    ("eps 0", lambda: ml.layer_norm(W(4, 3), eps=0.0), made(ValueError, f"{_EPS}, got 0.0")),
    ("eps a string", lambda: untyped.layer_norm(W(4, 3), eps="a"), made(ValueError, f"{_EPS}, got 'a'")),
    ("int64 input", lambda: untyped.layer_norm(ints(4, 3)), made(TypeError, f"layer_norm: {FLOATS} int64")),
    ("empty batch", lambda: ml.layer_norm(W(0, 3), W(3), W(3)), empty(0, 3)),
    ("no features", lambda: ml.layer_norm(W(3, 0), W(0), W(0)), empty(3, 0)),  # PyTorch's
    ("NaN", lambda: ml.layer_norm(NAN(4, 3)), nan(4, 3)),
)

# ------------------------------------------------------------------------------------ attention

_SDPA = "scaled_dot_product_attention"
_sdpa: Any = ml.scaled_dot_product_attention
rows(
    _SDPA,
    (
        "q and k of two feature sizes",
        lambda: _sdpa(W(2, 4), W(3, 5), W(3, 5)),
        run(f"{_SDPA}: q (2, 4), k (3, 5), v (3, 5)"),
    ),
    (
        "k and v of two lengths",
        lambda: _sdpa(W(2, 4), W(3, 4), W(2, 4)),
        run(f"{_SDPA}: q (2, 4), k (3, 4), v (2, 4) do"),
    ),
    (
        "1-d operands",
        lambda: _sdpa(W(4), W(4), W(4)),
        run(f"{_SDPA}: q, k and v must be arrays of 2 dimensions"),
    ),
    (
        "leading axes that do not broadcast",
        lambda: _sdpa(W(2, 2, 4), W(3, 3, 4), W(3, 3, 4)),
        run(f"{_SDPA}: the leading axes of q (2, 2, 4), k (3, 3, 4), v (3, 3, 4) do not broadcast"),
    ),
    (
        "k and v leading axes that do not broadcast",
        lambda: _sdpa(W(1, 2, 4), W(2, 3, 4), W(3, 3, 4)),
        run(f"{_SDPA}: the leading axes of q (1, 2, 4), k (2, 3, 4), v (3, 3, 4) do not broadcast"),
    ),
    (
        "a mask of the wrong shape",
        lambda: _sdpa(W(2, 4), W(3, 4), W(3, 4), bools(5, 5)),
        run(f"{_SDPA}: mask of shape (5, 5) does not broadcast to the scores' shape (2, 3)"),
    ),
    (
        "a mask that would grow the scores",
        lambda: _sdpa(W(1, 4), W(1, 4), W(1, 4), bools(1, 2)),
        run(f"{_SDPA}: mask of shape (1, 2) does not broadcast to the scores' shape (1, 1)"),
    ),
    (
        "a mask that would add a batch",
        lambda: _sdpa(W(1, 2, 4), W(1, 3, 4), W(1, 3, 4), bools(5, 2, 3)),
        run(f"{_SDPA}: mask of shape (5, 2, 3) does not broadcast to the scores' shape (1, 2, 3)"),
    ),
    (
        "a mask of more axes",
        lambda: _sdpa(W(2, 4), W(3, 4), W(3, 4), bools(1, 1, 1, 2, 3)),
        run(f"{_SDPA}: mask of shape (1, 1, 1, 2, 3) does not broadcast"),
    ),
    (
        "an int64 mask",
        lambda: _sdpa(W(2, 4), W(3, 4), W(3, 4), ints(2, 3)),
        made(TypeError, f"{_SDPA}: mask must be boolean or floating-point, got dtype int64"),
    ),
    (
        "a list mask",
        lambda: _sdpa(W(2, 4), W(3, 4), W(3, 4), [[True] * 3] * 2),
        made(TypeError, f"{_SDPA}: mask must be"),
    ),
    (
        "0 heads",
        lambda: _sdpa(W(2, 4), W(3, 4), W(3, 4), heads=0),
        made(ValueError, f"{_SDPA}: heads must be positive"),
    ),
    (
        "heads that do not divide",
        lambda: _sdpa(W(2, 4), W(3, 4), W(3, 4), heads=3),
        run(f"{_SDPA}: 3 heads do not divide"),
    ),
    (
        "scale a string",
        lambda: _sdpa(W(2, 4), W(3, 4), W(3, 4), scale="a"),
        made(TypeError, f"{_SDPA}: scale must be"),
    ),
    ("int64 q", lambda: _sdpa(ints(2, 4), W(3, 4), W(3, 4)), made(TypeError, f"{_SDPA}: {FLOATS} int64")),
    ("no queries", lambda: _sdpa(W(0, 4), W(3, 4), W(3, 4)), empty(0, 4)),
    (
        "no keys",
        lambda: _sdpa(W(2, 4), W(0, 4), W(0, 4)),
        equal(lambda: np.zeros((2, 4)), "zeros (docstring; PyTorch's)"),
    ),
    (
        "no features",
        lambda: _sdpa(W(2, 0), W(3, 0), W(3, 4)),
        equal(lambda: np.ones((2, 4)), "v's mean (PyTorch's)"),
    ),
    ("no queries and no keys", lambda: _sdpa(W(0, 4), W(0, 4), W(0, 4)), empty(0, 4)),
    ("NaN", lambda: _sdpa(NAN(2, 4), W(3, 4), W(3, 4)), nan(2, 4)),
)

# ------------------------------------------------------------------------- convolution, pooling


def _conv(name: str, x: tuple[int, ...], w: tuple[int, ...]) -> None:
    op: Any = getattr(ml, name)
    s = len(x) - 2
    kernel, zeros, ones = (3,) * s, (0,) * s, (1,) * s
    rows(
        name,
        (
            "channels that do not fit",
            lambda: op(W(*x), W(2, 4, *kernel)),
            run(
                f"{name}: x of shape {x} (3 channels) and w of shape {(2, 4, *kernel)} do not fit 1 group(s)"
            ),
        ),
        ("x without channels", lambda: op(W(*x[2:]), W(*w)), run(f"{name}: needs x of shape (..., C,")),
        ("w of another rank", lambda: op(W(*x), W(*w[:-1])), run(f"{name}: needs x of shape (..., C,")),
        (
            "a kernel larger than x",
            lambda: op(W(*x[:2], *(2,) * s), W(*w)),
            run(f"{name}: a kernel of shape {kernel}"),
        ),
        (
            "a kernel side of 0",
            lambda: op(W(*x), W(*w[:2], *zeros)),
            run(f"{name}: w of shape {(2, 3, *zeros)} has a kernel side of 0"),
        ),
        (
            "an empty input side",
            lambda: op(W(*x[:2], *zeros), W(*w[:2], *ones)),
            run(f"{name}: a kernel of shape {ones}"),
        ),
        (
            "negative padding",
            lambda: op(W(*x), W(*w), padding=-1),
            made(ValueError, f"{name}: padding must be {s} int(s)"),
        ),
        (
            "padding of too many axes",
            lambda: op(W(*x), W(*w), padding=(1,) * (s + 1)),
            made(ValueError, f"{name}: padding must be {s} int(s) of at least 0"),
        ),
        (
            "padding 'SAME'",
            lambda: op(W(*x), W(*w), padding="SAME"),
            made(ValueError, f"{name}: padding must be ints, 'valid' or 'same', got 'SAME'"),
        ),
        (
            "padding 'same' with a stride",
            lambda: op(W(*x), W(*w), padding="same", stride=2),
            made(ValueError, f"{name}: padding 'same' needs a stride of 1"),
        ),
        (
            "a stride of 0",
            lambda: op(W(*x), W(*w), stride=0),
            made(ValueError, f"{name}: stride must be {s} int(s)"),
        ),
        (
            "a dilation of 0",
            lambda: op(W(*x), W(*w), dilation=0),
            made(ValueError, f"{name}: dilation must be {s} int(s)"),
        ),
        (
            "0 groups",
            lambda: op(W(*x), W(*w), groups=0),
            made(ValueError, f"{name}: groups must be at least 1, got 0"),
        ),
        (
            "groups that do not divide",
            lambda: op(W(*x), W(*w), groups=2),
            run(f"{name}: x of shape {x} (3 channels) and w of shape {w} do not fit 2 group(s)"),
        ),
        (
            "a bias of another size",
            lambda: op(W(*x), W(*w), W(3)),
            run(f"{name}: bias of shape (3,) does not fit 2 output"),
        ),
        ("int64 x", lambda: op(ints(*x), W(*w)), made(TypeError, f"{name}: {FLOATS} int64")),
        ("a float kernel", lambda: op(W(*x), 0.5), made(TypeError, f"{name}: {ARRAY} for w, got float 0.5")),
        (
            "padding larger than x",
            lambda: op(W(*x), W(*w), padding=10),
            Gives(lambda v: v.shape == (1, 2, *(23,) * s), "zeros around x (PyTorch's)"),
        ),
        ("empty batch", lambda: op(W(0, *x[1:]), W(*w), W(2)), empty(0, 2, *kernel)),
        ("NaN", lambda: op(NAN(*x), W(*w)), nan(1, 2, *kernel)),
    )


_conv("conv1d", (1, 3, 5), (2, 3, 3))
_conv("conv2d", (1, 3, 5, 5), (2, 3, 3, 3))


def _pool(name: str) -> None:
    op: Any = getattr(ml, name)
    s = int(name[-2])
    x, twos, zeros = (1, *(4,) * s), (2,) * s, (0,) * s
    rows(
        name,
        (
            "a kernel of 0",
            lambda: op(W(*x), 0),
            made(ValueError, f"{name}: kernel_size must be {s} int(s) of at least 1"),
        ),
        (
            "a negative kernel",
            lambda: op(W(*x), -2),
            made(ValueError, f"{name}: kernel_size must be {s} int(s)"),
        ),
        (
            "a kernel of too many axes",
            lambda: op(W(*x), (2,) * (s + 1)),
            made(ValueError, f"{name}: kernel_size must be"),
        ),
        (
            "a float kernel",
            lambda: op(W(*x), 2.0),
            made(TypeError, f"{name}: kernel_size must be an int or {s} ints"),
        ),
        (
            "a kernel larger than x",
            lambda: op(W(*x), 5),
            run(f"{name}: a kernel of {(5,) * s} does not fit an input"),
        ),
        (
            "negative padding",
            lambda: op(W(*x), 2, padding=-1),
            made(ValueError, f"{name}: padding must be {s} int(s)"),
        ),
        (
            "padding over half the kernel",
            lambda: op(W(*x), 2, padding=2),
            made(ValueError, f"{name}: padding {twos} must"),
        ),
        (
            "a stride of 0",
            lambda: op(W(*x), 2, stride=0),
            made(ValueError, f"{name}: stride must be {s} int(s)"),
        ),
        (
            "too few axes",
            lambda: op(W(*(4,) * (s - 1)), 2),
            run(f"{name}: needs an array of at least {s} axes"),
        ),
        (
            "an empty side",
            lambda: op(W(1, *zeros), 2),
            run(f"{name}: a kernel of {twos} does not fit an input"),
        ),
        ("int64 x", lambda: op(ints(*x), 2), made(TypeError, f"{name}: {FLOATS} int64")),
        ("empty batch", lambda: op(W(0, *x[1:]), 2), empty(0, *twos)),
        ("NaN", lambda: op(NAN(*x), 2), nan(1, *twos)),
    )


for _name in ("max_pool1d", "avg_pool1d", "max_pool2d", "avg_pool2d"):
    _pool(_name)

# ------------------------------------------------------------------------------ recurrent steps

rows(
    "lstm_c",
    (
        "states of two sizes",
        lambda: ml.lstm_c(W(3), W(3), W(3), W(4)),
        run("lstm_c: operands of shapes (3,) and (3,)"),
    ),
    (
        "int64 gate",
        lambda: untyped.lstm_c(W(3), W(3), W(3), ints(3)),
        made(TypeError, f"lstm_c: {FLOATS} int64"),
    ),
    (
        "a float gate",
        lambda: untyped.lstm_c(0.5, W(3), W(3), W(3)),
        made(TypeError, f"lstm_c: {ARRAY} for i"),
    ),
    ("empty batch", lambda: ml.lstm_c(W(0, 3), W(0, 3), W(0, 3), W(0, 3)), empty(0, 3)),
    ("NaN", lambda: ml.lstm_c(NAN(3), W(3), W(3), W(3)), nan(3)),
)
rows(
    "lstm_h",
    (
        "states of two sizes",
        lambda: ml.lstm_h(W(3), W(4)),
        run("lstm_h: operands of shapes (3,) and (4,) do not fit"),
    ),
    ("int64 gate", lambda: untyped.lstm_h(ints(3), W(3)), made(TypeError, f"lstm_h: {FLOATS} int64")),
    ("empty batch", lambda: ml.lstm_h(W(0, 3), W(0, 3)), empty(0, 3)),
    ("NaN", lambda: ml.lstm_h(NAN(3), W(3)), nan(3)),
)
rows(
    "tree_lstm_c",
    (
        "memories of two sizes",
        lambda: ml.tree_lstm_c(W(3), W(3), W(3), W(3), W(3), W(4)),
        run("tree_lstm_c: operands of shapes"),
    ),
    (
        "int64 memory",
        lambda: untyped.tree_lstm_c(W(3), W(3), W(3), W(3), ints(3), W(3)),
        made(TypeError, f"tree_lstm_c: {FLOATS} int64"),
    ),
    (
        "a float gate",
        lambda: untyped.tree_lstm_c(W(3), 0.5, W(3), W(3), W(3), W(3)),
        made(TypeError, f"tree_lstm_c: {ARRAY} for f_left"),
    ),
    ("empty batch", lambda: ml.tree_lstm_c(*(W(0, 3) for _ in range(6))), empty(0, 3)),
    ("NaN", lambda: ml.tree_lstm_c(W(3), W(3), W(3), W(3), W(3), NAN(3)), nan(3)),
)
rows(
    "gru_h",
    (
        "states of two sizes",
        lambda: ml.gru_h(W(3), W(3), W(3), W(3), W(4)),
        run("gru_h: operands of shapes (3,) and"),
    ),
    ("float gates", lambda: untyped.gru_h(1.0, 1.0, 1.0, 1.0, 1.0), made(TypeError, f"gru_h: {ARRAY} for r")),
    ("empty batch", lambda: ml.gru_h(W(0, 3), W(0, 3), W(0, 3), W(0, 3), W(0, 3)), empty(0, 3)),
    ("NaN", lambda: ml.gru_h(W(3), W(3), NAN(3), W(3), W(3)), nan(3)),
)

# -------------------------------------------------------------------------------------- weights

_DATA = "ArrayWeight(shape=(3,), dtype=float64).data ="
rows(
    "ArrayWeight",
    ("int64 data", lambda: untyped.ArrayWeight(ints(3)), made(TypeError, f"ArrayWeight: {FLOATS} int64")),
    ("bool data", lambda: untyped.ArrayWeight(bools(3)), made(TypeError, f"ArrayWeight: {FLOATS} bool")),
    (
        "a list",
        lambda: untyped.ArrayWeight([1.0, 2.0]),
        made(TypeError, "ArrayWeight: expected a floating-point array"),
    ),
    (
        "None",
        lambda: untyped.ArrayWeight(None),
        made(TypeError, "ArrayWeight: expected a floating-point array"),
    ),
    (
        "data of another shape",
        lambda: setattr(W(3), "data", np.ones(4)),
        made(ShapeError, f"{_DATA} float64 array of"),
    ),
    (
        "data of another dtype",
        lambda: setattr(W(3), "data", F(3)),
        made(ShapeError, f"{_DATA} float32 array of"),
    ),
    (
        "int64 data assigned",
        lambda: setattr(W(3), "data", ints(3)),
        made(TypeError, f"ArrayWeight.data: {FLOATS} int64"),
    ),
    ("NaN data", lambda: ml.lift(NAN(3)), nan(3)),  # data, not refused: a step's finite check reports it
    ("empty data", lambda: ml.lift(W(0, 3)), empty(0, 3)),
)
_FLOAT_WEIGHT = "FloatWeight: expected a float, got"
rows(
    "FloatWeight",
    ("an array", lambda: untyped.FloatWeight(np.ones(2)), made(TypeError, f"{_FLOAT_WEIGHT} ndarray")),
    ("a bool", lambda: untyped.FloatWeight(True), made(TypeError, f"{_FLOAT_WEIGHT} bool")),
    ("a string", lambda: untyped.FloatWeight("1.0"), made(TypeError, f"{_FLOAT_WEIGHT} str")),
    ("NaN", lambda: ml.lift(FloatWeight(math.nan)), Gives(math.isnan, "NaN propagates")),
)

# ---------------------------------------------------------------------------------- nn's layers


def _train(layer: Callable[[], ArrayLayer]) -> Callable[[], Result[Any, Exception]]:
    """A training step on the sum of ``layer()`` (a batch norm's statistics update only there)."""
    return lambda: ml.sum(layer()).train_blocking(ml.SGD(0.1))


_LIN, _MLP, _EMB = nn.Linear.new(3, 2), nn.MLP.new([3, 4, 2]), nn.Embedding.new(5, 3)
_CELL, _GRU_CELL, _TREE = nn.LSTMCell.new(3, 2), nn.GRUCell.new(3, 2), nn.TreeLSTMCell.new(3, 2)
_LN, _MHA, _ENC = (
    nn.LayerNorm.new(3),
    nn.MultiHeadAttention.new(4, 2),
    nn.TransformerEncoderLayer.new(4, 2, 8),
)
_ALIGNED = "linear: shapes"

rows(
    "nn.Linear",
    (
        "inputs of another size",
        lambda: _LIN(F(4, 5)),
        run(f"{_ALIGNED} (4, 5) and (3, 2) are not aligned (5 != 3)"),
    ),
    ("int64 input", lambda: _LIN(ints(4, 3)), made(TypeError, f"linear: {FLOATS} int64")),
    (
        "a 0-d input",
        lambda: _LIN(F()),
        run("linear: needs x of at least 1 dimension and a 2-d w, got () and (3, 2)"),
    ),
    ("a string", lambda: _LIN(bad("abc")), made(TypeError, f"linear: {ARRAY} for x, got str")),
    ("empty batch", lambda: _LIN(F(0, 3)), empty(0, 2)),
    ("NaN", lambda: _LIN(NAN(4, 3)), nan(4, 2)),
)
rows(
    "nn.MLP",
    (
        "inputs of another size",
        lambda: _MLP(F(4, 5)),
        run(f"{_ALIGNED} (4, 5) and (3, 4) are not aligned (5 != 3)"),
    ),
    ("int64 input", lambda: _MLP(ints(4, 3)), made(TypeError, f"linear: {FLOATS} int64")),
    (
        "no layers",
        lambda: nn.MLP.new([3]),
        made(ValueError, "MLP.new: sizes needs an input and an output size"),
    ),
    ("empty batch", lambda: _MLP(F(0, 3)), empty(0, 2)),
)
_IDS = "take_rows: expected integer indices, got"
rows(
    "nn.Embedding",
    (
        "an id out of range",
        lambda: _EMB(np.array([7])),
        run(f"{_ROW} 7 is out of range for a table of shape (5, 3)"),
    ),
    ("a negative id", lambda: _EMB(-1), run(f"{_ROW} -1 is out of range for a table of shape (5, 3)")),
    ("float ids", lambda: _EMB(bad(np.array([0.5]))), made(TypeError, f"{_IDS} dtype float64")),
    ("a bool id", lambda: _EMB(True), made(TypeError, f"{_IDS} bool")),
    ("a string id", lambda: _EMB(bad("a")), made(TypeError, f"{_IDS} 'a'")),
    ("no ids", lambda: _EMB(np.zeros(0, np.int64)), empty(0, 3)),
)


def _dropout(name: str, dropout: Callable[..., Any]) -> None:
    layer = dropout(0.5)
    rows(
        name,
        ("p of 1", lambda: dropout(1.0), made(ValueError, "Dropout: p must be a float in [0, 1), got 1.0")),
        (
            "a negative p",
            lambda: dropout(-0.1),
            made(ValueError, "Dropout: p must be a float in [0, 1), got -0.1"),
        ),
        (
            "p a string",
            lambda: dropout("a"),
            made(ValueError, "Dropout: p must be a float in [0, 1), got 'a'"),
        ),
        (
            "a float input",
            lambda: layer(1.0),
            made(TypeError, "Dropout: expected an array, an ArrayWeight or"),
        ),
        ("int64 input", lambda: layer(ints(3)), made(TypeError, f"dropout: {FLOATS} int64")),
        (
            "empty batch in training",
            _train(lambda: layer(W(0, 3))),
            Gives(lambda v: v == 0.0, "a sum of nothing"),
        ),
        ("NaN", lambda: layer(NAN(3)), nan(3)),
    )


_dropout("Dropout", ml.Dropout)
_dropout("nn.Dropout", nn.Dropout)


def _conv_module(name: str, x: tuple[int, ...]) -> None:
    cls: Any = getattr(nn, name)
    layer = cls.new(3, 2, 3)
    s, op = len(x) - 2, name.lower()
    rows(
        f"nn.{name}",
        (
            "channels that do not fit",
            lambda: layer(F(1, 4, *x[2:])),
            run(f"{op}: x of shape {(1, 4, *x[2:])} (4 channels)"),
        ),
        (
            "an input smaller than the kernel",
            lambda: layer(F(1, 3, *(2,) * s)),
            run(f"{op}: a kernel of shape {(3,) * s}"),
        ),
        ("int64 input", lambda: layer(ints(*x)), made(TypeError, f"{op}: {FLOATS} int64")),
        (
            "negative outputs",
            lambda: cls.new(3, -2, 3),
            made(ValueError, f"{name}.new: outputs must be a positive int"),
        ),
        (
            "no inputs",
            lambda: cls.new(0, 2, 3),
            made(ValueError, f"{name}.new: inputs must be a positive int, got 0"),
        ),
        (
            "a kernel of 0",
            lambda: cls.new(3, 2, 0),
            made(ValueError, f"{name}: kernel_size must be {s} positive int(s)"),
        ),
        (
            "padding 'SAME' at the call",
            lambda: cls.new(3, 2, 3, padding="SAME")(F(*x)),
            made(ValueError, f"{op}: padding must be ints, 'valid' or 'same', got 'SAME'"),
        ),
        (
            "a w of another rank",
            lambda: cls(W(2, 3)),
            made(ValueError, f"{name}: w must have {s + 2} dimensions"),
        ),
        ("empty batch", lambda: layer(F(0, *x[1:])), empty(0, 2, *(3,) * s)),
    )


_conv_module("Conv1d", (1, 3, 5))
_conv_module("Conv2d", (1, 3, 5, 5))


def _pool_module(name: str, op: str) -> None:
    cls: Any = getattr(nn, name)
    rows(
        f"nn.{name}",
        (
            "an input smaller than the kernel",
            lambda: cls(2)(F(1, 1, 1)),
            run(f"{op}: a kernel of (2, 2) does not fit"),
        ),
        (
            "a kernel of 0 at the call",
            lambda: cls(0)(F(1, 4, 4)),
            made(ValueError, f"{op}: kernel_size must be 2 int(s)"),
        ),
        ("a 1-d input", lambda: cls(2)(F(4)), run(f"{op}: needs an array of at least 2 axes, got (4,)")),
        ("empty batch", lambda: cls(2)(F(0, 4, 4)), empty(0, 2, 2)),
    )


_pool_module("MaxPool2d", "max_pool2d")
_pool_module("AvgPool2d", "avg_pool2d")

# A cell's error names its first op that the operands do not fit (and its note the user's line).
rows(
    "nn.LSTMCell",
    (
        "x of another size",
        lambda: _CELL(F(4), *_CELL.zeros_state())[0],
        run(f"{_ALIGNED} (6,) and (5, 2) are not aligned"),
    ),
    (
        "h of another size",
        lambda: _CELL(F(3), F(3), _CELL.zeros_state()[1])[0],
        run(f"{_ALIGNED} (6,) and (5, 2)"),
    ),
    (
        "int64 x",
        lambda: _CELL(ints(3), *_CELL.zeros_state())[0],
        made(TypeError, f"LSTMCell.__call__: {FLOATS} int64"),
    ),
    ("empty batch", lambda: _CELL(F(0, 3), *_CELL.zeros_state(0))[0], empty(0, 2)),
    ("NaN", lambda: _CELL(NAN(3), *_CELL.zeros_state())[0], nan(2)),
)
rows(
    "nn.GRUCell",
    (
        "x of another size",
        lambda: _GRU_CELL(F(4), _GRU_CELL.zeros_state()),
        run(f"{_ALIGNED} (6,) and (5, 2)"),
    ),
    (
        "int64 x",
        lambda: _GRU_CELL(ints(3), _GRU_CELL.zeros_state()),
        made(TypeError, f"GRUCell.__call__: {FLOATS} int64"),
    ),
    ("empty batch", lambda: _GRU_CELL(F(0, 3), _GRU_CELL.zeros_state(0)), empty(0, 2)),
)
rows(
    "nn.TreeLSTMCell",
    (
        "a leaf of another size",
        lambda: _TREE.leaf(F(4))[0],
        run(f"{_ALIGNED} (4,) and (3, 2) are not aligned (4 != 3)"),
    ),
    (
        "children of another size",
        lambda: _TREE.compose(F(2), F(2), F(3), F(2))[0],
        run(f"{_ALIGNED} (5,) and (4, 2)"),
    ),
    ("int64 leaf", lambda: _TREE.leaf(ints(3))[0], made(TypeError, f"TreeLSTMCell.leaf: {FLOATS} int64")),
)


def _sequence(name: str) -> None:
    layer: Any = getattr(nn, name).new(3, 2)
    rows(
        f"nn.{name}",
        ("a string", lambda: layer("hello"), made(TypeError, f"{name}: takes a list of sequences, got str")),
        (
            "one array, not a list",
            lambda: layer(F(4, 3)),
            made(TypeError, f"{name}: takes a list of sequences, got an"),
        ),
        ("a sequence of no steps", lambda: layer([[]]), made(ValueError, f"{name}: sequence 0 is empty")),
        ("an array of no steps", lambda: layer([F(0, 3)]), made(ValueError, f"{name}: sequence 0 is empty")),
        (
            "steps of another width",
            lambda: layer([F(4, 4)]),
            made(ValueError, f"{name}: sequence 0 is an array of shape"),
        ),
        (
            "a 3-d sequence",
            lambda: layer([F(2, 4, 3)]),
            made(ValueError, f"{name}: sequence 0 is an array of shape (2,"),
        ),
        (
            "a step of another size",
            lambda: layer([[F(3), F(4)]]),
            made(ValueError, f"{name}: step 1 of sequence 0 has"),
        ),
        ("int64 steps", lambda: layer([ints(4, 3)]), made(TypeError, f"{name}: sequence 0: {FLOATS} int64")),
        (
            "an int64 step",
            lambda: layer([[F(3), ints(3)]]),
            made(TypeError, f"{name}: step 1 of sequence 0: {FLOATS}"),
        ),
        ("no sequences", lambda: layer([]).outputs, Gives(lambda v: v == [], "no outputs")),
        ("NaN", lambda: layer([np.full((2, 3), np.nan)]).outputs[0][0], nan(2)),
    )


_sequence("LSTM")
_sequence("GRU")
rows(
    "nn.LayerNorm",
    (
        "features of another size",
        lambda: _LN(F(2, 4)),
        run("layer_norm: weight of shape (3,) does not fit x of shape"),
    ),
    ("a 0-d input", lambda: _LN(F()), run("layer_norm: x must have a feature axis, got shape ()")),
    (
        "eps 0",
        lambda: nn.LayerNorm(None, None, 0.0),
        made(ValueError, "LayerNorm: eps must be positive, got 0.0"),
    ),
    (
        "weight and bias of two sizes",
        lambda: nn.LayerNorm(W(3), W(4)),
        made(ValueError, "LayerNorm: weight and bias"),
    ),
    ("empty batch", lambda: _LN(F(0, 3)), empty(0, 3)),
)
rows(
    "nn.MultiHeadAttention",
    (
        "features of another size",
        lambda: _MHA(F(3, 5)),
        run(f"{_ALIGNED} (3, 5) and (4, 12) are not aligned (5 != 4)"),
    ),
    (
        "a mask of the wrong shape",
        lambda: _MHA(F(3, 4), mask=bools(2, 2)),
        run(f"{_SDPA}: mask of shape (2, 2) does"),
    ),
    (
        "keys and values of two lengths",
        lambda: _MHA(F(3, 4), F(2, 4), F(3, 4)),
        run(f"{_SDPA}: q (3, 4), k (2, 4)"),
    ),
    ("a 1-d query", lambda: _MHA(F(4)), run("self_attention: qkv must have 2 dimensions at least")),
    (
        "a mask as the key",
        lambda: _MHA(F(3, 4), bools(3, 3)),
        made(TypeError, "MultiHeadAttention: key is a boolean"),
    ),
    (
        "heads that do not divide",
        lambda: nn.MultiHeadAttention.new(4, 3),
        made(ValueError, "MultiHeadAttention: 3 heads"),
    ),
    ("a sequence of no steps", lambda: _MHA(F(0, 4)), empty(0, 4)),
)
rows(
    "nn.TransformerEncoderLayer",
    (
        "features of another size",
        lambda: _ENC(F(3, 5)),
        run(f"{_ALIGNED} (3, 5) and (4, 12) are not aligned (5 != 4)"),
    ),
    ("a sequence of no steps", lambda: _ENC(F(0, 4)), empty(0, 4)),
)


def _batch_norm(name: str, x: tuple[int, ...]) -> None:
    cls: Any = getattr(nn, name)
    layer = cls.new(3)
    shown = f"{name}(3, momentum=0.1, eps=1e-05)"
    none, one = (0, *x[1:]), (1, 3, *(1,) * (len(x) - 2))
    rows(
        f"nn.{name}",
        (
            "channels that do not fit",
            lambda: layer(F(x[0], 5, *x[2:])),
            run(f"{shown}: gamma must have shape (5,)"),
        ),
        ("another rank", lambda: layer(F(3)), run(f"{shown}: expected an input of")),
        ("a float input", lambda: layer(1.0), made(TypeError, f"{name}: expected an array, got float")),
        (
            "no channels",
            lambda: cls.new(0),
            made(ValueError, f"{name}.new: channels must be a positive int, got 0"),
        ),
        (
            "a momentum above 1",
            lambda: cls.new(3, momentum=1.5),
            made(ValueError, f"{name}: momentum must be in [0, 1]"),
        ),
        (
            "an empty batch in training",
            _train(lambda: layer(F(*none))),
            Gives(
                lambda v: v == 0.0,
                "a loss of 0, the running statistics as they were (PyTorch's)",
                gradients=False,
            ),
        ),
        (
            "one value per channel in training",
            _train(lambda: layer(F(*one))),
            run(f"{shown}: expected more than 1 value per channel when training, got a batch of shape {one}"),
        ),
        (
            "an empty batch in a prediction",
            lambda: layer(F(*none)),
            Gives(lambda v: np.shape(v) == none, "an empty result", gradients=False),
        ),
    )


_batch_norm("BatchNorm1d", (4, 3))
_batch_norm("BatchNorm2d", (4, 3, 2, 2))

# A layer where an op takes data that is no operand (indices, a condition, targets, a mask): its
# value is not known when the op is made.
_LAYER: Any = ml.relu(W(2))
rows(
    "indexing",
    ("a layer as rows", lambda: W(3, 4)[_LAYER], made(TypeError, "take_rows: expected integer indices")),
)
rows(
    "take_along_axis",
    (
        "a layer of indices",
        lambda: untyped.take_along_axis(W(3, 4), _LAYER),
        made(TypeError, f"{_ALONG} expected integer"),
    ),
)
rows("where", ("a layer condition", lambda: untyped.where(_LAYER, W(2), W(2)), made(TypeError, _CONDITION)))
rows(
    "cross_entropy",
    (
        "a layer of targets",
        lambda: untyped.cross_entropy(W(3, 4), _LAYER),
        made(TypeError, "cross_entropy: expected an"),
    ),
)
rows(
    _SDPA,
    (
        "a layer mask",
        lambda: _sdpa(W(2, 4), W(3, 4), W(3, 4), _LAYER),
        made(TypeError, f"{_SDPA}: mask must be"),
    ),
)

# The losses of monadl.dsl.ops.losses: targets of another shape, an unknown reduction, integer data.


def _pointwise_loss_rows(name: str, what: str) -> None:
    f = getattr(untyped, name)
    rows(
        name,
        (
            "targets of another shape",
            lambda: f(W(3, 4, fill=0.5), np.zeros((3, 5))),
            run(f"{name}: {what} of shape (3, 4) and targets of shape (3, 5) differ"),
        ),
        (
            "an unknown reduction",
            lambda: f(W(3, 4, fill=0.5), np.zeros((3, 4)), reduction="avg"),
            made(ValueError, f"{name}: reduction must be 'mean', 'sum' or 'none', got 'avg'"),
        ),
        (
            "integer targets",
            lambda: f(W(3, 4, fill=0.5), ints(3, 4)),
            made(TypeError, f"{name}: expected a floating-point array"),
        ),
        (
            "an empty batch",
            lambda: f(W(0, 4, fill=0.5), np.zeros((0, 4))),
            Gives(lambda v: bool(np.isnan(v)), "the mean of no elements is NaN (PyTorch's)", gradients=False),
        ),
    )


for _name, _what in (
    ("mse_loss", "predictions"),
    ("l1_loss", "predictions"),
    ("huber_loss", "predictions"),
    ("smooth_l1_loss", "predictions"),
    ("binary_cross_entropy", "probabilities"),
    ("binary_cross_entropy_with_logits", "logits"),
):
    _pointwise_loss_rows(_name, _what)
rows(
    "binary_cross_entropy",
    (
        "probabilities outside [0, 1]",
        lambda: ml.binary_cross_entropy(W(3, 4, fill=1.5), np.zeros((3, 4))),
        run("binary_cross_entropy: probabilities of shape (3, 4) must lie in [0, 1]", ValueError),
    ),
)
rows(
    "huber_loss",
    (
        "a negative delta",
        lambda: ml.huber_loss(W(3, 4), np.zeros((3, 4)), delta=-1.0),
        made(ValueError, "huber_loss: delta must be > 0 and finite, got -1.0"),
    ),
)
rows(
    "smooth_l1_loss",
    (
        "a negative beta",
        lambda: ml.smooth_l1_loss(W(3, 4), np.zeros((3, 4)), beta=-1.0),
        made(ValueError, "smooth_l1_loss: beta must be >= 0 and finite, got -1.0"),
    ),
)
rows(
    "nll_loss",
    (
        "a label out of range",
        lambda: ml.nll_loss(W(3, 4), np.array([0, 4, 1])),
        run("nll_loss: label 4 is out of range for 4 classes", ValueError),
    ),
    (
        "float labels",
        lambda: untyped.nll_loss(W(3, 4), np.zeros(3)),
        made(TypeError, "nll_loss: expected integer labels, got targets of dtype float64"),
    ),
    (
        "labels of the wrong rank",
        lambda: ml.nll_loss(W(3, 4), ints(3, 4, 5)),
        run("nll_loss: targets of shape (3, 4, 5) do not fit log-probabilities of shape (3, 4)"),
    ),
    (
        "a class weight of the wrong shape",
        lambda: ml.nll_loss(W(3, 4), np.array([0, 1, 1]), weight=np.ones(3)),
        run("nll_loss: a class weight of shape (3,) does not fit 4 classes"),
    ),
    (
        "an empty batch",
        lambda: ml.nll_loss(W(0, 4), ints(0)),
        run("nll_loss: log-probabilities of shape (0, 4) are empty"),
    ),
)
rows(
    "cross_entropy",
    (
        "label smoothing outside [0, 1]",
        lambda: ml.cross_entropy(W(3, 4), np.array([0, 1, 1]), label_smoothing=1.5),
        made(ValueError, "cross_entropy: label_smoothing must be in [0, 1], got 1.5"),
    ),
)

# The builders' sizes: a size of 0 divided by 0 in an initialiser, a negative one was NumPy's error.
_POSITIVE = "must be a positive int, got"
rows(
    "nn.Linear",
    ("no inputs", lambda: nn.Linear.new(0, 2), made(ValueError, f"Linear.new: inputs {_POSITIVE} 0")),
    (
        "negative outputs",
        lambda: nn.Linear.new(3, -1),
        made(ValueError, f"Linear.new: outputs {_POSITIVE} -1"),
    ),
    (
        "a float size",
        lambda: nn.Linear.new(bad(2.5), 2),
        made(TypeError, f"Linear.new: inputs {_POSITIVE} float 2.5"),
    ),
    (
        "a negative seed",
        lambda: nn.Linear.new(3, 2, seed=-1),
        made(ValueError, "Linear.new: seed must be a non-negative"),
    ),
    (
        "a 1-d w",
        lambda: nn.Linear(W(3)),
        made(ValueError, "Linear: w must have 2 dimensions (inputs, outputs)"),
    ),
)
rows(
    "nn.MLP",
    (
        "a layer of 0",
        lambda: nn.MLP.new([3, 0, 2]),
        made(ValueError, f"MLP.new: each of sizes [3, 0, 2] {_POSITIVE} 0"),
    ),
)
rows(
    "nn.Embedding",
    (
        "a negative count",
        lambda: nn.Embedding.new(-1, 3),
        made(ValueError, f"Embedding.new: count {_POSITIVE} -1"),
    ),
    ("rows of 0", lambda: nn.Embedding.new(5, 0), made(ValueError, f"Embedding.new: dim {_POSITIVE} 0")),
    (
        "a 1-d table",
        lambda: nn.Embedding(W(3)),
        made(ValueError, "Embedding: table must have 2 dimensions (count, dim)"),
    ),
)
rows(
    "nn.LSTMCell",
    ("no inputs", lambda: nn.LSTMCell.new(0, 2), made(ValueError, f"LSTMCell.new: inputs {_POSITIVE} 0")),
    (
        "a negative count of rows",
        lambda: _CELL.zeros_state(-1),
        made(ValueError, "LSTMCell.zeros_state: rows must be"),
    ),
)
rows(
    "nn.GRUCell",
    ("no hidden units", lambda: nn.GRUCell.new(3, 0), made(ValueError, f"GRUCell.new: hidden {_POSITIVE} 0")),
    (
        "a negative count of rows",
        lambda: _GRU_CELL.zeros_state(-1),
        made(ValueError, "GRUCell.zeros_state: rows must be"),
    ),
)
rows(
    "nn.TreeLSTMCell",
    (
        "no inputs",
        lambda: nn.TreeLSTMCell.new(0, 2),
        made(ValueError, f"TreeLSTMCell.new: embedding {_POSITIVE} 0"),
    ),
)
rows(
    "nn.LSTM",
    ("no hidden units", lambda: nn.LSTM.new(3, 0), made(ValueError, f"LSTM.new: hidden {_POSITIVE} 0")),
)
rows("nn.GRU", ("no inputs", lambda: nn.GRU.new(0, 2), made(ValueError, f"GRU.new: inputs {_POSITIVE} 0")))
rows(
    "nn.LayerNorm",
    ("no features", lambda: nn.LayerNorm.new(0), made(ValueError, f"LayerNorm.new: features {_POSITIVE} 0")),
)
rows(
    "nn.MultiHeadAttention",
    (
        "no features",
        lambda: nn.MultiHeadAttention.new(0, 1),
        made(ValueError, f"MultiHeadAttention.new: features {_POSITIVE} 0"),
    ),
    (
        "no heads",
        lambda: nn.MultiHeadAttention.new(4, 0),
        made(ValueError, f"MultiHeadAttention.new: heads {_POSITIVE} 0"),
    ),
)
rows(
    "nn.TransformerEncoderLayer",
    (
        "no feed-forward units",
        lambda: nn.TransformerEncoderLayer.new(4, 2, 0),
        made(ValueError, "TransformerEncoderLayer.new: feedforward"),
    ),
)
rows(
    "nn.BatchNorm1d",
    (
        "eps a string",
        lambda: nn.BatchNorm1d.new(3, eps=bad("a")),
        made(TypeError, "BatchNorm1d: eps must be a float, got str 'a'"),
    ),
)
rows(
    "nn.Dropout",
    (
        "a negative seed",
        lambda: nn.Dropout(0.5, seed=-1),
        made(ValueError, "Dropout: seed must be a non-negative"),
    ),
)
rows(
    "ArrayWeight",
    (
        "a negative side",
        lambda: ArrayWeight.zeros((-1,)),
        made(ValueError, "ArrayWeight.zeros: shape (-1,) has a negative side"),
    ),
    (
        "a negative side drawn",
        lambda: ArrayWeight.normal((3, -1)),
        made(ValueError, "ArrayWeight.normal: shape (3, -1) has a"),
    ),
    (
        "a shape that is an int",
        lambda: ArrayWeight.zeros(bad(3)),
        made(TypeError, "ArrayWeight.zeros: shape must be a sequence"),
    ),
)

# --------------------------------------------- image layers, padding, flattening, group and RMS norm

_CT = "conv_transpose2d"
rows(
    _CT,
    (
        "a kernel of other input channels",
        lambda: ml.conv_transpose2d(W(1, 3, 4, 4), W(2, 2, 3, 3)),
        run(f"{_CT}: x of shape (1, 3, 4, 4) (3 channels) and w of shape (2, 2, 3, 3) do not fit 1 group(s)"),
    ),
    (
        "groups that do not divide",
        lambda: ml.conv_transpose2d(W(1, 3, 4, 4), W(3, 2, 3, 3), groups=2),
        run(f"{_CT}: x of shape (1, 3, 4, 4) (3 channels) and w of shape (3, 2, 3, 3) do not fit 2 group(s)"),
    ),
    (
        "padding that crops the whole output",
        lambda: ml.conv_transpose2d(W(1, 3, 1, 1), W(3, 2, 1, 1), padding=1),
        run(f"{_CT}: an input of shape (1, 3, 1, 1), a kernel of shape (1, 1) and padding (1, 1) give"),
    ),
    (
        "negative padding",
        lambda: ml.conv_transpose2d(W(1, 3, 4, 4), W(3, 2, 3, 3), padding=-1),
        made(ValueError, f"{_CT}: padding must be 2 int(s) of at least 0"),
    ),
    (
        "output padding of the stride",
        lambda: ml.conv_transpose2d(W(1, 3, 4, 4), W(3, 2, 3, 3), stride=2, output_padding=2),
        made(ValueError, f"{_CT}: output_padding (2, 2) must be less than the stride"),
    ),
    (
        "a bias of another size",
        lambda: ml.conv_transpose2d(W(1, 3, 4, 4), W(3, 2, 3, 3), W(3)),
        run(f"{_CT}: bias of shape (3,) does not fit 2 output channels"),
    ),
    ("a 2-d input", lambda: ml.conv_transpose2d(W(3, 4), W(3, 2, 3, 3)), run(f"{_CT}: needs x of shape")),
    (
        "int64 x",
        lambda: untyped.conv_transpose2d(ints(1, 3, 4, 4), W(3, 2, 3, 3)),
        made(TypeError, f"{_CT}: {FLOATS} int64"),
    ),
    (
        "a float kernel",
        lambda: untyped.conv_transpose2d(W(1, 3, 4, 4), 0.5),
        made(TypeError, f"{_CT}: {ARRAY} for w"),
    ),
    ("empty batch", lambda: ml.conv_transpose2d(W(0, 3, 4, 4), W(3, 2, 3, 3), W(2)), empty(0, 2, 6, 6)),
    ("NaN", lambda: ml.conv_transpose2d(NAN(1, 3, 4, 4), W(3, 2, 3, 3)), nan(1, 2, 6, 6)),
)
_AP = "adaptive_avg_pool2d"
rows(
    _AP,
    (
        "a 1-d input",
        lambda: ml.adaptive_avg_pool2d(W(4), 2),
        run(f"{_AP}: needs an array of 2 axes at least"),
    ),
    (
        "an empty map",
        lambda: ml.adaptive_avg_pool2d(W(2, 0, 4), 2),
        run(f"{_AP}: an input of shape (2, 0, 4)"),
    ),
    (
        "an output of 0",
        lambda: ml.adaptive_avg_pool2d(W(2, 4, 4), 0),
        made(ValueError, f"{_AP}: output_size must be at least 1"),
    ),
    (
        "three sizes",
        lambda: ml.adaptive_avg_pool2d(W(2, 4, 4), (1, 2, 3)),
        made(ValueError, f"{_AP}: output_size must be"),
    ),
    (
        "a float size",
        lambda: untyped.adaptive_avg_pool2d(W(2, 4, 4), 1.5),
        made(TypeError, f"{_AP}: output_size must be ints"),
    ),
    (
        "int64 input",
        lambda: untyped.adaptive_avg_pool2d(ints(2, 4, 4), 2),
        made(TypeError, f"{_AP}: {FLOATS} int64"),
    ),
    ("empty batch", lambda: ml.adaptive_avg_pool2d(W(0, 3, 4, 4), (3, 2)), empty(0, 3, 3, 2)),
    (
        "an output larger than the input",
        lambda: ml.adaptive_avg_pool2d(W(2, 2, 3), 5),
        equal(lambda: np.ones((2, 5, 5)), "PyTorch's bins repeat rows"),
    ),
    ("NaN", lambda: ml.adaptive_avg_pool2d(NAN(2, 4, 4), 2), nan(2, 2, 2)),
)
rows(
    "pad",
    (
        "an odd count of widths",
        lambda: ml.pad(W(2, 3), (1, 2, 3)),
        made(ValueError, "pad: pad must hold pairs of widths"),
    ),
    (
        "more axes than the input",
        lambda: ml.pad(W(3), (1, 1, 1, 1)),
        run("pad: padding 4 numbers (the last 2 axes) needs an array of 2"),
    ),
    (
        "a crop past the input",
        lambda: ml.pad(W(2, 3), (-2, -2)),
        run("pad: widths (-2, -2) crop more than the 3 elements"),
    ),
    (
        "reflect as wide as the axis",
        lambda: ml.pad(W(2, 3), (3, 0), "reflect"),
        run("pad: reflect widths (3, 0) must be less than"),
    ),
    (
        "circular wider than the axis",
        lambda: ml.pad(W(2, 3), (0, 4), "circular"),
        run("pad: circular widths (0, 4) exceed"),
    ),
    (
        "replicate of an empty axis",
        lambda: ml.pad(W(2, 0), (1, 0), "replicate"),
        run("pad: replicate has no element"),
    ),
    (
        "a negative reflect width",
        lambda: ml.pad(W(2, 3), (-1, 0), "reflect"),
        made(ValueError, "pad: mode 'reflect' takes no negative"),
    ),
    (
        "an unknown mode",
        lambda: untyped.pad(W(2, 3), (1, 1), "wrap"),
        made(ValueError, "pad: mode must be one of"),
    ),
    (
        "a value with reflect",
        lambda: ml.pad(W(2, 3), (1, 1), "reflect", 2.0),
        made(ValueError, "pad: mode 'reflect' takes no value"),
    ),
    (
        "float widths",
        lambda: untyped.pad(W(2, 3), (1.0, 1.0)),
        made(TypeError, "pad: pad must be a sequence of ints"),
    ),
    ("int64 input", lambda: untyped.pad(ints(2, 3), (1, 1)), made(TypeError, f"pad: {FLOATS} int64")),
    ("empty batch", lambda: ml.pad(W(0, 3), (1, 1), "reflect"), empty(0, 5)),
    ("NaN", lambda: ml.pad(NAN(2, 3), (1, 1), "circular"), nan(2, 5)),
)
rows(
    "flatten",
    (
        "start after end",
        lambda: ml.flatten(W(2, 3, 4), 2, 1),
        run("flatten: start_dim 2 and end_dim 1 are not axes"),
    ),
    (
        "an axis past the input",
        lambda: ml.flatten(W(2, 3), 0, 2),
        run("flatten: start_dim 0 and end_dim 2 are not axes"),
    ),
    (
        "a float axis",
        lambda: untyped.flatten(W(2, 3), 1.0),
        made(TypeError, "flatten: start_dim must be an int"),
    ),
    ("int64 input", lambda: untyped.flatten(ints(2, 3)), made(TypeError, f"flatten: {FLOATS} int64")),
    ("empty batch", lambda: ml.flatten(W(0, 3, 2), 1), empty(0, 6)),
    (
        "a 0-d input",
        lambda: ml.flatten(W()),
        equal(lambda: np.ones(1), "torch.flatten: a 0-d tensor becomes (1,)"),
    ),
    ("NaN", lambda: ml.flatten(NAN(2, 3)), nan(6)),
)
rows(
    "group_norm",
    (
        "groups that do not divide",
        lambda: ml.group_norm(W(2, 6, 3), 4),
        run("group_norm: 4 groups do not divide the 6 channels"),
    ),
    (
        "a weight of another size",
        lambda: ml.group_norm(W(2, 6, 3), 2, W(4)),
        run("group_norm: weight of shape (4,) does not fit the 6"),
    ),
    (
        "a channel axis past the input",
        lambda: ml.group_norm(W(2, 6), 2, axis=2),
        run("group_norm: channel axis 2 is not an axis"),
    ),
    (
        "0 groups",
        lambda: ml.group_norm(W(2, 6), 0),
        made(ValueError, "group_norm: groups must be at least 1"),
    ),
    (
        "eps 0",
        lambda: ml.group_norm(W(2, 6), 2, eps=0.0),
        made(ValueError, "group_norm: eps must be a positive float"),
    ),
    (
        "int64 input",
        lambda: untyped.group_norm(ints(2, 6), 2),
        made(TypeError, f"group_norm: {FLOATS} int64"),
    ),
    ("empty batch", lambda: ml.group_norm(W(0, 6, 3), 2, W(6), W(6)), empty(0, 6, 3)),
    ("NaN", lambda: ml.group_norm(NAN(2, 6, 3), 3), nan(2, 6, 3)),
)
rows(
    "rms_norm",
    (
        "an input of other last axes",
        lambda: ml.rms_norm(W(2, 5), 4),
        run("rms_norm: x of shape (2, 5) does not end in the normalized shape (4,)"),
    ),
    (
        "a weight of another shape",
        lambda: ml.rms_norm(W(2, 5), 5, W(3)),
        run("rms_norm: weight of shape (3,) does not fit"),
    ),
    (
        "no normalized axes",
        lambda: ml.rms_norm(W(2, 5), ()),
        made(ValueError, "rms_norm: normalized_shape must be one size"),
    ),
    (
        "eps negative",
        lambda: ml.rms_norm(W(2, 5), 5, eps=-1.0),
        made(ValueError, "rms_norm: eps must be a positive float"),
    ),
    ("int64 input", lambda: untyped.rms_norm(ints(2, 5), 5), made(TypeError, f"rms_norm: {FLOATS} int64")),
    ("empty batch", lambda: ml.rms_norm(W(0, 5), 5, W(5)), empty(0, 5)),
    ("NaN", lambda: ml.rms_norm(NAN(2, 5), 5), nan(2, 5)),
)
_SEQ = nn.Sequential(nn.Linear.new(3, 4), ml.relu, nn.Linear.new(4, 2))
_DEC = nn.TransformerDecoderLayer.new(4, 2, 8)
rows(
    "nn.Sequential",
    (
        "inputs of another size",
        lambda: _SEQ(F(2, 5)),
        run(f"{_ALIGNED} (2, 5) and (3, 4) are not aligned (5 != 3)"),
    ),
    (
        "a layer that is no function",
        lambda: nn.Sequential(ml.relu, bad(3)),
        made(TypeError, "Sequential: layer 1 is a int"),
    ),
    ("int64 input", lambda: _SEQ(ints(2, 3)), made(TypeError, f"linear: {FLOATS} int64")),
    ("empty batch", lambda: _SEQ(F(0, 3)), empty(0, 2)),
)
rows(
    "nn.Flatten",
    ("a 1-d input", lambda: nn.Flatten()(F(4)), run("flatten: start_dim 1 and end_dim -1 are not axes")),
    ("empty batch", lambda: nn.Flatten()(F(0, 3, 2)), empty(0, 6)),
)
rows(
    "nn.ConvTranspose2d",
    (
        "no inputs",
        lambda: nn.ConvTranspose2d.new(0, 2, 3),
        made(ValueError, f"ConvTranspose2d.new: inputs {_POSITIVE} 0"),
    ),
    (
        "groups that do not divide",
        lambda: nn.ConvTranspose2d.new(3, 4, 3, groups=2),
        made(ValueError, "ConvTranspose2d.new: 3 inputs and 4 outputs"),
    ),
    (
        "a 3-d kernel",
        lambda: nn.ConvTranspose2d(W(3, 2, 3)),
        made(ValueError, "ConvTranspose2d: w must have 4 dimensions"),
    ),
    (
        "input channels of another count",
        lambda: nn.ConvTranspose2d.new(3, 2, 3)(F(1, 4, 5, 5)),
        run(f"{_CT}: x of shape (1, 4, 5, 5)"),
    ),
    ("empty batch", lambda: nn.ConvTranspose2d.new(3, 2, 2, stride=2)(F(0, 3, 2, 2)), empty(0, 2, 4, 4)),
)
rows(
    "nn.AdaptiveAvgPool2d",
    (
        "an output of 0",
        lambda: nn.AdaptiveAvgPool2d(0)(F(2, 4, 4)),
        made(ValueError, f"{_AP}: output_size must be at least 1"),
    ),
    ("empty batch", lambda: nn.AdaptiveAvgPool2d(1)(F(0, 3, 4, 4)), empty(0, 3, 1, 1)),
)
rows(
    "nn.GroupNorm",
    (
        "groups that do not divide",
        lambda: nn.GroupNorm.new(4, 6),
        made(ValueError, "GroupNorm.new: 4 groups do not divide 6 channels"),
    ),
    (
        "no channels",
        lambda: nn.GroupNorm.new(1, 0),
        made(ValueError, f"GroupNorm.new: channels {_POSITIVE} 0"),
    ),
    (
        "eps a string",
        lambda: nn.GroupNorm(None, None, 2, bad("a")),
        made(TypeError, "GroupNorm: eps must be a float, got str 'a'"),
    ),
    (
        "channels of another count",
        lambda: nn.GroupNorm.new(2, 4)(F(2, 6, 3)),
        run("group_norm: weight of shape (4,) does not fit the 6"),
    ),
    ("empty batch", lambda: nn.GroupNorm.new(2, 4)(F(0, 4, 3)), empty(0, 4, 3)),
)
rows(
    "nn.RMSNorm",
    (
        "a side of 0",
        lambda: nn.RMSNorm.new((3, 0)),
        made(ValueError, f"RMSNorm.new: each side of normalized_shape {_POSITIVE} 0"),
    ),
    (
        "a weight of another shape",
        lambda: nn.RMSNorm(W(3), (4,)),
        made(ValueError, "RMSNorm: weight of shape (3,) does not fit"),
    ),
    (
        "eps 0",
        lambda: nn.RMSNorm(None, (4,), 0.0),
        made(ValueError, "RMSNorm: eps must be positive, got 0.0"),
    ),
    (
        "features of another size",
        lambda: nn.RMSNorm.new(4)(F(2, 5)),
        run("rms_norm: x of shape (2, 5) does not end in"),
    ),
    ("empty batch", lambda: nn.RMSNorm.new(4)(F(0, 4)), empty(0, 4)),
)
rows(
    "nn.TransformerDecoderLayer",
    (
        "no features",
        lambda: nn.TransformerDecoderLayer.new(0, 1),
        made(ValueError, f"TransformerDecoderLayer.new: features {_POSITIVE} 0"),
    ),
    (
        "a dropout of 1",
        lambda: nn.TransformerDecoderLayer.new(4, 2, dropout=1.0),
        made(ValueError, "Dropout: p must be a float in [0, 1)"),
    ),
    (
        "a memory of another width",
        lambda: _DEC(F(3, 4), F(5, 3)),
        run(f"{_ALIGNED} (5, 3) and (4, 4) are not aligned (3 != 4)"),
    ),
    (
        "a memory mask of the wrong shape",
        lambda: _DEC(F(3, 4), F(5, 4), memory_mask=bools(2, 2)),
        run(f"{_SDPA}: mask of shape (2, 2) does"),
    ),
    ("a target of no steps", lambda: _DEC(F(0, 4), F(5, 4)), empty(0, 4)),
)

# ---------------------------------------------------------------------------- what is no op

_NOT_OPS: list[tuple[str, str]] = [
    (
        "a type: its operators have rows ('operator +', 'indexing')",
        "AnyArray AnyFloat AnyLayer Array ArrayLayer FloatLayer ArrayOperators FloatOperators",
    ),
    (
        "an optimizer or a schedule: their settings are checked in test_optimizer_state.py, test_schedules",
        "SGD Adagrad Adam AdamW RMSprop Momentum Optimizer Chain chain GradientTransform clip_by_global_norm "
        "clip_by_value "
        "global_norm Constant CosineDecay LearningRate LinearWarmup Schedule StepDecay",
    ),
    (
        "runs a layer (its ops' rows are the layer's): test_training.py, test_apply_gradients.py",
        "compute_gradients predict predict_blocking train train_blocking apply_gradients check_gradients "
        "is_training",
    ),
    ("checkpoints: test_checkpoint_fuzz.py fuzzes bad files", "save load CheckpointError"),
    (
        "the engine and its combinators, not ops: test_do.py, test_direct.py, test_batchable.py",
        "Do Executor default_executor set_default_executor gather pure parallel direct batchable gc_paused "
        "DeepLearning",
    ),
    (
        "makes ops, or what their forward reads: test_custom_op.py, test_run_context.py",
        "custom_op CustomOp ShapeRuleError RunContext",
    ),
    (
        "an exception",
        "ShapeError NoOptimizerError NonFiniteGradientError NonFiniteLossError NonFiniteBufferError "
        "GradientMismatch",
    ),
    (
        "a container or a buffer of a model, not a layer: test_module.py, test_buffers.py",
        "Module Buffer BufferState ArrayBuffer GeneratorBuffer buffers_of weights_of parameter_count summary "
        "to_device stage_buffer staged_data nn.Module",
    ),
    ("what nn.LSTM and nn.GRU give, not a layer", "nn.SequenceOutput"),
    ("a type of a parameter: the rows of the ops that take it check what it allows", "Reduction PadMode"),
    ("a data loader: its own arguments are checked in test_loader.py", "DataLoader"),
    ("initialisers: test_init.py", "nn.init"),
]
NOT_OPS: dict[str, str] = {name: why for why, names in _NOT_OPS for name in names.split()}
"""The public names that are no op or layer, with why they have no row (and where their own
checks are tested)."""


def public_ops() -> set[str]:
    """Every name of ``monadl.__all__`` and of ``monadl.nn.__all__`` (as ``nn.X``) that is no
    re-export of a top-level name, less those of :data:`NOT_OPS`."""
    top = set(ml.__all__)
    layers = {f"nn.{name}" for name in nn.__all__ if name not in top or name == "Dropout"}
    return (top | layers) - set(NOT_OPS)


# ---------------------------------------------------------------------------------------- tests


def _outcome(build: Callable[[], object]) -> tuple[str, Any]:
    """``("made", error)``, ``("run", error)`` or ``("value", value)``."""
    try:
        made = build()
    except Exception as error:  # noqa: BLE001 - any exception is an outcome the row judges
        return "made", error
    if isinstance(made, (FloatLayer, ArrayLayer)):
        result = made.predict_blocking()
    elif isinstance(made, Result):
        result = made
    else:
        return "value", made
    return ("value", result.unwrap()) if is_successful(result) else ("run", result.failure())


def _loss(made: object) -> FloatLayer | None:
    if isinstance(made, ArrayLayer):
        return ml.sum(made)
    return made if isinstance(made, FloatLayer) else None


@pytest.mark.parametrize("row", ROWS, ids=str)
def test_row(row: Row) -> None:
    when, got = _outcome(row.build)
    expect = row.expect
    if isinstance(expect, Raises):
        assert when == expect.when, f"expected {expect.kind.__name__} when {expect.when}, got {when}: {got!r}"
        assert isinstance(got, expect.kind), f"expected {expect.kind.__name__}, got {got!r}"
        assert str(got).startswith(expect.message), f"expected {expect.message!r}..., got {str(got)!r}"
        if when == "run":
            made = row.build()
            if isinstance(made, ArrayLayer):  # its .shape: never a shape for a graph that cannot run
                try:
                    shape = made.shape
                except ValueError as error:
                    assert str(error) == str(got) or str(error).startswith(expect.message), str(error)
                else:
                    assert shape is None, f".shape {shape} for a graph whose run fails: {got!r}"
        return
    assert when == "value", f"expected a value ({expect.why}), got {when}: {got!r}"
    assert expect.check(got), f"{got!r} is not {expect.why}"
    made = row.build()
    loss = _loss(made)
    if loss is None or not expect.gradients:
        return
    finite = bool(np.all(np.isfinite(got))) if np.size(got) else True
    if not finite:
        with pytest.raises(NonFiniteLossError):
            ml.compute_gradients(loss)
        return
    _, gradients = ml.compute_gradients(loss)
    for weight, gradient in gradients.items():
        assert np.shape(gradient) == weight.shape, (
            f"the gradient of {weight!r} has shape {np.shape(gradient)}"
        )
        assert np.all(np.isfinite(np.asarray(gradient))), f"the gradient of {weight!r} is not finite"


def test_every_public_op_and_layer_has_rows() -> None:
    covered = {row.op for row in ROWS}
    missing = sorted(public_ops() - covered)
    assert not missing, (
        f"public ops and layers with no row in the table (add rows, or to NOT_OPS with why): {missing}"
    )


def test_a_new_public_op_without_rows_fails_the_table(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ml, "__all__", [*ml.__all__, "new_op"])
    monkeypatch.setattr(nn, "__all__", [*nn.__all__, "NewLayer"])
    with pytest.raises(AssertionError, match=re.escape("['new_op', 'nn.NewLayer']")):
        test_every_public_op_and_layer_has_rows()


def test_the_table_names_only_what_exists() -> None:
    names = set(ml.__all__) | {f"nn.{name}" for name in nn.__all__}
    operators = {row.op for row in ROWS if row.op.startswith("operator ") or row.op == "indexing"}
    assert not {row.op for row in ROWS} - names - operators
    assert not set(NOT_OPS) - names


def test_rows_are_unique() -> None:
    keys = [str(row) for row in ROWS]
    assert len(keys) == len(set(keys)), sorted(k for k in keys if keys.count(k) > 1)
