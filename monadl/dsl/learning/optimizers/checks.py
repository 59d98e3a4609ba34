"""The checks of an optimizer state that comes from outside a training step (a checkpoint): what
is wrong with a state's shape, its arrays and its step count, as ``check_state`` reports it."""

from __future__ import annotations

from typing import Any

from monadl.typeclasses.backend import namespace


def _shown(value: object) -> str:
    """A state part or a weight's data, as an error message names it."""
    if isinstance(value, tuple):
        return f"a tuple of {len(value)} items"
    shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
    if shape is not None and dtype is not None:
        return f"a {dtype} {tuple(shape)} {type(value).__name__}"
    return f"{type(value).__name__} {value!r}"


def parts_problem(state: object, names: tuple[str, ...]) -> str | None:
    """What is wrong with the shape of a state that should be the tuple ``names``."""
    if type(state) is not tuple or len(state) != len(names):
        return f"the state is {_shown(state)}, not a tuple ({', '.join(names)})"
    return None


_MAX_STEP = 2**63 - 1
"""The largest step count a state may hold (a signed 64-bit counter's): more updates than any run
makes, and an exponent that the bias correction's ``beta ** step`` takes (``10**400`` overflows
Python's float there, and every later update would fail)."""


def step_problem(step: object) -> str | None:
    """What is wrong with a step count (a schedule's argument, the bias correction's exponent)."""
    if type(step) is not int or step < 0:
        return f"the step count is {_shown(step)}, not an int >= 0"
    if step > _MAX_STEP:
        return f"the step count is an int of {step.bit_length()} bits, more than 2**63 - 1"
    return None


def array_problem(name: str, part: Any, data: Any, non_negative: bool = False) -> str | None:
    """What is wrong with a state's array ``part`` (a moment, a sum) for a weight holding ``data``:
    not of the weight's type, shape and dtype (a float for a float weight), or negative where it
    must not be (a sum of squares, whose square root is taken). NaN and infinity are not checked:
    a diverged run's state is still its state (a checkpoint's load refuses them unless told)."""
    if isinstance(data, float) or (isinstance(part, float) and getattr(data, "shape", None) == ()):
        # A float weight's state holds floats; so did a 0-d array weight's before its results were
        # kept 0-d arrays (a checkpoint saved those NumPy scalars as floats): both are loadable.
        if not isinstance(part, float):
            return f"its {name} is {_shown(part)}, not a float like the weight"
        negative = part < 0.0
    else:
        if type(part) is not type(data) or part.shape != data.shape or part.dtype != data.dtype:
            return f"its {name} is {_shown(part)}, not {_shown(data)} like the weight"
        negative = non_negative and bool(namespace(part).any(part < 0.0))
    if non_negative and negative:
        return f"its {name} has a negative entry"
    return None
