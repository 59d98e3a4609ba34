"""The Stanford Sentiment Treebank in its PTB-style bracketed form, a vocabulary, and a synthetic twin.

A file holds one binary tree per line, a sentiment label 0..4 (very negative .. very positive) on every
node: ``(3 (2 It) (4 (2 's) (4 good)))``. Words keep their PTB escapes verbatim (``-LRB-``, ``\\/``),
and a word runs up to its closing parenthesis, so it may contain a space: ``(2 8 1\\/2)``. The official
release has ``train.txt`` (8,544 trees), ``dev.txt`` (1,101) and ``test.txt`` (2,210).

``parse_tree`` is iterative (SST trees can be deep; no Python recursion) and reports malformed input
as ``SstFormatError`` naming the source, line and column. ``read_trees`` reads a file, ``load_sst`` a
directory of the three splits. ``Vocabulary`` maps words to ids (0 is ``<unk>``); ``encode`` turns a
tree into post-order arrays for a model. ``synthetic_trees`` / ``synthetic_treebank`` generate a
learnable synthetic treebank (words with polarities, negators, intensifiers), the default when SST is
absent. Entry point: ``open_dataset(path)``, with ``path=None`` for the synthetic data; every
``Treebank`` says which data it is with ``describe()``.
"""

from __future__ import annotations

import os
import random
import re
import stat
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, ClassVar, Final, NamedTuple

import numpy as np
import numpy.typing as npt

from monadl.data.files import atomic_write_bytes, check_path, read_regular_file
from monadl.data.trees import Tree
from monadl.typeclasses.backend import is_integer

__all__ = [
    "NUM_LABELS",
    "SPLITS",
    "SST_SPLIT_SIZES",
    "EncodedTree",
    "SstFormatError",
    "StrPath",
    "SyntheticLexicon",
    "Treebank",
    "Vocabulary",
    "encode",
    "format_tree",
    "leaf_ids",
    "load_sst",
    "open_dataset",
    "parse_tree",
    "read_trees",
    "synthetic_lexicon",
    "synthetic_treebank",
    "synthetic_trees",
    "write_trees",
]

StrPath = str | os.PathLike[str]

NUM_LABELS: Final = 5
SPLITS: Final[tuple[str, ...]] = ("train", "dev", "test")
#: The number of trees in each split of the official release.
SST_SPLIT_SIZES: Final[Mapping[str, int]] = MappingProxyType({"train": 8544, "dev": 1101, "test": 2210})


# ---------------------------------------------------------------------------------------------------
# Parsing


class SstFormatError(ValueError):
    """Malformed SST text; the message names the source, the line and the column (1-based)."""

    def __init__(self, source: str, line: int, column: int, reason: str) -> None:
        super().__init__(f"{source}, line {line}, column {column}: {reason}")
        self.source = source
        self.line = line
        self.column = column
        self.reason = reason

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.source, self.line, self.column, self.reason))


# The tokens, told apart by ``lastindex``: 2, a whole leaf '(label word)' (labels 1, word 2); 3, the
# '(label' that opens an inner node; None, anything else, by its first character: ')', a run of
# spaces, or stray text (everything up to the next parenthesis). A token swallows the spaces after it.
# Only ASCII spaces and tabs separate tokens: SST has words with a non-breaking space inside (U+00A0).
# A leaf's word is runs of other characters joined by spaces, matched possessively: a lazy word
# followed by ``[ \t]*\)`` would rescan a run of spaces at every character, quadratic on a long
# unclosed leaf.
_TOKENS: Final = re.compile(
    r"\([ \t]*([^ \t()]+)[ \t]+([^ \t()]+(?:[ \t]+[^ \t()]+)*+)[ \t]*+\)[ \t]*"
    r"|\([ \t]*([^ \t()]*)[ \t]*"
    r"|\)[ \t]*|[ \t]+|[^()]+"
)
_INTEGER: Final = re.compile(r"[+-]?[0-9]+")
_LABELS: Final = {str(i): i for i in range(NUM_LABELS)}
_SPACE: Final = " \t"
_WORD: Final = re.compile(r"[^ \t()\n\r](?:[^()\n\r]*[^ \t()\n\r])?")


