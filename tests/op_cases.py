"""The op cases every backend runs, and the helpers that make ops scalar losses for the checker.

Gradients are checked with the library's own checker, :func:`monadl.check_gradients` (finite
differences, the gradients' types, shapes and dtypes, and reruns bit for bit). :data:`CASES` lists
one or more fixed applications of every op; the backend tests (``test_ops_array_api``,
``test_cupy``) run them with :func:`run_case` on NumPy and on another array namespace and compare,
and ``test_ops_gradients`` checks the NumPy side with the checker.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray
from returns.pipeline import is_successful
from returns.result import Result

import monadl
from monadl import ArrayLayer, ArrayWeight, FloatLayer, FloatWeight
from monadl.dsl.ops.attention import self_attention
from monadl.dsl.ops.packed_gru import packed_gru
from monadl.dsl.ops.packed_lstm import packed_lstm
from monadl.gradcheck import ATOL, RTOL, check_gradients, gradients_of, make_weights

F64 = NDArray[np.float64]
Input = F64 | float
"""An input of the checker: an array becomes an ``ArrayWeight``, a float a ``FloatWeight``."""
Grad = F64 | float
Weight = ArrayWeight | FloatWeight
Loss = Callable[..., FloatLayer]
"""``f(*weights)``: a scalar loss built from the weights."""
Op = Callable[..., FloatLayer | ArrayLayer]


def _identity(x: Any) -> Any:
    return x


def value_of(result: Result[Any, Exception]) -> Any:
    """The value of a ``predict_blocking()`` result, re-raising the original exception of a failure."""
    if not is_successful(result):
        raise result.failure()
    return result.unwrap()


def predict(layer: FloatLayer | ArrayLayer) -> Any:
    """``layer``'s forward value, computed now."""
    return value_of(layer.predict_blocking())


def numpy_array(x: Any) -> F64:
    """``x`` itself, after checking that it is a NumPy array (not a NumPy scalar, not a list)."""
    assert isinstance(x, np.ndarray), f"expected a NumPy array, got {type(x).__name__}: {x!r}"
    return x


# -------------------------------------------------------------------------- ops to scalar losses


def probe(shape: tuple[int, ...], seed: int = 0) -> F64:
    """A fixed array of ``shape`` with entries in +-[0.5, 1.5]: ``sum(out * probe)`` weighs every
    element of ``out`` differently, so its gradient is not trivially uniform (and never zero)."""
    rng = np.random.default_rng([seed, *shape])
    magnitude = rng.uniform(0.5, 1.5, shape)
    sign = np.where(rng.uniform(size=shape) < 0.5, -1.0, 1.0)
    return np.asarray(magnitude * sign, dtype=np.float64)


def scalar_loss(op: Op, shape: tuple[int, ...] | None, asarray: Callable[[Any], Any] = _identity) -> Loss:
    """``op`` made a scalar loss: itself when it gives a float (``shape`` None), else
    ``sum(op(...) * probe(shape))``."""
    if shape is None:

        def float_loss(*weights: Weight) -> FloatLayer:
            out = op(*weights)
            assert isinstance(out, FloatLayer)
            return out

        return float_loss
    weighting = asarray(probe(shape))

    def array_loss(*weights: Weight) -> FloatLayer:
        out = op(*weights)
        assert isinstance(out, ArrayLayer), f"expected an ArrayLayer, got {type(out).__name__}"
        return monadl.sum(out * weighting)

    return array_loss


def check_op(
    op: Op,
    inputs: Sequence[Input],
    expected: Any,
    *,
    rtol: float = RTOL,
    atol: float = ATOL,
    forward_tol: float = 1e-12,
) -> list[Grad]:
    """Checks ``op``'s forward value against ``expected`` (a NumPy reference) and its gradients with
    :func:`check_gradients` through ``sum(op(...) * probe)``. Returns monadl's gradients."""
    out = op(*make_weights(inputs))
    value = predict(out)
    if isinstance(out, FloatLayer):
        assert type(value) is float, f"a FloatLayer's value must be a float, got {type(value).__name__}"
        assert np.ndim(expected) == 0
        shape: tuple[int, ...] | None = None
    else:
        assert np.shape(value) == np.shape(expected), f"shape {np.shape(value)} != {np.shape(expected)}"
        shape = tuple(np.shape(expected))
    np.testing.assert_allclose(value, expected, rtol=forward_tol, atol=forward_tol, err_msg="forward")
    return check_gradients(scalar_loss(op, shape), *inputs, rtol=rtol, atol=atol)


# ------------------------------------------------------------------ op cases shared by backends


@dataclass(frozen=True)
class Backend:
    """An array library to run ops on: how to make its arrays from NumPy ones and back."""

    name: str
    asarray: Callable[[Any], Any]
    """NumPy array -> this backend's array (float and integer arrays alike)."""
    to_numpy: Callable[[Any], F64]
    """This backend's array -> NumPy; asserts the value is an array of this backend."""


