"""Argument types for monadl's command lines (the examples and ``python -m monadl.bench``).

A count of zero or a negative learning rate is reported by argparse, naming the option, before
anything runs; not as a traceback from deep inside a data generator or a division.

And what the examples' command lines share: a progress bar (:class:`Progress`, with tqdm) and a
learning-curve plot (``--plot PATH``: :func:`check_plot`, then :func:`plot_curves`, with matplotlib).
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any


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


# ---------------------------------------------------------------------------- progress and plots
#
# tqdm and matplotlib are optional (the ``bench`` and ``dev`` extras): without tqdm there is no bar
# and no error; without matplotlib, ``--plot`` is an argparse error (exit status 2) before anything
# runs, not a traceback after the training.


def add_output_arguments(parser: argparse.ArgumentParser, *, plot: str = "learning curves") -> None:
    """Adds ``--no-progress`` and ``--plot PATH`` (a PNG of ``plot``) to an example's command line."""
    parser.add_argument(
        "--no-progress", action="store_true", help="no progress bar (there is none off a terminal either)"
    )
    parser.add_argument("--plot", metavar="PATH", help=f"write a PNG of the {plot} (needs matplotlib)")


def check_plot(parser: argparse.ArgumentParser, path: str | None) -> None:
    """For ``--plot PATH``, before any training: exits with argparse's error (status 2) if
    matplotlib cannot be imported or the PNG's folder does not exist."""
    if path is None:
        return
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        parser.error(
            "argument --plot: needs matplotlib, which is not installed "
            "(pip install matplotlib, or pip install 'monadl[bench]')"
        )
    folder = Path(path).parent
    if not folder.is_dir():
        parser.error(f"argument --plot: the folder {str(folder)!r} does not exist")


def on_terminal() -> bool:
    """Whether stdout and stderr are both terminals: a progress bar is for a person watching, not
    for a log file or a pipe."""
    return all(_is_terminal(stream) for stream in (sys.stdout, sys.stderr))


def _is_terminal(stream: object) -> bool:
    try:
        return bool(getattr(stream, "isatty", lambda: False)())
    except ValueError:  # closed
        return False


class Progress:
    """A tqdm progress bar over ``total`` samples (trees, images, characters), showing their rate
    (``unit``/s) and the loss; or nothing at all when not ``enabled`` (``--no-progress``), when
    stdout or stderr is not a terminal, or when tqdm is not installed. The bar is on stderr and
    is erased when closed; :meth:`write` prints a line to stdout past it."""

    def __init__(self, total: int, *, desc: str, unit: str, enabled: bool = True) -> None:
        self.bar: Any = None
        if not enabled or not on_terminal():
            return
        try:
            from tqdm import tqdm
        except ImportError:
            return
        self.bar = tqdm(
            total=total, desc=desc, unit=f" {unit}", file=sys.stderr, leave=False, dynamic_ncols=True
        )

    def update(self, samples: int, loss: float | None = None) -> None:
        """``samples`` more done; ``loss``: the loss to show (a running mean, say)."""
        if self.bar is not None:
            if loss is not None:
                self.bar.set_postfix_str(f"loss {loss:.4g}", refresh=False)
            self.bar.update(samples)

    def write(self, line: str) -> None:
        """Prints ``line`` to stdout (above the bar, which is redrawn below it)."""
        if self.bar is None:
            print(line, flush=True)
        else:
            self.bar.write(line, file=sys.stdout)
            sys.stdout.flush()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


Curve = tuple[Sequence[float], Sequence[float]]
"""A line of a plot: its x values and its y values."""


def plot_curves(
    path: str | Path, title: str, x_label: str, panels: Mapping[str, Mapping[str, Curve]]
) -> None:
    """Writes a PNG of line charts side by side, one per panel: its y label, and its curves by
    name. matplotlib's Agg backend, through its object API: no display, no pyplot state. (Call
    :func:`check_plot` first: this one raises ImportError without matplotlib.)"""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    figure = Figure(figsize=(5.0 * len(panels), 3.8), layout="constrained")
    axes = figure.subplots(1, len(panels), squeeze=False)[0]
    for ax, (y_label, curves) in zip(axes, panels.items(), strict=True):
        for name, (xs, ys) in curves.items():
            if len(ys) <= 30:  # points: an epoch's, a segment's
                ax.plot(list(xs), list(ys), marker="o", markersize=3, label=name)
            else:  # a noisy trace: a step's
                ax.plot(list(xs), list(ys), linewidth=0.8, alpha=0.6, label=name)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # epochs, steps
        ax.set_xlabel(x_label)
        ax.set_ylabel(y_label)
        ax.grid(alpha=0.3)
        if len(curves) > 1:
            ax.legend()
    figure.suptitle(title)
    figure.savefig(path, dpi=120)
