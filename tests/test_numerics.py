"""The ops' accuracy: forward values (and sigmoid's vjp) against references computed exactly enough
with :mod:`decimal`, over sweeps of inputs in float64 and float32; and ``pow``'s gradients where a
factor of the formula is 0 and another infinite (against finite differences and PyTorch).

Errors are relative, in units of the dtype's epsilon (``np.finfo(dtype).eps``: 2 ulps of a number
just below a power of two, 1 ulp just above), over the results whose reference is a normal number
of the dtype (below that, relative precision is not there to keep).

Bounds (measured maxima on x86-64 NumPy 2.4 in the comments of each test):

* ``sigmoid``, ``tanh``, ``exp``, ``log``: ``UNARY_BOUND`` = 3 eps.
* ``softmax``, ``log_softmax``, ``cross_entropy``: 3 eps beyond ``cond / 2`` eps, where ``cond`` is
  the result's condition number with respect to ``x - max(x)``: every implementation in working
  precision rounds that difference (to ``|x - max| * eps / 2``), which a probability of e^-300
  turns into 150 eps of relative error. The rest, the op's own error, is bounded by a few ulps.
"""

from __future__ import annotations

import decimal
import math
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from decimal import Decimal
from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray
from op_cases import predict

import monadl
from monadl import ArrayWeight, FloatWeight
from monadl.dsl.ops.activations import LOG_SOFTMAX, SIGMOID, SOFTMAX, TANH, sigmoid_of, sigmoids_of
from monadl.dsl.ops.classification import CROSS_ENTROPY_FUSED
from monadl.dsl.ops.elementwise import EXP, LOG
from monadl.gradcheck import check_gradients, gradients_of
from monadl.typeclasses.backend import NUMPY

DTYPES = [np.float64, np.float32]
UNARY_BOUND = 3.0
"""The bound on a unary op's relative error, in eps."""
SOFTMAX_BOUND = 3.0
"""The bound on the softmax family's relative error beyond ``cond / 2``, in eps."""

Array = NDArray[Any]


@contextmanager
def exact(digits: int) -> Iterator[None]:
    """Decimal arithmetic with ``digits`` significant digits, in this block."""
    with decimal.localcontext() as context:
        context.prec = digits
        context.Emin = -99999
        context.Emax = 99999
        yield


def dec(x: Any) -> Decimal:
    """A float's exact value."""
    return Decimal(float(x))


def flushes_subnormals() -> bool:
    """Whether this process flushes subnormal results to zero: a library built with -ffast-math
    (one a benchmark's peer loads, in an earlier test) sets that for the whole process, and then a
    kernel's intermediate results near the smallest normal number are lost too."""
    tiny = np.finfo(np.float32).tiny
    return bool(np.float32(tiny) / np.float32(4.0) == 0.0)


def relative_error(y: Any, reference: Decimal, dtype: Any) -> float | None:
    """``|y - reference| / |reference|`` in eps of ``dtype``; None where the reference is not a
    normal number of ``dtype`` (0 is: then ``y`` must be 0), or, where the process flushes
    subnormals, within 2**mantissa of the smallest normal one."""
    info = np.finfo(dtype)
    if reference == 0:
        return 0.0 if y == 0 else math.inf
    smallest = dec(info.tiny) * (2**info.nmant if flushes_subnormals() else 1)
    if not smallest <= abs(reference) <= dec(info.max):
        return None
    if not math.isfinite(float(y)):
        return math.inf
    return float(abs(dec(y) - reference) / abs(reference)) / float(info.eps)


def max_error(ys: Array, references: list[Decimal], dtype: Any) -> float:
    """The largest :func:`relative_error` of ``ys`` against ``references``."""
    worst = 0.0
    for y, r in zip(ys.ravel().tolist(), references, strict=True):
        e = relative_error(y, r, dtype)
        if e is not None and not e <= worst:  # (a nan is worse than anything)
            worst = e
    return worst


# ----------------------------------------------------------------------------------- references


def ref_sigmoid(x: float) -> Decimal:
    return 1 / (1 + (-dec(x)).exp())


