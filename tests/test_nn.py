"""The builders of ``monadl.nn`` (Linear, MLP, Embedding, LSTMCell, GRUCell, TreeLSTMCell): each one's
forward against a NumPy reference, its gradients against finite differences (the shared checker),
batched calls against unbatched ones, its weights' names and initialisation; the Tree-LSTM cell
against ``examples/tree_lstm.py``'s; and an MLP and an LSTM that learn.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, TypeVar, cast

import numpy as np
import pytest
from batching_check import gradients_of
from op_cases import F64, Weight, predict, probe

import monadl as ml
from examples.tree_lstm import Cell
from monadl import ArrayLayer, ArrayWeight, FloatLayer, FloatWeight
from monadl.gradcheck import check_gradients
from monadl.nn import MLP, Embedding, GRUCell, Linear, LSTMCell, Module, TreeLSTMCell, weights_of

M = TypeVar("M", bound=Module)
RTOL = 1e-12


def sigmoid(x: F64) -> F64:
    return np.asarray(1.0 / (1.0 + np.exp(-x)))


def uniform(seed: int, *shape: int) -> F64:
    return np.random.default_rng(seed).uniform(-1.5, 1.5, shape)


def data(module: Module) -> dict[str, F64]:
    """The module's weights' values by name."""
    return {name: np.asarray(w.data) for name, w in module.weights().items()}


def with_weights(module: M, weights: Sequence[Weight]) -> M:
    """A copy of ``module`` whose weights are ``weights``, in the order of ``module.weights()``."""
    swap = {id(old): new for old, new in zip(module.weights().values(), weights, strict=True)}

    def rebuilt(value: object) -> object:
        if isinstance(value, (ArrayWeight, FloatWeight)):
            return swap[id(value)]
        if isinstance(value, list):
            return [rebuilt(v) for v in value]
        if isinstance(value, Module):  # a dataclass, as every builder of monadl.nn
            instance: Any = value
            fields = {f.name: rebuilt(getattr(value, f.name)) for f in dataclasses.fields(instance)}
            return dataclasses.replace(instance, **fields)
        return value

    return cast(M, rebuilt(module))


def weighted_sum(*outs: ArrayLayer) -> FloatLayer:
    """``sum(out * probe)`` over the outputs: a loss whose gradient weighs every entry differently."""
    return ml.add_n([ml.sum(out * probe(tuple(predict(out).shape), seed=k)) for k, out in enumerate(outs)])


# ---------------------------------------------------------------------------- NumPy references


def linear_ref(p: dict[str, F64], x: F64, prefix: str = "") -> F64:
    return np.asarray(x @ p[f"{prefix}w"] + p.get(f"{prefix}b", 0.0))


def mlp_ref(p: dict[str, F64], x: F64, layers: int, activation: Callable[[F64], F64]) -> F64:
    for k in range(layers):
        x = linear_ref(p, x, f"layers.{k}.")
        x = activation(x) if k < layers - 1 else x
    return x


def lstm_ref(p: dict[str, F64], x: F64, h: F64, c: F64) -> tuple[F64, F64]:
    xh = np.concatenate([x, h], axis=-1)
    i, f, o = (sigmoid(linear_ref(p, xh, f"{gate}.")) for gate in "ifo")
    u = np.tanh(linear_ref(p, xh, "u."))
    c = i * u + f * c
    return o * np.tanh(c), c


def gru_ref(p: dict[str, F64], x: F64, h: F64) -> F64:
    # PyTorch's nn.GRUCell, with W_ir, W_hr stacked (and W_iz, W_hz) and b_ir + b_hr as one bias.
    xh = np.concatenate([x, h], axis=-1)
    r, z = sigmoid(linear_ref(p, xh, "r.")), sigmoid(linear_ref(p, xh, "z."))
    n = np.tanh(linear_ref(p, x, "n_x.") + r * linear_ref(p, h, "n_h."))
    return (1.0 - z) * n + z * h


def leaf_ref(p: dict[str, F64], x: F64) -> tuple[F64, F64]:
    c = linear_ref(p, x, "leaf_c.")
    return sigmoid(linear_ref(p, x, "leaf_o.")) * np.tanh(c), c


def compose_ref(p: dict[str, F64], hl: F64, cl: F64, hr: F64, cr: F64) -> tuple[F64, F64]:
    children = np.concatenate([hl, hr], axis=-1)
    i, fl, fr, o = (sigmoid(linear_ref(p, children, f"{g}.")) for g in ("i", "f_left", "f_right", "o"))
    c = i * np.tanh(linear_ref(p, children, "u.")) + fl * cl + fr * cr
    return o * np.tanh(c), c


# ------------------------------------------------------------------------------------- forward


@pytest.mark.parametrize("shape", [(3,), (5, 3)], ids=["a row", "rows"])
def test_linear_forward(shape: tuple[int, ...]) -> None:
    x = uniform(1, *shape)
    for layer in (
        Linear.new(3, 4, seed=1, dtype=np.float64),
        Linear.new(3, 4, seed=1, bias=False, dtype=np.float64),
    ):
        np.testing.assert_allclose(predict(layer(x)), linear_ref(data(layer), x), rtol=RTOL)


@pytest.mark.parametrize(
    ("activation", "reference"), [(ml.relu, lambda x: np.maximum(x, 0.0)), (ml.tanh, np.tanh)]
)
def test_mlp_forward(activation: Callable[[ArrayLayer], ArrayLayer], reference: Callable[[F64], F64]) -> None:
    mlp = MLP.new([3, 5, 4, 2], activation=activation, seed=2, dtype=np.float64)
    x = uniform(2, 6, 3)
    np.testing.assert_allclose(predict(mlp(x)), mlp_ref(data(mlp), x, 3, reference), rtol=RTOL)


def test_embedding_forward() -> None:
    embedding = Embedding.new(6, 3, seed=3)
    table = data(embedding)["table"]
    np.testing.assert_array_equal(predict(embedding(4)), table[4])
    ids = np.array([[5, 0], [5, 2]])
    np.testing.assert_array_equal(predict(embedding(ids)), table[ids])


@pytest.mark.parametrize("rows", [(), (4,)], ids=["a row", "rows"])
def test_lstm_cell_forward(rows: tuple[int, ...]) -> None:
    cell = LSTMCell.new(3, 2, seed=4, dtype=np.float64)
    x, h, c = uniform(40, *rows, 3), uniform(41, *rows, 2), uniform(42, *rows, 2)
    h_next, c_next = cell(x, h, c)
    h_ref, c_ref = lstm_ref(data(cell), x, h, c)
    np.testing.assert_allclose(predict(h_next), h_ref, rtol=RTOL)
    np.testing.assert_allclose(predict(c_next), c_ref, rtol=RTOL)


@pytest.mark.parametrize("rows", [(), (4,)], ids=["a row", "rows"])
def test_gru_cell_forward(rows: tuple[int, ...]) -> None:
    cell = GRUCell.new(3, 2, seed=5, dtype=np.float64)
    x, h = uniform(50, *rows, 3), uniform(51, *rows, 2)
    np.testing.assert_allclose(predict(cell(x, h)), gru_ref(data(cell), x, h), rtol=RTOL)


def test_tree_lstm_cell_forward() -> None:
    cell = TreeLSTMCell.new(3, 2, seed=6, dtype=np.float64)
    p = data(cell)
    xl, xr = uniform(60, 3), uniform(61, 3)
    (hl, cl), (hr, cr) = cell.leaf(xl), cell.leaf(xr)
    h, c = cell.compose(hl, cl, hr, cr)
    (hl_ref, cl_ref), (hr_ref, cr_ref) = leaf_ref(p, xl), leaf_ref(p, xr)
    h_ref, c_ref = compose_ref(p, hl_ref, cl_ref, hr_ref, cr_ref)
    for got, want in [(hl, hl_ref), (cl, cl_ref), (h, h_ref), (c, c_ref)]:
        np.testing.assert_allclose(predict(got), want, rtol=RTOL)


def test_the_initial_states_are_zeros_of_the_weights_dtype() -> None:
    lstm, gru = LSTMCell.new(3, 2, dtype=np.float32), GRUCell.new(3, 2, dtype=np.float32)
    for state, shape in [
        (lstm.zeros_state()[0], (2,)),
        (lstm.zeros_state(5)[1], (5, 2)),
        (gru.zeros_state(), (2,)),
    ]:
        value = predict(state)
        assert value.shape == shape and value.dtype == np.float32 and not value.any()
    h, c = lstm(np.ones(3, dtype=np.float32), *lstm.zeros_state())
    assert predict(h).dtype == predict(c).dtype == np.float32


# ------------------------------------------------------------------------------------ gradients
#
# Every weight of a (small) module and every input is a weight of the checker's; the loss runs
# several calls of the module, so that batchable calls merge and their merged backward is checked.


def check_module(module: M, loss: Callable[..., FloatLayer], *inputs: F64) -> None:
    """Checks the gradients of ``loss(module, *inputs)`` for the module's weights and the inputs."""
    params = list(data(module).values())

    def f(*weights: Weight) -> FloatLayer:
        return loss(with_weights(module, weights[: len(params)]), *weights[len(params) :])

    check_gradients(f, *params, *inputs)


