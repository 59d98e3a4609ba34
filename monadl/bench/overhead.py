"""Per-op overhead: monadl against the same math in plain NumPy (and PyTorch eager, when installed).

Cases, each a chain of --chain ops (default 200), all float64:

  elementwise-1x1     x = x * w_i and x = x + b_i alternately, on a 1x1 array, weights of its shape
  elementwise-16x64   the same on a 16x64 array
  matmul-16x64        x = x @ W_i, x of 16x64, W_i orthogonal 64x64 weights (the values stay finite)
  float               the elementwise chain on Python floats (FloatLayer, FloatWeight); its
                      baseline is plain Python float arithmetic
  const-1x1, const-16x64, const-matmul-16x64
                      the same chains with constants in every op: only the chain's input is a
                      weight (every op computes one delta, for its input; no op has a weight)

Modes, in microseconds per op (a call's time / the chain's length), median and min over --repeats:

  build     constructing the layers of the chain (weights made beforehand); no baseline
  forward   predict_blocking on a graph built once | NumPy forward | torch forward under no_grad
  fwd+bwd   compute_gradients on the same graph | NumPy forward and hand-written backward | torch
            backward; the loss is the sum of the output (``ml.sum``: the backward is seeded with ones)
  train     train_blocking with SGD | the baselines' fwd+bwd plus the same SGD update

With ``--device cuda`` the arrays are CuPy's, the baseline is the same math in plain CuPy and the
peer PyTorch on CUDA, each sample ending when the GPU's queued work is done; the float case, which
has no arrays, is left out there (``--device array-api-strict`` tests that plumbing on the CPU).

overhead = monadl - numpy and ratio = monadl / numpy, per op, from the medians. monadl runs on
Executor(workers=1); BLAS is capped at one thread (threadpoolctl) for the whole run, and torch too.
Each sample repeats a call until it lasts at least --min-time seconds, with the garbage collector
off; implementations are sampled in turn, so all see the same conditions. Before timing, monadl's
(and torch's) values and gradients are checked against NumPy's.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import importlib
import io
import json
import math
import os
import platform
import pstats
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import numpy as np
from array_api_compat import array_namespace
from returns.result import Result, Success
from threadpoolctl import threadpool_info, threadpool_limits

import monadl
from monadl import (
    SGD,
    ArrayLayer,
    ArrayWeight,
    Executor,
    FloatLayer,
    FloatWeight,
    compute_gradients,
    lift,
    lift_array,
    predict_blocking,
    train_blocking,
)
from monadl.bench.common import DEVICES, Device, host_array
from monadl.cli import positive_int
from monadl.data.files import atomic_write_bytes
from monadl.typeclasses.backend import Array

LEARNING_RATE = 1e-8
"""Small, so that thousands of training steps leave the chains' values finite."""
TARGET_US = 2.0
"""The engine's target: at most this many microseconds per op, forward + backward, beyond NumPy's
(the goal is 1)."""
MODES = ("build", "forward", "fwd+bwd", "train")
IMPLS = ("monadl", "numpy", "torch")

Weight = FloatWeight | ArrayWeight
Thunk = Callable[[], object]


# ------------------------------------------------------------------------------------- baselines


def _ones_like(x: Any) -> Any:
    """Ones of ``x``'s shape, dtype and namespace (NumPy's own call for NumPy arrays)."""
    if isinstance(x, np.ndarray):
        return np.ones_like(x)
    return array_namespace(x).ones_like(x)


