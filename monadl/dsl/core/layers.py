"""``FloatLayer`` and ``ArrayLayer``: differentiable expressions, and their typed operators.

Operators accept any mix of literal (float, array), weight and layer and return a layer. The result
type follows the operands: float with float gives a ``FloatLayer``, anything with an array gives an
``ArrayLayer``. The operator mixins are shared by layers and weights (``weights.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from types import EllipsisType
from typing import TYPE_CHECKING, Any, Final, Self, TypeAlias, TypeVar, cast, final, overload

import numpy as np
from mypy_extensions import mypyc_attr
from numpy.typing import NDArray
from returns.future import FutureResult
from returns.result import Result

from monadl.do.do import Do, Node, Ref, as_node
from monadl.do.executor import Executor
from monadl.do.graph import Graph, row_of
from monadl.do.primitive import Primitive
from monadl.do.tape import Tape
from monadl.dsl.core.apply import apply_primitive
from monadl.dsl.core.base import Differentiable
from monadl.dsl.core.deep_learning import forbid_truth_value
from monadl.dsl.core.indices import row_params
from monadl.dsl.learning import training
from monadl.dsl.ops.operators import ADD, DIV, GETITEM, MATMUL, MUL, NEG, POW, SUB, TAKE_ROWS, basic_index
from monadl.typeclasses.backend import Array, RowIndices, is_array

if TYPE_CHECKING:
    from monadl.dsl.learning.optimizers.base import Optimizer

BasicIndex: TypeAlias = "int | np.integer[Any] | slice | EllipsisType | None"
"""An entry of a basic index (``layer[:, 1:3]``, ``layer[..., 0]``)."""
IndexEntry: TypeAlias = "BasicIndex | Sequence[int] | NDArray[Any]"
"""An entry of an index: a basic one, or an integer or boolean array or a list (advanced indexing)."""
Index: TypeAlias = "RowIndices | slice | EllipsisType | NDArray[np.bool_] | tuple[IndexEntry, ...]"
"""What indexes an array layer or weight: rows (an embedding lookup), a basic index, or integer
arrays and lists in a tuple, or a boolean mask (advanced indexing)."""


def is_float_kind(x: object) -> bool:
    """True for operands of float type: floats, ints, float weights and float layers."""
    kind = type(x)  # the common operands first, before the slower isinstance of a tuple
    if kind is ArrayLayer:
        return False
    if kind is FloatLayer or kind is float:
        return True
    return isinstance(x, (FloatOperators, float, int))


def apply(prim: Primitive, *operands: object, **params: Any) -> FloatLayer | ArrayLayer:
    """``prim`` applied to ``operands``: a ``FloatLayer`` if all are floats, else an ``ArrayLayer``."""
    graph, row = apply_primitive(prim, operands, params)
    for x in operands:  # a loop, not all() of a generator: this runs for every op recorded
        if not is_float_kind(x):
            return array_layer(graph, row)
    return float_layer(graph, row)


def apply_array(prim: Primitive, *operands: object, **params: Any) -> ArrayLayer:
    """``prim`` applied to ``operands``, known to give an array."""
    graph, row = apply_primitive(prim, operands, params)
    return array_layer(graph, row)


def apply_float(prim: Primitive, *operands: object, **params: Any) -> FloatLayer:
    """``prim`` applied to ``operands``, known to give a float."""
    return float_op(prim, operands, params)


def array_op(prim: Primitive, operands: tuple[object, ...], params: dict[str, Any]) -> ArrayLayer:
    """:func:`apply_array` of the operands and parameters as a tuple and a dict (see
    :func:`float_op`)."""
    graph, row = apply_primitive(prim, operands, params)
    return array_layer(graph, row)


NO_PARAMS: Final[dict[str, Any]] = {}
"""The parameters of an op that has none, for :func:`array_op` and :func:`float_op`: shared by
every such op, and never changed."""


def float_op(prim: Primitive, operands: tuple[object, ...], params: dict[str, Any]) -> FloatLayer:
    """:func:`apply_float` of the operands and parameters as a tuple and a dict, no keywords for the
    compiled function to parse: what a loss made once per node of a tree calls from interpreted
    code. ``params``: the op keeps it, and nothing changes it (ops may share one: see
    ``classification.LABEL_PARAMS``)."""
    graph, row = apply_primitive(prim, operands, params)
    return float_layer(graph, row)


def float_layer(graph: Graph, row: int) -> FloatLayer:
    """The layer of row ``row`` of ``graph``, a float."""
    return FloatLayer(Ref(graph, row))


def array_layer(graph: Graph, row: int) -> ArrayLayer:
    """The layer of row ``row`` of ``graph``, an array."""
    return ArrayLayer(Ref(graph, row))


@mypyc_attr(allow_interpreted_subclasses=True)
class FloatOperators(Differentiable):
    """Operators of float-typed differentiable values (``FloatLayer``, ``FloatWeight``)."""

    __slots__ = ()

    @property
    def forward(self) -> Do[Tape[float, float]]:
        """The lazy forward pass: a tape of the value and of the way back to its weights."""
        return cast(Do[Tape[float, float]], self.node())

    def __await__(self) -> Generator[Node, Any, float]:
        tape: Tape[float, float] = yield self.node()
        return tape.data

    @overload
    def __add__(self, other: AnyFloat) -> FloatLayer: ...
    @overload
    def __add__(self, other: AnyArray) -> ArrayLayer: ...
    def __add__(self, other: AnyFloat | AnyArray) -> FloatLayer | ArrayLayer:
        return apply(ADD, self, other)

    @overload
    def __radd__(self, other: float) -> FloatLayer: ...
    @overload
    def __radd__(self, other: Array) -> ArrayLayer: ...
    def __radd__(self, other: float | Array) -> FloatLayer | ArrayLayer:
        return apply(ADD, other, self)

    @overload
    def __sub__(self, other: AnyFloat) -> FloatLayer: ...
    @overload
    def __sub__(self, other: AnyArray) -> ArrayLayer: ...
    def __sub__(self, other: AnyFloat | AnyArray) -> FloatLayer | ArrayLayer:
        return apply(SUB, self, other)

    @overload
    def __rsub__(self, other: float) -> FloatLayer: ...
    @overload
    def __rsub__(self, other: Array) -> ArrayLayer: ...
    def __rsub__(self, other: float | Array) -> FloatLayer | ArrayLayer:
        return apply(SUB, other, self)

    @overload
    def __mul__(self, other: AnyFloat) -> FloatLayer: ...
    @overload
    def __mul__(self, other: AnyArray) -> ArrayLayer: ...
    def __mul__(self, other: AnyFloat | AnyArray) -> FloatLayer | ArrayLayer:
        return apply(MUL, self, other)

    @overload
    def __rmul__(self, other: float) -> FloatLayer: ...
    @overload
    def __rmul__(self, other: Array) -> ArrayLayer: ...
    def __rmul__(self, other: float | Array) -> FloatLayer | ArrayLayer:
        return apply(MUL, other, self)

    @overload
    def __truediv__(self, other: AnyFloat) -> FloatLayer: ...
    @overload
    def __truediv__(self, other: AnyArray) -> ArrayLayer: ...
    def __truediv__(self, other: AnyFloat | AnyArray) -> FloatLayer | ArrayLayer:
        return apply(DIV, self, other)

    @overload
    def __rtruediv__(self, other: float) -> FloatLayer: ...
    @overload
    def __rtruediv__(self, other: Array) -> ArrayLayer: ...
    def __rtruediv__(self, other: float | Array) -> FloatLayer | ArrayLayer:
        return apply(DIV, other, self)

    @overload
    def __pow__(self, other: AnyFloat) -> FloatLayer: ...
    @overload
    def __pow__(self, other: AnyArray) -> ArrayLayer: ...
    def __pow__(self, other: AnyFloat | AnyArray) -> FloatLayer | ArrayLayer:
        return apply(POW, self, other)

    @overload
    def __rpow__(self, other: float) -> FloatLayer: ...
    @overload
    def __rpow__(self, other: Array) -> ArrayLayer: ...
    def __rpow__(self, other: float | Array) -> FloatLayer | ArrayLayer:
        return apply(POW, other, self)

    def __neg__(self) -> FloatLayer:
        return apply_float(NEG, self)

    def __pos__(self) -> Self:
        return self

    @property
    def shape(self) -> tuple[()]:
        """``()``: a float has no axes (as a NumPy scalar's shape), whatever its graph (an array
        layer's raises its run's error where its graph cannot run: :attr:`ArrayOperators.shape`)."""
        # (No check of the graph here: compiled, a getter of type tuple[()] cannot raise.)
        return ()

    @property
    def dtype(self) -> type[float]:
        """``float``: a Python float, which takes an array's dtype where it meets one (a float32
        array plus a float layer is float32)."""
        return float


@mypyc_attr(allow_interpreted_subclasses=True)
class ArrayOperators(Differentiable):
    """Operators of array-typed differentiable values (``ArrayLayer``, ``ArrayWeight``)."""

    __slots__ = ()

    @property
    def forward(self) -> Do[Tape[Array, Array]]:
        """The lazy forward pass: a tape of the value and of the way back to its weights."""
        return cast(Do[Tape[Array, Array]], self.node())

    def __await__(self) -> Generator[Node, Any, Array]:
        tape: Tape[Array, Array] = yield self.node()
        return tape.data

    def __add__(self, other: AnyFloat | AnyArray) -> ArrayLayer:
        return apply_array(ADD, self, other)

    def __radd__(self, other: float | Array) -> ArrayLayer:
        return apply_array(ADD, other, self)

    def __sub__(self, other: AnyFloat | AnyArray) -> ArrayLayer:
        return apply_array(SUB, self, other)

    def __rsub__(self, other: float | Array) -> ArrayLayer:
        return apply_array(SUB, other, self)

    def __mul__(self, other: AnyFloat | AnyArray) -> ArrayLayer:
        return apply_array(MUL, self, other)

    def __rmul__(self, other: float | Array) -> ArrayLayer:
        return apply_array(MUL, other, self)

    def __truediv__(self, other: AnyFloat | AnyArray) -> ArrayLayer:
        return apply_array(DIV, self, other)

    def __rtruediv__(self, other: float | Array) -> ArrayLayer:
        return apply_array(DIV, other, self)

    def __pow__(self, other: AnyFloat | AnyArray) -> ArrayLayer:
        return apply_array(POW, self, other)

    def __rpow__(self, other: float | Array) -> ArrayLayer:
        return apply_array(POW, other, self)

    def __matmul__(self, other: AnyArray) -> ArrayLayer:
        return apply_array(MATMUL, self, other)

    def __rmatmul__(self, other: Array) -> ArrayLayer:
        return apply_array(MATMUL, other, self)

    def __neg__(self) -> ArrayLayer:
        return apply_array(NEG, self)

    def __pos__(self) -> Self:
        return self

    @property
    def shape(self) -> tuple[int, ...] | None:
        """The shape of this array, where it is known before it runs, else None. A weight's or a
        constant's is its data's; an op's follows from its inputs' by the op's rule: elementwise
        ops and activations (broadcasting), ``matmul``, ``linear``, the reductions, ``reshape``,
        ``transpose``, ``concatenate``, ``stack``, ``split``, indexing (basic and advanced),
        ``take_rows``, ``take_along_axis``, ``where``, ``softmax``, ``log_softmax``,
        ``batch_norm``, dropout, convolutions and pools. A ``@batchable`` call's result, a
        ``custom_op``'s and anything that depends on one are None (:mod:`monadl.dsl.core.shapes`).
        Worked out on first access, not while the graph is built. A graph that cannot run has no
        shape: where an op's operands do not fit it (``zeros((3, 4)) @ zeros((5, 2))``), this
        raises the error its run would give, a :class:`~monadl.ShapeError` naming the op."""
        info = _static(self)
        return None if info is None else info[0]

    @property
    def dtype(self) -> Any:
        """The dtype of this array (of its namespace: ``numpy.float32``'s dtype for NumPy), where it
        is known before it runs, else None (where :attr:`shape` is). It is the run's: a constant
        operand wider than the layers it meets takes their dtype, then NumPy 2's promotion of the
        array operands' dtypes (``result_type``); a Python float operand keeps an array's. It
        raises where :attr:`shape` does."""
        info = _static(self)
        return None if info is None else info[1]

    def __getitem__(self, key: Index) -> ArrayLayer:
        """``self[key]``. Rows of this array for an int (0 or more), a list or an integer array of
        them (an embedding lookup, its delta sparse rows: see :func:`monadl.take_rows`); else
        NumPy's basic indexing, whose delta is the result's in zeros of this array's shape: slices
        (``x[:, a:b]``, ``x[::-1]``), ints that drop their axis (``x[..., 3]``, ``x[-1]``), ``None``
        (a new axis: ``x[None, :]``, not ``x[None]`` alone) and one ``...``, in a tuple. A tuple of
        integer arrays or lists (``x[rows, cols]``, ``x[:, rows]``) or a boolean mask (``x[mask]``)
        is NumPy's advanced indexing, its delta one scatter-add (see
        :func:`monadl.dsl.ops.selection.index_arrays`)."""
        kind = type(key)
        if kind is int:  # one row (a word of a tree), or one from the end
            basic = cast(int, key) < 0
        elif kind is tuple or kind is slice or key is Ellipsis:
            basic = True  # (None alone is no index, as before: ``x[None, ...]`` adds an axis)
            if kind is tuple and _has_arrays(cast(tuple[Any, ...], key)):
                return _index_arrays(self, key)
        else:
            basic = isinstance(key, np.integer) and int(key) < 0
            if not basic and str(getattr(key, "dtype", "")).endswith("bool"):  # a boolean mask
                return _index_arrays(self, key)
        if basic:
            return apply_array(GETITEM, self, index=basic_index(key), axis=0)
        return array_op(TAKE_ROWS, (self,), row_params(cast(RowIndices, key)))


STATIC_INFO: Final[list[Callable[[Graph, int], tuple[tuple[int, ...], Any, Any] | None]]] = []
"""What ``.shape`` and ``.dtype`` ask: :func:`monadl.dsl.core.shapes.static_info`, registered by that
module, whose rules build on the op modules that build on this one; ``monadl`` imports it."""


def _static(x: ArrayOperators) -> tuple[tuple[int, ...], Any, Any] | None:
    if not STATIC_INFO:
        return None  # (monadl.dsl.core.shapes not imported: nothing is known)
    graph = x.graph
    if graph is not None:
        return STATIC_INFO[0](graph, x.row)
    graph = Graph()  # a weight's: its own row
    return STATIC_INFO[0](graph, graph.node(x.node()))


def _has_arrays(key: tuple[Any, ...]) -> bool:
    """Whether an index holds an array or a list (advanced indexing), not only basic entries."""
    for e in key:
        if type(e) is list or type(e) is np.ndarray:
            return True
        if is_array(e) and not isinstance(e, np.generic):
            return True
    return False


ADVANCED_INDEX: Final[list[Callable[[Any, object], ArrayLayer]]] = []
"""The op of ``x[rows, cols]`` (advanced indexing), registered by :mod:`monadl.dsl.ops.selection`,
which builds on this module (importing it here would be a cycle); ``monadl`` imports it."""


def _index_arrays(x: ArrayOperators, key: object) -> ArrayLayer:
    if not ADVANCED_INDEX:
        raise TypeError("getitem: advanced indexing needs monadl.dsl.ops.selection (import monadl)")
    return ADVANCED_INDEX[0](x, key)


@final
class FloatLayer(FloatOperators):
    """A differentiable expression of type float."""

    __slots__ = ()

    def __init__(self, forward: Do[Tape[float, float]]) -> None:
        if type(forward) is Ref:  # (a row's own layer: the commonest, first)
            self.graph, self.row = forward.graph, forward.row
        else:
            self.graph, self.row = row_of(as_node(forward))
        self.variable = None

    def predict(self, *, executor: Executor | None = None) -> FutureResult[float, Exception]:
        """The forward value, as a ``FutureResult`` (computed when awaited): awaited, an
        ``IOResult[float, Exception]`` (see :func:`monadl.predict`)."""
        return training.predict(self, executor=executor)

    def train(
        self, optimizer: Optimizer | None = None, *, executor: Executor | None = None
    ) -> FutureResult[float, Exception]:
        """One training step on this loss, as a ``FutureResult`` (computed when awaited): awaited,
        an ``IOResult[float, Exception]`` (see :func:`monadl.train`)."""
        return training.train(self, optimizer, executor=executor)

    def predict_blocking(self, *, executor: Executor | None = None) -> Result[float, Exception]:
        """The forward value, computed now."""
        return training.predict_blocking(self, executor=executor)

    def train_blocking(
        self, optimizer: Optimizer | None = None, *, executor: Executor | None = None
    ) -> Result[float, Exception]:
        """One training step, now: the loss, or the failure (and then no weight changed)."""
        return training.train_blocking(self, optimizer, executor=executor)


@final
class ArrayLayer(ArrayOperators):
    """A differentiable expression of array type."""

    __slots__ = ()

    def __init__(self, forward: Do[Tape[Array, Array]]) -> None:
        if type(forward) is Ref:  # (a row's own layer: the commonest, first)
            self.graph, self.row = forward.graph, forward.row
        else:
            self.graph, self.row = row_of(as_node(forward))
        self.variable = None

    def predict(self, *, executor: Executor | None = None) -> FutureResult[Array, Exception]:
        """The forward value, as a ``FutureResult`` (computed when awaited): awaited, an
        ``IOResult[Array, Exception]`` (see :func:`monadl.predict`)."""
        return training.predict(self, executor=executor)

    def train(
        self, optimizer: Optimizer | None = None, *, executor: Executor | None = None
    ) -> FutureResult[Array, Exception]:
        """One training step on this loss, as a ``FutureResult`` (computed when awaited): awaited,
        an ``IOResult[Array, Exception]`` (see :func:`monadl.train`)."""
        return training.train(self, optimizer, executor=executor)

    def predict_blocking(self, *, executor: Executor | None = None) -> Result[Array, Exception]:
        """The forward value, computed now."""
        return training.predict_blocking(self, executor=executor)

    def train_blocking(
        self, optimizer: Optimizer | None = None, *, executor: Executor | None = None
    ) -> Result[Array, Exception]:
        """One training step on the sum of this array (seeded with ones), now."""
        return training.train_blocking(self, optimizer, executor=executor)


# Each compiled class's own slot (see ``forbid_truth_value``): ``if layer:`` is an error.
for _cls in (FloatOperators, ArrayOperators, FloatLayer, ArrayLayer):
    forbid_truth_value(_cls)

# The operand types, as values (not strings), so that tools that read annotations at run time
# (documentation) resolve them wherever they are used. ``FloatOperators`` is the base of
# ``FloatWeight`` and ``FloatLayer``, ``ArrayOperators`` that of ``ArrayWeight`` and ``ArrayLayer``.
AnyFloat: TypeAlias = float | FloatLayer | FloatOperators
"""Anything usable where a differentiable float is expected: a float, a float layer or weight (or
what :data:`AnyLayer` gives for a float weight)."""
AnyArray: TypeAlias = Array | ArrayLayer | ArrayOperators
"""Anything usable where a differentiable array is expected: an array, an array layer or weight (or
what :data:`AnyLayer` gives for an array weight)."""

AnyLayer = TypeVar("AnyLayer", FloatLayer, ArrayLayer, FloatOperators, ArrayOperators)
"""The type variable of a function polymorphic over the kind of its operands, as ``AnyStr`` is
over ``str`` and ``bytes``: ``def swish(x: AnyLayer) -> AnyLayer: return x * sigmoid(x)`` takes
layers and weights of either kind, as they are. A ``FloatLayer`` gives a ``FloatLayer`` and an
``ArrayLayer`` an ``ArrayLayer``; a weight, or weights and layers of one kind together, give that
kind's base, ``FloatOperators`` or ``ArrayOperators``, which every op and operator takes (and
:func:`~monadl.lift` makes a layer again, for ``predict`` and ``train``). Operands of two kinds
are rejected, and so are plain floats and arrays (``lift`` them: ``ndarray * ndarray`` is no layer).

A weight cannot give its layer type here: ``FloatWeight`` is no ``FloatLayer`` (it has no
``predict`` or ``train``), and a type variable's value for an argument is a type that the
argument's type is a subtype of. ``TypeVar("L", FloatLayer, ArrayLayer)`` rejects weights."""
