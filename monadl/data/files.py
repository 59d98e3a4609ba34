"""Files: atomic writes (a file appears whole under its name, or not at all), their temporary files,
and reading user paths that are regular files only.

A temporary file is named ``.{name}.{tag}-{pid}.{random}.tmp`` beside its target ``name``: ``tag``
tells this machine (and PID namespace) apart, ``pid`` is the writer's process. A writer killed
mid-write (SIGKILL, a power cut) cannot remove its own, so the next write to the same target removes
those of writers that are gone, and any left untouched for a day.

A path to read is checked with ``stat`` before it is opened: a FIFO, a device or a socket is refused
by what it is (``NotARegularFileError``), never opened (a FIFO would wait for a writer, a device may
never end), and a missing path or a broken symbolic link is a ``FileNotFoundError`` saying which.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import re
import secrets
import shutil
import socket
import stat
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO, Final

#: A temporary file untouched for this long is stale even if a process of its writer's PID is alive
#: (PIDs are reused: after a reboot, say). A live writer touches its file as it writes.
STALE_AFTER_S: Final = 24 * 3600.0


class NotARegularFileError(OSError):
    """A path that exists but is no regular file (nor a directory, where one is allowed): a FIFO, a
    device, a socket, or a symbolic link to one. The message says which; the path was not opened."""


# ---------------------------------------------------------------------------------------------------
# Reading


def check_path(path: Path, *, directory_ok: bool = False) -> os.stat_result:
    """The ``stat`` of ``path`` (through symbolic links) if it is a regular file, or a directory when
    ``directory_ok``; else ``FileNotFoundError`` (nothing there, or a broken symbolic link),
    ``IsADirectoryError`` or ``NotARegularFileError``, each naming the path and what it is. Only
    ``stat`` and ``lstat`` are used: nothing is opened."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        if os.path.islink(path):
            raise FileNotFoundError(f"{path}: {kind_of(path)}") from None
        raise FileNotFoundError(f"{path}: no such file or directory") from None
    except OSError as e:
        if e.errno == errno.ELOOP:  # links that lead back to themselves
            raise NotARegularFileError(f"{path}: {kind_of(path)}, not a regular file: refused") from None
        if e.errno == errno.ENOTDIR:
            raise FileNotFoundError(f"{path}: no such file (a part of the path is not a directory)") from None
        raise
    if stat.S_ISREG(st.st_mode) or (directory_ok and stat.S_ISDIR(st.st_mode)):
        return st
    if stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError(f"{path}: {kind_of(path)}, not a regular file")
    wanted = "a regular file or directory" if directory_ok else "a regular file"
    raise NotARegularFileError(
        f"{path}: {kind_of(path)}, not {wanted}: refused (data is read from regular files only; a "
        "FIFO, a device or a socket is not opened, as reading it could block or never end)"
    )


def kind_of(path: Path) -> str:
    """What ``path`` is, in words, for messages: "a FIFO (named pipe)", "a symbolic link to /dev/null,
    which is a character device", "a broken symbolic link to 'x' (which does not exist)", ... From
    ``lstat`` and ``stat`` alone."""
    try:
        own = os.lstat(path)
    except FileNotFoundError:
        return "no such file or directory"
    if not stat.S_ISLNK(own.st_mode):
        return _kind(own.st_mode)
    target = os.readlink(path)
    try:
        return f"a symbolic link to {target}, which is {_kind(os.stat(path).st_mode)}"
    except FileNotFoundError:
        return f"a broken symbolic link to {target!r} (which does not exist)"
    except OSError as e:  # a loop of links, say
        return f"a symbolic link to {target} that cannot be followed ({e.strerror})"