class _Elementwise:
    """The elementwise chain by hand: ``x * p`` at even positions, ``x + p`` at odd ones."""

    def __init__(self, x0: Any, params: Sequence[Any]) -> None:
        self.x0 = x0
        self.params = list(params)
        self.muls = [i % 2 == 0 for i in range(len(self.params))]

    def forward(self) -> Any:
        x = self.x0
        for mul, p in zip(self.muls, self.params, strict=True):
            x = x * p if mul else x + p
        return x

    def gradients(self) -> tuple[Any, list[Any]]:
        params = self.params
        muls = self.muls
        inputs = []
        x = self.x0
        for mul, p in zip(muls, params, strict=True):
            inputs.append(x)
            x = x * p if mul else x + p
        d: Any = 1.0 if type(x) is float else _ones_like(x)
        grads: list[Any] = [None] * len(params)
        for i in range(len(params) - 1, -1, -1):
            if muls[i]:
                grads[i] = d * inputs[i]
                if i:  # the chain's input is a constant: no delta for it
                    d = d * params[i]
            else:
                grads[i] = d
        return x, grads

    def train(self) -> None:
        _, grads = self.gradients()
        self.params = [p - LEARNING_RATE * g for p, g in zip(self.params, grads, strict=True)]


class _Matmul:
    """The matmul chain by hand: ``x @ W_i``."""

    def __init__(self, x0: Array, params: Sequence[Array]) -> None:
        self.x0 = x0
        self.params = list(params)

    def forward(self) -> Array:
        x = self.x0
        for w in self.params:
            x = x @ w
        return x

    def gradients(self) -> tuple[Array, list[Any]]:
        params = self.params
        inputs = []
        x = self.x0
        for w in params:
            inputs.append(x)
            x = x @ w
        d = _ones_like(x)
        grads: list[Any] = [None] * len(params)
        for i in range(len(params) - 1, -1, -1):
            grads[i] = inputs[i].T @ d
            if i:
                d = d @ params[i].T
        return x, grads

    def train(self) -> None:
        _, grads = self.gradients()
        self.params = [p - LEARNING_RATE * g for p, g in zip(self.params, grads, strict=True)]


class _ConstantChain:
    """A chain whose ops take constants; only its input ``x0`` is trained (one leaf, as in a
    deep network's activations: every op's delta is computed, no op has a weight of its own)."""

    def __init__(self, x0: Any, params: Sequence[Any], matmul: bool) -> None:
        self.x0 = x0
        self.params = list(params)
        self.matmul = matmul
        self.muls = [i % 2 == 0 for i in range(len(self.params))]

    def forward(self) -> Any:
        x = self.x0
        if self.matmul:
            for p in self.params:
                x = x @ p
        else:
            for mul, p in zip(self.muls, self.params, strict=True):
                x = x * p if mul else x + p
        return x

    def gradients(self) -> tuple[Any, list[Any]]:
        x = self.forward()
        d: Any = 1.0 if type(x) is float else _ones_like(x)
        for i in range(len(self.params) - 1, -1, -1):
            if self.matmul:
                d = d @ self.params[i].T
            elif self.muls[i]:
                d = d * self.params[i]
        return x, [d]

    def train(self) -> None:
        _, (grad,) = self.gradients()
        self.x0 = self.x0 - LEARNING_RATE * grad


@dataclass(frozen=True)
class TorchImpl:
    """A case in PyTorch eager: its three timed calls, and the gradients of the last backward."""

    forward: Thunk
    gradients: Thunk
    train: Thunk
    grads: Callable[[], list[Any]]


def _torch_impl(
    torch: Any, x0: Any, params: Sequence[Any], matmul: bool, constants: bool = False, device: str = "cpu"
) -> TorchImpl:
    def tensor(value: Any, requires_grad: bool) -> Any:
        return torch.tensor(value, dtype=torch.float64, device=device, requires_grad=requires_grad)

    tx0 = tensor(x0, constants)
    weights = [tensor(p, not constants) for p in params]
    leaves = [tx0] if constants else weights
    muls = [i % 2 == 0 for i in range(len(weights))]

    def chain() -> Any:
        x = tx0
        if matmul:
            for w in weights:
                x = x @ w
        else:
            for mul, w in zip(muls, weights, strict=True):
                x = x * w if mul else x + w
        return x

    def forward() -> Any:
        with torch.no_grad():
            return chain()

    def gradients() -> Any:
        for w in leaves:
            w.grad = None
        y = chain()
        y.backward(torch.ones_like(y))
        return y

    optimizer = torch.optim.SGD(leaves, lr=LEARNING_RATE)

    def train() -> None:
        optimizer.zero_grad(set_to_none=True)
        y = chain()
        y.backward(torch.ones_like(y))
        optimizer.step()

    return TorchImpl(forward, gradients, train, lambda: [w.grad for w in leaves])


