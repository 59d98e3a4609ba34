"""Batch norm: the ``batch_norm`` op's vjp, and ``nn.BatchNorm1d``/``BatchNorm2d``, whose running
statistics are buffers that a training step updates in its commit, all or nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from returns.pipeline import is_successful

import monadl as ml
from monadl.nn import BatchNorm1d, BatchNorm2d

RNG = np.random.default_rng(3)


def probe_loss(y: ml.ArrayLayer, probe: Any) -> ml.FloatLayer:
    return ml.sum(y * probe)


@pytest.mark.parametrize("shape", [(5, 3), (4, 3, 2), (2, 3, 2, 3)], ids=str)
def test_the_op_matches_finite_differences(shape: tuple[int, ...]) -> None:
    probe = RNG.normal(size=shape)
    x, gamma, beta = RNG.normal(size=shape), RNG.uniform(0.5, 1.5, 3), RNG.normal(size=3)
    ml.check_gradients(lambda x, g, b: probe_loss(ml.batch_norm(x, g, b), probe), x, gamma, beta)


def test_the_op_normalises_by_the_batch_statistics_over_every_axis_but_1() -> None:
    x = RNG.normal(size=(4, 3, 5, 2))
    mean, var = x.mean(axis=(0, 2, 3), keepdims=True), x.var(axis=(0, 2, 3), keepdims=True)
    gamma, beta = np.array([1.0, 2.0, 0.5]), np.array([0.0, -1.0, 3.0])
    want = (x - mean) / np.sqrt(var + 1e-3) * gamma[:, None, None] + beta[:, None, None]
    got = ml.batch_norm(x, gamma, beta, eps=1e-3).predict_blocking().unwrap()
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_shapes_that_do_not_fit_are_shape_errors_naming_the_layer() -> None:
    norm = BatchNorm2d.new(3)
    failure = norm(np.ones((2, 3, 4))).predict_blocking().failure()
    assert isinstance(failure, ml.ShapeError)
    assert "BatchNorm2d(3, momentum=0.1, eps=1e-05): expected an input of 4 dimensions" in str(failure)
    failure = BatchNorm1d.new(3)(np.ones((2, 4))).predict_blocking().failure()
    assert "gamma must have shape (4,) for input (2, 4), got (3,)" in str(failure)


torch = pytest.importorskip("torch")


def torch_pair(channels: int, two_d: bool) -> tuple[Any, Any]:
    mine = (BatchNorm2d if two_d else BatchNorm1d).new(channels, momentum=0.2, dtype=np.float64)
    theirs = (torch.nn.BatchNorm2d if two_d else torch.nn.BatchNorm1d)(channels, momentum=0.2).double()
    with torch.no_grad():
        theirs.weight.copy_(torch.tensor(RNG.uniform(0.5, 1.5, channels)))
        theirs.bias.copy_(torch.tensor(RNG.normal(size=channels)))
    mine.weight.data = theirs.weight.detach().numpy().copy()
    mine.bias.data = theirs.bias.detach().numpy().copy()
    return mine, theirs


@pytest.mark.parametrize("shape", [(6, 3), (4, 3, 5), (2, 3, 4, 4)], ids=str)
def test_steps_update_the_running_statistics_as_pytorch_and_predictions_use_them(
    shape: tuple[int, ...],
) -> None:
    mine, theirs = torch_pair(3, len(shape) == 4)
    sgd = torch.optim.SGD(theirs.parameters(), lr=0.1)
    for step in range(3):
        x, probe = RNG.normal(size=shape) + step, RNG.normal(size=shape)
        assert is_successful(probe_loss(mine(x), probe).train_blocking(ml.SGD(0.1)))
        theirs.train()
        sgd.zero_grad()
        (theirs(torch.tensor(x)) * torch.tensor(probe)).sum().backward()
        sgd.step()
        for buffer, theirs_buffer in (
            (mine.running_mean, theirs.running_mean),
            (mine.running_var, theirs.running_var),
        ):
            np.testing.assert_allclose(buffer.data, theirs_buffer.numpy(), rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(mine.weight.data, theirs.weight.detach().numpy(), rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(mine.bias.data, theirs.bias.detach().numpy(), rtol=1e-12, atol=1e-14)
    assert not np.array_equal(mine.running_mean.data, np.zeros(3))
    x = RNG.normal(size=shape)
    theirs.eval()
    np.testing.assert_allclose(
        mine(x).predict_blocking().unwrap(), theirs(torch.tensor(x)).detach().numpy(), rtol=1e-12, atol=1e-12
    )


def test_a_layer_used_twice_in_a_step_updates_as_two_pytorch_calls() -> None:
    mine, theirs = torch_pair(2, False)
    a, b = RNG.normal(size=(5, 2)), RNG.normal(size=(3, 2)) * 2 + 1
    assert is_successful((ml.sum(mine(a)) + ml.sum(mine(b) * b)).train_blocking(ml.SGD(0.1)))
    theirs(torch.tensor(a))
    theirs(torch.tensor(b))
    np.testing.assert_allclose(mine.running_mean.data, theirs.running_mean.numpy(), rtol=1e-12)
    np.testing.assert_allclose(mine.running_var.data, theirs.running_var.numpy(), rtol=1e-12)


def state(norm: Any) -> list[Any]:
    return [norm.running_mean.data, norm.running_var.data, norm.weight.data, norm.bias.data]


def test_a_failed_step_leaves_the_running_statistics_as_they_were() -> None:
    norm = BatchNorm1d.new(3, dtype=np.float64)
    x = RNG.normal(size=(4, 3))
    assert is_successful(ml.sum(norm(x)).train_blocking(ml.SGD(0.1)))
    before = state(norm)
    for bad in (
        ml.sum(norm(x)) * np.inf,  # a non-finite loss
        ml.sum(norm(x) * np.array([1.0, np.nan, 1.0])) * 0.0 + 1.0,  # a non-finite gradient
    ):
        result = bad.train_blocking(ml.SGD(0.1))
        assert not is_successful(result)
        assert isinstance(result.failure(), (ml.NonFiniteLossError, ml.NonFiniteGradientError))
        for have, had in zip(state(norm), before, strict=True):
            assert have is had
    ml.compute_gradients(ml.sum(norm(x)))  # training mode, nothing committed
    assert all(have is had for have, had in zip(state(norm), before, strict=True))


def test_a_step_whose_running_statistics_would_not_be_finite_fails_and_changes_nothing() -> None:
    norm = BatchNorm1d.new(3)  # float32: a variance of inputs of 1e20 overflows
    before = state(norm)
    x = np.full((4, 3), 1e20, dtype=np.float32) * np.array([1.0, -1.0, 1.0, -1.0], dtype=np.float32)[:, None]
    result = ml.sum(norm(x) * 0.0).train_blocking(ml.SGD(0.1))
    assert isinstance(result.failure(), ml.NonFiniteBufferError)
    assert "ArrayBuffer" in str(result.failure()) and "not finite" in str(result.failure())
    assert all(have is had for have, had in zip(state(norm), before, strict=True))
    ok = ml.sum(norm(np.ones((4, 3), dtype=np.float32))).train_blocking(ml.SGD(0.1))
    assert is_successful(ok)


def test_an_empty_batch_leaves_the_running_statistics_and_a_batch_of_one_is_refused_as_pytorch() -> None:
    norm = BatchNorm1d.new(3, dtype=np.float64)
    before = state(norm)
    empty = ml.sum(norm(np.zeros((0, 3)))).train_blocking(ml.SGD(0.1))
    assert is_successful(empty)
    for have, had in zip(state(norm)[:2], before[:2], strict=True):
        np.testing.assert_array_equal(have, had)
    one = ml.sum(norm(np.ones((1, 3)))).train_blocking(ml.SGD(0.1))
    assert isinstance(one.failure(), ValueError)
    assert "more than 1 value per channel" in str(one.failure())
    prediction = norm(np.ones((1, 3))).predict_blocking()  # evaluation: the running statistics
    assert is_successful(prediction)


def test_predictions_read_the_running_statistics_and_stage_nothing() -> None:
    norm = BatchNorm1d.new(2, eps=1e-3, dtype=np.float64)
    norm.running_mean.data = np.array([1.0, -1.0])
    norm.running_var.data = np.array([4.0, 0.25])
    x = RNG.normal(size=(3, 2))
    got = norm(x).predict_blocking().unwrap()
    np.testing.assert_allclose(got, (x - [1.0, -1.0]) / np.sqrt(np.array([4.0, 0.25]) + 1e-3), rtol=1e-12)
    np.testing.assert_array_equal(norm.running_mean.data, [1.0, -1.0])


def test_calls_never_merge_so_batching_gives_what_it_does_off() -> None:
    def run(batching: bool) -> tuple[Any, ...]:
        norm = BatchNorm1d.new(3, dtype=np.float64)
        xs = [np.random.default_rng(k).normal(size=(4, 3)) for k in range(3)]
        loss = ml.add_n([ml.sum(norm(x) * x) for x in xs])
        executor = ml.Executor(batching=batching)
        value, grads = ml.compute_gradients(loss, executor=executor)
        assert is_successful(loss.train_blocking(ml.SGD(0.1), executor=executor))
        return value, grads[norm.weight], norm.running_mean.data, norm.running_var.data

    on, off = run(True), run(False)
    assert on[0] == off[0]
    for a, b in zip(on[1:], off[1:], strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_checkpoint_saves_and_loads_the_running_statistics(tmp_path: Path) -> None:
    norm = BatchNorm2d.new(2)
    ml.sum(norm(RNG.normal(size=(2, 2, 3, 3)))).train_blocking(ml.Adam(0.1))
    ml.save(tmp_path / "bn.safetensors", norm)
    back = BatchNorm2d.new(2)
    ml.load(tmp_path / "bn.safetensors", back)
    for have, saved in zip(state(back), state(norm), strict=True):
        np.testing.assert_array_equal(have, saved)
    assert set(back.buffers()) == {"running_mean", "running_var"} and set(back.weights()) == {
        "weight",
        "bias",
    }
