"""Tests of monadl.data.sst: the bracketed-tree parser and its errors, files, the vocabulary and
encoding, the synthetic treebank, and the real SST when ../shared/data/sst is there (skipped if not).
"""

from __future__ import annotations

import copy
import pickle
import random
import re
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from monadl.data.sst import (
    _TOKENS,
    SST_SPLIT_SIZES,
    SstFormatError,
    SyntheticLexicon,
    Treebank,
    Vocabulary,
    encode,
    format_tree,
    leaf_ids,
    load_sst,
    open_dataset,
    parse_tree,
    read_trees,
    synthetic_lexicon,
    synthetic_treebank,
    synthetic_trees,
    write_trees,
)
from monadl.data.trees import Tree

SST_DIR = Path(__file__).resolve().parents[2] / "shared" / "data" / "sst"


def leaf(label: int, word: str) -> Tree:
    return Tree(label, word=word)


def node(label: int, left: Tree, right: Tree) -> Tree:
    return Tree(label, left=left, right=right)


# --- parsing --------------------------------------------------------------------------------------------


def test_parses_nested_trees_with_labels_on_every_node() -> None:
    t = parse_tree("(3 (2 It) (4 (2 's) (4 good)))")
    assert t == node(3, leaf(2, "It"), node(4, leaf(2, "'s"), leaf(4, "good")))
    assert list(t.leaves()) == ["It", "'s", "good"]
    assert [n.label for n in t.nodes()] == [2, 2, 4, 4, 3]
    assert parse_tree("(0 alone)") == leaf(0, "alone")


def test_a_leaf_runs_up_to_its_closing_parenthesis_spaces_included() -> None:
    assert parse_tree(r"(2 8 1\/2)") == leaf(2, r"8 1\/2")
    t = parse_tree(r"(3 (2 8 1\/2) (3 (2 more than) (2 2\/3)))")
    assert list(t.leaves()) == [r"8 1\/2", "more than", r"2\/3"]
    # SST's own leaves with a space have a non-breaking one (U+00A0): part of the word, never stripped.
    assert parse_tree("(2 2\xa01\\/2)").word == "2\xa01\\/2"
    assert parse_tree("(2 \xa0x\xa0)").word == "\xa0x\xa0"


def test_ptb_escapes_and_other_text_are_kept_verbatim() -> None:
    words = ["-LRB-", "-RRB-", r"\/", r"\*", "``", "''", "--", "n't", "café", "...", "1\\/2-hour", "&"]
    line = "(2 " * (len(words) - 1) + " ".join(f"(2 {w})" + (")" if i else "") for i, w in enumerate(words))
    t = parse_tree(line)
    assert list(t.leaves()) == words
    assert format_tree(t) == line


def test_spaces_around_tokens_and_line_endings_are_allowed() -> None:
    expected = node(1, leaf(2, "a b"), leaf(0, "c"))
    for line in [
        "(1 (2 a b) (0 c))",
        "(1 (2 a b) (0 c))\n",
        "(1 (2 a b) (0 c))\r\n",
        "  ( 1 (2 a b)(0 c) )  ",
        "(1\t(2\ta b\t)  (0   c ) )\t\n",
    ]:
        assert parse_tree(line) == expected, repr(line)


def test_format_tree_round_trips_and_refuses_unwritable_words() -> None:
    line = r"(3 (2 (2 The) (2 -LRB-)) (4 (3 8 1\/2) (4 good)))"
    assert format_tree(parse_tree(line)) == line
    for word in ["", "a(b", "b)", " lead", "trail\t", "two\nlines"]:
        with pytest.raises(ValueError, match="cannot be written"):
            format_tree(node(2, leaf(2, "ok"), leaf(2, word)))


@pytest.mark.parametrize("shape", ["right", "left"])
def test_deep_trees_parse_without_recursion(shape: str) -> None:
    depth = 5000
    if shape == "right":
        line = "(1 (2 w) " * depth + "(3 end)" + ")" * depth
    else:
        line = "(1 " * depth + "(3 end)" + " (2 w))" * depth
    t = parse_tree(line)
    assert t.height() == depth and len(t) == depth + 1
    assert sum(1 for _ in t.nodes()) == 2 * depth + 1
    assert format_tree(t) == line
    enc = encode(t, Vocabulary({"w": 5}))
    assert enc.height[enc.root] == depth and enc.label[enc.root] == 1
    if shape == "right":
        deeper = "(1 (2 w) " * 50_000 + "(3 end)" + ")" * 50_000
        assert parse_tree(deeper).height() == 50_000


