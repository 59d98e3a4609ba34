"""The sequence layers ``nn.LSTM`` and ``nn.GRU``: PyTorch's results on the same weights, gradients
by finite differences, batched equal to unbatched (and merged), variable lengths, bad input."""

from __future__ import annotations

import dataclasses
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest
from batching_check import assert_close, gradients_of
from op_cases import probe
from returns.result import Failure

import monadl as ml
from monadl import ArrayLayer, ArrayWeight, FloatLayer, nn
from monadl.bench.suite_dynet import fused_lstm
from monadl.do.primitive import JointDeltas
from monadl.dsl.ops.packing import layer_op
from monadl.gradcheck import check_gradients

LENGTHS = (5, 2, 3, 1)


def sequences(inputs: int, lengths: tuple[int, ...] = LENGTHS, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.normal(size=(n, inputs)) for n in lengths]


def state_hs(states: list[Any]) -> list[ArrayLayer]:
    return [s[0] if isinstance(s, tuple) else s for s in states]


# ------------------------------------------------------------------------------- against PyTorch


def torch_lstm(lstm: nn.LSTM) -> Any:
    torch = pytest.importorskip("torch")
    params = {name: np.asarray(w.data) for name, w in lstm.weights().items()}
    module = torch.nn.LSTM(lstm.inputs, lstm.hidden, lstm.layers, bidirectional=lstm.bidirectional)
    module = module.double()
    with torch.no_grad():
        for layer in range(lstm.layers):
            for prefix, suffix in (("forward_cells", ""), ("backward_cells", "_reverse")):
                if suffix and not lstm.bidirectional:
                    continue
                w_x, w_h, b = fused_lstm(params, f"{prefix}.{layer}", "ifuo")
                getattr(module, f"weight_ih_l{layer}{suffix}").copy_(torch.from_numpy(w_x))
                getattr(module, f"weight_hh_l{layer}{suffix}").copy_(torch.from_numpy(w_h))
                getattr(module, f"bias_ih_l{layer}{suffix}").copy_(torch.from_numpy(b))
                getattr(module, f"bias_hh_l{layer}{suffix}").zero_()
    return module


def torch_gru(gru: nn.GRU) -> Any:
    torch = pytest.importorskip("torch")
    module = torch.nn.GRU(gru.inputs, gru.hidden, gru.layers, bidirectional=gru.bidirectional).double()
    with torch.no_grad():
        for layer in range(gru.layers):
            for cells, suffix in ((gru.forward_cells, ""), (gru.backward_cells, "_reverse")):
                if not cells:
                    continue
                cell = cells[layer]
                n = cell.inputs
                r, z = np.asarray(cell.r.w.data), np.asarray(cell.z.w.data)
                w_ih = np.concatenate([r[:n].T, z[:n].T, np.asarray(cell.n_x.w.data).T])
                w_hh = np.concatenate([r[n:].T, z[n:].T, np.asarray(cell.n_h.w.data).T])
                assert cell.r.b is not None and cell.z.b is not None
                assert cell.n_x.b is not None and cell.n_h.b is not None
                b_ih = np.concatenate([np.asarray(g.data) for g in (cell.r.b, cell.z.b, cell.n_x.b)])
                b_hh = np.concatenate([np.zeros(2 * gru.hidden), np.asarray(cell.n_h.b.data)])
                for name, value in (
                    ("weight_ih", w_ih),
                    ("weight_hh", w_hh),
                    ("bias_ih", b_ih),
                    ("bias_hh", b_hh),
                ):
                    getattr(module, f"{name}_l{layer}{suffix}").copy_(
                        torch.from_numpy(np.ascontiguousarray(value))
                    )
    return module


