"""Command lines reject bad numbers up front: argparse names the option (exit status 2), before any
data is made or anything runs; the argument types accept exactly what they say."""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from examples import cifar_columns, tree_lstm
from monadl.bench import __main__ as bench
from monadl.cli import non_negative_float, non_negative_int, positive_float, positive_int


@given(st.integers(-(10**6), 10**6))
def test_integer_types_accept_exactly_their_range(n: int) -> None:
    for parse, low in ((positive_int, 1), (non_negative_int, 0)):
        if n >= low:
            assert parse(str(n)) == n
        else:
            with pytest.raises(argparse.ArgumentTypeError):
                parse(str(n))


@given(st.floats(allow_nan=True, allow_infinity=True, allow_subnormal=False))  # a peer may set flush-to-zero
def test_float_types_accept_exactly_finite_numbers_in_range(x: float) -> None:
    for parse, ok in ((positive_float, x > 0), (non_negative_float, x >= 0)):
        if ok and x != float("inf"):
            assert parse(repr(x)) == x
        else:
            with pytest.raises(argparse.ArgumentTypeError):
                parse(repr(x))


@pytest.mark.parametrize("parse", [positive_int, non_negative_int, positive_float, non_negative_float])
@pytest.mark.parametrize("text", ["", "x", "1,5", "one"])
def test_what_is_not_a_number_is_rejected(parse: Callable[[str], Any], text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="expected"):
        parse(text)


def test_an_integer_type_rejects_a_fraction() -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=re.escape("expected an integer, got '1.5'")):
        positive_int("1.5")


def _bench(argv: Sequence[str]) -> object:
    return bench.main(argv)


@pytest.mark.parametrize(
    ("main", "argv", "message"),
    [
        (tree_lstm.main, ["--trees", "0"], "argument --trees: expected a positive integer, got 0"),
        (tree_lstm.main, ["--batch", "-3"], "argument --batch: expected a positive integer, got -3"),
        (tree_lstm.main, ["--hidden", "x"], "argument --hidden: expected an integer, got 'x'"),
        (
            tree_lstm.main,
            ["--learning-rate", "0"],
            "argument --learning-rate: expected a number above 0, got 0",
        ),
        (
            tree_lstm.main,
            ["--weight-decay", "-0.5"],
            "argument --weight-decay: expected a number of at least 0",
        ),
        (tree_lstm.main, ["--learning-rate", "nan"], "argument --learning-rate: expected a finite number"),
        (cifar_columns.main, ["--columns", "0"], "argument --columns: expected a positive integer, got 0"),
        (cifar_columns.main, ["--steps", "0"], "argument --steps: expected a positive integer, got 0"),
        (cifar_columns.main, ["--seed", "-1"], "argument --seed: expected an integer of at least 0, got -1"),
        (_bench, ["columns", "--pools", "1", "0"], "argument --pools: expected a positive integer, got 0"),
        (_bench, ["columns", "--warmup", "-1"], "argument --warmup: expected an integer of at least 0"),
        (_bench, ["treelstm", "--batches", "0"], "argument --batches: expected a positive integer, got 0"),
        (_bench, ["threads", "--repeats", "0"], "argument --repeats: expected a positive integer, got 0"),
        (_bench, ["overhead", "--chain", "0"], "argument --chain: expected a positive integer, got 0"),
    ],
)
def test_a_bad_number_is_an_argparse_error_naming_the_option(
    main: Callable[[Sequence[str]], object], argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_treelstm_leaf_range_must_not_be_empty() -> None:
    with pytest.raises(SystemExit, match="--min-leaves 5 is above --max-leaves 3"):
        bench.main(["treelstm", "--min-leaves", "5", "--max-leaves", "3", "--no-torch", "--no-dynet"])
