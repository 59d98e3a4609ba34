"""``monadl._native``'s one-pass kernels (the optimizers' updates, the recurrent cells' joint vjps):
the NumPy rules' bits, their fallbacks, their errors. Skipped where the engine runs from its sources
(the kernels are then not loaded)."""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable
from typing import Any
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import monadl as ml
from monadl.dsl import fused
from monadl.dsl.learning.optimizers import native
from monadl.dsl.learning.optimizers.adam import _adam_in_chunks, adam_rule
from monadl.dsl.ops import classification, recurrent
from monadl.typeclasses import backend
from monadl.typeclasses.sparse import SparseRows

needs_kernels = pytest.mark.skipif(not native.available(), reason="the engine runs from its sources")

SHAPES = [(1,), (7,), (3, 4), (2, 3, 5), (33, 5), (300, 130)]


def _bits(a: Any) -> bytes:
    """An array's dtype, shape and bytes: -0.0 against 0.0 and every NaN's payload count."""
    array = np.asarray(a)
    return str(array.dtype).encode() + str(array.shape).encode() + array.tobytes()


def _moments(rng: np.random.Generator, shape: tuple[int, ...], dtype: Any) -> tuple[Any, ...]:
    data, g, m = (rng.standard_normal(shape).astype(dtype) for _ in range(3))
    v = np.abs(rng.standard_normal(shape)).astype(dtype) * dtype(0.01)
    g.reshape(-1)[::5] = 0.0  # a gradient's zeros
    g.reshape(-1)[1::7] = -0.0
    m.reshape(-1)[2::6] = -0.0
    v.reshape(-1)[::4] = 0.0  # a coordinate never moved before
    return data, g, m, v


@needs_kernels
@settings(deadline=None, max_examples=60)
@given(
    dtype=st.sampled_from([np.float32, np.float64]),
    shape=st.sampled_from(SHAPES),
    seed=st.integers(0, 2**32 - 1),
    t=st.integers(1, 10_000),
    rate=st.floats(1e-5, 1.0),
    beta1=st.floats(0.0, 0.99),
    beta2=st.floats(0.5, 0.9999),
    epsilon=st.sampled_from([1e-8, 1e-6, 1e-3]),
)
def test_adam_kernel_is_the_rule_as_written_bit_for_bit(
    dtype: Any,
    shape: tuple[int, ...],
    seed: int,
    t: int,
    rate: float,
    beta1: float,
    beta2: float,
    epsilon: float,
) -> None:
    """Every result (the data, both moments) is ``adam_rule``'s in every bit, signed zeros too, and
    the inputs are unchanged."""
    data, g, m, v = _moments(np.random.default_rng(seed), shape, dtype)
    held = [_bits(x) for x in (data, g, m, v)]
    done = native.adam(data, g, m, v, beta1, beta2, t, rate, epsilon)
    assert done is not None
    expected = adam_rule(data, g, m, v, beta1, beta2, t, rate, epsilon)
    assert [_bits(x) for x in done] == [_bits(x) for x in expected]
    assert [_bits(x) for x in (data, g, m, v)] == held


@needs_kernels
@settings(deadline=None, max_examples=40)
@given(
    dtype=st.sampled_from([np.float32, np.float64]),
    shape=st.sampled_from([(1, 3), (9, 4), (50, 7), (300, 130), (4, 2, 3)]),
    seed=st.integers(0, 2**32 - 1),
    touched=st.floats(0.0, 1.0),
    t=st.integers(1, 1000),
)
def test_adam_kernel_of_rows_is_the_chunked_rule_and_the_dense_one(
    dtype: Any, shape: tuple[int, ...], seed: int, touched: float, t: int
) -> None:
    """A sparse gradient's rows (sorted, distinct: none, some, all, the first and the last) give
    the chunked rule's bits, which are the rule's on the dense gradient (+0.0 elsewhere)."""
    rng = np.random.default_rng(seed)
    data, _, m, v = _moments(rng, shape, dtype)
    rows = np.flatnonzero(rng.random(shape[0]) < touched).astype(np.int64)
    g_rows = rng.standard_normal((len(rows), *shape[1:])).astype(dtype)
    done = native.adam(data, g_rows, m, v, 0.9, 0.999, t, 0.01, 1e-8, rows)
    assert done is not None
    chunked = _adam_in_chunks(data, g_rows, m, v, 0.9, 0.999, t, 0.01, 1e-8, rows)
    dense = np.zeros_like(data)
    dense[rows] = g_rows
    expected = adam_rule(data, dense, m, v, 0.9, 0.999, t, 0.01, 1e-8)
    assert [_bits(x) for x in done] == [_bits(x) for x in chunked] == [_bits(x) for x in expected]