@pytest.mark.parametrize("kind", ["lstm", "gru"])
@pytest.mark.parametrize(("layers", "bidirectional"), [(1, False), (2, True), (3, False)])
def test_outputs_and_final_states_are_pytorchs(kind: str, layers: int, bidirectional: bool) -> None:
    torch = pytest.importorskip("torch")
    build = nn.LSTM.new if kind == "lstm" else nn.GRU.new
    model = build(
        3,
        4,
        layers=layers,
        bidirectional=bidirectional,
        seed=1,
        init=nn.init.xavier_uniform,
        dtype=np.float64,
    )
    reference = torch_lstm(model) if isinstance(model, nn.LSTM) else torch_gru(model)
    xs = sequences(3)
    out = model(xs)
    assert [len(o) for o in out.outputs] == list(LENGTHS)
    directions = 2 if bidirectional else 1
    assert all(len(s) == layers * directions for s in out.states)
    for s, x in enumerate(xs):
        with torch.no_grad():
            expected, final = reference(torch.from_numpy(x).unsqueeze(1))
        h_n = (final[0] if isinstance(final, tuple) else final).squeeze(1).numpy()
        got = np.asarray(ml.stack(out.outputs[s]).predict_blocking().unwrap())
        got_h = np.asarray(ml.stack(state_hs(out.states[s])).predict_blocking().unwrap())
        np.testing.assert_allclose(got, expected.squeeze(1).numpy(), rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(got_h, h_n, rtol=1e-12, atol=1e-12)
        if isinstance(final, tuple):  # an LSTM's c_n
            cs = [state[1] for state in out.states[s] if isinstance(state, tuple)]
            got_c = np.asarray(ml.stack(cs).predict_blocking().unwrap())
            np.testing.assert_allclose(got_c, final[1].squeeze(1).numpy(), rtol=1e-12, atol=1e-12)


# ------------------------------------------------------------------------------ gradients


def scalar(out: nn.SequenceOutput[Any], hidden: int) -> FloatLayer:
    """``sum(x * probe)`` over every output and every part of every final state: every path counts
    (the outputs are 2 ``hidden`` wide: bidirectional)."""
    terms: list[FloatLayer] = []
    for s, (outputs, states) in enumerate(zip(out.outputs, out.states, strict=True)):
        terms += [ml.sum(o * probe((2 * hidden,), 10 * s + t)) for t, o in enumerate(outputs)]
        for k, state in enumerate(states):
            for j, part in enumerate(state if isinstance(state, tuple) else (state,)):
                terms.append(ml.sum(part * probe((hidden,), 100 * s + 10 * k + j)))
    return ml.add_n(terms)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_gradients_of_a_stacked_bidirectional_layer_are_finite_differences(kind: str) -> None:
    build = nn.LSTM.new if kind == "lstm" else nn.GRU.new
    model: Any = build(2, 2, layers=2, bidirectional=True, seed=3)
    first = model.forward_cells[0]
    top = model.backward_cells[1]

    def loss(x0: ArrayWeight, x1: ArrayWeight, w_first: ArrayWeight, w_top: ArrayWeight) -> FloatLayer:
        if isinstance(first, nn.LSTMCell) and isinstance(top, nn.LSTMCell):
            cells: tuple[Any, Any] = (
                dataclasses.replace(first, i=nn.Linear(w_first, first.i.b)),
                dataclasses.replace(top, u=nn.Linear(w_top, top.u.b)),
            )
        else:
            assert isinstance(first, nn.GRUCell) and isinstance(top, nn.GRUCell)
            cells = (
                dataclasses.replace(first, n_x=nn.Linear(w_first, first.n_x.b)),
                dataclasses.replace(top, r=nn.Linear(w_top, top.r.b)),
            )
        layer = dataclasses.replace(
            model,
            forward_cells=[cells[0], model.forward_cells[1]],
            backward_cells=[model.backward_cells[0], cells[1]],
        )
        steps = [[x0[t] for t in range(3)], [x1[t] for t in range(2)]]  # two sequences, 3 and 2 steps
        return scalar(layer(steps), 2)

    rng = np.random.default_rng(4)
    w_first = np.asarray(first.i.w.data if isinstance(first, nn.LSTMCell) else first.n_x.w.data, np.float64)
    w_top = np.asarray(top.u.w.data if isinstance(top, nn.LSTMCell) else top.r.w.data, np.float64)
    check_gradients(loss, rng.normal(size=(3, 2)), rng.normal(size=(2, 2)), w_first.copy(), w_top.copy())


def by_cells(model: nn.LSTM | nn.GRU, sequences: list[list[Any]]) -> nn.SequenceOutput[Any]:
    """What ``model(sequences)`` computes, by calling its cells one step at a time."""
    cells: list[list[Any]] = [list(model.forward_cells), list(model.backward_cells)]
    directions = cells if model.bidirectional else cells[:1]
    states: list[list[Any]] = [[] for _ in sequences]
    xs: list[list[Any]] = sequences
    for layer in range(model.layers):
        runs = []  # per direction, per sequence, per step
        for d, direction in enumerate(directions):
            cell = direction[layer]
            run = []
            for s, steps in enumerate(xs):
                state = cell.zeros_state()
                hs = []
                for x in steps if d == 0 else steps[::-1]:
                    if isinstance(cell, nn.LSTMCell):
                        h, c = cell(x, *state)
                        state = (h, c)
                    else:
                        h = state = cell(x, state)
                    hs.append(h)
                run.append(hs if d == 0 else hs[::-1])
                states[s].append(state)
            runs.append(run)
        xs = (
            runs[0]
            if len(runs) == 1
            else [
                [ml.concatenate([f, b]) for f, b in zip(fs, bs, strict=True)]
                for fs, bs in zip(runs[0], runs[1], strict=True)
            ]
        )
    return nn.SequenceOutput(xs, states)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_a_layer_as_one_op_is_its_cells_called_step_by_step(kind: str) -> None:
    # each layer runs as one op (monadl.dsl.ops.packed_lstm, packed_gru); calling its cells one step at
    # a time gives the same values and gradients, but for the order of the sums
    build = nn.LSTM.new if kind == "lstm" else nn.GRU.new
    model = build(3, 4, layers=2, bidirectional=True, seed=12, dtype=np.float64)
    table = ml.ArrayWeight(np.random.default_rng(14).normal(size=(10, 3)))
    steps = [[table[int(k)] for k in np.arange(n) % 10] for n in (4, 1, 6, 6, 2)]
    packed, cells = (
        gradients_of(scalar(model(steps), 4), True),
        gradients_of(scalar(by_cells(model, steps), 4), True),
    )
    assert_close(packed.value, cells.value, "loss")
    assert set(packed.gradients) == set(cells.gradients) == {*model.weights().values(), table}
    for weight, gradient in cells.gradients.items():
        assert_close(packed.gradients[weight], gradient, weight.name or repr(weight))
    op = f"packed_{kind}"
    assert packed.stats.kinds[op] == 2 and op not in cells.stats.kinds


# ---------------------------------------------------------------------- dynamic batching


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_batched_equals_unbatched_and_the_outputs_lookups_merge(kind: str) -> None:
    build = nn.LSTM.new if kind == "lstm" else nn.GRU.new
    model = build(3, 4, layers=2, bidirectional=True, seed=5, dtype=np.float64)
    xs = sequences(3, seed=6)
    table = ml.ArrayWeight(np.random.default_rng(7).normal(size=(10, 3)))
    steps = [[table[int(k)] for k in np.arange(n) % 10] for n in LENGTHS]  # steps that are layers
    out_arrays = model(xs)
    out_layers = model(steps)
    loss = ml.add_n([scalar(out_arrays, 4), scalar(out_layers, 4)])
    batched, alone = gradients_of(loss, batching=True), gradients_of(loss, batching=False)
    assert_close(batched.value, alone.value, "loss")
    assert set(batched.gradients) == {*model.weights().values(), table}
    for weight, gradient in alone.gradients.items():
        assert_close(batched.gradients[weight], gradient, weight.name or repr(weight))
    # Each layer is one op over the whole batch, both directions (two calls of the model). The
    # last layer's outputs, one lookup a step, merge into one per call (and the table's lookups).
    for stats in (alone.stats, batched.stats):
        assert stats.kinds[f"packed_{kind}"] == 2 * 2, stats.kinds
    assert alone.stats.kinds["take_rows"] >= 2 * sum(LENGTHS) + sum(LENGTHS)
    assert batched.stats.kinds["take_rows"] <= 3, batched.stats.kinds


# ---------------------------------------------------------------------- sequences and shapes


def test_a_sequences_results_do_not_depend_on_the_others_in_its_batch() -> None:
    # float64: a layer's products cover the whole batch, and a row's last bit may depend on the
    # products' sizes (BLAS's blocking); what is tested is that no sequence reads another's steps
    model = nn.LSTM.new(3, 4, layers=2, bidirectional=True, seed=8, dtype=np.float64)
    xs = sequences(3, seed=9)
    together = model(xs)
    for s, x in enumerate(xs):
        alone = model([x])
        both = ml.stack([*together.outputs[s], *alone.outputs[0]]).predict_blocking().unwrap()
        half = len(x)
        np.testing.assert_allclose(np.asarray(both)[:half], np.asarray(both)[half:], rtol=1e-12, atol=0)


def test_rows_of_an_array_are_the_steps_and_unidirectional_outputs_are_h() -> None:
    model = nn.GRU.new(3, 4, seed=10)
    x = sequences(3, (4,), seed=11)[0]
    as_array, as_list = model([x]), model([[row for row in x]])
    got = ml.stack([*as_array.outputs[0], *as_list.outputs[0]]).predict_blocking().unwrap()
    np.testing.assert_array_equal(np.asarray(got)[:4], np.asarray(got)[4:])
    assert len(as_array.states[0]) == 1
    last = ml.stack([as_array.outputs[0][-1], as_array.states[0][0]]).predict_blocking().unwrap()
    np.testing.assert_array_equal(np.asarray(last)[0], np.asarray(last)[1])
    assert model.weights().keys() >= {"forward_cells.0.r.w", "forward_cells.0.n_h.b"}
    assert (model.inputs, model.hidden, model.layers, model.bidirectional) == (3, 4, 1, False)


def test_an_empty_list_of_sequences_gives_nothing() -> None:
    out = nn.LSTM.new(3, 4, bidirectional=True)([])
    assert out.outputs == [] and out.states == []


def test_bad_input_is_an_error_naming_the_sequence_and_the_shapes() -> None:
    lstm = nn.LSTM.new(3, 4, bidirectional=True)
    with pytest.raises(TypeError, match=r"LSTM: takes a list of sequences, got an array of shape \(5, 3\)"):
        lstm(np.zeros((5, 3)))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="LSTM: sequence 1 is empty"):
        lstm([np.zeros((2, 3)), []])
    with pytest.raises(
        ValueError, match=r"LSTM: sequence 0 is an array of shape \(2, 5\), not \(length, 3\)"
    ):
        lstm([np.zeros((2, 5))])
    with pytest.raises(ValueError, match=r"LSTM: step 1 of sequence 0 has shape \(2,\), not \(3,\)"):
        lstm([[np.zeros(3), np.zeros(2)]])
    with pytest.raises(TypeError, match="GRU: sequence 0 must be a list of steps or a 2-D array"):
        nn.GRU.new(3, 4)(["abc"])  # type: ignore[list-item]
    with pytest.raises(ValueError, match=r"LSTM\.new: layers must be 1 or more, got 0"):
        nn.LSTM.new(3, 4, layers=0)
    with pytest.raises(
        ValueError, match=r"LSTM: layer 1's cells need \(inputs, hidden\) \(8, 4\), got \(4, 4\)"
    ):
        nn.LSTM(
            [nn.LSTMCell.new(3, 4), nn.LSTMCell.new(4, 4)], [nn.LSTMCell.new(3, 4), nn.LSTMCell.new(4, 4)]
        )
    with pytest.raises(ValueError, match="GRU: needs as many backward cells as forward ones"):
        nn.GRU([nn.GRUCell.new(3, 4)], [nn.GRUCell.new(3, 4), nn.GRUCell.new(8, 4)])
    # integer or boolean data: the layer the user called names it, not an inner op (stack)
    for kind in ("LSTM", "GRU"):
        layer = getattr(nn, kind).new(3, 4)
        with pytest.raises(
            TypeError, match=rf"^{kind}: sequence 1: expected a floating-point array .*got dtype int64"
        ):
            layer([np.zeros((2, 3)), np.ones((2, 3), dtype=np.int64)])
        with pytest.raises(
            TypeError,
            match=rf"^{kind}: step 1 of sequence 0: expected a floating-point array .*got dtype bool",
        ):
            layer([[np.zeros(3), np.ones(3, dtype=bool)]])
    # steps that are layers have no shape until they run: the layer's op reports them, with shapes
    table = ml.ArrayWeight(np.ones((10, 5)))
    result = ml.stack(lstm([[table[1], table[2]], [table[3]]]).outputs[0]).predict_blocking()
    assert isinstance(result, Failure) and isinstance(result.failure(), ml.ShapeError)
    assert "packed_lstm: the steps must be (steps, 3) for these cells, got (3, 5)" in str(result.failure())


