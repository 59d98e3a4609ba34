"""The data of ``python -m monadl.bench suite``: the DyNet benchmark suite's tasks, read from files or
generated, and encoded as integers once, so that every implementation reads the same ids.

Real data (``--data DIR``, laid out as the project's shared data folder):

=========================  ==========================================================================
task                       files under ``DIR``
=========================  ==========================================================================
``bilstm-tagger``,         ``dynet-benchmark/tags/wikiner-sample.txt``: ``word|TAG ...`` a line;
``bilstm-tagger-withchar`` the first 90% train, the rest is held out
``treenn``                 ``sst/train.txt`` (train) and ``sst/dev.txt`` (held out; else the last
                           tenth of train), SST's bracketed trees
``rnnlm-batch``            ``dynet-benchmark/text/ptb-valid.txt`` (train), ``ptb-test.txt`` (held out)
=========================  ==========================================================================

Synthetic data (the default, nothing to download), of the real sets' shape and learnable:

* tagged sentences: Zipf-distributed word types, some of them capitalised names of one entity class
  each, tagged ``I-<class>`` (the rest ``O``), except that a name right after one of a few trigger
  words takes the trigger's class: the tag needs the word, its left neighbour, and (for a rare name)
  its spelling;
* trees: ``monadl.data.sst.synthetic_trees`` (labels by word polarities, negators, intensifiers);
* sentences for the language model: a first-order Markov chain over a Zipf vocabulary, each word
  with a few likely successors, of gamma-distributed lengths (about 21 words, as the Penn
  Treebank's).

Vocabularies follow the suite's scripts: a tagger's word with a training count of 5 or less is
unknown (``UNK``, id 0) and, in ``bilstm-tagger-withchar``, spelled by its characters between two
``<*>`` pad characters; ``treenn`` knows every training word (id 0 for the others); the language
model's vocabulary is every training word, with ``<s>`` (id 0, which ends every sentence and starts
the model) and ``<unk>`` (id 1, for words unseen in training).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from monadl.data import sst
from monadl.data.files import read_regular_file
from monadl.data.trees import Tree

TASKS = ("bilstm-tagger", "bilstm-tagger-withchar", "treenn", "rnnlm-batch")
UNITS = {
    "bilstm-tagger": "words",
    "bilstm-tagger-withchar": "words",
    "treenn": "nodes",
    "rnnlm-batch": "words",
}

TAGGED_FILE = Path("dynet-benchmark/tags/wikiner-sample.txt")
TEXT_TRAIN, TEXT_HELD_OUT = (
    Path("dynet-benchmark/text/ptb-valid.txt"),
    Path("dynet-benchmark/text/ptb-test.txt"),
)
SST_TRAIN, SST_HELD_OUT = Path("sst/train.txt"), Path("sst/dev.txt")

RARE = 5  # a tagger's word seen this many times or fewer in training is unknown (the scripts' wc[w] > 5)
UNK = 0  # the taggers' word id of a rare word
CHAR_UNK, PAD_CHAR = 0, 1  # their char ids of an unseen character and of the pad ``<*>``
START, LM_UNK = 0, 1  # the language model's ``<s>`` and ``<unk>``


class TaggedSentence(NamedTuple):
    """A tagged sentence as ids: per word its id (``UNK`` for a rare one), its tag, and for a rare
    word its spelling (char ids, ``<*>`` at both ends; None for a frequent word)."""

    words: tuple[int, ...]
    tags: tuple[int, ...]
    spellings: tuple[tuple[int, ...] | None, ...]


Sentence = tuple[int, ...]
"""A language model's sentence: word ids, ending with ``START`` (``<s>``)."""


class DataError(ValueError):
    """A data file that cannot be read as its task's format (naming the file and the line)."""


# ---------------------------------------------------------------------------------------------------
# Readers


def _lines(path: Path) -> list[str]:
    try:
        text = read_regular_file(path).decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not valid UTF-8 ({e.reason} at byte {e.start})") from e
    return text.removeprefix("\ufeff").splitlines()


def read_tagged(path: Path) -> list[list[tuple[str, str]]]:
    """The sentences of a ``word|TAG word|TAG ...`` file, one a line (blank lines skipped); a token
    without ``|`` is an error naming its line."""
    sentences = []
    for number, line in enumerate(_lines(path), start=1):
        sentence = []
        for token in line.split():
            word, bar, tag = token.rpartition("|")
            if not bar or not word or not tag:
                raise DataError(f"{path}, line {number}: {token!r} is not word|TAG")
            sentence.append((word, tag))
        if sentence:
            sentences.append(sentence)
    return sentences


def read_text(path: Path) -> list[list[str]]:
    """The sentences of a text file of space-separated words, one a line (blank lines skipped)."""
    return [words for line in _lines(path) if (words := line.split())]


