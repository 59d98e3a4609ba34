"""The multi-machine path of ``monadl.distributed``, on one machine: a Ray head started apart
(``ray start --head``, as on a cluster's head machine) and a driver in a process of its own that
joins it by address, as a script on a cluster does. The driver's data-parallel run (two workers on
the head) ends with bit-identical replicas, within 1e-12 of one process on the whole batches; the
head is stopped afterwards, and none of its processes remains.

The head is this test's alone: its files (sockets, logs, its address file) are in a short temporary
folder of its own, its ports are the system's choice, every server of it listens on the loopback
address only, and it admits only clients that hold its token. Other Ray clusters on the machine
(other tests' at the same time too) are neither joined nor stopped."""

from __future__ import annotations

import importlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("ray")

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="finds the head's processes in /proc"
)

ROOT = Path(__file__).resolve().parent.parent
_RAY = Path(sys.executable).with_name("ray")
RAY = [str(_RAY)] if _RAY.exists() else [sys.executable, "-m", "ray.scripts.scripts"]
"""The ``ray`` command of the interpreter that runs the tests (beside it, as in a virtual
environment; else its module)."""
MARKER = "MONADL_TEST_RAY_HEAD"
"""Set, to the head's folder, in the environment of the head and of the driver, and so in every
process they start (Ray's workers rename themselves, ``ray::IDLE``, but keep the environment they
were started with): the processes that carry it are this test's, and no one else's."""
START_S = 60.0
"""The longest wait for the head to start (seconds)."""
DRIVER_S = 180.0
"""The longest the driver may run."""
STOP_S = 30.0
"""The longest wait for the head to stop after SIGTERM before it is killed, and for its processes
to be gone after that."""

DRIVER = '''\
"""Joins the Ray head at sys.argv[1], trains on two workers there, then trains in this process on
the same batches; prints what the test compares, as JSON, on its last line."""

import json
import sys

import numpy as np
import ray

import monadl as ml
from monadl import nn
from monadl.distributed import DataParallel

# build and loss are defined in __main__: Ray's cloudpickle sends them by value, with COMPILED.
COMPILED = ml.compiled()


def build():
    return nn.MLP.new([3, 8, 2], activation=ml.tanh, seed=11, dtype=np.float64)  # compared to 1e-12


def loss(net, shard):
    """The SUM of the shard's squared errors (DataParallel divides by the global batch's size)."""
    if ml.compiled() != COMPILED:  # on a worker: the engine the driver runs (MONADL_PURE went through)
        raise RuntimeError(f"the worker's engine is {'pure' if COMPILED else 'compiled'}, the driver's not")
    x, y = shard
    error = net(x) - y
    return ml.sum(error * error)


rng = np.random.default_rng(5)
batches = [(rng.normal(size=(7, 3)), rng.normal(size=(7, 2))) for _ in range(3)]  # shards of 4 and 3

ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
with DataParallel(build, loss, ml.Adam(0.05), workers=2) as trainer:
    losses = [trainer.step(batch).unwrap() for batch in batches]  # unwrap: a Failure raises
    digests = trainer.digests()
    weights = trainer.weights()
report = {
    "gcs": ray.get_runtime_context().gcs_address,
    "cpus": ray.cluster_resources().get("CPU"),
    "nodes": len(ray.nodes()),
}
ray.shutdown()

net = build()
optimizer = ml.Adam(0.05)
reference = [ml.train_blocking(loss(net, (x, y)) * (1.0 / len(x)), optimizer).unwrap() for x, y in batches]
expected = {name: weight.data for name, weight in net.weights().items()}
report.update(
    losses=losses,
    reference_losses=reference,
    digests_equal=len(set(digests)) == 1,
    names_equal=sorted(weights) == sorted(expected),
    max_difference=max(float(np.max(np.abs(weights[name] - expected[name]))) for name in expected),
    compiled=ml.compiled(),
)
print(json.dumps(report))
'''


# ----------------------------------------------------------------------------------------- processes


def processes(folder: Path) -> dict[int, str]:
    """The processes of the head whose folder is ``folder`` (those whose environment carries
    :data:`MARKER`, or whose command line names the folder): their command lines by pid."""
    tag = f"{MARKER}={folder}".encode()
    found: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes()
            environment = (entry / "environ").read_bytes()
        except OSError:  # gone, or another user's
            continue
        if tag in environment.split(b"\0") or f"{folder}/".encode() in command:
            found[int(entry.name)] = command.replace(b"\0", b" ").decode(errors="replace").strip()
    return found