@pytest.mark.parametrize("directions", [1, 2])
def test_a_layer_ops_deltas_on_several_threads_are_worked_out_once(directions: int) -> None:
    """A whole-layer op's joint vjp gives every operand's delta in one backward pass: asked for on
    a pool's threads at once (as a backward pass on a pool asks), the first works it out and the
    others wait for it (none repeats it)."""
    calls: list[Any] = []

    def forward(xp: Any, x: Any, *weights: Any, lengths: tuple[int, ...]) -> tuple[Any, tuple[Any, ...]]:
        return x, ("saved",)

    def deltas(xp: Any, d: Any, saved: Any, *inputs: Any, lengths: tuple[int, ...]) -> list[Any]:
        calls.append(saved)
        time.sleep(0.05)  # long enough for every thread to ask meanwhile
        return [k * d for k in range(len(inputs))]

    prim = layer_op(
        "fake", forward, deltas, lambda *_, **__: 0.0, lambda *_, **__: None, lambda *_, **__: None
    )
    assert prim.joint_vjp is deltas and prim.vjps == ()
    operands = (np.ones(2), *[np.ones(2)] * (8 * directions))
    _, saved = prim.forward(np, *operands, lengths=(2,))
    d = np.ones(2)
    joint = JointDeltas(prim)
    with ThreadPoolExecutor(len(operands)) as pool:
        got = list(
            pool.map(
                lambda k: joint.delta(k, np, operands, saved, d, {"lengths": (2,)}, False),
                range(len(operands)),
            )
        )
    assert calls == [("saved",)]
    for k, delta in enumerate(got):
        np.testing.assert_array_equal(delta, k * d)


def test_with_a_pool_a_layers_gradients_are_those_of_one_thread() -> None:
    model = nn.LSTM.new(3, 4, bidirectional=True, seed=15, dtype=np.float64)
    xs = sequences(3, seed=16)
    alone = ml.compute_gradients(scalar(model(xs), 4), executor=ml.Executor())
    with ml.Executor(workers=2, min_pool_cost=0.0) as executor:
        pooled = ml.compute_gradients(scalar(model(xs), 4), executor=executor)
    assert pooled[0] == alone[0]
    for weight, gradient in alone[1].items():
        np.testing.assert_array_equal(pooled[1][weight], gradient)