# ---------------------------------------------------------------------------------------------------
# Vocabularies and encodings


@dataclass(frozen=True)
class TaggerVocabulary:
    """Ids of a tagger: frequent words (``UNK`` = 0), tags, characters (0 unknown, 1 ``<*>``)."""

    words: dict[str, int]
    tags: dict[str, int]
    chars: dict[str, int]

    @classmethod
    def of(
        cls, train: Sequence[Sequence[tuple[str, str]]], held_out: Iterable[Sequence[tuple[str, str]]]
    ) -> TaggerVocabulary:
        """The words seen more than ``RARE`` times in ``train`` (by count, then alphabetically), the
        characters of its words, the tags of both sets (by first appearance)."""
        counts = Counter(word for sentence in train for word, _ in sentence)
        frequent = sorted((w for w, c in counts.items() if c > RARE), key=lambda w: (-counts[w], w))
        chars = sorted({c for word in counts for c in word})
        tags: dict[str, int] = {}
        for sentence in (*train, *held_out):
            for _, tag in sentence:
                tags.setdefault(tag, len(tags))
        return cls(
            {w: i for i, w in enumerate(["_UNK_", *frequent])},
            tags,
            {c: i for i, c in enumerate(["_UNK_", "<*>", *chars])},
        )

    def encode(self, sentence: Sequence[tuple[str, str]]) -> TaggedSentence:
        """``sentence`` as ids (see :class:`TaggedSentence`)."""
        words = tuple(self.words.get(w, UNK) for w, _ in sentence)
        spellings = tuple(
            None if i != UNK else (PAD_CHAR, *(self.chars.get(c, CHAR_UNK) for c in w), PAD_CHAR)
            for (w, _), i in zip(sentence, words, strict=True)
        )
        return TaggedSentence(words, tuple(self.tags[t] for _, t in sentence), spellings)


def lm_vocabulary(train: Iterable[Sequence[str]]) -> dict[str, int]:
    """``<s>`` (0), ``<unk>`` (1), then the training words by count, then alphabetically."""
    counts = Counter(w for sentence in train for w in sentence)
    words = sorted((w for w in counts if w not in ("<s>", "<unk>")), key=lambda w: (-counts[w], w))
    return {w: i for i, w in enumerate(["<s>", "<unk>", *words])}


def encode_sentence(words: Sequence[str], vocabulary: dict[str, int]) -> Sentence:
    """``words`` as ids (``<unk>`` for an unknown word), ``<s>`` appended."""
    return (*(vocabulary.get(w, LM_UNK) for w in words), START)


# ---------------------------------------------------------------------------------------------------
# A task's data


@dataclass
class TaskData:
    """One task's instances as ids: ``train`` (the pool the batches come from) and ``held_out``
    (the learning check's), the vocabulary sizes (``words``; ``tags``, ``chars``, ``labels``), and
    for ``treenn`` the training words by id (``vocabulary``: the trees keep their words)."""

    task: str
    train: list[Any]
    held_out: list[Any]
    sizes: dict[str, int]
    description: str
    vocabulary: list[str] = field(default_factory=list)

    def units(self, instance: Any) -> int:
        """The words (of a sentence) or nodes (of a tree) of ``instance``: what its loss sums over."""
        return units(self.task, instance)

    def word_ids(self) -> dict[str, int]:
        """``treenn``: a word's id (id 0 for an unknown word: ``.get(word, 0)``)."""
        return {w: i for i, w in enumerate(self.vocabulary)}


def units(task: str, instance: Any) -> int:
    """The words or nodes of ``instance`` of ``task`` (every one has a loss)."""
    if task == "treenn":
        return 2 * len(instance) - 1
    if task == "rnnlm-batch":
        return len(instance)
    return len(instance.words)


def to_json(task: str, instance: Any) -> Any:
    """``instance`` as JSON (for a worker process); :func:`from_json` reads it back."""
    if task == "treenn":
        return sst.format_tree(instance)
    if task == "rnnlm-batch":
        return list(instance)
    return [
        list(instance.words),
        list(instance.tags),
        [None if s is None else list(s) for s in instance.spellings],
    ]


def from_json(task: str, value: Any) -> Any:
    """The instance that :func:`to_json` wrote."""
    if task == "treenn":
        return sst.parse_tree(value)
    if task == "rnnlm-batch":
        return tuple(value)
    words, tags, spellings = value
    return TaggedSentence(
        tuple(words), tuple(tags), tuple(None if s is None else tuple(s) for s in spellings)
    )


def dump(data: TaskData, path: Path) -> None:
    """``data`` as one JSON file (read back by :func:`load`)."""
    record = {
        "task": data.task,
        "train": [to_json(data.task, x) for x in data.train],
        "held_out": [to_json(data.task, x) for x in data.held_out],
        "sizes": data.sizes,
        "description": data.description,
        "vocabulary": data.vocabulary,
    }
    path.write_text(json.dumps(record))