def linear_loss(layer: Linear, x: ArrayWeight) -> FloatLayer:
    return weighted_sum(layer(x), layer(x[0]), layer(x[1]))  # the two rows' calls merge


def mlp_loss(mlp: MLP, x: ArrayWeight) -> FloatLayer:
    return weighted_sum(mlp(x))


def embedding_loss(embedding: Embedding) -> FloatLayer:
    return weighted_sum(embedding(np.array([2, 0, 2])), embedding(1), embedding(2))  # the last two merge


def lstm_loss(cell: LSTMCell, *xs: ArrayWeight) -> FloatLayer:
    """Two sequences of two steps, from zeros: the calls of each step merge."""
    states = [cell.zeros_state(), cell.zeros_state()]
    for t in range(2):
        states = [cell(xs[2 * k + t], *states[k]) for k in range(2)]
    return weighted_sum(*(h for h, _ in states), *(c for _, c in states))


def gru_loss(cell: GRUCell, x1: ArrayWeight, x2: ArrayWeight, h: ArrayWeight) -> FloatLayer:
    h1, h2 = cell(x1, h), cell(x2, cell.zeros_state())
    return weighted_sum(cell(x2, h1), cell(x1, h2))


def tree_loss(cell: TreeLSTMCell, x1: ArrayWeight, x2: ArrayWeight, x3: ArrayWeight) -> FloatLayer:
    """The tree ((x1 x2) x3)."""
    (h1, c1), (h2, c2), (h3, c3) = (cell.leaf(x) for x in (x1, x2, x3))
    h12, c12 = cell.compose(h1, c1, h2, c2)
    return weighted_sum(*cell.compose(h12, c12, h3, c3))


