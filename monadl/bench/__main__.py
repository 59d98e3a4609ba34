"""``python -m monadl.bench COMMAND``: the benchmarks' command line, one subcommand per benchmark."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence

from monadl.bench import columns, distributed, models, overhead, phases, suite, threads, treelstm


def build_parser() -> argparse.ArgumentParser:
    """The parser, with one subparser per benchmark."""
    parser = argparse.ArgumentParser(prog="python -m monadl.bench", description="monadl's benchmarks.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    benchmarks = [
        ("overhead", overhead, "per-op overhead of forward and forward + backward, against plain NumPy"),
        ("columns", columns, "the CIFAR-100 column benchmark of the DeepLearning.scala 2 paper"),
        ("treelstm", treelstm, "Tree-LSTM trees/s, dynamic batching on and off, against PyTorch and DyNet"),
        ("threads", threads, "whether a pool of two can pay here: the column kernels on one and two threads"),
        ("distributed", distributed, "data-parallel Tree-LSTM on Ray: steps/s by workers, Ray's overhead"),
        ("suite", suite, "the DyNet benchmark suite's four tasks against DyNet and PyTorch"),
        ("models", models, "the example models' steps (conv, CNN, Transformer, BiLSTM) against PyTorch"),
        ("phases", phases, "where a training step of the suite's models spends its time, phase by phase"),
    ]
    for name, module, summary in benchmarks:
        sub = commands.add_parser(
            name,
            help=summary,
            description=module.__doc__,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        module.add_arguments(sub)
        sub.set_defaults(func=module.run_cli)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the benchmark named in ``argv`` (default: the command line); returns the exit status."""
    args = build_parser().parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    return func(args)


if __name__ == "__main__":
    raise SystemExit(main())
