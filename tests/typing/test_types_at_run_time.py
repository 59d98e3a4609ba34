"""What the types say holds when the code runs: each lift gives the layer its name and its type say,
a function typed with ``AnyLayer`` runs and trains on weights as they are, and awaiting ``train`` or
``predict`` gives the ``IOResult`` that their docstrings (and the typing snippets) say."""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from returns.io import IO, IOFailure, IOResult, IOSuccess
from returns.result import Failure, Result, Success
from returns.unsafe import unsafe_perform_io

import monadl as ml
from monadl import AnyLayer

ROOT = Path(__file__).resolve().parents[2]


def test_each_lift_gives_the_layer_it_names() -> None:
    s = ml.FloatWeight(2.0)
    w = ml.ArrayWeight(np.ones(3))
    assert type(ml.lift_float(1.5)) is ml.FloatLayer
    assert type(ml.lift_float(s)) is ml.FloatLayer
    assert type(ml.lift_array(np.ones(3))) is ml.ArrayLayer
    assert type(ml.lift_array(w)) is ml.ArrayLayer
    assert type(ml.lift(1.5)) is ml.FloatLayer and type(ml.lift(w)) is ml.ArrayLayer
    f, a = s * 1.0, w * 1.0
    assert ml.lift_float(f) is f and ml.lift_array(a) is a and ml.lift(f) is f
    assert ml.lift_float(s).predict_blocking() == Success(2.0)
    np.testing.assert_array_equal(ml.lift_array(w).predict_blocking().unwrap(), np.ones(3))


@pytest.mark.parametrize(
    ("lift", "operand", "message"),
    [
        (ml.lift_float, np.ones(3), "lift_float: expected a float, float weight or float layer, got ndarray"),
        (
            ml.lift_float,
            ml.ArrayWeight(np.ones(2)),
            "lift_float: expected a float, float weight or float layer",
        ),
        (ml.lift_float, "abc", "lift_float: "),
    ],
)
def test_lift_float_of_another_kind_is_a_type_error(lift: object, operand: object, message: str) -> None:
    assert callable(lift)
    with pytest.raises(TypeError) as raised:
        lift(operand)
    assert message in str(raised.value)


def test_lift_array_of_a_float_still_gives_a_float_layer_at_run_time() -> None:
    """Its type takes arrays only; code written when it lifted floats too still runs (the bench)."""
    old_style: Any = ml.lift_array
    assert type(old_style(1.0)) is ml.FloatLayer
    assert type(old_style(ml.FloatWeight(1.0) * 1.0)) is ml.FloatLayer


def swish(x: AnyLayer) -> AnyLayer:
    return x * ml.sigmoid(x)


def test_an_any_layer_function_runs_and_trains_on_weights_as_they_are() -> None:
    assert AnyLayer.__constraints__ == (ml.FloatLayer, ml.ArrayLayer, ml.FloatOperators, ml.ArrayOperators)
    s = ml.FloatWeight(1.0)
    w = ml.ArrayWeight(np.array([1.0, -1.0]))
    assert isinstance(swish(s), ml.FloatOperators) and isinstance(swish(w), ml.ArrayOperators)
    assert type(swish(s * 1.0)) is ml.FloatLayer and type(swish(w * 1.0)) is ml.ArrayLayer
    expected = 1.0 / (1.0 + np.exp(-1.0))
    assert ml.lift(swish(s)).predict_blocking().unwrap() == pytest.approx(expected)
    loss = ml.sum(swish(w)) + swish(s)
    assert loss.train_blocking(ml.SGD(0.1)).unwrap() == pytest.approx(expected + expected - (1 - expected))
    assert s.data < 1.0 and w.data[0] < 1.0


def _docstring(module: str, qualname: str) -> str:
    """The docstring of ``qualname`` in ``monadl/dsl/<module>.py`` (``module``: its path there, without
    ``.py``), the last of its definitions."""
    tree = ast.parse((ROOT / "monadl" / "dsl" / f"{module}.py").read_text())
    *classes, name = qualname.split(".")
    body = tree.body
    for cls in classes:
        body = next(n for n in body if isinstance(n, ast.ClassDef) and n.name == cls).body
    definitions = [n for n in body if isinstance(n, ast.FunctionDef) and n.name == name]
    return ast.get_docstring(definitions[-1]) or ""


def test_awaiting_train_and_predict_gives_the_documented_io_result() -> None:
    # (read from the sources: a module compiled with mypyc keeps no docstrings)
    for module, name in [
        ("learning/training", "train"),
        ("learning/training", "predict"),
        ("core/layers", "FloatLayer.train"),
    ]:
        assert "IOResult" in _docstring(module, name), (module, name)
    s = ml.FloatWeight(3.0)
    loss = s * s
    bad = ml.sum(ml.ArrayWeight(np.ones(2)) @ np.ones((3, 3)))

    async def run() -> tuple[object, ...]:
        return (
            await loss.predict(),
            await loss.train(ml.SGD(0.1)),
            await ml.predict(loss),
            await bad.train(ml.SGD(0.1)),
        )

    predicted, trained, after, failed = asyncio.run(run())
    assert predicted == IOSuccess(9.0) and trained == IOSuccess(9.0)
    assert isinstance(after, IOResult) and unsafe_perform_io(IO.from_ioresult(after)) == Success(
        pytest.approx(2.4 * 2.4)
    )
    assert isinstance(failed, IOResult) and not isinstance(failed, IOSuccess)
    result: Result[float, Exception] = unsafe_perform_io(IO.from_ioresult(failed))
    assert isinstance(result, Failure) and "matmul" in str(result.failure())
    assert isinstance(failed, type(IOFailure(None)))