# (text, column, a fragment of the message)
MALFORMED = [
    ("(2 (2 a) (2 b)", 15, "unbalanced '('"),
    ("(2 (2 a) (2 b", 14, "2 nodes are open"),
    ("(2 (2 a) (2 b)))", 16, "unbalanced ')'"),
    (")", 1, "unbalanced ')'"),
    ("((2 a) (2 b))", 2, "missing label"),
    ("( (2 a) (2 b))", 3, "missing label"),
    ("(x a)", 2, "expected an integer label 0..4, found 'x'"),
    ("(2.5 a)", 2, "found '2.5'"),
    ("(2 (2a b) (2 c))", 5, "found '2a'"),
    ("(5 a)", 2, "label 5 is outside 0..4"),
    ("(2 (2 a) (-1 b))", 11, "label -1 is outside 0..4"),
    ("(2 (2 a))", 1, "a node with one subtree"),
    ("(2 (2 (2 a)) (2 b))", 4, "a node with one subtree"),
    ("(2 (2 a) (2 b) (2 c))", 16, "a third subtree"),
    ("(2 )", 4, "an empty leaf"),
    ("(2)", 3, "an empty leaf"),
    ("(2 (2 a) (2))", 12, "an empty leaf"),
    ("(2 (2 a) (2 b)) (2 c)", 17, "trailing text after the tree that ends at column 15"),
    ("(2 a) junk", 7, "'junk' after the tree"),
    ("junk (2 a)", 1, "before the tree"),
    ("(2 a (2 b))", 6, "a subtree after the word 'a'"),
    ("(2 (2 a) b)", 10, "text 'b' after a subtree"),
    ("", 1, "found an empty line"),
    ("   ", 1, "found an empty line"),
    ("(2 (2 a)\n(2 b))", 9, "line break"),
]


@pytest.mark.parametrize(("text", "column", "fragment"), MALFORMED)
def test_malformed_lines_raise_with_source_line_and_column(text: str, column: int, fragment: str) -> None:
    with pytest.raises(SstFormatError) as info:
        parse_tree(text, source="trees.txt", line_number=7)
    e = info.value
    assert isinstance(e, ValueError)
    assert (e.source, e.line, e.column) == ("trees.txt", 7, column)
    assert str(e).startswith(f"trees.txt, line 7, column {column}: ")
    assert fragment in str(e)


def test_errors_pickle() -> None:
    with pytest.raises(SstFormatError) as info:
        parse_tree("(9 a)")
    again = pickle.loads(pickle.dumps(info.value))
    assert isinstance(again, SstFormatError) and str(again) == str(info.value) and again.column == 2


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="(2 )ab\\/\t7x-", max_size=40))
def test_any_text_parses_or_raises_sst_format_error(text: str) -> None:
    try:
        t = parse_tree(text)
    except SstFormatError as e:
        assert 1 <= e.column <= len(text) + 1
    else:
        assert format_tree(parse_tree(format_tree(t))) == format_tree(t)


words = st.text(alphabet="ab \\/-é\xa0", min_size=1, max_size=6).filter(lambda w: w.strip(" ") == w)
trees = st.recursive(
    st.builds(leaf, st.integers(0, 4), words),
    lambda sub: st.builds(node, st.integers(0, 4), sub, sub),
    max_leaves=30,
)


@settings(max_examples=200, deadline=None)
@given(trees)
def test_format_then_parse_is_the_identity(tree: Tree) -> None:
    assert parse_tree(format_tree(tree)) == tree


# --- files -------------------------------------------------------------------------------------------------


def test_read_trees_skips_blank_lines_and_names_file_and_line(tmp_path: Path) -> None:
    good = tmp_path / "good.txt"
    good.write_text("(3 (2 a) (4 b))\n\n  \n(1 c)\r\n", encoding="utf-8")
    assert read_trees(good) == [node(3, leaf(2, "a"), leaf(4, "b")), leaf(1, "c")]
    bad = tmp_path / "bad.txt"
    bad.write_text("(3 (2 a) (4 b))\n(1 c)\n(2 (2 d) (7 e))\n(1 f)\n", encoding="utf-8")
    with pytest.raises(SstFormatError, match=r"bad\.txt, line 3, column 11: label 7") as info:
        read_trees(bad)
    assert info.value.line == 3 and info.value.source == str(bad)
    binary = tmp_path / "binary.txt"
    binary.write_bytes(b"(1 c)\n(2 caf\xe9)\n")
    with pytest.raises(SstFormatError, match=r"line 2, column 7: not valid UTF-8 \(byte 0xe9"):
        read_trees(binary)
    assert read_trees(tmp_path / "good.txt") == read_trees(str(good))
    (tmp_path / "empty.txt").write_text("")
    assert read_trees(tmp_path / "empty.txt") == []