def _numpy_reference(x: Any) -> F64:
    # NumPy gives 0-d results as NumPy scalars (np.float64), not 0-d arrays; the reference side of
    # the backend comparisons accepts both. test_ops_gradients.test_zero_dim_results_are_arrays
    # checks that contract on its own.
    if isinstance(x, np.generic):
        return np.asarray(x)
    return numpy_array(x)


NUMPY = Backend("numpy", np.asarray, _numpy_reference)


@dataclass(frozen=True)
class OpCase:
    """One application of an op: ``op(c, *weights)``, where ``c`` converts NumPy constants (indices,
    targets, constant operands) to the backend, on ``inputs`` (one weight each)."""

    name: str
    op: Callable[..., FloatLayer | ArrayLayer]
    inputs: tuple[Input, ...]

    def __str__(self) -> str:
        return self.name


def run_case(case: OpCase, backend: Backend) -> tuple[Any, float, list[Grad]]:
    """``case`` on ``backend``: its forward value (a float, or a NumPy array converted back), and the
    loss and gradients of ``sum(out * probe)`` (or of the float itself)."""
    c = backend.asarray

    def op(*weights: Weight) -> FloatLayer | ArrayLayer:
        return case.op(c, *weights)

    out = op(*make_weights(case.inputs, c))
    value = predict(out)
    if isinstance(out, FloatLayer):
        assert type(value) is float, f"a FloatLayer's value must be a float, got {type(value).__name__}"
        forward: Any = value
        shape: tuple[int, ...] | None = None
    else:
        forward = backend.to_numpy(value)
        shape = tuple(forward.shape)
    loss, grads = gradients_of(scalar_loss(op, shape, c), case.inputs, asarray=c)
    return forward, loss, [g if type(g) is float else backend.to_numpy(g) for g in grads]


def _u(seed: int, shape: tuple[int, ...], lo: float = -2.0, hi: float = 2.0) -> F64:
    return np.random.default_rng(seed).uniform(lo, hi, shape)


def _away(seed: int, shape: tuple[int, ...]) -> F64:
    """Entries in +-[0.2, 2]: away from the kinks of abs, relu, and from zero denominators."""
    x = _u(seed, shape, 0.2, 2.0)
    return np.where(np.random.default_rng(seed + 1).uniform(size=shape) < 0.5, -x, x)


_A = _u(1, (3, 4))
_B = _u(2, (3, 4))
_ROW = _u(3, (4,))
_COL = _u(4, (3, 1))
_POS = _u(5, (3, 4), 0.5, 2.0)
_POS_ROW = _u(6, (4,), 0.5, 2.0)
_LABELS = np.array([0, 3, 3], dtype=np.int64)
_LABELS_3D = np.array([[0, 2], [1, 1]], dtype=np.int64)
_ROWS = np.array([1, 1, 4, 0, 1], dtype=np.int64)
_ROWS_2D = np.array([[2, 0], [2, 2]], dtype=np.int64)


# A constant on the left of an operator is lifted (or the op's function form is used): an
# array_api_strict array's operators raise TypeError on an operand they do not know instead of
# returning NotImplemented, so ``strict_array - weight`` never reaches ``weight.__rsub__``. NumPy
# literals on the left of operators are tested in test_ops_gradients.
def monadl_linear(c: Any, x: Any, w: Any, b: Any) -> ArrayLayer:
    return monadl.linear(x, w, b)


