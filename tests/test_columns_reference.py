"""The reference implementations of the CIFAR-100 column model (``monadl.bench.columns_*``).

They are what monadl's own column model is benchmarked and checked against, so they are checked
here on their own, without monadl's layers:

* the parameters and batches are the spec's (names, shapes, He init drawn in sorted key order);
* NumPy's gradients equal finite differences of a literal transcription of the spec's loss;
* skip and noskip compute the same loss and the same gradients of the shared weights, and noskip's
  other fine classifiers get exactly-zero gradients (and so keep their values under SGD);
* NumPy's training lowers the loss of a learnable toy problem;
* PyTorch's loss, gradients and SGD steps equal NumPy's in float64 (skipped where torch is absent).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

from monadl.bench.columns_numpy import NumpyColumns, Variant
from monadl.bench.columns_params import (
    FINE_CLASSES,
    FINE_PER_COARSE,
    INPUT,
    init_params,
    is_weight,
    param_shapes,
    random_batch,
)
from monadl.bench.columns_torch import TorchColumns
from monadl.bench.common import torch_available

VARIANTS: tuple[Variant, ...] = ("skip", "noskip")
HAS_TORCH = torch_available()
needs_torch = pytest.mark.skipif(not HAS_TORCH, reason="PyTorch is not installed (it is optional)")


@pytest.fixture(autouse=True)
def _one_blas_thread() -> Iterator[None]:
    """One BLAS thread: these problems are tiny, and threads only cost time (much of it on a busy box)."""
    with threadpool_limits(1):
        yield


def _params(
    n_columns: int, hidden: int, seed: int, dtype: type[np.floating] = np.float64
) -> dict[str, np.ndarray]:
    """``init_params`` with random (not zero) biases, so that no ReLU sits exactly at its kink."""
    params = init_params(n_columns, hidden=hidden, seed=seed, dtype=dtype)
    rng = np.random.default_rng(seed + 1000)
    for name, p in params.items():
        if not is_weight(name):
            params[name] = rng.normal(0.0, 0.1, size=p.shape).astype(dtype)
    return params


def _shared(names: list[str] | dict[str, np.ndarray], c: int) -> list[str]:
    """The parameters that get gradients in skip: columns, coarse, and fine classifier ``c``."""
    return [n for n in names if not n.startswith("fine") or n.startswith(f"fine{c}.")]


def _spec_loss(
    p: dict[str, np.ndarray], x: np.ndarray, c: int, fine_local: np.ndarray, variant: Variant
) -> float:
    """The spec's loss, transcribed literally (onehot, log_softmax, the 0.0 weights), in float64."""

    def relu(a: np.ndarray) -> np.ndarray:
        out: np.ndarray = np.maximum(a, 0.0)
        return out

    def ce(logits: np.ndarray, labels: np.ndarray, k: int) -> float:
        shifted = logits - logits.max(axis=1, keepdims=True)
        log_softmax = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
        return float(-np.sum(np.eye(k)[labels] * log_softmax) / (len(labels) * k))

    n_columns = sum(1 for name in p if name.endswith(".w1") and name.startswith("column"))
    h = sum(
        relu(relu(x @ p[f"column{i}.w1"] + p[f"column{i}.b1"]) @ p[f"column{i}.w2"] + p[f"column{i}.b2"])
        for i in range(n_columns)
    )
    assert isinstance(h, np.ndarray)
    loss = ce(h @ p["coarse.w"] + p["coarse.b"], np.full(len(x), c), 20)
    fine = range(FINE_CLASSES) if variant == "noskip" else [c]
    loss += ce(_fine_logits(p, h, c), fine_local, FINE_PER_COARSE)
    for j in fine:
        if j != c:
            loss += 0.0 * ce(_fine_logits(p, h, j), fine_local, FINE_PER_COARSE)
    return loss