# ----------------------------------------------------------------------------------------- cases


@dataclass(frozen=True)
class Case:
    """One benchmark case: monadl's graph builder and weights, and the baselines of the same math."""

    key: str
    title: str
    ops: int
    build: Callable[[], FloatLayer | ArrayLayer]
    weights: Sequence[Weight]
    numpy_forward: Callable[[], Any]
    numpy_gradients: Callable[[], tuple[Any, list[Any]]]
    numpy_train: Thunk
    torch: TorchImpl | None = None


def _build_elementwise(x0: Any, weights: Sequence[Weight]) -> Callable[[], FloatLayer | ArrayLayer]:
    """The elementwise chain in monadl: ``x * w`` at even positions, ``x + w`` at odd ones."""
    muls = [i % 2 == 0 for i in range(len(weights))]

    def build() -> FloatLayer | ArrayLayer:
        x: Any = lift(x0)
        for mul, w in zip(muls, weights, strict=True):
            x = x * w if mul else x + w
        result: FloatLayer | ArrayLayer = x
        return result

    return build


def _build_matmul(x0: Array, weights: Sequence[ArrayWeight]) -> Callable[[], ArrayLayer]:
    def build() -> ArrayLayer:
        x = lift_array(x0)
        for w in weights:
            x = x @ w
        return x

    return build


def _elementwise_params(rng: np.random.Generator, chain: int, shape: tuple[int, ...]) -> list[Array]:
    """Factors near 1 at even positions, small offsets at odd ones: the values stay near the input."""
    return [
        1.0 + 0.01 * rng.standard_normal(shape) if i % 2 == 0 else 0.01 * rng.standard_normal(shape)
        for i in range(chain)
    ]


def _elementwise_case(
    key: str,
    title: str,
    shape: tuple[int, ...],
    chain: int,
    rng: np.random.Generator,
    torch: Any,
    device: Device,
) -> Case:
    x0 = rng.standard_normal(shape)
    params = _elementwise_params(rng, chain, shape)
    weights = [ArrayWeight(device.put(p)) for p in params]
    baseline = _Elementwise(device.put(x0), [device.put(p.copy()) for p in params])
    return Case(
        key,
        title,
        chain,
        _build_elementwise(device.put(x0), weights),
        weights,
        baseline.forward,
        baseline.gradients,
        baseline.train,
        None if torch is None else _torch_impl(torch, x0, params, matmul=False, device=device.torch_device),
    )


def _float_case(chain: int, rng: np.random.Generator, torch: Any, device: Device) -> Case:
    x0 = 0.5
    params = [float(p[0]) for p in _elementwise_params(rng, chain, (1,))]
    weights = [FloatWeight(p) for p in params]
    baseline = _Elementwise(x0, params)
    return Case(
        "float",
        "float (Python floats)",
        chain,
        _build_elementwise(x0, weights),
        weights,
        baseline.forward,
        baseline.gradients,
        baseline.train,
        None if torch is None else _torch_impl(torch, x0, params, matmul=False),
    )


def _matmul_case(chain: int, rng: np.random.Generator, torch: Any, device: Device) -> Case:
    x0 = rng.standard_normal((16, 64))
    # Orthogonal factors keep the rows' norms: no overflow or underflow along a long chain.
    params = [np.linalg.qr(rng.standard_normal((64, 64)))[0] for _ in range(chain)]
    weights = [ArrayWeight(device.put(p)) for p in params]
    baseline = _Matmul(device.put(x0), [device.put(p.copy()) for p in params])
    return Case(
        "matmul-16x64",
        "matmul 16x64 @ 64x64",
        chain,
        _build_matmul(device.put(x0), weights),
        weights,
        baseline.forward,
        baseline.gradients,
        baseline.train,
        None if torch is None else _torch_impl(torch, x0, params, matmul=True, device=device.torch_device),
    )


