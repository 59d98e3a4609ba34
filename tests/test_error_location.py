"""An op's error names the line of the user's code that made it (a note on the exception)."""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np
from returns.result import Failure

import monadl as ml
from monadl.nn import Linear


def _line_of(marker: str, source: Any) -> int:
    lines, start = inspect.getsourcelines(source)
    return start + next(i for i, line in enumerate(lines) if marker in line)


def test_a_shape_error_names_the_users_line() -> None:
    w = ml.ArrayWeight(np.ones((3, 4)))
    bad = ml.matmul(np.ones((5, 2)), w)  # made here
    result = ml.sum(bad).predict_blocking()
    assert isinstance(result, Failure)
    error = result.failure()
    assert isinstance(error, ml.ShapeError)
    line = _line_of("# made here", test_a_shape_error_names_the_users_line)
    assert error.__notes__ == [f"matmul was made at {__file__}:{line}"]


def test_through_a_library_builder_the_users_call_is_named() -> None:
    layer = Linear.new(3, 2, seed=0)

    def model() -> ml.FloatLayer:
        return ml.sum(layer(np.ones((4, 5))))  # the builder's call

    result = model().train_blocking(ml.SGD(0.1))
    assert isinstance(result, Failure)
    notes = getattr(result.failure(), "__notes__", [])
    assert notes == [f"linear was made at {__file__}:{_line_of('# the builder', model)}"]


def test_merged_calls_name_one_of_their_lines() -> None:
    w = ml.ArrayWeight(np.ones((3, 4)))
    terms = [ml.sum(ml.matmul(np.ones((2, 5)), w)) for _ in range(3)]  # three calls, one group
    result = ml.add_n(terms).predict_blocking()
    assert isinstance(result, Failure)
    assert getattr(result.failure(), "__notes__", [""])[0].startswith(f"matmul was made at {__file__}:")


def test_the_users_code_is_found_among_thousands_of_functions() -> None:
    """Whether a frame's code is the library's is cached in a table of 1,024 slots: with three
    thousand functions of the user's (many sharing a slot with each other and with the library's
    op wrappers and builders), each op still records its own caller's code, never a library one."""
    x = ml.ArrayWeight(np.ones(3))
    layer = Linear.new(3, 2, seed=0)
    namespace: dict[str, Any] = {"ml": ml, "x": x, "layer": layer}
    functions = []
    for k in range(3000):
        exec(f"def f{k}():\n    return ml.tanh(x) if {k} % 2 else layer(x)", namespace)
        functions.append(namespace[f"f{k}"])
    for _ in range(2):  # the second time, every code is in the table or was pushed out of it
        for f in functions:
            made = f()
            assert made.graph is not None
            assert made.graph.codes[made.row] is f.__code__


def test_the_compiled_and_the_python_walks_find_the_same_frame() -> None:
    """``users_code`` (``monadl._native.user_site`` where compiled) and the Python walk name the
    same code and line, from user code, from inside a library builder, and from exec'd code."""
    from monadl.dsl.core import apply

    def line(found: tuple[Any, int]) -> int | None:
        code, lasti = found
        return next((ln for start, end, ln in code.co_lines() if start <= lasti < end), None)

    namespace: dict[str, Any] = {"apply": apply}
    exec("def f():\n    return apply.users_code(), apply.walk_to_users_code()", namespace)
    for _ in range(3):  # the first call fills the compiled walk's table of codes, the next read it
        here = apply.users_code(), apply.walk_to_users_code()
        assert here[0][0] is here[1][0] is test_the_compiled_and_the_python_walks_find_the_same_frame.__code__
        assert line(here[0]) == line(here[1])
        made = namespace["f"]()
        assert made[0][0] is made[1][0] is namespace["f"].__code__
        assert line(made[0]) == line(made[1]) == 2
