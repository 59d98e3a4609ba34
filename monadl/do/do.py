"""``Do[A]``: an immutable, lazy description of a computation that yields an ``A``: the program.

Nothing runs until an :class:`~monadl.do.executor.Executor` interprets it. A ``Do`` is a graph of
nodes, each a small final class with a ``kind`` the scheduler dispatches on. Two families:

The monad's own nodes (user code runs inside them, so the graph behind them is only known once
they ran: they are the program's *dynamic* part):

==========  =================================================================================
Pure        a value that is already known
Delay       ``thunk()`` computes the value on the scheduler's thread (cheap bookkeeping)
Defer       ``thunk()`` returns the ``Do`` to continue with (recursion, dynamic structure)
Bind        waits for its ``sources`` (applicatively: independent, possibly concurrent), then
            ``MAP``: ``f(*values)`` is the value; ``FLAT``: ``f(*values)`` is the next ``Do``;
            ``KERNEL``: ``f(*values)`` is numeric work the executor may run on a pool thread
Kernel      ``fn(*args)``: numeric work for the pool (or inline, if too small)
==========  =================================================================================

The differentiable program's nodes, data the scheduler reads without running user code (its
*static* part; their values are tapes, see ``values.py``):

==========  =================================================================================
Variable    a weight (its ``data`` read when a run reaches it)
Apply       a primitive (``primitive.py``) applied to ``sources`` with static ``params``
Call        a call of a batchable operation: its layer arguments and its signature's static part
Project     result ``index`` of a ``Call`` (an operation may return several layers)
==========  =================================================================================

A constant is ``Pure(Tape(value))``. ``map``/``flat_map`` are sequential; :func:`gather` combines
independent values. Within one run, a node reached through several paths is evaluated once (nodes
are compared by identity).
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable
from types import CodeType
from typing import TYPE_CHECKING, Any, Final, Generic, TypeVar, final, overload

if TYPE_CHECKING:
    from monadl.do.primitive import Operation, Primitive

A = TypeVar("A")
B = TypeVar("B")
C = TypeVar("C")
D = TypeVar("D")
A_co = TypeVar("A_co", covariant=True)

# Node kinds (small ints, for the scheduler's dispatch).
PURE: Final = 0
DELAY: Final = 1
DEFER: Final = 2
BIND: Final = 3
KERNEL: Final = 4
VARIABLE: Final = 5
APPLY: Final = 6
CALL: Final = 7
PROJECT: Final = 8

# Bind modes.
MAP: Final = 0
FLAT: Final = 1
KERNEL_MAP: Final = 2


class Do(Generic[A_co]):
    """A lazy computation yielding ``A``. Build with :func:`pure`, :func:`delay`, :func:`defer`,
    :func:`kernel`, :func:`gather`; combine with :meth:`map` and :meth:`flat_map`."""

    __slots__ = ("kind", "sources")
    kind: int
    sources: tuple[Do[Any], ...]
    """The nodes whose values this one reads (empty for a leaf or a node of the monad's own that
    reads none; a ``Project`` reads its ``call``, and keeps no tuple of it): declared here, so that
    the scheduler reads them without knowing the node's kind."""

    def __init__(self, kind: int) -> None:
        self.kind = kind
        self.sources = ()

    def map(self, f: Callable[[A_co], B]) -> Do[B]:
        """The value transformed by ``f``, on the scheduler's thread (keep ``f`` cheap)."""
        return Bind((self,), f, MAP)

    def flat_map(self, f: Callable[[A_co], Do[B]]) -> Do[B]:
        """Run ``self``, then the ``Do`` that ``f`` makes of its value: a sequencing point."""
        return Bind((self,), f, FLAT)

    def map_kernel(self, f: Callable[[A_co], B], cost: float = 0.0) -> Do[B]:
        """Like :meth:`map`, but ``f`` is numeric work that the executor may run on its pool."""
        return Bind((self,), f, KERNEL_MAP, cost)

    def zip(self, other: Do[B]) -> Do[tuple[A_co, B]]:
        """Both values, evaluated independently (possibly concurrently)."""
        return Bind((self, other), _tuple_of, MAP)

    def __await__(self) -> Generator[Do[Any], Any, A_co]:
        """In a coroutine run by :func:`~monadl.do.coroutine.from_coroutine`: this value."""
        value: A_co = yield self
        return value


def _tuple_of(*values: Any) -> tuple[Any, ...]:
    return values


@final
class Pure(Do[A_co]):
    """A value that is already known (a constant's tape, for a layer)."""

    __slots__ = ("value",)

    def __init__(self, value: A_co) -> None:
        self.kind = PURE
        self.sources = ()
        self.value = value

    def __repr__(self) -> str:
        return f"Pure({self.value!r})"


@final
class Delay(Do[A_co]):
    """``thunk()``, called when a run reaches this node (once per run)."""

    __slots__ = ("thunk",)

    def __init__(self, thunk: Callable[[], A_co]) -> None:
        self.kind = DELAY
        self.sources = ()
        self.thunk = thunk