def _constant_case(
    key: str,
    title: str,
    shape: tuple[int, ...],
    matmul: bool,
    chain: int,
    rng: np.random.Generator,
    torch: Any,
    device: Device,
) -> Case:
    x0 = rng.standard_normal(shape)
    if matmul:
        params = [np.linalg.qr(rng.standard_normal((64, 64)))[0] for _ in range(chain)]
    else:
        params = _elementwise_params(rng, chain, shape)
    weight = ArrayWeight(device.put(x0))
    constants = [device.put(p) for p in params]
    baseline = _ConstantChain(device.put(x0.copy()), constants, matmul)

    def build() -> ArrayLayer:
        x: ArrayLayer = lift_array(weight)  # a layer, without an op
        if matmul:
            for p in constants:
                x = x @ p
        else:
            for i, p in enumerate(constants):
                x = x * p if i % 2 == 0 else x + p
        return x

    return Case(
        key,
        title,
        chain,
        build,
        [weight],
        baseline.forward,
        baseline.gradients,
        baseline.train,
        None
        if torch is None
        else _torch_impl(torch, x0, params, matmul=matmul, constants=True, device=device.torch_device),
    )


CASES: dict[str, Callable[[int, np.random.Generator, Any, Device], Case]] = {
    "elementwise-1x1": lambda n, rng, torch, device: _elementwise_case(
        "elementwise-1x1", "elementwise 1x1", (1, 1), n, rng, torch, device
    ),
    "elementwise-16x64": lambda n, rng, torch, device: _elementwise_case(
        "elementwise-16x64", "elementwise 16x64", (16, 64), n, rng, torch, device
    ),
    "matmul-16x64": _matmul_case,
    "float": _float_case,
    "const-1x1": lambda n, rng, torch, device: _constant_case(
        "const-1x1", "constants 1x1", (1, 1), False, n, rng, torch, device
    ),
    "const-16x64": lambda n, rng, torch, device: _constant_case(
        "const-16x64", "constants 16x64", (16, 64), False, n, rng, torch, device
    ),
    "const-matmul-16x64": lambda n, rng, torch, device: _constant_case(
        "const-matmul-16x64", "constants matmul 16x64", (16, 64), True, n, rng, torch, device
    ),
}
"""The cases by key: each makes its ``Case`` from the chain's length, a generator, torch (or None)
and the device of its arrays."""
ARRAY_FREE = ("float",)
"""The cases without arrays: they run on the CPU alone."""


def make_case(
    key: str, chain: int, *, seed: int = 0, torch: Any = None, device: Device | None = None
) -> Case:
    """The case ``key`` (one of :data:`CASES`) with a chain of ``chain`` ops, its arrays on ``device``
    (default: NumPy on the CPU)."""
    return CASES[key](chain, np.random.default_rng(seed), torch, device or Device("cpu"))


# ------------------------------------------------------------------------------------ correctness


def _check_close(case: Case, what: str, got: Any, want: Any) -> None:
    g, w = host_array(got), host_array(want)
    if g.shape != w.shape or not np.allclose(g, w, rtol=1e-9, atol=1e-12):
        raise AssertionError(f"{case.key}: {what} differs from NumPy's: got {got!r}, expected {want!r}")


def _unwrap(case: Case, what: str, result: Result[Any, Exception]) -> Any:
    if not isinstance(result, Success):
        raise RuntimeError(f"{case.key}: {what} failed: {result.failure()!r}")
    return result.unwrap()


def loss_of(layer: FloatLayer | ArrayLayer) -> FloatLayer:
    """A chain's loss: its value, or the sum of its array (whose delta is ones, as the baselines')."""
    return layer if isinstance(layer, FloatLayer) else monadl.sum(layer)