def _fine_logits(p: dict[str, np.ndarray], h: np.ndarray, j: int) -> np.ndarray:
    a = np.maximum(h @ p[f"fine{j}.w1"] + p[f"fine{j}.b1"], 0.0)
    a = np.maximum(a @ p[f"fine{j}.w2"] + p[f"fine{j}.b2"], 0.0)
    out: np.ndarray = a @ p[f"fine{j}.w3"] + p[f"fine{j}.b3"]
    return out


# --------------------------------------------------------------------------------- params, batches


def test_init_params_follows_the_spec() -> None:
    h = 8
    params = init_params(2, hidden=h, seed=3, dtype=np.float32)
    assert list(params) == list(param_shapes(2, h))
    assert len(params) == 2 * 4 + 2 + FINE_CLASSES * 6
    assert params["column1.w1"].shape == (INPUT, h) and params["coarse.w"].shape == (h, 20)
    assert params["fine19.w3"].shape == (h, FINE_PER_COARSE) and params["fine19.b3"].shape == (5,)
    assert all(p.dtype == np.float32 for p in params.values())
    assert all(not p.any() for n, p in params.items() if not is_weight(n))
    # the draw: He normal, one weight after the other in sorted key order, biases drawing nothing
    rng = np.random.default_rng(3)
    for name in sorted(params):
        if is_weight(name):
            shape = params[name].shape
            want = rng.normal(0.0, np.sqrt(2.0 / shape[0]), size=shape).astype(np.float32)
            np.testing.assert_array_equal(params[name], want, err_msg=name)
    w1 = init_params(1, seed=0, dtype=np.float64)["column0.w1"]
    assert abs(w1.std() / np.sqrt(2.0 / INPUT) - 1.0) < 0.02 and abs(w1.mean()) < 1e-3
    for name, p in init_params(2, hidden=h, seed=3, dtype=np.float32).items():
        np.testing.assert_array_equal(p, params[name])


def test_random_batch() -> None:
    x, c, fine_local = random_batch(16, seed=1, dtype=np.float32)
    assert x.shape == (16, INPUT) and x.dtype == np.float32
    assert x.min() >= 0.0 and x.max() < 1.0 and np.all(x * 256 == np.round(x * 256))
    assert isinstance(c, int) and 0 <= c < 20
    assert fine_local.shape == (16,) and fine_local.min() >= 0 and fine_local.max() < FINE_PER_COARSE
    x2, c2, f2 = random_batch(16, seed=1, dtype=np.float32)
    assert np.array_equal(x, x2) and c == c2 and np.array_equal(fine_local, f2)


def test_bad_input_is_refused() -> None:
    model = NumpyColumns(init_params(1, hidden=4), "skip")
    x, c, fine_local = random_batch(4, seed=0)
    with pytest.raises(ValueError, match="coarse label"):
        model.step(x, 20, fine_local)
    with pytest.raises(ValueError, match="fine_local"):
        model.step(x, c, fine_local + 5)
    with pytest.raises(ValueError, match="shape"):
        model.step(x[:, :100], c, fine_local)
    with pytest.raises(ValueError, match="variant"):
        NumpyColumns(init_params(1, hidden=4), "sometimes")  # type: ignore[arg-type]
    params = init_params(1, hidden=4)
    del params["fine3.b2"]
    with pytest.raises(ValueError, match=r"fine3\.b2"):
        NumpyColumns(params, "noskip")


# ----------------------------------------------------------------------------------- NumPy's math


