"""Data-parallel training of the Tree-LSTM of examples/tree_lstm.py on Ray (monadl.distributed).

The model, its loss and its data are those of ``examples/tree_lstm.py``; here they train on
``--workers`` processes at once, each holding a replica of the model (``DataParallel``). A step takes
a global batch of ``--batch-size`` trees and gives each worker a contiguous share of it; every worker
computes the gradients of its shard's **summed** loss divided by the global batch size, the
gradients are summed in a fixed order, and every replica applies the same Adagrad update. The
objective is the mean loss per tree over the global batch, as ``tree_lstm.py``'s: one process
training on the same batches computes the same weights, but for rounding. After each epoch the
driver copies the trained weights into a local model (``trainer.copy_to``) and measures dev
accuracy there.

Run it: ``python examples/data_parallel.py --workers 4`` starts a local Ray cluster on this machine
(synthetic trees from ``monadl.data.sst``; ``--data path/to/trainDevTestTrees_PTB`` for the real
treebank). ``--address HEAD:6379`` joins a running cluster instead. On a terminal a progress bar
shows each epoch's trees/s and loss (with tqdm; ``--no-progress`` hides it); ``--plot curves.png``
draws the loss and the dev accuracy per epoch (with matplotlib).

``--save PATH`` writes a checkpoint after every epoch (``trainer.save``: the weights, Adagrad's
state, the number of steps committed); ``--resume PATH`` goes on from one, at the step where it
stopped, with the batches a run that never stopped would have taken. Ctrl-C stops at a step's
boundary: the step in flight is committed on every worker or on none, the last committed state is
saved (with ``--save``), the number of committed steps is printed, the workers are stopped, and the
exit status is 130.

A cluster needs, on every machine: monadl installed with the ``distributed`` extra
(``pip install -e '.[distributed]'``), the same Python and the same Ray and monadl versions as the
driver's, since the workers unpickle the model's class, ``monadl.bench.treelstm_model.TreeLstm``,
by name: monadl installed there, or a checkout at the same path as on the driver's machine (the
example puts that path on the workers' ``PYTHONPATH``), or Ray started there with the checkout's
folder on ``PYTHONPATH`` (``PYTHONPATH=/path/to/checkout ray start ...``: the workers keep it).
Start Ray with ``ray start --head --port 6379`` on one machine and ``ray start --address
HEAD_IP:6379`` on each of the others, then run the example on the head with ``--address
HEAD_IP:6379``. Each worker takes one of the cluster's CPUs: fewer CPUs than
``--workers`` is an error.
"""

from __future__ import annotations

import argparse
import functools
import logging
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from returns.result import Failure

import monadl as ml
from monadl.cli import (
    Progress,
    add_output_arguments,
    check_plot,
    non_negative_float,
    non_negative_int,
    plot_curves,
    positive_float,
    positive_int,
)
from monadl.data import sst
from monadl.data.trees import Tree
from monadl.distributed import DataParallel

ROOT = Path(__file__).resolve().parent.parent
"""The repository: the folder that holds the ``examples`` package."""

if __name__ == "__main__" and str(ROOT) not in sys.path:  # run as a script: ``examples`` importable
    sys.path.insert(0, str(ROOT))

from examples.tree_lstm import TreeLstm  # noqa: E402

DTYPES: dict[str, type[np.floating[Any]]] = {"float32": np.float32, "float64": np.float64}

INTERRUPTED = 130
"""The exit status after Ctrl-C (128 + SIGINT), as a shell's."""


def epoch_batches(trees: Sequence[Tree], batch_size: int, seed: int, epoch: int) -> list[list[Tree]]:
    """An epoch's global batches: ``trees`` in an order drawn from ``seed`` and ``epoch`` alone (a
    resumed run takes the batches of one that never stopped), ``batch_size`` at a time."""
    return list(ml.DataLoader(trees, batch_size, shuffle=True, seed=seed, collate=list).epoch(epoch))


def model_builder(vocabulary_size: int, args: argparse.Namespace) -> Callable[[], TreeLstm]:
    """What makes the model, everywhere alike: ``TreeLstm`` with its arguments, pickled to the
    workers by name (a class of ``monadl.bench.treelstm_model``, importable there)."""
    return functools.partial(
        TreeLstm,
        vocabulary_size,
        args.embedding,
        args.hidden,
        seed=args.seed,
        learning_rate=args.learning_rate,
        weight_decay=args.weight_decay,
        dtype=DTYPES[args.dtype],
    )


def shard_loss(word_id: Callable[[str], int]) -> Callable[[TreeLstm, list[Tree]], ml.FloatLayer]:
    """``loss(model, shard)``: the **sum** of the shard's per-tree losses (``TreeLstm.loss``);
    ``DataParallel`` divides it by the global batch size."""
    return functools.partial(TreeLstm.loss, word_id=word_id)


