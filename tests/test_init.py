"""The initialisers of ``monadl.nn.init``: each one's statistics against its formula on a large
sample, orthogonality, determinism by seed, fans, and the builders' ``init=``."""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest

from monadl import nn
from monadl.nn import init

SHAPE = (300, 500)  # 150,000 draws: the sample variance is within 1% of the true one (~0.4% std)


def assert_variance(drawn: np.ndarray, variance: float) -> None:
    assert abs(float(drawn.mean())) < 0.05 * math.sqrt(variance)
    assert float(drawn.var()) == pytest.approx(variance, rel=0.02)


def test_fans_of_a_matrix_are_monadls_inputs_outputs_and_of_a_kernel_pytorchs() -> None:
    assert init.fans((3, 7)) == (3, 7)
    assert init.fans((16, 8, 3, 5)) == (8 * 15, 16 * 15)
    with pytest.raises(ValueError, match=r"fans: needs a shape of 2 dimensions or more, got \(4,\)"):
        init.fans((4,))


@pytest.mark.parametrize(
    ("nonlinearity", "param", "gain"),
    [
        ("linear", None, 1.0),
        ("sigmoid", None, 1.0),
        ("tanh", None, 5 / 3),
        ("relu", None, math.sqrt(2)),
        ("leaky_relu", None, math.sqrt(2 / (1 + 0.01**2))),
        ("leaky_relu", 0.2, math.sqrt(2 / 1.04)),
        ("selu", None, 0.75),
    ],
)
def test_calculate_gain_follows_pytorchs_table(
    nonlinearity: init.Nonlinearity, param: float | None, gain: float
) -> None:
    assert init.calculate_gain(nonlinearity, param) == pytest.approx(gain)


def test_xavier_uniform_is_uniform_with_glorots_bound() -> None:
    fan_in, fan_out = SHAPE
    bound = 2.0 * math.sqrt(6 / (fan_in + fan_out))
    drawn = init.xavier_uniform(SHAPE, gain=2.0, seed=1, dtype=np.float64)
    assert drawn.shape == SHAPE and drawn.dtype == np.float64
    assert float(np.abs(drawn).max()) <= bound
    assert float(np.abs(drawn).max()) > 0.999 * bound  # fills its interval
    assert_variance(drawn, bound**2 / 3)


def test_xavier_normal_has_glorots_std() -> None:
    drawn = init.xavier_normal(SHAPE, gain=0.5, seed=2, dtype=np.float32)
    assert drawn.dtype == np.float32
    assert_variance(drawn.astype(np.float64), 0.25 * 2 / sum(SHAPE))


@pytest.mark.parametrize("mode", ["fan_in", "fan_out"])
def test_kaiming_uniform_and_normal_have_hes_variance(mode: init.Mode) -> None:
    shape = (64, 48, 3, 3)  # a conv kernel: fans 48*9 and 64*9
    fan = 48 * 9 if mode == "fan_in" else 64 * 9
    uniform = init.kaiming_uniform(shape, mode=mode, seed=3)
    assert float(np.abs(uniform).max()) <= math.sqrt(6 / fan)
    assert_variance(uniform, 2 / fan)
    normal = init.kaiming_normal(shape, a=0.2, mode=mode, nonlinearity="leaky_relu", seed=4)
    assert_variance(normal, 2 / (1 + 0.2**2) / fan)
    tanh = init.kaiming_normal(SHAPE, nonlinearity="tanh", seed=5)
    assert_variance(tanh, (5 / 3) ** 2 / SHAPE[0])


def test_explicit_fans_override_the_shapes() -> None:
    drawn = init.xavier_normal(SHAPE, fans=(10, 30), seed=6)
    assert_variance(drawn, 2 / 40)
    with pytest.raises(ValueError, match=r"xavier_normal: fans must be positive, got \(0, 3\)"):
        init.xavier_normal(SHAPE, fans=(0, 3))


@pytest.mark.parametrize("shape", [(40, 40), (60, 25), (25, 60), (8, 3, 2, 2)])
def test_orthogonal_rows_or_columns_are_orthonormal_times_the_gain(shape: tuple[int, ...]) -> None:
    drawn = init.orthogonal(shape, gain=1.5, seed=7, dtype=np.float64)
    assert drawn.shape == shape
    flat = drawn.reshape(shape[0], -1) / 1.5
    small = flat @ flat.T if flat.shape[0] <= flat.shape[1] else flat.T @ flat
    np.testing.assert_allclose(small, np.eye(small.shape[0]), atol=1e-12)