def test_write_trees_is_atomic_and_round_trips(tmp_path: Path) -> None:
    ts = synthetic_trees(20, seed=3)
    path = write_trees(ts, tmp_path / "synthetic.txt")
    assert read_trees(path) == ts
    assert path.read_text(encoding="utf-8").count("\n") == 20
    assert [p.name for p in tmp_path.iterdir()] == ["synthetic.txt"]  # no temporary file left
    with pytest.raises(ValueError, match="cannot be written"):
        write_trees([*ts, leaf(2, "a)")], path)
    assert read_trees(path) == ts and len(list(tmp_path.iterdir())) == 1  # the old file stays whole


def test_load_sst_reads_the_three_splits_and_says_what_is_missing(tmp_path: Path) -> None:
    splits = {"train": synthetic_trees(5, seed=1), "dev": synthetic_trees(2, seed=2), "test": []}
    with pytest.raises(FileNotFoundError, match=r"no train\.txt, dev\.txt, test\.txt here"):
        load_sst(tmp_path)
    (tmp_path / "trees").mkdir()  # the layout of the official zip
    for name, ts in splits.items():
        write_trees(ts, tmp_path / "trees" / f"{name}.txt")
    with pytest.raises(SstFormatError, match=r"test\.txt, line 1, column 1: no trees"):
        load_sst(tmp_path)
    write_trees(synthetic_trees(3, seed=3), tmp_path / "trees" / "test.txt")
    tb = load_sst(tmp_path)
    assert isinstance(tb, dict) and list(tb) == ["train", "dev", "test"]
    assert tb["train"] == splits["train"] and len(tb["test"]) == 3
    where = tmp_path / "trees"
    assert tb.describe().startswith(
        f"SST (Stanford Sentiment Treebank, not the official split sizes) from {where}: train 5 trees"
    )
    (tmp_path / "trees" / "dev.txt").unlink()
    with pytest.raises(FileNotFoundError, match=r"no dev\.txt here"):
        load_sst(tmp_path)


# --- vocabulary and encoding -------------------------------------------------------------------------


def test_vocabulary_ids_are_unknown_first_then_by_count_then_alphabetical() -> None:
    ts = [
        parse_tree("(2 (2 b) (2 (2 a) (2 c)))"),
        parse_tree("(2 (2 c) (2 (2 b) (2 <unk>)))"),
        parse_tree("(2 (2 d) (2 (2 c) (2 8 1\\/2)))"),
    ]
    v = Vocabulary.from_trees(ts)
    assert v.words == ("<unk>", "c", "b", "8 1\\/2", "a", "d")  # c 3, b 2, then ones alphabetically
    assert len(v) == 6 and v.UNKNOWN_ID == 0
    assert [v.index(w) for w in v.words] == list(range(6))
    assert v.index("never seen") == 0 and v.index("<unk>") == 0
    assert "c" in v and "zzz" not in v and "<unk>" not in v
    assert v.word(2) == "b"
    with pytest.raises(IndexError):
        v.word(6)
    shuffled = ts[::-1]
    assert Vocabulary.from_trees(shuffled).words == v.words  # ids depend on counts, not on order
    v2 = Vocabulary.from_trees(ts, min_count=2)
    assert v2.words == ("<unk>", "c", "b") and v2.index("a") == 0
    assert v2.unknown_rate(ts) == pytest.approx(4 / 9)
    assert "3 ids" in v2.describe() and "at least 2 times among 9 tokens" in v2.describe()
    with pytest.raises(ValueError, match="min_count"):
        Vocabulary.from_trees(ts, min_count=0)