@needs_kernels
@pytest.mark.parametrize("optimizer", [ml.Adam(0.01), ml.Adam(0.01, weight_decay=0.1), ml.AdamW(0.01)])
@pytest.mark.parametrize("shape", [(5,), (40, 8), (300, 130)])
def test_adam_and_adamw_update_as_without_the_kernels(
    optimizer: Any, shape: tuple[int, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Five steps through the optimizer, dense and sparse gradients in turn, give the data and the
    state of the same steps with the kernels off (the chunked and written rules)."""
    rng = np.random.default_rng(3)
    start = rng.standard_normal(shape).astype(np.float32)
    grads: list[Any] = []
    for step in range(5):
        if step % 2 and len(shape) == 2:
            rows = rng.integers(0, shape[0], 6)
            grads.append(SparseRows(rows, rng.standard_normal((6, shape[1])).astype(np.float32), shape))
        else:
            grads.append(rng.standard_normal(shape).astype(np.float32))

    def run() -> list[bytes]:
        data, state = start, optimizer.init(start)
        for g in grads:
            data, state = optimizer.update(data, g, state)
        return [_bits(data), *(_bits(s) for s in state if s is not None and not isinstance(s, int))]

    with_kernels = run()
    monkeypatch.setattr(fused, "NATIVE", None)
    assert not native.available()
    assert run() == with_kernels


@needs_kernels
@settings(deadline=None, max_examples=80)
@given(
    dtype=st.sampled_from([np.float32, np.float64]),
    shape=st.sampled_from(SHAPES),
    seed=st.integers(0, 2**32 - 1),
    rate=st.one_of(st.floats(1e-6, 10.0), st.sampled_from([0.0, 1.0, 1e-4, 1e30])),
    into_g=st.booleans(),
    poison=st.sampled_from([None, np.inf, -np.inf, np.nan, 1e38, 1e308]),
)
def test_sgd_kernel_is_the_rule_as_written_bit_for_bit(
    dtype: Any, shape: tuple[int, ...], seed: int, rate: float, into_g: bool, poison: float | None
) -> None:
    """``data - rate * g`` in every bit (signed zeros, a rate that overflows the products), into a
    fresh array or into ``g`` itself; ``data`` unchanged; and whether every element written is
    finite (a gradient's infinity or NaN anywhere, or an update that overflows)."""
    rng = np.random.default_rng(seed)
    data, g, _, _ = _moments(rng, shape, dtype)
    data.reshape(-1)[3::11] = -0.0
    if poison is not None:
        with np.errstate(over="ignore"):
            g.reshape(-1)[rng.integers(g.size)] = poison
    held = _bits(data)
    with np.errstate(over="ignore", invalid="ignore"):
        rule = data - rate * g
    out = g if into_g else np.empty_like(data)
    finite = native.sgd(data, g, out, rate)
    assert finite is bool(np.isfinite(rule).all())
    assert _bits(out) == _bits(rule)
    assert _bits(data) == held


@needs_kernels
def test_sgd_kernel_does_not_take_what_it_cannot_read() -> None:
    """Arrays the kernel cannot read as they are (another dtype, a view, a read-only output): None,
    nothing written, and the optimizer's NumPy rule runs."""
    data = np.ones((4, 3), dtype=np.float32)
    g = np.full((4, 3), 2.0, dtype=np.float32)
    frozen = np.zeros((4, 3), dtype=np.float32)
    frozen.flags.writeable = False
    assert native.sgd(data, g.astype(np.float64), np.empty((4, 3)), 0.5) is None
    assert native.sgd(data, np.ones((3, 4), dtype=np.float32).T, np.empty_like(data), 0.5) is None
    assert native.sgd(data, g, frozen, 0.5) is None
    assert not frozen.any()
    with pytest.raises(TypeError, match="C-contiguous writable"):
        fused.NATIVE.sgd(data, g, frozen, 0.5)
    with pytest.raises(ValueError, match="differ in size"):
        fused.NATIVE.sgd(data, g, np.empty(5, dtype=np.float32), 0.5)
    with pytest.raises(TypeError, match="one dtype"):
        fused.NATIVE.sgd(data, g, np.empty((4, 3)), 0.5)


@needs_kernels
@pytest.mark.parametrize("rate", [0.1, ml.StepDecay(0.5, 0.3, every=2)])
def test_sgd_updates_in_place_as_without_the_kernels(rate: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Training steps with SGD (the step's own gradient memory updated in place) give the same
    weights, bit for bit, with the kernels and without them."""

    def run() -> bytes:
        rng = np.random.default_rng(4)
        w = ml.ArrayWeight(rng.standard_normal((30, 20)).astype(np.float32))
        x = rng.standard_normal((8, 30)).astype(np.float32)
        for _ in range(4):
            ml.mean(ml.tanh(x @ w) * ml.tanh(x @ w)).train_blocking(ml.SGD(rate)).unwrap()
        return _bits(w.data)

    ran: list[bool | None] = []
    kernel = native.sgd

    def counted(*args: Any) -> bool | None:
        ran.append(kernel(*args))
        return ran[-1]

    monkeypatch.setattr(native, "sgd", counted)
    with_kernels = run()
    assert ran and all(r is True for r in ran)  # every update went through the kernel: finite
    monkeypatch.setattr(fused, "NATIVE", None)
    ran.clear()
    assert run() == with_kernels
    assert ran and all(r is None for r in ran)  # and now none did


@needs_kernels
def test_adam_kernel_does_not_take_what_it_cannot_read() -> None:
    """Not C-contiguous, of two dtypes, of integers, of the other byte order, 0-d or a list: None
    (the NumPy rule runs)."""
    rng = np.random.default_rng(0)
    data, g, m, v = _moments(rng, (6, 4), np.float32)
    assert native.adam(data.T, g.T, m.T, v.T, 0.9, 0.999, 1, 0.1, 1e-8) is None
    assert native.adam(data, g.astype(np.float64), m, v, 0.9, 0.999, 1, 0.1, 1e-8) is None
    ints = np.ones((6, 4), dtype=np.int64)
    assert native.adam(ints, ints, ints, ints, 0.9, 0.999, 1, 0.1, 1e-8) is None
    swapped = data.astype(data.dtype.newbyteorder())
    assert native.adam(swapped, swapped, swapped, swapped, 0.9, 0.999, 1, 0.1, 1e-8) is None
    zero = np.asarray(np.float32(1.0))
    assert native.adam(zero, zero, zero, zero, 0.9, 0.999, 1, 0.1, 1e-8) is None
    assert native.adam(data, list(g), m, v, 0.9, 0.999, 1, 0.1, 1e-8) is None
    assert native.adam(data, g[:2].T.copy().T, m, v, 0.9, 0.999, 1, 0.1, 1e-8, np.array([0, 1])) is None


@pytest.mark.parametrize("shape", [(0, 4), (5, 0), (0,)])
def test_adam_updates_weights_of_no_elements(shape: tuple[int, ...]) -> None:
    """An empty weight's step (a dense gradient, and a sparse one of no rows where it has rows)
    changes nothing and keeps its shape, with or without the kernels."""
    data = np.zeros(shape, dtype=np.float32)
    grads: list[Any] = [np.zeros(shape, dtype=np.float32)]
    if len(shape) == 2:
        grads.append(SparseRows(np.zeros(0, dtype=np.int64), np.zeros((0, shape[1]), np.float32), shape))
    optimizers: list[Any] = [ml.Adam(0.1), ml.AdamW(0.1)]
    for optimizer in optimizers:
        for g in grads:
            new, state = optimizer.update(data, g, optimizer.init(data))
            assert new.shape == shape and new.dtype == np.float32
            assert state[0].shape == shape


@needs_kernels
def test_the_kernel_refuses_bad_buffers_with_clear_errors() -> None:
    """Called directly, the kernel checks what the wrapper ensures: its errors name what is wrong."""
    kernels: Any = fused.NATIVE
    a = np.zeros((4, 3), dtype=np.float32)
    outs = [np.empty_like(a) for _ in range(3)]
    scalars = (0.9, 0.1, 0.999, 0.001, 0.1, 0.001, 0.01, 1e-8)
    with pytest.raises(TypeError, match="one dtype"):
        kernels.adam(a, a.astype(np.float64), a, a, *outs, scalars)
    with pytest.raises(ValueError, match="differ in size"):
        kernels.adam(a, a, a[:2], a, *outs, scalars)
    with pytest.raises(TypeError, match="C-contiguous writable"):
        frozen = np.empty_like(a)
        frozen.flags.writeable = False
        kernels.adam(a, a, a, a, frozen, outs[1], outs[2], scalars)
    with pytest.raises(ValueError, match="8 scalars"):
        kernels.adam(a, a, a, a, *outs, scalars[:7])
    g = np.zeros((2, 3), dtype=np.float32)
    with pytest.raises(ValueError, match="sorted, distinct and in range"):
        kernels.adam(a, g, a, a, *outs, scalars, np.array([2, 1]), 3)
    with pytest.raises(ValueError, match="sorted, distinct and in range"):
        kernels.adam(a, g, a, a, *outs, scalars, np.array([0, 4]), 3)
    with pytest.raises(ValueError, match="do not fit"):
        kernels.adam(a, g, a, a, *outs, scalars, np.array([0, 1]), 2)
    with pytest.raises(TypeError, match="int64"):
        kernels.adam(a, g, a, a, *outs, scalars, np.array([0, 1], dtype=np.int32), 3)
    swapped = "<" if sys.byteorder == "big" else ">"  # the other byte order than the machine's
    with pytest.raises(TypeError, match="int64"):
        kernels.adam(a, g, a, a, *outs, scalars, np.array([0, 1], dtype=swapped + "i8"), 3)
    other = [x.astype(swapped + "f4") for x in (a, a, a, a, *outs)]
    with pytest.raises(TypeError, match="one dtype"):
        kernels.adam(*other, scalars)


def test_the_kernels_are_loaded_iff_the_engine_runs_compiled() -> None:
    assert native.available() == ml.compiled()


# ----------------------------------------------------------------------------- the cells' joint vjps

GATE_RULES = {  # a joint vjp, and how many activations it saved and inputs it takes
    "lstm_c": (recurrent.LSTM_C, 3, 4),
    "tree_lstm_c": (recurrent.TREE_LSTM_C, 4, 6),
    "lstm_h": (recurrent.LSTM_H, 2, 2),
    "gru_h": (recurrent.GRU_H, 3, 5),
}


def _gate_arrays(rng: np.random.Generator, count: int, shape: tuple[int, ...], dtype: Any) -> list[Any]:
    """``count`` arrays of a cell's range: activations in [0, 1] (exact 0s and 1s among them, as a
    saturated sigmoid gives), pre-activations and deltas of every sign, signed zeros, huge and tiny
    values."""
    arrays = []
    for k in range(count):
        a = rng.uniform(-3.0, 3.0, shape) if k % 2 else rng.uniform(0.0, 1.0, shape)
        flat = a.reshape(-1)
        flat[::7] = 0.0
        flat[1::11] = -0.0
        flat[2::13] = 1.0
        flat[3::17] = 3e38 if dtype == np.float32 else 1e300
        flat[4::19] = 1e-30
        arrays.append(a.astype(dtype))
    return arrays


def _forward_bits(results: Any) -> list[bytes]:
    """The bits of a forward's result and of each saved activation (a tuple of arrays, the NumPy
    rule's, or the blocks of one array, the kernel's)."""
    result, saved = results
    return [_bits(result), *(_bits(a) for a in saved)]


def _delta_bits(results: Any) -> list[bytes]:
    """The bits of a joint vjp's deltas."""
    return [_bits(g) for g in results]


def _numpy_bits(rule: Any, flat: Callable[[Any], list[bytes]], *args: Any) -> list[bytes]:
    """The bits of ``rule``'s NumPy form (the kernels off: no kernel called)."""
    with mock.patch.object(fused, "NATIVE", None):
        assert not fused.native_takes(args[0])  # (the rules, compiled, see the switch)
        return flat(rule(np, *args))


@needs_kernels
@settings(deadline=None, max_examples=80)
@given(
    name=st.sampled_from(sorted(GATE_RULES)),
    dtype=st.sampled_from([np.float32, np.float64]),
    shape=st.sampled_from(SHAPES),
    seed=st.integers(0, 2**32 - 1),
    blocks=st.booleans(),
    strided=st.booleans(),
)
def test_a_cells_joint_vjp_kernel_is_its_numpy_rule_bit_for_bit(
    name: str, dtype: Any, shape: tuple[int, ...], seed: int, blocks: bool, strided: bool
) -> None:
    """Every delta of ``lstm_c``, ``tree_lstm_c``, ``lstm_h`` and ``gru_h`` from the C loop equals the
    NumPy rule's, bits (signed zeros, overflows to infinity, NaNs of inf * 0) and dtype and shape,
    each an array of its own (the backward pass may add into it), whether the forward saved its
    activations as a tuple (the NumPy rule) or as the blocks of one array (the kernel), and the
    delta a strided slice of a joined one or not."""
    prim, saves, inputs = GATE_RULES[name]
    rng = np.random.default_rng(seed)
    d, *rest = _gate_arrays(rng, 1 + saves + inputs, shape, dtype)
    saved, args = tuple(rest[:saves]), rest[saves:]
    if strided:  # the delta as concatenate's vjp gives it: a slice of a joined delta's rows
        d = np.concatenate([d, np.ones_like(d)], axis=-1)[..., : shape[-1]]
    rule = prim.joint_vjp
    assert rule is not None
    given_saved = np.stack(saved) if blocks else saved
    with np.errstate(over="ignore", invalid="ignore"):
        kernel = fused.native_deltas(name, d, given_saved, *args)
        assert kernel is not None  # the kernel runs
        assert all(type(g) is np.ndarray and g.base is None for g in kernel)
        assert _delta_bits(rule(np, d, given_saved, *args)) == _numpy_bits(rule, _delta_bits, d, saved, *args)


@needs_kernels
@settings(deadline=None, max_examples=60)
@given(
    name=st.sampled_from(sorted(GATE_RULES)),
    dtype=st.sampled_from([np.float32, np.float64]),
    shape=st.sampled_from(SHAPES),
    seed=st.integers(0, 2**32 - 1),
)
def test_a_cells_native_forward_is_its_numpy_rule_bit_for_bit(
    name: str, dtype: Any, shape: tuple[int, ...], seed: int
) -> None:
    """The result and the saved activations of ``lstm_c``, ``tree_lstm_c``, ``lstm_h`` and ``gru_h``
    with the C loops (and NumPy's own exp and tanh loops) equal the NumPy rule's, bits and dtype and
    shape: gates far below and above 0 (exp(-x) overflows to infinity: a sigmoid of 0), signed
    zeros, huge memories."""
    prim, _, inputs = GATE_RULES[name]
    rng = np.random.default_rng(seed)
    args = []
    for a in _gate_arrays(rng, inputs, shape, dtype):
        flat = a.reshape(-1)
        flat[5::9] = -100.0
        flat[6::23] = 100.0
        args.append(a)
    assert fused.native_forward(name, *args) is not None  # the kernels run
    with np.errstate(over="ignore", invalid="ignore"):
        assert _forward_bits(prim.forward(np, *args)) == _numpy_bits(prim.forward, _forward_bits, *args)


@needs_kernels
def test_a_cells_joint_vjp_runs_its_numpy_rule_where_the_kernel_does_not_apply() -> None:
    """Operands that broadcast, a float, a transposed (not C-contiguous) array, two dtypes, 0-d: no
    native output (the NumPy rule runs, giving what it always gave)."""
    a = np.ones((3, 4), dtype=np.float32)
    assert fused.native_forward("lstm_h", a, a) is not None
    assert fused.native_deltas("lstm_h", a, (a, a), a, a) is not None
    for other in (
        np.ones((4,), dtype=np.float32),
        1.0,
        np.ones((4, 3), dtype=np.float32).T,
        a.astype(np.float64),
        a.astype(np.float16),
    ):
        assert fused.native_forward("lstm_h", a, other) is None
        assert fused.native_deltas("lstm_h", a, (a, a), a, other) is None
        assert fused.native_deltas("lstm_h", a, (a, other), a, a) is None
    zero_d = np.asarray(np.float32(1.0))
    assert fused.native_forward("lstm_h", zero_d, zero_d) is None
    assert fused.native_deltas("lstm_h", a, np.stack([a, a, a]), a, a) is None  # three blocks, not two
    assert fused.native_deltas("lstm_h", a, (a, a, a), a, a) is None
    d, so, tc = np.ones((3, 4)), np.full((3, 4), 0.5), np.full((4,), 0.25)
    g_o, g_c = recurrent._h_deltas(np, d, (so, tc), so, tc)
    np.testing.assert_array_equal(g_o, d * tc * so * (1.0 - so))
    np.testing.assert_array_equal(g_c, d * so * (1.0 - tc * tc))


def _reference_takes(*arrays: Any) -> bool:
    """What the kernels read as they are, in NumPy's terms: ``fused.native_takes``'s rule."""
    first = arrays[0]
    if type(first) is not np.ndarray or first.ndim == 0:
        return False
    if first.dtype not in (np.dtype(np.float32), np.dtype(np.float64)):
        return False
    return all(
        type(a) is np.ndarray
        and a.shape == first.shape
        and a.dtype == first.dtype
        and a.flags.c_contiguous
        and a.flags.aligned
        for a in arrays
    )


_KINDS = ["<f4", "<f8", ">f4", "<f2", "<i8", "<c8"]


@st.composite
def _candidate(draw: Any) -> Any:
    """An array the kernels may or may not read: a dtype (byte order too), a shape, and a view
    (transposed, strided, misaligned, a subclass) or not."""
    kind = draw(st.sampled_from(_KINDS))
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=0, max_size=3)))
    size = int(np.prod(shape)) if shape else 1
    view = draw(st.sampled_from(["plain", "transposed", "strided", "misaligned", "subclass", "float"]))
    dtype = np.dtype(kind)
    if view == "float":
        return 1.0
    if view == "misaligned":  # the elements one byte off their alignment
        raw = np.zeros(size * dtype.itemsize + 1, dtype=np.uint8)
        return raw[1:].view(dtype).reshape(shape)
    a = np.arange(size * 2, dtype=np.float64).astype(dtype)
    if view == "strided":
        return a[::2].reshape(shape) if shape else a[0:1].reshape(())
    a = a[:size].reshape(shape)
    if view == "transposed":
        return a.T
    if view == "subclass":
        return a.view(np.ma.MaskedArray)
    return a


