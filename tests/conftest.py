"""Fixtures shared by the test files: one local Ray cluster for the session (started once, where
the tests that need it run; Ray is the optional ``distributed`` extra, in ``dev``)."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"
RAY_CPUS = 4
"""The logical CPUs of the session's cluster: enough for the tests' four workers (on any machine)."""


def pytest_configure(config: pytest.Config) -> None:
    """Ctrl-C is a ``KeyboardInterrupt`` in the tests' process and in the processes it starts, even
    where the suite itself was started with SIGINT ignored (as a background job of a
    non-interactive shell is: it inherits SIG_IGN, and Python then installs no handler). The tests
    that interrupt a step or a training script send it."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session")
def ray_session() -> Iterator[Any]:
    """A local Ray cluster, started at the first test that asks for it and stopped at the end of
    the session. Its workers import the repository's modules (``examples``) and the tests' own
    (functions defined in a test file are sent by name), and run the engine the tests run
    (``MONADL_PURE``)."""
    ray = pytest.importorskip("ray")
    env = {"PYTHONPATH": os.pathsep.join([str(ROOT), str(TESTS)])}
    if "MONADL_PURE" in os.environ:
        env["MONADL_PURE"] = os.environ["MONADL_PURE"]
    ray.init(
        num_cpus=RAY_CPUS,
        include_dashboard=False,
        logging_level="ERROR",
        log_to_driver=False,
        runtime_env={"env_vars": env},
    )
    try:
        yield ray
    finally:
        ray.shutdown()