def kill_all(folder: Path) -> None:
    """SIGKILLs every process of the head (each found by its mark just before)."""
    for pid in processes(folder):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def environment(folder: Path, token: str) -> dict[str, str]:
    """The head's and the driver's environment: this one's, less every ``RAY_`` variable (no
    ``RAY_ADDRESS`` to join another cluster by), with the repository on the path (the workers import
    ``monadl`` from it), ``MONADL_PURE`` as it is here, and the cluster's settings."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("RAY_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env.update(
        {
            MARKER: str(folder),
            # The node's address is the loopback address: Ray's servers (the GCS's, the raylet's,
            # the workers' and agents') listen on it alone. Otherwise Ray takes the machine's
            # outward address for the node, even when told --node-ip-address 127.0.0.1.
            "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
            # A token of the test's own: no other client joins, and no token is written to ~/.ray.
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN": token,
            "RAY_USAGE_STATS_ENABLED": "0",
            # On SIGTERM, stop at once (not drain the node, up to 30 seconds, first).
            "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0",
        }
    )
    return env


OPTIONS = [
    # Every port the system's choice (0): no clash with another cluster on the machine.
    ("--node-manager-port", "0"),
    ("--object-manager-port", "0"),
    ("--runtime-env-agent-port", "0"),
    ("--dashboard-agent-listen-port", "0"),
    ("--dashboard-agent-grpc-port", "0"),
    ("--metrics-export-port", "0"),
    ("--min-worker-port", "0"),
    ("--max-worker-port", "0"),
    # Small, and without what a fixed node of one test does not need: the dashboard, the log
    # monitor (the driver takes no log), the autoscaler's monitor (slow to start and to stop).
    ("--object-store-memory", str(128 * 2**20)),
    ("--include-dashboard", "false"),
    ("--include-log-monitor", "false"),
    ("--no-monitor", None),
    ("--disable-usage-stats", None),
]
"""Options of ``ray start`` given where the installed Ray has them (``--no-monitor`` is hidden)."""


def start_options() -> set[str]:
    """The options the installed Ray's ``ray start`` takes (none known: an empty set)."""
    try:
        start = importlib.import_module("ray.scripts.scripts").start
        return {option for parameter in start.params for option in parameter.opts}
    except Exception:  # noqa: BLE001 - Ray's command line is not an API: go without the options
        return set()


class Head:
    """A Ray head, ``ray start --head --block``, in a session of its own."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.env = environment(folder, secrets.token_hex(32))
        self.log = folder / "head.log"
        command = [*RAY, "start", "--head", "--block", "--node-ip-address", "127.0.0.1", "--port", "0"]
        command += ["--num-cpus", "2", "--temp-dir", str(folder / "ray")]
        known = start_options()
        for option, value in OPTIONS:
            if option in known:
                command += [option] if value is None else [option, value]
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                command,
                cwd=folder,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def address(self) -> str:
        """The head's address (``127.0.0.1:port``), once it has started: ``ray start`` writes it to
        its folder when every process of the node is up."""
        written = self.folder / "ray" / "ray_current_cluster"
        deadline = time.monotonic() + START_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                pytest.fail(f"ray start exited with {self.process.returncode}:\n{self.tail()}")
            text = written.read_text().strip() if written.exists() else ""
            host, _, port = text.rpartition(":")
            if host and port.isdigit():
                return f"127.0.0.1:{port}"
            time.sleep(0.05)
        pytest.fail(f"the Ray head did not start in {START_S:.0f} s:\n{self.tail()}")

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def stop(self) -> dict[int, str]:
        """Stops the head (SIGTERM: ``ray start --block`` stops the node's processes, then exits;
        SIGKILL to its session where it does not in time) and waits for its processes to go; returns
        those that did not (killed then)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=STOP_S)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=STOP_S)
        deadline = time.monotonic() + STOP_S
        left = processes(self.folder)
        while left and time.monotonic() < deadline:
            time.sleep(0.1)
            left = processes(self.folder)
        kill_all(self.folder)
        return left


@pytest.fixture
def head() -> Iterator[Head]:
    folder = Path(tempfile.mkdtemp(prefix="mdl-ray-", dir="/tmp"))  # Unix sockets' paths are short
    try:
        started = Head(folder)
        try:
            yield started
        finally:
            started.stop()
    finally:
        kill_all(folder)
        shutil.rmtree(folder, ignore_errors=True)


# ----------------------------------------------------------------------------------------- the test


def test_a_driver_that_joins_a_separate_head_trains_as_one_process(head: Head) -> None:
    address = head.address()
    script = head.folder / "driver.py"
    script.write_text(DRIVER)
    try:
        run = subprocess.run(
            [sys.executable, str(script), address],
            cwd=ROOT,
            env=head.env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=DRIVER_S,
        )
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"the driver ran past {DRIVER_S:.0f} s:\n{e.stdout!r}\n{e.stderr!r}\n{head.tail()}")
    assert run.returncode == 0, f"the driver failed:\n{run.stdout}\n{run.stderr}\n{head.tail()}"
    report: dict[str, Any] = json.loads(run.stdout.strip().splitlines()[-1])

    # It joined this head (its GCS's port; one node, of two CPUs), not another cluster.
    assert report["gcs"].endswith(":" + address.rpartition(":")[2]), report
    assert (report["nodes"], report["cpus"]) == (1, 2.0), report
    # The engine the tests run (the workers run the driver's: the loss checks it).
    if os.environ.get("MONADL_PURE", "") not in ("", "0"):
        assert not report["compiled"], report

    assert report["digests_equal"], report
    assert report["names_equal"], report
    assert report["max_difference"] < 1e-12, report
    assert len(report["losses"]) == 3, report
    for got, expected in zip(report["losses"], report["reference_losses"], strict=True):
        assert abs(got - expected) < 1e-12, report

    left = head.stop()
    assert not left, f"processes of the head still ran after it stopped: {left}"