@pytest.mark.parametrize(("n_columns", "variant"), [(1, "skip"), (2, "skip"), (2, "noskip")])
def test_numpy_gradients_equal_finite_differences(n_columns: int, variant: Variant) -> None:
    """Three random entries of every gradient against 4th-order central differences of ``_spec_loss``.

    With ``h = 1e-5`` in float64 the truncation error (``~h**4``) is negligible and the rounding error
    about ``ulp(loss) / h ~ 1e-11``; errors are relative to ``max(|fd|, |grad|, 1e-4)``, the floor
    keeping that rounding from failing entries whose gradient is (nearly) zero. A wrong gradient is off
    by O(itself). Measured worst case over 24 such configurations: 6e-8.
    """
    params = _params(n_columns, hidden=4, seed=n_columns)
    x, c, fine_local = random_batch(6, seed=n_columns, dtype=np.float64)
    model = NumpyColumns(params, variant)
    loss, grads = model.gradients(x, c, fine_local)
    assert loss == pytest.approx(_spec_loss(params, x, c, fine_local, variant), rel=1e-12)
    assert model.loss(x, c, fine_local) == loss
    want_names = list(params) if variant == "noskip" else _shared(params, c)
    assert list(grads) == want_names

    h = 1e-5
    rng = np.random.default_rng(7)
    worst = 0.0
    for name, grad in grads.items():
        for _ in range(3):
            idx = tuple(int(rng.integers(0, n)) for n in grad.shape)

            def f(delta: float, name: str = name, idx: tuple[int, ...] = idx) -> float:
                moved = dict(params)
                moved[name] = params[name].copy()
                moved[name][idx] += delta
                return _spec_loss(moved, x, c, fine_local, variant)

            fd = (-f(2 * h) + 8 * f(h) - 8 * f(-h) + f(-2 * h)) / (12 * h)
            an = float(grad[idx])
            err = abs(fd - an) / max(abs(fd), abs(an), 1e-4)
            assert err < 1e-6, f"{name}{list(idx)}: finite difference {fd!r}, gradient {an!r}"
            worst = max(worst, err)
    assert worst > 0.0  # the comparison really ran on nonzero gradients


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_skip_and_noskip_agree(dtype: type[np.floating]) -> None:
    params = _params(2, hidden=8, seed=5, dtype=dtype)
    skip, noskip = NumpyColumns(params, "skip"), NumpyColumns(params, "noskip")
    for seed in range(3):
        x, c, fine_local = random_batch(8, seed=seed, dtype=dtype)
        loss_s, grads_s = skip.gradients(x, c, fine_local)
        loss_n, grads_n = noskip.gradients(x, c, fine_local)
        assert loss_s == loss_n
        assert list(grads_s) == _shared(params, c) and list(grads_n) == list(params)
        for name, g in grads_s.items():
            assert np.any(g), name
            np.testing.assert_array_equal(grads_n[name], g, err_msg=name)
        others = [n for n in params if n not in grads_s]
        assert len(others) == (FINE_CLASSES - 1) * 6
        for name in others:
            assert grads_n[name].dtype == dtype and np.all(grads_n[name] == 0.0), name

    # SGD: the same trajectory of the shared weights; noskip's other fine classifiers keep their values
    seen: set[int] = set()
    for seed in range(4):
        x, c, fine_local = random_batch(8, seed=10 + seed, dtype=dtype)
        seen.add(c)
        assert skip.step(x, c, fine_local) == noskip.step(x, c, fine_local)
    for name, p in params.items():
        np.testing.assert_array_equal(noskip.params[name], skip.params[name], err_msg=name)
        trained = not name.startswith("fine") or int(name[4:].split(".")[0]) in seen
        assert np.array_equal(skip.params[name], p) != trained, name


@pytest.mark.parametrize("variant", VARIANTS)
def test_numpy_step_is_sgd(variant: Variant) -> None:
    params = _params(1, hidden=8, seed=2)
    model = NumpyColumns(params, variant, learning_rate=0.5)
    x, c, fine_local = random_batch(5, seed=4, dtype=np.float64)
    loss, grads = model.gradients(x, c, fine_local)
    assert model.step(x, c, fine_local) == loss
    # (step seeds its backward with the learning rate: lr * grad up to rounding)
    _assert_close_rel(
        {n: p.copy() for n, p in model.params.items() if n in grads},
        {n: p - 0.5 * grads[n] for n, p in params.items() if n in grads},
        rtol=1e-14,
    )
    for name, p in params.items():
        if name not in grads:
            np.testing.assert_array_equal(model.params[name], p, err_msg=name)
    # another batch size gets its own buffers; the first one's still work
    x3, c3, f3 = random_batch(3, seed=5, dtype=np.float64)
    assert model.loss(x3, c3, f3) == pytest.approx(_spec_loss(model.params, x3, c3, f3, variant), rel=1e-12)
    assert model.loss(x, c, fine_local) == pytest.approx(
        _spec_loss(model.params, x, c, fine_local, variant), rel=1e-12
    )