@final
class Defer(Do[A_co]):
    """The ``Do`` that ``thunk()`` returns, built only when a run reaches this node."""

    __slots__ = ("thunk",)

    def __init__(self, thunk: Callable[[], Do[A_co]]) -> None:
        self.kind = DEFER
        self.sources = ()
        self.thunk = thunk


@final
class Bind(Do[A_co]):
    """``f`` applied to the values of ``sources`` (see the module's table for ``mode``)."""

    __slots__ = ("cost", "f", "mode")

    def __init__(
        self,
        sources: tuple[Do[Any], ...],
        f: Callable[..., Any],
        mode: int,
        cost: float | Callable[[], float] = 0.0,
    ) -> None:
        self.kind = BIND
        self.sources = sources
        self.f = f
        self.mode = mode
        self.cost = cost


@final
class Kernel(Do[A_co]):
    """Numeric work on plain values. ``cost`` (roughly, floating-point operations; or a function
    that gives it) decides whether the pool is worth it."""

    __slots__ = ("args", "cost", "fn")

    def __init__(
        self, fn: Callable[..., A_co], args: tuple[Any, ...], cost: float | Callable[[], float] = 0.0
    ) -> None:
        self.kind = KERNEL
        self.sources = ()
        self.fn = fn
        self.args = args
        self.cost = cost


@final
class Variable(Do[Any]):
    """A trainable variable's node: its value in a run is a tape of ``weight.data`` at that time,
    and its summed delta is that weight's gradient. A weight has one, made once, so every use of
    the weight in a run is one node."""

    __slots__ = ("weight",)

    def __init__(self, weight: Any) -> None:
        self.kind = VARIABLE
        self.sources = ()
        self.weight = weight


@final
class Apply(Do[Any]):
    """``prim`` applied to the values (tapes) of ``sources``, with static ``params``; ``code`` and
    ``instruction``: where the user's code made it (None where unknown), named by its errors
    (:meth:`made_at`)."""

    __slots__ = ("code", "instruction", "params", "prim")

    def __init__(
        self,
        prim: Primitive,
        sources: tuple[Do[Any], ...],
        params: dict[str, Any],
        code: CodeType | None = None,
        instruction: int = 0,
    ) -> None:
        self.kind = APPLY
        self.prim = prim
        self.sources = sources
        self.params = params
        self.code = code
        self.instruction = instruction

    def made_at(self) -> str | None:
        """``file:line`` of the user's code that made the op (None if unknown)."""
        code = self.code
        if code is None:
            return None
        for start, end, line in code.co_lines():
            if start <= self.instruction < end and line is not None:
                return f"{code.co_filename}:{line}"
        return code.co_filename


@final
class Call(Do[Any]):
    """A call of the batchable operation ``op``: ``sources`` are the forwards of its row (layer)
    arguments; ``static`` is the part of its signature known when it is made (the operation, its
    other arguments); ``args``/``kwargs`` are the arguments themselves, for running its body.
    Its value is the tuple of its results' tapes; a ``Project`` of it is the node of one. (It holds
    no projection of its own: a call and its projections would be a reference cycle, and a batch's
    whole graph would wait for the garbage collector.)"""

    __slots__ = ("args", "kwargs", "op", "rows", "static")

    def __init__(
        self,
        op: Operation,
        sources: tuple[Do[Any], ...],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        rows: list[int],
        static: Any,
    ) -> None:
        self.kind = CALL
        self.op = op
        self.sources = sources
        self.args = args
        self.kwargs = kwargs
        self.rows = rows
        self.static = static


@final
class Project(Do[Any]):
    """Result ``index`` of ``call``."""

    __slots__ = ("call", "index")

    def __init__(self, call: Call, index: int) -> None:
        self.kind = PROJECT
        self.sources = ()  # its source is ``call`` (a tuple of it would be made for every result)
        self.call = call
        self.index = index


UNIT: Do[None] = Pure(None)
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
    return Bind(dos, _tuple_of, MAP)


def gather_all(dos: Iterable[Do[A]]) -> Do[tuple[A, ...]]:
    """:func:`gather` over an iterable."""
    return Bind(tuple(dos), _tuple_of, MAP)


def map_n(f: Callable[..., B], *dos: Do[Any]) -> Do[B]:
    """``f`` applied to the values of independent computations (a fused gather + map)."""
    return Bind(dos, f, MAP)


def flat_map_n(f: Callable[..., Do[B]], *dos: Do[Any]) -> Do[B]:
    """``f`` applied to the values of independent computations, then run (gather + flat_map)."""
    return Bind(dos, f, FLAT)


def kernel_n(f: Callable[..., B], *dos: Do[Any], cost: float = 0.0) -> Do[B]:
    """Numeric work on the values of independent computations (gather + kernel)."""
    return Bind(dos, f, KERNEL_MAP, cost)