CASES: list[OpCase] = [
    # elementwise binary, with broadcasting and mixed float/array operands
    OpCase("add", lambda c, a, b: a + b, (_A, _B)),
    OpCase("add (3,4)+(4,)", lambda c, a, b: a + b, (_A, _ROW)),
    OpCase("add (3,1)+(4,)", lambda c, a, b: a + b, (_COL, _ROW)),
    OpCase("add float weight", lambda c, a, b: a + b, (_A, 0.7)),
    OpCase("add python float", lambda c, a: 1.5 + a, (_A,)),
    OpCase("sub", lambda c, a, b: a - b, (_A, _ROW)),
    OpCase("sub constant", lambda c, a: monadl.lift_array(c(_ROW)) - a, (_A,)),
    OpCase("mul", lambda c, a, b: a * b, (_A, _COL)),
    OpCase("mul float weight", lambda c, a, b: a * b, (-1.3, _A)),
    OpCase("mul constant", lambda c, a: a * c(_B), (_A,)),
    OpCase("div", lambda c, a, b: a / b, (_A, _away(7, (4,)))),
    OpCase("div float weight", lambda c, a, b: a / b, (0.8, _away(8, (3, 4)))),
    OpCase("div constant numerator", lambda c, b: monadl.lift_array(c(_A)) / b, (_away(9, (3, 1)),)),
    OpCase("pow constant exponent", lambda c, a: a**2.5, (_POS,)),
    OpCase("pow int exponent, any sign", lambda c, a: a**3, (_A,)),
    OpCase("pow layer ** layer", lambda c, a, b: a**b, (_POS, _ROW)),
    OpCase("pow float weight ** array weight", lambda c, a, b: a**b, (1.7, _A)),
    OpCase("pow float constant ** array weight", lambda c, b: 1.7**b, (_A,)),
    OpCase("float weights only", lambda c, a, b: (a * b - a / b) ** 2.0, (0.6, -1.4)),
    OpCase("neg", lambda c, a: -a, (_A,)),
    # elementwise unary
    OpCase("exp", lambda c, a: monadl.exp(a), (_A,)),
    OpCase("log", lambda c, a: monadl.log(a), (_POS,)),
    OpCase("sqrt", lambda c, a: monadl.sqrt(a), (_POS,)),
    OpCase("abs", lambda c, a: monadl.abs(a), (_away(10, (3, 4)),)),
    OpCase("tanh", lambda c, a: monadl.tanh(a), (_A,)),
    OpCase("sigmoid", lambda c, a: monadl.sigmoid(a), (_A,)),
    OpCase("relu", lambda c, a: monadl.relu(a), (_away(11, (3, 4)),)),
    OpCase("exp of a float weight", lambda c, a: monadl.exp(a) * monadl.tanh(a), (0.3,)),
    OpCase("maximum layer layer", lambda c, a, b: monadl.maximum(a, b), (_A, _B)),
    OpCase("maximum broadcast", lambda c, a, b: monadl.maximum(a, b), (_A, _ROW)),
    OpCase("maximum python float", lambda c, a: monadl.maximum(a, 0.25), (_A,)),
    OpCase("maximum float weight", lambda c, a, b: monadl.maximum(b, a), (0.25, _A)),
    OpCase("minimum layer layer", lambda c, a, b: monadl.minimum(a, b), (_A, _B)),
    OpCase("minimum array constant", lambda c, a: monadl.minimum(c(_ROW), a), (_A,)),
    # linear (x @ w + b as one op)
    OpCase(
        "linear", lambda c, x, w, b: monadl.linear(x, w, b), (_u(40, (3, 4)), _u(41, (4, 2)), _u(42, (2,)))
    ),
    OpCase(
        "linear 1d", lambda c, x, w, b: monadl.linear(x, w, b), (_u(43, (4,)), _u(44, (4, 2)), _u(45, (2,)))
    ),
    OpCase("linear 3d, float bias", monadl_linear, (_u(46, (2, 3, 4)), _u(47, (4, 2)), 0.3)),
    OpCase("linear constant x", lambda c, w, b: monadl.linear(c(_A), w, b), (_u(48, (4, 2)), _u(49, (2,)))),
    # matmul
    OpCase("matmul 2d@2d", lambda c, a, b: a @ b, (_u(12, (3, 4)), _u(13, (4, 2)))),
    OpCase("matmul 1d@2d", lambda c, a, b: monadl.matmul(a, b), (_u(14, (4,)), _u(15, (4, 3)))),
    OpCase("matmul 2d@1d", lambda c, a, b: monadl.matmul(a, b), (_u(16, (3, 4)), _u(17, (4,)))),
    OpCase("dot 1d@1d", lambda c, a, b: monadl.dot(a, b), (_u(18, (4,)), _u(19, (4,)))),
    OpCase("matmul 3d@3d", lambda c, a, b: a @ b, (_u(20, (2, 3, 4)), _u(21, (2, 4, 2)))),
    OpCase("matmul 3d@2d", lambda c, a, b: a @ b, (_u(22, (2, 3, 4)), _u(23, (4, 2)))),
    OpCase("matmul constant@weight", lambda c, b: monadl.matmul(c(_A), b), (_u(24, (4, 2)),)),
    # reductions
    OpCase("sum", lambda c, a: monadl.sum(a), (_A,)),
    OpCase("sum axis", lambda c, a: monadl.sum(a, axis=-1), (_u(25, (2, 3, 4)),)),
    OpCase("sum axes keepdims", lambda c, a: monadl.sum(a, axis=(0, 2), keepdims=True), (_u(26, (2, 3, 4)),)),
    OpCase("mean", lambda c, a: monadl.mean(a), (_A,)),
    OpCase("mean axis keepdims", lambda c, a: monadl.mean(a, axis=0, keepdims=True), (_A,)),
    OpCase("mean axes", lambda c, a: monadl.mean(a, axis=(1, 2)), (_u(27, (2, 3, 4)),)),
    OpCase("add_n", lambda c, a, b, d: monadl.add_n([a, b, d]), (_A, _ROW, _COL)),
    # shape
    OpCase("reshape", lambda c, a: monadl.reshape(a, (2, -1, 3)), (_u(28, (3, 4)),)),
    OpCase("transpose", lambda c, a: monadl.transpose(a), (_u(29, (2, 3, 4)),)),
    OpCase("transpose axes", lambda c, a: monadl.transpose(a, (1, 2, 0)), (_u(30, (2, 3, 4)),)),
    OpCase("concatenate 2 axis 0", lambda c, a, b: monadl.concatenate([a, b]), (_A, _u(31, (2, 4)))),
    OpCase(
        "concatenate 3 axis -1",
        lambda c, a, b, d: monadl.concatenate([a, b, d], axis=-1),
        (_u(32, (3, 1)), _A, _u(33, (3, 2))),
    ),
    OpCase("concatenate with a constant", lambda c, a: monadl.concatenate([c(_A), a], axis=1), (_B,)),
    OpCase(
        "concatenate 3-d axis -2",  # a middle axis: neither the first nor the last
        lambda c, a, b: monadl.concatenate([a, b], axis=-2),
        (_u(206, (2, 1, 3)), _u(207, (2, 2, 3))),
    ),
    OpCase("take_rows", lambda c, t: monadl.take_rows(t, c(_ROWS)), (_u(34, (5, 3)),)),
    OpCase("take_rows 2d indices", lambda c, t: monadl.take_rows(t, c(_ROWS_2D)), (_u(35, (3, 2)),)),
    # softmax and losses
    OpCase("softmax", lambda c, a: monadl.softmax(a), (_A,)),
    OpCase("softmax axis 0", lambda c, a: monadl.softmax(a, axis=0), (_A,)),
    OpCase("log_softmax", lambda c, a: monadl.log_softmax(a), (_A,)),
    OpCase("log_softmax axis 1 of 3d", lambda c, a: monadl.log_softmax(a, axis=1), (_u(36, (2, 3, 4)),)),
    OpCase("cross_entropy labels", lambda c, a: monadl.cross_entropy(a, c(_LABELS)), (_A,)),
    OpCase("cross_entropy one-hot", lambda c, a: monadl.cross_entropy(a, c(np.eye(4)[_LABELS])), (_A,)),
    OpCase(
        "cross_entropy labels 3d", lambda c, a: monadl.cross_entropy(a, c(_LABELS_3D)), (_u(37, (2, 2, 3)),)
    ),
    OpCase(  # logits whose memory is not in row order (a transpose's view): the labels' -1 must land
        "cross_entropy labels 3d transposed",
        lambda c, a: monadl.cross_entropy(monadl.transpose(a, (2, 1, 0)), c(_LABELS_3D)),
        (_u(50, (3, 2, 2)),),
    ),
    # a small network: every op's delta flows through the others
    OpCase(
        "mlp",
        lambda c, x, w1, b1, w2: monadl.cross_entropy(
            monadl.relu(x @ w1 + b1) @ w2, c(np.array([1, 0, 2], dtype=np.int64))
        ),
        (_u(38, (3, 4)), _u(39, (4, 5)), _u(40, (5,)), _u(41, (5, 3))),
    ),
]