class _Epoch:
    """An epoch's running totals, after each committed step (``DataParallel.train``'s ``on_step``)."""

    def __init__(self, batches: list[list[Tree]], first: int, bar: Progress, losses: list[float]) -> None:
        self.batches, self.first, self.bar, self.losses = batches, first, bar, losses
        self.total, self.seen = 0.0, 0

    def __call__(self, step: int, loss: float) -> None:
        size = len(self.batches[step - self.first - 1])
        self.losses.append(loss)
        self.total += loss * size
        self.seen += size
        self.bar.update(size, loss=self.total / self.seen)


def start_ray(address: str | None, workers: int) -> bool:
    """Starts Ray (a local cluster, or a connection to ``address``) unless it is running already;
    returns whether it started it. The workers import monadl from this checkout, if it is one."""
    import ray

    if ray.is_initialized():
        return False
    # ${PYTHONPATH}: what the worker's machine has already (Ray expands it there).
    env = {"PYTHONPATH": f"{ROOT}{os.pathsep}${{PYTHONPATH}}"}
    common: dict[str, Any] = {"logging_level": logging.ERROR, "runtime_env": {"env_vars": env}}
    if address is None:
        # One CPU per worker, even where the machine has fewer (they then share the cores).
        ray.init(num_cpus=max(os.cpu_count() or 1, workers), include_dashboard=False, **common)
    else:
        ray.init(address=address, **common)
    return True


