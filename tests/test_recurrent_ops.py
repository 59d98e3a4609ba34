"""The recurrent cells' fused gate ops, ``lstm_c``, ``lstm_h`` and ``gru_h`` (monadl.dsl.ops.recurrent):
values against the elementwise ops they replace, gradients against finite differences, merged
calls against calls on their own, errors, and the cells built on them."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from batching_check import merged_and_alone
from op_cases import predict

import monadl as ml
from monadl import ArrayWeight, FloatLayer, nn


def uniform(seed: int, *shape: int) -> np.ndarray[Any, np.dtype[np.float64]]:
    return np.random.default_rng(seed).uniform(-3.0, 3.0, shape)


def sigmoid(x: Any) -> Any:
    return 1.0 / (1.0 + np.exp(-x))


@pytest.mark.parametrize("shape", [(5,), (3, 5), (2, 3, 4)])
def test_the_values_are_the_cells_arithmetic(shape: tuple[int, ...]) -> None:
    i, f, u, c, o = (uniform(k, *shape) for k in range(5))
    c_next = sigmoid(i) * np.tanh(u) + sigmoid(f) * c
    np.testing.assert_allclose(predict(ml.lstm_c(i, f, u, c)), c_next, rtol=1e-14, atol=1e-15)
    np.testing.assert_allclose(predict(ml.lstm_h(o, c_next)), sigmoid(o) * np.tanh(c_next), rtol=1e-14)


def test_the_dtype_is_kept() -> None:
    i, f, u, c = (uniform(k, 2, 3).astype(np.float32) for k in range(4))
    value = np.asarray(predict(ml.lstm_h(i, ml.lstm_c(i, f, u, c))))
    assert value.dtype == np.float32
    assert ml.lstm_c(i, f, u, c).shape == (2, 3) and ml.lstm_c(i, f, u, c).dtype == np.float32


@pytest.mark.parametrize("memory", [(3, 4), (4,)])
def test_the_gradients_are_finite_differences(memory: tuple[int, ...]) -> None:
    probe_c, probe_h = uniform(9, 3, 4), uniform(10, 3, 4)

    def loss(i: ArrayWeight, f: ArrayWeight, u: ArrayWeight, o: ArrayWeight, c: ArrayWeight) -> FloatLayer:
        c_next = ml.lstm_c(i, f, u, c)
        # both outputs read, and c' read twice (by the loss and by lstm_h): its deltas add
        return ml.sum(c_next * probe_c) + ml.sum(ml.lstm_h(o, c_next) * probe_h)

    ml.check_gradients(loss, *(uniform(20 + k, 3, 4) for k in range(4)), uniform(30, *memory))


def test_merged_calls_equal_calls_on_their_own() -> None:
    """The steps of several sequences through one cell: the cell's calls and its fused ops merge
    across the sequences; values and gradients equal the unmerged run's."""

    def loss() -> FloatLayer:
        cell = nn.LSTMCell.new(3, 4, seed=1, dtype=np.float64)
        sequences = [[uniform(40 + 10 * s + t, 3) for t in range(2 + s)] for s in range(4)]
        terms = []
        for s, steps in enumerate(sequences):
            h, c = cell.zeros_state()
            for x in steps:
                h, c = cell(x, h, c)
            terms.append(ml.sum(h * uniform(60 + s, 4)) + ml.sum(c * uniform(70 + s, 4)))
        return ml.add_n(terms)

    merged, alone = merged_and_alone(loss)
    assert merged.stats.merged > 0 and alone.stats.merged == 0
    for op in ("lstm_c", "lstm_h"):
        assert merged.stats.kinds.get(op, 0) < alone.stats.kinds[op], op