def _kind(mode: int) -> str:
    kinds = (
        (stat.S_ISREG, "a regular file"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    )
    return next((name for test, name in kinds if test(mode)), "a special file")


def open_regular_file(path: Path) -> int:
    """A read-only descriptor of the regular file ``path``, refused as ``check_path`` says otherwise.

    Opened non-blocking and checked again with ``fstat``: a path replaced by a FIFO after the check
    is refused, not waited on. The descriptor is then made blocking again (for regular files, no
    difference)."""
    check_path(path)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotARegularFileError(f"{path}: replaced by {kind_of(path)} as it was opened: refused")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_regular_file(path: Path) -> bytes:
    """The bytes of the regular file ``path``, refused as ``check_path`` says otherwise."""
    with os.fdopen(open_regular_file(path), "rb") as f:
        return f.read()


# ---------------------------------------------------------------------------------------------------
# Writing


@contextlib.contextmanager
def atomic_file(path: Path) -> Iterator[BinaryIO]:
    """A binary file written to a temporary name in ``path``'s directory, synced, then renamed to
    ``path`` (and the directory synced); on any failure the temporary file is removed and ``path`` is
    left as it was. Stale temporary files of earlier writes to ``path`` are removed first.

    The file gets the mode a plain ``open`` would give it (an existing file's own, else
    ``0o666`` less the umask), and a symbolic link at ``path`` is written through, not replaced."""
    path, tmp, mode = _temporary_for(path)
    try:  # (entered before the file exists: no interrupt can leave it behind)
        fd = _create(tmp)
        try:
            with os.fdopen(fd, "wb", closefd=False) as f:  # (closed below, once synced)
                yield f
            os.fchmod(fd, mode)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    sync_directory(path.parent)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Writes ``data`` to ``path`` atomically (as :func:`atomic_file`)."""
    with atomic_file(path) as f:
        fd = f.fileno()  # written directly: a buffered write of all of it would copy it once more
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]


def _temporary_for(path: Path) -> tuple[Path, Path, int]:
    """``path`` resolved (a symbolic link is written through), the name of a temporary file of this
    process's own for it (not made yet), and the mode a plain ``open`` would give ``path``; stale
    temporaries of earlier writers are removed."""
    path = Path(os.path.realpath(path))
    directory = path.parent
    if not directory.is_dir():  # else the error would name the temporary file
        raise FileNotFoundError(errno.ENOENT, f"cannot write {path.name}: no such directory", str(directory))
    remove_stale_temporaries(directory, path.name)
    return path, directory / f"{temporary_prefix(path.name)}{secrets.token_hex(8)}.tmp", _mode_for(path)


def _create(tmp: Path) -> int:
    """A new file of the owner's only (its mode is set once written), never one that exists."""
    return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o600)


@contextlib.contextmanager
def temporary_directory(directory: Path, name: str) -> Iterator[Path]:
    """A new directory in ``directory``, named as a temporary of ``name``, removed with its contents
    on exit; stale ones of earlier writers (see ``remove_stale_temporaries``) are removed first."""
    remove_stale_temporaries(directory, name)
    tmp = Path(tempfile.mkdtemp(dir=directory, prefix=temporary_prefix(name), suffix=".tmp"))
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def temporary_prefix(name: str) -> str:
    """The start of this process's temporary names for ``name``: ``.{name}.{tag}-{pid}.``; a random
    part and ``.tmp`` follow."""
    return f".{name}.{_writer_tag()}-{os.getpid()}."


def remove_stale_temporaries(directory: Path, name: str, *, now: float | None = None) -> None:
    """Remove the temporary files (or directories) of ``name`` in ``directory`` whose writer is gone:
    its process no longer exists on this machine, or the temporary was untouched for
    ``STALE_AFTER_S`` (its PID reused, or written from another machine). Those of this process and
    of other live writers stay. Best effort: a temporary that cannot be removed is left."""
    pattern = re.compile(rf"\.{re.escape(name)}\.([0-9a-f]{{8}})-([0-9]{{1,10}})\.[^.]+\.tmp")
    now = time.time() if now is None else now
    tag = _writer_tag()
    with contextlib.suppress(OSError), os.scandir(directory) as entries:
        for entry in entries:
            m = pattern.fullmatch(entry.name)
            if m is None:
                continue
            with contextlib.suppress(OSError):
                st = entry.stat(follow_symlinks=False)
                old = now - st.st_mtime > STALE_AFTER_S
                pid = int(m.group(2))
                if pid == os.getpid() and m.group(1) == tag:
                    continue  # this process's own: another thread may be writing it
                if old or (m.group(1) == tag and not _alive(pid)):
                    _remove(Path(entry.path), st)


def _alive(pid: int) -> bool:
    """Whether a process ``pid`` exists here (signal 0 tests without sending; a process of another
    user answers PermissionError, and is alive)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except (OverflowError, OSError):
        return True  # cannot tell: keep it (the age limit still applies)
    return True


def _remove(path: Path, st: os.stat_result) -> None:
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(path, ignore_errors=True)
    elif stat.S_ISREG(st.st_mode):
        path.unlink(missing_ok=True)


def _writer_tag() -> str:
    """Eight hex digits for this machine and PID namespace: a PID means something only there (an
    NFS-shared directory, or containers sharing a volume, see other machines' writers)."""
    try:
        namespace = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        namespace = 0
    host = f"{socket.gethostname()} {namespace}".encode()
    return hashlib.blake2b(host, digest_size=4).hexdigest()


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


def sync_file(path: Path) -> None:
    """Makes a file's data durable before it is renamed into place."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sync_directory(directory: Path) -> None:
    """Makes a rename itself durable (where a directory can be opened and synced)."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