def check_case(case: Case, executor: Executor) -> None:
    """Raises unless monadl's (and torch's) forward value and gradients equal NumPy's."""
    layer = case.build()
    value = _unwrap(case, "predict_blocking", predict_blocking(layer, executor=executor))
    _check_close(case, "the forward value", value, case.numpy_forward())
    loss, grads = compute_gradients(loss_of(layer), executor=executor)
    want_loss, want_grads = case.numpy_gradients()
    _check_close(
        case,
        "compute_gradients' value",
        loss,
        want_loss if type(want_loss) is float else host_array(want_loss).sum(),
    )
    if len(grads) != len(case.weights):
        raise AssertionError(f"{case.key}: {len(grads)} gradients for {len(case.weights)} weights")
    for i, w in enumerate(case.weights):
        _check_close(case, f"the gradient of weight {i}", grads[w], want_grads[i])
    if case.torch is not None:
        _check_close(case, "torch's forward value", case.torch.forward(), want_loss)
        _check_close(case, "torch's fwd+bwd value", case.torch.gradients(), want_loss)
        for i, g in enumerate(case.torch.grads()):
            _check_close(case, f"torch's gradient of weight {i}", g, want_grads[i])


# ---------------------------------------------------------------------------------------- timing


@dataclass(frozen=True)
class Stats:
    """Microseconds per op over the repeats; each sample is ``number`` calls."""

    median: float
    min: float
    samples: tuple[float, ...]
    number: int

    def to_json(self) -> dict[str, Any]:
        return {"median": self.median, "min": self.min, "samples": list(self.samples), "number": self.number}


def _time(fn: Thunk, number: int, synchronize: Thunk = lambda: None) -> float:
    """Seconds for ``number`` calls of ``fn``, with the garbage collector off (collected before),
    up to the end of the queued GPU work (``synchronize``, before the clock starts and stops)."""
    gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    try:
        synchronize()
        start = time.perf_counter()
        for _ in range(number):
            fn()
        synchronize()
        return time.perf_counter() - start
    finally:
        if enabled:
            gc.enable()


def _calibrate(fn: Thunk, min_time: float, synchronize: Thunk = lambda: None) -> int:
    """Warms ``fn`` up; returns how many calls make a sample of at least ``min_time`` seconds."""
    fn()
    fn()
    number = 1
    while True:
        elapsed = _time(fn, number, synchronize)
        if elapsed >= min_time:
            return number
        number = max(number + 1, math.ceil(number * 1.1 * min_time / max(elapsed, 1e-9)))


def measure(
    fns: dict[str, Thunk], ops: int, repeats: int, min_time: float, synchronize: Thunk = lambda: None
) -> dict[str, Stats]:
    """Microseconds per op of each function (a call runs ``ops`` ops), sampled in turn, each sample
    timed to the end of its GPU work (``synchronize``)."""
    numbers = {name: _calibrate(fn, min_time, synchronize) for name, fn in fns.items()}
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            n = numbers[name]
            samples[name].append(_time(fn, n, synchronize) / (n * ops) * 1e6)
    return {name: Stats(statistics.median(s), min(s), tuple(s), numbers[name]) for name, s in samples.items()}


# ---------------------------------------------------------------------------------------- report


@dataclass(frozen=True)
class Row:
    """One case in one mode: each implementation's microseconds per op (None: not measured)."""

    case: str
    title: str
    mode: str
    monadl: Stats
    numpy: Stats | None = None
    torch: Stats | None = None

    @property
    def overhead(self) -> float | None:
        """monadl's median minus NumPy's, in microseconds per op."""
        return None if self.numpy is None else self.monadl.median - self.numpy.median

    @property
    def ratio(self) -> float | None:
        """monadl's median over NumPy's."""
        return None if self.numpy is None else self.monadl.median / self.numpy.median

    @property
    def torch_overhead(self) -> float | None:
        """torch's median minus NumPy's, in microseconds per op."""
        if self.numpy is None or self.torch is None:
            return None
        return self.torch.median - self.numpy.median

    def to_json(self) -> dict[str, Any]:
        return {
            "case": self.case,
            "title": self.title,
            "mode": self.mode,
            "monadl": self.monadl.to_json(),
            "numpy": None if self.numpy is None else self.numpy.to_json(),
            "torch": None if self.torch is None else self.torch.to_json(),
            "overhead_us": self.overhead,
            "ratio": self.ratio,
            "torch_overhead_us": self.torch_overhead,
        }