@needs_kernels
@settings(deadline=None, max_examples=300)
@given(st.lists(_candidate(), min_size=1, max_size=4))
def test_which_arrays_the_kernels_read_follows_numpys_flags(arrays: list[Any]) -> None:
    """``native_takes`` (NumPy's array struct read in C) says what the rule in NumPy's terms says, on
    arrays of every dtype, byte order, shape and layout; a cell's native forward of the first and
    the last of them runs exactly where it says so of those two, into fresh arrays of their shape
    and dtype."""
    assert fused.native_takes(*arrays) is _reference_takes(*arrays)
    pair = (arrays[0], arrays[-1])
    made = fused.native_forward("lstm_h", *pair)
    if not _reference_takes(*pair):
        assert made is None
        return
    assert made is not None
    result, saved = made
    for a, shape in ((result, pair[0].shape), (saved, (2, *pair[0].shape))):
        assert type(a) is np.ndarray and a.flags.c_contiguous and a.flags.writeable and a.base is None
        assert a.shape == shape and a.dtype == pair[0].dtype


@needs_kernels
def test_the_cell_kernels_refuse_bad_calls_clearly() -> None:
    kernels: Any = fused.NATIVE
    a = np.ones((2, 3), dtype=np.float32)
    with pytest.raises(TypeError, match="no cell named 'lstm'"):
        kernels.cell_forward("lstm", a, a)
    with pytest.raises(TypeError, match="no cell named"):
        kernels.cell_deltas()
    with pytest.raises(TypeError, match="lstm_c takes 4 operands, got 2"):
        kernels.cell_forward("lstm_c", a, a)
    with pytest.raises(TypeError, match="gru_h takes 5 operands, got 4"):
        kernels.cell_forward("gru_h", a, a, a, a)
    with pytest.raises(TypeError, match="lstm_h takes d, saved and 2 operands"):
        kernels.cell_deltas("lstm_h", a, (a, a), a)
    many = np.ones((1,) * 64, dtype=np.float32)
    assert kernels.cell_forward("lstm_h", many, many) is None  # no room for t's axis of blocks


