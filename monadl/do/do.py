"""``Do[A]``: an immutable, lazy description of a computation that yields an ``A``.

Nothing runs until an :class:`~monadl.do.executor.Executor` interprets it. A ``Do`` is a small graph
of nodes, each a final class with a ``tag`` that the scheduler dispatches on: the monad's own nodes,
whose graph is known only once they ran (user code runs inside them):

==========  =================================================================================
Pure        a value that is already known (``Pure(Tape(x))``: a constant of the program)
Delay       ``thunk()`` computes the value when a run reaches the node
Defer       ``thunk()`` returns the ``Do`` to continue with (recursion, dynamic structure)
Bind        waits for its ``sources`` (independent, possibly concurrent), then ``MAP``:
            ``f(*values)`` is the value; ``FLAT``: it is the next ``Do``; ``KERNEL_MAP``: it is
            numeric work the executor may run on its pool
Kernel      ``fn(*args)``: numeric work for the pool (or inline, if too small)
Variable    a weight, read as of the run's snapshot (a weight's ``forward``)
Ref         a row of a :class:`~monadl.do.graph.Graph`: a layer's ``forward``
==========  =================================================================================

The differentiable program itself (ops, batchable calls and their results) is no node here: it is
rows of a graph (``graph.py``), one row per op, which a ``Ref`` names. Within one run, a node reached
through several paths is evaluated once (nodes are compared by identity, rows by graph and index).
``Do`` itself is a protocol, for the type checker: the nodes are plain classes, so that compiled they
need no instance dictionary.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable
from typing import TYPE_CHECKING, Any, Final, Protocol, TypeVar, final, overload

from mypy_extensions import mypyc_attr

from monadl.do.stats import kind_number

if TYPE_CHECKING:
    from monadl.do.graph import Graph

A = TypeVar("A")
B = TypeVar("B")
C = TypeVar("C")
D = TypeVar("D")
A_co = TypeVar("A_co", covariant=True)

# Node tags, for the scheduler's dispatch.
PURE: Final = 0
DELAY: Final = 1
DEFER: Final = 2
BIND: Final = 3
KERNEL: Final = 4
VARIABLE: Final = 5
REF: Final = 6

# Bind modes.
MAP: Final = 0
FLAT: Final = 1
KERNEL_MAP: Final = 2


class Do(Protocol[A_co]):
    """A lazy computation yielding ``A``. Build with :func:`pure`, :func:`delay`, :func:`defer`,
    :func:`kernel`, :func:`gather`; combine with :meth:`map` and :meth:`flat_map`."""

    def map(self, f: Callable[[A_co], B]) -> Do[B]:
        """The value transformed by ``f``, on the scheduler's thread (keep ``f`` cheap)."""
        ...

    def flat_map(self, f: Callable[[A_co], Do[B]]) -> Do[B]:
        """Run ``self``, then the ``Do`` that ``f`` makes of its value: a sequencing point."""
        ...

    def map_kernel(self, f: Callable[[A_co], B], cost: float = 0.0) -> Do[B]:
        """Like :meth:`map`, but ``f`` is numeric work that the executor may run on its pool."""
        ...

    def zip(self, other: Do[B]) -> Do[tuple[A_co, B]]:
        """Both values, evaluated independently (possibly concurrently)."""
        ...

    def __await__(self) -> Generator[Node, Any, A_co]:
        """In a coroutine run by :func:`~monadl.do.coroutine.from_coroutine`: this value."""
        ...


class Node:
    """A node of a ``Do`` graph: its ``tag`` (which class it is) and the nodes whose values it
    reads."""

    tag: int
    sources: tuple[Node, ...]

    def map(self, f: Callable[[Any], Any]) -> Node:
        return Bind((self,), f, MAP)

    def flat_map(self, f: Callable[[Any], Any]) -> Node:
        return Bind((self,), f, FLAT)

    def map_kernel(self, f: Callable[[Any], Any], cost: float = 0.0) -> Node:
        return Bind((self,), f, KERNEL_MAP, cost)

    def zip(self, other: Do[Any]) -> Node:
        return Bind((self, as_node(other)), tuple_of, MAP)

    def __await__(self) -> Generator[Node, Any, Any]:
        value = yield self
        return value


def tuple_of(*values: Any) -> tuple[Any, ...]:
    return values


def as_node(do: object) -> Node:
    """``do`` as a node, or a TypeError (a ``Do`` is always one; a user's value may not be)."""
    if isinstance(do, Node):
        return do
    raise TypeError(f"expected a Do, got {type(do).__name__}")


@final
class Pure(Node):
    """A value that is already known."""

    def __init__(self, value: Any) -> None:
        self.tag = PURE
        self.sources = ()
        self.value = value

    def __repr__(self) -> str:
        return f"Pure({self.value!r})"


@final
class Delay(Node):
    def __init__(self, thunk: Callable[[], Any]) -> None:
        self.tag = DELAY
        self.sources = ()
        self.thunk = thunk


@final
class Defer(Node):
    def __init__(self, thunk: Callable[[], Any]) -> None:
        self.tag = DEFER
        self.sources = ()
        self.thunk = thunk


