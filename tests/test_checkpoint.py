"""Checkpoints (``ml.save`` / ``ml.load``): complete (weights, optimizer states, buffers),
validated, atomic, and a resumed run is the run that was never interrupted, bit for bit."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from returns.result import Success

import monadl as ml
from monadl import ArrayWeight, FloatWeight
from monadl.nn import MLP

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Model(ml.Module):
    w: ArrayWeight
    b: ArrayWeight
    s: FloatWeight
    table: ArrayWeight
    drop: ml.Dropout  # a buffer: its generator
    stats: ml.ArrayBuffer  # a buffer no step changes: saved and loaded all the same

    def loss(self, step: int) -> ml.FloatLayer:
        rng = np.random.default_rng(step)
        x = rng.normal(size=(5, 3))
        rows = ml.take_rows(self.table, rng.integers(0, 6, size=4))
        h = ml.tanh(ml.linear(self.drop(x), self.w, self.b)) * self.s
        return ml.mean(h * h) + ml.mean(rows * rows)


def model(seed: int = 0, dtype: type[np.floating[Any]] = np.float64) -> Model:
    return Model(
        ArrayWeight.normal((3, 2), seed=seed, dtype=dtype),
        ArrayWeight.zeros((2,), dtype=dtype),
        FloatWeight(0.8),
        ArrayWeight.normal((6, 2), seed=seed + 1, dtype=dtype),
        ml.Dropout(0.3, seed=seed + 2),
        ml.ArrayBuffer(np.random.default_rng(seed + 3).normal(size=2).astype(dtype)),
    )


def buffer_states(m: Any) -> dict[str, tuple[str, dict[str, bytes]]]:
    """Every buffer's state: its JSON part (as text) and its arrays' bytes."""
    return {
        name: (repr(state.info), {k: a.dtype.str.encode() + a.tobytes() for k, a in state.arrays.items()})
        for name, state in ((name, b.state()) for name, b in ml.buffers_of(m).items())
    }


OPTIMIZERS = [
    ml.SGD(0.1),
    ml.Momentum(0.05, 0.9),
    ml.Adam(0.01),
    ml.Adagrad(0.1),
    ml.chain(ml.clip_by_global_norm(0.5), ml.Adam(ml.CosineDecay(0.02, steps=40))),
    ml.Momentum(ml.LinearWarmup(0.05, steps=10), 0.9, lazy=True),
]


def train(m: Model, optimizer: ml.Optimizer, steps: range) -> None:
    for step in steps:
        assert isinstance(m.loss(step).train_blocking(optimizer), Success)


def same(a: Model, b: Model) -> None:
    for (name, x), y in zip(a.weights().items(), b.weights().values(), strict=True):
        assert np.asarray(x.data).tobytes() == np.asarray(y.data).tobytes(), name
        assert repr(x.optimizer_state) == repr(y.optimizer_state), name
    assert buffer_states(a) == buffer_states(b)


@pytest.mark.parametrize("optimizer", OPTIMIZERS, ids=lambda o: repr(o)[:48])
def test_a_resumed_run_equals_the_uninterrupted_one_bit_for_bit(
    optimizer: ml.Optimizer, tmp_path: Path
) -> None:
    whole = model()
    train(whole, optimizer, range(40))
    first = model()
    train(first, optimizer, range(20))
    ml.save(tmp_path / "c.safetensors", first, metadata={"step": 20, "note": "half"})
    resumed = model(seed=7)  # other values: all of them come from the file
    assert ml.load(tmp_path / "c.safetensors", resumed) == {"step": 20, "note": "half"}
    same(first, resumed)
    train(resumed, optimizer, range(20, 40))
    same(whole, resumed)


def test_float32_weights_and_their_state_keep_their_dtype(tmp_path: Path) -> None:
    m = model(dtype=np.float32)
    train(m, ml.Adam(0.01), range(3))
    ml.save(tmp_path / "c.safetensors", m)
    back = model(seed=3, dtype=np.float32)
    ml.load(tmp_path / "c.safetensors", back)
    same(m, back)
    assert back.w.data.dtype == np.float32 and not back.w.data.flags.writeable


def test_names_that_differ_are_an_error_unless_partial(tmp_path: Path) -> None:
    m = model()
    ml.save(tmp_path / "c.safetensors", m)

    @dataclass
    class Other(ml.Module):
        w: ArrayWeight
        extra: ArrayWeight

    other = Other(ArrayWeight.zeros((3, 2), dtype=np.float64), ArrayWeight.zeros((1,)))
    with pytest.raises(ml.CheckpointError, match=r"missing \['extra'\], unexpected \['b', 's', 'table'\]"):
        ml.load(tmp_path / "c.safetensors", other)
    assert not other.w.data.any()  # nothing loaded
    ml.load(tmp_path / "c.safetensors", other, partial=True)
    np.testing.assert_array_equal(other.w.data, m.w.data)
    assert not other.extra.data.any()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda m: setattr(m, "w", ArrayWeight.zeros((2, 3), dtype=np.float64)),
            r"'w': the model's is float64 \(2, 3\), the file holds float64 \(3, 2\)",
        ),
        (
            lambda m: setattr(m, "b", ArrayWeight.zeros((2,), dtype=np.float32)),
            r"'b': the model's is float32 \(2,\)",
        ),
        (lambda m: setattr(m, "s", ArrayWeight.zeros(())), r"'s': .* \(a float weight\)"),
    ],
)
def test_a_weight_that_differs_is_named_and_nothing_changes(
    change: object, message: str, tmp_path: Path
) -> None:
    ml.save(tmp_path / "c.safetensors", model())
    target = model(seed=5)
    change(target)  # type: ignore[operator]
    before = {name: np.asarray(w.data).copy() for name, w in target.weights().items()}
    with pytest.raises(ml.CheckpointError, match=message):
        ml.load(tmp_path / "c.safetensors", target)
    for name, w in target.weights().items():
        np.testing.assert_array_equal(np.asarray(w.data), before[name])


@settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(data=st.data())
def test_a_damaged_file_is_a_checkpoint_error_never_a_crash(data: st.DataObject, tmp_path: Path) -> None:
    path = tmp_path / "c.safetensors"
    if not path.exists():
        m = model()
        train(m, ml.Adam(0.01), range(2))
        ml.save(path, m, metadata={"step": 2})
    raw = bytearray(path.read_bytes())
    how = data.draw(st.sampled_from(["truncate", "flip", "header"]))
    if how == "truncate":
        raw = raw[: data.draw(st.integers(0, len(raw) - 1))]
    elif how == "flip":
        for _ in range(data.draw(st.integers(1, 8))):
            raw[data.draw(st.integers(0, len(raw) - 1))] ^= data.draw(st.integers(1, 255))
    else:  # within the JSON header, where a change is a change of meaning, not of a number
        length = int.from_bytes(raw[:8], "little")
        k = data.draw(st.integers(8, min(8 + length, len(raw)) - 1))
        raw[k] = data.draw(st.sampled_from(list(b'{}[]":,0123456789-.eE tfnx')))
    damaged = tmp_path / "damaged.safetensors"
    damaged.write_bytes(bytes(raw))
    target = model(seed=9)
    before = {name: np.asarray(w.data).copy() for name, w in target.weights().items()}
    try:
        ml.load(damaged, target)
    except ml.CheckpointError:
        for name, w in target.weights().items():  # a refused file changed nothing
            np.testing.assert_array_equal(np.asarray(w.data), before[name])
    # Loaded: a flip in an array's bytes is another valid checkpoint; what was loaded is the file's.


def test_weight_data_assignment_checks_shape_and_dtype() -> None:
    w = ArrayWeight.zeros((3, 2), dtype=np.float64)
    with pytest.raises(ml.ShapeError, match=r"\(5, 5\).*the weight holds float64 \(3, 2\)"):
        w.data = np.zeros((5, 5))
    with pytest.raises(TypeError, match=r"ArrayWeight\.data"):
        w.data = np.zeros((3, 2), dtype=np.int64)
    source = np.ones((3, 2))
    w.data = source
    source[0, 0] = 7.0  # the weight holds a copy of its own
    assert w.data[0, 0] == 1.0 and not w.data.flags.writeable


WRITER = """
import sys
import numpy as np
import monadl as ml
sys.path.insert(0, {tests!r})
from test_checkpoint import model
path = sys.argv[1]
a, b = model(0), model(1)
big = ml.ArrayWeight(np.zeros((256, 256)))  # a file large enough to be caught half-written
print("ready", flush=True)
while True:
    for m, fill in ((a, 1.0), (b, 2.0)):
        big.data = np.full((256, 256), fill)
        ml.save(path, [m, big], metadata={{"fill": fill}})
