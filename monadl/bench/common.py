"""What the benchmarks share: timing implementations in turn, the machine's CPUs, whether PyTorch (an
optional peer) can be imported, a peer in a worker process, and the command-line options of the
benchmarks that compare monadl with peers."""

from __future__ import annotations

import argparse
import gc
import importlib.util
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Self

from returns.result import Failure, Result

from monadl.cli import non_negative_int, positive_int
from monadl.typeclasses.backend import to_numpy


def cpus() -> int:
    """The CPUs this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def blas_libraries() -> str:
    """The BLAS libraries loaded, with their versions and, for OpenBLAS, the kernels it runs (its
    ``architecture``: chosen by the CPU when it loads, or by ``OPENBLAS_CORETYPE`` where that is
    set), as threadpoolctl reports them. A model's matrix products run there: on one CPU, OpenBLAS's
    AVX2 and AVX-512 kernels can differ twofold, so a benchmark's report names them, and says when
    the environment chose them."""
    from threadpoolctl import threadpool_info

    forced = os.environ.get("OPENBLAS_CORETYPE")
    found = []
    for lib in threadpool_info():
        if lib["user_api"] == "blas":
            kernels = lib.get("architecture")
            if kernels and forced and lib["internal_api"] == "openblas":
                kernels += f", as OPENBLAS_CORETYPE={forced} asks"
            found.append(
                f"{lib['internal_api']} {lib.get('version') or '?'}" + (f" ({kernels})" if kernels else "")
            )
    return ", ".join(found) or "none found"


def torch_available() -> bool:
    """Whether PyTorch can be imported here."""
    if importlib.util.find_spec("torch") is None:
        return False
    try:
        import torch  # type: ignore[import-not-found, unused-ignore]  # noqa: F401
    except ImportError:
        return False
    return True


def interleaved(
    segments: Sequence[Callable[[], int]], repeats: int, synchronize: Callable[[], None] | None = None
) -> list[list[float]]:
    """The rates of ``segments`` (each runs one timed segment of its implementation and returns how
    many items it did: steps, trees), ``repeats`` rounds of one segment of each in turn, so that the
    machine's drift in speed (20-50% within an hour on the project's VMs) touches them alike and
    their ratios hold even where their absolute figures move. Each segment starts from a collected
    heap: the collector's work for one segment's garbage is not timed in the next one's.
    ``synchronize`` (a ``Device``'s, on a GPU) waits for queued work before the clock starts and
    before it stops, so that a segment is timed to the end of its work, not of its launches."""
    rates: list[list[float]] = [[] for _ in segments]
    for _ in range(repeats):
        for segment, found in zip(segments, rates, strict=True):
            gc.collect()
            if synchronize is not None:
                synchronize()
            start = time.perf_counter()
            items = segment()
            if synchronize is not None:
                synchronize()
            found.append(items / (time.perf_counter() - start))
    return rates


class WorkerProcess:
    """A peer in a Python process of its own (DyNet fixes its settings once per process), on one
    thread, driven line by line: a request on its stdin, an answer line starting with ``mark`` on
    its stdout. ``files`` writes what the worker reads into its folder; the worker is
    ``function(folder)`` of ``module``, and answers first once it is ready. A context manager; a
    worker that fails raises ``RuntimeError`` with the tail of its stderr."""

    def __init__(
        self, name: str, module: str, function: str, mark: str, files: Callable[[Path], object]
    ) -> None:
        self.name = name
        self.mark = mark
        self._folder = tempfile.TemporaryDirectory(prefix="monadl-bench-")
        self.folder = Path(self._folder.name)
        files(self.folder)
        root = str(Path(__file__).resolve().parents[2])
        env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        code = f"import sys; from {module} import {function}; {function}(sys.argv[1])"
        self._stderr = open(self.folder / "stderr", "w+")  # closed in close()
        self._worker = subprocess.Popen(
            [sys.executable, "-c", code, str(self.folder)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            env=env,
        )
        try:
            self.answer()  # ready
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def ask(self, request: str) -> list[str]:
        """Sends ``request``; the words of the worker's answer after the mark."""
        assert self._worker.stdin is not None
        try:
            self._worker.stdin.write(request + "\n")
            self._worker.stdin.flush()
        except BrokenPipeError:
            pass  # the worker died: answer() says why
        return self.answer()

    def answer(self) -> list[str]:
        """The words of the worker's next answer after the mark."""
        assert self._worker.stdout is not None
        for line in self._worker.stdout:
            if line.startswith(self.mark):
                return line[len(self.mark) :].split()
        self._stderr.seek(0)
        tail = " | ".join(self._stderr.read().strip().splitlines()[-3:])
        raise RuntimeError(f"{self.name}: the worker failed (exit {self._worker.wait()}): {tail}")

    def close(self) -> None:
        """Ends the worker (its stdin closed) and removes its files."""
        if self._worker.poll() is None:
            assert self._worker.stdin is not None
            try:
                self._worker.stdin.close()
            except BrokenPipeError:
                pass
            try:
                self._worker.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._worker.kill()
                self._worker.wait()
        for stream in (self._worker.stdout, self._stderr):
            if stream is not None:
                stream.close()
        self._folder.cleanup()


def add_peer_options(parser: argparse.ArgumentParser, *, dynet: bool) -> None:
    """The options of a benchmark against peers: the seed, the peers to leave out (``dynet``: DyNet
    is one), where the results go, the progress bar, and a seconds-long smoke run."""
    parser.add_argument("--seed", type=non_negative_int, default=0)
    parser.add_argument("--no-torch", action="store_true", help="skip PyTorch even when installed")
    if dynet:
        parser.add_argument("--no-dynet", action="store_true", help="skip DyNet even when installed")
        parser.add_argument("--dynet-mem", type=positive_int, default=1024, help="DyNet's memory pool, MiB")
    parser.add_argument("--json", type=Path, help="write the results as JSON here")
    parser.add_argument("--plot", type=Path, help="write a PNG plot here")
    parser.add_argument("--no-progress", dest="progress", action="store_false")
    parser.add_argument("--smoke", action="store_true", help="a seconds-long run (for CI): tiny sizes")


class Progress:
    """A tqdm bar over a benchmark's configurations (or nothing, with --no-progress or without tqdm,
    an optional dependency: the ``bench`` extra)."""

    def __init__(self, total: int, enabled: bool, desc: str) -> None:
        self.bar: Any = None
        if enabled and importlib.util.find_spec("tqdm") is not None:
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc=desc, unit="config", file=sys.stderr)

    def start(self, what: str) -> None:
        """Shows what runs now."""
        if self.bar is not None:
            self.bar.set_postfix_str(what)

    def advance(self) -> None:
        """One configuration done."""
        if self.bar is not None:
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