def test_linear_gradients() -> None:
    check_module(Linear.new(3, 2, seed=1, dtype=np.float64), linear_loss, uniform(1, 2, 3))
    check_module(Linear.new(3, 2, seed=1, bias=False, dtype=np.float64), linear_loss, uniform(1, 2, 3))


def test_mlp_gradients() -> None:
    # tanh: relu's kink would make finite differences unreliable near zero
    check_module(MLP.new([3, 4, 2], activation=ml.tanh, seed=2, dtype=np.float64), mlp_loss, uniform(2, 2, 3))


def test_embedding_gradients() -> None:
    check_module(Embedding.new(4, 2, seed=3, dtype=np.float64), embedding_loss)


def test_lstm_cell_gradients() -> None:
    cell = LSTMCell.new(2, 2, seed=4, dtype=np.float64)
    check_module(cell, lstm_loss, *(uniform(40 + k, 2) for k in range(4)))


def test_gru_cell_gradients() -> None:
    check_module(
        GRUCell.new(2, 2, seed=5, dtype=np.float64), gru_loss, uniform(50, 2), uniform(51, 2), uniform(52, 2)
    )


def test_tree_lstm_cell_gradients() -> None:
    cell = TreeLSTMCell.new(2, 2, seed=6, dtype=np.float64)
    check_module(cell, tree_loss, uniform(60, 2), uniform(61, 2), uniform(62, 2))


# --------------------------------------------------------------------------- batched = unbatched