"""


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL")
def test_a_save_killed_at_any_moment_leaves_the_old_or_the_new_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "c.safetensors"
    rng = random.Random(5)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    script = WRITER.format(tests=str(ROOT / "tests"))
    deadline = time.monotonic() + 60
    for _ in range(12):
        writer = subprocess.Popen([sys.executable, "-c", script, str(path)], stdout=subprocess.PIPE, env=env)
        assert writer.stdout is not None and writer.stdout.readline().strip() == b"ready"
        time.sleep(rng.uniform(0.0, 0.15))
        writer.kill()
        writer.wait(timeout=30)
        assert time.monotonic() < deadline
        if not path.exists():
            continue  # killed before its first rename
        loaded, big = model(9), ArrayWeight(np.zeros((256, 256)))
        fill = ml.load(path, [loaded, big])["fill"]
        assert fill in (1.0, 2.0)
        np.testing.assert_array_equal(big.data, np.full((256, 256), fill))
        expected = model(0) if fill == 1.0 else model(1)
        np.testing.assert_array_equal(loaded.w.data, expected.w.data)
    leftovers = [p.name for p in tmp_path.iterdir() if p.name != path.name]
    ml.save(path, model())  # the next save removes the temporary files of killed writers
    assert [p.name for p in tmp_path.iterdir()] == [path.name], leftovers


def readme_classifier() -> str:
    """The README's model with ``Dropout``: its code up to the line that makes ``model``."""
    text = (ROOT / "README.md").read_text()
    block = next(b for b in text.split("```python\n")[1:] if "class Classifier(" in b).split("```")[0]
    lines = block.splitlines()
    made = next(k for k, line in enumerate(lines) if line.startswith("model = Classifier("))
    return "\n".join(lines[: made + 1]) + "\n"