@dataclass
class Report:
    """The results of one run of the benchmark."""

    chain: int
    repeats: int
    min_time: float
    environment: dict[str, Any]
    torch_note: str | None
    rows: list[Row] = field(default_factory=list)

    @property
    def has_torch(self) -> bool:
        return any(r.torch is not None for r in self.rows)

    def targets(self) -> list[tuple[str, float, bool]]:
        """Per case: monadl's fwd+bwd overhead per op, and whether it meets :data:`TARGET_US`."""
        return [
            (r.case, r.overhead, r.overhead <= TARGET_US)
            for r in self.rows
            if r.mode == "fwd+bwd" and r.overhead is not None
        ]

    def to_json(self) -> dict[str, Any]:
        return {
            "benchmark": "overhead",
            "unit": "us/op",
            "chain": self.chain,
            "repeats": self.repeats,
            "min_time_s": self.min_time,
            "environment": self.environment,
            "torch_note": self.torch_note,
            "rows": [r.to_json() for r in self.rows],
            "target": {
                "max_fwd_bwd_overhead_us": TARGET_US,
                "results": [{"case": c, "overhead_us": o, "pass": ok} for c, o, ok in self.targets()],
            },
        }


def _fmt(x: float | None, ratio: bool = False) -> str:
    if x is None:
        return "-"
    return f"{x:.1f}x" if ratio else f"{x:.2f}"


def format_table(report: Report) -> str:
    """The report as an aligned plain-text table, with its notes."""
    header = ["case", "mode", "monadl", "(min)", "numpy", "(min)", "overhead", "ratio"]
    if report.has_torch:
        header += ["torch", "(min)", "torch-numpy"]
    lines: list[list[str]] = [header]
    previous = None
    for r in report.rows:
        line = [
            r.title if r.case != previous else "",
            r.mode,
            _fmt(r.monadl.median),
            _fmt(r.monadl.min),
            _fmt(None if r.numpy is None else r.numpy.median),
            _fmt(None if r.numpy is None else r.numpy.min),
            _fmt(r.overhead),
            _fmt(r.ratio, ratio=True),
        ]
        if report.has_torch:
            line += [
                _fmt(None if r.torch is None else r.torch.median),
                _fmt(None if r.torch is None else r.torch.min),
                _fmt(r.torch_overhead),
            ]
        lines.append(line)
        previous = r.case
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]

    def row(cells: list[str]) -> str:
        left = [c.ljust(w) for c, w in zip(cells[:2], widths[:2], strict=True)]
        right = [c.rjust(w) for c, w in zip(cells[2:], widths[2:], strict=True)]
        return "  ".join(left + right).rstrip()

    env = report.environment
    out = [
        f"monadl per-op overhead: chains of {report.chain} ops; microseconds per op, median (and min) "
        f"of {report.repeats} repeats, each >= {report.min_time:g} s",
        f"monadl {env['monadl']} on Executor(workers=1); BLAS threads capped at 1; numpy {env['numpy']}; "
        f"Python {env['python']}; {env['machine']}, {env['cpus']} CPUs; device {env.get('device', 'cpu')}, "
        f"baseline {env.get('baseline', 'numpy')} (its column is 'numpy')",
        "",
        row(lines[0]),
        "  ".join("-" * w for w in widths),
    ]
    out += [row(cells) for cells in lines[1:]]
    out.append("")
    out.append("overhead = monadl - numpy, ratio = monadl / numpy (medians, per op); build has no baseline;")
    out.append("train = one SGD step (the baselines: fwd+bwd plus the same update).")
    for case, overhead, ok in report.targets():
        verdict = "meets" if ok else "MISSES"
        out.append(f"target: {case}: fwd+bwd overhead {overhead:.2f} us/op {verdict} <= {TARGET_US:g} us/op")
    if report.torch_note:
        out.append(report.torch_note)
    return "\n".join(out)