def test_the_forwards_take_numpys_own_exp_and_tanh() -> None:
    """The kernels found NumPy's exp and tanh loops for float32 and float64 in the ufuncs of the
    NumPy installed, and checked them against the ufuncs when they loaded: were they not found (a
    NumPy that computes them otherwise), the cells' forwards would run the NumPy rule, correct but
    slower, and only this test would say so."""
    if not native.available():
        pytest.skip("the engine runs from its sources")
    assert fused.NATIVE.numpy_loops == 1


@needs_kernels
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("gate", [-1e6, -100.0, -1.0, 0.0, 100.0])
@pytest.mark.parametrize("name", sorted(GATE_RULES))
def test_a_cells_native_forward_warns_of_no_overflow(name: str, gate: float, dtype: Any) -> None:
    """A gate's exp(-x) overflows to infinity (its sigmoid 0) silently: NumPy's exp loop leaves no
    floating-point flag behind for a check, even where every error raises; the NumPy rule's bits."""
    prim, _, inputs = GATE_RULES[name]
    args = [np.full((3, 5), 0.5, dtype=dtype) for _ in range(inputs)]
    args[0][1, 2] = gate
    assert fused.native_forward(name, *args) is not None  # the kernels run
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with np.errstate(over="warn", invalid="warn", divide="warn"):  # (NumPy's defaults)
            result = prim.forward(np, *args)
        with np.errstate(all="raise"):
            prim.forward(np, *args)
            np.add(args[0], 1.0)  # (a ufunc after it sees no flag of the kernel's)
    with np.errstate(over="ignore"):
        assert _forward_bits(result) == _numpy_bits(prim.forward, _forward_bits, *args)


class _Subclass(np.ndarray):
    pass


def _candidates() -> list[Any]:
    """Values the backward pass may be given as deltas: arrays of their own, views, read-only
    arrays, a subclass, and things that are not arrays at all."""
    fresh = np.arange(6.0).reshape(2, 3)
    frozen = np.ones(3)
    frozen.flags.writeable = False
    wrapped = np.frombuffer(bytearray(24), dtype=np.float64)  # memory of a bytearray: a base
    return [
        fresh, fresh[0], fresh.T, fresh.reshape(3, 2), np.zeros(0), np.float64(1.0), np.asarray(2.0),
        frozen, np.broadcast_to(np.ones(1), (4,)), wrapped, np.ones(2).view(_Subclass), 1.0, None,
        [1.0], SparseRows(np.array([0]), np.ones((1, 3)), (4, 3)),
    ]  # fmt: skip


@needs_kernels
def test_writable_own_is_the_attributes_test() -> None:
    """The C test answers as the attributes it stands for, on every kind of value."""
    kernels: Any = fused.NATIVE
    for value in _candidates():
        want = type(value) is np.ndarray and value.base is None and value.flags.writeable
        assert kernels.writable_own(value) is want, value


@needs_kernels
@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from([np.float32, np.float64]),
    st.integers(0, 300),
    st.lists(st.tuples(st.integers(0, 299), st.sampled_from([np.inf, -np.inf, np.nan])), max_size=3),
    st.integers(0, 2**32 - 1),
)
def test_finite_reads_every_element(
    dtype: type[np.floating[Any]], n: int, bad: list[tuple[int, float]], seed: int
) -> None:
    """The bits test agrees with NumPy's isfinite on arrays of any length (the loop's vector body
    and its tail), with infinities and NaNs anywhere, and with the largest finite values."""
    kernels: Any = fused.NATIVE
    a = np.random.default_rng(seed).standard_normal(n).astype(dtype)
    if n:
        a[seed % n] = np.finfo(dtype).max * (1 if seed % 2 else -1)
    for k, value in bad:
        if k < n:
            a[k] = value
    assert kernels.finite(a) is bool(np.isfinite(a).all())
    assert kernels.finite(a.reshape(1, n)) is bool(np.isfinite(a).all())


