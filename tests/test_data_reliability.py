"""Reliability of the data readers and writers: a file changed under
an open reader is an error, not a crash; a synthetic-data description is checked against its files;
a path that is no regular file is named for what it is; a killed writer's temporary files are removed
by the next write. Files are small and written under pytest's tmp_path.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from monadl.data import (
    FINE_TO_COARSE,
    RECORD_BYTES,
    Cifar100,
    CifarFormatError,
    NotARegularFileError,
    extract_cifar100,
    open_cifar100,
    sst,
    write_synthetic_cifar100,
)
from monadl.data.files import STALE_AFTER_S, atomic_write_bytes, temporary_prefix

ROOT = Path(__file__).resolve().parents[1]


def _python(code: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter that imports this checkout's monadl."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=timeout, env=env
    )


@pytest.fixture(scope="module")
def synth_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_synthetic_cifar100(tmp_path_factory.mktemp("synth"), per_fine_class=2, test_per_fine_class=1)


# --- item 1: a file changed while open ------------------------------------------------------------------

TRUNCATE = """
import os, sys
from monadl.data import Cifar100, CifarFormatError
ds = Cifar100(sys.argv[1])
os.truncate(sys.argv[1], int(sys.argv[2]))
try:
    list(ds.batches(8))
except CifarFormatError as e:
    print(e)
    sys.exit(0)