# Batch norm (the batch's statistics; channels on axis 1).
CASES += [
    OpCase("batch_norm 2d", lambda c, x, g, b: monadl.batch_norm(x, g, b), (_A, _u(60, (4,)), _u(61, (4,)))),
    OpCase(
        "batch_norm NCHW",
        lambda c, x, g, b: monadl.batch_norm(x, g, b, eps=1e-3),
        (_u(62, (2, 3, 2, 2)), _u(63, (3,)), _u(64, (3,))),
    ),
]

# ------------------------------------------------ activations and reductions

CASES += [
    OpCase("softplus", lambda c, a: monadl.softplus(a), (_u(60, (3, 4), -30.0, 30.0),)),
    OpCase("softplus of a float weight", lambda c, a: monadl.softplus(a), (-0.7,)),
    OpCase("gelu", lambda c, a: monadl.gelu(a), (_A,)),
    OpCase("silu", lambda c, a: monadl.silu(a), (_A,)),
    OpCase("silu of a float weight", lambda c, a: monadl.silu(a) * monadl.gelu(a), (0.4,)),
    OpCase("leaky_relu", lambda c, a: monadl.leaky_relu(a, 0.2), (_away(61, (3, 4)),)),
    OpCase("elu", lambda c, a: monadl.elu(a, alpha=1.5), (_away(62, (3, 4)),)),
    OpCase("elu of a float weight", lambda c, a: monadl.elu(a), (-1.2,)),
    OpCase("clip", lambda c, a: monadl.clip(a, -0.9, 1.1), (_u(63, (3, 4)) * 0.9 + 0.05,)),
    OpCase("max", lambda c, a: monadl.max(a), (_A,)),
    OpCase("max axis", lambda c, a: monadl.max(a, axis=-1), (_u(64, (2, 3, 4)),)),
    OpCase("min axes keepdims", lambda c, a: monadl.min(a, axis=(0, 2), keepdims=True), (_u(65, (2, 3, 4)),)),
    OpCase("logsumexp", lambda c, a: monadl.logsumexp(a), (_A,)),
    OpCase("logsumexp axis large", lambda c, a: monadl.logsumexp(a * 400.0, axis=1), (_A,)),
    OpCase(
        "logsumexp axes keepdims",
        lambda c, a: monadl.logsumexp(a, axis=(0, 1), keepdims=True),
        (_u(66, (2, 3, 4)),),
    ),
    OpCase("var", lambda c, a: monadl.var(a), (_A,)),
    OpCase("var axis correction", lambda c, a: monadl.var(a, axis=0, correction=1.0), (_A,)),
    OpCase("std", lambda c, a: monadl.std(a), (_A,)),
    OpCase("std axes keepdims", lambda c, a: monadl.std(a, axis=(1, 2), keepdims=True), (_u(67, (2, 3, 4)),)),
    OpCase("where", lambda c, a, b: monadl.where(c(_A > 0.0), a, b), (_B, _ROW)),
    OpCase("where broadcast condition", lambda c, a, b: monadl.where(c(_COL > 0.0), a, b), (_ROW, 0.3)),
    OpCase("where constant branch", lambda c, a: monadl.where(c(_A < 0.5), c(_B), a), (_A,)),
]