def test_the_cell_equals_its_elementwise_form() -> None:
    """``LSTMCell``'s step (on the fused ops) against the same arithmetic in plain NumPy, values and
    the gradients of every weight."""
    cell = nn.LSTMCell.new(3, 4, seed=2, dtype=np.float64)
    x, h0, c0 = uniform(80, 2, 3), uniform(81, 2, 4), uniform(82, 2, 4)
    h, c = cell(x, h0, c0)
    probe = uniform(83, 2, 4)
    value, gradients = ml.compute_gradients(ml.sum(h * probe) + ml.sum(c))
    xh = np.concatenate([x, h0], axis=-1)
    pre = {name: xh @ gate.w.data + gate.b.data for name, gate in vars(cell).items() if gate.b is not None}
    c_ref = sigmoid(pre["i"]) * np.tanh(pre["u"]) + sigmoid(pre["f"]) * c0
    h_ref = sigmoid(pre["o"]) * np.tanh(c_ref)
    assert value == pytest.approx(float(np.sum(h_ref * probe) + np.sum(c_ref)), rel=1e-13)
    # the output gate's weight: d(sum(h * probe))/d(W_o) = xh.T @ (probe * tanh(c) * s'(o))
    so = sigmoid(pre["o"])
    expected = xh.T @ (probe * np.tanh(c_ref) * so * (1.0 - so))
    np.testing.assert_allclose(gradients[cell.o.w], expected, rtol=1e-12, atol=1e-14)


def test_errors_name_the_op() -> None:
    with pytest.raises(ml.ShapeError, match=r"lstm_c: operands of shapes \(2, 3\) and \(2, 4\)"):
        predict(ml.lstm_c(uniform(1, 2, 3), uniform(2, 2, 4), uniform(3, 2, 3), uniform(4, 2, 3)))
    with pytest.raises(TypeError, match=r"lstm_h: expected an array .* for o"):
        ml.lstm_h("o", uniform(1, 3))  # type: ignore[arg-type]


def gru_reference(r: Any, z: Any, n_x: Any, n_h: Any, h: Any) -> Any:
    return (1.0 - sigmoid(z)) * np.tanh(n_x + sigmoid(r) * n_h) + sigmoid(z) * h


@pytest.mark.parametrize("shape", [(5,), (3, 5), (2, 3, 4)])
def test_gru_h_is_the_cells_arithmetic(shape: tuple[int, ...]) -> None:
    parts = [uniform(90 + k, *shape) for k in range(5)]
    np.testing.assert_allclose(predict(ml.gru_h(*parts)), gru_reference(*parts), rtol=1e-14, atol=1e-15)
    assert ml.gru_h(*parts).shape == shape


@pytest.mark.parametrize("state", [(3, 4), (4,)])
def test_gru_h_gradients_are_finite_differences(state: tuple[int, ...]) -> None:
    probe_h = uniform(11, 3, 4)

    def loss(
        r: ArrayWeight, z: ArrayWeight, n_x: ArrayWeight, n_h: ArrayWeight, h: ArrayWeight
    ) -> FloatLayer:
        return ml.sum(ml.gru_h(r, z, n_x, n_h, h) * probe_h)

    ml.check_gradients(loss, *(uniform(100 + k, 3, 4) for k in range(4)), uniform(110, *state))


def test_gru_merged_calls_equal_calls_on_their_own() -> None:
    def loss() -> FloatLayer:
        cell = nn.GRUCell.new(3, 4, seed=3, dtype=np.float64)
        terms = []
        for s in range(4):
            h = cell.zeros_state()
            for t in range(2 + s):
                h = cell(uniform(120 + 10 * s + t, 3), h)
            terms.append(ml.sum(h * uniform(170 + s, 4)))
        return ml.add_n(terms)

    merged, alone = merged_and_alone(loss)
    assert merged.stats.merged > 0 and alone.stats.merged == 0
    assert merged.stats.kinds.get("gru_h", 0) < alone.stats.kinds["gru_h"]


def test_gru_h_errors_name_the_op() -> None:
    good = uniform(1, 2, 3)
    with pytest.raises(ml.ShapeError, match=r"gru_h: operands of shapes"):
        predict(ml.gru_h(good, good, good, uniform(2, 2, 4), good))
    with pytest.raises(TypeError, match=r"gru_h: expected an array .* for n_h"):
        ml.gru_h(good, good, good, "n_h", good)  # type: ignore[arg-type]
