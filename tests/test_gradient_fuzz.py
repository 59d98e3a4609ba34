"""A gradient fuzz over every public op's parameters.

Each case draws an op's parameters (strides, paddings, dilations, groups, axes, keepdims, masks,
heads, scales, corrections, slopes, bounds, indices, operand kinds) and its operands' shapes
(size-1 axes, broadcasting, and empty axes where the op takes them), then checks, in float64:

- the gradient of ``sum(op(...) * probe)`` (or of the op's float) against central finite
  differences, with the library's checker (``monadl.check_gradients``: it also checks each
  gradient's type, shape and dtype, and that reruns, replayed or not, give the same bits);
- where PyTorch has the op and torch is installed, the value and the gradients against PyTorch's
  (all but the packed LSTM and GRU layers, whose weights PyTorch lays out otherwise);
- two calls of the op, summed, with dynamic batching on and off: merged calls give the value and
  gradients of the calls alone. Some operands are weights (shared by the calls), some computed
  layers (rows of their own: the second call's scaled), and the calls' data (indices, masks,
  targets, conditions) differ, so a merged step that mixed up its rows would show.

Operands are drawn away from the points where an op has no derivative, by construction: distinct
values for max, min and max pooling (no ties), magnitudes of 0.2 or more for abs, relu and their
kin, values off a grid for maximum, minimum and clip (whose bounds are on it), positive bases and
denominators away from 0. Input sides of convolutions and pooling are drawn so that the windows
often end exactly at the padded input's end, or at the unpadded input's.

CI runs a fixed set of cases (derandomized: the same every run), ``CI_EXAMPLES`` (821) in all;
``MONADL_GRADFUZZ_EXAMPLES=20000`` runs about that many random ones instead, spread over the ops
in the same proportions (``pytest -s`` prints the counts).
"""

from __future__ import annotations

import importlib
import math
import operator
import os
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import pytest
from batching_check import assert_close, dense
from hypothesis import HealthCheck, currently_in_test_context, given, note, settings
from hypothesis import strategies as st
from op_cases import probe, value_of

import monadl
from monadl import ArrayLayer, ArrayWeight, FloatLayer
from monadl.dsl.ops import (
    activations,
    adaptive_pool,
    attention,
    batch_norm,
    classification,
    conv,
    conv_transpose,
    elementwise,
    flatten,
    linalg,
    norm,
    padding,
    pooling,
    recurrent,
    reductions,
    selection,
    shape,
)
from monadl.dsl.ops.attention import self_attention
from monadl.dsl.ops.packed_gru import packed_gru
from monadl.dsl.ops.packed_lstm import packed_lstm
from monadl.gradcheck import check_gradients, make_weights

# PyTorch is optional (CI does not install it): imported by name, so that mypy needs no stubs for it.
torch: Any
F: Any
try:
    torch = importlib.import_module("torch")
    F = importlib.import_module("torch.nn.functional")
except ImportError:  # pragma: no cover - the comparisons with PyTorch are skipped
    torch = F = None

F64 = np.ndarray[Any, np.dtype[np.float64]]
Input = F64 | float
Rng = np.random.Generator

# --------------------------------------------------------------------------------------- the case


@dataclass(frozen=True)
class Case:
    """One application of an op: ``op(*operands)`` on one operand per input (a weight, or a layer
    computed from it), a ``FloatLayer`` or an ``ArrayLayer``; ``reference``: the same function of
    PyTorch tensors (float64), or None where PyTorch has no such op or gives another value."""

    op: Callable[..., Any]
    inputs: tuple[Input, ...]
    reference: Callable[..., Any] | None = None
    params: dict[str, Any] = field(default_factory=dict)
    """The drawn parameters, for the report of a failing case."""
    variant: Callable[..., Any] | None = None
    """The op of a second call, with other data of the same shapes (indices, masks, targets,
    conditions: what merged calls stack), or None (``op``)."""


def _loss(op: Callable[..., Any], shape: tuple[int, ...] | None, seed: int = 0) -> Callable[..., FloatLayer]:
    """``op`` as a scalar loss: the float itself (``shape`` None), or ``sum(out * probe)``."""
    if shape is None:
        return lambda *operands: op(*operands)
    weighting = probe(shape, seed)
    return lambda *operands: monadl.sum(op(*operands) * weighting)


def check_case(case: Case, layered: Sequence[bool]) -> None:
    """The checks of the module's docstring, on ``case``; ``layered``: which operands the merged
    calls get as computed layers (``w * 1.0``), not as weights."""
    if currently_in_test_context():
        note(f"params {case.params}; input shapes {[np.shape(x) for x in case.inputs]}")
    out = case.op(*make_weights(case.inputs))
    value = value_of(out.predict_blocking())
    if isinstance(out, FloatLayer):
        assert type(value) is float, f"a FloatLayer's value is a {type(value).__name__}"
        shape: tuple[int, ...] | None = None
    else:
        assert isinstance(out, ArrayLayer), type(out)
        assert isinstance(value, np.ndarray) and value.dtype == np.float64, repr(value)
        shape = tuple(value.shape)
    gradients = check_gradients(_loss(case.op, shape), *case.inputs)
    if torch is not None and case.reference is not None:
        _against_torch(case, value, shape, gradients)
    _merged_like_alone(case, shape, layered)


def _tensor(x: Input, grad: bool = False) -> Any:
    return torch.tensor(x, dtype=torch.float64, requires_grad=grad)


def _against_torch(case: Case, value: Any, shape: tuple[int, ...] | None, gradients: list[Any]) -> None:
    assert case.reference is not None
    tensors = [_tensor(x, True) for x in case.inputs]
    out = case.reference(*tensors)
    assert tuple(out.shape) == (shape or ()), f"PyTorch's shape {tuple(out.shape)}, monadl's {shape}"
    np.testing.assert_allclose(value, out.detach().numpy(), rtol=1e-9, atol=1e-11, err_msg="value")
    loss = out if shape is None else (out * torch.tensor(probe(shape))).sum()
    theirs = (
        torch.autograd.grad(loss, tensors, allow_unused=True) if loss.requires_grad else [None] * len(tensors)
    )
    for i, (ours, t, x) in enumerate(zip(gradients, theirs, case.inputs, strict=True)):
        expected = np.zeros(np.shape(x)) if t is None else t.numpy()
        np.testing.assert_allclose(ours, expected, rtol=1e-7, atol=1e-9, err_msg=f"gradient of input {i}")


EXECUTORS = {batching: monadl.Executor(batching=batching) for batching in (True, False)}


def _merged_like_alone(case: Case, shape: tuple[int, ...] | None, layered: Sequence[bool]) -> None:
    """Two calls of the op, summed: with batching (they merge where the op batches) as without.
    The layered operands differ between the calls (the second's scaled by 0.75), and so do the
    calls' data where the case has a ``variant``: a merged step that mixed up its rows would
    show."""
    first, second = _loss(case.op, shape, 1), _loss(case.variant or case.op, shape, 2)
    results = []
    for batching in (True, False):
        weights = make_weights(case.inputs)

        def operands(scale: float, weights: list[Any] = weights) -> list[Any]:
            return [w * scale if layer else w for w, layer in zip(weights, layered, strict=True)]

        value, gradients = monadl.compute_gradients(
            first(*operands(1.0)) + second(*operands(0.75)), executor=EXECUTORS[batching]
        )
        results.append((value, [dense(gradients[w]) for w in weights]))
    (merged, merged_gradients), (alone, alone_gradients) = results
    assert_close(merged, alone, "merged calls' loss")
    for i, (a, b) in enumerate(zip(merged_gradients, alone_gradients, strict=True)):
        assert_close(a, b, f"merged calls' gradient of input {i}")


# ------------------------------------------------------------------------------------ the values


def real(rng: Rng, shape: tuple[int, ...], lo: float = -2.0, hi: float = 2.0) -> F64:
    return rng.uniform(lo, hi, shape)


def away(rng: Rng, shape: tuple[int, ...], lo: float = 0.2, hi: float = 2.0) -> F64:
    """Magnitudes in [lo, hi], either sign: away from 0 (the kinks of abs, relu, leaky_relu, elu)."""
    return real(rng, shape, lo, hi) * np.where(rng.uniform(size=shape) < 0.5, -1.0, 1.0)


def distinct(rng: Rng, shape: tuple[int, ...]) -> F64:
    """Distinct values at least 0.04 apart (no ties within a finite-difference step), shuffled."""
    n = math.prod(shape)
    spread = (rng.permutation(n) - n / 2.0) * 0.05 + rng.uniform(0.0, 0.01, n)
    return np.asarray(spread.reshape(shape), dtype=np.float64)


def off_grid(rng: Rng, shape: tuple[int, ...]) -> F64:
    """Values ``k / 2 + 0.25 + u`` (``|u| <= 0.1``): at least 0.15 from every multiple of 0.5."""
    return rng.integers(-6, 6, shape) / 2.0 + 0.25 + rng.uniform(-0.1, 0.1, shape)


def on_grid(rng: Rng, shape: tuple[int, ...]) -> F64:
    return np.asarray(rng.integers(-6, 6, shape) / 2.0, dtype=np.float64)


RNGS = st.integers(0, 2**32 - 1).map(np.random.default_rng)