# Convolution and pooling (monadl.dsl.ops.conv): NCHW; every parameter of the ops at least once. Max
# pooling's inputs are drawn apart from one another (no ties within a finite-difference step).
_MAX_POOL_X = np.random.default_rng(61).permutation(2 * 3 * 7 * 6).reshape(2, 3, 7, 6) / 40.0 - 1.0
CASES += [
    OpCase(
        "conv2d",
        lambda c, x, w, b: monadl.conv2d(x, w, b),
        (_u(51, (2, 3, 5, 4)), _u(52, (4, 3, 3, 2)), _u(53, (4,))),
    ),
    OpCase(
        "conv2d stride, padding, dilation, groups",
        lambda c, x, w, b: monadl.conv2d(x, w, b, stride=(2, 1), padding=(1, 2), dilation=(1, 2), groups=2),
        (_u(54, (2, 4, 6, 5)), _u(55, (6, 2, 3, 2)), _u(56, (6,))),
    ),
    OpCase(
        "conv2d same, no bias, unbatched",
        lambda c, x, w: monadl.conv2d(x, w, padding="same"),
        (_u(57, (2, 4, 4)), _u(58, (3, 2, 2, 3))),
    ),
    OpCase(
        "conv2d constant x",
        lambda c, w: monadl.conv2d(c(_u(59, (1, 2, 4, 4))), w, 0.5, padding=1),
        (_u(60, (2, 2, 3, 3)),),
    ),
    OpCase(
        "conv1d stride, padding, dilation",
        lambda c, x, w, b: monadl.conv1d(x, w, b, stride=2, padding=1, dilation=2),
        (_u(62, (2, 3, 9)), _u(63, (4, 3, 3)), _u(64, (4,))),
    ),
    OpCase("max_pool2d", lambda c, x: monadl.max_pool2d(x, 3, stride=2, padding=1), (_MAX_POOL_X,)),
    OpCase("max_pool1d", lambda c, x: monadl.max_pool1d(x, 2), (_MAX_POOL_X[0],)),
    OpCase(
        "avg_pool2d",
        lambda c, x: monadl.avg_pool2d(x, (3, 2), stride=(2, 1), padding=1),
        (_u(65, (2, 3, 7, 6)),),
    ),
    OpCase("avg_pool1d", lambda c, x: monadl.avg_pool1d(x, 3, stride=2), (_u(66, (2, 3, 9)),)),
    OpCase(  # a small CNN: conv, relu, pool, linear, loss
        "cnn",
        lambda c, x, w, b, v: monadl.cross_entropy(
            monadl.reshape(monadl.max_pool2d(monadl.relu(monadl.conv2d(x, w, b, padding=1)), 2), (2, -1)) @ v,
            c(np.array([1, 0], dtype=np.int64)),
        ),
        (_u(67, (2, 2, 4, 4)), _u(68, (3, 2, 3, 3)), _u(69, (3,)), _u(70, (12, 3))),
    ),
]

# layer norm and attention (monadl.dsl.ops.norm, monadl.dsl.ops.attention)
_KEEP = np.array([[1, 0, 1, 1], [1, 1, 0, 0], [1, 0, 0, 1]], dtype=bool)
CASES += [
    OpCase(
        "layer_norm",
        lambda c, x, w, b: monadl.layer_norm(x, w, b),
        (_u(60, (3, 4)), _u(61, (4,)), _u(62, (4,))),
    ),
    OpCase("layer_norm 3d, no affine", lambda c, x: monadl.layer_norm(x, eps=0.1), (_u(63, (2, 3, 4)),)),
    OpCase(
        "scaled_dot_product_attention",
        lambda c, q, k, v: monadl.scaled_dot_product_attention(q, k, v),
        (_u(64, (2, 3, 4)), _u(65, (2, 4, 4)), _u(66, (2, 4, 2))),
    ),
    OpCase(
        "scaled_dot_product_attention boolean mask, heads",
        lambda c, q, k, v: monadl.scaled_dot_product_attention(q, k, v, c(_KEEP), heads=2),
        (_u(67, (2, 3, 4)), _u(68, (2, 4, 4)), _u(69, (2, 4, 2))),
    ),
    OpCase(
        "scaled_dot_product_attention additive mask, causal",
        lambda c, q, k, v: monadl.scaled_dot_product_attention(q, k, v, c(_u(70, (3, 4))), causal=True),
        (_u(71, (3, 4)), _u(72, (4, 4)), _u(73, (4, 3))),
    ),
]
CASES += [  # the modules' attention of q, k and v packed in one array (not exported)
    OpCase(
        "self_attention causal, heads",
        lambda c, qkv: self_attention(qkv, causal=True, heads=2),
        (_u(74, (2, 3, 12)),),
    ),
    OpCase(
        "self_attention boolean mask",
        lambda c, qkv: self_attention(qkv, c(_KEEP[:, :3])),
        (_u(75, (3, 6)),),
    ),
]

