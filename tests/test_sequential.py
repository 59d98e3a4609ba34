"""``nn.Sequential``, ``nn.Flatten`` and ``ml.flatten``: a container equal to PyTorch's
``nn.Sequential`` with the weights copied, its layers found by position, a model applied to one
example at a time merged equal to the calls alone and to one call on the batch, and ``flatten`` as
``torch.flatten`` (its calls merged, each flattened as its own rank says)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from batching_check import assert_close, gradients_of, merged_and_alone
from op_cases import predict

import monadl as ml
from monadl import ArrayWeight, FloatLayer, ShapeError, interop, nn


def uniform(seed: int, *shape: int) -> Any:
    return np.random.default_rng(seed).uniform(-1.0, 1.0, shape)


def cnn(seed: int = 0) -> nn.Sequential[ml.AnyArray]:
    """A small CNN of every kind of layer a Sequential holds: modules, a function, a lambda."""
    return nn.Sequential(
        nn.Conv2d.new(2, 4, 3, padding=1, seed=seed, dtype=np.float64),
        nn.GroupNorm.new(2, 4, axis=-3, dtype=np.float64),
        ml.relu,
        nn.AdaptiveAvgPool2d((2, 3)),
        nn.Flatten(-3),
        nn.Linear.new(24, 5, seed=seed + 1, dtype=np.float64),
        lambda h: ml.tanh(h) * 2.0,
    )


def test_layers_apply_in_order_and_are_found_by_position() -> None:
    model = cnn()
    x = uniform(1, 3, 2, 5, 6)
    h = x
    for layer in model:
        h = layer(h)
    np.testing.assert_array_equal(predict(model(x)), predict(h))
    assert len(model) == 7 and isinstance(model[0], nn.Conv2d) and model[2] is ml.relu
    assert model[-2:] == model.layers[-2:]
    assert list(model.weights()) == [
        "layers.0.w",
        "layers.0.b",
        "layers.1.weight",
        "layers.1.bias",
        "layers.5.w",
        "layers.5.b",
    ]
    nested = nn.Sequential(model, nn.Linear.new(5, 2, seed=3, dtype=np.float64))
    assert next(iter(nested.weights())) == "layers.0.layers.0.w"
    assert predict(nested(x)).shape == (3, 2)


def test_a_sequential_is_pytorchs() -> None:
    """PyTorch's ``nn.Sequential`` of the same layers, its weights loaded into the monadl one by
    PyTorch's names (``0.weight``, ``5.weight``): the same outputs."""
    torch = pytest.importorskip("torch")
    model = nn.Sequential(
        nn.Conv2d.new(2, 4, 3, padding=1, dtype=np.float64),
        nn.GroupNorm.new(2, 4, dtype=np.float64),
        ml.relu,
        nn.AdaptiveAvgPool2d((2, 3)),
        nn.Flatten(),
        nn.Linear.new(24, 5, dtype=np.float64),
    )
    theirs = torch.nn.Sequential(
        torch.nn.Conv2d(2, 4, 3, padding=1),
        torch.nn.GroupNorm(2, 4),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d((2, 3)),
        torch.nn.Flatten(),
        torch.nn.Linear(24, 5),
    ).double()
    with torch.no_grad():
        for k, p in enumerate(theirs.parameters()):
            p.add_(torch.from_numpy(uniform(10 + k, *p.shape)))
    assert interop.load_state_dict(model, theirs.state_dict()) == interop.LoadResult([], [])
    x = uniform(2, 3, 2, 5, 6)
    with torch.no_grad():
        expected = theirs(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(predict(model(x)), expected, rtol=1e-12, atol=1e-12)


def test_single_examples_merge_and_equal_the_batch() -> None:
    """The CNN applied to examples of (C, H, W) one by one (its Flatten and GroupNorm counting
    axes from the end): every op's calls merged, the loss and gradients those of the calls alone,
    and each example's output its row of the batch's."""
    xs = [uniform(20 + k, 2, 5, 6) for k in range(3)]

    def loss() -> FloatLayer:
        model = cnn(4)
        return ml.add_n([ml.sum(model(ArrayWeight(x)) * uniform(30 + k, 5)) for k, x in enumerate(xs)])

    merged, alone = merged_and_alone(loss)
    for op in ("conv", "group_norm", "adaptive_avg_pool2d", "flatten", "linear"):
        assert merged.stats.kinds[op] == 1 and alone.stats.kinds[op] == 3, (op, merged.stats.kinds)
    model = cnn(4)
    batch = predict(model(np.stack(xs)))
    for k, x in enumerate(xs):
        np.testing.assert_allclose(predict(model(x)), batch[k], rtol=1e-12, atol=1e-12)


_CNN = cnn(6)


@ml.batchable
def _classify(x: ml.ArrayLayer) -> ml.ArrayLayer:
    return _CNN(x)


@ml.batchable
def _flatten_from_the_front(x: ml.ArrayLayer) -> ml.ArrayLayer:
    return ml.flatten(ml.tanh(x), 0, 1)


@ml.batchable
def _group_norm_from_the_front(x: ml.ArrayLayer) -> ml.ArrayLayer:
    return ml.sum(ml.group_norm(x, 2, axis=0), axis=-1)


def test_a_batchable_body_of_the_model_runs_once_on_the_stacked_examples() -> None:
    """A ``@batchable`` body runs once on its calls' stacked rows: the CNN, whose Flatten and
    GroupNorm count axes from the end, gives what its calls give alone."""
    xs = [uniform(70 + k, 2, 5, 6) for k in range(4)]

    def loss() -> FloatLayer:
        return ml.add_n([ml.sum(_classify(ml.lift_array(x)) * uniform(80 + k, 5)) for k, x in enumerate(xs)])

    merged, alone = merged_and_alone(loss)
    assert merged.stats.kinds["conv"] == 1 and alone.stats.kinds["conv"] == 4


@pytest.mark.parametrize(
    ("body", "op"),
    [(_flatten_from_the_front, "flatten(axis=(0, 1))"), (_group_norm_from_the_front, "group_norm(axis=0)")],
)
def test_a_batchable_body_that_counts_axes_from_the_front_is_refused_naming_the_op(
    body: Any, op: str
) -> None:
    """Run once on the stacked rows, ``flatten(x, 0, 1)`` would join the rows and ``group_norm`` of
    channel axis 0 would normalise across them, each giving results of the rows' shape: the group
    is refused, naming the op."""
    shape = (1, 4) if body is _flatten_from_the_front else (4, 3)
    loss = ml.add_n(
        [ml.sum(body(ml.lift_array(uniform(90 + k, *shape))) * uniform(95 + k, 4)) for k in range(4)]
    )
    failure = loss.predict_blocking(executor=ml.Executor()).failure()
    assert isinstance(failure, ShapeError) and f"its body's {op} mixes them" in str(failure), failure
    ml.predict_blocking(loss, executor=ml.Executor(batching=False)).unwrap()  # each call alone: fine


def test_a_sequential_trains() -> None:
    model = nn.Sequential(nn.Linear.new(3, 8, seed=1), ml.tanh, nn.Linear.new(8, 2, seed=2))
    rng = np.random.default_rng(5)
    x = rng.normal(size=(32, 3)).astype(np.float32)
    labels = (x[:, 0] > 0).astype(np.int64)
    losses = [
        ml.train_blocking(ml.cross_entropy(model(x), labels), ml.Adam(0.05)).unwrap() for _ in range(60)
    ]
    assert losses[-1] < 0.5 * losses[0]


def test_a_layer_that_is_not_callable_is_refused() -> None:
    with pytest.raises(TypeError, match="Sequential: layer 1 is a int, not a callable layer"):
        nn.Sequential(ml.relu, 3)  # type: ignore[call-overload]


# ------------------------------------------------------------------------------------------ flatten


@pytest.mark.parametrize(
    ("shape", "dims"),
    [
        ((2, 3, 4, 5), ()),
        ((2, 3, 4, 5), (1,)),
        ((2, 3, 4, 5), (1, 2)),
        ((2, 3, 4, 5), (-3, -2)),
        ((), ()),
        ((4,), (0, 0)),
    ],
)
def test_flatten_is_torchs(shape: tuple[int, ...], dims: tuple[int, ...]) -> None:
    torch = pytest.importorskip("torch")
    x = uniform(40, *shape)
    expected = torch.flatten(torch.from_numpy(x), *dims).numpy()
    out = ml.flatten(x, *dims)
    assert out.shape == expected.shape
    np.testing.assert_array_equal(predict(out), expected)
    module = nn.Flatten(*dims) if dims else nn.Flatten()
    if len(shape) > 1:
        module_expected = (torch.nn.Flatten(*dims) if dims else torch.nn.Flatten())(
            torch.from_numpy(x)
        ).numpy()
        np.testing.assert_array_equal(predict(module(x)), module_expected)


def test_flatten_calls_merge_each_flattened_as_its_rank_says() -> None:
    """Calls of one start and end on inputs of one shape merge; an axis counted from the start
    counts past the rows' axis, so each call's result is its own flatten."""
    for dims, shape in (((0, 1), (6, 4)), ((1, -1), (2, 12)), ((-2, -1), (2, 12))):
        xs = [ArrayWeight(uniform(50 + k, 2, 3, 4)) for k in range(3)]
        loss = ml.add_n(
            [ml.sum(ml.flatten(x * 2.0, *dims) * uniform(60 + k, *shape)) for k, x in enumerate(xs)]
        )
        on, off = gradients_of(loss, True), gradients_of(loss, False)
        assert on.stats.kinds["flatten"] == 1 and off.stats.kinds["flatten"] == 3
        assert_close(on.value, off.value, "loss")
        for x in xs:
            assert_close(on.gradients[x], off.gradients[x], repr(x))
        alone = [predict(ml.flatten(x, *dims)) for x in xs]
        for x, value in zip(xs, alone, strict=True):
            np.testing.assert_array_equal(value, np.reshape(x.data, shape))


def test_flatten_errors_name_the_op() -> None:
    with pytest.raises(
        ShapeError, match=r"flatten: start_dim 2 and end_dim 1 are not axes of an array of shape"
    ):
        predict(ml.flatten(uniform(1, 2, 3, 4), 2, 1))
    with pytest.raises(ShapeError, match=r"flatten: start_dim 0 and end_dim 3 .* shape \(2, 3\)"):
        predict(ml.flatten(uniform(1, 2, 3), 0, 3))
    with pytest.raises(TypeError, match="flatten: start_dim must be an int"):
        ml.flatten(uniform(1, 2, 3), 1.0)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="flatten: expected an array"):
        ml.flatten(2.0)  # type: ignore[arg-type]