@final
class Bind(Node):
    """``f`` applied to the values of ``sources``, as ``mode`` says (see the module)."""

    def __init__(
        self, sources: tuple[Node, ...], f: Callable[..., Any], mode: int, cost: object = 0.0
    ) -> None:
        self.tag = BIND
        self.sources = sources
        self.f = f
        self.mode = mode
        self.cost = cost  # a float, or a function that gives it


@final
class Kernel(Node):
    """Numeric work on plain values; ``cost`` (roughly, floating-point operations, or a function
    that gives it) decides whether the pool is worth it."""

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...], cost: object = 0.0) -> None:
        self.tag = KERNEL
        self.sources = ()
        self.fn = fn
        self.args = args
        self.cost = cost


@final
class Variable(Node):
    """A weight's node (a weight has one): every use of the weight in a run is this node, and its
    summed delta is the weight's gradient."""

    def __init__(self, weight: Any) -> None:
        self.tag = VARIABLE
        self.sources = ()
        self.weight = weight


@final
class Ref(Node):
    """Row ``row`` of ``graph``: a layer's ``forward`` (see ``graph.py``)."""

    def __init__(self, graph: Graph, row: int) -> None:
        self.tag = REF
        self.sources = ()
        self.graph = graph
        self.row = row

    def __repr__(self) -> str:
        return f"Ref({self.row})"


@mypyc_attr(native_class=False)  # subclassed by dsl's BatchableOperation, a Python class
class Operation:
    """A batchable operation: a function of layers whose calls merge (``@monadl.batchable``).

    The scheduler groups calls of equal signature and asks :meth:`expand` for the forwards of the
    body's results on the group's stacked rows (or, for a call on its own, on its own arguments).
    ``scalars[j]`` says whether result ``j`` of a call is a float (a row of a vector)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.number = kind_number(name)  # (the run's counts by kind)
        self.scalars: list[bool] = []

    def expand(self, call: Call, inputs: list[Any]) -> list[Node]:
        """The forwards of the body's results, the body run on ``inputs`` (tapes) in place of
        ``call``'s row arguments."""
        raise NotImplementedError


@final
class Call:
    """What a call of a batchable operation keeps (its row's object, see ``graph.py``): the
    operation, its arguments (its row arguments, at positions ``row_args``, are the row's inputs)
    and ``static``, its signature's known part (the operation, its other arguments)."""

    def __init__(
        self,
        op: Operation,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        row_args: list[int],
        static: tuple[Any, ...],
    ) -> None:
        self.op = op
        self.args = args
        self.kwargs = kwargs
        self.row_args = row_args
        self.static = static


UNIT: Final[Do[None]] = Pure(None)
"""The computation that does nothing."""


def pure(value: A) -> Do[A]:
    """A computation whose value is already known."""
    return Pure(value)


def delay(thunk: Callable[[], A]) -> Do[A]:
    """A computation that calls ``thunk`` when run (at most once per run)."""
    return Delay(thunk)


def defer(thunk: Callable[[], Do[A]]) -> Do[A]:
    """A computation that builds the ``Do`` to run only when it is run (lazy recursion)."""
    return Defer(thunk)


def kernel(fn: Callable[..., A], *args: Any, cost: float = 0.0) -> Do[A]:
    """Numeric work ``fn(*args)`` that the executor may run on its thread pool."""
    return Kernel(fn, args, cost)


@overload
def gather(a: Do[A], b: Do[B], /) -> Do[tuple[A, B]]: ...
@overload
def gather(a: Do[A], b: Do[B], c: Do[C], /) -> Do[tuple[A, B, C]]: ...
@overload
def gather(a: Do[A], b: Do[B], c: Do[C], d: Do[D], /) -> Do[tuple[A, B, C, D]]: ...
@overload
def gather(*dos: Do[A]) -> Do[tuple[A, ...]]: ...
def gather(*dos: Do[Any]) -> Do[tuple[Any, ...]]:
    """The values of independent computations, as a tuple; the executor may run them concurrently."""
    return Bind(_nodes(dos), tuple_of, MAP)


def gather_all(dos: Iterable[Do[A]]) -> Do[tuple[A, ...]]:
    """:func:`gather` over an iterable."""
    return Bind(_nodes(dos), tuple_of, MAP)


def map_n(f: Callable[..., B], *dos: Do[Any]) -> Do[B]:
    """``f`` applied to the values of independent computations (a fused gather + map)."""
    return Bind(_nodes(dos), f, MAP)


def flat_map_n(f: Callable[..., Do[B]], *dos: Do[Any]) -> Do[B]:
    """``f`` applied to the values of independent computations, then run (gather + flat_map)."""
    return Bind(_nodes(dos), f, FLAT)


def kernel_n(f: Callable[..., B], *dos: Do[Any], cost: float = 0.0) -> Do[B]:
    """Numeric work on the values of independent computations (gather + kernel)."""
    return Bind(_nodes(dos), f, KERNEL_MAP, cost)


def _nodes(dos: Iterable[Do[Any]]) -> tuple[Node, ...]:
    found = []
    for do in dos:
        found.append(as_node(do))
    return tuple(found)
