"""Argument types for monadl's command lines (the examples and ``python -m monadl.bench``).

A count of zero or a negative learning rate is reported by argparse, naming the option, before
anything runs; not as a traceback from deep inside a data generator or a division.
"""

from __future__ import annotations

import argparse
import math


def _number(text: str, kind: type[int] | type[float]) -> int | float:
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected {'an integer' if kind is int else 'a number'}, got {text!r}"
        ) from None
    if kind is float and not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def positive_int(text: str) -> int:
    """An integer of at least 1 (a count, a size)."""
    value = int(_number(text, int))
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text}")
    return value


def non_negative_int(text: str) -> int:
    """An integer of at least 0 (a seed, warm-up steps)."""
    value = int(_number(text, int))
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer of at least 0, got {text}")
    return value


def positive_float(text: str) -> float:
    """A finite number above 0 (a learning rate)."""
    value = float(_number(text, float))
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a number above 0, got {text}")
    return value


def non_negative_float(text: str) -> float:
    """A finite number of at least 0 (a weight decay)."""
    value = float(_number(text, float))
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a number of at least 0, got {text}")
    return value