def load(path: Path) -> TaskData:
    """The :class:`TaskData` that :func:`dump` wrote."""
    record = json.loads(path.read_text())
    task = record["task"]
    return TaskData(
        task,
        [from_json(task, x) for x in record["train"]],
        [from_json(task, x) for x in record["held_out"]],
        record["sizes"],
        record["description"],
        record["vocabulary"],
    )


def _summary(data: TaskData) -> str:
    if not data.train or not data.held_out:
        raise DataError(
            f"{data.task}: {data.description} gives no {'held-out' if data.train else 'training'} instances"
        )
    counts = [data.units(x) for x in data.train]
    unit = UNITS[data.task]
    return (
        f"{len(data.train)} train / {len(data.held_out)} held out, "
        f"{sum(counts) / len(counts):.1f} {unit} per instance ({min(counts)}-{max(counts)}), "
        + ", ".join(f"{n} {k}" for k, n in data.sizes.items())
    )


def tagged_task(
    task: str, train: list[list[tuple[str, str]]], held_out: list[list[tuple[str, str]]], source: str
) -> TaskData:
    """A tagger task of ``train`` and ``held_out`` (raw sentences), its vocabulary from ``train``."""
    vocabulary = TaggerVocabulary.of(train, held_out)
    data = TaskData(
        task,
        [vocabulary.encode(s) for s in train],
        [vocabulary.encode(s) for s in held_out],
        {"words": len(vocabulary.words), "tags": len(vocabulary.tags), "chars": len(vocabulary.chars)},
        source,
    )
    summary = _summary(data)
    rare = sum(w == UNK for s in data.train for w in s.words) / sum(len(s.words) for s in data.train)
    data.description = f"{source}: {summary}; {rare:.0%} of training words rare (count <= {RARE})"
    return data


def text_task(train: list[list[str]], held_out: list[list[str]], source: str) -> TaskData:
    """``rnnlm-batch`` over ``train`` and ``held_out`` (raw sentences), its vocabulary from ``train``."""
    vocabulary = lm_vocabulary(train)
    data = TaskData(
        "rnnlm-batch",
        [encode_sentence(s, vocabulary) for s in train],
        [encode_sentence(s, vocabulary) for s in held_out],
        {"words": len(vocabulary)},
        source,
    )
    data.description = f"{source}: {_summary(data)}"
    return data


def tree_task(train: list[Tree], held_out: list[Tree], source: str) -> TaskData:
    """``treenn`` over ``train`` and ``held_out``, its vocabulary every word of ``train``."""
    vocabulary = sst.Vocabulary.from_trees(train)
    labels = 1 + max(node.label for tree in (*train, *held_out) for node in tree.nodes())
    data = TaskData(
        "treenn",
        train,
        held_out,
        {"words": len(vocabulary), "labels": labels},
        source,
        list(vocabulary.words),
    )
    data.description = f"{source}: {_summary(data)}"
    return data


# ---------------------------------------------------------------------------------------------------
# Loading


class Missing(Exception):
    """A task's files are absent under ``--data`` (the task is then skipped, with this message)."""