# Gathers: take_along_axis and advanced indexing, repeated indices included (their
# deltas add).
_ALONG = np.array([[3, 0, 3], [1, 1, 2], [0, 3, 3]], dtype=np.int64)
CASES += [
    OpCase("take_along_axis", lambda c, a: monadl.take_along_axis(a, c(_ALONG), axis=1), (_A,)),
    OpCase(
        "take_along_axis axis 0, broadcast",
        lambda c, a: monadl.take_along_axis(a, c(np.array([[2, 0, 2, 1]], dtype=np.int64)), axis=0),
        (_A,),
    ),
    OpCase(
        "take_along_axis one per row",
        lambda c, a: monadl.take_along_axis(a, c(_LABELS[:, None]), axis=-1),
        (_A,),
    ),
    OpCase("getitem rows, cols", lambda c, a: a[c(_ALONG[:, 0] % 3), c(_ALONG[0])], (_A,)),
    OpCase("getitem [:, cols]", lambda c, a: a[:, c(_ALONG)], (_u(71, (2, 4, 3)),)),
    OpCase("getitem mask", lambda c, a: a[c(_A > 0.0)], (_B,)),
]

# The LSTM cell's fused gate arithmetic (monadl.dsl.ops.recurrent); c broadcast from one row too.
CASES += [
    OpCase(
        "lstm_c",
        lambda c, i, f, u, m: monadl.lstm_c(i, f, u, m),
        (_u(80, (3, 4)), _u(81, (3, 4)), _u(82, (3, 4)), _u(83, (3, 4))),
    ),
    OpCase(
        "lstm_c memory broadcast",
        lambda c, i, f, u, m: monadl.lstm_c(i, f, u, m),
        (_u(84, (2, 3)), _u(85, (2, 3)), _u(86, (2, 3)), _u(87, (3,))),
    ),
    OpCase("lstm_h", lambda c, o, m: monadl.lstm_h(o, m), (_u(88, (3, 4)), _u(89, (3, 4)))),
    OpCase(
        "tree_lstm_c left memory broadcast",
        lambda c, i, fl, fr, u, ml_, mr: monadl.tree_lstm_c(i, fl, fr, u, ml_, mr),
        (*(_u(200 + k, (2, 3)) for k in range(4)), _u(204, (3,)), _u(205, (2, 3))),
    ),
    # nn.LSTM's whole layer (monadl.dsl.ops.packed_lstm): x (steps, 2), hidden 3, gates (5, 3) and
    # biases (3,) per direction; sequences of unequal lengths, not sorted (final memories included)
    OpCase(
        "packed_lstm bidirectional",
        lambda c, x, *w: packed_lstm(x, (2, 3, 1), *w),
        (_u(95, (6, 2)), *[_u(96 + k, (5, 3) if k % 8 < 4 else (3,)) for k in range(16)]),
    ),
    OpCase(
        "packed_lstm one sequence",
        lambda c, x, *w: packed_lstm(x, (3,), *w),
        (_u(112, (3, 2)), *[_u(113 + k, (5, 3) if k < 4 else (3,)) for k in range(8)]),
    ),
    # nn.GRU's whole layer (monadl.dsl.ops.packed_gru): r and z (5, 3), n_x (2, 3), n_h (3, 3), biases
    OpCase(
        "packed_gru bidirectional",
        lambda c, x, *w: packed_gru(x, (2, 3, 1), *w),
        (
            _u(121, (6, 2)),
            *[_u(122 + k, ((5, 3), (5, 3), (2, 3), (3, 3))[k % 8] if k % 8 < 4 else (3,)) for k in range(16)],
        ),
    ),
    OpCase(
        "packed_gru one sequence",
        lambda c, x, *w: packed_gru(x, (3,), *w),
        (
            _u(138, (3, 2)),
            *[_u(139 + k, ((5, 3), (5, 3), (2, 3), (3, 3))[k] if k < 4 else (3,)) for k in range(8)],
        ),
    ),
    OpCase(
        "gru_h state broadcast",
        lambda c, r, z, nx, nh, h: monadl.gru_h(r, z, nx, nh, h),
        (_u(90, (2, 3)), _u(91, (2, 3)), _u(92, (2, 3)), _u(93, (2, 3)), _u(94, (3,))),
    ),
]

# Cross-attention: queries and keys of different lengths, a mask of shape (Lq, Lk) for
# every batch row and head, and keys that broadcast over the queries' batch axis.
_CROSS_KEEP = np.array([[1, 0, 1, 1, 0], [0, 1, 0, 0, 1]], dtype=bool)
CASES += [
    OpCase(
        "scaled_dot_product_attention cross, (Lq, Lk) mask, heads",
        lambda c, q, k, v: monadl.scaled_dot_product_attention(q, k, v, c(_CROSS_KEEP), heads=2),
        (_u(80, (3, 2, 4)), _u(81, (5, 4)), _u(82, (5, 6))),
    ),
]