class _Open:
    """An inner node being parsed: its label, the index of its '(', and its subtrees so far."""

    __slots__ = ("children", "label", "start", "word")

    def __init__(self, label: int, start: int) -> None:
        self.label = label
        self.start = start
        self.word: str | None = None  # only in malformed input: a word where subtrees belong
        self.children: list[Tree] = []


def _excerpt(text: str, index: int) -> str:
    if index >= len(text):
        return "the end of the line"
    chunk = text[index : index + 20]
    return repr(chunk + "..." if index + 20 < len(text) else chunk)


def _quote(token: str) -> str:
    token = token.rstrip(_SPACE)
    return repr(token if len(token) <= 20 else token[:20] + "...")


def parse_tree(line: str, *, source: str = "<string>", line_number: int = 1) -> Tree:
    """Parse one bracketed tree such as ``(3 (2 It) (4 good))``; raise ``SstFormatError`` if malformed.

    Labels are integers 0..4; a word is the text after its label up to the closing parenthesis, kept
    verbatim but for the spaces (ASCII space, tab) around it. Spaces between tokens and a trailing line
    break are allowed. ``source`` and ``line_number`` go into error messages, with the 1-based column.
    """

    def fail(index: int, reason: str) -> SstFormatError:
        return SstFormatError(source, line_number, index + 1, reason)

    text = line[:-1] if line.endswith("\n") else line
    text = text[:-1] if text.endswith("\r") else text
    for brk in ("\n", "\r"):
        if (at := text.find(brk)) >= 0:
            raise fail(at, "a line break inside the tree: expected one tree on one line")
    stack: list[_Open] = []
    root: Tree | None = None
    root_end = 0  # the column of the root's ')'
    for m in _TOKENS.finditer(text):
        kind = m.lastindex
        if kind is not None:  # '(': a leaf or an inner node
            if stack:
                parent = stack[-1]
                if parent.word is not None or len(parent.children) == 2:
                    raise fail(m.start(), _misplaced_subtree(parent))
            elif root is not None:
                raise fail(m.start(), f"trailing text after the tree that ends at column {root_end}")
            group = 1 if kind == 2 else 3
            label = _LABELS.get(m.group(group))
            if label is None:
                label = _label(m.group(group), m.start(group), text, fail)
            if kind == 3:
                stack.append(_Open(label, m.start()))
                continue
            tree = Tree(label, word=m.group(2))
            end = m.end(2)
        else:
            first = m.group()[0]
            if first in _SPACE:
                continue
            if first != ")":  # stray text
                if not stack:
                    where = f"after the tree that ends at column {root_end}" if root else "before the tree"
                    raise fail(m.start(), f"text {_quote(m.group())} {where}: expected '('")
                node = stack[-1]
                if node.children:
                    raise fail(
                        m.start(),
                        f"text {_quote(m.group())} after a subtree of the node opened at column "
                        f"{node.start + 1}: expected '(' or ')'",
                    )
                node.word = m.group().rstrip(_SPACE)  # a leaf, unless a subtree follows (an error)
                continue
            if not stack:
                if root is not None:
                    raise fail(m.start(), f"unbalanced ')': the tree already ended at column {root_end}")
                raise fail(m.start(), "unbalanced ')': expected '(' to start a tree")
            node = stack.pop()
            if len(node.children) == 2:
                tree = Tree(node.label, left=node.children[0], right=node.children[1])
            elif node.word is not None:
                tree = Tree(node.label, word=node.word)
            elif node.children:
                raise fail(
                    node.start,
                    f"a node with one subtree (it closes at column {m.start() + 1}): "
                    "expected a word or two subtrees",
                )
            else:
                raise fail(m.start(), "an empty leaf: expected a word or two subtrees before ')'")
            end = m.start()
        if stack:
            stack[-1].children.append(tree)
        else:
            root = tree
            root_end = text.index(")", end) + 1
    if stack:
        unclosed = f"{len(stack)} nodes are" if len(stack) > 1 else "1 node is"
        raise fail(
            len(text),
            f"unbalanced '(': the line ends while {unclosed} open (the innermost opened at column "
            f"{stack[-1].start + 1}): expected ')'",
        )
    if root is None:
        raise fail(0, "expected a tree, found an empty line")
    return root


