"""A step interrupted at any moment (Ctrl-C: a timer signal whose handler raises
``KeyboardInterrupt``) returns control to the caller at once and leaves every weight and optimizer
state as the step before left them, or every one updated: never some.
Each mode runs in a process of its own, under a watchdog (the subprocess's timeout): a hang fails
the test, not the suite."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TRIES = 120


@pytest.mark.skipif(not hasattr(signal, "setitimer"), reason="needs POSIX interval timers")
@pytest.mark.parametrize("mode", ["default", "unbatched", "unreplayed", "pool"])
def test_interrupted_steps_are_all_or_nothing_and_return(mode: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "interrupt_check.py"), mode, str(TRIES), "7"],
        capture_output=True,
        text=True,
        timeout=90,  # a caller left waiting (the audit's hang with a pool) fails here
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Exception ignored" not in done.stderr  # no interrupt was swallowed
    counts = json.loads(done.stdout.strip().splitlines()[-1])
    assert counts["interrupted"] >= TRIES // 4  # the timer did land inside steps
    assert counts["half_applied"] == 0
    assert counts["mixed_states"] == 0
    assert counts["collector_off"] == 0
    assert counts["usable_after"] == 1