sys.exit(3)  # no error at all
"""


@pytest.mark.parametrize("size", [10_000, 0, 100 * RECORD_BYTES])
def test_a_file_truncated_while_open_is_a_format_error_not_a_crash(
    tmp_path: Path, synth_dir: Path, size: int
) -> None:
    path = tmp_path / "train.bin"
    path.write_bytes((synth_dir / "train.bin").read_bytes())  # 200 records, no sidecar: a plain file
    done = _python(TRUNCATE, str(path), str(size), timeout=120)
    # A memory-mapped reader dies of SIGBUS here: returncode -7 (135 from a shell).
    assert done.returncode == 0, f"exit {done.returncode}: {done.stderr[-2000:]}"
    assert done.stdout.startswith(f"{path}: the file changed after it was opened: {size:,} bytes now, ")
    assert f"{200 * RECORD_BYTES:,} expected (200 records)" in done.stdout


def test_labels_rewritten_while_open_are_named(tmp_path: Path, synth_dir: Path) -> None:
    path = tmp_path / "train.bin"
    path.write_bytes((synth_dir / "train.bin").read_bytes())
    ds = Cifar100(path)
    fine = (int(ds.fine_labels[5]) + 1) % 100
    with path.open("r+b") as f:  # in place: another valid pair of labels, so only a reread tells
        f.seek(5 * RECORD_BYTES)
        f.write(bytes([FINE_TO_COARSE[fine], fine]))
    with pytest.raises(CifarFormatError, match="changed after it was opened: record 5 has the labels"):
        ds.batch([5])
    assert ds.batch([4]).fine.tolist() == [ds.fine_labels[4]]  # the other records still read


def test_batches_read_runs_and_single_records_alike(synth_dir: Path) -> None:
    ds = Cifar100(synth_dir / "train.bin")
    raw = np.frombuffer((synth_dir / "train.bin").read_bytes(), dtype=np.uint8).reshape(-1, RECORD_BYTES)
    members = np.flatnonzero(ds.coarse_labels == 0)
    for ix in (members, members[::-1], members[[3, 4, 0, 5, 6, 9]]):
        assert np.array_equal(ds.batch(ix).x, raw[ix, 2:] / np.float32(256))
    again = pickle.loads(pickle.dumps(ds))  # reopened by its path
    assert again.describe() == ds.describe() and np.array_equal(again.batch(members).x, ds.batch(members).x)


# --- item 11: the synthetic-data description ------------------------------------------------------------


def _describe(directory: Path, **changes: object) -> Path:
    sidecar = directory / "synthetic.json"
    meta = json.loads(sidecar.read_text())
    for field, value in changes.items():
        if value is _DROP:
            del meta[field]
        else:
            meta[field] = value
    sidecar.write_text(json.dumps(meta))
    return sidecar


_DROP = object()


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"per_fine_class": {"train": 50}}, "per_fine_class.train is 50 (5,000 records"),
        ({"per_fine_class": {}}, "per_fine_class {}"),
        ({"per_fine_class": []}, "per_fine_class []"),
        ({"per_fine_class": {"train": 0}}, "per_fine_class.train 0 is not a positive integer"),
        ({"per_fine_class": {"train": -5}}, "per_fine_class.train -5 is not a positive integer"),
        ({"per_fine_class": {"train": 1, "valid": 1}}, "per_fine_class has the split 'valid'"),
        ({"per_fine_class": {"train": True}}, "per_fine_class.train True"),
        ({"noise": -1.0}, "noise -1.0 is not a finite non-negative number"),
        ({"noise": 10**400}, "noise 1000000000"),
        ({"version": 99}, "version 99 is not 1"),
        ({"version": "1"}, "version '1' is not 1"),
        ({"seed": -3}, "seed -3 is not a non-negative integer"),
        ({"complete": "yes"}, "complete 'yes' is not true or false"),
        ({"version": _DROP}, "version is missing"),
        ({"noise": _DROP}, "noise is missing"),
        ({"per_fine_class": _DROP}, "per_fine_class is missing"),
    ],
)
def test_a_bad_synthetic_description_is_named_with_its_field(
    tmp_path: Path, changes: dict[str, object], field: str
) -> None:
    write_synthetic_cifar100(tmp_path, per_fine_class=1, test_per_fine_class=0)  # 100 records
    sidecar = _describe(tmp_path, **changes)
    with pytest.raises(CifarFormatError) as e:
        Cifar100(tmp_path / "train.bin")
    assert str(e.value).startswith(f"{sidecar}: ") and field in str(e.value)


def test_a_description_must_match_every_split_it_lists(tmp_path: Path) -> None:
    write_synthetic_cifar100(tmp_path, per_fine_class=1, test_per_fine_class=2)
    sidecar = _describe(tmp_path, per_fine_class={"train": 1, "test": 3})
    with pytest.raises(CifarFormatError, match=r"per_fine_class\.test is 3 .* test\.bin holds 200 records"):
        Cifar100(tmp_path / "train.bin")  # the other split's file, checked too
    _describe(tmp_path, per_fine_class={"train": 1})
    with pytest.raises(CifarFormatError, match=r"per_fine_class has no 'test', yet test\.bin is here") as e:
        Cifar100(tmp_path / "test.bin")  # synthetic data, never described as the real set
    assert str(sidecar) in str(e.value)
    assert Cifar100(tmp_path / "train.bin").is_synthetic  # a split it does not list, missing: fine
    (tmp_path / "test.bin").unlink()
    _describe(tmp_path, per_fine_class={"train": 1, "test": 2})
    assert Cifar100(tmp_path / "train.bin").describe().startswith("synthetic CIFAR-100 train.bin (100")


# --- item 12: paths that are no regular file ------------------------------------------------------------

Opener = Callable[[Path], object]
OPENERS: dict[str, Opener] = {
    "open_cifar100": open_cifar100,
    "Cifar100": Cifar100,
    "extract_cifar100": extract_cifar100,
    "sst.open_dataset": sst.open_dataset,
    "sst.read_trees": sst.read_trees,
}


def _special(tmp_path: Path, kind: str) -> Path:
    path = tmp_path / "data"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "link to /dev/null":
        path.symlink_to("/dev/null")
    elif kind == "broken link":
        path.symlink_to(tmp_path / "gone")
    return path


def _unblock(path: Path) -> None:
    """Let a reader waiting to open the FIFO ``path`` go on: a writer opens it, then closes (EOF)."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:
        pass


def _raised_within(seconds: float, call: Callable[[], object], fifo: Path) -> BaseException | None:
    """What ``call()`` raised (None if nothing), failing the test if it blocks (opening a FIFO waits for
    a writer): the refusal must come from stat alone."""
    raised: list[BaseException | None] = []

    def run() -> None:
        try:
            call()
            raised.append(None)
        except BaseException as e:  # noqa: BLE001 (handed to the test)
            raised.append(e)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        _unblock(fifo)
        worker.join(seconds)
        pytest.fail(f"blocked for {seconds} s on {fifo}")
    return raised[0]