@needs_kernels
def test_finite_declines_what_it_cannot_read() -> None:
    """None (the caller checks another way) for values that are not C-contiguous float32/64 arrays
    in the machine's byte order."""
    kernels: Any = fused.NATIVE
    a = np.ones((4, 4))
    declined = (
        a.T[:, ::2],
        a.T,
        a.astype(np.int64),
        a.astype(a.dtype.newbyteorder()),
        a.view(_Subclass),
        1.0,
        [1.0],
    )
    for value in declined:
        assert kernels.finite(value) is None, value
    assert kernels.finite(a) is True


@needs_kernels
def test_freeze_makes_an_array_read_only() -> None:
    kernels: Any = fused.NATIVE
    for a in (np.ones(3), np.ones(3).view(_Subclass), np.ones((2, 2))[0]):
        assert a.flags.writeable
        assert kernels.freeze(a) is None
        assert not a.flags.writeable
        with pytest.raises(ValueError, match="read-only"):
            a[0] = 2.0
    with pytest.raises(TypeError, match="expected a NumPy array"):
        kernels.freeze([1.0])


@needs_kernels
@settings(deadline=None, max_examples=80)
@given(
    dtype=st.sampled_from([np.float32, np.float64]),
    shape=st.sampled_from([(1, 1), (4, 1, 50), (3, 7), (2, 3, 5), (5, 0), (9, 130)]),
    row=st.integers(0, 8),
    seed=st.integers(0, 2**32 - 1),
)
def test_add_row_is_numpys_in_place_add_bit_for_bit(
    dtype: type[np.floating[Any]], shape: tuple[int, ...], row: int, seed: int
) -> None:
    """``add_row(held, row, g)`` leaves ``held`` as ``held[row] += g`` does, bits included (signed
    zeros, infinities, NaNs), every other row untouched."""
    kernels: Any = fused.NATIVE
    row %= shape[0]
    rng = np.random.default_rng(seed)
    held = rng.standard_normal(shape).astype(dtype)
    g = rng.standard_normal(shape[1:]).astype(dtype)
    for a in (held.reshape(-1), g.reshape(-1)):
        a[::5] = -0.0
        a[1::7] = np.inf
        a[2::11] = np.nan
    expected = held.copy()
    view = expected[row]
    view += g
    assert kernels.add_row(held, row, g) is True
    assert _bits(held) == _bits(expected)


@needs_kernels
def test_add_row_declines_what_numpy_must_add() -> None:
    """False, and nothing written, for arguments the loop does not read as NumPy would: another
    dtype or layout, a read-only or 1-d array, a row out of range, a delta of another shape (one
    NumPy broadcasts included), a subclass, and a delta that overlaps the row."""
    kernels: Any = fused.NATIVE
    held = np.zeros((3, 4))
    frozen = np.zeros((3, 4))
    frozen.flags.writeable = False
    g = np.ones(4)
    declined: list[tuple[Any, int, Any]] = [
        (held, 0, g.astype(np.float32)),
        (held.astype(np.float32), 0, g),
        (held.astype(np.int64), 0, g.astype(np.int64)),
        (np.zeros((4, 3)).T, 0, g),
        (held, 0, np.ones(8)[::2]),
        (frozen, 0, g),
        (np.zeros(4), 0, g[:1]),
        (held, 3, g),
        (held, -1, g),
        (held, 0, np.ones((1, 4))),
        (held, 0, np.ones(1)),
        (held, 0, np.ones((2, 2))),
        (held.view(_Subclass), 0, g),
        (held, 0, g.view(_Subclass)),
        (held.astype(held.dtype.newbyteorder()), 0, g),
        (held, 0, 1.0),
        ([[0.0]], 0, g),
    ]
    for a, row, delta in declined:
        before = np.array(a, copy=True)
        assert kernels.add_row(a, row, delta) is False, (np.shape(a), row, np.shape(delta))
        np.testing.assert_array_equal(np.asarray(a), before)
    overlapping = np.arange(12.0).reshape(3, 4)
    assert kernels.add_row(overlapping, 1, overlapping[1]) is False
    assert kernels.add_row(overlapping, 1, overlapping.reshape(-1)[2:6]) is False
    assert kernels.add_row(overlapping, 0, overlapping[1]) is True  # (apart: added)
    np.testing.assert_array_equal(overlapping[0], [4.0, 6.0, 8.0, 10.0])
    with pytest.raises(TypeError, match="expected held, row and g"):
        kernels.add_row(held, 0)