DEVICES = ("cpu", "cuda", "array-api-strict")
"""What ``--device`` takes: NumPy on the CPU, CuPy on a CUDA GPU (against PyTorch on CUDA), or
array-api-strict, a CPU namespace that stands in for a device in tests of the plumbing."""


class Device:
    """Where a benchmark's monadl arrays live, and its PyTorch peer's tensors: ``xp`` is the arrays'
    namespace, ``torch_device`` the peer's device, ``put``/``get`` move arrays there and back, and
    ``synchronize`` waits for queued GPU work (CuPy's and PyTorch's), so that a timed segment ends
    when its work is done, not when it is queued."""

    def __init__(self, name: str) -> None:
        if name not in DEVICES:
            raise ValueError(f"device must be one of {DEVICES}, got {name!r}")
        self.name = name
        self.torch_device = "cuda" if name == "cuda" else "cpu"
        self.xp: Any
        if name == "cpu":
            import numpy

            self.xp = numpy
        elif name == "cuda":
            try:
                import cupy
            except ImportError as e:
                raise RuntimeError(
                    "--device cuda needs CuPy: pip install 'monadl[cuda13]' (or cuda12)"
                ) from e
            try:
                count = int(cupy.cuda.runtime.getDeviceCount())
            except Exception as e:
                raise RuntimeError(f"--device cuda: CuPy finds no CUDA driver ({e})") from e
            if count == 0:
                raise RuntimeError("--device cuda: CuPy finds no CUDA GPU")
            self.xp = cupy
        else:
            import array_api_strict

            self.xp = array_api_strict

    @property
    def is_numpy(self) -> bool:
        """Whether the arrays are NumPy's (the hand-written NumPy baselines run only then)."""
        return self.name == "cpu"

    def put(self, array: Any) -> Any:
        """A NumPy array (or a number) as an array of this device's namespace."""
        import numpy

        return array if self.is_numpy else self.xp.asarray(numpy.asarray(array))

    def get(self, array: Any) -> Any:
        """An array of this device's namespace (or a torch tensor, or a number) as a NumPy array."""
        return host_array(array)

    def synchronize(self) -> None:
        """Waits until the GPU's queued work is done (nothing to wait for on the CPU)."""
        if self.name != "cuda":
            return
        self.xp.cuda.Device().synchronize()
        import sys

        torch = sys.modules.get("torch")  # only if the benchmark uses it
        if torch is not None and torch.cuda.is_initialized():
            torch.cuda.synchronize()

    def describe(self) -> str:
        """The device in words, for a benchmark's report."""
        if self.name != "cuda":
            return self.name
        props = self.xp.cuda.runtime.getDeviceProperties(self.xp.cuda.Device().id)
        name = props["name"]
        return f"cuda: {name.decode() if isinstance(name, bytes) else name}, CuPy {self.xp.__version__}"

    def move_weights(self, weights: Any) -> None:
        """Moves each of ``weights`` (monadl weights, before any training step) to this device."""
        if self.is_numpy:
            return
        for w in weights:
            w.data = self.put(self.get(w.data))


def host_array(value: Any) -> Any:
    """A NumPy array of ``value``: an array of any namespace (``to_numpy``), a torch tensor
    (perhaps on the GPU), or a number."""
    import numpy

    if hasattr(value, "detach"):
        return value.detach().cpu().numpy()
    return numpy.asarray(to_numpy(value))


def add_device_option(parser: argparse.ArgumentParser) -> None:
    """``--device``: where monadl's arrays (and PyTorch's tensors) live."""
    parser.add_argument(
        "--device",
        choices=DEVICES,
        default="cpu",
        help="cpu: NumPy (and torch on the CPU); cuda: CuPy against PyTorch on CUDA, synchronised around "
        "every timed segment; array-api-strict: a stand-in namespace that tests the plumbing (default cpu)",
    )


def raised(result: Result[Any, Exception]) -> Any:
    """The value of ``result``, or its original exception raised (the benchmarks' models fail as
    plain Python code does)."""
    if isinstance(result, Failure):
        raise result.failure()
    return result.unwrap()