def ref_tanh(x: float) -> Decimal:
    if abs(x) > 200.0:  # 1 to 170 digits
        return Decimal(1).copy_sign(dec(x))
    e = (2 * dec(x)).exp()
    return (e - 1) / (e + 1)  # e - 1 cancels for tiny x: the 150 digits keep 100 of them at 1e-45


def ref_exp(x: float) -> Decimal:
    return dec(x).exp()


def ref_log(x: float) -> Decimal:
    return dec(x).ln()


def _grid() -> Array:
    """-100..100 in steps of 0.05, magnitudes 1e-30..800 logarithmically, both signs, and the
    edges where exp overflows or sigmoid's result becomes subnormal."""
    steps = np.linspace(-100.0, 100.0, 4001)
    magnitudes = np.logspace(-30.0, math.log10(800.0), 600)
    edges = [0.0, -745.0, -720.0, -709.7, -103.0, -88.7, -87.0, 87.0, 88.7, 709.7]
    return np.unique(np.concatenate([steps, magnitudes, -magnitudes, edges]))


def _positive() -> Array:
    """Positive floats over the whole range, and around 1 (where log is near 0) in steps of ulps."""
    near_one = [1.0 + k * s for k in range(-50, 51) for s in (2.3e-16, 6e-8, 1e-9)]
    return np.unique(np.concatenate([np.logspace(-300.0, 300.0, 1500), near_one]))


UNARY: dict[str, tuple[Any, Callable[[float], Decimal], Callable[[], Array]]] = {
    # name: (primitive, reference, inputs)
    "sigmoid": (SIGMOID, ref_sigmoid, _grid),
    "tanh": (TANH, ref_tanh, _grid),
    "exp": (EXP, ref_exp, lambda: np.linspace(-745.0, 709.0, 6000)),
    "log": (LOG, ref_log, _positive),
}


def _as(xs: Array, dtype: Any) -> Array:
    """``xs`` in ``dtype``, the values that overflow it left out."""
    with np.errstate(over="ignore"):
        x = xs.astype(dtype)
    return np.unique(x[np.isfinite(x)])


# ------------------------------------------------------------------------------------- sigmoid


@pytest.mark.parametrize(
    ("dtype", "x"),
    [(dtype, x) for dtype in DTYPES for x in (-18.0, -30.0, -40.0, -80.0)] + [(np.float64, -700.0)],
)
def test_log_sigmoid_of_a_negative_input_is_finite(dtype: Any, x: float) -> None:
    # 0.5 * (1 + tanh(x / 2)) gave 0 below -38 in float64 (below -17 in float32, and 0.96
    # relative error at -18): log of it was -inf, where PyTorch gives x - log1p(e^x) (= x here).
    # (Below -88.7 in float32, -709.8 in float64, the exact sigmoid is subnormal and is 0, as
    # PyTorch's sigmoid gives it.)
    w = ArrayWeight(np.array([x, 0.5 * x], dtype=dtype))
    value = predict(monadl.log(monadl.sigmoid(w)))
    assert value.dtype == dtype
    expected = [float(-(1 + (-dec(v)).exp()).ln()) for v in (x, 0.5 * x)]
    np.testing.assert_allclose(value, expected, rtol=4 * float(np.finfo(dtype).eps))


def test_log_sigmoid_gradient_of_a_negative_input() -> None:
    # d log(sigmoid(x)) / dx = 1 - sigmoid(x): 1 at -40, where the old forward gave nan
    x = np.array([-40.0, -30.0, 0.0, 30.0, 40.0])

    def loss(w: ArrayWeight) -> monadl.FloatLayer:
        return monadl.sum(monadl.log(monadl.sigmoid(w)))

    (g,) = check_gradients(loss, x)
    np.testing.assert_allclose(g, 1.0 - 1.0 / (1.0 + np.exp(-x)), rtol=1e-12, atol=1e-300)


