"""CIFAR-100 in the official binary format: a validated reader, batching by coarse class, and a synthetic
stand-in written in exactly the same format.

A file is a sequence of 3,074-byte records: one coarse-label byte (0..19), one fine-label byte (0..99),
then 3,072 pixel bytes, channel-major (3 x 32 x 32: all red, all green, all blue). The official
release ships them as ``train.bin`` (50,000 records) and ``test.bin`` (10,000 records), inside
``cifar-100-binary.tar.gz``. Files are checked when opened (size, label ranges and every fine label
against its coarse class) and kept open; a batch's records are read then, with positional reads into
a NumPy buffer, never into Python objects. Not memory-mapped: a mapped file truncated by another process
kills the reader with SIGBUS, where a short read is a ``CifarFormatError`` naming the file.

Batches hold samples of one coarse class, in the form the column model expects: ``x`` (B, 3072) of
pixels / 256, the coarse class ``c`` and ``fine_local`` (B,), the rank 0..4 of each sample's fine class
among the five fine classes of ``c``.

Entry point: ``open_dataset(path)`` (``monadl.data.open_cifar100``), with ``path=None`` for the
synthetic data set. Every data set says which data it is with ``describe()`` (also ``source``).
"""

from __future__ import annotations

import itertools
import json
import lzma
import os
import stat
import sys
import tarfile
import typing
import weakref
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from gzip import BadGzipFile
from pathlib import Path, PurePosixPath
from typing import Any, Final, Literal, NamedTuple

import numpy as np
import numpy.typing as npt

from monadl.data.files import (
    atomic_file,
    atomic_write_bytes,
    check_path,
    open_regular_file,
    read_regular_file,
    sync_directory,
    sync_file,
    temporary_directory,
)
from monadl.typeclasses.backend import is_integer

__all__ = [
    "COARSE_TO_FINE",
    "FINE_PER_COARSE",
    "FINE_TO_COARSE",
    "FINE_TO_LOCAL",
    "IMAGE_BYTES",
    "N_COARSE",
    "N_FINE",
    "RECORD_BYTES",
    "Batch",
    "Cifar100",
    "CifarFormatError",
    "Split",
    "StrPath",
    "default_cache_dir",
    "extract_cifar100",
    "open_dataset",
    "synthetic_cifar100",
    "write_synthetic_cifar100",
]

StrPath = str | os.PathLike[str]
Split = Literal["train", "test"]

IMAGE_BYTES: Final = 3 * 32 * 32
RECORD_BYTES: Final = 2 + IMAGE_BYTES
N_COARSE: Final = 20
N_FINE: Final = 100
FINE_PER_COARSE: Final = 5

# The official CIFAR-100 mapping, indexed by fine label.
FINE_TO_COARSE: Final[tuple[int, ...]] = (
    4, 1, 14, 8, 0, 6, 7, 7, 18, 3, 3, 14, 9, 18, 7, 11, 3, 9, 7, 11,
    6, 11, 5, 10, 7, 6, 13, 15, 3, 15, 0, 11, 1, 10, 12, 14, 16, 9, 11, 5,
    5, 19, 8, 8, 15, 13, 14, 17, 18, 10, 16, 4, 17, 4, 2, 0, 17, 4, 18, 17,
    10, 3, 2, 12, 12, 16, 12, 1, 9, 19, 2, 10, 0, 1, 16, 12, 9, 13, 15, 13,
    16, 19, 2, 4, 6, 19, 5, 5, 8, 19, 18, 1, 2, 15, 6, 0, 17, 8, 14, 13,
)  # fmt: skip
#: The fine labels of each coarse class, ascending; a fine class's local label is its index here.
COARSE_TO_FINE: Final[tuple[tuple[int, ...], ...]] = tuple(
    tuple(f for f in range(N_FINE) if FINE_TO_COARSE[f] == c) for c in range(N_COARSE)
)
#: The local label 0..4 of each fine label.
FINE_TO_LOCAL: Final[tuple[int, ...]] = tuple(
    COARSE_TO_FINE[FINE_TO_COARSE[f]].index(f) for f in range(N_FINE)
)

_FINE_TO_COARSE = np.array(FINE_TO_COARSE, dtype=np.int64)
_FINE_TO_LOCAL = np.array(FINE_TO_LOCAL, dtype=np.int64)
_COARSE_TO_FINE = np.array(COARSE_TO_FINE, dtype=np.int64)
_COARSE_TO_FINE.setflags(write=False)
_FINE_TO_COARSE.setflags(write=False)
_FINE_TO_LOCAL.setflags(write=False)

_SIDECAR: Final = "synthetic.json"
_SIDECAR_FORMAT: Final = "monadl synthetic CIFAR-100"
_SYNTHETIC_VERSION: Final = 1
_ARCHIVE_NAME: Final = "cifar-100-binary.tar.gz"
_TEST_PER_FINE_CLASS: Final = 10  # synthetic defaults
_NOISE: Final = 48.0
_HAS_PREADV: Final = hasattr(os, "preadv")


