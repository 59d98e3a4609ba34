"""Direct style: ``async def`` functions that ``await`` layers, turned into layer-returning functions.

::

    @direct
    async def gated(x: Array) -> ArrayLayer:
        s0, s1 = await parallel(gate0(x), gate1(x))   # both evaluated concurrently
        return expert0(x) * gate0(x) if s0 > s1 else expert1(x) * gate1(x)

``await layer`` gives the layer's forward data (typed ``float`` or ``Array``); it is the same tape
that later differentiable uses of that layer in the run get, so nothing is evaluated twice. The
executor drives the coroutine; no asyncio event loop is involved.
"""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Callable, Coroutine
from typing import Any, ParamSpec, TypeVar, overload

from monadl.do.coroutine import from_coroutine
from monadl.do.do import Defer, Do, gather_all
from monadl.do.tape import Tape
from monadl.dsl.core.apply import forward_of
from monadl.dsl.core.base import Differentiable
from monadl.dsl.core.deep_learning import DeepLearning
from monadl.dsl.core.layers import ArrayLayer, FloatLayer, is_float_kind

P = ParamSpec("P")
L = TypeVar("L", FloatLayer, ArrayLayer)
D1 = TypeVar("D1")
D2 = TypeVar("D2")
D3 = TypeVar("D3")
D4 = TypeVar("D4")


def direct(fn: Callable[P, Coroutine[Any, Any, L]]) -> Callable[P, L]:
    """Turns an ``async def`` returning a ``FloatLayer`` or ``ArrayLayer`` into a function that
    returns that layer at once; the coroutine runs (once per run) when the layer is evaluated."""
    if not inspect.iscoroutinefunction(fn):
        raise TypeError(f"@direct: {getattr(fn, '__qualname__', fn)!r} must be an 'async def' function")
    try:
        result_type = typing.get_type_hints(fn).get("return")
    except Exception as e:
        raise TypeError(f"@direct: cannot resolve the return annotation of {fn.__qualname__}: {e}") from e
    if result_type not in (FloatLayer, ArrayLayer):
        raise TypeError(
            f"@direct: {fn.__qualname__} must be annotated to return FloatLayer or ArrayLayer, "
            f"got {result_type!r}"
        )
    wants_float = result_type is FloatLayer
    name = fn.__qualname__

    @functools.wraps(fn)
    def layer(*args: P.args, **kwargs: P.kwargs) -> L:
        def start() -> Do[Tape[Any, Any]]:
            return from_coroutine(fn(*args, **kwargs), name).flat_map(result_forward)

        return result_type(Defer(start))  # type: ignore[no-any-return]

    def result_forward(result: object) -> Do[Tape[Any, Any]]:
        if is_float_kind(result) != wants_float:
            raise TypeError(
                f"{name}: returned {type(result).__name__}, but is annotated to return {result_type.__name__}"
            )
        return forward_of(result, name)

    return layer


@overload
def parallel(a: DeepLearning[D1, Any], /) -> Do[tuple[D1]]: ...
@overload
def parallel(a: DeepLearning[D1, Any], b: DeepLearning[D2, Any], /) -> Do[tuple[D1, D2]]: ...
@overload
def parallel(
    a: DeepLearning[D1, Any], b: DeepLearning[D2, Any], c: DeepLearning[D3, Any], /
) -> Do[tuple[D1, D2, D3]]: ...
@overload
def parallel(
    a: DeepLearning[D1, Any],
    b: DeepLearning[D2, Any],
    c: DeepLearning[D3, Any],
    d: DeepLearning[D4, Any],
    /,
) -> Do[tuple[D1, D2, D3, D4]]: ...
@overload
def parallel(*values: DeepLearning[D1, Any]) -> Do[tuple[D1, ...]]: ...
def parallel(*values: DeepLearning[Any, Any]) -> Do[tuple[Any, ...]]:
    """The forward data of several layers, evaluated applicatively (concurrently where it pays).
    ``await parallel(a, b)`` in a ``@direct`` function gives a tuple of their values."""
    for v in values:
        if not isinstance(v, Differentiable):
            raise TypeError(f"parallel: expected layers or weights, got {type(v).__name__}")
    return gather_all(v.forward for v in values).map(_datas)


def _datas(tapes: tuple[Tape[Any, Any], ...]) -> tuple[Any, ...]:
    return tuple(t.data for t in tapes)