def _misplaced_subtree(parent: _Open) -> str:
    if parent.word is not None:
        return (
            f"a subtree after the word {parent.word!r} of the node opened at column {parent.start + 1}: "
            "a node holds either one word or two subtrees"
        )
    return (
        f"a third subtree in the node opened at column {parent.start + 1}: "
        "expected ')' after two subtrees (trees are binary)"
    )


def _label(label: str, at: int, text: str, fail: Callable[[int, str], SstFormatError]) -> int:
    """The label at index ``at``, checked to be an integer 0..4 (the slow path: "0".."4" are looked up)."""
    if not label:
        raise fail(at, f"a missing label: expected an integer 0..4 after '(', found {_excerpt(text, at)}")
    if not _INTEGER.fullmatch(label):
        raise fail(at, f"expected an integer label 0..4, found {label!r}")
    digits = label.lstrip("+-").lstrip("0")
    if len(digits) > 3:  # far out of range (and int() refuses > 4,300 digits)
        shown = label if len(label) <= 20 else f"{label[:10]}...{label[-5:]} ({len(label)} characters)"
        raise fail(at, f"label {shown} is outside 0..{NUM_LABELS - 1}")
    value = -int(digits or "0") if label.startswith("-") else int(digits or "0")  # (zeros: any number)
    if not 0 <= value < NUM_LABELS:
        raise fail(at, f"label {value} is outside 0..{NUM_LABELS - 1}")
    return value


def format_tree(tree: Tree) -> str:
    """The bracketed form of ``tree``, as in the SST files: ``(label word)`` or ``(label left right)``."""
    return tree.render(
        lambda leaf: f"({_writable_label(leaf)} {_writable_word(leaf)})",
        lambda node: (f"({_writable_label(node)} ", " ", ")"),
    )


def _writable_label(tree: Tree) -> int:
    label = tree.label
    if not is_integer(label) or not 0 <= label < NUM_LABELS:
        raise ValueError(
            f"the label {label!r} cannot be written: SST's labels are the integers 0..{NUM_LABELS - 1}"
        )
    return label


def _writable_word(leaf: Tree) -> str:
    word = leaf.word
    if word is None or not _WORD.fullmatch(word):
        raise ValueError(
            f"the word {word!r} cannot be written in the bracketed format: it must be "
            "non-empty, without parentheses or line breaks, and not start or end with a space"
        )
    return word


# ---------------------------------------------------------------------------------------------------
# Files


def read_trees(path: StrPath) -> list[Tree]:
    """The trees of a UTF-8 file, one per line, blank lines skipped; errors name the file and line.

    Only a regular file is read: a FIFO or a device is refused by what it is, not opened."""
    p = Path(path)
    data = read_regular_file(p)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        bad_line = data.count(b"\n", 0, e.start) + 1
        column = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        raise SstFormatError(
            str(p), bad_line, column, f"not valid UTF-8 (byte 0x{data[e.start]:02x}; column counted in bytes)"
        ) from e
    text = text.removeprefix("\ufeff")
    trees: list[Tree] = []
    for number, line in enumerate(text.split("\n"), start=1):
        if line.strip(" \t\r"):
            trees.append(parse_tree(line, source=str(p), line_number=number))
    return trees


def write_trees(trees: Iterable[Tree], path: StrPath) -> Path:
    """Write ``trees`` one per line (``format_tree``), to a temporary file renamed into place."""
    p = Path(path)
    atomic_write_bytes(p, "".join(format_tree(t) + "\n" for t in trees).encode("utf-8"))
    return p


