"""``python -m monadl.bench COMMAND``: the benchmarks' command line, one subcommand per benchmark."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence

from monadl.bench import columns, overhead


def build_parser() -> argparse.ArgumentParser:
    """The parser, with one subparser per benchmark."""
    parser = argparse.ArgumentParser(prog="python -m monadl.bench", description="monadl's benchmarks.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sub = commands.add_parser(
        "overhead",
        help="per-op overhead of forward and forward + backward, against plain NumPy",
        description=overhead.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    overhead.add_arguments(sub)
    sub.set_defaults(func=overhead.run_cli)
    sub = commands.add_parser(
        "columns",
        help="the CIFAR-100 column benchmark of the DeepLearning.scala 2 paper, against NumPy and PyTorch",
        description=columns.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    columns.add_arguments(sub)
    sub.set_defaults(func=columns.run_cli)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the benchmark named in ``argv`` (default: the command line); returns the exit status."""
    args = build_parser().parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    return func(args)


if __name__ == "__main__":
    raise SystemExit(main())
