"""The character-level LSTM example (examples/char_lstm.py): its data, its loss in NumPy, the merging
of one time step across sentences of different lengths, a short run whose held-out perplexity falls,
and a checkpoint that resumes the run bit for bit."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest

import monadl as ml
from examples import char_lstm
from examples.char_lstm import TEXT, Alphabet, CharLstm, sentences

TINY = ["--hidden", "16", "--embedding", "8", "--sample", "20", "--no-progress"]


def test_the_sentences_are_the_text_and_of_many_lengths() -> None:
    parts = sentences()
    assert " ".join(parts) == " ".join(TEXT.split())
    assert all(p[-1] in ".!?" for p in parts)
    assert len({len(p) for p in parts}) > len(parts) // 2
    alphabet = Alphabet.of(TEXT)
    assert alphabet.decode(alphabet.encode(parts[0]).tolist()) == parts[0]
    assert len(alphabet) == len(set(TEXT))


def reference_nats(model: CharLstm, sequences: list[np.ndarray]) -> float:
    """The model's mean loss per predicted character, in plain NumPy."""
    p = {name: np.asarray(w.data, dtype=np.float64) for name, w in model.weights().items()}

    def sigmoid(x: np.ndarray) -> np.ndarray:
        return np.asarray(1.0 / (1.0 + np.exp(-x)))

    total, count = 0.0, 0
    for sequence in sequences:
        h = c = np.zeros(model.cell.hidden)
        for t in range(len(sequence) - 1):
            xh = np.concatenate([p["embedding.table"][sequence[t]], h])
            i, f, o = (sigmoid(xh @ p[f"cell.{g}.w"] + p[f"cell.{g}.b"]) for g in "ifo")
            c = i * np.tanh(xh @ p["cell.u.w"] + p["cell.u.b"]) + f * c
            h = o * np.tanh(c)
            logits = h @ p["readout.w"] + p["readout.b"]
            top = logits.max()
            total += float(top + np.log(np.sum(np.exp(logits - top))) - logits[sequence[t + 1]])
            count += 1
    return total / count


def test_the_loss_is_the_lstms_and_one_step_merges_across_sentences() -> None:
    alphabet = Alphabet.of(TEXT)
    sequences = [alphabet.encode(s) for s in ("The lamp.", "A ship passed at nine.", "She wrote.")]
    model = CharLstm.new(len(alphabet), 4, 6, seed=1)
    model.nats(sequences[:1])  # an operation's first call runs alone (it learns its results)
    with ml.Executor(batching=True) as merged, ml.Executor(batching=False) as alone:
        batched, unbatched = model.nats(sequences, merged), model.nats(sequences, alone)
        kinds, alone_kinds = merged.last_stats.kinds, alone.last_stats.kinds
    assert batched == pytest.approx(reference_nats(model, sequences), rel=1e-5)  # float32
    assert batched == pytest.approx(unbatched, rel=1e-6)
    # Sentences of 9, 22 and 10 characters: one launch of the cell per time step, 21, not 38.
    assert kinds["LSTMCell.__call__"] == max(len(s) for s in sequences) - 1
    assert alone_kinds["LSTMCell.__call__"] == sum(len(s) - 1 for s in sequences)


def test_the_optimizer_clips_the_global_norm_then_runs_adam() -> None:
    chain = char_lstm.optimizer(0.02, 1.0)
    assert isinstance(chain, ml.Chain)
    assert chain.transforms == (ml.clip_by_global_norm(1.0),) and chain.optimizer == ml.Adam(0.02)


def test_a_tiny_run_lowers_the_held_out_perplexity(capsys: pytest.CaptureFixture[str]) -> None:
    losses = char_lstm.main(["--epochs", "3", *TINY])
    assert len(losses) == 3 and losses[0] > losses[1] > losses[2]
    out = capsys.readouterr().out
    assert out.startswith("data: the built-in text")
    before = float(re.findall(r"before training: held-out perplexity ([\d.]+)", out)[0])
    after = [float(v) for v in re.findall(r"epoch \d: .* held-out perplexity ([\d.]+)", out)]
    assert len(after) == 3 and after[-1] < after[0] < before
    assert before == pytest.approx(len(Alphabet.of(TEXT)), rel=0.2)  # knowing nothing: the alphabet
    (sample,) = re.findall(r"sample: (.*)", out)
    assert sample.startswith("The ") and len(sample) == len("The ") + 20


def test_a_checkpoint_resumes_the_run_bit_for_bit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    whole, half = tmp_path / "whole.safetensors", tmp_path / "half.safetensors"
    straight = char_lstm.main(["--epochs", "2", "--save", str(whole), *TINY])
    first = char_lstm.main(["--epochs", "1", "--save", str(half), *TINY])
    resumed = char_lstm.main(["--epochs", "2", "--resume", str(half), "--save", str(half), *TINY])
    assert "resumed: " in capsys.readouterr().out
    assert first == straight[:1] and resumed == straight  # the losses, as floats: the same bits
    alphabet = len(Alphabet.of(TEXT))
    a, b = CharLstm.new(alphabet, 8, 16, seed=9), CharLstm.new(alphabet, 8, 16, seed=9)
    assert ml.load(whole, a) == ml.load(half, b)  # the metadata: epoch, losses, perplexities
    for (name, wa), wb in zip(a.weights().items(), b.weights().values(), strict=True):
        np.testing.assert_array_equal(np.asarray(wa.data), np.asarray(wb.data), err_msg=name)
        state_a, state_b = wa.optimizer_state, wb.optimizer_state
        assert state_a is not None and state_b is not None
        assert state_a[0] == state_b[0] == char_lstm.optimizer()  # the chain, clipping and Adam
        (m_a, v_a, steps_a), (m_b, v_b, steps_b) = state_a[1], state_b[1]
        np.testing.assert_array_equal(m_a, m_b, err_msg=name)
        np.testing.assert_array_equal(v_a, v_b, err_msg=name)
        assert steps_a == steps_b == 14  # 7 batches of 4 sentences, twice


def test_resuming_from_what_is_not_its_checkpoint_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "other.safetensors"
    ml.save(path, CharLstm.new(5, 8, 16))  # another alphabet
    with pytest.raises(SystemExit) as exited:
        char_lstm.main(["--resume", str(path), *TINY])
    assert exited.value.code == 2
    assert "argument --resume" in capsys.readouterr().err


def test_plot_writes_a_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    path = tmp_path / "curves.png"
    losses = char_lstm.main(["--epochs", "2", "--plot", str(path), *TINY])
    assert all(math.isfinite(v) for v in losses)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
