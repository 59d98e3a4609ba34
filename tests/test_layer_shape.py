"""A layer's static ``.shape`` and ``.dtype`` equal its run's value's, for every op case.

Every case of ``op_cases.CASES`` is built on NumPy (float64 and float32 weights: constants stay
float64, so promotion is exercised) and on array-api-strict; its layer's ``.shape`` and ``.dtype``,
read before it runs, must be its value's once it has run. Ops without a rule give None.
"""

from __future__ import annotations

from typing import Any

import array_api_strict as xps
import numpy as np
import pytest
from op_cases import CASES, NUMPY, Backend, OpCase, predict
from returns.pipeline import is_successful

import monadl
import monadl.nn
from monadl import ArrayLayer, ArrayWeight, FloatLayer, FloatWeight

STRICT = Backend("array_api_strict", xps.asarray, lambda x: np.asarray(np.from_dlpack(x)))


def _weights(inputs: tuple[Any, ...], backend: Backend, dtype: Any) -> list[ArrayWeight | FloatWeight]:
    return [
        FloatWeight(x) if isinstance(x, float) else ArrayWeight(backend.asarray(x.astype(dtype)))
        for x in inputs
    ]


def _check(case: OpCase, backend: Backend, dtype: Any) -> None:
    out = case.op(backend.asarray, *_weights(case.inputs, backend, dtype))
    shape, static_dtype = out.shape, out.dtype  # before it runs
    value = predict(out)
    if isinstance(out, FloatLayer):
        assert type(value) is float and (shape, static_dtype) == ((), float)
        return
    assert shape is not None, f"{case}: no static shape"
    assert shape == tuple(value.shape), f"{case}: static {shape}, ran {tuple(value.shape)}"
    assert static_dtype == value.dtype, f"{case}: static {static_dtype}, ran {value.dtype}"


@pytest.mark.parametrize("case", CASES, ids=str)
@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
def test_static_shape_and_dtype_are_the_runs(case: OpCase, dtype: Any) -> None:
    _check(case, NUMPY, dtype)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_static_shape_and_dtype_on_array_api_strict(case: OpCase) -> None:
    _check(case, STRICT, np.float32)


def _layer(x: Any) -> ArrayLayer:
    return monadl.lift_array(x)


_X = np.arange(24.0).reshape(2, 3, 4)

_F32 = _X.astype(np.float32)

# Ops that CASES does not hold, or holds in one form only: (name, a function of a layer of _X).
MORE = [
    ("basic slice", lambda x: x[:, 1:3]),
    ("negative step", lambda x: x[::-1, ..., 1]),
    ("new axis", lambda x: x[None, :, -1]),
    ("past the end", lambda x: x[:, 5:9]),
    ("int from the end", lambda x: x[-1]),
    ("stack axis -1", lambda x: monadl.stack([x, x], axis=-1)),
    ("stack axis 1", lambda x: monadl.stack([x, x, x], axis=1)),
    ("split", lambda x: monadl.split(x, 2, axis=-1)[1]),
    ("split at indices", lambda x: monadl.split(x, [1], axis=1)[1]),
    ("rows", lambda x: x[[1, 0, 1]]),
    ("one row", lambda x: x[1]),
    ("reshape -1 first", lambda x: monadl.reshape(x, (-1, 4))),
    ("sum keepdims", lambda x: monadl.sum(x, axis=1, keepdims=True)),
    ("max negative axes", lambda x: monadl.max(x, axis=(-1, -3))),
    ("matmul 1d@3d", lambda x: monadl.matmul(np.ones(3), x)),
    ("float32 and a float", lambda x: _layer(_F32) * 2.5),
    ("float32 with float64", lambda x: _layer(_F32) * x),
    ("float32 with a float layer", lambda x: _layer(_F32) * monadl.sum(x)),
    ("dropout", lambda x: monadl.nn.Dropout(0.5)(x)),
]


@pytest.mark.parametrize(("name", "build"), MORE, ids=[m[0] for m in MORE])
def test_more_ops(name: str, build: Any) -> None:
    out = build(_layer(_X))
    static = (out.shape, out.dtype)
    value = predict(out)
    assert static == (tuple(value.shape), value.dtype)


def test_weights_and_constants_report_their_data() -> None:
    w = ArrayWeight(np.zeros((2, 5), np.float32))
    assert (w.shape, w.dtype) == ((2, 5), np.float32)
    assert (_layer(_X).shape, _layer(_X).dtype) == ((2, 3, 4), np.float64)
    assert (FloatWeight(1.0).shape, FloatWeight(1.0).dtype) == ((), float)
    strict = ArrayWeight(STRICT.asarray(np.ones(3, np.float32)))
    assert (strict.shape, strict.dtype) == ((3,), xps.float32)


def test_ops_without_a_rule_give_none() -> None:
    double = monadl.custom_op("double", lambda xp, x: 2.0 * x, (lambda xp, d, o, x: 2.0 * d,))
    unknown = double(_layer(_X))
    assert (unknown.shape, unknown.dtype) == (None, None)
    after = monadl.relu(unknown) + _X  # whatever depends on it is unknown too
    assert (after.shape, after.dtype) == (None, None)

    @monadl.batchable
    def twice(x: ArrayLayer) -> ArrayLayer:
        return x + x

    called = twice(_layer(_X))
    assert called.shape is None and called.dtype is None
    assert tuple(predict(called).shape) == (2, 3, 4)


def test_shapes_are_not_worked_out_while_building() -> None:
    """Building records no static information: it is found on the first access, and kept."""
    x = monadl.tanh(_layer(_X)) * 2.0
    graph = x.graph
    assert graph is not None
    inner = graph.inputs(x.row)[0]
    assert x.row not in graph.statics and inner not in graph.statics
    assert x.shape == (2, 3, 4)
    assert graph.statics[x.row][0] is not None and graph.statics[inner][0] is not None


def test_a_deep_graph_is_no_recursion() -> None:
    x = _layer(np.ones((2, 3)))
    for _ in range(20_000):
        x = x + 1.0
    assert x.shape == (2, 3)


def test_operands_that_do_not_fit_give_none_until_the_run_says_why() -> None:
    bad = _layer(np.ones((2, 3))) + np.ones((4,))
    assert bad.shape is None
    assert not is_successful(bad.predict_blocking())


def test_a_constant_takes_the_dtype_of_the_layers_it_meets() -> None:
    """The run casts a float64 constant to the float32 layers it meets (through ops between the
    weight and the constant too); weights of two dtypes promote; constants alone promote."""
    w = ArrayWeight(np.ones((2, 3, 4), np.float32))
    builds = [
        monadl.tanh(w) * _X,
        monadl.concatenate([_layer(_X), monadl.relu(w)], axis=0),
        monadl.tanh(w) * ArrayWeight(_X),
        _layer(_F32) + _X,
    ]
    for out in builds:
        static = (out.shape, out.dtype)
        value = predict(out)
        assert static == (tuple(value.shape), value.dtype)
    assert [b.dtype for b in builds] == [np.float32, np.float32, np.float64, np.float64]