class CifarFormatError(ValueError):
    """A CIFAR-100 file or archive that is not in the expected format; the message names the file."""


class Batch(NamedTuple):
    """Samples of one coarse class, unpackable as ``x, coarse, fine_local``.

    ``x`` (B, 3072) pixels / 256, in [0, 1); ``coarse`` the class 0..19 they share; ``fine_local`` (B,)
    int64, each sample's fine class as its rank 0..4 among the fine classes of ``coarse``.
    """

    x: npt.NDArray[np.floating[Any]]
    coarse: int
    fine_local: npt.NDArray[np.int64]

    @property
    def fine(self) -> npt.NDArray[np.int64]:
        """The fine labels 0..99, (B,)."""
        fine: npt.NDArray[np.int64] = _COARSE_TO_FINE[self.coarse, self.fine_local]
        return fine


# NamedTuple makes the constructor in a namespace of its own, where these string annotations name
# nothing: resolved once, for tools that read the constructor's annotations (the API reference).
Batch.__new__.__annotations__.update(typing.get_type_hints(Batch))


@dataclass(frozen=True)
class _SyntheticInfo:
    seed: int
    noise: float
    per_fine_class: int


class Cifar100:
    """One CIFAR-100 binary file (``train.bin`` or ``test.bin``), validated on open and kept open.

    Raises ``CifarFormatError`` naming the file (and the first bad record) when the file is malformed,
    and when it changes while open: a batch whose records are no longer there (the file truncated) or
    whose labels are not those validated (the file rewritten in place).
    """

    path: Path
    source: str

    def __init__(self, path: StrPath, *, origin: StrPath | None = None) -> None:
        """Open and validate ``path``; ``origin`` is the archive it was extracted from, if any."""
        self.path = Path(path)
        self._origin = origin
        if self.path.is_dir():
            raise IsADirectoryError(
                f"{self.path}: a directory, not a CIFAR-100 binary file (open_dataset finds one in it)"
            )
        # The descriptor, not the path, is read from then on: the file validated here, even if another
        # takes its name. Closed when this object is collected.
        self._fd = open_regular_file(self.path)
        self._close = weakref.finalize(self, os.close, self._fd)
        try:
            size = os.fstat(self._fd).st_size
            if size == 0 or size % RECORD_BYTES != 0:
                raise CifarFormatError(
                    f"{self.path}: size {size:,} bytes is not a positive multiple of the record size "
                    f"{RECORD_BYTES} (1 coarse byte, 1 fine byte, {IMAGE_BYTES} pixel bytes); truncated "
                    "or not a CIFAR-100 binary file"
                )
            self._n = size // RECORD_BYTES
            # Copies of the two label columns: n bytes each, used for validation and for batching.
            self._coarse, self._fine = self._read_labels()
            _validate_labels(self.path, self._coarse, self._fine)
            self._coarse.setflags(write=False)
            self._fine.setflags(write=False)
            self._class_indices = [np.flatnonzero(self._coarse == c) for c in range(N_COARSE)]
            self._synthetic = _read_sidecar(self.path, self._n)
        except BaseException:
            self._close()
            raise
        self.source = self._describe(origin)

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled as its path: unpickling opens (and validates) the file again."""
        return (_reopen, (self.path, self._origin))

    def _read_labels(self) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.uint8]]:
        """The coarse and fine label of every record, read a chunk of records at a time."""
        coarse = np.empty(self._n, dtype=np.uint8)
        fine = np.empty(self._n, dtype=np.uint8)
        chunk = 1024  # 3 MB
        for start in range(0, self._n, chunk):
            rec = self._read_run(start, min(chunk, self._n - start))
            coarse[start : start + len(rec)] = rec[:, 0]
            fine[start : start + len(rec)] = rec[:, 1]
        return coarse, fine

    def _describe(self, origin: StrPath | None) -> str:
        counts = f"{len(self):,} records"
        if self._synthetic is not None:
            s = self._synthetic
            what = (
                f"synthetic CIFAR-100 {self.path.name} ({counts}, seed {s.seed}, "
                f"{s.per_fine_class} per fine class, noise {s.noise:g})"
            )
        else:
            what = f"CIFAR-100 {self.path.name} ({counts})"
        where = f" from {origin}" if origin is not None else ""
        return f"{what}{where} at {self.path}"

    def describe(self) -> str:
        """Which data this is, for logs and reports: kind, file, record count and path."""
        return self.source

    def __repr__(self) -> str:
        return f"Cifar100({self.source!r})"

    @property
    def is_synthetic(self) -> bool:
        """Whether this file was written by ``write_synthetic_cifar100`` (per its ``synthetic.json``)."""
        return self._synthetic is not None

    def __len__(self) -> int:
        return self._n

    @property
    def coarse_labels(self) -> npt.NDArray[np.uint8]:
        """The coarse label of every record, (n,) uint8, read-only."""
        return self._coarse

    @property
    def fine_labels(self) -> npt.NDArray[np.uint8]:
        """The fine label of every record, (n,) uint8, read-only."""
        return self._fine

    @property
    def records(self) -> npt.NDArray[np.uint8]:
        """Every record's bytes, (n, 3074) uint8: a copy read from the file now, n x 3,074 bytes in memory
        (``batches`` and ``batch`` read only their own records)."""
        return self._read_run(0, self._n)

    @property
    def pixels(self) -> npt.NDArray[np.uint8]:
        """The raw pixel bytes, (n, 3072) (channel-major 3 x 32 x 32): a view of ``records``, read now."""
        return self.records[:, 2:]

    def class_counts(self) -> npt.NDArray[np.int64]:
        """The number of records of each coarse class, (20,)."""
        return np.array([len(ix) for ix in self._class_indices], dtype=np.int64)

    def num_batches(self, batch_size: int, *, drop_last: bool = True) -> int:
        """How many batches ``batches(batch_size, drop_last=drop_last)`` yields."""
        _check_batch_size(batch_size)
        counts = self.class_counts()
        full = int((counts // batch_size).sum())
        return full if drop_last else full + int(np.count_nonzero(counts % batch_size))

    def batch(self, indices: npt.ArrayLike, *, dtype: npt.DTypeLike = np.float32) -> Batch:
        """The batch of the given record indices, which must all share one coarse class."""
        given = np.asarray(indices)
        if given.size and given.dtype.kind not in "iu":  # 1.7 or True would pick a record silently
            raise TypeError(f"record indices must be integers, got an array of {given.dtype}")
        ix = given.astype(np.int64).reshape(-1)
        if ix.size == 0:
            raise ValueError("a batch needs at least one record")
        if ix.min() < 0 or ix.max() >= len(self):
            raise IndexError(f"record indices out of range 0..{len(self) - 1} of {self.path}")
        coarse = self._coarse[ix]
        if np.any(coarse != coarse[0]):
            raise ValueError(
                f"records of a batch must share one coarse class, got {np.unique(coarse).tolist()}"
            )
        return self._gather(ix, int(coarse[0]), _float_dtype(dtype))

    def _gather(self, ix: npt.NDArray[np.int64], coarse: int, dtype: np.dtype[Any]) -> Batch:
        rec = self._read_records(ix)
        fine = self._fine[ix]
        if (rec[:, 0] != coarse).any() or (rec[:, 1] != fine).any():  # the labels validated on open
            raise self._changed(ix, rec)
        # An exact scaling: 1/256 is a power of two.
        x = rec[:, 2:].astype(dtype)
        x *= dtype.type(1.0 / 256.0)
        return Batch(x, coarse, _FINE_TO_LOCAL[fine])

    def _read_records(self, ix: npt.NDArray[np.int64]) -> npt.NDArray[np.uint8]:
        """The records ``ix`` in that order, (len(ix), 3074): one positional read per run of consecutive
        indices, straight into the array (a system call per record of a shuffled batch, so the loop is
        kept lean)."""
        out = np.empty((len(ix), RECORD_BYTES), dtype=np.uint8)
        view = out.data.cast("B")
        cuts = [0, *(np.flatnonzero(np.diff(ix) != 1) + 1).tolist(), len(ix)]
        runs = [view[a * RECORD_BYTES : b * RECORD_BYTES] for a, b in itertools.pairwise(cuts)]
        offsets = (ix[cuts[:-1]] * RECORD_BYTES).tolist()
        if _HAS_PREADV:
            got = sum(map(os.preadv, itertools.repeat(self._fd), ([r] for r in runs), offsets))
        else:
            got = 0
        if got != len(view):  # the end of the file (or no preadv): run by run, to say where
            for run, offset in zip(runs, offsets, strict=True):
                self._read_into(run, offset)
        return out

    def _read_run(self, start: int, count: int) -> npt.NDArray[np.uint8]:
        """``count`` records from record ``start`` on, (count, 3074)."""
        out = np.empty((count, RECORD_BYTES), dtype=np.uint8)
        self._read_into(out.data.cast("B"), start * RECORD_BYTES)
        return out

    def _read_into(self, view: memoryview, offset: int) -> None:
        """Fill ``view`` from byte ``offset``; a ``CifarFormatError`` if the file ends first."""
        done = 0
        while done < len(view):
            got = _pread_into(self._fd, view[done:], offset + done)
            if got == 0:
                raise self._truncated(offset + len(view))
            done += got

    def _truncated(self, needed: int) -> CifarFormatError:
        now = os.fstat(self._fd).st_size
        return CifarFormatError(
            f"{self.path}: the file changed after it was opened: {now:,} bytes now, "
            f"{self._n * RECORD_BYTES:,} expected ({self._n:,} records) and {needed:,} needed by this "
            "read; truncated or rewritten while open? Open it again"
        )

    def _changed(self, ix: npt.NDArray[np.int64], rec: npt.NDArray[np.uint8]) -> CifarFormatError:
        k = int(np.argmax((rec[:, 0] != self._coarse[ix]) | (rec[:, 1] != self._fine[ix])))
        i = int(ix[k])
        return CifarFormatError(
            f"{self.path}: the file changed after it was opened: record {i} has the labels "
            f"{rec[k, 0]}/{rec[k, 1]} (coarse/fine) now, {self._coarse[i]}/{self._fine[i]} when validated; "
            "rewritten while open? Open it again"
        )

    def batch_indices(
        self, batch_size: int, *, seed: int | None = 0, drop_last: bool = True, epochs: int | None = 1
    ) -> Iterator[tuple[int, npt.NDArray[np.int64]]]:
        """The plan of ``batches``: its coarse class and record indices, batch by batch, same arguments."""
        _check_batch_size(batch_size)
        if epochs is not None and not is_integer(epochs):
            raise TypeError(f"epochs must be None (forever) or an integer, got {epochs!r}")
        if epochs is not None and epochs < 0:
            raise ValueError(f"epochs must be None (forever) or at least 0, got {epochs}")
        if epochs is None and self.num_batches(batch_size, drop_last=drop_last) == 0:
            raise ValueError(f"no class has {batch_size} records: an endless stream would yield nothing")
        return self._plan(batch_size, seed, drop_last, epochs)

    def _plan(
        self, batch_size: int, seed: int | None, drop_last: bool, epochs: int | None
    ) -> Iterator[tuple[int, npt.NDArray[np.int64]]]:
        rng = np.random.default_rng(seed) if seed is not None else None
        epoch = 0
        while epochs is None or epoch < epochs:
            plan: list[tuple[int, npt.NDArray[np.int64]]] = []
            for c, members in enumerate(self._class_indices):
                ix = rng.permutation(members) if rng is not None else members
                stop = len(ix) - len(ix) % batch_size if drop_last else len(ix)
                plan.extend((c, ix[i : i + batch_size]) for i in range(0, stop, batch_size))
            order = rng.permutation(len(plan)) if rng is not None else range(len(plan))
            for k in order:
                yield plan[k]
            epoch += 1

    def batches(
        self,
        batch_size: int,
        *,
        seed: int | None = 0,
        dtype: npt.DTypeLike = np.float32,
        drop_last: bool = True,
        epochs: int | None = 1,
    ) -> Iterator[Batch]:
        """Batches of up to ``batch_size`` samples sharing one coarse class, for ``epochs`` passes.

        One ``np.random.default_rng(seed)`` shuffles every pass: the samples within each class, then
        the order of all batches across classes; ``seed=None`` keeps file order, classes in turn. The
        last short batch of each class is dropped unless ``drop_last=False``. ``epochs=None`` repeats
        forever. Pixels are ``dtype`` (a float type).
        """
        dt = _float_dtype(dtype)
        plan = self.batch_indices(batch_size, seed=seed, drop_last=drop_last, epochs=epochs)
        return (self._gather(ix, c, dt) for c, ix in plan)


def _reopen(path: Path, origin: StrPath | None) -> Cifar100:
    return Cifar100(path, origin=origin)


def _pread_into(fd: int, view: memoryview, offset: int) -> int:
    """Read into ``view`` from byte ``offset`` of ``fd``, not moving its position (batches may be read
    from several threads); the number of bytes read, short only at the end of the file."""
    if _HAS_PREADV:
        return os.preadv(fd, [view], offset)
    data = os.pread(fd, len(view), offset)  # macOS before 11: a copy more
    view[: len(data)] = data
    return len(data)


def _check_batch_size(batch_size: int) -> None:
    if not is_integer(batch_size):
        raise TypeError(f"batch_size must be an integer, got {batch_size!r}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")


def _check_split(split: str) -> None:
    """A split's name is part of a file name: only the release's two are allowed."""
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")


def _float_dtype(dtype: npt.DTypeLike) -> np.dtype[Any]:
    dt = np.dtype(dtype)
    if dt.kind != "f":
        raise TypeError(f"batches hold floating-point pixels; dtype must be a float type, got {dt}")
    return dt


def _validate_labels(path: Path, coarse: npt.NDArray[np.uint8], fine: npt.NDArray[np.uint8]) -> None:
    """Raise CifarFormatError naming ``path``, the first bad record and its values, if any label is bad."""
    bad_coarse = coarse >= N_COARSE
    bad_fine = fine >= N_FINE
    expected = _FINE_TO_COARSE[np.minimum(fine, N_FINE - 1)]
    mismatch = ~bad_coarse & ~bad_fine & (expected != coarse)
    bad = bad_coarse | bad_fine | mismatch
    if not bad.any():
        return
    i = int(np.argmax(bad))
    c, f = int(coarse[i]), int(fine[i])
    problems = []
    if bad_coarse[i]:
        problems.append(f"coarse label {c} is out of range 0..{N_COARSE - 1}")
    if bad_fine[i]:
        problems.append(f"fine label {f} is out of range 0..{N_FINE - 1}")
    if mismatch[i]:
        problems.append(
            f"fine label {f} belongs to coarse class {FINE_TO_COARSE[f]}, not to coarse label {c}"
        )
    more = int(bad.sum()) - 1
    tail = f" ({more:,} more bad record{'s follow' if more > 1 else ' follows'})" if more else ""
    raise CifarFormatError(
        f"{path}: record {i} (byte offset {i * RECORD_BYTES:,}): {'; '.join(problems)}{tail}"
    )


def default_cache_dir() -> Path:
    """The cache root: ``$MONADL_CACHE_DIR``, else ``$XDG_CACHE_HOME/monadl``, else ``~/.cache/monadl``."""
    env = os.environ.get("MONADL_CACHE_DIR")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "monadl"


# ---------------------------------------------------------------------------------------------------
# The official archive


def _safe_member_name(archive: Path, name: str) -> None:
    p = PurePosixPath(name.replace("\\", "/"))
    if p.is_absolute() or ".." in p.parts or (p.parts and ":" in p.parts[0]):
        raise CifarFormatError(
            f"{archive}: member {name!r} would be extracted outside the target directory "
            "(absolute path or '..'); refusing to extract from this archive"
        )


def extract_cifar100(archive: StrPath, cache_dir: StrPath | None = None) -> dict[str, Path]:
    """Extract the ``.bin`` members of a CIFAR-100 binary archive; return them by file name.

    They go under ``cache_dir`` (default: the archive's directory) with their paths in the archive, as
    ``tar xzf`` would put them; they are reused while the archive is the one they came from (its size
    and modification time, in a stamp beside them). Extraction uses tarfile's 'data' filter, each file
    lands atomically, and an archive with a member that would escape the directory (absolute path,
    '..', a link), or whose compressed data fails its checksum, is refused with ``CifarFormatError``.
    """
    archive = Path(archive)
    dest = Path(cache_dir) if cache_dir is not None else archive.parent
    check_path(archive)  # a FIFO or a device is refused by name, not opened
    try:
        with tarfile.open(archive, "r:*") as tar:
            members = tar.getmembers()
            # gzip, bz2 and xz check their checksum only at the end of the stream, and tarfile stops
            # reading at the tar's end-of-archive block: without this, a corrupt byte in a member's
            # pixels would be extracted silently (only the labels are validated).
            while tar.fileobj is not None and tar.fileobj.read(1 << 20):
                pass
            for m in members:
                _safe_member_name(archive, m.name)
            bins = [m for m in members if PurePosixPath(m.name).name.endswith(".bin")]
            seen: dict[str, str] = {}
            for m in bins:
                base = PurePosixPath(m.name).name
                if not m.isfile():
                    raise CifarFormatError(f"{archive}: member {m.name!r} is not a regular file")
                if base in seen:
                    raise CifarFormatError(
                        f"{archive}: members {seen[base]!r} and {m.name!r} share a file name"
                    )
                seen[base] = m.name
            dest.mkdir(parents=True, exist_ok=True)
            stamp_path = dest / f".{archive.name}.extracted.json"
            stamp = _stamp(archive, bins)
            fresh = _json_or_none(stamp_path) == stamp and all(
                (dest / m.name).is_file() and (dest / m.name).stat().st_size == m.size for m in bins
            )
            out: dict[str, Path] = {}
            for m in bins:
                target = dest / m.name
                if not fresh:
                    _extract_member(archive, tar, m, dest, target)
                out[PurePosixPath(m.name).name] = target
            if not fresh:
                atomic_write_bytes(stamp_path, json.dumps(stamp).encode())
            return out
    except (
        tarfile.ReadError,
        tarfile.CompressionError,
        tarfile.HeaderError,
        EOFError,
        zlib.error,
        lzma.LZMAError,
        BadGzipFile,
    ) as e:
        raise CifarFormatError(f"{archive}: not a readable tar archive ({type(e).__name__}: {e})") from e
    except OSError as e:  # bz2's corrupt data ("Invalid data stream"), or the archive unreadable
        if isinstance(e, FileNotFoundError | PermissionError):
            raise
        raise CifarFormatError(f"{archive}: not a readable tar archive ({type(e).__name__}: {e})") from e


def _stamp(archive: Path, bins: list[tarfile.TarInfo]) -> dict[str, Any]:
    """What identifies an extraction: the archive (its path, size and modification time) and its
    members' sizes."""
    st = archive.stat()
    return {
        "archive": str(archive.resolve()),
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        "members": {m.name: m.size for m in bins},
    }


def _json_or_none(path: Path) -> Any:
    """The JSON value in ``path``, or None if there is no such file or it cannot be read (a stamp or
    a description to write anew, then)."""
    try:
        return json.loads(read_regular_file(path))
    except (OSError, ValueError, RecursionError):
        return None


def _extract_member(
    archive: Path, tar: tarfile.TarFile, m: tarfile.TarInfo, dest: Path, target: Path
) -> None:
    # Named as a temporary of this process, so that the next extraction removes it if this one is
    # killed (it would hold a copy of the member: 150 MB for train.bin).
    with temporary_directory(dest, "extract") as tmp:
        try:
            tar.extract(m, tmp, filter="data")
        except tarfile.FilterError as e:
            raise CifarFormatError(f"{archive}: member {m.name!r} refused by the 'data' filter: {e}") from e
        sync_file(tmp / m.name)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(tmp / m.name, target)
        sync_directory(target.parent)


# ---------------------------------------------------------------------------------------------------
# Synthetic data


def write_synthetic_cifar100(
    directory: StrPath | None = None,
    *,
    per_fine_class: int = 50,
    test_per_fine_class: int = _TEST_PER_FINE_CLASS,
    seed: int = 0,
    noise: float = _NOISE,
) -> Path:
    """Write a learnable synthetic CIFAR-100 in the official binary format; return its directory.

    Each fine class has a mean image (its coarse class's mean plus a fine offset, from ``seed``); a
    sample is its class mean plus Gaussian noise of std ``noise``, rounded and clipped to 0..255.
    ``train.bin`` holds ``per_fine_class`` samples of each of the 100 fine classes in shuffled order,
    ``test.bin`` ``test_per_fine_class`` (none when 0), with a ``synthetic.json`` describing them.
    Default directory: ``default_cache_dir()/synthetic/<parameters>``. Files already there with the
    same parameters are reused; new ones are written to a temporary file and renamed into place.
    """
    if per_fine_class < 1 or test_per_fine_class < 0:
        raise ValueError("per_fine_class must be at least 1 and test_per_fine_class at least 0")
    if not np.isfinite(noise) or noise < 0:
        raise ValueError(f"noise must be a finite non-negative float, got {noise}")
    if directory is None:
        directory = _synthetic_dir(default_cache_dir(), seed, per_fine_class, test_per_fine_class, noise)
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    sizes: dict[str, int] = {"train": per_fine_class}
    if test_per_fine_class:
        sizes["test"] = test_per_fine_class
    meta = {
        "format": _SIDECAR_FORMAT,
        "version": _SYNTHETIC_VERSION,
        "seed": seed,
        "noise": float(noise),
        "per_fine_class": sizes,
    }
    old = _our_sidecar(out / _SIDECAR)
    if old == meta and _splits_written(out, sizes):  # reused
        return out
    if old is None:  # never overwrite data that this generator did not write (the real set, say)
        foreign = [name for name in ("train.bin", "test.bin") if (out / name).exists()]
        if foreign:
            raise FileExistsError(
                f"{out}: {' and '.join(foreign)} {'were' if len(foreign) > 1 else 'was'} not written by "
                f"monadl's synthetic generator (no "
                f"{_SIDECAR} of its own): refusing to overwrite {'them' if len(foreign) > 1 else 'it'}; "
                "choose another directory"
            )
    means_rng, *split_rngs = np.random.default_rng(seed).spawn(3)
    coarse_means = means_rng.uniform(64.0, 192.0, size=(N_COARSE, IMAGE_BYTES))
    fine_offsets = means_rng.normal(0.0, 32.0, size=(N_FINE, IMAGE_BYTES))
    fine_means = (coarse_means[_FINE_TO_COARSE] + fine_offsets).astype(np.float32)
    # Until every split is written, the description says so: files of an interrupted write are
    # neither taken for the real set nor for the finished synthetic one.
    atomic_write_bytes(out / _SIDECAR, (json.dumps({**meta, "complete": False}, indent=2) + "\n").encode())
    listed = old.get("per_fine_class") if old is not None else None
    for split in listed if isinstance(listed, dict) else ():
        if split not in sizes and split in ("train", "test"):  # a split this set no longer has
            (out / f"{split}.bin").unlink(missing_ok=True)
    for (split, per), rng in zip(sizes.items(), split_rngs, strict=False):
        _write_split(out / f"{split}.bin", fine_means, per, noise, rng)
    atomic_write_bytes(out / _SIDECAR, (json.dumps(meta, indent=2) + "\n").encode())
    return out


def _our_sidecar(path: Path) -> dict[str, Any] | None:
    """The synthetic-data description at ``path`` if it is one of ours (a JSON object of our
    format), else None."""
    meta = _json_or_none(path)
    return meta if isinstance(meta, dict) and meta.get("format") == _SIDECAR_FORMAT else None


def _synthetic_dir(
    root: Path, seed: int, per_fine_class: int, test_per_fine_class: int, noise: float
) -> Path:
    return root / "synthetic" / f"seed{seed}-train{per_fine_class}-test{test_per_fine_class}-noise{noise:g}"


def _splits_written(out: Path, sizes: dict[str, int]) -> bool:
    """Whether every split's file is there with its size."""
    try:
        return all(
            (out / f"{s}.bin").stat().st_size == per * N_FINE * RECORD_BYTES for s, per in sizes.items()
        )
    except OSError:
        return False


def _write_split(
    path: Path, fine_means: npt.NDArray[np.float32], per: int, noise: float, rng: np.random.Generator
) -> None:
    labels = rng.permutation(np.repeat(np.arange(N_FINE, dtype=np.int64), per))
    chunk = 1024
    with atomic_file(path) as f:
        for start in range(0, len(labels), chunk):
            lab = labels[start : start + chunk]
            rec = np.empty((len(lab), RECORD_BYTES), dtype=np.uint8)
            rec[:, 0] = _FINE_TO_COARSE[lab]
            rec[:, 1] = lab
            pix = rng.standard_normal(size=(len(lab), IMAGE_BYTES), dtype=np.float32)
            pix *= np.float32(noise)
            pix += fine_means[lab]
            rec[:, 2:] = np.clip(np.rint(pix), 0, 255)
            f.write(rec.tobytes())


def _read_sidecar(path: Path, records: int) -> _SyntheticInfo | None:
    """The synthetic-data description of ``path`` (of ``records`` records), from a ``synthetic.json``
    beside it, if there is one of ours.

    A description of ours is checked whole, and against the files it describes: malformed, of
    another version, unfinished or not matching a file's record count, it is a ``CifarFormatError``
    naming it and the field, so that synthetic data is never described as the real set, nor with
    wrong counts. A file of that name in another format is refused too: ignored, it would let
    synthetic data whose description was damaged pass as the real set."""
    sidecar = path.parent / _SIDECAR
    if not os.path.lexists(sidecar):
        return None
    try:
        meta = json.loads(read_regular_file(sidecar))
    except (ValueError, RecursionError) as e:
        raise CifarFormatError(f"{sidecar}: malformed synthetic-data description ({e!r})") from e
    if not isinstance(meta, dict) or meta.get("format") != _SIDECAR_FORMAT:
        found = meta.get("format") if isinstance(meta, dict) else type(meta).__name__
        raise CifarFormatError(
            f"{sidecar}: not a description of monadl's synthetic data (format {found!r}, not "
            f"{_SIDECAR_FORMAT!r}): refused rather than taking the data beside it for the real "
            "CIFAR-100 (remove the file if it is)"
        )
    seed, noise, sizes = _sidecar_fields(sidecar, meta)
    if path.name not in ("train.bin", "test.bin"):
        return None  # a file it does not describe
    split = path.name.removesuffix(".bin")
    if split not in sizes:
        raise CifarFormatError(
            f"{sidecar}: the synthetic-data description does not match the files: per_fine_class has "
            f"no {split!r}, yet {path.name} is here (not written by the generator that wrote it)"
        )
    for s, per in sizes.items():
        _check_split_size(sidecar, path.parent / f"{s}.bin", s, per, records if s == split else None)
    return _SyntheticInfo(seed=seed, noise=noise, per_fine_class=sizes[split])


def _sidecar_fields(sidecar: Path, meta: dict[str, Any]) -> tuple[int, float, dict[str, int]]:
    """The seed, noise and counts of a description of our format, each checked (``complete`` first:
    an interrupted write is named as such)."""

    def bad(field: str, problem: str) -> CifarFormatError:
        return CifarFormatError(f"{sidecar}: malformed synthetic-data description: {field} {problem}")

    complete = meta.get("complete", True)
    if type(complete) is not bool:
        raise bad("complete", f"{complete!r} is not true or false")
    if not complete:
        raise CifarFormatError(
            f"{sidecar}: the synthetic data here was not finished being written (interrupted?); "
            "write it again (write_synthetic_cifar100) or delete the directory"
        )
    for field in ("version", "seed", "noise", "per_fine_class"):
        if field not in meta:
            raise bad(field, "is missing")
    version, seed, noise, sizes = meta["version"], meta["seed"], meta["noise"], meta["per_fine_class"]
    if type(version) is not int or version != _SYNTHETIC_VERSION:
        raise bad("version", f"{version!r} is not {_SYNTHETIC_VERSION}, the only version this monadl reads")
    if type(seed) is not int or seed < 0:  # np.random.default_rng takes no other
        raise bad("seed", f"{seed!r} is not a non-negative integer")
    if type(noise) not in (int, float) or not 0 <= noise <= sys.float_info.max:  # NaN, inf, 10**400: not
        raise bad("noise", f"{noise!r} is not a finite non-negative number")
    if not isinstance(sizes, dict) or "train" not in sizes:
        raise bad("per_fine_class", f"{sizes!r} is not an object with a count for 'train' (and 'test')")
    for split, per in sizes.items():
        if split not in ("train", "test"):
            raise bad("per_fine_class", f"has the split {split!r}; there are only 'train' and 'test'")
        if type(per) is not int or per < 1:
            raise bad(f"per_fine_class.{split}", f"{per!r} is not a positive integer")
    return seed, float(noise), sizes


def _check_split_size(sidecar: Path, file: Path, split: str, per: int, records: int | None) -> None:
    """A ``CifarFormatError`` unless ``file`` (of ``records`` records, or as big as it is; a split
    missing is not checked) holds the ``N_FINE * per`` records the description says."""
    if records is None:
        if not file.is_file():
            return
        size = file.stat().st_size
        records = size // RECORD_BYTES if size % RECORD_BYTES == 0 else -1
        held = f"{records:,} records" if records >= 0 else f"{size:,} bytes, not a whole number of records"
    else:
        held = f"{records:,} records"
    if records != N_FINE * per:
        raise CifarFormatError(
            f"{sidecar}: the synthetic-data description does not match the files: per_fine_class.{split} "
            f"is {per} ({N_FINE * per:,} records, {per} per fine class), but {file.name} holds {held}"
        )


def synthetic_cifar100(
    directory: StrPath | None = None,
    *,
    split: Split = "train",
    per_fine_class: int = 50,
    test_per_fine_class: int = _TEST_PER_FINE_CLASS,
    seed: int = 0,
    noise: float = _NOISE,
) -> Cifar100:
    """Write (or reuse) the synthetic data set, see ``write_synthetic_cifar100``, and open ``split``."""
    _check_split(split)
    if split == "test" and test_per_fine_class == 0:
        raise ValueError("split='test' needs test_per_fine_class > 0")
    out = write_synthetic_cifar100(
        directory,
        per_fine_class=per_fine_class,
        test_per_fine_class=test_per_fine_class,
        seed=seed,
        noise=noise,
    )
    return Cifar100(out / f"{split}.bin")


# ---------------------------------------------------------------------------------------------------
# Entry point


def open_dataset(
    path: StrPath | None = None,
    *,
    split: Split = "train",
    cache_dir: StrPath | None = None,
    per_fine_class: int = 50,
    seed: int = 0,
) -> Cifar100:
    """Open CIFAR-100 from ``path``, or the synthetic data set when ``path`` is None.

    ``path`` may be a ``.bin`` file, a ``.tar.gz`` archive (extracted into ``cache_dir``, default beside
    it) or a directory holding ``{split}.bin``, ``cifar-100-binary/{split}.bin`` or the archive. With
    no path, the synthetic data set of ``per_fine_class`` train samples per fine class and ``seed`` is
    written under ``cache_dir`` (default ``default_cache_dir()``) and opened.
    """
    _check_split(split)
    if path is None:
        root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        directory = _synthetic_dir(root, seed, per_fine_class, _TEST_PER_FINE_CLASS, _NOISE)
        return synthetic_cifar100(directory, split=split, per_fine_class=per_fine_class, seed=seed)
    p = Path(path)
    # By stat alone: a FIFO, a device or a broken link is named as such (and a FIFO is not opened).
    if stat.S_ISDIR(check_path(p, directory_ok=True).st_mode):
        p = _find_in_directory(p, split)
    if p.suffix == ".bin":
        return Cifar100(p)
    files = extract_cifar100(p, cache_dir)
    name = f"{split}.bin"
    if name not in files:
        found = ", ".join(sorted(files)) or "none"
        raise CifarFormatError(f"{p}: the archive has no member named {name} (its .bin members: {found})")
    return Cifar100(files[name], origin=p)


def _find_in_directory(directory: Path, split: Split) -> Path:
    """The first of ``{split}.bin``, ``cifar-100-binary/{split}.bin`` and the archive in ``directory``
    that is there: anything of that name, so that one that cannot be read (a FIFO, a broken link, a
    directory) is refused by what it is rather than taken for missing."""
    name = f"{split}.bin"
    for candidate in (directory / name, directory / "cifar-100-binary" / name, directory / _ARCHIVE_NAME):
        if os.path.lexists(candidate):
            return candidate
    raise FileNotFoundError(
        f"{directory}: found neither {name}, cifar-100-binary/{name} nor {_ARCHIVE_NAME} in this directory"
    )