# Queries of no key, a float bias, equal elements and empty axes (tests/test_gradient_fuzz.py has
# their regression tests): the array API's paths of each, where NumPy takes one of its own.
_NO_KEY = np.array([[1, 0, 1, 1], [0, 0, 0, 0], [1, 1, 0, 1]], dtype=bool)  # query 1 keeps no key
_EQUAL_ROWS = np.stack([np.full(3, 0.1), _u(90, (3,)), np.full(3, 0.7)])  # the mean of 0.1s rounds
CASES += [
    OpCase(
        "scaled_dot_product_attention a query of no key",
        lambda c, q, k, v: monadl.scaled_dot_product_attention(q, k, v, c(_NO_KEY)),
        (_u(91, (3, 2)), _u(92, (4, 2)), _u(93, (4, 3))),
    ),
    OpCase(
        "scaled_dot_product_attention no keys",
        lambda c, q, k, v: monadl.scaled_dot_product_attention(q, k, v),
        (_u(94, (3, 2)), _u(95, (0, 2)), _u(96, (0, 3))),
    ),
    OpCase(
        "conv1d float weight bias",
        lambda c, x, w, b: monadl.conv1d(x, w, b, padding=1),
        (_u(97, (2, 3, 5)), _u(98, (2, 3, 3)), 0.4),
    ),
    OpCase("std of equal elements", lambda c, a: monadl.std(a, axis=1), (_EQUAL_ROWS,)),
    OpCase("softmax along an empty axis", lambda c, a: monadl.softmax(a, axis=0), (_u(99, (0, 3)),)),
    OpCase(
        "layer_norm of no features", lambda c, x, w: monadl.layer_norm(x, w), (_u(100, (3, 0)), _u(101, (0,)))
    ),
]

# Transposed convolution, adaptive pooling, padding, flattening, group and RMS norm: every
# parameter of the ops at least once, each path of their rules (a bias-free kernel, bins that tile
# the input and bins that overlap, each padding mode, a crop), on every backend.
CASES += [
    OpCase(
        "conv_transpose2d",
        lambda c, x, w, b: monadl.conv_transpose2d(x, w, b),
        (_u(102, (2, 3, 3, 4)), _u(103, (3, 2, 3, 2)), _u(104, (2,))),
    ),
    OpCase(
        "conv_transpose2d stride, padding, output_padding, dilation, groups",
        lambda c, x, w, b: monadl.conv_transpose2d(
            x, w, b, stride=(2, 1), padding=(1, 0), output_padding=(1, 1), dilation=(1, 2), groups=2
        ),
        (_u(105, (2, 4, 3, 3)), _u(106, (4, 1, 3, 2)), _u(107, (2,))),
    ),
    OpCase(
        "conv_transpose2d unbatched, no bias, tiling strides",
        lambda c, x, w: monadl.conv_transpose2d(x, w, stride=2),
        (_u(108, (2, 3, 3)), _u(109, (2, 3, 2, 2))),
    ),
    OpCase(
        "adaptive_avg_pool2d overlapping bins",
        lambda c, x: monadl.adaptive_avg_pool2d(x, (3, 2)),
        (_u(110, (2, 3, 5, 5)),),
    ),
    OpCase(
        "adaptive_avg_pool2d global", lambda c, x: monadl.adaptive_avg_pool2d(x, 1), (_u(111, (3, 4, 6)),)
    ),
    OpCase(
        "adaptive_avg_pool2d tiles, None",
        lambda c, x: monadl.adaptive_avg_pool2d(x, (2, None)),
        (_u(112, (2, 4, 3)),),
    ),
    OpCase("pad constant", lambda c, x: monadl.pad(x, (1, 2, 0, 1), value=0.5), (_u(113, (2, 3, 4)),)),
    OpCase("pad constant crop", lambda c, x: monadl.pad(x, (-1, 2, 1, -2)), (_u(114, (3, 4)),)),
    OpCase("pad reflect", lambda c, x: monadl.pad(x, (2, 1, 1, 2), mode="reflect"), (_u(115, (2, 3, 4)),)),
    OpCase(
        "pad replicate", lambda c, x: monadl.pad(x, (1, 2, 2, 0), mode="replicate"), (_u(116, (2, 3, 4)),)
    ),
    OpCase("pad circular", lambda c, x: monadl.pad(x, (3, 1, 0, 2), mode="circular"), (_u(117, (2, 3, 4)),)),
    OpCase("flatten", lambda c, x: monadl.flatten(x, 1), (_u(118, (2, 3, 2, 2)),)),
    OpCase("flatten middle", lambda c, x: monadl.flatten(x, -3, -2), (_u(119, (2, 3, 2, 2)),)),
    OpCase(
        "group_norm",
        lambda c, x, w, b: monadl.group_norm(x, 2, w, b),
        (_u(120, (2, 4, 3, 2)), _u(121, (4,)), _u(122, (4,))),
    ),
    OpCase(
        "group_norm no affine, axis -2",
        lambda c, x: monadl.group_norm(x, 3, axis=-2, eps=0.1),
        (_u(123, (6, 2)),),
    ),
    OpCase("rms_norm", lambda c, x, w: monadl.rms_norm(x, (3, 2), w), (_u(124, (2, 3, 2)), _u(125, (3, 2)))),
    OpCase("rms_norm no weight, eps", lambda c, x: monadl.rms_norm(x, 4, eps=0.1), (_u(126, (3, 4)),)),
]