def main(argv: Sequence[str] | None = None) -> list[float]:
    """Trains on synthetic trees (or the SST, ``--data``) on ``--workers`` Ray workers and prints the
    loss, the dev accuracy and the speed per epoch; returns every committed step's mean loss per
    tree (of this run). Ctrl-C exits with status 130 (``SystemExit``)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--workers", type=positive_int, default=2, help="Ray workers, one replica each")
    parser.add_argument(
        "--address", help="a running Ray cluster's head, HOST:PORT (default: start one on this machine)"
    )
    parser.add_argument("--data", help="the SST folder of train.txt, dev.txt, test.txt (default: synthetic)")
    parser.add_argument(
        "--trees", type=positive_int, default=400, help="synthetic training trees (dev: a quarter)"
    )
    parser.add_argument("--epochs", type=positive_int, default=3)
    parser.add_argument(
        "--batch-size", type=positive_int, default=50, help="trees per step, over all the workers"
    )
    parser.add_argument("--embedding", type=positive_int, default=128)
    parser.add_argument("--hidden", type=positive_int, default=128)
    parser.add_argument("--learning-rate", type=positive_float, default=0.05)
    parser.add_argument("--weight-decay", type=non_negative_float, default=0.0, help="L2 (Tai et al.: 1e-4)")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32", help="the weights' float type")
    parser.add_argument(
        "--reduction", choices=["tree", "driver"], default="tree", help="how the gradients are summed"
    )
    parser.add_argument("--seed", type=non_negative_int, default=0)
    parser.add_argument(
        "--save", metavar="PATH", help="write a checkpoint there after every epoch and on Ctrl-C"
    )
    parser.add_argument("--resume", metavar="PATH", help="go on from a checkpoint of --save")
    add_output_arguments(parser, plot="loss and dev accuracy per epoch")
    args = parser.parse_args(argv)
    check_plot(parser, args.plot)
    if args.save is not None and not Path(args.save).parent.is_dir():
        parser.error(f"argument --save: the folder {str(Path(args.save).parent)!r} does not exist")
    try:
        import ray
    except ImportError:
        parser.error("needs Ray: pip install -e '.[distributed]' (or pip install ray)")

    sizes = {"train": args.trees, "dev": max(args.trees // 4, 1)}
    data = sst.open_dataset(args.data, seed=args.seed, sizes=sizes)
    train = data["train"]
    vocabulary = sst.Vocabulary.from_trees(train)
    print(f"data: {data.describe()}; {vocabulary.describe()}")
    build = model_builder(len(vocabulary), args)
    local = build()  # the driver's copy of the model, for dev accuracy
    # What fixes the sequence of batches: a checkpoint resumes only a run that had the same.
    run = {"trees": len(train), "batch_size": args.batch_size, "seed": args.seed}
    if args.resume is not None:
        try:
            metadata = ml.load(args.resume, local)  # checked here, before Ray starts
        except (OSError, ml.CheckpointError) as e:
            parser.error(f"argument --resume: {e}")
        if any(metadata.get(key) != value for key, value in run.items()) or "step" not in metadata:
            parser.error(
                f"argument --resume: {args.resume} is not a checkpoint of this example with these trees, "
                f"--batch-size and --seed ({run})"
            )

    started = start_ray(args.address, args.workers)
    try:
        cpus = ray.cluster_resources().get("CPU", 0)  # type: ignore[no-untyped-call]
        if cpus < args.workers:  # else the workers would wait for CPUs, and time out
            parser.error(f"argument --workers: the Ray cluster has {cpus:g} CPUs, and each worker takes one")
        return _train(args, data, vocabulary, build, local, run)
    except KeyboardInterrupt:  # while the workers started or stopped
        print("interrupted", flush=True)
        raise SystemExit(INTERRUPTED) from None
    finally:
        if started:
            ray.shutdown()


def _train(
    args: argparse.Namespace,
    data: sst.Treebank,
    vocabulary: sst.Vocabulary,
    build: Callable[[], TreeLstm],
    local: TreeLstm,
    run: dict[str, int],
) -> list[float]:
    """The training of :func:`main`, on the workers, once Ray runs."""
    train, dev = data["train"], data["dev"]
    loss = shard_loss(vocabulary.index)
    per_epoch = math.ceil(len(train) / args.batch_size)
    optimizer = ml.Adagrad(args.learning_rate, weight_decay=args.weight_decay)  # as TreeLstm's own
    losses: list[float] = []  # every committed step's
    epochs: list[int] = []
    epoch_losses: list[float] = []  # per tree
    accuracies: list[tuple[float, float]] = []  # dev: fine-grained, binary
    interrupted = False
    with DataParallel(build, loss, optimizer, args.workers, reduction=args.reduction) as trainer:
        print(
            f"workers: {args.workers} Ray actors, processes {' '.join(map(str, trainer.pids()))}; "
            f"{args.batch_size} trees per step, {per_epoch} steps per epoch",
            flush=True,
        )
        if args.resume is not None:
            trainer.load(args.resume)
            print(f"resumed: {args.resume}, after {trainer.steps} steps")
        fine, binary = local.accuracy(dev, vocabulary.index)  # local: the weights the workers start from
        when = "before training" if trainer.steps == 0 else f"after {trainer.steps} steps"
        print(f"{when}: dev root accuracy {fine:.3f} fine-grained, {binary:.3f} binary", flush=True)
        try:
            for epoch in range(trainer.steps // per_epoch, args.epochs):
                first = trainer.steps
                batches = epoch_batches(train, args.batch_size, args.seed, epoch)[first - epoch * per_epoch :]
                start = time.perf_counter()
                with Progress(
                    sum(map(len, batches)), desc=f"epoch {epoch}", unit="trees", enabled=not args.no_progress
                ) as bar:
                    tally = _Epoch(batches, first, bar, losses)
                    result = trainer.train(batches, on_step=tally)
                seconds = time.perf_counter() - start
                if isinstance(result, Failure):  # no replica changed: keep what was committed
                    if args.save is not None:
                        trainer.save(args.save, metadata=run)
                    raise result.failure()
                trainer.copy_to(local)
                fine, binary = local.accuracy(dev, vocabulary.index)
                epochs.append(epoch + 1)
                epoch_losses.append(tally.total / tally.seen)
                accuracies.append((fine, binary))
                print(
                    f"epoch {epoch}: loss {epoch_losses[-1]:.3f} per tree ({tally.seen / seconds:.1f} "
                    f"trees/s); dev root accuracy {fine:.3f} fine-grained, {binary:.3f} binary",
                    flush=True,
                )
                if args.save is not None:
                    trainer.save(args.save, metadata=run)
        except KeyboardInterrupt:
            # DataParallel settled the step in flight: the replicas hold the last committed state.
            interrupted = True
            if args.save is not None:
                trainer.save(args.save, metadata=run)
            saved = f"; checkpoint: {args.save}" if args.save is not None else ""
            print(f"interrupted: {trainer.steps} steps committed{saved}", flush=True)
    # Leaving the with block stopped the workers.
    if interrupted:
        raise SystemExit(INTERRUPTED)
    if args.save is not None:
        print(f"checkpoint: {args.save}")
    if "test" in data and epochs:
        fine, binary = local.accuracy(data["test"], vocabulary.index)
        print(f"test root accuracy, last weights: {fine:.3f} fine-grained, {binary:.3f} binary")
    if args.plot:
        plot_curves(
            args.plot,
            f"Tree-LSTM sentiment, {args.workers} workers: {len(train)} training trees, {len(dev)} dev trees",
            "epoch",
            {
                "training loss per tree": {"train": (epochs, epoch_losses)},
                "dev root accuracy": {
                    "fine-grained": (epochs, [a[0] for a in accuracies]),
                    "binary": (epochs, [a[1] for a in accuracies]),
                },
            },
        )
        print(f"plot: {args.plot}")
    return losses


if __name__ == "__main__":
    main()