def test_sigmoid_of_a_float_and_its_extremes() -> None:
    # a FloatLayer's sigmoid is the same rule on Python floats: exp(1000) overflows to inf there,
    # and the result is 0 without an exception (or a warning from arrays: exp's overflow is expected)
    assert predict(monadl.sigmoid(FloatWeight(-1000.0))) == 0.0
    assert predict(monadl.sigmoid(FloatWeight(1000.0))) == 1.0
    assert predict(monadl.sigmoid(FloatWeight(-40.0))) == pytest.approx(
        4.248354255291589e-18, rel=1e-15, abs=0.0
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for dtype in DTYPES:
            out = SIGMOID.forward(NUMPY, np.array([-1e4, -800.0, -100.0, 100.0, 1e4], dtype=dtype))
            assert out.dtype == dtype
            assert out[0] == 0.0 and out[-1] == 1.0 and out[-2] == 1.0


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(), (1,), (16, 50), (2, 3, 4)])
def test_the_numpy_sigmoids_are_the_generic_rule_bit_for_bit(dtype: Any, shape: tuple[int, ...]) -> None:
    """NumPy arrays take an in-place path (the same operations in the same order): every bit and
    the dtype are the rule's as written, the extremes included; two at once give the same."""
    rng = np.random.default_rng(len(shape))
    x = (rng.standard_normal(shape) * 40.0).astype(dtype)
    if x.size:
        x.flat[0] = -1000.0
    with np.errstate(over="ignore"):
        expected = 1.0 / (1.0 + np.exp(-x))
    for got in (sigmoid_of(NUMPY, x), *sigmoids_of(NUMPY, x, x)):
        assert np.asarray(got).dtype == expected.dtype
        np.testing.assert_array_equal(got, expected, strict=True)


@pytest.mark.parametrize("dtype", DTYPES)
def test_sigmoid_vjp_accuracy(dtype: Any) -> None:
    """The vjp ``d * s * (1 - s)``: relative error of a few eps where s <= 1/2 (x <= 0), where
    ``1 - s`` is in [1/2, 1]; for x > 0 ``1 - s`` cancels, to an absolute error of at most an eps
    times ``|d|`` (the rounding of s near 1), as in PyTorch's and JAX's: a gradient that small is
    below the rounding of anything it is added to."""
    x = _as(_grid(), dtype)
    d = np.ones_like(x)
    (rule,) = SIGMOID.vjps
    g = rule(NUMPY, d, SIGMOID.forward(NUMPY, x), x)
    assert g.dtype == dtype
    eps = float(np.finfo(dtype).eps)
    with exact(60):
        references = [ref_sigmoid(v) * (1 - ref_sigmoid(v)) for v in x.tolist()]
        # Measured: 1.3 eps (float64), 1.9 eps (float32), and absolute 0.7 eps at most; with the
        # old forward, 1 (a 0 gradient) from x = -38 (float64), -17 (float32) down, where the
        # exact one is e^x.
        assert (
            max_error(g[x <= 0], [r for r, v in zip(references, x.tolist(), strict=True) if v <= 0], dtype)
            <= UNARY_BOUND
        )
        absolute = max(abs(dec(gi) - r) for gi, r in zip(g.tolist(), references, strict=True))
    assert float(absolute) <= eps


# ------------------------------------------------------------------------------ unary op sweeps


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", list(UNARY))
def test_unary_sweep(name: str, dtype: Any) -> None:
    """Relative error of at most 3 eps over the sweep. Measured (float64, float32): sigmoid 0.94,
    1.53 (before: 4.5e15 and 1.1e8, all digits lost); tanh 0.72, 0.69; exp 0.54, 1.24; log 0.5,
    0.75."""
    prim, reference, inputs = UNARY[name]
    x = _as(inputs(), dtype)
    if name == "log":
        x = x[x > 0]
    with np.errstate(over="ignore"):  # exp's overflow at the top of the float32 range
        y = prim.forward(NUMPY, x)
    assert y.dtype == dtype
    with exact(150):
        references = [reference(v) for v in x.tolist()]
        error = max_error(y, references, dtype)
    assert error <= UNARY_BOUND, f"{name} {np.dtype(dtype).name}: {error:.3g} eps"