@st.composite
def shapes(
    draw: st.DrawFn, min_dims: int = 0, max_dims: int = 3, max_side: int = 3, empty: bool = True
) -> tuple[int, ...]:
    """A shape of sides 1 to ``max_side``; one side 0 in about one case of eight (``empty``)."""
    sides = [draw(st.integers(1, max_side)) for _ in range(draw(st.integers(min_dims, max_dims)))]
    if empty and sides and draw(st.integers(0, 7)) == 0:
        sides[draw(st.integers(0, len(sides) - 1))] = 0
    return tuple(sides)


@st.composite
def broadcasting(draw: st.DrawFn, n: int, empty: bool = True, min_dims: int = 0) -> list[tuple[int, ...]]:
    """``n`` shapes that broadcast together: trailing parts of one shape, some sides made 1."""
    whole = draw(shapes(min_dims=min_dims, empty=empty))
    out = []
    for _ in range(n):
        kept = draw(st.integers(min(min_dims, len(whole)), len(whole)))
        part = [1 if draw(st.integers(0, 3)) == 0 else s for s in whole[len(whole) - kept :]]
        out.append(tuple(part))
    return out


def axis_spelling(draw: st.DrawFn, axis: int, ndim: int) -> int:
    """``axis`` counted from the start or from the end, drawn."""
    return axis - ndim if draw(st.booleans()) else axis


Draw = Callable[[st.DrawFn], Case]

# ----------------------------------------------------------------------------------- elementwise


def _torch_fn(name: str, **kwargs: Any) -> Callable[..., Any] | None:
    if torch is None:
        return None
    table: dict[str, Callable[..., Any]] = {
        "exp": torch.exp,
        "log": torch.log,
        "sqrt": torch.sqrt,
        "abs": torch.abs,
        "tanh": torch.tanh,
        "sigmoid": torch.sigmoid,
        "relu": torch.relu,
        "softplus": F.softplus,
        "gelu": lambda t: F.gelu(t, approximate="tanh"),
        "silu": F.silu,
        "leaky_relu": lambda t: F.leaky_relu(t, kwargs["negative_slope"]),
        "elu": lambda t: F.elu(t, kwargs["alpha"]),
        "clip": lambda t: torch.clamp(t, kwargs["lo"], kwargs["hi"]),
        "neg": operator.neg,
        "lift": lambda t: t * 1.0,
        "lift_array": lambda t: t * 1.0,
        "lift_float": lambda t: t * 1.0,
    }
    return table[name]


# name -> the values it is drawn on, and the operand kinds it takes
UNARY: dict[str, tuple[Callable[[Rng, tuple[int, ...]], F64], str]] = {
    "exp": (real, "any"),
    "log": (lambda rng, s: real(rng, s, 0.2, 3.0), "any"),
    "sqrt": (lambda rng, s: real(rng, s, 0.2, 3.0), "any"),
    "abs": (away, "any"),
    "tanh": (real, "any"),
    "sigmoid": (lambda rng, s: real(rng, s, -6.0, 6.0), "any"),
    "relu": (away, "any"),
    "softplus": (lambda rng, s: real(rng, s, -15.0, 15.0), "any"),
    "gelu": (lambda rng, s: real(rng, s, -4.0, 4.0), "any"),
    "silu": (lambda rng, s: real(rng, s, -4.0, 4.0), "any"),
    "leaky_relu": (away, "any"),
    "elu": (away, "any"),
    "clip": (off_grid, "any"),
    "neg": (real, "any"),
    "lift": (real, "any"),
    "lift_array": (real, "array"),
    "lift_float": (real, "float"),
}


def _unary(name: str) -> Draw:
    values, kinds = UNARY[name]

    def draw(d: st.DrawFn) -> Case:
        rng = d(RNGS)
        floating = kinds == "float" or (kinds == "any" and d(st.integers(0, 3)) == 0)
        x: Input = float(values(rng, ())) if floating else values(rng, d(shapes()))
        params: dict[str, Any] = {}
        default = d(st.integers(0, 3)) == 0  # the slope or alpha not given
        if name == "leaky_relu":
            params["negative_slope"] = 0.01 if default else d(st.floats(-0.5, 2.0))
        elif name == "elu":
            params["alpha"] = 1.0 if default else d(st.floats(0.1, 2.0))
        elif name == "clip":
            lo = d(st.integers(-4, 2)) / 2.0
            params["lo"] = -math.inf if d(st.integers(0, 5)) == 0 else lo
            params["hi"] = math.inf if d(st.integers(0, 5)) == 0 else lo + d(st.integers(1, 4)) / 2.0
        fn = operator.neg if name == "neg" else getattr(monadl, name)
        given = {} if default and name in ("leaky_relu", "elu") else params
        return Case(lambda w: fn(w, **given), (x,), _torch_fn(name, **params), given)  # (defaults: not given)

    return draw


def _const(x: Any) -> Any:
    """A constant operand of a PyTorch reference: a tensor (no gradient) for an array."""
    return torch.tensor(x) if isinstance(x, np.ndarray) else x


def _as_tensor(x: Any) -> Any:
    return x if isinstance(x, torch.Tensor) else torch.tensor(x, dtype=torch.float64)


# name -> monadl's spelling, PyTorch's, the values of the first operand, of the second
BINARY: dict[str, tuple[Callable[..., Any], Callable[..., Any], Any, Any]] = {
    "add": (operator.add, operator.add, real, real),
    "sub": (operator.sub, operator.sub, real, real),
    "mul": (operator.mul, operator.mul, real, real),
    "div": (operator.truediv, operator.truediv, real, lambda rng, s: away(rng, s, 0.5, 2.0)),
    "pow": (operator.pow, operator.pow, lambda rng, s: real(rng, s, 0.5, 2.0), real),
    "maximum": (monadl.maximum, lambda a, b: torch.maximum(_as_tensor(a), _as_tensor(b)), off_grid, on_grid),
    "minimum": (monadl.minimum, lambda a, b: torch.minimum(_as_tensor(a), _as_tensor(b)), off_grid, on_grid),
}
OPERAND_KINDS = ("weight", "weight", "constant")


def _binary(name: str) -> Draw:
    ours, theirs, values_a, values_b = BINARY[name]

    def draw(d: st.DrawFn) -> Case:
        rng = d(RNGS)
        floats = [d(st.integers(0, 3)) == 0 for _ in range(2)]
        kinds = [d(st.sampled_from(OPERAND_KINDS)) for _ in range(2)]
        if kinds == ["constant", "constant"]:
            kinds[d(st.integers(0, 1))] = "weight"
        shape_a, shape_b = d(broadcasting(2))
        a = float(values_a(rng, ())) if floats[0] else values_a(rng, shape_a)
        b = float(values_b(rng, ())) if floats[1] else values_b(rng, shape_b)
        if name in ("maximum", "minimum") and d(st.booleans()):  # the grid's operand first, as often
            a, b = b, a
        operands = [a, b]
        weighted = [k == "weight" for k in kinds]
        inputs = tuple(x for x, w in zip(operands, weighted, strict=True) if w)

        def fill(given: Sequence[Any], constant: Callable[[Any], Any]) -> list[Any]:
            it = iter(given)
            return [next(it) if w else constant(x) for x, w in zip(operands, weighted, strict=True)]

        def op(*weights: Any) -> Any:
            return ours(*fill(weights, lambda x: x))

        reference = None if torch is None else (lambda *ts: theirs(*fill(ts, _const)))
        return Case(op, inputs, reference, {"kinds": kinds, "floats": floats})

    return draw


def _pow_int(d: st.DrawFn) -> Case:
    """``x ** n`` of an int exponent: a base of any sign (away from 0 for a negative one)."""
    rng = d(RNGS)
    n = d(st.sampled_from([2, 3, -1, -2, 0, 1]))
    x: Input = float(away(rng, ())) if d(st.integers(0, 3)) == 0 else away(rng, d(shapes()))
    return Case(lambda w: w**n, (x,), None if torch is None else (lambda t: t**n), {"n": n})


# ---------------------------------------------------------------------------------------- matmul