def test_numpy_training_lowers_the_loss() -> None:
    """300 SGD steps on a fixed toy problem: 4 coarse x 5 fine classes, each a binary pixel pattern
    plus noise, 32 batches of 16 cycled; the loss must at least halve (it falls from ~0.44 to ~0.12)."""
    rng = np.random.default_rng(0)
    means = (rng.random((4, FINE_PER_COARSE, INPUT)) < 0.5) * 0.9
    data = []
    for _ in range(32):
        c = int(rng.integers(0, 4))
        fine_local = rng.integers(0, FINE_PER_COARSE, size=16)
        x = np.clip(means[c, fine_local] + 0.05 * rng.standard_normal((16, INPUT)), 0.0, 0.99)
        data.append((x, c, fine_local))
    model = NumpyColumns(init_params(1, hidden=16, seed=0, dtype=np.float64), "skip", learning_rate=0.05)
    losses = [model.step(*data[s % len(data)]) for s in range(300)]
    assert all(np.isfinite(losses))
    first, last = float(np.mean(losses[:30])), float(np.mean(losses[-30:]))
    assert last < 0.5 * first, (first, last)


# ------------------------------------------------------------------------------------- PyTorch's


def _assert_close_rel(got: dict[str, np.ndarray], want: dict[str, np.ndarray], rtol: float) -> None:
    """Per array: max |got - want| <= rtol * max |want| (exact zeros must stay exact)."""
    assert list(got) == list(want)
    for name, w in want.items():
        g = got[name]
        assert g.shape == w.shape and g.dtype == w.dtype, name
        scale = float(np.max(np.abs(w)))
        if scale == 0.0:
            assert not g.any(), name
        else:
            assert float(np.max(np.abs(g - w))) <= rtol * scale, name


@needs_torch
@pytest.mark.parametrize("variant", VARIANTS)
def test_torch_equals_numpy(variant: Variant) -> None:
    params = _params(2, hidden=8, seed=4)
    numpy_model = NumpyColumns(params, variant, learning_rate=0.1)
    torch_model = TorchColumns(params, variant, learning_rate=0.1)
    for seed in range(2):
        x, c, fine_local = random_batch(6, seed=seed, dtype=np.float64)
        loss_n, grads_n = numpy_model.gradients(x, c, fine_local)
        loss_t, grads_t = torch_model.gradients(x, c, fine_local)
        assert loss_t == pytest.approx(loss_n, rel=1e-12)
        assert torch_model.loss(x, c, fine_local) == pytest.approx(loss_n, rel=1e-12)
        _assert_close_rel(grads_t, grads_n, rtol=1e-9)
    # a few SGD steps, batches of several coarse classes: the same parameters after
    for seed in range(4):
        x, c, fine_local = random_batch(6, seed=20 + seed, dtype=np.float64)
        assert torch_model.step(x, c, fine_local) == pytest.approx(
            numpy_model.step(x, c, fine_local), rel=1e-12
        )
    _assert_close_rel(torch_model.numpy_params(), {n: p.copy() for n, p in numpy_model.params.items()}, 1e-12)


@needs_torch
def test_torch_float32_step() -> None:
    params = init_params(1, hidden=16, seed=0)
    numpy_model, torch_model = NumpyColumns(params, "noskip"), TorchColumns(params, "noskip")
    x, c, fine_local = random_batch(16, seed=0)
    assert torch_model.step(x, c, fine_local) == pytest.approx(numpy_model.step(x, c, fine_local), rel=1e-5)
    got = torch_model.numpy_params()
    assert all(p.dtype == np.float32 for p in got.values())
    _assert_close_rel(got, {n: p.copy() for n, p in numpy_model.params.items()}, 1e-5)
