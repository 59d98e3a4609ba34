"""Atomic writes: a file appears whole under its name, or not at all."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO


@contextlib.contextmanager
def atomic_file(path: Path) -> Iterator[BinaryIO]:
    """A binary file written to a temporary name in ``path``'s directory, synced, then renamed to
    ``path``; on any failure the temporary file is removed and ``path`` is left as it was.

    The file gets the mode a plain ``open`` would give it (an existing file's own, else
    ``0o666`` less the umask), and a symbolic link at ``path`` is written through, not replaced."""
    path = Path(os.path.realpath(path))
    directory = path.parent
    if not directory.is_dir():  # else mkstemp's error would name the temporary file
        raise FileNotFoundError(errno.ENOENT, f"cannot write {path.name}: no such directory", str(directory))
    mode = _mode_for(path)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fchmod(f.fileno(), mode)  # mkstemp makes it 0600
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    _sync_directory(directory)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Writes ``data`` to ``path`` atomically."""
    with atomic_file(path) as f:
        f.write(data)


def _mode_for(path: Path) -> int:
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        return 0o666 & ~_umask()


def _umask() -> int:
    """The process's umask, read without changing it where Linux allows (``os.umask`` can only be
    read by setting it, which races with other threads creating files)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    old = os.umask(0o077)
    os.umask(old)
    return old


def _sync_directory(directory: Path) -> None:
    """Makes the rename itself durable (where a directory can be opened and synced)."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