RESUME = """
import sys
import numpy as np
{classifier}
from monadl.nn import MLP, Dropout


def steps(model, begin, end):
    for step in range(begin, end):
        rng = np.random.default_rng(step)
        x, labels = rng.normal(size=(16, 784)), rng.integers(0, 10, size=16)
        ml.cross_entropy(model(x), labels).train_blocking(ml.Adam(1e-3)).unwrap()


path, begin, end = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
if begin:  # resumed: every value (weights, optimizer state, dropout generator) from the file
    model = Classifier(MLP.new([784, 128, 10], seed=5), Dropout(0.2, seed=6))
    assert ml.load(path, model) == {{"step": begin}}
steps(model, begin, end)
ml.save(path, model, metadata={{"step": end}})
"""


def test_the_readme_classifier_with_dropout_resumed_in_a_new_process_is_the_uninterrupted_run(
    tmp_path: Path,
) -> None:
    script = RESUME.format(classifier=readme_classifier())
    assert "Dropout(" in script and "self.drop(" in script  # the README's model still has dropout
    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    def run(path: Path, begin: int, end: int) -> None:
        command = [sys.executable, "-c", script, str(path), str(begin), str(end)]
        subprocess.run(command, env=env, cwd=tmp_path, check=True, timeout=240)

    run(tmp_path / "whole.safetensors", 0, 6)  # six steps in one process
    run(tmp_path / "resumed.safetensors", 0, 3)  # three, saved; three more in another process
    run(tmp_path / "resumed.safetensors", 3, 6)
    whole, resumed = ({"body": MLP.new([784, 128, 10], seed=k)} for k in (7, 8))  # (the weights alone)
    ml.load(tmp_path / "whole.safetensors", whole, partial=True)
    ml.load(tmp_path / "resumed.safetensors", resumed, partial=True)
    for (name, a), b in zip(ml.weights_of(whole).items(), ml.weights_of(resumed).values(), strict=True):
        np.testing.assert_array_equal(np.asarray(b.data), np.asarray(a.data), err_msg=name)
    # Weights, optimizer states and generators: the same bytes (a checkpoint is one model's bytes).
    assert (tmp_path / "whole.safetensors").read_bytes() == (tmp_path / "resumed.safetensors").read_bytes()