def load_task(task: str, folder: Path | None, *, seed: int = 0, smoke: bool = False) -> TaskData:
    """``task``'s data: read from ``folder`` (raises :class:`Missing` naming an absent file), or
    synthetic when ``folder`` is None (``smoke``: a few short instances)."""
    if folder is None:
        return synthetic_task(task, seed=seed, smoke=smoke)

    def need(relative: Path) -> Path:
        path = folder / relative
        if not path.is_file():
            raise Missing(f"{task}: skipped, {path} not found")
        return path

    if task in ("bilstm-tagger", "bilstm-tagger-withchar"):
        path = need(TAGGED_FILE)
        sentences = read_tagged(path)
        cut = int(len(sentences) * 0.9)
        return tagged_task(task, sentences[:cut], sentences[cut:], f"{path} (first 90% train, rest held out)")
    if task == "treenn":
        train_path = need(SST_TRAIN)
        train = sst.read_trees(train_path)
        held_path = folder / SST_HELD_OUT
        if held_path.is_file():
            return tree_task(train, sst.read_trees(held_path), f"{train_path} (held out: {held_path})")
        cut = len(train) - max(1, len(train) // 10)
        return tree_task(train[:cut], train[cut:], f"{train_path} (last tenth held out)")
    if task == "rnnlm-batch":
        train_path, held_path = need(TEXT_TRAIN), need(TEXT_HELD_OUT)
        return text_task(read_text(train_path), read_text(held_path), f"{train_path} (held out: {held_path})")
    raise ValueError(f"unknown task {task!r}; the tasks: {', '.join(TASKS)}")


def synthetic_task(task: str, *, seed: int = 0, smoke: bool = False) -> TaskData:
    """``task``'s synthetic data (see the module): about the size and shape of the real sets, or a
    few short instances if ``smoke``."""
    if task in ("bilstm-tagger", "bilstm-tagger-withchar"):
        count, (low, high) = (120, (3, 8)) if smoke else (1700, (5, 41))
        sentences = synthetic_tagged(count, seed=seed, min_words=low, max_words=high)
        cut = int(count * 0.9)
        return tagged_task(task, sentences[:cut], sentences[cut:], "synthetic tagged sentences")
    if task == "treenn":
        count, (low, high) = (60, (2, 6)) if smoke else (2000, (5, 35))
        trees = sst.synthetic_trees(count, seed=seed, min_leaves=low, max_leaves=high)
        cut = int(count * 0.9)
        return tree_task(trees[:cut], trees[cut:], f"synthetic SST-like trees, {low}-{high} leaves")
    if task == "rnnlm-batch":
        # 26,000 types, of which some 6,000 occur in training: the size of ptb-valid's vocabulary.
        count, vocabulary, length = (120, 60, 5.0) if smoke else (3600, 26000, 21.0)
        text = synthetic_text(count, seed=seed, vocabulary=vocabulary, mean_length=length)
        cut = int(count * 0.9)
        return text_task(text[:cut], text[cut:], "synthetic Markov-chain sentences")
    raise ValueError(f"unknown task {task!r}; the tasks: {', '.join(TASKS)}")


# ---------------------------------------------------------------------------------------------------
# Synthetic generators

_CLASSES = ("PER", "ORG", "LOC", "MISC")
_LETTERS = "abcdefghijklmnopqrstuvwxyz"


def _zipf(count: int, exponent: float = 1.0) -> np.ndarray:
    p: np.ndarray = 1.0 / np.arange(1, count + 1) ** exponent
    total: np.ndarray = p / p.sum()
    return total


def synthetic_tagged(
    count: int, *, seed: int = 0, types: int = 8000, min_words: int = 5, max_words: int = 41
) -> list[list[tuple[str, str]]]:
    """``count`` tagged sentences (see the module), ``min_words..max_words`` words each, deterministic
    under ``seed``. One in six word types is a capitalised name of an entity class; eight frequent
    lower-case words are triggers, two per class."""
    rng = np.random.default_rng(seed)
    spelled: set[str] = set()
    lexicon: list[tuple[str, str | None]] = []  # (word, entity class or None)
    while len(lexicon) < types:
        word = "".join(rng.choice(list(_LETTERS), size=int(rng.integers(2, 10))))
        if word in spelled:
            continue
        spelled.add(word)
        if len(lexicon) >= 40 and rng.random() < 1 / 6:  # the 40 most frequent types are lower case
            lexicon.append((word.capitalize(), _CLASSES[int(rng.integers(len(_CLASSES)))]))
        else:
            lexicon.append((word, None))
    triggers = {lexicon[k][0]: _CLASSES[k // 2 % len(_CLASSES)] for k in range(8)}
    p = _zipf(types)
    sentences = []
    for _ in range(count):
        ids = rng.choice(types, size=int(rng.integers(min_words, max_words + 1)), p=p)
        sentence = []
        previous = ""
        for k in ids:
            word, kind = lexicon[int(k)]
            if kind is not None and previous in triggers:
                kind = triggers[previous]
            sentence.append((word, "O" if kind is None else f"I-{kind}"))
            previous = word
        sentences.append(sentence)
    return sentences


def synthetic_text(
    count: int, *, seed: int = 0, vocabulary: int = 6000, mean_length: float = 21.0, successors: int = 6
) -> list[list[str]]:
    """``count`` sentences of a first-order Markov chain (see the module), deterministic under
    ``seed``: each word has ``successors`` likely next words (Zipf-weighted); one word in ten is
    drawn afresh from the vocabulary's Zipf distribution instead. Lengths are gamma-distributed,
    ``mean_length`` words on average (at least 2), like the Penn Treebank's."""
    rng = np.random.default_rng(seed)
    p = _zipf(vocabulary)
    nexts = rng.choice(vocabulary, size=(vocabulary, successors), p=p)
    weights = _zipf(successors, 0.8)
    sentences = []
    for _ in range(count):
        length = max(2, round(rng.gamma(3.0, mean_length / 3.0)))
        fresh = rng.choice(vocabulary, size=length, p=p)
        jumps = rng.random(length) < 0.1
        picks = rng.choice(successors, size=length, p=weights)
        word = int(fresh[0])
        sentence = [word]
        for t in range(1, length):
            word = int(fresh[t]) if jumps[t] else int(nexts[word, picks[t]])
            sentence.append(word)
        sentences.append([f"w{w}" for w in sentence])
    return sentences
