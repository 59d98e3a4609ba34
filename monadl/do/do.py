"""``Do[A]``: an immutable, lazy description of a computation that yields an ``A``.

Nothing runs until an :class:`~monadl.do.executor.Executor` interprets it. There are six node kinds,
each a small class with a ``tag`` the interpreter dispatches on:

========  ===============================================================================
Pure      a value that is already known
Delay     ``thunk()`` computes the value on the interpreter's thread (cheap bookkeeping)
Defer     ``thunk()`` returns the ``Do`` to continue with (recursion, dynamic structure)
Bind      waits for its ``sources`` (applicatively: independent, possibly concurrent), then
          ``MAP``: ``f(*values)`` is the value; ``FLAT``: ``f(*values)`` is the next ``Do``;
          ``KERNEL``: ``f(*values)`` is numeric work the executor may run on a pool thread
Kernel    ``fn(*args)`` on plain values: numeric work for the pool (or inline, if too small)
Batch     ``fn(*args)`` returns the ``Do`` to continue with, unless the executor merges the call
          with others of equal signature (dynamic batching: ``monadl.do.batching``)
========  ===============================================================================

``map``/``flat_map`` are sequential; :func:`gather` combines independent values. Within one run,
a node reached through several paths is evaluated once (nodes are compared by identity).
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable
from typing import TYPE_CHECKING, Any, Generic, TypeVar, overload

if TYPE_CHECKING:
    from monadl.do.batching import Batcher

A = TypeVar("A")
B = TypeVar("B")
C = TypeVar("C")
D = TypeVar("D")
A_co = TypeVar("A_co", covariant=True)

# Node tags (ints, for a fast dispatch in the interpreter's loop). A node tagged PRIVATE is
# referenced from one place only (made inside a flat_map or a tape's backward and handed on once), so
# the executor evaluates it without a memo entry: sharing cannot arise for it.
PURE, DELAY, DEFER, BIND, KERNEL, BATCH = 0, 1, 2, 3, 4, 5
PRIVATE = 8
# Bind modes.
MAP, FLAT, KERNEL_MAP = 0, 1, 2


class Do(Generic[A_co]):
    """A lazy computation yielding ``A``. Build with :func:`pure`, :func:`delay`, :func:`defer`,
    :func:`kernel`, :func:`gather`; combine with :meth:`map` and :meth:`flat_map`."""

    __slots__ = ()
    tag: int

    def map(self, f: Callable[[A_co], B]) -> Do[B]:
        """The value transformed by ``f``, on the interpreter's thread (keep ``f`` cheap)."""
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


class Pure(Do[A_co]):
    __slots__ = ("value",)
    tag = PURE

    def __init__(self, value: A_co) -> None:
        self.value = value

    def __repr__(self) -> str:
        return f"Pure({self.value!r})"


class Delay(Do[A_co]):
    __slots__ = ("thunk",)
    tag = DELAY

    def __init__(self, thunk: Callable[[], A_co]) -> None:
        self.thunk = thunk


class Defer(Do[A_co]):
    __slots__ = ("thunk",)
    tag = DEFER

    def __init__(self, thunk: Callable[[], Do[A_co]]) -> None:
        self.thunk = thunk


class Bind(Do[A_co]):
    __slots__ = ("cost", "f", "mode", "sources")
    tag = BIND

    def __init__(
        self,
        sources: tuple[Do[Any], ...],
        f: Callable[..., Any],
        mode: int,
        cost: float | Callable[[], float] = 0.0,
    ) -> None:
        self.sources = sources
        self.f = f
        self.mode = mode
        self.cost = cost


class Kernel(Do[A_co]):
    """Numeric work on plain values. ``cost`` (roughly, floating-point operations; or a function
    that gives it) decides whether the pool is worth it; ``batch``, if given, may merge this kernel
    with others of equal signature (dynamic batching)."""

    __slots__ = ("args", "batch", "cost", "fn")
    tag = KERNEL

    def __init__(
        self,
        fn: Callable[..., A_co],
        args: tuple[Any, ...],
        cost: float | Callable[[], float] = 0.0,
        batch: Batcher | None = None,
    ) -> None:
        self.fn = fn
        self.args = args
        self.cost = cost
        self.batch = batch


class Batch(Do[A_co]):
    """``fn(*args)``, a ``Do`` to continue with; or, with dynamic batching, one row of
    ``batch.run`` over the calls of equal ``batch.signature(*args)``. Referenced from one place only
    (no memo entry): made by a ``flat_map`` and handed on once."""

    __slots__ = ("args", "batch", "fn")
    tag = BATCH | PRIVATE

    def __init__(self, fn: Callable[..., Do[A_co]], args: tuple[Any, ...], batch: Batcher) -> None:
        self.fn = fn
        self.args = args
        self.batch = batch


class PrivateDefer(Defer[A_co]):
    """A ``Defer`` referenced from one place only (no memo entry)."""

    __slots__ = ()
    tag = DEFER | PRIVATE


class PrivateBind(Bind[A_co]):
    """A ``Bind`` referenced from one place only (no memo entry)."""

    __slots__ = ()
    tag = BIND | PRIVATE


class PrivateKernel(Kernel[A_co]):
    """A ``Kernel`` referenced from one place only (no memo entry)."""

    __slots__ = ()
    tag = KERNEL | PRIVATE


UNIT: Do[None] = Pure(None)
"""The computation that does nothing; shared, since a ``Pure`` needs no memo."""


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


def run_unit(dos: Iterable[Do[None]], *, private: bool = False) -> Do[None]:
    """Runs independent side-effecting computations; ``UNIT`` if there are none. ``private``:
    the result is referenced from one place only (no memo entry; see ``PRIVATE``)."""
    parts = tuple(d for d in dos if d is not UNIT)
    if not parts:
        return UNIT
    if len(parts) == 1:
        return parts[0]
    return (PrivateBind if private else Bind)(parts, _none, MAP)


def _none(*_: Any) -> None:
    return None