def test_encode_gives_post_order_arrays() -> None:
    t = parse_tree("(3 (2 the) (4 (3 very) (4 good)))")
    v = Vocabulary(Counter({"the": 3, "good": 2}))
    e = encode(t, v)
    assert e.word.tolist() == [v.index("the"), 0, v.index("good"), -1, -1]
    assert e.left.tolist() == [-1, -1, -1, 1, 0] and e.right.tolist() == [-1, -1, -1, 2, 3]
    assert e.label.tolist() == [2, 3, 4, 4, 3] and e.height.tolist() == [0, 0, 0, 1, 2]
    assert e.is_leaf.tolist() == [True, True, True, False, False] and e.root == 4
    assert all(arr.dtype == np.int64 for arr in (e.word, e.left, e.right, e.label, e.height))
    assert leaf_ids(t, v).tolist() == [1, 0, 2] and leaf_ids(t, v).dtype == np.int64


def test_encode_makes_a_tree_even_of_shared_subtrees() -> None:
    shared = leaf(4, "good")
    t = node(3, shared, node(4, shared, shared))
    e = encode(t, Vocabulary({"good": 1}))
    inner = ~e.is_leaf
    children = np.concatenate([e.left[inner], e.right[inner]])
    assert sorted(children.tolist()) == list(range(len(e.label) - 1))  # each node but the root once
    assert np.all(e.left[inner] < np.flatnonzero(inner)) and np.all(e.right[inner] < np.flatnonzero(inner))


# --- synthetic treebank --------------------------------------------------------------------------------


def rule_scores(tree: Tree, lexicon: SyntheticLexicon) -> dict[int, int]:
    """The documented rule, applied afresh: the score -2..2 of every node, by id."""
    ops = lexicon.negators | lexicon.intensifiers
    score: dict[int, int] = {}
    for n in tree.nodes():
        if n.word is not None:
            score[id(n)] = lexicon.polarity.get(n.word, 0)
            continue
        assert n.left is not None and n.right is not None
        lw, rw = n.left.word, n.right.word
        lop, rop = lw in ops, rw in ops
        other = score[id(n.right)] if lop else score[id(n.left)]
        if lop and rop:
            s = 0
        elif lw in lexicon.negators or rw in lexicon.negators:
            s = -other
        elif lop or rop:
            s = max(-2, min(2, 2 * other))
        else:
            s = max(-2, min(2, score[id(n.left)] + score[id(n.right)]))
        score[id(n)] = s
    return score


@pytest.fixture(scope="module")
def synth() -> list[Tree]:
    return synthetic_trees(600, seed=11)


def test_synthetic_is_deterministic_under_a_seed(synth: list[Tree]) -> None:
    again = synthetic_trees(600, seed=11)
    assert [format_tree(t) for t in again] == [format_tree(t) for t in synth]
    other = synthetic_trees(600, seed=12)
    assert [format_tree(t) for t in other] != [format_tree(t) for t in synth]
    assert synthetic_trees(0) == []


def test_synthetic_labels_leaves_and_words_are_in_range(synth: list[Tree]) -> None:
    lexicon = synthetic_lexicon()
    lengths = [len(t) for t in synth]
    assert min(lengths) >= 10 and max(lengths) <= 40 and len(set(lengths)) > 20
    assert all(0 <= n.label <= 4 for t in synth for n in t.nodes())
    assert {w for t in synth for w in t.leaves()} <= set(lexicon.words)
    short = synthetic_trees(50, seed=1, min_leaves=1, max_leaves=3, vocabulary_size=7)
    assert {len(t) for t in short} == {1, 2, 3}
    with pytest.raises(ValueError, match="min_leaves"):
        synthetic_trees(3, min_leaves=5, max_leaves=4)
    with pytest.raises(ValueError, match="count"):
        synthetic_trees(-1)


def test_synthetic_labels_follow_the_documented_rule_and_negators_flip(synth: list[Tree]) -> None:
    lexicon = synthetic_lexicon()
    for t in synth:
        score = rule_scores(t, lexicon)
        assert all(n.label == score[id(n)] + 2 for n in t.nodes())
    # Negated subtrees flip: label 4 - l; intensified ones double their score.
    flips = doubles = 0
    for t in synth:
        for n in t.nodes():
            if n.left is None or n.right is None:
                continue
            for op, sib in ((n.left, n.right), (n.right, n.left)):
                if sib.word in lexicon.negators or sib.word in lexicon.intensifiers:
                    continue
                if op.word in lexicon.negators:
                    assert n.label == 4 - sib.label
                    flips += sib.label != 2
                elif op.word in lexicon.intensifiers:
                    assert n.label - 2 == max(-2, min(2, 2 * (sib.label - 2)))
                    doubles += sib.label not in (0, 2, 4)
    assert flips > 100 and doubles > 50