CASES: dict[str, Callable[[], FloatLayer]] = {
    "linear": lambda: linear_loss(Linear.new(3, 2, seed=1, dtype=np.float64), ArrayWeight(uniform(1, 2, 3))),
    "mlp": lambda: weighted_sum(
        *(MLP.new([3, 4, 2], seed=2, dtype=np.float64)(uniform(k, 3)) for k in range(3))
    ),
    "embedding": lambda: embedding_loss(Embedding.new(4, 2, seed=3, dtype=np.float64)),
    "lstm": lambda: lstm_loss(
        LSTMCell.new(2, 3, seed=4, dtype=np.float64), *(ArrayWeight(uniform(k, 2)) for k in range(4))
    ),
    "gru": lambda: gru_loss(
        GRUCell.new(2, 3, seed=5, dtype=np.float64),
        *(ArrayWeight(uniform(k, s)) for k, s in enumerate((2, 2, 3))),
    ),
    "tree_lstm": lambda: tree_loss(
        TreeLSTMCell.new(2, 3, seed=6, dtype=np.float64), *(ArrayWeight(uniform(k, 2)) for k in range(3))
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_batched_equals_unbatched(name: str) -> None:
    """The same graph (the same weights, drawn from the same seeds) with batching on and off."""
    merged, alone = gradients_of(CASES[name](), batching=True), gradients_of(CASES[name](), batching=False)
    assert merged.stats.merged > 0 and alone.stats.merged == 0
    np.testing.assert_allclose(merged.value, alone.value, rtol=RTOL)
    assert len(merged.gradients) == len(alone.gradients)
    for a, b in zip(merged.gradients.values(), alone.gradients.values(), strict=True):
        np.testing.assert_allclose(a, b, rtol=RTOL, atol=RTOL)


# ------------------------------------------------------------------------ weights and their names


def test_weight_names() -> None:
    assert list(Linear.new(2, 3).weights()) == ["w", "b"]
    assert list(Linear.new(2, 3, bias=False).weights()) == ["w"]
    assert list(MLP.new([2, 3, 4]).weights()) == ["layers.0.w", "layers.0.b", "layers.1.w", "layers.1.b"]
    assert list(Embedding.new(5, 2).weights()) == ["table"]
    assert list(LSTMCell.new(2, 3).weights()) == ["i.w", "i.b", "f.w", "f.b", "o.w", "o.b", "u.w", "u.b"]
    assert list(GRUCell.new(2, 3).weights()) == [
        "r.w",
        "r.b",
        "z.w",
        "z.b",
        "n_x.w",
        "n_x.b",
        "n_h.w",
        "n_h.b",
    ]
    gates = ["leaf_c", "leaf_o", "i", "f_left", "f_right", "o", "u"]
    assert list(TreeLSTMCell.new(2, 3).weights()) == [f"{g}.{p}" for g in gates for p in "wb"]
    # In a structure of modules, as any module.
    assert list(weights_of({"embed": Embedding.new(5, 2), "out": [Linear.new(2, 1)]})) == [
        "embed.table",
        "out.0.w",
        "out.0.b",
    ]


def test_an_mlps_activation_is_not_a_weight() -> None:
    mlp = MLP.new([2, 3, 1], activation=ml.tanh)
    assert mlp.activation is ml.tanh
    assert len(mlp.weights()) == 4 and not any("activation" in name for name in mlp.weights())


def test_shapes_and_initialisation() -> None:
    p = data(LSTMCell.new(3, 2, seed=0))
    assert {name: v.shape for name, v in p.items() if name.endswith("w")} == {
        g: (5, 2) for g in ("i.w", "f.w", "o.w", "u.w")
    }
    np.testing.assert_array_equal(p["f.b"], np.ones(2))  # the forget gate's bias: 1
    for gate in "iou":
        np.testing.assert_array_equal(p[f"{gate}.b"], np.zeros(2))
    gru = data(GRUCell.new(3, 2))
    assert [v.shape for v in gru.values()] == [(5, 2), (2,), (5, 2), (2,), (3, 2), (2,), (2, 2), (2,)]
    # Linear: std 1/sqrt(inputs) by default, or std; the same seed gives the same weights.
    w = data(Linear.new(400, 300, seed=9))["w"]
    assert abs(w.std() - 400**-0.5) < 0.01 * 400**-0.5
    assert abs(data(Linear.new(400, 300, seed=9, std=0.5))["w"].std() - 0.5) < 0.005
    np.testing.assert_array_equal(w, data(Linear.new(400, 300, seed=9))["w"])
    # One generator for a module's weights: its layers differ; dtype is honoured.
    mlp = MLP.new([4, 4, 4], seed=1, dtype=np.float32)
    assert not np.array_equal(data(mlp)["layers.0.w"], data(mlp)["layers.1.w"])
    assert all(v.dtype == np.float32 for v in data(mlp).values())
    assert Embedding.new(5, 2, optimizer=ml.SGD(0.5)).table.optimizer == ml.SGD(0.5)


def test_bad_shapes_are_refused() -> None:
    with pytest.raises(ValueError, match="b must have shape"):
        Linear(ArrayWeight.zeros((2, 3)), ArrayWeight.zeros((2,)))
    with pytest.raises(ValueError, match="at least"):
        MLP.new([3])
    lstm = LSTMCell.new(2, 3)
    with pytest.raises(ValueError, match="LSTMCell"):
        LSTMCell(lstm.i, lstm.f, lstm.o, Linear.new(5, 2))
    gru = GRUCell.new(2, 3)
    with pytest.raises(ValueError, match="GRUCell"):
        GRUCell(gru.r, gru.z, gru.n_x, Linear.new(3, 3, bias=False))


# ------------------------------------------------------------------- the example's Tree-LSTM cell


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_tree_lstm_cell_is_the_examples(dtype: type[np.floating[Any]]) -> None:
    """From one seed, the same weights as examples/tree_lstm.py's Cell (the generator left in the
    same state), and the same h and c at every node, bit for bit."""
    ours_rng, theirs_rng = np.random.default_rng(7), np.random.default_rng(7)
    ours, theirs = TreeLSTMCell.new(3, 4, seed=ours_rng, dtype=dtype), Cell.new(3, 4, theirs_rng, dtype)
    assert ours_rng.standard_normal() == theirs_rng.standard_normal()
    for field in dataclasses.fields(theirs):
        affine = getattr(theirs, field.name)
        for p in "wb":
            np.testing.assert_array_equal(data(ours)[f"{field.name}.{p}"], getattr(affine, p).data)
    # Share the weights: the graphs are then the same ops on the same values.
    ours = with_weights(
        ours, [getattr(getattr(theirs, f.name), p) for f in dataclasses.fields(theirs) for p in "wb"]
    )
    xs = [uniform(70 + k, 3).astype(dtype) for k in range(3)]
    ours_leaves, theirs_leaves = [ours.leaf(x) for x in xs], [theirs.leaf_cell(ml.lift_array(x)) for x in xs]
    ours_mid = ours.compose(*ours_leaves[0], *ours_leaves[1])
    ours_root = ours.compose(*ours_mid, *ours_leaves[2])
    theirs_mid = theirs.inner_cell(*theirs_leaves[0], *theirs_leaves[1])
    theirs_root = theirs.inner_cell(*theirs_mid, *theirs_leaves[2])
    for a, b in zip(
        [*ours_leaves, ours_mid, ours_root], [*theirs_leaves, theirs_mid, theirs_root], strict=True
    ):
        for ours_value, theirs_value in zip(a, b, strict=True):
            np.testing.assert_array_equal(predict(ours_value), predict(theirs_value))


# -------------------------------------------------------------------------------------- learning


def train(loss: Callable[[], FloatLayer], steps: int, optimizer: ml.Optimizer) -> list[float]:
    """The losses of ``steps`` training steps, each on a freshly built graph."""
    return [float(ml.train_blocking(loss(), optimizer).unwrap()) for _ in range(steps)]


def test_an_mlp_learns_xor() -> None:
    mlp = MLP.new([2, 8, 2], activation=ml.tanh, seed=0)
    x = np.array([[0.0, 0.0], [0.0, 1.0], [1.0, 0.0], [1.0, 1.0]])
    labels = np.array([0, 1, 1, 0])
    losses = train(lambda: ml.cross_entropy(mlp(x), labels), 60, ml.Adam(0.05))
    assert losses[-1] < 0.1 * losses[0]
    assert list(np.argmax(predict(mlp(x)), axis=-1)) == list(labels)


def test_an_lstm_remembers_the_first_input() -> None:
    """Sequences of three numbers; the target is the first. Each sequence runs call by call (the
    calls of one step merge across the sequences)."""
    cell, readout = LSTMCell.new(1, 4, seed=0), Linear.new(4, 1, seed=1)
    sequences = np.random.default_rng(0).choice([-1.0, 1.0], size=(8, 3, 1))

    def loss() -> FloatLayer:
        errors = []
        for sequence in sequences:
            h, c = cell.zeros_state()
            for x in sequence:
                h, c = cell(x, h, c)
            errors.append(ml.sum((readout(h) - sequence[0]) ** 2.0))
        return ml.add_n(errors) * (1.0 / len(sequences))

    losses = train(loss, 40, ml.Adam(0.05))
    assert losses[-1] < 0.2 * losses[0]
