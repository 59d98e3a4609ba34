"""The character Transformer example (examples/transformer_lm.py): its data, its loss against
PyTorch's model with the same weights where PyTorch is installed, and a short run whose held-out
perplexity falls."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import monadl as ml
from examples import transformer_lm
from examples.transformer_lm import Alphabet, TransformerLm, batches, text, windows

TINY = ["--width", "16", "--heads", "2", "--layers", "1", "--context", "16", "--characters", "6000"]


def test_the_text_and_its_windows() -> None:
    corpus = text(5000)
    assert len(corpus) == 5000 and "statement" in corpus
    alphabet = Alphabet.of(corpus)
    ids = alphabet.encode(corpus)
    cut = windows(ids, 16)
    assert cut.shape == ((len(ids) - 1) // 16, 17)
    np.testing.assert_array_equal(cut[1, 0], cut[0, -1])  # consecutive: each character predicted once
    np.testing.assert_array_equal(cut[0], ids[:17])
    drawn = batches(ids, 16, 4, 3, np.random.default_rng(0))
    assert len(drawn) == 3 and all(b.shape == (4, 17) for b in drawn)


def test_the_loss_is_pytorchs() -> None:
    torch = pytest.importorskip("torch")
    alphabet = Alphabet.of(text(3000))
    ids = alphabet.encode(text(3000))
    model = TransformerLm.new(len(alphabet), 8, 8, 2, 1, seed=3)
    batch = batches(ids, 8, 3, 1, np.random.default_rng(1))[0]
    mine = model.nats(batch)

    def t(w: ml.ArrayWeight | ml.FloatWeight | None) -> Any:
        assert w is not None
        return torch.tensor(np.asarray(w.data, dtype=np.float64))

    w = model.weights()
    layer = model.layers[0]
    x = t(w["embedding.table"])[torch.tensor(batch[:, :-1])] + t(w["positions"])
    h = torch.nn.functional.layer_norm(x, (8,), t(layer.norm1.weight), t(layer.norm1.bias))
    qkv = h @ t(layer.attention.qkv.w) + t(layer.attention.qkv.b)
    q, k, v = (z.view(3, 8, 2, 4).transpose(1, 2) for z in qkv.split(8, dim=-1))
    a = (
        torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        .transpose(1, 2)
        .reshape(3, 8, 8)
    )
    x = x + a @ t(layer.attention.out.w) + t(layer.attention.out.b)
    h = torch.nn.functional.layer_norm(x, (8,), t(layer.norm2.weight), t(layer.norm2.bias))
    x = x + torch.relu(h @ t(layer.ff1.w) + t(layer.ff1.b)) @ t(layer.ff2.w) + t(layer.ff2.b)
    logits = torch.nn.functional.layer_norm(x, (8,), t(model.norm.weight), t(model.norm.bias))
    logits = logits @ t(model.readout.w) + t(model.readout.b)
    expected = torch.nn.functional.cross_entropy(
        logits.reshape(-1, len(alphabet)), torch.tensor(batch[:, 1:]).reshape(-1)
    )
    assert mine == pytest.approx(expected.item(), rel=1e-5)  # the model is float32


def test_a_short_run_lowers_the_held_out_perplexity(capsys: pytest.CaptureFixture[str]) -> None:
    perplexities = transformer_lm.main([*TINY, "--epochs", "2", "--steps", "15", "--no-progress"])
    out = capsys.readouterr().out
    printed = [float(p) for p in re.findall(r"held-out perplexity ([\d.]+)", out)]
    assert len(printed) == 3 and printed == pytest.approx(perplexities, abs=0.01)
    assert all(math.isfinite(p) for p in perplexities)
    assert perplexities[-1] < perplexities[0] * 0.5


def test_the_plot(tmp_path: object) -> None:
    pytest.importorskip("matplotlib")
    path = f"{tmp_path}/curves.png"
    transformer_lm.main([*TINY, "--epochs", "1", "--steps", "2", "--no-progress", "--plot", path])
    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_the_example_holds_its_model() -> None:
    """A reader of examples/transformer_lm.py sees the model: it is defined there, not imported."""
    assert TransformerLm.__module__ == transformer_lm.__name__
    source = Path(transformer_lm.__file__).read_text(encoding="utf-8")
    assert "class TransformerLm(ml.Module):" in source
    assert "monadl.bench" not in source.split('"""', 2)[2]


@pytest.mark.parametrize(("sizes", "seed"), [((8, 8, 2, 1), 3), ((6, 12, 3, 2), 0)])
def test_the_benchmark_measures_the_examples_model(sizes: tuple[int, int, int, int], seed: int) -> None:
    """The ``transformer`` workload of ``python -m monadl.bench models`` measures the package's copy
    of the model: the same weights from a seed, the same loss, and the same after a step."""
    from monadl.bench import models
    from monadl.bench.transformer_model import TransformerLm as Measured

    assert vars(models)["TransformerLm"] is Measured
    context, width, heads, layers = sizes
    alphabet = Alphabet.of(text(3000))
    mine = TransformerLm.new(len(alphabet), context, width, heads, layers, seed=seed)
    measured = Measured.new(len(alphabet), context, width, heads, layers, seed=seed)
    ours, theirs = mine.weights(), measured.weights()
    assert list(ours) == list(theirs)
    for name, weight in ours.items():
        assert np.asarray(weight.data).dtype == np.asarray(theirs[name].data).dtype == np.float32, name
        np.testing.assert_array_equal(weight.data, theirs[name].data, err_msg=name)
    ids = alphabet.encode(text(3000))
    batch, short = batches(ids, context, 3, 2, np.random.default_rng(seed))
    assert mine.nats(batch) == measured.nats(batch)
    assert mine.nats(short[:, : context // 2 + 1]) == measured.nats(short[:, : context // 2 + 1])
    adam = ml.chain(ml.clip_by_global_norm(1.0), ml.Adam(1e-2))
    step = [model.loss(batch).train_blocking(adam).unwrap() for model in (mine, measured)]
    assert step[0] == step[1]
    assert mine.nats(short) == measured.nats(short)