def test_synthetic_root_labels_are_balanced_and_need_the_structure(synth: list[Tree]) -> None:
    lexicon = synthetic_lexicon()
    roots = Counter(t.label for t in synth)
    assert all(roots[c] > 0.1 * len(synth) for c in range(5)), roots
    # A bag of words (the clipped sum of polarities, negators ignored) gets far less than the rule's 100%.
    bag = [max(-2, min(2, sum(lexicon.polarity.get(w, 0) for w in t.leaves()))) + 2 for t in synth]
    assert np.mean([b == t.label for b, t in zip(bag, synth, strict=True)]) < 0.6
    # The splits share the lexicon, so a model trained on one split knows the other's words.
    tb = synthetic_treebank(sizes={"train": 400, "dev": 100})
    assert Vocabulary.from_trees(tb["train"]).unknown_rate(tb["dev"]) < 0.05


def test_synthetic_lexicon_and_intensifiers_switch() -> None:
    lex = synthetic_lexicon(1000)
    assert len(lex.words) == 1000 and len(set(lex.words)) == 1000
    assert len(lex.negators) == 10 and len(lex.intensifiers) == 10
    assert set(lex.polarity.values()) == {-2, -1, 0, 1, 2}
    assert sum(lex.frequency) == pytest.approx(1.0)
    assert len(synthetic_lexicon(7).words) == 7
    with pytest.raises(ValueError, match="at least 7"):
        synthetic_lexicon(6)
    plain = synthetic_trees(200, seed=4, intensifiers=False)
    seen = {w for t in plain for w in t.leaves()}
    assert not seen & lex.intensifiers and seen & lex.negators


def test_synthetic_treebank_and_open_dataset_describe_themselves(tmp_path: Path) -> None:
    sizes = {"train": 30, "dev": 10, "test": 20}
    tb = open_dataset(sizes=sizes, seed=5)
    assert isinstance(tb, Treebank) and {k: len(v) for k, v in tb.items()} == sizes
    assert tb.describe().startswith(
        "synthetic sentiment treebank (seed 5, 1,000-word lexicon, 10-40 leaves, negators and intensifiers): "
        "train 30 trees ("
    )
    again = synthetic_treebank(sizes=sizes, seed=5)
    assert all([format_tree(t) for t in tb[s]] == [format_tree(t) for t in again[s]] for s in sizes)
    assert [format_tree(t) for t in tb["dev"]] != [format_tree(t) for t in tb["test"][:10]]
    assert "train=30" in repr(tb)
    for name, ts in tb.items():
        write_trees(ts, tmp_path / f"{name}.txt")
    loaded = open_dataset(tmp_path)
    assert loaded == tb and loaded.describe().startswith("SST (Stanford Sentiment Treebank, not the official")
    assert dict(SST_SPLIT_SIZES) == {"train": 8544, "dev": 1101, "test": 2210}


# --- the real SST, when present --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sst() -> Treebank:
    if not (SST_DIR / "train.txt").is_file():
        pytest.skip(f"the Stanford Sentiment Treebank is not at {SST_DIR} (see shared/data/README.md)")
    return load_sst(SST_DIR)


def test_real_sst_has_the_official_splits_and_every_line_parses(sst: Treebank) -> None:
    assert {name: len(ts) for name, ts in sst.items()} == dict(SST_SPLIT_SIZES)
    for name, ts in sst.items():
        lines = (SST_DIR / f"{name}.txt").read_text(encoding="utf-8").split("\n")
        nonblank = [line for line in lines if line.strip()]
        assert len(nonblank) == len(ts)
        # Verbatim: writing each tree back gives its line, character for character.
        assert [format_tree(t) for t in ts] == nonblank
    labels = Counter(n.label for ts in sst.values() for t in ts for n in t.nodes())
    assert set(labels) == {0, 1, 2, 3, 4}
    assert sst.describe() == (
        f"SST (Stanford Sentiment Treebank) from {SST_DIR}: train 8,544 trees (163,563 words), "
        "dev 1,101 trees (21,274 words), test 2,210 trees (42,405 words)"
    )