# ------------------------------------------------------------------------- softmax and its kin


def _rows(dtype: Any) -> Array:
    """Rows of 3 logits: ``[0, t, -50]`` and ``[t, t, 0]`` for t in -100..100 (a dominant class, ties),
    and random rows of scales 1, 10, 100, and around 1e4."""
    t = np.linspace(-100.0, 100.0, 201)
    rng = np.random.default_rng(0)
    rows = [
        np.stack([np.zeros_like(t), t, np.full_like(t, -50.0)], axis=1),
        np.stack([t, t, np.zeros_like(t)], axis=1),
        *(rng.standard_normal((80, 3)) * scale for scale in (1.0, 10.0, 100.0)),
        rng.standard_normal((80, 3)) + 1e4,
    ]
    return np.concatenate(rows).astype(dtype)


def _reference_rows(x: Array) -> list[tuple[list[Decimal], list[Decimal], list[Decimal]]]:
    """Each row's ``(x - max, log_softmax, softmax)``, exactly enough (400 digits hold a 1 and an
    e^-800 added)."""
    out = []
    for row in x.tolist():
        xs = [dec(v) for v in row]
        m = max(xs)
        shifted = [v - m for v in xs]
        terms = [s.exp() for s in shifted]
        total = sum(terms, Decimal(0))
        lse = total.ln()
        out.append((shifted, [s - lse for s in shifted], [e / total for e in terms]))
    return out


def _excess(y: Any, reference: Decimal, cond: Decimal, dtype: Any) -> float:
    """The relative error of ``y`` (in eps) beyond ``cond / 2``; 0 where it is not measured."""
    e = relative_error(y, reference, dtype)
    return 0.0 if e is None else e - float(cond) / 2


def _softmax_excess(y: Array, x: Array, dtype: Any) -> float:
    """The largest error of softmax results ``y`` beyond their condition (``cond`` of ``p_i`` with
    respect to ``s = x - max``: ``sum_j |d p_i / d s_j| |s_j| / p_i = |s_i| (1 - p_i) + sum_{j != i}
    p_j |s_j|``)."""
    worst = 0.0
    for row, (s, _, p) in zip(y.tolist(), _reference_rows(x), strict=True):
        for i, yi in enumerate(row):
            cond = abs(s[i]) * (1 - p[i]) + sum(
                (p[j] * abs(s[j]) for j in range(len(s)) if j != i), Decimal(0)
            )
            worst = max(worst, _excess(yi, p[i], cond, dtype))
    return worst


def _log_softmax_excess(y: Array, x: Array, dtype: Any) -> float:
    """As :func:`_softmax_excess` for log-probabilities: ``cond = sum_j |delta_ij - p_j| |s_j| / |y_i|``."""
    worst = 0.0
    for row, (s, ly, p) in zip(y.tolist(), _reference_rows(x), strict=True):
        for i, yi in enumerate(row):
            weight = sum((abs((1 if i == j else 0) - p[j]) * abs(s[j]) for j in range(len(s))), Decimal(0))
            cond = weight / abs(ly[i]) if ly[i] else Decimal(0)
            worst = max(worst, _excess(yi, ly[i], cond, dtype))
    return worst


def _namespaces() -> list[Any]:
    """NumPy (the ops' NumPy paths) and, where installed, array-api-strict (their generic paths)."""
    spaces: list[Any] = [pytest.param((NUMPY, np.asarray), id="numpy")]
    try:
        import array_api_strict as strict
    except ImportError:  # pragma: no cover - a dev dependency
        return spaces
    return [*spaces, pytest.param((strict, strict.asarray), id="array-api-strict")]


@pytest.mark.parametrize("space", _namespaces())
@pytest.mark.parametrize("dtype", DTYPES)
def test_softmax_sweep(dtype: Any, space: tuple[Any, Callable[[Any], Any]]) -> None:
    """Measured beyond cond / 2 (float64, float32): 0.86, 0.93 eps; before (exp of log_softmax,
    which rounds the log-probability once more): 31, 4.4 eps."""
    xp, asarray = space
    x = _rows(dtype)
    y = np.asarray(SOFTMAX.forward(xp, asarray(x)))
    assert y.dtype == dtype
    with exact(400):
        excess = _softmax_excess(y, x, dtype)
    assert excess <= SOFTMAX_BOUND, f"{excess:.3g} eps"