# ------------------------------------------------------------------------------------------- run


def load_torch(use: bool = True) -> tuple[Any, str | None]:
    """torch (or None) and a note on why its figures are missing, if they are."""
    if not use:
        return None, "PyTorch: skipped (--no-torch)."
    try:
        torch = importlib.import_module("torch")
    except ImportError as e:
        return None, f"PyTorch: skipped, not importable here ({e})."
    return torch, None


def _environment(torch: Any, device: Device) -> dict[str, Any]:
    return {
        "device": device.describe(),
        "baseline": "numpy" if device.is_numpy else device.xp.__name__,
        "monadl": monadl.__version__,
        "python": platform.python_version(),
        "numpy": np.__version__,
        "torch": None if torch is None else str(torch.__version__),
        "machine": platform.machine(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "threadpools": [
            {k: info.get(k) for k in ("user_api", "internal_api", "version", "num_threads")}
            for info in threadpool_info()
        ],
    }


def _measure_case(
    case: Case,
    executor: Executor,
    repeats: int,
    min_time: float,
    progress: TextIO | None,
    synchronize: Thunk = lambda: None,
) -> list[Row]:
    def say(mode: str) -> None:
        if progress is not None:
            print(f"  {case.key}: {mode}", file=progress, flush=True)

    ops = case.ops
    say("checking against NumPy")
    check_case(case, executor)
    rows: list[Row] = []

    say("build")
    rows.append(
        Row(
            case.key,
            case.title,
            "build",
            measure({"monadl": case.build}, ops, repeats, min_time, synchronize)["monadl"],
        )
    )

    layer = case.build()
    loss = loss_of(layer)
    optimizer = SGD(LEARNING_RATE)
    tc = case.torch
    modes: list[tuple[str, dict[str, Thunk]]] = [
        (
            "forward",
            {"monadl": lambda: predict_blocking(layer, executor=executor), "numpy": case.numpy_forward},
        ),
        (
            "fwd+bwd",
            {"monadl": lambda: compute_gradients(loss, executor=executor), "numpy": case.numpy_gradients},
        ),
        (
            "train",
            {
                "monadl": lambda: train_blocking(loss, optimizer, executor=executor),
                "numpy": case.numpy_train,
            },
        ),
    ]
    if tc is not None:
        modes[0][1]["torch"] = tc.forward
        modes[1][1]["torch"] = tc.gradients
        modes[2][1]["torch"] = tc.train
    for mode, fns in modes:
        say(mode)
        stats = measure(fns, ops, repeats, min_time, synchronize)
        rows.append(Row(case.key, case.title, mode, stats["monadl"], stats["numpy"], stats.get("torch")))
    # The timed calls ignore their results: make sure that training still succeeds (finite loss).
    _unwrap(case, "train_blocking", train_blocking(loss, optimizer, executor=executor))
    return rows


def run_overhead(
    chain: int = 200,
    repeats: int = 7,
    min_time: float = 0.1,
    cases: Sequence[str] | None = None,
    *,
    use_torch: bool = True,
    progress: TextIO | None = None,
    device: str = "cpu",
) -> Report:
    """Runs the benchmark (see the module's docstring) on ``device`` (one of ``common.DEVICES``) and
    returns its report."""
    if chain < 1 or repeats < 1 or min_time < 0:
        raise ValueError(f"need chain >= 1, repeats >= 1, min_time >= 0; got {chain}, {repeats}, {min_time}")
    where = Device(device)
    keys = list(CASES) if not cases else list(cases)
    if not where.is_numpy:
        keys = [key for key in keys if key not in ARRAY_FREE]
    torch, note = load_torch(use_torch)  # imported before the BLAS cap, so that the cap covers it too
    # The objects alive now (modules, torch's) are left out of the collections before each sample,
    # which then take microseconds, not a tenth of a second.
    gc.collect()
    gc.freeze()
    torch_threads = None
    try:
        with threadpool_limits(limits=1, user_api="blas"), Executor(workers=1) as executor:
            if torch is not None:
                torch_threads = torch.get_num_threads()
                torch.set_num_threads(1)
            report = Report(chain, repeats, min_time, _environment(torch, where), note)
            for key in keys:
                case = make_case(key, chain, torch=torch, device=where)
                gc.collect()
                gc.freeze()  # again: torch.optim imports much on first use
                report.rows += _measure_case(case, executor, repeats, min_time, progress, where.synchronize)
    finally:
        if torch_threads is not None:
            torch.set_num_threads(torch_threads)
        gc.unfreeze()
    return report


def profile_case(key: str, chain: int, mode: str = "fwd+bwd", calls: int = 50, top: int = 25) -> str:
    """cProfile of ``calls`` monadl calls of ``mode`` on case ``key``: the ``top`` functions by tottime."""
    case = make_case(key, chain)
    with threadpool_limits(limits=1, user_api="blas"), Executor(workers=1) as executor:
        check_case(case, executor)
        layer = case.build()
        loss = loss_of(layer)
        fns: dict[str, Thunk] = {
            "build": case.build,
            "forward": lambda: predict_blocking(layer, executor=executor),
            "fwd+bwd": lambda: compute_gradients(loss, executor=executor),
            "train": lambda: train_blocking(loss, SGD(LEARNING_RATE), executor=executor),
        }
        fn = fns[mode]
        for _ in range(3):
            fn()
        profiler = cProfile.Profile()
        gc.collect()
        profiler.enable()
        for _ in range(calls):
            fn()
        profiler.disable()
    out = io.StringIO()
    print(
        f"cProfile: monadl {mode} of {key}, chain of {chain} ops, {calls} calls; top {top} by tottime",
        file=out,
    )
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(top)
    return out.getvalue()


# ------------------------------------------------------------------------------------------- CLI


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``overhead`` subcommand's options."""
    parser.add_argument("--chain", type=positive_int, default=200, metavar="N", help="ops per chain (200)")
    parser.add_argument("--repeats", type=positive_int, default=7, metavar="R", help="samples per figure (7)")
    parser.add_argument(
        "--min-time", type=float, default=0.1, metavar="S", help="least seconds per sample (0.1)"
    )
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write the results as JSON to PATH")
    parser.add_argument(
        "--case", action="append", choices=list(CASES), dest="cases", help="run only this case (repeatable)"
    )
    parser.add_argument("--no-torch", action="store_true", help="leave PyTorch out even if it is installed")
    parser.add_argument(
        "--device",
        choices=DEVICES,
        default="cpu",
        help="cpu: NumPy; cuda: CuPy against plain CuPy and PyTorch on CUDA (default cpu)",
    )
    parser.add_argument(
        "--profile",
        choices=list(CASES),
        metavar="CASE",
        help="instead of timing, profile monadl on CASE with cProfile and print the top functions",
    )
    parser.add_argument("--profile-mode", choices=MODES, default="fwd+bwd", help="what to profile (fwd+bwd)")
    parser.add_argument("--profile-calls", type=positive_int, default=50, metavar="N", help="calls (50)")
    parser.add_argument("--profile-top", type=positive_int, default=25, metavar="N", help="functions (25)")


def run_cli(args: argparse.Namespace) -> int:
    """Runs the ``overhead`` subcommand; returns the exit status."""
    if args.profile:
        print(profile_case(args.profile, args.chain, args.profile_mode, args.profile_calls, args.profile_top))
        return 0
    report = run_overhead(
        args.chain,
        args.repeats,
        args.min_time,
        args.cases,
        use_torch=not args.no_torch,
        progress=sys.stderr,
        device=args.device,
    )
    print(format_table(report))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(args.json, (json.dumps(report.to_json(), indent=2) + "\n").encode())
        print(f"JSON written to {args.json}")
    return 0