@st.composite
def _matmul_shapes(draw: st.DrawFn) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Operands of a matrix product: 1 to 3 axes each, stacked axes that broadcast, any side 0."""
    k, m, n = (draw(st.integers(1, 3)) for _ in range(3))
    if draw(st.integers(0, 7)) == 0:
        k, m, n = draw(st.permutations([0, m, n]))
    ranks = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    batch = draw(broadcasting(2, empty=True))
    stacked = [b[-1:] if r == 3 else () for b, r in zip(batch, ranks, strict=True)]
    a = (*stacked[0], m, k) if ranks[0] >= 2 else (k,)
    b = (*stacked[1], k, n) if ranks[1] >= 2 else (k,)
    return a, b


def _matmul(spelling: str) -> Draw:
    fn: Callable[[Any, Any], Any] = {"matmul": monadl.matmul, "@": operator.matmul, "dot": monadl.dot}[
        spelling
    ]

    def draw(d: st.DrawFn) -> Case:
        rng = d(RNGS)
        shape_a, shape_b = d(_matmul_shapes())
        a, b = real(rng, shape_a), real(rng, shape_b)
        constant = d(st.sampled_from(["none", "none", "a", "b"]))
        if constant == "a":
            return Case(lambda w: fn(a, w), (b,), None if torch is None else (lambda t: _const(a) @ t))
        if constant == "b":
            return Case(lambda w: fn(w, b), (a,), None if torch is None else (lambda t: t @ _const(b)))
        return Case(fn, (a, b), None if torch is None else torch.matmul)

    return draw


def _linear(d: st.DrawFn) -> Case:
    rng = d(RNGS)
    k, n = d(st.integers(1, 3)), d(st.integers(1, 3))
    x, w = real(rng, (*d(shapes(0, 2)), k)), real(rng, (k, n))
    bias = d(st.sampled_from(["array", "array", "float", "array constant", "float constant"]))
    b: Input = real(rng, (n,)) if bias.startswith("array") else float(real(rng, ()))
    weighted = [d(st.integers(0, 3)) > 0, True, not bias.endswith("constant")]  # x, w, b

    def fill(given: Sequence[Any], constant: Callable[[Any], Any]) -> list[Any]:
        it = iter(given)
        return [next(it) if k else constant(v) for v, k in zip((x, w, b), weighted, strict=True)]

    reference = None
    if torch is not None:

        def reference(*ts: Any) -> Any:
            x_, w_, b_ = fill(ts, _const)
            return x_ @ w_ + b_

    inputs = tuple(v for v, k in zip((x, w, b), weighted, strict=True) if k)
    return Case(
        lambda *ws: monadl.linear(*fill(ws, lambda v: v)),
        inputs,
        reference,
        {"bias": bias, "weighted": weighted},
    )


# ------------------------------------------------------------------------------------ reductions


def _torch_reduction(name: str, axes: tuple[int, ...] | None, keepdims: bool, correction: float) -> Any:
    if torch is None:
        return None

    def reference(t: Any) -> Any:
        dims = tuple(range(t.ndim)) if axes is None else axes
        if name in ("sum", "mean"):
            return (
                getattr(torch, name)(t)
                if axes is None
                else getattr(torch, name)(t, dim=dims, keepdim=keepdims)
            )
        if name in ("max", "min"):
            return (torch.amax if name == "max" else torch.amin)(t, dim=dims, keepdim=keepdims)
        if name == "logsumexp":
            return torch.logsumexp(t, dim=dims, keepdim=keepdims)
        return getattr(torch, name)(t, dim=dims, correction=correction, keepdim=keepdims)

    return reference


def _reduction(name: str) -> Draw:
    def draw(d: st.DrawFn) -> Case:
        rng = d(RNGS)
        ndim = d(st.integers(0 if name in ("sum", "mean") else 1, 3))
        shape = [d(st.integers(1, 3)) for _ in range(ndim)]
        whole = ndim == 0 or d(st.integers(0, 3)) == 0
        axes = None if whole else tuple(d(st.permutations(range(ndim)))[: d(st.integers(1, ndim))])
        keepdims = not whole and d(st.booleans())
        reduced = range(ndim) if axes is None else axes
        empty_ok = [a for a in range(ndim) if name == "sum" or a not in reduced]
        if empty_ok and d(st.integers(0, 7)) == 0:
            shape[d(st.sampled_from(empty_ok))] = 0
        correction = 0.0
        if name in ("var", "std"):
            count = math.prod(shape[a] for a in reduced)
            correction = d(st.sampled_from([c for c in (0.0, 0.5, 1.0) if c < count]))
        x = distinct(rng, tuple(shape)) if name in ("max", "min") else real(rng, tuple(shape))
        kwargs: dict[str, Any] = {"correction": correction} if name in ("var", "std") else {}
        axis: Any = None
        if axes is not None:
            spelled = tuple(axis_spelling(d, a, ndim) for a in axes)
            axis = spelled[0] if len(spelled) == 1 and d(st.booleans()) else spelled
            kwargs["keepdims"] = keepdims
        fn = getattr(monadl, name)
        params = {"axis": axis, **kwargs}
        return Case(
            lambda w: fn(w, axis, **kwargs), (x,), _torch_reduction(name, axes, keepdims, correction), params
        )

    return draw


# ---------------------------------------------------------------------------- softmax and losses


def _softmax(name: str) -> Draw:
    def draw(d: st.DrawFn) -> Case:
        rng = d(RNGS)
        x = real(rng, d(shapes(1, 3)), -3.0, 3.0)
        axis = axis_spelling(d, d(st.integers(0, x.ndim - 1)), x.ndim)
        fn = getattr(monadl, name)
        reference = None if torch is None else (lambda t: getattr(torch, name)(t, dim=axis))
        if d(st.integers(0, 3)) == 0 and axis in (-1, x.ndim - 1):
            return Case(lambda w: fn(w), (x,), reference, {"axis": "default"})
        return Case(lambda w: fn(w, axis=axis), (x,), reference, {"axis": axis})

    return draw


def _cross_entropy(d: st.DrawFn) -> Case:
    rng = d(RNGS)
    rows, classes = d(shapes(0, 2, empty=False)), d(st.integers(1, 4))  # (no rows: a ShapeError)
    logits = real(rng, (*rows, classes), -3.0, 3.0)
    kind = d(st.sampled_from(["labels", "labels", "one-hot", "soft"]))
    as_int = not rows and d(st.booleans())

    def draw_targets() -> Any:
        labels = rng.integers(0, classes, rows)
        if kind == "labels":
            return int(labels) if as_int else np.asarray(labels, dtype=np.int64)
        if kind == "one-hot":
            return np.eye(classes)[labels]
        return rng.dirichlet(np.ones(classes), size=rows)

    targets, other = draw_targets(), draw_targets()  # the second: the other call's
    reference = None
    if torch is not None:

        def reference(t: Any) -> Any:
            flat = torch.tensor(np.reshape(targets, (-1,) if kind == "labels" else (-1, classes)))
            return F.cross_entropy(t.reshape(-1, classes), flat)

    return Case(
        lambda w: monadl.cross_entropy(w, targets),
        (logits,),
        reference,
        {"targets": kind},
        lambda w: monadl.cross_entropy(w, other),
    )


# ---------------------------------------------------------------------------------------- shapes


def _reshape(d: st.DrawFn) -> Case:
    rng = d(RNGS)
    x = real(rng, d(shapes()))
    new = list(d(st.permutations([*x.shape, 1])))
    unknown = d(st.booleans())  # one side given as -1
    if x.size and unknown:
        new[d(st.integers(0, len(new) - 1))] = -1
    target = tuple(new)
    return Case(
        lambda w: monadl.reshape(w, target),
        (x,),
        None if torch is None else (lambda t: t.reshape(target)),
        {"shape": target},
    )


def _transpose(d: st.DrawFn) -> Case:
    rng = d(RNGS)
    x = real(rng, d(shapes()))
    if d(st.integers(0, 3)) == 0:
        reversed_axes = tuple(reversed(range(x.ndim)))
        return Case(
            lambda w: monadl.transpose(w),
            (x,),
            None if torch is None else (lambda t: t.permute(reversed_axes)),
            {"axes": None},
        )
    axes = tuple(axis_spelling(d, a, x.ndim) for a in d(st.permutations(range(x.ndim))))
    return Case(
        lambda w: monadl.transpose(w, axes),
        (x,),
        None if torch is None else (lambda t: t.permute(axes)),
        {"axes": axes},
    )


def _joined(d: st.DrawFn, new_axis: bool) -> tuple[list[F64], list[bool], int, int]:
    """Operands of concatenate (sides along the axis drawn, 0 included) or stack (one shape),
    which of them are weights, the axis and its rank."""
    rng = d(RNGS)
    shape = list(d(shapes(0 if new_axis else 1, 3)))
    ndim = len(shape) + (1 if new_axis else 0)
    axis = d(st.integers(0, ndim - 1))
    xs = []
    for _ in range(d(st.integers(1, 3))):
        if not new_axis:
            shape[axis] = d(st.integers(0, 3))
        xs.append(real(rng, tuple(shape)))
    weighted = [d(st.integers(0, 3)) > 0 for _ in xs]
    if not any(weighted):
        weighted[0] = True
    return xs, weighted, axis_spelling(d, axis, ndim), ndim


def _sequence_op(name: str) -> Draw:
    fn, theirs = {"concatenate": (monadl.concatenate, "cat"), "stack": (monadl.stack, "stack")}[name]

    def draw(d: st.DrawFn) -> Case:
        xs, weighted, axis, _ = _joined(d, name == "stack")

        def fill(given: Sequence[Any], constant: Callable[[Any], Any]) -> list[Any]:
            it = iter(given)
            return [next(it) if w else constant(x) for x, w in zip(xs, weighted, strict=True)]

        default = axis == 0 and d(st.booleans())  # axis 0 not given

        def op(*weights: Any) -> Any:
            return fn(fill(weights, lambda x: x)) if default else fn(fill(weights, lambda x: x), axis=axis)

        reference = (
            None if torch is None else (lambda *ts: getattr(torch, theirs)(fill(ts, _const), dim=axis))
        )
        inputs = tuple(x for x, w in zip(xs, weighted, strict=True) if w)
        return Case(op, inputs, reference, {"axis": axis, "weighted": weighted})

    return draw


def _split(d: st.DrawFn) -> Case:
    rng = d(RNGS)
    x = real(rng, d(shapes(1, 3)))
    axis = d(st.integers(0, x.ndim - 1))
    n = x.shape[axis]
    sections: int | list[int]
    if d(st.booleans()):
        sections = d(st.sampled_from([k for k in range(1, max(n, 1) + 1) if n % k == 0] if n else [1, 2]))
    else:
        sections = d(st.lists(st.integers(0, n + 1), max_size=3))
    spelled = axis_spelling(d, axis, x.ndim)
    default = axis == 0 and d(st.booleans())  # axis 0 not given
    given: Any = (
        np.asarray(sections, dtype=np.int64) if isinstance(sections, list) and d(st.booleans()) else sections
    )
    pieces = np.split(x, sections, axis=axis)
    weightings = [probe(p.shape, k) for k, p in enumerate(pieces)]

    def op(w: Any) -> Any:
        parts = monadl.split(w, given) if default else monadl.split(w, given, axis=spelled)
        assert len(parts) == len(pieces)
        return monadl.add_n([monadl.sum(p * q) for p, q in zip(parts, weightings, strict=True)])

    reference = None
    if torch is not None:

        def reference(t: Any) -> Any:
            parts = torch.tensor_split(t, sections, dim=spelled)
            return sum((p * torch.tensor(q)).sum() for p, q in zip(parts, weightings, strict=True))

    return Case(op, (x,), reference, {"sections": sections, "axis": spelled})


def _add_n(d: st.DrawFn) -> Case:
    rng = d(RNGS)
    count = d(st.integers(1, 4))
    if d(st.integers(0, 4)) == 0:  # floats: a FloatLayer
        xs: list[Input] = [float(real(rng, ())) for _ in range(count)]
    else:
        xs = [real(rng, s) for s in d(broadcasting(count))]
    reference = None if torch is None else (lambda *ts: sum(ts[1:], ts[0]))
    return Case(lambda *ws: monadl.add_n(list(ws)), tuple(xs), reference, {"count": count})


# --------------------------------------------------------------------------------------- gathers


def _indexed(key: Any, shape: tuple[int, ...]) -> Any:
    """PyTorch's reference of ``x[key]`` (NumPy's indexing): the flat positions ``key`` picks,
    taken from the tensor (PyTorch has no negative steps)."""
    positions = np.arange(math.prod(shape)).reshape(shape)[key]
    return lambda t: torch.take(t, torch.tensor(np.array(positions)))


def _take_rows(d: st.DrawFn) -> Case:
    rng = d(RNGS)
    rows = d(st.integers(1, 4))
    table = real(rng, (rows, *d(shapes(0, 2))))
    form = d(st.sampled_from(["int", "list", "array", "array"]))
    indices: Any
    if form == "int":
        indices = d(st.integers(0, rows - 1))
    elif form == "list":
        indices = d(st.lists(st.integers(0, rows - 1), max_size=4))
    else:
        indices = rng.integers(0, rows, d(shapes(0, 2)))
    reference = None if torch is None else _indexed(np.asarray(indices, dtype=np.int64), table.shape)
    other = (rng.integers(0, rows, np.shape(indices)) + 1) % rows  # the second call's rows
    others: Any = int(other) if form == "int" else other.tolist() if form == "list" else other
    return Case(
        lambda w: monadl.take_rows(w, indices),
        (table,),
        reference,
        {"indices": form},
        lambda w: monadl.take_rows(w, others),
    )


def _basic_key(d: st.DrawFn, shape: tuple[int, ...]) -> tuple[Any, ...]:
    """A key of basic indexing that fits ``shape``: ints in range, slices of any bounds and steps,
    None anywhere, and one ``...`` or none (the entries after it index the last axes)."""
    count = d(st.integers(0, len(shape)))  # the axes indexed
    split = d(st.integers(0, count)) if d(st.booleans()) else count  # where the ... goes, if any
    parts: list[list[Any]] = [[], []]
    for j, a in enumerate([*range(split), *range(len(shape) - (count - split), len(shape))]):
        part = parts[0 if j < split else 1]
        n = shape[a]
        if d(st.integers(0, 4)) == 0:
            part.append(None)  # (a new axis: it indexes none)
        if n and d(st.integers(0, 2)) == 0:
            part.append(d(st.integers(-n, n - 1)))
        else:
            bound = st.one_of(st.none(), st.integers(-4, 4))
            part.append(slice(d(bound), d(bound), d(st.sampled_from([None, 1, 2, -1, -2]))))
    if split < count or d(st.booleans()):
        return (*parts[0], Ellipsis, *parts[1])
    return tuple(parts[0])


def _getitem(d: st.DrawFn) -> Case:
    rng = d(RNGS)
    x = real(rng, d(shapes(1, 3)))
    key: Any = _basic_key(d, x.shape)
    if len(key) == 1 and (type(key[0]) is slice or key[0] is Ellipsis) and d(st.booleans()):
        key = key[0]  # a slice or ... alone, not in a tuple
    reference = None if torch is None else _indexed(key, x.shape)
    return Case(lambda w: w[key], (x,), reference, {"key": key})


def _getitem_arrays(d: st.DrawFn) -> Case:
    rng = d(RNGS)
    x = real(rng, d(shapes(1, 3, empty=False)))
    before = d(st.integers(0, x.ndim - 1))
    keys: list[list[Any]] = [[slice(None)] * before, [slice(None)] * before]  # the second: the other call's
    if d(st.integers(0, 3)) == 0:  # a boolean mask of the next axes (the other: as many True)
        m = d(st.integers(1, x.ndim - before))
        mask = rng.uniform(size=x.shape[before : before + m]) < 0.5
        keys[0].append(mask)
        keys[1].append(rng.permutation(mask.reshape(-1)).reshape(mask.shape))
    else:
        arrays = d(st.integers(1, x.ndim - before))
        index_shapes = d(broadcasting(arrays, empty=True))
        listed = d(st.integers(0, 3)) == 0
        for j, shape in enumerate(index_shapes):
            n = x.shape[before + j]
            for key in keys:
                index: Any = rng.integers(-n, n, shape)
                key.append(index.tolist() if index.ndim == 1 and listed else index)
        if d(st.integers(0, 3)) == 0:
            for key in keys:
                key.append(Ellipsis)
    k, other = tuple(keys[0]), tuple(keys[1])
    reference = None if torch is None else _indexed(k, x.shape)
    return Case(lambda w: w[k], (x,), reference, {"key": k}, lambda w: w[other])


def _take_along_axis(d: st.DrawFn) -> Case:
    rng = d(RNGS)
    ndim = d(st.integers(1, 3))
    axis = d(st.integers(0, ndim - 1))
    x_shape, i_shape = [], []
    for a in range(ndim):
        side = d(st.integers(1, 3))
        if a == axis:
            x_shape.append(side)
            i_shape.append(d(st.integers(0, 3)))
        else:
            which = d(st.integers(0, 3))  # x broadcast, the indices broadcast, or neither
            x_shape.append(1 if which == 0 else side)
            i_shape.append(1 if which == 1 else side)
    x = real(rng, tuple(x_shape))
    indices = rng.integers(0, x_shape[axis], tuple(i_shape))
    spelled = axis_spelling(d, axis, ndim)
    reference = None
    if torch is not None:

        def reference(t: Any) -> Any:
            return torch.take_along_dim(t, torch.tensor(indices), dim=spelled)

    other = rng.integers(0, x_shape[axis], tuple(i_shape))  # the second call's
    if d(st.integers(0, 4)) == 0 and spelled in (-1, ndim - 1):
        return Case(
            lambda w: monadl.take_along_axis(w, indices),
            (x,),
            reference,
            {"axis": "default"},
            lambda w: monadl.take_along_axis(w, other),
        )
    return Case(
        lambda w: monadl.take_along_axis(w, indices, axis=spelled),
        (x,),
        reference,
        {"axis": spelled},
        lambda w: monadl.take_along_axis(w, other, axis=spelled),
    )


def _where(d: st.DrawFn) -> Case:
    rng = d(RNGS)
    shape_c, shape_a, shape_b = d(broadcasting(3))
    condition: Any = rng.uniform(size=shape_c) < 0.5
    floats = [d(st.integers(0, 3)) == 0 for _ in range(2)]
    operands: list[Input] = [
        float(real(rng, ())) if f else real(rng, s) for f, s in zip(floats, (shape_a, shape_b), strict=True)
    ]
    kinds = [d(st.sampled_from(OPERAND_KINDS)) for _ in range(2)]
    if kinds == ["constant", "constant"]:
        kinds[d(st.integers(0, 1))] = "weight"
    weighted = [k == "weight" for k in kinds]
    if all(floats) and condition.ndim == 0 and d(st.booleans()):
        condition = np.bool_(condition)  # a NumPy bool: a 0-d condition

    def fill(given: Sequence[Any], constant: Callable[[Any], Any]) -> list[Any]:
        it = iter(given)
        return [next(it) if w else constant(x) for x, w in zip(operands, weighted, strict=True)]

    reference = None
    if torch is not None:

        def reference(*ts: Any) -> Any:
            a, b = (_as_tensor(v) for v in fill(ts, _const))
            return torch.where(torch.tensor(np.asarray(condition)), a, b)

    inputs = tuple(x for x, w in zip(operands, weighted, strict=True) if w)
    other = ~condition  # the second call's
    return Case(
        lambda *ws: monadl.where(condition, *fill(ws, lambda x: x)),
        inputs,
        reference,
        {"kinds": kinds},
        lambda *ws: monadl.where(other, *fill(ws, lambda x: x)),
    )


# --------------------------------------------------------------------------- convolution, pooling


def _torch_batched(t: Any, spatial: int, fn: Callable[[Any], Any], channels: bool) -> Any:
    """``fn`` of ``t`` (..., [C,] *spatial) with its leading axes as one batch axis, restored after."""
    kept = spatial + (1 if channels else 0)
    lead = tuple(t.shape[: t.ndim - kept])
    x = t.reshape(
        math.prod(lead), *(t.shape[t.ndim - kept :] if channels else (1, *t.shape[t.ndim - kept :]))
    )
    out = fn(x)
    return out.reshape(*lead, *(out.shape[1:] if channels else out.shape[2:]))


KERNELS = st.sampled_from([3, 2, 1, 3])
"""Kernel sides: 3 as often as 1 and 2 together (the side where padding 1 is below half)."""


def _side(d: st.DrawFn, kernel: int, stride: int, dilation: int, pad: int) -> int:
    """An input side that holds one window at least: one on which the windows (of ``stride``)
    end exactly at the padded input's end, or exactly at the unpadded input's end (then the padding
    adds none or some), or any (the windows leave some of it out)."""
    reach = dilation * (kernel - 1) + 1
    windows = d(st.integers(1, 3))
    fit = d(st.sampled_from(["padded", "unpadded", "any", "padded", "unpadded"]))
    if fit == "padded":
        n = (windows - 1) * stride + reach - 2 * pad
    elif fit == "unpadded":
        n = (windows - 1) * stride + reach
    else:
        n = (windows - 1) * stride + reach - 2 * pad + d(st.integers(0, 2 * stride))
    return n if n >= 1 else max(1, reach - 2 * pad)


def _conv(spatial: int) -> Draw:
    def draw(d: st.DrawFn) -> Case:
        rng = d(RNGS)
        groups = d(st.integers(1, 3))
        cg, og = d(st.integers(1, 2 if groups < 3 else 1)), d(st.integers(1, 2))
        c, o = groups * cg, groups * og
        kernel = tuple(d(KERNELS) for _ in range(spatial))
        dilation = tuple(d(st.sampled_from([1, 2, 1])) for _ in range(spatial))
        tiled = d(st.booleans())  # stride = kernel: windows that may tile the (padded) input
        stride = kernel if tiled else tuple(d(st.integers(1, 3)) for _ in range(spatial))
        padding_form = d(st.sampled_from(["int", "ints", "ints", "same", "valid"]))
        if padding_form == "same" and any(s != 1 for s in stride):
            padding_form = "ints"
        pads = tuple(d(st.integers(0, 2)) for _ in range(spatial))
        if padding_form == "int":
            pads = (pads[0],) * spatial
        elif padding_form in ("same", "valid"):
            pads = (0,) * spatial
        if padding_form == "same":  # (its padding, for the sides: the total, split)
            sizes = [_side(d, k, 1, r, (r * (k - 1)) // 2) for k, r in zip(kernel, dilation, strict=True)]
        else:
            sizes = [_side(d, *kdp) for kdp in zip(kernel, stride, dilation, pads, strict=True)]
        lead = d(st.sampled_from([(), (1,), (2,), (2,), (0,), (2, 1)]))
        x = real(rng, (*lead, c, *sizes))
        w = real(rng, (o, cg, *kernel))
        bias = d(st.sampled_from(["array", "array", "none", "float weight", "float"]))
        b: Input = real(rng, (o,)) if bias == "array" else float(real(rng, ()))
        padding: Any = padding_form if padding_form in ("same", "valid") else pads
        if padding_form == "int":
            padding = pads[0]
        kwargs: dict[str, Any] = {"padding": padding}  # stride, dilation and groups: given or default
        if stride != (1,) * spatial or d(st.booleans()):
            kwargs["stride"] = stride[0] if spatial == 1 and d(st.booleans()) else stride
        if dilation != (1,) * spatial or d(st.booleans()):
            kwargs["dilation"] = dilation[0] if spatial == 1 and d(st.booleans()) else dilation
        if groups > 1 or d(st.booleans()):
            kwargs["groups"] = groups
        fn = monadl.conv1d if spatial == 1 else monadl.conv2d
        inputs: tuple[Input, ...] = (x, w) if bias in ("none", "float") else (x, w, b)

        def op(*ws: Any) -> Any:
            bias_operand = ws[2] if len(ws) == 3 else (b if bias == "float" else None)
            return fn(ws[0], ws[1], bias_operand, **kwargs)

        reference = None
        if torch is not None:
            conv_t = F.conv1d if spatial == 1 else F.conv2d
            torch_padding = padding_form if padding_form in ("same", "valid") else pads

            def reference(*ts: Any) -> Any:
                if bias == "none":
                    bias_t = None
                elif bias == "float":
                    bias_t = torch.full((o,), b, dtype=torch.float64)
                else:
                    bias_t = ts[2].reshape(-1).expand(o)
                return _torch_batched(
                    ts[0],
                    spatial,
                    lambda t: conv_t(t, ts[1], bias_t, stride, torch_padding, dilation, groups),
                    True,
                )

        return Case(op, inputs, reference, {**kwargs, "bias": bias, "lead": lead})

    return draw


def _pool(name: str) -> Draw:
    spatial = int(name[-2])
    fn = getattr(monadl, name)

    def draw(d: st.DrawFn) -> Case:
        rng = d(RNGS)
        kernel = tuple(d(KERNELS) for _ in range(spatial))
        tiled = d(st.booleans())  # no stride given: the kernel's
        stride = kernel if tiled else tuple(d(st.integers(1, 3)) for _ in range(spatial))
        pads = tuple(d(st.integers(0, k // 2)) for k in kernel)
        sizes = tuple(_side(d, k, s, 1, p) for k, s, p in zip(kernel, stride, pads, strict=True))
        lead: tuple[int, ...] = d(st.sampled_from([(), (1,), (2,), (2, 1), (1, 2), (0,), (2, 0)]))
        shape = (*lead, *sizes)
        x = distinct(rng, shape) if name.startswith("max") else real(rng, shape)
        kwargs: dict[str, Any] = {}
        if not tiled or d(st.booleans()):
            kwargs["stride"] = stride[0] if spatial == 1 and d(st.booleans()) else stride
        if any(pads) or d(st.booleans()):
            kwargs["padding"] = pads[0] if len(set(pads)) == 1 and d(st.booleans()) else pads
        ks: Any = kernel[0] if len(set(kernel)) == 1 and d(st.booleans()) else kernel
        reference = None
        if torch is not None and 0 not in lead:  # (PyTorch's pooling refuses an empty batch)
            pool_t = getattr(F, name)

            def reference(t: Any) -> Any:
                return _torch_batched(t, spatial, lambda u: pool_t(u, kernel, stride, pads), False)

        return Case(
            lambda w: fn(w, ks, **kwargs), (x,), reference, {"kernel_size": ks, **kwargs, "lead": lead}
        )

    return draw


def _conv_transpose(d: st.DrawFn) -> Case:
    rng = d(RNGS)
    groups = d(st.integers(1, 3))
    cg, og = d(st.integers(1, 2 if groups < 3 else 1)), d(st.integers(1, 2))
    c, o = groups * cg, groups * og
    kernel = tuple(d(KERNELS) for _ in range(2))
    stride = tuple(d(st.integers(1, 3)) for _ in range(2))
    dilation = tuple(d(st.sampled_from([1, 2, 1])) for _ in range(2))
    extra = tuple(d(st.integers(0, max(s, r) - 1)) for s, r in zip(stride, dilation, strict=True))
    pads = tuple(d(st.integers(0, 2)) for _ in range(2))
    sizes = []
    for k, s, r, p, e in zip(kernel, stride, dilation, pads, extra, strict=True):
        least = 1  # an input side whose output has one element at least: (n - 1) s + r (k - 1) + e + 1 > 2p
        while (least - 1) * s + r * (k - 1) + e + 1 - 2 * p < 1:
            least += 1
        sizes.append(least + d(st.integers(0, 2)))
    lead = d(st.sampled_from([(), (1,), (2,), (2,), (0,), (2, 1)]))
    x = real(rng, (*lead, c, *sizes))
    w = real(rng, (c, og, *kernel))
    bias = d(st.sampled_from(["array", "array", "none", "float weight", "float"]))
    b: Input = real(rng, (o,)) if bias == "array" else float(real(rng, ()))
    kwargs: dict[str, Any] = {}  # each given, as one int or a pair, or left at its default
    for name, value, default in (
        ("stride", stride, (1, 1)),
        ("padding", pads, (0, 0)),
        ("output_padding", extra, (0, 0)),
        ("dilation", dilation, (1, 1)),
    ):
        if value != default or d(st.booleans()):
            kwargs[name] = value[0] if value[0] == value[1] and d(st.booleans()) else value
    if groups > 1 or d(st.booleans()):
        kwargs["groups"] = groups
    inputs: tuple[Input, ...] = (x, w) if bias in ("none", "float") else (x, w, b)

    def op(*ws: Any) -> Any:
        bias_operand = ws[2] if len(ws) == 3 else (b if bias == "float" else None)
        return monadl.conv_transpose2d(ws[0], ws[1], bias_operand, **kwargs)

    reference = None
    if torch is not None and 0 not in lead:  # (PyTorch's transposed convolution refuses no rows)

        def reference(*ts: Any) -> Any:
            if bias == "none":
                bias_t = None
            elif bias == "float":
                bias_t = torch.full((o,), b, dtype=torch.float64)
            else:
                bias_t = ts[2].reshape(-1).expand(o)
            return _torch_batched(
                ts[0],
                2,
                lambda t: F.conv_transpose2d(t, ts[1], bias_t, stride, pads, extra, groups, dilation),
                True,
            )

    return Case(op, inputs, reference, {**kwargs, "bias": bias, "lead": lead})


def _adaptive_avg_pool(d: st.DrawFn) -> Case:
    rng = d(RNGS)
    sides = (d(st.integers(1, 5)), d(st.integers(1, 5)))
    lead: tuple[int, ...] = d(st.sampled_from([(), (1,), (2,), (2, 1), (1, 2), (0,)]))
    x = real(rng, (*lead, *sides))
    form = d(st.sampled_from(["int", "pair", "pair", "divides", "none"]))
    size: Any
    if form == "int":
        size = d(st.integers(1, 5))
    elif form == "divides":  # equal windows that tile the input (a global pool among them)
        size = tuple(d(st.sampled_from([k for k in range(1, n + 1) if n % k == 0])) for n in sides)
    else:
        size = (d(st.integers(1, 5)), d(st.integers(1, 5)))
        if form == "none":
            size = (None, size[1]) if d(st.booleans()) else (size[0], None)
    reference = None
    if torch is not None and 0 not in lead:

        def reference(t: Any) -> Any:
            return _torch_batched(t, 2, lambda u: F.adaptive_avg_pool2d(u, size), False)

    return Case(
        lambda w: monadl.adaptive_avg_pool2d(w, size), (x,), reference, {"output_size": size, "lead": lead}
    )


def _pad(d: st.DrawFn) -> Case:
    rng = d(RNGS)
    mode = d(st.sampled_from(["constant", "constant", "reflect", "replicate", "circular"]))
    padded = d(st.integers(0 if mode == "constant" else 1, 3))
    lead = d(shapes(0, 2, empty=mode == "constant"))
    sides = [d(st.integers(0 if mode == "constant" else 1, 3)) for _ in range(padded)]
    widths: list[int] = []
    for n in reversed(sides):  # PyTorch's order: the last axis first
        for _ in range(2):
            if mode == "constant":
                widths.append(d(st.integers(-n, 2)) if d(st.booleans()) else d(st.integers(0, 2)))
            elif mode == "reflect":
                widths.append(d(st.integers(0, n - 1)))
            elif mode == "circular":
                widths.append(d(st.integers(0, n)))
            else:
                widths.append(d(st.integers(0, 2)))
        if mode == "constant" and widths[-1] + widths[-2] < -n:  # (both sides cut: at most the side)
            widths[-1] = -n - widths[-2]
    x = real(rng, (*lead, *sides))
    value = d(st.sampled_from([0.0, 0.0, 1.5, -0.5])) if mode == "constant" else 0.0
    kwargs: dict[str, Any] = {} if mode == "constant" and d(st.booleans()) else {"mode": mode}
    if value:
        kwargs["value"] = value
    reference = None
    if torch is not None and (mode == "constant" or (widths and 0 not in lead)):

        def reference(t: Any) -> Any:
            if mode == "constant":
                return F.pad(t, widths, value=value) if widths else t * 1.0
            # PyTorch's other modes take (batch, channels, *padded) only: the leading axes as one
            u = t.reshape(1, -1, *t.shape[t.ndim - padded :])
            out = F.pad(u, widths, mode=mode)
            return out.reshape(*t.shape[: t.ndim - padded], *out.shape[2:])

    return Case(lambda w: monadl.pad(w, widths, **kwargs), (x,), reference, {"pad": widths, **kwargs})


def _flatten(d: st.DrawFn) -> Case:
    rng = d(RNGS)
    x = real(rng, d(shapes(0, 4)))
    n = max(x.ndim, 1)
    start = d(st.integers(0, n - 1))
    end = d(st.integers(start, n - 1))
    spelled = (axis_spelling(d, start, n), axis_spelling(d, end, n))
    reference = None if torch is None else (lambda t: torch.flatten(t, *spelled))
    if spelled == (0, -1) and d(st.booleans()):
        return Case(lambda w: monadl.flatten(w), (x,), reference, {"dims": "default"})
    return Case(lambda w: monadl.flatten(w, *spelled), (x,), reference, {"dims": spelled})


# -------------------------------------------------------------------------------- normalisation


def _layer_norm(d: st.DrawFn) -> Case:
    rng = d(RNGS)
    x = real(rng, d(shapes(1, 3)))
    n = x.shape[-1]
    affine = d(st.sampled_from(["none", "both", "both", "weight", "bias"]))
    eps = d(st.sampled_from([1e-5, 0.1, 1.0]))
    weight, bias = real(rng, (n,)), real(rng, (n,))
    inputs: tuple[Input, ...] = {
        "none": (x,),
        "both": (x, weight, bias),
        "weight": (x, weight),
        "bias": (x, bias),
    }[affine]

    def op(*ws: Any) -> Any:
        w = ws[1] if affine in ("both", "weight") else None
        b = ws[-1] if affine in ("both", "bias") else None
        return monadl.layer_norm(ws[0], w, b, eps=eps) if eps != 1e-5 else monadl.layer_norm(ws[0], w, b)

    reference = None
    if torch is not None:

        def reference(*ts: Any) -> Any:
            w = ts[1] if affine in ("both", "weight") else None
            b = ts[-1] if affine in ("both", "bias") else None
            return F.layer_norm(ts[0], (n,), w, b, eps)

    return Case(op, inputs, reference, {"affine": affine, "eps": eps})


def _batch_norm(d: st.DrawFn) -> Case:
    rng = d(RNGS)
    channels = d(st.integers(1, 3))
    spatial = d(shapes(0, 3, max_side=2, empty=False))
    batch = d(st.integers(1, 3))
    x = real(rng, (batch, channels, *spatial))
    gamma, beta = real(rng, (channels,)), real(rng, (channels,))
    eps = d(st.sampled_from([1e-5, 0.1]))
    reference = None
    if torch is not None and batch * math.prod(spatial) > 1:  # (PyTorch refuses one value per channel)

        def reference(t: Any, g: Any, b: Any) -> Any:
            return F.batch_norm(t, None, None, g, b, training=True, eps=eps)

    return Case(
        lambda t, g, b: monadl.batch_norm(t, g, b) if eps == 1e-5 else monadl.batch_norm(t, g, b, eps=eps),
        (x, gamma, beta),
        reference,
        {"eps": eps},
    )


def _group_norm(d: st.DrawFn) -> Case:
    rng = d(RNGS)
    groups = d(st.integers(1, 3))
    channels = groups * d(st.integers(1, 2))
    lead = d(shapes(0, 2, max_side=2, empty=False))
    rest = d(shapes(0, 2, max_side=3, empty=False))
    x = real(rng, (*lead, channels, *rest))
    axis = axis_spelling(d, len(lead), x.ndim)
    affine = d(st.sampled_from(["none", "both", "both", "weight", "bias"]))
    eps = d(st.sampled_from([1e-5, 0.1]))
    weight, bias = real(rng, (channels,)), real(rng, (channels,))
    inputs: tuple[Input, ...] = {
        "none": (x,),
        "both": (x, weight, bias),
        "weight": (x, weight),
        "bias": (x, bias),
    }[affine]
    kwargs: dict[str, Any] = {} if axis == 1 and d(st.booleans()) else {"axis": axis}
    if eps != 1e-5:
        kwargs["eps"] = eps

    def op(*ws: Any) -> Any:
        w = ws[1] if affine in ("both", "weight") else None
        b = ws[-1] if affine in ("both", "bias") else None
        return monadl.group_norm(ws[0], groups, w, b, **kwargs)

    reference = None
    if torch is not None and math.prod(rest) * channels // groups > 1:  # (PyTorch: a group of 2 or more)

        def reference(*ts: Any) -> Any:
            w = ts[1] if affine in ("both", "weight") else torch.ones(channels, dtype=torch.float64)
            b = ts[-1] if affine in ("both", "bias") else None
            out = F.group_norm(ts[0].reshape(-1, channels, *rest), groups, w, b, eps)
            return out.reshape(ts[0].shape)

    return Case(op, inputs, reference, {"groups": groups, "affine": affine, **kwargs})


def _rms_norm(d: st.DrawFn) -> Case:
    rng = d(RNGS)
    lead = d(shapes(0, 2, max_side=2))
    normalized = d(shapes(1, 2, max_side=3, empty=False))
    x = real(rng, (*lead, *normalized))
    eps = d(st.sampled_from([None, None, 1e-5, 0.1]))
    weighted = d(st.integers(0, 3)) > 0
    given: Any = normalized[0] if len(normalized) == 1 and d(st.booleans()) else normalized
    kwargs: dict[str, Any] = {} if eps is None else {"eps": eps}

    def op(*ws: Any) -> Any:
        return monadl.rms_norm(ws[0], given, ws[1] if weighted else None, **kwargs)

    reference = None
    if torch is not None:

        def reference(*ts: Any) -> Any:
            return F.rms_norm(ts[0], normalized, ts[1] if weighted else None, eps)

    inputs: tuple[Input, ...] = (x, real(rng, normalized)) if weighted else (x,)
    return Case(op, inputs, reference, {"shape": given, "weighted": weighted, **kwargs})


# ------------------------------------------------------------------------------------- attention


def _heads_split(t: Any, heads: int) -> Any:
    """(..., L, heads * d) as (..., heads, L, d)."""
    return t.reshape(*t.shape[:-1], heads, t.shape[-1] // heads).transpose(-3, -2)


def _torch_attention(mask: Any, causal: bool, scale: float | None, heads: int, lq: int, lk: int) -> Any:
    """PyTorch's ``scaled_dot_product_attention`` with monadl's mask and causal rule combined in
    one mask (PyTorch takes one or the other), the same for every head."""
    keep = None if mask is None else torch.tensor(mask)
    if causal:
        lower = torch.ones(lq, lk, dtype=torch.bool).tril()
        if keep is None:
            keep = lower
        elif keep.dtype == torch.bool:
            keep = keep & lower
        else:
            keep = keep + torch.zeros(lq, lk, dtype=torch.float64).masked_fill(~lower, -math.inf)
    if keep is not None:  # the same for every head (an axis of its own in PyTorch's layout)
        keep = keep.unsqueeze(-3)

    def reference(q: Any, k: Any, v: Any) -> Any:
        # the leading axes broadcast first: PyTorch's op does not broadcast v's against the others'
        lead = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
        q, k, v = (t.expand(*lead, *t.shape[-2:]) for t in (q, k, v))
        scores = (*lead, heads, lq, lk)
        out = F.scaled_dot_product_attention(
            _heads_split(q, heads),
            _heads_split(k, heads),
            _heads_split(v, heads),
            attn_mask=None if keep is None else keep.expand(scores),  # (a mask of fewer axes can fail)
            scale=scale,
        )
        out = out.transpose(-3, -2)
        return out.reshape(*out.shape[:-2], out.shape[-2] * out.shape[-1])

    return reference


@st.composite
def _attention_params(draw: st.DrawFn, packed: bool) -> dict[str, Any]:
    rng = draw(RNGS)
    heads = draw(st.integers(1, 2))
    d, dv = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    lq = draw(st.integers(1, 3)) if draw(st.integers(0, 9)) else 0  # (no queries, no keys: empty)
    lk = lq if packed else (draw(st.integers(1, 3)) if draw(st.integers(0, 9)) else 0)
    if packed:
        dv = d
    lead_q, lead_k, lead_v = draw(broadcasting(3, empty=True)) if not packed else [draw(shapes(0, 2))] * 3
    lead_q, lead_k, lead_v = (s[-2:] for s in (lead_q, lead_k, lead_v))
    causal = draw(st.booleans())
    scale = None if packed or draw(st.booleans()) else draw(st.floats(0.2, 2.0))
    mask_form = draw(st.sampled_from(["none", "none", "bool", "bool", "additive", "additive -inf"]))
    masks: list[Any] = [None, None]  # the second: the other call's
    scores = np.broadcast_shapes(lead_q, lead_k, lead_v)
    if mask_form != "none":
        lead = draw(st.sampled_from([(), scores[-1:], scores]))
        shape = (*lead, draw(st.sampled_from([lq, 1])), draw(st.sampled_from([lk, 1])))
        for j in range(2):
            if mask_form == "bool":
                masks[j] = rng.uniform(size=shape) < 0.6  # rows of no key included
            else:
                masks[j] = real(rng, shape, -1.0, 1.0)
                if mask_form == "additive -inf":
                    masks[j][rng.uniform(size=shape) < 0.4] = -math.inf
    return {
        "rng": rng,
        "heads": heads,
        "shapes": ((*lead_q, lq, heads * d), (*lead_k, lk, heads * d), (*lead_v, lk, heads * dv)),
        "causal": causal,
        "scale": scale,
        "mask": masks[0],
        "other mask": masks[1],
        "mask_form": mask_form,
    }


def _attention(d: st.DrawFn) -> Case:
    p = d(_attention_params(False))
    rng = p.pop("rng")
    q, k, v = (real(rng, s, -1.5, 1.5) for s in p["shapes"])
    mask, causal, scale, heads = p["mask"], p["causal"], p["scale"], p["heads"]
    kwargs: dict[str, Any] = (
        {"causal": causal, "heads": heads} if causal or heads > 1 or d(st.booleans()) else {}
    )
    if scale is not None:
        kwargs["scale"] = scale
    reference = (
        None if torch is None else _torch_attention(mask, causal, scale, heads, q.shape[-2], k.shape[-2])
    )
    return Case(
        lambda q_, k_, v_: monadl.scaled_dot_product_attention(q_, k_, v_, mask, **kwargs),
        (q, k, v),
        reference,
        {**kwargs, "mask": p["mask_form"], "shapes": p["shapes"]},
        lambda q_, k_, v_: monadl.scaled_dot_product_attention(q_, k_, v_, p["other mask"], **kwargs),
    )


def _self_attention(d: st.DrawFn) -> Case:
    p = d(_attention_params(True))
    rng = p.pop("rng")
    q_shape = p["shapes"][0]
    qkv = real(rng, (*q_shape[:-1], 3 * q_shape[-1]), -1.5, 1.5)
    mask, causal, heads = p["mask"], p["causal"], p["heads"]
    reference = None
    if torch is not None:
        attend = _torch_attention(mask, causal, None, heads, q_shape[-2], q_shape[-2])
        reference = lambda t: attend(*torch.tensor_split(t, 3, dim=-1))
    return Case(
        lambda w: self_attention(w, mask, causal=causal, heads=heads),
        (qkv,),
        reference,
        {"causal": causal, "heads": heads, "mask": p["mask_form"]},
        lambda w: self_attention(w, p["other mask"], causal=causal, heads=heads),
    )


# ------------------------------------------------------------------------------------- recurrent


def _lstm_c(d: st.DrawFn) -> Case:
    rng = d(RNGS)
    xs = tuple(real(rng, s) for s in d(broadcasting(4)))
    reference = None
    if torch is not None:

        def reference(i: Any, f: Any, u: Any, c: Any) -> Any:
            return torch.sigmoid(i) * torch.tanh(u) + torch.sigmoid(f) * c

    return Case(monadl.lstm_c, xs, reference)


def _lstm_h(d: st.DrawFn) -> Case:
    rng = d(RNGS)
    xs = tuple(real(rng, s) for s in d(broadcasting(2)))
    reference = None if torch is None else (lambda o, c: torch.sigmoid(o) * torch.tanh(c))
    return Case(monadl.lstm_h, xs, reference)


def _tree_lstm_c(d: st.DrawFn) -> Case:
    rng = d(RNGS)
    xs = tuple(real(rng, s) for s in d(broadcasting(6)))
    reference = None
    if torch is not None:

        def reference(i: Any, fl: Any, fr: Any, u: Any, cl: Any, cr: Any) -> Any:
            return torch.sigmoid(i) * torch.tanh(u) + torch.sigmoid(fl) * cl + torch.sigmoid(fr) * cr

    return Case(monadl.tree_lstm_c, xs, reference)


def _gru_h(d: st.DrawFn) -> Case:
    rng = d(RNGS)
    xs = tuple(real(rng, s) for s in d(broadcasting(5)))
    reference = None
    if torch is not None:

        def reference(r: Any, z: Any, nx: Any, nh: Any, h: Any) -> Any:
            s = torch.sigmoid(z)
            return (1.0 - s) * torch.tanh(nx + torch.sigmoid(r) * nh) + s * h

    return Case(monadl.gru_h, xs, reference)


def _packed(name: str) -> Draw:
    """``nn.LSTM``'s and ``nn.GRU``'s layer op: sequences of drawn lengths, one or two directions
    (finite differences only: PyTorch's layers lay their weights out otherwise)."""

    def draw(d: st.DrawFn) -> Case:
        rng = d(RNGS)
        inputs, hidden = d(st.integers(1, 2)), d(st.integers(1, 2))
        lengths = tuple(d(st.lists(st.integers(1, 3), min_size=1, max_size=3)))
        directions = d(st.integers(1, 2))
        x = real(rng, (sum(lengths), inputs), -1.0, 1.0)
        if name == "packed_lstm":
            gates = [(inputs + hidden, hidden)] * 4
            fn: Callable[..., Any] = packed_lstm
        else:
            gates = [(inputs + hidden, hidden)] * 2 + [(inputs, hidden), (hidden, hidden)]
            fn = packed_gru
        weights = [real(rng, s, -1.0, 1.0) for _ in range(directions) for s in [*gates, *[(hidden,)] * 4]]
        return Case(
            lambda *ws: fn(ws[0], lengths, *ws[1:]),
            (x, *weights),
            None,
            {"lengths": lengths, "directions": directions, "inputs": inputs, "hidden": hidden},
        )

    return draw


# ------------------------------------------------------------------------------------------ ops


@dataclass(frozen=True)
class Fuzzed:
    """A fuzzed op: its draw, its cases in CI, and the public name it exercises."""

    draw: Draw
    examples: int
    public: str


OPS: dict[str, Fuzzed] = {
    **{name: Fuzzed(_unary(name), 6, name) for name in UNARY},
    **{name: Fuzzed(_binary(name), 12, name) for name in BINARY},
    "pow int": Fuzzed(_pow_int, 6, "pow"),
    "matmul": Fuzzed(_matmul("matmul"), 10, "matmul"),
    "@": Fuzzed(_matmul("@"), 6, "matmul"),
    "dot": Fuzzed(_matmul("dot"), 6, "dot"),
    "linear": Fuzzed(_linear, 10, "linear"),
    **{
        name: Fuzzed(_reduction(name), 12, name)
        for name in ("sum", "mean", "max", "min", "logsumexp", "var", "std")
    },
    "softmax": Fuzzed(_softmax("softmax"), 8, "softmax"),
    "log_softmax": Fuzzed(_softmax("log_softmax"), 8, "log_softmax"),
    "cross_entropy": Fuzzed(_cross_entropy, 12, "cross_entropy"),
    "reshape": Fuzzed(_reshape, 8, "reshape"),
    "transpose": Fuzzed(_transpose, 8, "transpose"),
    "concatenate": Fuzzed(_sequence_op("concatenate"), 10, "concatenate"),
    "stack": Fuzzed(_sequence_op("stack"), 8, "stack"),
    "split": Fuzzed(_split, 10, "split"),
    "add_n": Fuzzed(_add_n, 8, "add_n"),
    "take_rows": Fuzzed(_take_rows, 10, "take_rows"),
    "getitem": Fuzzed(_getitem, 14, "getitem"),
    "getitem arrays": Fuzzed(_getitem_arrays, 14, "getitem"),
    "take_along_axis": Fuzzed(_take_along_axis, 14, "take_along_axis"),
    "where": Fuzzed(_where, 12, "where"),
    "conv1d": Fuzzed(_conv(1), 40, "conv1d"),
    "conv2d": Fuzzed(_conv(2), 25, "conv2d"),
    **{
        name: Fuzzed(_pool(name), 30, name)
        for name in ("max_pool1d", "max_pool2d", "avg_pool1d", "avg_pool2d")
    },
    "conv_transpose2d": Fuzzed(_conv_transpose, 25, "conv_transpose2d"),
    "adaptive_avg_pool2d": Fuzzed(_adaptive_avg_pool, 15, "adaptive_avg_pool2d"),
    "pad": Fuzzed(_pad, 25, "pad"),
    "flatten": Fuzzed(_flatten, 8, "flatten"),
    "layer_norm": Fuzzed(_layer_norm, 12, "layer_norm"),
    "group_norm": Fuzzed(_group_norm, 15, "group_norm"),
    "rms_norm": Fuzzed(_rms_norm, 12, "rms_norm"),
    "batch_norm": Fuzzed(_batch_norm, 10, "batch_norm"),
    "scaled_dot_product_attention": Fuzzed(_attention, 25, "scaled_dot_product_attention"),
    "self_attention": Fuzzed(_self_attention, 10, "self_attention"),
    "lstm_c": Fuzzed(_lstm_c, 6, "lstm_c"),
    "lstm_h": Fuzzed(_lstm_h, 5, "lstm_h"),
    "tree_lstm_c": Fuzzed(_tree_lstm_c, 6, "tree_lstm_c"),
    "gru_h": Fuzzed(_gru_h, 6, "gru_h"),
    "packed_lstm": Fuzzed(_packed("packed_lstm"), 5, "packed_lstm"),
    "packed_gru": Fuzzed(_packed("packed_gru"), 5, "packed_gru"),
}

CI_EXAMPLES = sum(f.examples for f in OPS.values())
EXAMPLES = int(os.environ.get("MONADL_GRADFUZZ_EXAMPLES", "0"))
"""Cases over all the ops for a run by hand (random ones); 0: CI's fixed ones."""


def _settings(examples: int) -> settings:
    scaled = max(round(EXAMPLES * examples / CI_EXAMPLES), 1) if EXAMPLES else examples
    return settings(
        max_examples=scaled,
        deadline=None,
        derandomize=not EXAMPLES,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    )


CHECKED: Counter[str] = Counter()
"""The cases checked in this session, by op (``pytest -s`` prints their count at the end)."""


@pytest.fixture(scope="module", autouse=True)
def _count() -> Iterator[None]:
    yield
    if CHECKED:
        print(f"\ngradient fuzz: {CHECKED.total()} cases checked over {len(CHECKED)} ops")
        if EXAMPLES:  # a run by hand: the cases of each op too
            print(", ".join(f"{name} {n}" for name, n in CHECKED.items()))


@pytest.mark.filterwarnings("ignore:Using padding='same':UserWarning")  # PyTorch's note on its copy
@pytest.mark.filterwarnings(r"ignore:(var|std)\(\). degrees of freedom:UserWarning")  # PyTorch's, of no rows
@pytest.mark.parametrize("name", list(OPS))
def test_gradients_of_drawn_parameters(name: str) -> None:
    fuzzed = OPS[name]

    @_settings(fuzzed.examples)
    @given(data=st.data())
    def run(data: st.DataObject) -> None:
        case = fuzzed.draw(cast(st.DrawFn, data.draw))
        layered = [data.draw(st.booleans()) for _ in case.inputs]
        check_case(case, layered)
        CHECKED[name] += 1

    run()


# Where each public op is: the modules of differentiable ops (argmax and argmin give integers: no
# gradient), and the operators of layers (their ops' names).
MODULES = (
    elementwise,
    shape,
    linalg,
    classification,
    activations,
    reductions,
    selection,
    conv,
    pooling,
    conv_transpose,
    adaptive_pool,
    padding,
    flatten,
    norm,
    attention,
    recurrent,
    batch_norm,
)
NOT_DIFFERENTIABLE = {"argmax", "argmin"}
CHECKED_ELSEWHERE = {"nll_loss"}
"""Ops whose gradients another test checks against PyTorch's (tests/test_losses.py), as the other
losses'."""
OPERATORS = {"add", "sub", "mul", "div", "pow", "neg", "getitem"}
INTERNAL = {"self_attention", "packed_lstm", "packed_gru"}
"""Ops not exported, fuzzed for the modules built on them (MultiHeadAttention, LSTM, GRU)."""


def test_the_fuzz_covers_every_public_op() -> None:
    names = {m.__name__ for m in MODULES}
    public = {n for n in monadl.__all__ if getattr(getattr(monadl, n), "__module__", None) in names}
    assert public >= {n for m in (elementwise, shape, linalg, classification) for n in m.__all__} - {
        "class_loss"
    }
    fuzzed = {f.public for f in OPS.values()}
    wanted = (public - NOT_DIFFERENTIABLE - CHECKED_ELSEWHERE) | OPERATORS | INTERNAL
    assert fuzzed == wanted, fuzzed ^ wanted


# ------------------------------------------------------------------------ what the fuzz found


@pytest.mark.parametrize(
    ("shape", "axis"), [((0,), -1), ((2, 0), -1), ((2, 0), 1), ((0, 3), 0), ((3, 0, 2), 1)]
)
@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
def test_softmax_along_an_empty_axis_is_empty(name: str, shape: tuple[int, ...], axis: int) -> None:
    """As PyTorch's: an empty result and an empty delta (not a ShapeError of NumPy's maximum of
    nothing)."""
    x = np.ones(shape)
    fn = getattr(monadl, name)
    check_case(
        Case(
            lambda w: fn(w, axis=axis),
            (x,),
            None if torch is None else (lambda t: getattr(torch, name)(t, dim=axis)),
        ),
        [False],
    )
    assert value_of(fn(ArrayWeight(x), axis=axis).predict_blocking()).shape == shape


def test_an_attention_mask_broadcasts_against_every_operands_leading_axes() -> None:
    """The leading axes of the result are q's, k's and v's broadcast: a mask may have v's (more
    than q's scores have), and k's and v's must broadcast with each other too, not only with q's."""
    rng = np.random.default_rng(3)
    q, k, v = real(rng, (3, 4)), real(rng, (5, 4)), real(rng, (2, 5, 2))
    keep = rng.uniform(size=(2, 3, 5)) < 0.6
    out = value_of(monadl.scaled_dot_product_attention(q, k, v, keep).predict_blocking())
    for b in range(2):
        alone = value_of(monadl.scaled_dot_product_attention(q, k, v[b], keep[b]).predict_blocking())
        np.testing.assert_allclose(out[b], alone, rtol=1e-12, atol=1e-12)
    reference = None if torch is None else _torch_attention(keep, False, None, 1, 3, 5)
    check_case(
        Case(lambda q_, k_, v_: monadl.scaled_dot_product_attention(q_, k_, v_, keep), (q, k, v), reference),
        [False] * 3,
    )
    with pytest.raises(
        monadl.ShapeError, match=r"scaled_dot_product_attention: the leading axes of .* do not broadcast"
    ):
        value_of(
            monadl.scaled_dot_product_attention(
                q, real(rng, (2, 5, 4)), real(rng, (3, 5, 2))
            ).predict_blocking()
        )


@pytest.mark.parametrize("indices", [[], [[]], [[], []]])
def test_take_rows_of_no_rows_is_empty(indices: list[Any]) -> None:
    """An empty list of rows (NumPy reads it as floats) takes none, as ``table[[]]`` does in NumPy
    and PyTorch (not a TypeError)."""
    table = np.arange(6.0).reshape(3, 2)
    expected = table[np.asarray(indices, dtype=np.int64)]
    reference = None if torch is None else (lambda t: t[torch.tensor(indices, dtype=torch.int64)])
    check_case(Case(lambda w: monadl.take_rows(w, indices), (table,), reference), [False])
    assert value_of(monadl.take_rows(ArrayWeight(table), indices).predict_blocking()).shape == expected.shape
    assert value_of(ArrayWeight(table)[indices].predict_blocking()).shape == expected.shape


@pytest.mark.parametrize(("lq", "lk"), [(2, 0), (0, 3), (0, 0)])
def test_attention_over_no_keys_or_no_queries(lq: int, lk: int) -> None:
    """No keys: every query keeps none, so its result is 0 (as PyTorch's; not a ShapeError of
    NumPy's maximum of nothing); no queries: an empty result."""
    rng = np.random.default_rng(4)
    q, k, v = real(rng, (2, lq, 2)), real(rng, (2, lk, 2)), real(rng, (2, lk, 3))
    out = value_of(monadl.scaled_dot_product_attention(q, k, v).predict_blocking())
    np.testing.assert_array_equal(out, np.zeros((2, lq, 3)))
    reference = None if torch is None else _torch_attention(None, False, None, 1, lq, lk)
    check_case(Case(monadl.scaled_dot_product_attention, (q, k, v), reference), [False, True, False])