def test_orthogonal_draws_are_haar_distributed_not_biased_to_a_sign() -> None:
    # R's diagonal fixes the signs: without it, the Q of numpy's (Householder) QR has a diagonal
    # biased to one sign; with it, the mean of Q's diagonal entries over many draws is near zero.
    diagonal = np.array([np.diag(init.orthogonal((6, 6), seed=s)) for s in range(400)])
    assert abs(float(diagonal.mean())) < 0.05


@pytest.mark.parametrize(
    "initializer",
    [init.xavier_uniform, init.xavier_normal, init.kaiming_uniform, init.kaiming_normal, init.orthogonal],
)
def test_initialisers_are_deterministic_by_seed_and_advance_a_generator(
    initializer: init.Initializer,
) -> None:
    a, b = initializer((5, 4), seed=11), initializer((5, 4), seed=11)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, initializer((5, 4), seed=12))
    rng = np.random.default_rng(11)
    first, second = initializer((5, 4), seed=rng), initializer((5, 4), seed=rng)
    np.testing.assert_array_equal(first, a)  # an int seed is a fresh generator of that seed
    assert not np.array_equal(first, second)  # a generator advances


def test_errors_name_the_initialiser_and_the_value() -> None:
    with pytest.raises(ValueError, match=r"orthogonal: needs a shape of 2 dimensions or more, got \(3,\)"):
        init.orthogonal((3,))
    with pytest.raises(ValueError, match="kaiming_normal: mode must be 'fan_in' or 'fan_out', got 'fan'"):
        init.kaiming_normal((3, 4), mode="fan")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="calculate_gain: unknown nonlinearity 'swish'"):
        init.calculate_gain("swish")  # type: ignore[arg-type]


def test_builders_draw_their_matrices_with_init_and_keep_their_biases() -> None:
    xavier = functools.partial(init.xavier_uniform, gain=1.5)
    linear = nn.Linear.new(4, 3, seed=5, init=xavier)
    np.testing.assert_array_equal(linear.w.data, xavier((4, 3), seed=5))
    assert linear.b is not None and not np.any(linear.b.data)

    cell = nn.LSTMCell.new(3, 2, seed=1, init=init.orthogonal, dtype=np.float32)
    rng = np.random.default_rng(1)
    for gate in (cell.i, cell.f, cell.o, cell.u):
        np.testing.assert_array_equal(gate.w.data, init.orthogonal((5, 2), seed=rng, dtype=np.float32))
    assert cell.f.b is not None and np.all(cell.f.b.data == 1.0)  # the forget gate's bias stays 1

    gru = nn.GRUCell.new(3, 2, seed=2, init=init.kaiming_normal)
    rng = np.random.default_rng(2)
    for gate, shape in ((gru.r, (5, 2)), (gru.z, (5, 2)), (gru.n_x, (3, 2)), (gru.n_h, (2, 2))):
        np.testing.assert_array_equal(gate.w.data, init.kaiming_normal(shape, seed=rng))

    table = nn.Embedding.new(10, 4, seed=3, init=init.xavier_normal)
    np.testing.assert_array_equal(table.table.data, init.xavier_normal((10, 4), seed=3))

    tree = nn.TreeLSTMCell.new(3, 2, seed=4, init=init.xavier_uniform)
    rng = np.random.default_rng(4)
    np.testing.assert_array_equal(tree.leaf_c.w.data, init.xavier_uniform((3, 2), seed=rng))
    np.testing.assert_array_equal(tree.leaf_o.w.data, init.xavier_uniform((3, 2), seed=rng))

    mlp = nn.MLP.new([3, 5, 2], seed=6, init=init.kaiming_uniform)
    rng = np.random.default_rng(6)
    np.testing.assert_array_equal(mlp.layers[0].w.data, init.kaiming_uniform((3, 5), seed=rng))


def test_builders_without_init_draw_as_before() -> None:
    # The default stays LeCun's normal draw (in the default float32), so a seed draws as before.
    linear = nn.Linear.new(4, 3, seed=5)
    expected = (np.random.default_rng(5).standard_normal((4, 3)) * 4**-0.5).astype(np.float32)
    np.testing.assert_array_equal(linear.w.data, expected)


def test_builders_reject_std_with_init() -> None:
    with pytest.raises(ValueError, match=r"Linear\.new: give std or init, not both"):
        nn.Linear.new(4, 3, std=0.1, init=init.xavier_uniform)
    with pytest.raises(ValueError, match=r"Embedding\.new: give std or init, not both"):
        nn.Embedding.new(4, 3, std=0.1, init=init.xavier_uniform)