class Treebank(dict[str, list[Tree]]):
    """Trees by split name (``train``, ``dev``, ``test``): a plain dict that can ``describe()`` itself."""

    source: str

    def __init__(self, splits: Mapping[str, list[Tree]], *, source: str) -> None:
        super().__init__(splits)
        self.source = source

    def describe(self) -> str:
        """Which data this is, for logs and reports: the source, then trees and words per split."""
        parts = [
            f"{name} {len(trees):,} trees ({sum(len(t) for t in trees):,} words)"
            for name, trees in self.items()
        ]
        return f"{self.source}: {', '.join(parts)}"

    def __repr__(self) -> str:
        sizes = ", ".join(f"{name}={len(trees)}" for name, trees in self.items())
        return f"Treebank({self.source!r}, {sizes})"


def load_sst(directory: StrPath) -> Treebank:
    """The SST splits ``train``, ``dev``, ``test`` from ``{split}.txt`` in ``directory`` (or its ``trees/``).

    The result is a ``dict[str, list[Tree]]`` (a ``Treebank``, with ``describe()``). Raises
    ``FileNotFoundError`` naming the missing files, ``SstFormatError`` naming a malformed line.
    """
    root = Path(directory)
    # A FIFO, a device or a broken link is named as such (by stat: a FIFO is not opened).
    if not stat.S_ISDIR(check_path(root, directory_ok=True).st_mode):
        raise NotADirectoryError(
            f"{root}: a regular file, not a directory (SST is read from a directory of train.txt, dev.txt "
            "and test.txt)"
        )
    # Whatever has a split's name counts as there: read_trees refuses one that is not a regular file
    # by what it is, where is_file would call it missing.
    if not os.path.lexists(root / "train.txt") and os.path.lexists(root / "trees" / "train.txt"):
        root = root / "trees"  # the layout of the official trainDevTestTrees_PTB.zip
    missing = [f"{s}.txt" for s in SPLITS if not os.path.lexists(root / f"{s}.txt")]
    if missing:
        raise FileNotFoundError(
            f"{root}: no {', '.join(missing)} here (expected train.txt, dev.txt, test.txt)"
        )
    splits = {s: read_trees(root / f"{s}.txt") for s in SPLITS}
    for s, trees in splits.items():
        if not trees:
            raise SstFormatError(str(root / f"{s}.txt"), 1, 1, "no trees in this file")
    sizes = {s: len(t) for s, t in splits.items()}
    standard = "" if sizes == dict(SST_SPLIT_SIZES) else ", not the official split sizes"
    return Treebank(splits, source=f"SST (Stanford Sentiment Treebank{standard}) from {root}")


# ---------------------------------------------------------------------------------------------------
# Vocabulary and encoding


class Vocabulary:
    """Words and their ids: id 0 is the unknown word ``<unk>``, then known words by descending count,
    ties alphabetically (so the ids depend only on the counts).
    """

    UNKNOWN: ClassVar[str] = "<unk>"
    UNKNOWN_ID: ClassVar[int] = 0

    def __init__(self, counts: Mapping[str, int], *, min_count: int = 1) -> None:
        """The words of ``counts`` seen at least ``min_count`` times (``<unk>`` itself is never a word)."""
        if min_count < 1:
            raise ValueError(f"min_count must be at least 1, got {min_count}")
        kept = [(w, c) for w, c in counts.items() if c >= min_count and w != self.UNKNOWN]
        kept.sort(key=lambda wc: (-wc[1], wc[0]))
        self._words: tuple[str, ...] = (self.UNKNOWN, *(w for w, _ in kept))
        self._ids: dict[str, int] = {w: i for i, w in enumerate(self._words)}
        self.counts: Mapping[str, int] = dict(kept)
        self.min_count = min_count
        self.tokens = sum(counts.values())

    @classmethod
    def from_trees(cls, trees: Iterable[Tree], *, min_count: int = 1) -> Vocabulary:
        """The vocabulary of the leaves of ``trees`` (the training split): words seen ``min_count``+ times."""
        return cls(Counter(w for t in trees for w in t.leaves()), min_count=min_count)

    @property
    def words(self) -> tuple[str, ...]:
        """Every word by id, ``<unk>`` first."""
        return self._words

    def __len__(self) -> int:
        """The number of ids, ``<unk>`` included."""
        return len(self._words)

    def __contains__(self, word: object) -> bool:
        return word in self._ids and word != self.UNKNOWN

    def index(self, word: str) -> int:
        """The id of ``word``; ``UNKNOWN_ID`` (0) for a word not in the vocabulary."""
        return self._ids.get(word, self.UNKNOWN_ID)

    def word(self, index: int) -> str:
        """The word of an id."""
        if not 0 <= index < len(self._words):
            raise IndexError(f"word id {index} is out of range 0..{len(self._words) - 1}")
        return self._words[index]

    def unknown_rate(self, trees: Iterable[Tree]) -> float:
        """The fraction of the leaves of ``trees`` that are unknown words (0.0 for no leaves)."""
        total = unknown = 0
        for t in trees:
            for w in t.leaves():
                total += 1
                unknown += w not in self
        return unknown / total if total else 0.0

    def describe(self) -> str:
        """Its size and how it was built, for logs and reports."""
        return (
            f"vocabulary of {len(self):,} ids ({len(self) - 1:,} words seen at least {self.min_count} "
            f"time{'s' if self.min_count > 1 else ''} among {self.tokens:,} tokens, and {self.UNKNOWN} = 0)"
        )

    def __repr__(self) -> str:
        return f"Vocabulary({len(self)} ids, min_count={self.min_count})"


