"""Argument types for monadl's command lines (the examples and ``python -m monadl.bench``).

A count of zero or a negative learning rate is reported by argparse, naming the option, before
anything runs; not as a traceback from deep inside a data generator or a division.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable


def _parsed(text: str, kind: type[int] | type[float], fits: Callable[[float], bool], wanted: str) -> float:
    """``text`` as a number of ``kind``, which must fit (else argparse's error saying what is wanted)."""
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected {'an integer' if kind is int else 'a number'}, got {text!r}"
        ) from None
    if kind is float and not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    if not fits(value):
        raise argparse.ArgumentTypeError(f"expected {wanted}, got {text}")
    return value


def positive_int(text: str) -> int:
    """An integer of at least 1 (a count, a size)."""
    return int(_parsed(text, int, lambda v: v >= 1, "a positive integer"))


def non_negative_int(text: str) -> int:
    """An integer of at least 0 (a seed, warm-up steps)."""
    return int(_parsed(text, int, lambda v: v >= 0, "an integer of at least 0"))


def positive_float(text: str) -> float:
    """A finite number above 0 (a learning rate)."""
    return _parsed(text, float, lambda v: v > 0, "a number above 0")


def non_negative_float(text: str) -> float:
    """A finite number of at least 0 (a weight decay)."""
    return _parsed(text, float, lambda v: v >= 0, "a number of at least 0")