@pytest.mark.parametrize("native", [True, False])
def test_add_into_row_is_numpys_add_either_way(native: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """``backend.add_into_row`` adds a delta into its row, by the loop or by NumPy (a delta NumPy
    broadcasts, a float): the same values."""
    if not native:
        monkeypatch.setattr(backend, "_ADD_ROW", None)
    held = np.zeros((3, 1, 4), dtype=np.float32)
    backend.add_into_row(held, 1, np.arange(4, dtype=np.float32).reshape(1, 4))
    backend.add_into_row(held, 1, np.ones(4, dtype=np.float32))  # broadcast: NumPy's add
    backend.add_into_row(held, 2, 0.5)
    expected = np.zeros((3, 1, 4), dtype=np.float32)
    expected[1, 0] = [1.0, 2.0, 3.0, 4.0]
    expected[2] = 0.5
    np.testing.assert_array_equal(held, expected)


@needs_kernels
@settings(deadline=None, max_examples=60)
@given(n=st.integers(0, 300), set_at=st.lists(st.integers(0, 299), max_size=3))
def test_any_set_is_numpys_any(n: int, set_at: list[int]) -> None:
    """``any_set`` agrees with NumPy's ``any`` on boolean arrays of any length, set anywhere (the
    loop's vector body and its tail)."""
    kernels: Any = fused.NATIVE
    mask = np.zeros(n, dtype=bool)
    for k in set_at:
        if k < n:
            mask[k] = True
    assert kernels.any_set(mask) is bool(mask.any())
    assert backend.any_set(mask) is bool(mask.any())


@needs_kernels
def test_any_set_declines_what_is_not_a_contiguous_mask() -> None:
    """None (the caller asks NumPy) for values that are not C-contiguous boolean arrays."""
    kernels: Any = fused.NATIVE
    mask = np.zeros((4, 4), dtype=bool)
    mask[1, 2] = True
    for value in (mask.T, mask[:, ::2], mask.astype(np.uint8), mask.view(_Subclass), [True], True):
        assert kernels.any_set(value) is None
        assert backend.any_set(value) is bool(np.any(value))
    assert kernels.any_set(mask) is True


# ----------------------------------------------------------------------------- a concatenation

_JOIN_DTYPES = ["<f4", "<f8", "<f2", "<i8", "<i4", "|u1", "|b1", "<c8"]


@needs_kernels
@settings(deadline=None, max_examples=200)
@given(
    dtype=st.sampled_from(_JOIN_DTYPES),
    shape=st.lists(st.integers(0, 4), min_size=1, max_size=4),
    widths=st.lists(st.integers(0, 5), min_size=1, max_size=4),
    axis=st.integers(-4, 3),
    seed=st.integers(0, 2**32 - 1),
)
def test_concat_is_numpys_concatenate_bit_for_bit(
    dtype: str, shape: list[int], widths: list[int], axis: int, seed: int
) -> None:
    """``concat`` joins arrays of one dtype, of any rank and any axis (counted from either end), with
    empty arrays among them, into np.concatenate's array: its dtype, shape and bytes (NaNs' payloads,
    signed zeros), a fresh C-contiguous array."""
    if not -len(shape) <= axis < len(shape):
        return
    rng = np.random.default_rng(seed)
    xs = []
    for w in widths:
        s = list(shape)
        s[axis] = w
        raw = rng.integers(0, 256, size=int(np.prod(s)) * np.dtype(dtype).itemsize, dtype=np.uint8)
        a = raw.view(np.bool_).astype(dtype) if dtype == "|b1" else raw.view(dtype)
        xs.append(a.reshape(s))
    made = fused.NATIVE.concat(xs, axis)
    assert made is not None
    assert type(made) is np.ndarray and made.flags.c_contiguous and made.flags.writeable
    assert _bits(made) == _bits(np.concatenate(xs, axis=axis))
    assert _bits(fused.NATIVE.concat(tuple(xs), axis)) == _bits(made)
    assert _bits(backend.concat_arrays(backend.NUMPY, xs, axis)) == _bits(made)


@needs_kernels
def test_concat_declines_what_numpy_must_join() -> None:
    """Arrays the copy of bytes would join wrongly go to np.concatenate: mixed dtypes (a cast), views
    that are not C-contiguous, another byte order, subclasses, 0-d arrays, objects, an axis out of
    range (NumPy's error); a call of the wrong form is an error."""
    a = np.arange(6.0, dtype=np.float32).reshape(2, 3)
    assert fused.NATIVE.concat([a, a], 1) is not None
    cases: list[tuple[list[Any], int]] = [
        ([a, a.astype(np.float64)], 1),
        ([a, a.T.copy().T], 1),
        ([a, a.astype(">f4" if sys.byteorder == "little" else "<f4")], 1),
        ([a, a.view(np.ma.MaskedArray)], 1),
        ([np.asarray(1.0), np.asarray(2.0)], 0),
        ([np.array([None, 1], dtype=object)] * 2, 0),
        ([a, a[:, :2].copy()], 0),  # shapes differ off the axis
        ([a, a.reshape(3, 2, 1)], 0),
        ([a, a], 2),
        ([a, a], -3),
        ([], 0),
    ]
    for xs, axis in cases:
        assert fused.NATIVE.concat(xs, axis) is None
    with pytest.raises(TypeError, match="a tuple or list of arrays and an axis"):
        fused.NATIVE.concat(iter([a]), 0)
    with pytest.raises(TypeError, match="a tuple or list of arrays and an axis"):
        fused.NATIVE.concat([a], 0.5)


@needs_kernels
def test_concatenate_joins_numpy_arrays_by_the_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """``ml.concatenate``'s forward on NumPy arrays of one dtype is the kernel's copy (NumPy's
    concatenate not called), its value np.concatenate's; arrays of two dtypes go to NumPy."""
    x, h = np.arange(4.0, dtype=np.float32), np.arange(3.0, dtype=np.float32)
    calls: list[int] = []
    numpy_concat = np.concat

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return numpy_concat(*args, **kwargs)

    monkeypatch.setattr(np, "concat", counted)
    assert _bits(ml.concatenate([x, h], axis=-1).predict_blocking().unwrap()) == _bits(np.concatenate([x, h]))
    assert calls == []
    mixed = ml.concatenate([x, h.astype(np.float64)]).predict_blocking().unwrap()
    assert calls == [1] and _bits(mixed) == _bits(np.concatenate([x, h.astype(np.float64)]))


# ----------------------------------------------------------------------------- a bias added to rows


@needs_kernels
@settings(deadline=None, max_examples=80)
@given(
    dtype=st.sampled_from([np.float32, np.float64]),
    lead=st.lists(st.integers(0, 4), max_size=2),
    n=st.integers(0, 70),
    seed=st.integers(0, 2**32 - 1),
)
def test_add_to_rows_is_numpys_broadcast_add_bit_for_bit(
    dtype: Any, lead: list[int], n: int, seed: int
) -> None:
    """``add_to_rows(a, v)`` adds ``v`` into every row of ``a`` in place, NumPy's ``a += v`` bit for
    bit (signed zeros, infinities, NaNs), for rows of every length and any number of rows."""
    rng = np.random.default_rng(seed)
    a, v = (x.reshape(-1) for x in _gate_arrays(rng, 2, (max(1, int(np.prod(lead))) * n,), dtype))
    a = a.reshape(*lead, n) if int(np.prod(lead)) else np.zeros((*lead, n), dtype=dtype)
    v = v[:n].copy()
    with np.errstate(over="ignore", invalid="ignore"):  # (huge values' sums: infinities, as NumPy's)
        expected = a + v
    assert fused.NATIVE.add_to_rows(a, v) is True
    assert _bits(a) == _bits(expected)


@needs_kernels
def test_add_to_rows_declines_what_numpy_must_add() -> None:
    """Where the loop would add wrongly it adds nothing and says so (the caller adds by NumPy):
    rows of another length, a matrix or a scalar for ``v``, two dtypes, a read-only, non-contiguous
    or subclassed ``a``, a ``v`` inside ``a``; ``backend.add_to_rows`` then adds as NumPy does."""
    a = np.arange(6.0).reshape(2, 3)
    frozen = a.copy()
    frozen.flags.writeable = False
    cases = [
        (a, np.ones(2)),
        (a, np.ones((1, 3))),
        (a, np.asarray(1.0)),
        (a, np.ones(3, dtype=np.float32)),
        (frozen, np.ones(3)),
        (np.arange(6.0).reshape(3, 2).T, np.ones(3)),
        (a.view(np.ma.MaskedArray), np.ones(3)),
        (a, a[1]),
        (np.arange(6, dtype=np.int64).reshape(2, 3), np.ones(3, dtype=np.int64)),
    ]
    for target, v in cases:
        before = target.copy()
        assert fused.NATIVE.add_to_rows(target, v) is False
        assert _bits(target) == _bits(before)
    inside = a.copy()
    transposed = np.arange(6.0).reshape(3, 2).T
    for target, v in [(inside, inside[1]), (transposed, np.ones(3))]:
        expected = target + v
        backend.add_to_rows(target, v)
        assert _bits(target) == _bits(expected)
    with pytest.raises(TypeError, match="expected a and v"):
        fused.NATIVE.add_to_rows(a)


# ----------------------------------------------------------------------------- a stacked delta's start


@needs_kernels
@settings(deadline=None, max_examples=40)
@given(
    dtype=st.sampled_from([np.float32, np.float64]),
    shape=st.lists(st.integers(0, 5), max_size=3),
    order=st.sampled_from(["C", "F"]),
)
def test_minus_zeros_like_is_minus_zeros(dtype: Any, shape: list[int], order: str) -> None:
    """``minus_zeros_like(a)`` is ``backend.minus_zeros`` of ``a``'s shape and dtype, bit for bit (-0.0
    in every element: the identity of addition), a fresh C-contiguous array whatever ``a``'s layout."""
    a = np.ones(shape, dtype=dtype, order=order)  # type: ignore[call-overload]
    made = fused.NATIVE.minus_zeros_like(a)
    assert made.flags.c_contiguous and made.flags.writeable and made.base is None and made is not a
    assert _bits(made) == _bits(backend.minus_zeros(np, tuple(shape), np.dtype(dtype)))
    assert _bits(backend.minus_zeros_like(a)) == _bits(made)


@needs_kernels
def test_minus_zeros_like_declines_what_is_not_a_plain_float_array() -> None:
    """Integers, float16, another byte order, a subclass, a float: None (``backend.minus_zeros_like``
    then asks NumPy, for the float types it can fill)."""
    swapped = ">f4" if sys.byteorder == "little" else "<f4"
    for a in (np.ones(3, dtype=np.int64), np.ones(3, dtype=np.float16), np.ones(3, dtype=swapped),
              np.ones(3).view(np.ma.MaskedArray), 1.0):  # fmt: skip
        assert fused.NATIVE.minus_zeros_like(a) is None
    half = backend.minus_zeros_like(np.ones(3, dtype=np.float16))
    assert half.dtype == np.float16 and _bits(half) == _bits(np.full(3, -0.0, dtype=np.float16))


@needs_kernels
@settings(deadline=None, max_examples=40)
@given(n=st.integers(1, 40), k=st.integers(-50, 50))
def test_set_flag_is_numpys_item_assignment(n: int, k: int) -> None:
    """``set_flag(mask, k)`` sets element ``k`` of a boolean vector where ``k`` is in range (counted
    from the front only: a negative ``k`` declines, NumPy would count it from the end);
    ``backend.set_flag`` then sets it as NumPy's indexing does."""
    mask = np.zeros(n, dtype=bool)
    expected = mask.copy()
    done = fused.NATIVE.set_flag(mask, k)
    assert done is (0 <= k < n)
    if done:
        expected[k] = True
    assert _bits(mask) == _bits(expected)
    if -n <= k < n:
        mask = np.zeros(n, dtype=bool)
        backend.set_flag(mask, k)
        assert bool(mask[k]) and int(mask.sum()) == 1


@needs_kernels
def test_set_flag_declines_what_is_not_a_writable_boolean_vector() -> None:
    frozen = np.zeros(3, dtype=bool)
    frozen.flags.writeable = False
    for mask, k in [
        (np.zeros((2, 2), dtype=bool), 0),
        (np.zeros(3, dtype=np.uint8), 0),
        (frozen, 0),
        (np.zeros(6, dtype=bool)[::2], 0),
        (np.zeros(3, dtype=bool), np.int64(1)),
        (np.zeros(3, dtype=bool), 2**70),
    ]:
        before = np.array(mask)
        assert fused.NATIVE.set_flag(mask, k) is False
        assert _bits(mask) == _bits(before)
    with pytest.raises(TypeError, match="expected mask and k"):
        fused.NATIVE.set_flag(np.zeros(3, dtype=bool))


def _label_softmax_rule(matrix: Any, labels: Any, batch: int) -> tuple[Any, Any]:
    """The NumPy rule ``label_softmax`` stands for (``classification._picked_labels`` without the
    kernels)."""
    with mock.patch.object(fused, "NATIVE", None):
        return classification._picked_labels(matrix, labels, batch)


LABEL_TYPES = [np.int64, np.int32, np.int16, np.int8, np.uint8, np.uint16, np.uint32, np.uint64, np.intp]


@needs_kernels
@settings(deadline=None, max_examples=150)
@given(
    dtype=st.sampled_from([np.float32, np.float64]),
    rows=st.integers(1, 12),
    classes=st.one_of(st.integers(1, 40), st.sampled_from([127, 128, 129, 300])),
    scale=st.sampled_from([1e-3, 1.0, 30.0, 1e4]),
    label_type=st.sampled_from(LABEL_TYPES),
    batch=st.sampled_from([1, 3, 16, 2**24]),
    special=st.sampled_from([None, np.nan, np.inf, -np.inf, -0.0, 0.0, 1e30, "tie"]),
    seed=st.integers(0, 2**32 - 1),
)
def test_label_softmax_is_the_numpy_rule_bit_for_bit(
    dtype: Any, rows: int, classes: int, scale: float, label_type: Any, batch: int, special: Any, seed: int
) -> None:
    """Each row's log-probability of its label and the softmax less the one-hot over ``batch``, from
    the C loops with NumPy's own exp, log1p and row sums, equal the NumPy rule's, bits and dtype and
    shape, over logits of every scale, labels of every integer type, ties for the maximum (the
    first is np.argmax's), signed zeros, NaNs and infinities (NaN where the rule gives NaN)."""
    rng = np.random.default_rng(seed)
    matrix = (rng.standard_normal((rows, classes)) * scale).astype(dtype)
    r, c = int(rng.integers(rows)), int(rng.integers(classes))
    if special == "tie":  # the row's maximum twice (the first is the one set to 0 for the sum)
        matrix[r, c] = matrix[r].max()
        matrix[r, (c + classes // 2) % classes] = matrix[r, c]
    elif special is not None:
        matrix[r, c] = special
    labels = rng.integers(0, min(classes, 128), rows).astype(label_type)
    with np.errstate(all="ignore"):
        found = fused.NATIVE.label_softmax(matrix, labels, batch)
        assert found is not None  # the kernel runs
        want = _label_softmax_rule(matrix, labels, batch)
    assert [_bits(a) for a in found] == [_bits(a) for a in want]
    assert all(type(a) is np.ndarray and a.base is None and a.flags.writeable for a in found)


@needs_kernels
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_label_softmax_of_many_rows_runs_without_the_gil_and_gives_the_rules_bits(dtype: Any) -> None:
    # A language model's logits (many rows by a vocabulary) go past the size from which the kernel
    # lets other threads run: the same bits there.
    rng = np.random.default_rng(7)
    matrix = (rng.standard_normal((70, 1000)) * 5.0).astype(dtype)
    labels = rng.integers(0, 1000, 70)
    with np.errstate(all="ignore"):
        found = fused.NATIVE.label_softmax(matrix, labels, 70)
        want = _label_softmax_rule(matrix, labels, 70)
    assert found is not None
    assert [_bits(a) for a in found] == [_bits(a) for a in want]


@needs_kernels
def test_label_softmax_declines_what_it_does_not_read_and_the_loss_stays_the_rules() -> None:
    matrix = np.arange(12, dtype=np.float32).reshape(3, 4)
    labels = np.array([0, 3, 1])
    for args in [
        (matrix, np.array([0, 4, 1]), 3),  # a label out of range: the rule's IndexError
        (matrix, np.array([0, -1, 1]), 3),
        (matrix, np.array([0, 2**63 + 5, 1], dtype=np.uint64), 3),
        (matrix, np.array([0.0, 1.0, 2.0]), 3),  # not integers
        (matrix, np.array([True, False, True]), 3),
        (matrix, np.array([0, 1]), 3),  # not a label per row
        (matrix, np.array([[0, 1, 2]]), 3),
        (matrix, np.array([0, 0, 1, 1, 2, 2])[::2], 3),  # strided labels
        (matrix.astype(np.float16), labels, 3),
        (matrix.astype(np.int32), labels, 3),
        (np.asfortranarray(np.arange(12.0).reshape(3, 4)), labels, 3),
        (matrix.reshape(3, 2, 2), labels, 3),
        (matrix.reshape(-1), labels, 3),
        (matrix[:0], labels[:0], 3),  # no rows
        (matrix[:, :0], labels, 3),  # no classes
        (matrix, labels, 0),
        (matrix, labels, 2**24 + 1),
        (matrix, labels, 2**70),
    ]:
        assert fused.NATIVE.label_softmax(*args) is None, args
    with pytest.raises(TypeError, match="expected matrix, labels and batch"):
        fused.NATIVE.label_softmax(matrix, labels)
    with pytest.raises(TypeError, match="expected matrix, labels and batch"):
        fused.NATIVE.label_softmax(matrix, labels, 3.0)
    # Declined, the op runs the rule: the same loss and gradient as the kernel's where it runs.
    logits = ml.ArrayWeight(matrix.astype(np.float64))
    with_kernel = ml.compute_gradients(ml.cross_entropy(logits, labels))
    with mock.patch.object(fused, "NATIVE", None):
        without = ml.compute_gradients(ml.cross_entropy(logits, labels))
    assert with_kernel[0] == without[0]
    assert _bits(with_kernel[1][logits]) == _bits(without[1][logits])


def test_the_label_softmax_takes_numpys_own_log1p_and_row_sums() -> None:
    """The kernels found NumPy's log1p and add loops for float32 and float64, and checked them (and
    a row's sum as the add loop's reduction) against the ufuncs when they loaded: were they not
    found, a cross-entropy of labels would run the NumPy rule, correct but slower, and only this
    test would say so."""
    if not native.available():
        pytest.skip("the engine runs from its sources")
    assert fused.NATIVE.label_loops == 1


@st.composite
def _gather(draw: Any) -> tuple[Any, Any, Any, Any]:
    """A gather's arrays: rows of ``data`` (some picked twice; the whole array, a slice of its
    columns or one row broadcast) put at distinct rows of ``out``."""
    dtype = draw(st.sampled_from([np.float32, np.float64]))
    row = draw(st.sampled_from([(), (1,), (5,), (3, 4), (17,)]))
    rows_in = draw(st.integers(1, 12))
    rows_out = draw(st.integers(1, 12))
    n = draw(st.integers(0, rows_out))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    data = rng.standard_normal((rows_in, *row)).astype(dtype)
    data.reshape(-1)[::7] = -0.0
    layout = draw(st.sampled_from(["whole", "columns", "broadcast"]))
    if layout == "columns":  # each row contiguous, the rows apart (concatenate's slice of a delta)
        data = (
            np.stack([data, data], axis=1)[:, 0]
            if not row
            else np.concatenate([data, data], axis=1)[:, : row[0]]
        )
    elif layout == "broadcast":  # one row, repeated (stride 0)
        data = np.broadcast_to(data[:1], data.shape)
    out = rng.standard_normal((rows_out, *row)).astype(dtype)
    places = rng.permutation(rows_out)[:n].astype(np.intp)
    picks = rng.integers(0, rows_in, n).astype(np.intp)
    return out, places, data, picks


@needs_kernels
@settings(deadline=None, max_examples=150)
@given(_gather())
def test_put_rows_is_numpys_take_and_assignment(arrays: tuple[Any, Any, Any, Any]) -> None:
    out, places, data, picks = arrays
    expected = out.copy()
    expected[places] = data.take(picks, axis=0)
    held = _bits(data)
    assert fused.NATIVE.put_rows(out, places, data, picks) is True
    assert _bits(out) == _bits(expected)
    assert _bits(data) == held


@needs_kernels
@settings(deadline=None, max_examples=150)
@given(_gather(), st.booleans())
def test_add_rows_at_is_numpys_fancy_add_bit_for_bit(
    arrays: tuple[Any, Any, Any, Any], ordered: bool
) -> None:
    # held[picks] += d[places], the picks distinct (a merged group's rows): the same additions.
    held, picks, d, places = arrays  # (the gather's distinct places serve as the distinct picks)
    if ordered:
        d = d[: len(picks)].copy() if len(d) >= len(picks) else np.resize(d, (len(picks), *d.shape[1:]))
    with np.errstate(all="ignore"):
        expected = held.copy()
        expected[picks] += d if ordered else d[places]
        assert fused.NATIVE.add_rows_at(held, picks, d, None if ordered else places) is True
    assert _bits(held) == _bits(expected)


@needs_kernels
def test_the_row_kernels_decline_what_they_do_not_read() -> None:
    out = np.zeros((4, 3), dtype=np.float32)
    data = np.ones((5, 3), dtype=np.float32)
    idx = np.array([0, 2], dtype=np.intp)
    frozen = out.copy()
    frozen.flags.writeable = False
    for args in [
        (out, idx, data.astype(np.float64), idx),  # dtypes differ
        (out, idx, np.ones((5, 4), dtype=np.float32), idx),  # rows of another shape
        (out, idx, np.ones(5, dtype=np.float32), idx),  # another rank
        (out, idx.astype(np.int32), data, idx),  # not intp
        (out, idx, data, np.array([0, 2, 3], dtype=np.intp)),  # lengths differ
        (out, np.array([0, 4], dtype=np.intp), data, idx),  # a row of out out of range
        (out, idx, data, np.array([-1, 0], dtype=np.intp)),  # a negative row of data (NumPy's wraps)
        (out, np.arange(4, dtype=np.intp)[::2], data, idx),  # a strided index vector
        (out, idx, np.ones((5, 6), dtype=np.float32)[:, ::2], idx),  # rows not contiguous
        (out, idx, data[::-1], idx),  # rows in reverse (a negative stride)
        (out[:, :2], idx, data[:, :2], idx),  # out not contiguous
        (frozen, idx, data, idx),
        (out, idx, out, idx),  # one array
        (out.astype(np.int32), idx, data.astype(np.int32), idx),
        (list(out), idx, data, idx),
    ]:
        arrays = [a for a in args if isinstance(a, np.ndarray)]
        before = [_bits(a) for a in arrays]
        assert fused.NATIVE.put_rows(*args) is False, args  # out[places] = data[picks]
        assert fused.NATIVE.add_rows_at(*args) is False, args  # held[picks] += d[places]
        assert [_bits(a) for a in arrays] == before
    assert fused.NATIVE.add_rows_at(out, idx, data, None) is False  # d has a row per pick, or no
    with pytest.raises(TypeError, match="expected out, places, data and picks"):
        fused.NATIVE.put_rows(out, idx, data)
    with pytest.raises(TypeError, match="expected held, picks, d and places"):
        fused.NATIVE.add_rows_at(out, idx, data)


@needs_kernels
@settings(deadline=None, max_examples=100)
@given(st.lists(st.integers(-(2**63), 2**63 - 1), max_size=40))
def test_index_array_is_numpys_conversion(values: list[int]) -> None:
    found = fused.NATIVE.index_array(values)
    assert _bits(found) == _bits(np.asarray(values, dtype=np.intp))


@needs_kernels
def test_index_array_declines_what_is_not_a_list_of_ints() -> None:
    for values in [[1, 2.0], [True, 1], [np.int64(3)], (1, 2), [2**64], np.arange(3)]:
        assert fused.NATIVE.index_array(values) is None
    numpys: Any = [np.int64(3), 4]
    assert _bits(backend.index_array(numpys)) == _bits(np.array([3, 4], dtype=np.intp))  # NumPy's then