class EncodedTree(NamedTuple):
    """A tree as int64 arrays over its n nodes in post-order: children before parents, the root last.

    ``word``: the vocabulary id of each leaf, -1 at inner nodes. ``left``, ``right``: the indices of
    a node's children, -1 at leaves. ``label``: each node's label. ``height``: 0 at leaves, 1 + the
    taller child's height otherwise (nodes of one height can be computed together).
    """

    word: npt.NDArray[np.int64]
    left: npt.NDArray[np.int64]
    right: npt.NDArray[np.int64]
    label: npt.NDArray[np.int64]
    height: npt.NDArray[np.int64]

    @property
    def is_leaf(self) -> npt.NDArray[np.bool_]:
        """Whether each node is a leaf, (n,)."""
        leaf: npt.NDArray[np.bool_] = self.word >= 0
        return leaf

    @property
    def root(self) -> int:
        """The index of the root: the last node."""
        return len(self.label) - 1


def leaf_ids(tree: Tree, vocab: Vocabulary) -> npt.NDArray[np.int64]:
    """The vocabulary id of each leaf of ``tree``, left to right, (len(tree),) int64."""
    return np.array([vocab.index(w) for w in tree.leaves()], dtype=np.int64)


def encode(tree: Tree, vocab: Vocabulary) -> EncodedTree:
    """``tree`` as post-order arrays of word ids, child indices, labels and heights (see ``EncodedTree``)."""
    word: list[int] = []
    left: list[int] = []
    right: list[int] = []
    label: list[int] = []
    height: list[int] = []
    pending: list[int] = []  # the indices of the subtrees done whose parent is not
    for i, node in enumerate(tree.nodes()):
        label.append(node.label)
        if node.word is not None:
            word.append(vocab.index(node.word))
            left.append(-1)
            right.append(-1)
            height.append(0)
        else:
            ri, li = pending.pop(), pending.pop()
            word.append(-1)
            left.append(li)
            right.append(ri)
            height.append(1 + max(height[li], height[ri]))
        pending.append(i)

    def arr(xs: list[int]) -> npt.NDArray[np.int64]:
        return np.array(xs, dtype=np.int64)

    return EncodedTree(arr(word), arr(left), arr(right), arr(label), arr(height))


# ---------------------------------------------------------------------------------------------------
# Synthetic data

_DEFAULT_VOCABULARY: Final = 1000
# The kinds of words: (name prefix, share of the lexicon, share of the tokens, polarity). Negators and
# intensifiers are operators (polarity 0 alone).
_KINDS: Final[tuple[tuple[str, float, float, int], ...]] = (
    ("word", 0.68, 0.50, 0),
    ("good", 0.10, 0.14, 1),
    ("bad", 0.10, 0.14, -1),
    ("great", 0.05, 0.05, 2),
    ("awful", 0.05, 0.05, -2),
    ("not", 0.01, 0.07, 0),
    ("very", 0.01, 0.05, 0),
)