# ------------------------------------------------------------- merged graphs shared by backends


def tree_loss(asarray: Callable[[Any], Any], uneven: bool = False) -> tuple[FloatLayer, list[ArrayWeight]]:
    """A batch of complete binary trees of a ``@batchable`` cell over word lookups (Python int ids,
    as a Tree-LSTM's leaves give them), with losses of NumPy labels: wide enough that every level
    merges. ``uneven``: trees of random shapes instead, whose merged cells gather their children
    from several groups (leaves and inner nodes of different heights) in one stack."""
    rng = np.random.default_rng(0)
    w = ArrayWeight(asarray(rng.normal(size=(4, 4))))
    b = ArrayWeight(asarray(rng.normal(size=(4,))))
    table = ArrayWeight(asarray(rng.normal(size=(10, 4))))

    @monadl.batchable
    def cell(left: ArrayLayer, right: ArrayLayer) -> ArrayLayer:
        return monadl.tanh(monadl.linear(left + right, w, b))

    def tree(depth: int, i: int) -> ArrayLayer:
        if depth == 0:
            return monadl.take_rows(table, (7 * i) % 10)  # repeated words: their deltas add
        return cell(tree(depth - 1, 2 * i), tree(depth - 1, 2 * i + 1))

    def random_tree(leaves: list[int]) -> ArrayLayer:
        if len(leaves) == 1:
            return monadl.take_rows(table, leaves[0] % 10)
        cut = int(rng.integers(1, len(leaves)))
        return cell(random_tree(leaves[:cut]), random_tree(leaves[cut:]))

    if uneven:
        roots = [random_tree(list(range(k, k + int(rng.integers(2, 12))))) for k in range(8)]
    else:
        roots = [tree(3, k) for k in range(6)]
    # a loss at every root, of NumPy labels (as a Tree-LSTM gives them) whatever the logits' namespace
    losses = [monadl.sum(r * r) + monadl.cross_entropy(r, np.asarray(k % 4)) for k, r in enumerate(roots)]
    return monadl.add_n(losses), [w, b, table]


def dense(gradient: Any) -> Any:
    """A gradient as a dense array (a sparse one's rows summed into the table's shape)."""
    return gradient.to_dense() if hasattr(gradient, "to_dense") else gradient


def check_merged_trees(backend: Backend, batching: bool, uneven: bool, tol: float) -> None:
    """:func:`tree_loss`'s value and gradients on ``backend`` equal NumPy's, merged or not."""
    results = []
    for b in (NUMPY, backend):
        executor = monadl.Executor(batching=batching)
        loss, weights = tree_loss(b.asarray, uneven)
        value, gradients = monadl.compute_gradients(loss, executor=executor)
        stats = executor.stats  # over the forward and backward runs
        results.append((value, [b.to_numpy(dense(gradients[w])) for w in weights], stats))
    (expected, expected_grads, numpy_stats), (value, grads, stats) = results
    assert abs(value - expected) <= tol * abs(expected)
    for g, e in zip(grads, expected_grads, strict=True):
        np.testing.assert_allclose(g, e, rtol=tol, atol=tol)
    assert (stats.merged > 0) == (numpy_stats.merged > 0) == batching


def check_replayed_gathers(backend: Backend, tol: float) -> None:
    """A static graph replayed from its program's steps on ``backend`` gives NumPy's value and
    gradients at every run: the gathers' index arrays, copied to the device on the first run, are
    used again by every replay (forward and backward)."""
    results = []
    for b in (NUMPY, backend):
        rng = np.random.default_rng(1)
        w = ArrayWeight(b.asarray(rng.normal(size=(4, 4))))
        table = ArrayWeight(b.asarray(rng.normal(size=(10, 4))))
        xs = [monadl.tanh(monadl.matmul(monadl.take_rows(table, (3 * i) % 10), w)) for i in range(6)]
        ys = [monadl.tanh(monadl.matmul(xs[i] + xs[(i * 5) % 6], w)) for i in range(6)]
        loss = monadl.add_n([monadl.sum(y) for y in ys] + [monadl.sum(xs[0])])
        executor = monadl.Executor()
        for _ in range(3):
            value, gradients = monadl.compute_gradients(loss, executor=executor)
            results.append((value, [b.to_numpy(dense(gradients[v])) for v in (w, table)]))
        assert executor.stats.replayed == 2 and executor.stats.merged > 0
    expected, expected_grads = results[0]
    for value, grads in results[1:]:
        assert abs(value - expected) <= tol * abs(expected)
        for g, e in zip(grads, expected_grads, strict=True):
            np.testing.assert_allclose(g, e, rtol=tol, atol=tol)
