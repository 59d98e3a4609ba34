"""The BiLSTM tagger example (examples/bilstm_tagger.py): a step's cell calls merge across the
sentences, a short run learns the tags beyond the most frequent one, and the command line runs."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest

import monadl as ml
from examples import bilstm_tagger
from examples.bilstm_tagger import Tagger
from monadl.bench.suite_data import TaggedSentence


def small_task(count: int = 300) -> tuple[list[TaggedSentence], list[TaggedSentence]]:
    """Sentences of 20 word types, 3 to 8 words: a word of types 10..19 is a name, tagged 1, or 2
    right after word 0 (a trigger); every other word 0. The tag needs the word and its neighbour."""
    rng = np.random.default_rng(1)
    sentences = []
    for _ in range(count):
        words = tuple(int(w) for w in rng.integers(0, 20, size=int(rng.integers(3, 9))))
        tags = tuple(0 if w < 10 else 2 if k and words[k - 1] == 0 else 1 for k, w in enumerate(words))
        sentences.append(TaggedSentence(words, tags, (None,) * len(words)))
    return sentences[: count * 7 // 8], sentences[count * 7 // 8 :]


def test_a_steps_lstm_is_one_op_and_the_words_lookups_merge() -> None:
    train, _ = small_task()
    batch = train[:8]
    model = Tagger.new(20, 3, embedding=8, hidden=8, seed=0)
    with ml.Executor() as executor:
        model.step(batch, ml.Adam(0.01), executor)
        kinds = executor.last_stats.kinds
    # the BiLSTM over the whole batch, both directions: one op; every word's embedding and every
    # word's output row: one lookup each, merged across the sentences
    assert kinds["packed_lstm"] == 1 and kinds["take_rows"] == 2, kinds


def test_a_short_run_learns_the_tags_beyond_the_most_frequent_one() -> None:
    train, held_out = small_task()
    counts = Counter(tag for s in held_out for tag in s.tags)
    majority = max(counts.values()) / sum(counts.values())
    model = Tagger.new(20, 3, embedding=16, hidden=16, mlp=16, seed=0)
    adam = ml.Adam(0.02)
    before = model.accuracy(held_out)
    for epoch in range(4):
        order = np.random.default_rng(epoch).permutation(len(train))
        for k in range(0, len(train), 16):
            model.step([train[i] for i in order[k : k + 16]], adam)
    after = model.accuracy(held_out)
    assert after > max(before, majority) + 0.03, (before, majority, after)


def test_the_command_line_prints_the_held_out_accuracy_every_epoch(
    capsys: pytest.CaptureFixture[str],
) -> None:
    accuracies = bilstm_tagger.main(
        ["--smoke", "--epochs", "2", "--embedding", "8", "--hidden", "8", "--no-progress"]
    )
    out = capsys.readouterr().out
    assert len(accuracies) == 2 and all(0.0 <= a <= 1.0 for a in accuracies)
    assert out.count("held-out tag accuracy") == 2 and "synthetic tagged sentences" in out


def test_a_data_folder_without_the_sample_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        bilstm_tagger.main(["--data", str(tmp_path), "--no-progress"])
    assert exit_info.value.code == 2
    assert "wikiner-sample.txt not found" in capsys.readouterr().err


def test_the_benchmark_measures_the_examples_model() -> None:
    from monadl.bench import models
    from monadl.bench.tagger_model import Tagger as measured

    assert measured is Tagger
    assert vars(models)["Tagger"] is measured  # the models benchmark's, not a copy