@dataclass(frozen=True)
class SyntheticLexicon:
    """The words of the synthetic treebank and their roles (see ``synthetic_trees`` for the rule).

    ``polarity``: the score -2..2 of every word but the operators (``negators``, ``intensifiers``);
    ``frequency``: each word's share of the tokens, in the order of ``words``.
    """

    words: tuple[str, ...]
    polarity: Mapping[str, int]
    negators: frozenset[str]
    intensifiers: frozenset[str]
    frequency: tuple[float, ...]


def synthetic_lexicon(vocabulary_size: int = _DEFAULT_VOCABULARY) -> SyntheticLexicon:
    """The lexicon of ``synthetic_trees``: a function of ``vocabulary_size`` alone, shared by all seeds.

    Words are named by kind, numbered from 0: neutral ``word<i>`` (polarity 0, 68% of the lexicon),
    ``good<i>`` (+1, 10%), ``bad<i>`` (-1, 10%), ``great<i>`` (+2, 5%), ``awful<i>`` (-2, 5%), negators
    ``not<i>`` (1%) and intensifiers ``very<i>`` (1%), at least one of each (so at least 7 words).
    Token shares per kind: 50%, 14%, 14%, 5%, 5%, 7%, 5%; within a kind, Zipfian (the i-th word's weight
    is proportional to 1 / (i + 1)).
    """
    if vocabulary_size < len(_KINDS):
        raise ValueError(f"vocabulary_size must be at least {len(_KINDS)} (one word of each kind)")
    sizes = [max(1, round(vocabulary_size * share)) for _, share, _, _ in _KINDS[1:]]
    sizes.insert(0, vocabulary_size - sum(sizes))  # >= 1 for every size >= 7
    words: list[str] = []
    frequency: list[float] = []
    polarity: dict[str, int] = {}
    for (prefix, _, token_share, pol), n in zip(_KINDS, sizes, strict=True):
        zipf = [1.0 / (i + 1) for i in range(n)]
        total = sum(zipf)
        for i in range(n):
            w = f"{prefix}{i}"
            words.append(w)
            frequency.append(token_share * zipf[i] / total)
            if prefix not in ("not", "very"):
                polarity[w] = pol
    return SyntheticLexicon(
        words=tuple(words),
        polarity=polarity,
        negators=frozenset(w for w in words if w.startswith("not")),
        intensifiers=frozenset(w for w in words if w.startswith("very")),
        frequency=tuple(frequency),
    )


def _clip(score: int) -> int:
    return -2 if score < -2 else 2 if score > 2 else score


def _synthetic(
    count: int,
    rng: random.Random,
    lexicon: SyntheticLexicon,
    min_leaves: int,
    max_leaves: int,
    intensifiers: bool,
) -> list[Tree]:
    words = [w for w in lexicon.words if intensifiers or w not in lexicon.intensifiers]
    share = dict(zip(lexicon.words, lexicon.frequency, strict=True))
    cum: list[float] = []
    acc = 0.0
    for w in words:
        acc += share[w]
        cum.append(acc)
    # Each pending node: (tree, score, operator) with operator 'n' (negator leaf), 'i' (intensifier
    # leaf) or '' (anything else).
    role = {w: ("n" if w in lexicon.negators else "i" if w in lexicon.intensifiers else "") for w in words}
    trees: list[Tree] = []
    for _ in range(count):
        n = rng.randint(min_leaves, max_leaves)
        nodes = [
            (Tree(lexicon.polarity.get(w, 0) + 2, word=w), lexicon.polarity.get(w, 0), role[w])
            for w in rng.choices(words, cum_weights=cum, k=n)
        ]
        while len(nodes) > 1:
            i = rng.randrange(len(nodes) - 1)
            (a, sa, oa), (b, sb, ob) = nodes[i], nodes[i + 1]
            if oa and ob:
                score = 0
            elif oa == "n" or ob == "n":
                score = -(sb if oa else sa)
            elif oa == "i" or ob == "i":
                score = _clip(2 * (sb if oa else sa))
            else:
                score = _clip(sa + sb)
            nodes[i : i + 2] = [(Tree(score + 2, left=a, right=b), score, "")]
        trees.append(nodes[0][0])
    return trees