@pytest.mark.parametrize("space", _namespaces())
@pytest.mark.parametrize("dtype", DTYPES)
def test_log_softmax_sweep(dtype: Any, space: tuple[Any, Callable[[Any], Any]]) -> None:
    """Measured beyond cond / 2 (float64, float32): 0.61, 1.2 eps; before, a confident class's
    log-probability -log1p(e^-40) came out 0: relative error 1 (4.5e15 and 8.4e6 eps). On rows
    (NumPy's path for a batch of logits) and on columns, in 3 dimensions (its path for any axis)."""
    xp, asarray = space
    x = _rows(dtype)
    y = np.asarray(LOG_SOFTMAX.forward(xp, asarray(x)))
    columns = np.asarray(LOG_SOFTMAX.forward(xp, asarray(np.ascontiguousarray(x.T)[None]), axis=1))
    assert y.dtype == columns.dtype == dtype
    with exact(400):
        excess = _log_softmax_excess(y, x, dtype)
        excess_columns = _log_softmax_excess(columns[0].T, x, dtype)
    assert excess <= SOFTMAX_BOUND, f"{excess:.3g} eps"
    assert excess_columns <= SOFTMAX_BOUND, f"{excess_columns:.3g} eps (columns)"


@pytest.mark.parametrize("targets", ["labels", "probabilities"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_cross_entropy_sweep(dtype: Any, targets: str) -> None:
    """Each row's loss ``-log_softmax(row)[label]`` (a batch of one: the mean of a batch is a sum
    of such), as log_softmax's bound; on the NumPy path of integer labels and the generic one of
    probabilities. A confident right prediction's loss (e^-40) was 0."""
    x = _rows(dtype)
    labels = np.arange(len(x)) % 3
    with exact(400):
        references = _reference_rows(x)
        worst = 0.0
        for k in range(len(x)):
            label = int(labels[k])
            logits = x[k : k + 1]
            if targets == "labels":
                loss, _ = CROSS_ENTROPY_FUSED.forward(NUMPY, logits, labels[k : k + 1], (label, label))
            else:
                loss, _ = CROSS_ENTROPY_FUSED.forward(
                    NUMPY, logits, np.eye(3, dtype=dtype)[label][None], None
                )
            s, ly, p = references[k]
            weight = sum((abs((1 if label == j else 0) - p[j]) * abs(s[j]) for j in range(3)), Decimal(0))
            cond = weight / abs(ly[label]) if ly[label] else Decimal(0)
            worst = max(worst, _excess(np.asarray(loss, dtype=dtype), -ly[label], cond, dtype))
    assert worst <= SOFTMAX_BOUND, f"{worst:.3g} eps"


def test_confident_cross_entropy_is_not_zero() -> None:
    # the loss of a right prediction by a margin of 40 is log1p(e^-40 + e^-50): 4.2e-18, not 0
    w = ArrayWeight(np.array([[0.0, -40.0, -50.0]]))
    loss = predict(monadl.cross_entropy(w, np.array([0])))
    assert loss == pytest.approx(math.log1p(math.exp(-40.0) + math.exp(-50.0)), rel=1e-15, abs=0.0)
    logp = predict(monadl.log_softmax(w))
    assert logp[0, 0] == pytest.approx(-math.log1p(math.exp(-40.0) + math.exp(-50.0)), rel=1e-15, abs=0.0)


# ------------------------------------------------------------------------------------------ pow


def test_pow_zero_exponent_gradient_at_zero() -> None:
    # d(w ** 0) / dw = 0 everywhere, 0 ** 0 = 1 included: the formula 0 * 0 ** -1 was 0 * inf = nan
    x = np.array([0.0, 1.5, -2.0])
    (g,) = check_gradients(lambda w: monadl.sum(w**0.0), x)
    assert np.array_equal(g, np.zeros(3))


def test_pow_gradients_at_a_zero_base() -> None:
    # w ** e with weights w = 0 where e is 1, 2, 3 (finite differences are defined: 0 ** (e +- h)
    # is 0): the base's [1, 0, 0], and e's 0 where 0 * log(0) was nan. (At e == 0 the exponent's
    # is not: 0 ** -h is inf; see test_pow_gradients_match_pytorch_at_zeros.)
    base = np.array([0.0, 0.0, 0.0, 2.0])
    exponent = np.array([1.0, 2.0, 3.0, 1.5])
    gw, ge = (np.asarray(g) for g in check_gradients(lambda w, e: monadl.sum(w**e), base, exponent))
    np.testing.assert_allclose(gw, [1.0, 0.0, 0.0, 1.5 * 2.0**0.5], rtol=1e-12)
    assert np.array_equal(ge[:3], [0.0, 0.0, 0.0])
    np.testing.assert_allclose(ge[3], 2.0**1.5 * math.log(2.0), rtol=1e-12)


def test_pow_constant_base_with_zeros() -> None:
    # c ** e for a constant c with zeros: d/de = c ** e * log(c) = 0 * -inf was nan where c == 0
    c = np.array([0.0, 0.5, 0.0, 3.0])
    g = np.asarray(check_gradients(lambda e: monadl.sum(c**e), np.array([1.0, 2.0, 2.5, 0.5]))[0])
    assert np.all(np.isfinite(g)) and g[0] == 0.0 and g[2] == 0.0
    # a float base of 0 (a FloatLayer's rule on a float and an array)
    (g0,) = check_gradients(lambda e: monadl.sum(0.0**e), np.array([1.0, 2.0]))
    assert np.array_equal(g0, [0.0, 0.0])


def _torch_pow_gradients(base: Array, exponent: Array) -> tuple[Array, Array]:
    torch = pytest.importorskip("torch")
    a = torch.tensor(base, dtype=torch.float64, requires_grad=True)
    b = torch.tensor(exponent, dtype=torch.float64, requires_grad=True)
    (a**b).sum().backward()
    assert a.grad is not None and b.grad is not None
    return a.grad.numpy(), b.grad.numpy()


def test_pow_gradients_match_pytorch_at_zeros() -> None:
    # where finite differences are not defined (0 ** e at e == 0), PyTorch's values: 0 for the
    # base where e == 0, 0 for the exponent where the base is 0 and e >= 0
    base = np.array([0.0, 0.0, 0.0, 0.0, 2.0, -1.5])
    exponent = np.array([0.0, 0.5, 1.0, 2.0, 0.0, 2.0])
    want_base, want_exponent = _torch_pow_gradients(base, exponent)
    _, (gw, ge) = gradients_of(lambda w, e: monadl.sum(w**e), [base, exponent])
    np.testing.assert_array_equal(gw, want_base)
    np.testing.assert_array_equal(ge, want_exponent)
    # a float exponent of 0 and a float base of 0
    want_base, _ = _torch_pow_gradients(base, np.zeros_like(base))
    _, (gw,) = gradients_of(lambda w: monadl.sum(w**0.0), [base])
    np.testing.assert_array_equal(gw, want_base)
    _, want_exponent = _torch_pow_gradients(np.zeros_like(exponent), exponent)
    _, (ge,) = gradients_of(lambda e: monadl.sum(0.0**e), [exponent])
    np.testing.assert_array_equal(ge, want_exponent)


def test_pow_of_floats_at_zero() -> None:
    # the rules on Python floats (FloatWeights): 0.0 ** 0.0's gradients, as arrays' (PyTorch's)
    _, (gw, ge) = gradients_of(lambda w, e: w**e, [0.0, 0.0])
    assert (gw, ge) == (0.0, 0.0)
    _, (gw, ge) = gradients_of(lambda w, e: w**e, [0.0, 2.0])
    assert (gw, ge) == (0.0, 0.0)