def test_real_sst_words_and_vocabulary(sst: Treebank) -> None:
    train_words = Counter(w for t in sst["train"] for w in t.leaves())
    assert {"-LRB-", "-RRB-", r"\/", "``", "''"} <= set(train_words)
    assert "8\xa01\\/2" in train_words  # the leaf with a (non-breaking) space
    v = Vocabulary.from_trees(sst["train"])
    assert v.words[:4] == ("<unk>", ".", ",", "the") and len(v) == len(train_words) + 1
    assert Vocabulary.from_trees(random.Random(0).sample(sst["train"], len(sst["train"]))).words == v.words
    assert 0.0 < v.unknown_rate(sst["dev"]) < 0.1
    e = encode(sst["dev"][0], v)
    assert e.label[e.root] == sst["dev"][0].label and e.height[e.root] == sst["dev"][0].height()


# The leaf token as it was before it was made possessive (quadratic on a long unclosed leaf: a lazy
# word rescanned the run of spaces after it at every character). The tokens must be the same.
_LAZY_TOKENS = re.compile(
    r"\([ \t]*([^ \t()]+)[ \t]+([^ \t()][^()]*?)[ \t]*\)[ \t]*"
    r"|\([ \t]*([^ \t()]*)[ \t]*"
    r"|\)[ \t]*|[ \t]+|[^()]+"
)


@settings(max_examples=500)
@given(st.text(alphabet="()  \t\u00a02ab-", max_size=40))
def test_the_tokens_are_those_of_the_lazy_leaf_pattern(text: str) -> None:
    def tokens(pattern: re.Pattern[str]) -> list[tuple[object, ...]]:
        return [(m.span(), m.lastindex, m.groups()) for m in pattern.finditer(text)]

    assert tokens(_TOKENS) == tokens(_LAZY_TOKENS)


def test_a_long_unclosed_leaf_is_an_error_naming_its_line() -> None:
    with pytest.raises(SstFormatError, match="line 1"):
        parse_tree("(2 a" + " " * 100_000 + "b")


@pytest.mark.parametrize("label", [7, -1, 2.5, True, "x"])
def test_a_label_sst_cannot_hold_is_refused_when_written(tmp_path: Path, label: object) -> None:
    bad = Tree(label, left=Tree(2, word="a"), right=Tree(3, word="b"))  # type: ignore[arg-type]
    path = tmp_path / "trees.txt"
    path.write_text("(2 kept)\n")
    with pytest.raises(ValueError, match=re.escape(f"the label {label!r} cannot be written")):
        write_trees([Tree(1, word="fine"), bad], path)
    assert path.read_text() == "(2 kept)\n"  # nothing of the failed write
    assert format_tree(Tree(np.int64(4), word="ok")) == "(4 ok)"  # type: ignore[arg-type]


def test_a_tree_of_any_depth_compares_hashes_prints_and_pickles() -> None:
    depth = 5000  # far beyond Python's recursion limit
    tree = parse_tree("(2 " * depth + "(2 w)" + " (3 x))" * depth)
    twin = parse_tree("(2 " * depth + "(2 w)" + " (3 x))" * depth)
    other = parse_tree("(2 " * depth + "(2 w)" + " (3 y))" * depth)
    assert tree == twin and hash(tree) == hash(twin)
    assert tree != other and tree != tree.left
    assert pickle.loads(pickle.dumps(tree)) == tree
    assert copy.deepcopy(tree) == tree
    assert repr(tree).startswith("Tree(label=2, left=Tree(label=2, left=")
    small = Tree(1, left=Tree(0, word="a"), right=Tree(4, word="b"))
    assert repr(small) == "Tree(label=1, left=Tree(label=0, word='a'), right=Tree(label=4, word='b'))"
    assert len({small, Tree(1, left=Tree(0, word="a"), right=Tree(4, word="b"))}) == 1


@pytest.mark.parametrize("digits", [4, 4301, 100_000])
def test_a_label_of_many_digits_is_a_format_error_naming_its_place(digits: int) -> None:
    # Python's int() refuses strings of more than 4,300 digits with a plain ValueError (no line,
    # no column); a label that long is out of range, and says so where it is.
    label = "9" * digits
    with pytest.raises(
        SstFormatError, match=r"line 1, column 2: label 9+(\.\.\.9+ \(\d+ characters\))? is outside 0\.\.4"
    ):
        parse_tree(f"({label} a)")
    assert parse_tree("(0003 a)").label == 3  # leading zeros are digits too, not size
