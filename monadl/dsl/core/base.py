"""The base class of layers and weights: a differentiable value with a lazy ``forward``."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, NoReturn

from mypy_extensions import mypyc_attr

from monadl.do.do import Node, Ref
from monadl.dsl.core.deep_learning import forbid_array_value, no_truth_value

if TYPE_CHECKING:
    from monadl.do.graph import Graph


@mypyc_attr(allow_interpreted_subclasses=True)
class Differentiable:
    """A layer or a weight. It is its own ``DeepLearning`` witness: it has a ``forward`` (typed by
    its kind, in ``FloatOperators`` and ``ArrayOperators``).

    A layer is a handle: ``graph`` and ``row``, its row in the graph that recorded it
    (``monadl.do.graph``). A weight is no row of any one graph: its ``variable`` is the node that
    every graph reads it by (``graph`` is None).

    ``__array_ufunc__ = None`` makes ``ndarray * layer`` call our reflected operator instead of
    building an object array. NumPy's functions and ``numpy.asarray`` refuse it, with a
    ``TypeError`` naming monadl's op (:func:`~monadl.dsl.core.deep_learning.forbid_array_value`).
    ``await x`` (in a ``@direct`` function) gives its forward data, shared with every
    differentiable use of ``x`` in the same run.
    """

    __slots__ = ("graph", "row", "variable")
    __array_ufunc__: ClassVar[None] = None
    graph: Graph | None
    row: int
    variable: Node | None

    def node(self) -> Node:
        """The ``Do`` of this value: a layer's row, or a weight's node."""
        graph = self.graph
        if graph is not None:
            return Ref(graph, self.row)
        variable = self.variable
        assert variable is not None
        return variable

    # A class attribute, not a method: mypy reads its NoReturn (``if layer:`` is unreachable code,
    # which --strict with warn_unreachable reports), and mypyc compiles only bool-returning methods.
    __bool__: ClassVar[Callable[[Any], NoReturn]] = no_truth_value


forbid_array_value(Differentiable)
