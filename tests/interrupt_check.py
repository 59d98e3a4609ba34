"""Interrupts training steps at random moments (a timer signal whose handler raises
``KeyboardInterrupt``, as Ctrl-C does) and prints, as JSON, how many steps were interrupted and how
many were left half-applied. Run as a script, in a process of its own, by ``test_interrupts.py``:
``python tests/interrupt_check.py MODE TRIES SEED``."""

from __future__ import annotations

import gc
import json
import random
import signal
import sys
import time
from types import FrameType

import numpy as np
from returns.result import Success

import monadl as ml

WEIGHTS = 200


def executor_for(mode: str) -> ml.Executor:
    """The executor of a mode: its default, unbatched, unreplayed, or with a pool of two."""
    return {
        "default": lambda: ml.Executor(),
        "unbatched": lambda: ml.Executor(batching=False),
        "unreplayed": lambda: ml.Executor(replay=False),
        "pool": lambda: ml.Executor(2, min_pool_cost=0),
    }[mode]()


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def main(mode: str, tries: int, seed: int) -> dict[str, int]:
    executor = executor_for(mode)
    weights = [ml.ArrayWeight(np.zeros(3)) for _ in range(WEIGHTS)]
    scales = [np.full(3, float(k + 1)) for k in range(WEIGHTS)]
    loss = ml.add_n([ml.sum(ml.tanh(w * c)) for w, c in zip(weights, scales, strict=True)])
    optimizer = ml.Adam(0.01)
    for _ in range(2):  # compiled and warm
        assert isinstance(loss.train_blocking(optimizer, executor=executor), Success)
    times = []
    for _ in range(5):
        started = time.perf_counter()
        assert isinstance(loss.train_blocking(optimizer, executor=executor), Success)
        times.append(time.perf_counter() - started)
    # The fastest: a step measured slow (the machine busy for a moment) would send the timer past
    # most steps, and fewer would be interrupted than the test needs to mean anything.
    step = min(times)
    signal.signal(signal.SIGALRM, _interrupt)
    rng = random.Random(seed)
    interrupted = half_applied = mixed_states = collector_off = 0
    for _ in range(tries):
        before = np.array([w.data for w in weights])
        try:
            # half the interrupts anywhere in a step, half around its end (its commit, the
            # collector switched back on)
            late = rng.random() < 0.5
            delay = rng.uniform(0.8, 1.2) * step if late else rng.uniform(0.0, step)
            signal.setitimer(signal.ITIMER_REAL, delay)
            loss.train_blocking(optimizer, executor=executor)
            signal.setitimer(signal.ITIMER_REAL, 0.0)
        except KeyboardInterrupt:
            interrupted += 1
        signal.setitimer(signal.ITIMER_REAL, 0.0)
        collector_off += not gc.isenabled()  # the step's pause of the collector ended with it
        gc.enable()
        changed = int(np.any(np.array([w.data for w in weights]) != before, axis=1).sum())
        half_applied += 0 < changed < WEIGHTS
        counts = {state[1][2] for w in weights if (state := w.optimizer_state) is not None}
        mixed_states += len(counts) > 1  # Adam's step counts differ between weights
    # The executor (and its pool) still works: one more step updates every weight.
    before = np.array([w.data for w in weights])
    after_ok = isinstance(loss.train_blocking(optimizer, executor=executor), Success)
    all_moved = bool(np.all(np.array([w.data for w in weights]) != before))
    executor.close()
    return {
        "tries": tries,
        "interrupted": interrupted,
        "half_applied": half_applied,
        "mixed_states": mixed_states,
        "collector_off": collector_off,
        "usable_after": int(after_ok and all_moved),
    }


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))))
