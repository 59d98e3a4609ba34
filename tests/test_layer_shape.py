"""A layer's static ``.shape`` and ``.dtype`` equal its run's value's, for every op case.

Every case of ``op_cases.CASES`` is built on NumPy (float64 and float32 weights: constants stay
float64, so promotion is exercised) and on array-api-strict; its layer's ``.shape`` and ``.dtype``,
read before it runs, must be its value's once it has run. Ops without a rule give None. Over random
shapes and parameters, valid and not, ``.shape`` is the run's result's shape, or both fail with the
same error.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import array_api_strict as xps
import numpy as np
import pytest
from hypothesis import given, note, settings
from hypothesis import strategies as st
from op_cases import CASES, NUMPY, Backend, OpCase, predict
from returns.pipeline import is_successful

import monadl
import monadl.nn
from monadl import ArrayLayer, ArrayWeight, FloatLayer, FloatWeight
from monadl.dsl.ops import shape_rules

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


def test_operands_that_do_not_fit_raise_the_runs_error() -> None:
    # Before, .shape was None here, and (3, 2) for the matmul: a shape for a graph that cannot run.
    bad = _layer(np.ones((2, 3))) + np.ones((4,))
    with pytest.raises(
        monadl.ShapeError, match=re.escape("add: operands of shapes (2, 3) and (4,) do not fit")
    ):
        _ = bad.shape
    assert not is_successful(bad.predict_blocking())
    product = ArrayWeight.zeros((3, 4)) @ ArrayWeight.zeros((5, 2))
    error = product.predict_blocking().failure()
    for attribute in ("shape", "dtype"):
        with pytest.raises(monadl.ShapeError) as raised:
            getattr(product, attribute)
        assert str(raised.value) == str(error) == "matmul: shapes (3, 4) and (5, 2) are not aligned (4 != 5)"
    # an op after it: its operand's error
    with pytest.raises(monadl.ShapeError, match=re.escape(str(error))):
        _ = monadl.relu(product).shape
    # an array op after a float op that cannot run (a float layer's own shape is always ())
    with pytest.raises(monadl.ShapeError, match="cross_entropy: targets of shape"):
        _ = (
            monadl.cross_entropy(ArrayWeight.zeros((3, 4)), np.zeros((4,), dtype=np.int64)) * np.ones(2)
        ).shape


def test_a_user_op_whose_operands_do_not_fit_is_unknown() -> None:
    # A custom op's own checks are its own: its rule's mismatch is no library op's error.
    add = monadl.custom_op("add2", lambda xp, a, b: a + b, (lambda xp, d, o, a, b: d,) * 2, broadcasts=True)
    add.primitive.shape_rule = shape_rules.elementwise
    assert add(_layer(np.ones((2, 3))), np.ones((4,))).shape is None


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


# --------------------------------------------------- .shape against the run, over random shapes

Build = Callable[[], Any]
_DIMS = st.integers(0, 4)
_AXES = st.integers(-4, 4)


def _shapes(low: int = 0, high: int = 4) -> st.SearchStrategy[tuple[int, ...]]:
    return st.lists(_DIMS, min_size=low, max_size=high).map(tuple)


@st.composite
def _near(draw: st.DrawFn, base: tuple[int, ...]) -> tuple[int, ...]:
    """A shape that mostly fits ``base`` (equal, a suffix, ones in places), else any."""
    if draw(st.integers(0, 3)) == 0:
        return draw(_shapes())
    suffix = base[draw(st.integers(0, len(base))) :]
    return tuple(1 if draw(st.integers(0, 3)) == 0 else n for n in suffix)


def _w(shape: tuple[int, ...]) -> ArrayWeight:
    return ArrayWeight(np.zeros(shape))


def _labels(shape: tuple[int, ...]) -> Any:
    return np.zeros(shape, dtype=np.int64)


@st.composite
def _elementwise(draw: st.DrawFn) -> Build:
    a = draw(_shapes())
    b = draw(_near(a))
    op = draw(st.sampled_from([lambda x, y: x + y, lambda x, y: x * y, monadl.maximum, monadl.lstm_h]))
    return lambda: op(_w(a), _w(b))


@st.composite
def _where(draw: st.DrawFn) -> Build:
    a = draw(_shapes())
    b, c = draw(_near(a)), draw(_near(a))
    return lambda: monadl.where(np.zeros(c, dtype=bool), _w(a), _w(b))


@st.composite
def _matmul(draw: st.DrawFn) -> Build:
    a = draw(_shapes(0, 3))
    b = draw(_near(a[-1:] + a[-1:]) if draw(st.booleans()) else _shapes(0, 3))
    if len(a) >= 1 and len(b) >= 2 and draw(st.booleans()):
        b = (*b[:-2], a[-1], b[-1])
    op = draw(st.sampled_from([monadl.matmul, monadl.dot]))
    return lambda: op(_w(a), _w(b))


@st.composite
def _linear(draw: st.DrawFn) -> Build:
    x = draw(_shapes(0, 3))
    w = draw(st.one_of(_shapes(0, 3), st.tuples(st.just(x[-1] if x else 1), _DIMS)))
    b = draw(st.one_of(_shapes(0, 2), st.just(w[-1:])))
    return lambda: monadl.linear(_w(x), _w(w), _w(b))


@st.composite
def _reduction(draw: st.DrawFn) -> Build:
    x = draw(_shapes())
    axis = draw(st.one_of(st.none(), _AXES, st.lists(_AXES, min_size=1, max_size=2).map(tuple)))
    keep = draw(st.booleans()) and axis is not None
    op: Any = draw(
        st.sampled_from([monadl.sum, monadl.mean, monadl.max, monadl.logsumexp, monadl.var, monadl.std])
    )
    return lambda: op(_w(x), axis, keepdims=keep)


@st.composite
def _softmax(draw: st.DrawFn) -> Build:
    x, axis = draw(_shapes()), draw(_AXES)
    op = draw(st.sampled_from([monadl.softmax, monadl.log_softmax]))
    return lambda: op(_w(x), axis)


@st.composite
def _reshape(draw: st.DrawFn) -> Build:
    x = draw(_shapes())
    target = list(draw(_shapes()))
    unknown = draw(st.booleans())
    if target and unknown:
        target[draw(st.integers(0, len(target) - 1))] = -1
    return lambda: monadl.reshape(_w(x), tuple(target))


@st.composite
def _transpose(draw: st.DrawFn) -> Build:
    x = draw(_shapes())
    axes = draw(st.one_of(st.none(), st.permutations(range(len(x))), st.lists(_AXES, max_size=4)))
    return lambda: monadl.transpose(_w(x), None if axes is None else tuple(axes))


@st.composite
def _join(draw: st.DrawFn) -> Build:
    a = draw(_shapes(0, 3))
    shapes = [a, *[draw(_near(a)) for _ in range(draw(st.integers(0, 2)))]]
    axis = draw(_AXES)
    op = draw(st.sampled_from([monadl.concatenate, monadl.stack]))
    return lambda: op([_w(s) for s in shapes], axis=axis)


@st.composite
def _split(draw: st.DrawFn) -> Build:
    x = draw(_shapes())
    sections: Any = draw(st.one_of(st.integers(1, 3), st.lists(st.integers(0, 5), max_size=2)))
    axis, piece = draw(_AXES), draw(st.integers(0, 2))
    return lambda: monadl.split(_w(x), sections, axis)[
        piece % (sections if isinstance(sections, int) else len(sections) + 1)
    ]


@st.composite
def _indexing(draw: st.DrawFn) -> Build:
    x = draw(_shapes())
    i = draw(st.integers(-5, 5))
    kind = draw(st.integers(0, 3))
    if kind == 0:
        return lambda: _w(x)[i]  # a row (take_rows), or from the end (getitem)
    if kind == 1:
        return lambda: _w(x)[..., i]
    if kind == 2:
        rows = draw(st.lists(st.integers(-1, 4), max_size=3))
        return lambda: monadl.take_rows(_w(x), np.asarray(rows, dtype=np.int64))
    index = draw(_shapes(0, 3))
    return lambda: monadl.take_along_axis(_w(x), np.zeros(index, dtype=np.int64), draw(_AXES))


@st.composite
def _cross_entropy(draw: st.DrawFn) -> Build:
    logits = draw(_shapes())
    labels = draw(st.one_of(st.just(logits[:-1]), st.just(logits), _shapes()))
    soft = draw(st.booleans())
    targets = np.zeros(labels) if soft else _labels(labels)
    return lambda: monadl.cross_entropy(_w(logits), targets)


@st.composite
def _norms(draw: st.DrawFn) -> Build:
    x = draw(_shapes())
    gamma = draw(st.one_of(st.just(x[1:2]), st.just(x[-1:]), _shapes(0, 2)))
    if draw(st.booleans()):
        return lambda: monadl.batch_norm(_w(x), _w(gamma), _w(gamma))
    return lambda: monadl.layer_norm(_w(x), _w(gamma), _w(gamma))


@st.composite
def _attention(draw: st.DrawFn) -> Build:
    q = draw(_shapes(1, 3))
    k = draw(_near(q))
    v = draw(_near(k))
    heads = draw(st.integers(1, 2))
    mask = draw(st.one_of(st.none(), _shapes(0, 3)))
    causal = draw(st.booleans())
    return lambda: monadl.scaled_dot_product_attention(
        _w(q), _w(k), _w(v), None if mask is None else np.ones(mask, dtype=bool), causal=causal, heads=heads
    )


@st.composite
def _conv(draw: st.DrawFn) -> Build:
    spatial = draw(st.integers(1, 2))
    x = draw(_shapes(spatial, spatial + 2))
    channels = x[-spatial - 1] if len(x) > spatial else 1
    groups = draw(st.integers(1, 2))
    w = (
        draw(_DIMS),
        draw(st.sampled_from([channels // groups, draw(_DIMS)])),
        *draw(_shapes(spatial, spatial)),
    )
    b = draw(st.one_of(st.none(), st.just(w[:1]), _shapes(1, 1)))
    stride, dilation = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    padding: Any = draw(st.one_of(st.integers(0, 2), st.sampled_from(["valid", "same"])))
    op = monadl.conv1d if spatial == 1 else monadl.conv2d
    return lambda: op(
        _w(x),
        _w(w),
        None if b is None else _w(b),
        stride=stride,
        padding=padding,
        dilation=dilation,
        groups=groups,
    )


@st.composite
def _pool(draw: st.DrawFn) -> Build:
    spatial = draw(st.integers(1, 2))
    x = draw(_shapes(0, spatial + 2))
    kernel = draw(st.integers(1, 3))
    stride = draw(st.one_of(st.none(), st.integers(1, 2)))
    padding = draw(st.integers(0, kernel // 2))
    op = draw(
        st.sampled_from(
            [monadl.max_pool1d, monadl.avg_pool1d] if spatial == 1 else [monadl.max_pool2d, monadl.avg_pool2d]
        )
    )
    return lambda: op(_w(x), kernel, stride, padding)


FAMILIES: dict[str, st.SearchStrategy[Build]] = {
    "elementwise": _elementwise(),
    "where": _where(),
    "matmul": _matmul(),
    "linear": _linear(),
    "reductions": _reduction(),
    "softmax": _softmax(),
    "reshape": _reshape(),
    "transpose": _transpose(),
    "concatenate and stack": _join(),
    "split": _split(),
    "indexing": _indexing(),
    "cross_entropy": _cross_entropy(),
    "batch_norm and layer_norm": _norms(),
    "attention": _attention(),
    "convolutions": _conv(),
    "pools": _pool(),
}

_UNFIT = re.compile(r"^(\w+: operands of shapes .* do not fit):")


@pytest.mark.parametrize("family", FAMILIES)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_static_shape_is_the_runs_or_its_error(family: str, data: st.DataObject) -> None:
    build = data.draw(FAMILIES[family])
    try:
        layer = build()
    except (TypeError, ValueError) as e:  # refused where it is made: no layer to ask
        note(f"made: {e}")
        return
    if isinstance(layer, FloatLayer):  # (a float layer's .shape is (), by its type): as an array
        layer = layer * np.ones(())
    try:
        static_shape, static_error = layer.shape, None
    except ValueError as e:
        static_shape, static_error = None, e
    result = layer.predict_blocking()
    if is_successful(result):
        assert static_error is None, f"the run succeeded, .shape raised {static_error!r}"
        assert static_shape == np.shape(result.unwrap())
        return
    error = result.failure()
    assert isinstance(error, ValueError), repr(error)
    assert static_error is not None, f".shape {static_shape} for a graph whose run fails: {error!r}"
    assert type(static_error) is type(error)
    unfit = _UNFIT.match(str(error))  # NumPy's words for a broadcast differ (they follow the prefix)
    if unfit is None:
        assert str(static_error) == str(error)
    else:
        assert str(static_error).startswith(unfit[1] + ":"), (str(static_error), str(error))