@pytest.mark.parametrize("opener", list(OPENERS))
@pytest.mark.parametrize(
    ("kind", "error", "says"),
    [
        ("fifo", NotARegularFileError, "a FIFO (named pipe), not a regular file"),
        (
            "link to /dev/null",
            NotARegularFileError,
            "a symbolic link to /dev/null, which is a character device, not a regular file",
        ),
        ("broken link", FileNotFoundError, "a broken symbolic link to "),
        ("missing", FileNotFoundError, "no such file or directory"),
    ],
)
def test_a_path_that_is_no_regular_file_is_named_for_what_it_is(
    tmp_path: Path, opener: str, kind: str, error: type[Exception], says: str
) -> None:
    path = _special(tmp_path, kind)
    raised = _raised_within(10, lambda: OPENERS[opener](path), path)
    assert isinstance(raised, error), repr(raised)
    assert str(raised).startswith(f"{path}: {says}")


def test_a_fifo_inside_a_data_directory_is_named(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "train.bin")
    raised = _raised_within(10, lambda: open_cifar100(tmp_path), tmp_path / "train.bin")
    assert isinstance(raised, NotARegularFileError)
    assert str(raised).startswith(f"{tmp_path / 'train.bin'}: a FIFO")
    sst_dir = tmp_path / "sst"
    sst_dir.mkdir()
    for split in ("dev", "test"):
        (sst_dir / f"{split}.txt").write_text("(2 a)\n")
    os.mkfifo(sst_dir / "train.txt")
    raised = _raised_within(10, lambda: sst.load_sst(sst_dir), sst_dir / "train.txt")
    assert isinstance(raised, NotARegularFileError)  # not "no train.txt here"
    assert str(raised).startswith(f"{sst_dir / 'train.txt'}: a FIFO")


def test_a_synthetic_description_that_is_a_fifo_is_refused(tmp_path: Path, synth_dir: Path) -> None:
    (tmp_path / "train.bin").write_bytes((synth_dir / "train.bin").read_bytes())
    os.mkfifo(tmp_path / "synthetic.json")  # not taken for absent: the data would pass for the real set
    raised = _raised_within(10, lambda: Cifar100(tmp_path / "train.bin"), tmp_path / "synthetic.json")
    assert isinstance(raised, NotARegularFileError)


# --- item 13: temporary files of killed writers ---------------------------------------------------------


def _temporary(directory: Path, name: str, pid: int, random: str, *, tag: str | None = None) -> Path:
    """A temporary file of ``name`` as the writer ``pid`` names it (on this machine, unless ``tag``)."""
    mine = temporary_prefix(name)  # .{name}.{tag}-{our pid}.
    prefix = mine.removesuffix(f"{os.getpid()}.") if tag is None else f".{name}.{tag}-"
    path = directory / f"{prefix}{pid}.{random}.tmp"
    path.write_bytes(b"partial")
    return path


@pytest.fixture
def dead_pid() -> int:
    """The PID of a process that has exited and been reaped."""
    done = _python("import os; print(os.getpid())")
    return int(done.stdout)


@pytest.fixture
def live_pid() -> Iterator[int]:
    """The PID of another process, alive until the test ends."""
    with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"]) as child:
        try:
            yield child.pid
        finally:
            child.kill()


KILLED_WRITER = """
import sys, time
from pathlib import Path
from monadl.data.files import atomic_file
with atomic_file(Path(sys.argv[1])) as f:
    f.write(b"x" * 100_000)
    f.flush()
    print("writing", flush=True)
    time.sleep(120)
"""


def test_a_killed_writers_temporary_is_removed_by_the_next_write(
    tmp_path: Path, dead_pid: int, live_pid: int
) -> None:
    target = tmp_path / "target.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    writer = subprocess.Popen(
        [sys.executable, "-c", KILLED_WRITER, str(target)], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert writer.stdout is not None and writer.stdout.readline() == "writing\n"
        (killed,) = [p for p in tmp_path.iterdir() if p.name.startswith(".target.json.")]
    finally:
        writer.kill()  # SIGKILL: no cleanup of its own
        writer.wait()
        if writer.stdout is not None:
            writer.stdout.close()
    assert killed.exists()
    gone = _temporary(tmp_path, "target.json", dead_pid, "abcdefgh")
    mine = _temporary(tmp_path, "target.json", os.getpid(), "other123")  # another thread's, say
    theirs = _temporary(tmp_path, "target.json", live_pid, "live5678")
    other_target = _temporary(tmp_path, "target.json.5", dead_pid, "abcdefgh")  # not of this target
    atomic_write_bytes(target, b"new")
    assert target.read_bytes() == b"new"
    assert not killed.exists() and not gone.exists()
    assert mine.exists() and theirs.exists() and other_target.exists()
    assert f"-{writer.pid}." in killed.name and killed.name.endswith(".tmp")  # recognisable