def _check_synthetic(count: int, min_leaves: int, max_leaves: int) -> None:
    if count < 0:
        raise ValueError(f"count must be at least 0, got {count}")
    if not 1 <= min_leaves <= max_leaves:
        raise ValueError(f"need 1 <= min_leaves <= max_leaves, got {min_leaves} and {max_leaves}")


def synthetic_trees(
    count: int,
    *,
    seed: int = 0,
    vocabulary_size: int = _DEFAULT_VOCABULARY,
    min_leaves: int = 10,
    max_leaves: int = 40,
    intensifiers: bool = True,
) -> list[Tree]:
    """``count`` trees of a learnable synthetic sentiment treebank, deterministic under ``seed``.

    A sentence has a uniform number of leaves in ``min_leaves..max_leaves``, words drawn independently
    by the token frequencies of ``synthetic_lexicon(vocabulary_size)`` (no intensifiers when
    ``intensifiers`` is False). Bracketing: repeatedly merge a uniformly chosen pair of adjacent
    nodes. Every node has a score in -2..2 and the label ``score + 2``:

    - a leaf: its word's polarity (negators and intensifiers: 0);
    - a node over a negator leaf and a sibling: minus the sibling's score (``not`` flips: label 4 - l);
    - a node over an intensifier leaf and a sibling: twice the sibling's score, clipped to -2..2;
    - a node over two operator leaves (negator or intensifier): 0, and it is no operator itself;
    - any other node: the sum of its children's scores, clipped to -2..2.

    So every label is a function of the children's labels and of whether a child is an operator leaf:
    a tree model can learn the rule exactly, and a bag of words cannot (negation depends on structure).
    Python's ``random.Random(seed)`` drives the sampling.
    """
    _check_synthetic(count, min_leaves, max_leaves)
    lexicon = synthetic_lexicon(vocabulary_size)
    return _synthetic(count, random.Random(seed), lexicon, min_leaves, max_leaves, intensifiers)


def synthetic_treebank(
    *,
    sizes: Mapping[str, int] = SST_SPLIT_SIZES,
    seed: int = 0,
    vocabulary_size: int = _DEFAULT_VOCABULARY,
    min_leaves: int = 10,
    max_leaves: int = 40,
    intensifiers: bool = True,
) -> Treebank:
    """A synthetic ``Treebank`` of ``synthetic_trees``, SST-sized splits by default.

    The splits share the lexicon; each split draws from its own stream, seeded by ``seed`` and its name.
    """
    for count in sizes.values():
        _check_synthetic(count, min_leaves, max_leaves)
    lexicon = synthetic_lexicon(vocabulary_size)
    splits = {
        name: _synthetic(
            count,
            random.Random(f"monadl sst synthetic {seed} {name}"),
            lexicon,
            min_leaves,
            max_leaves,
            intensifiers,
        )
        for name, count in sizes.items()
    }
    ops = "negators and intensifiers" if intensifiers else "negators, no intensifiers"
    return Treebank(
        splits,
        source=(
            f"synthetic sentiment treebank (seed {seed}, {vocabulary_size:,}-word lexicon, "
            f"{min_leaves}-{max_leaves} leaves, {ops})"
        ),
    )


# ---------------------------------------------------------------------------------------------------
# Entry point


def open_dataset(
    path: StrPath | None = None, *, seed: int = 0, sizes: Mapping[str, int] = SST_SPLIT_SIZES
) -> Treebank:
    """SST from the directory ``path`` (see ``load_sst``), or the synthetic treebank when ``path`` is None.

    The synthetic treebank (``synthetic_treebank(sizes=sizes, seed=seed)``) has SST's split sizes by
    default. ``describe()`` on the result says which data it is.
    """
    if path is None:
        return synthetic_treebank(sizes=sizes, seed=seed)
    return load_sst(path)