def test_an_old_temporary_goes_and_another_machines_fresh_one_stays(
    tmp_path: Path, dead_pid: int, live_pid: int
) -> None:
    old = _temporary(tmp_path, "t", live_pid, "aaaaaaaa")  # its PID alive, but untouched for days: reused
    long_ago = time.time() - STALE_AFTER_S - 3600
    os.utime(old, (long_ago, long_ago))
    fresh = _temporary(tmp_path, "t", live_pid, "bbbbbbbb")
    tag = "ffffffff" if temporary_prefix("t") != f".t.ffffffff-{os.getpid()}." else "00000000"
    elsewhere = _temporary(tmp_path, "t", dead_pid, "cccccccc", tag=tag)  # a PID of another machine
    elsewhere_old = _temporary(tmp_path, "t", dead_pid, "dddddddd", tag=tag)
    os.utime(elsewhere_old, (long_ago, long_ago))
    atomic_write_bytes(tmp_path / "t", b"x")
    assert not old.exists() and not elsewhere_old.exists()
    assert fresh.exists() and elsewhere.exists()


def test_a_killed_extractions_temporary_directory_is_removed(
    tmp_path: Path, synth_dir: Path, dead_pid: int
) -> None:
    import io
    import tarfile

    archive = tmp_path / "a.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        data = (synth_dir / "test.bin").read_bytes()
        info = tarfile.TarInfo("cifar-100-binary/test.bin")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    cache = tmp_path / "cache"
    cache.mkdir()
    stale = _temporary(cache, "extract", dead_pid, "abcdefgh")
    stale.unlink()
    (stale / "cifar-100-binary").mkdir(parents=True)  # as a killed extraction leaves it
    (stale / "cifar-100-binary" / "test.bin").write_bytes(data)
    assert len(open_cifar100(archive, split="test", cache_dir=cache)) == 100
    assert not stale.exists()
    assert sorted(p.name for p in cache.iterdir()) == [".a.tar.gz.extracted.json", "cifar-100-binary"]


# --- found by the audit's second campaign -----------------------------------------------------------


@pytest.mark.parametrize("content", ["null", "[]", '{"format": "monadl synthetic CIFAR-10"}', "{}"])
def test_a_sidecar_of_another_format_is_refused_not_ignored(content: str, tmp_path: Path) -> None:
    # Ignored, a damaged description let synthetic data pass as "CIFAR-100 train.bin (100 records)".
    directory = write_synthetic_cifar100(tmp_path / "synthetic", per_fine_class=1, test_per_fine_class=0)
    (directory / "synthetic.json").write_text(content)
    with pytest.raises(CifarFormatError, match=r"synthetic\.json: not a description of monadl's synthetic"):
        open_cifar100(directory)


def test_a_symbolic_link_loop_is_named(tmp_path: Path) -> None:
    loop = tmp_path / "train.bin"
    loop.symlink_to(loop)
    with pytest.raises(NotARegularFileError, match=r"train\.bin"):
        open_cifar100(loop)
    with pytest.raises(NotARegularFileError, match=r"train\.bin"):
        sst.read_trees(loop)


@pytest.mark.parametrize("label", ["0" * 4300 + "1", "0" * 5000, "-" + "0" * 4400 + "7"])
def test_a_zero_padded_label_past_int_limit_is_read_or_named(label: str) -> None:
    text = f"({label} a)"
    if label.lstrip("-").lstrip("0") in ("", "1"):
        assert sst.parse_tree(text).label == int(label.lstrip("-").lstrip("0") or "0")
    else:
        with pytest.raises(sst.SstFormatError, match=r"outside 0\.\.4"):
            sst.parse_tree(text)
