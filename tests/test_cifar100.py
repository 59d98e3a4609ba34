"""Tests of monadl.data.cifar100: the binary reader and its validation, archives, batching by coarse
class and the synthetic generator. Every file is small and written under pytest's tmp_path.
"""

from __future__ import annotations

import gzip
import io
import itertools
import json
import os
import tarfile
from collections import Counter
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from monadl.data import (
    COARSE_TO_FINE,
    FINE_TO_COARSE,
    FINE_TO_LOCAL,
    IMAGE_BYTES,
    RECORD_BYTES,
    Batch,
    Cifar100,
    CifarFormatError,
    default_cache_dir,
    extract_cifar100,
    open_cifar100,
    synthetic_cifar100,
    write_synthetic_cifar100,
)

OFFICIAL_FINE_TO_COARSE = [
    4, 1, 14, 8, 0, 6, 7, 7, 18, 3, 3, 14, 9, 18, 7, 11, 3, 9, 7, 11, 6, 11, 5, 10, 7, 6, 13, 15, 3, 15,
    0, 11, 1, 10, 12, 14, 16, 9, 11, 5, 5, 19, 8, 8, 15, 13, 14, 17, 18, 10, 16, 4, 17, 4, 2, 0, 17, 4, 18,
    17, 10, 3, 2, 12, 12, 16, 12, 1, 9, 19, 2, 10, 0, 1, 16, 12, 9, 13, 15, 13, 16, 19, 2, 4, 6, 19, 5, 5,
    8, 19, 18, 1, 2, 15, 6, 0, 17, 8, 14, 13,
]  # fmt: skip


def write_records(path: Path, coarse: list[int], fine: list[int], seed: int = 0) -> npt.NDArray[np.uint8]:
    """Write records with the given labels and random pixels; return the raw (n, 3074) bytes."""
    rng = np.random.default_rng(seed)
    rec = rng.integers(0, 256, size=(len(coarse), RECORD_BYTES), dtype=np.uint8)
    rec[:, 0] = coarse
    rec[:, 1] = fine
    path.write_bytes(rec.tobytes())
    return rec


def valid_labels(n: int) -> tuple[list[int], list[int]]:
    fine = [i % 100 for i in range(n)]
    return [FINE_TO_COARSE[f] for f in fine], fine


@pytest.fixture(scope="module")
def synth_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # 7 per fine class: 35 per coarse class, so batches of 8 leave a short batch of 3 in every class.
    return write_synthetic_cifar100(tmp_path_factory.mktemp("synth"), per_fine_class=7, test_per_fine_class=2)


@pytest.fixture(scope="module")
def synth(synth_dir: Path) -> Cifar100:
    return Cifar100(synth_dir / "train.bin")


# --- the label mapping ---------------------------------------------------------------------------------


def test_mapping_is_the_official_one_with_five_fine_classes_per_coarse_class() -> None:
    assert list(FINE_TO_COARSE) == OFFICIAL_FINE_TO_COARSE
    assert Counter(FINE_TO_COARSE) == {c: 5 for c in range(20)}
    for c, fines in enumerate(COARSE_TO_FINE):
        assert len(fines) == 5 and list(fines) == sorted(fines)
        assert all(FINE_TO_COARSE[f] == c for f in fines)
        assert [FINE_TO_LOCAL[f] for f in fines] == [0, 1, 2, 3, 4]
    # Two spot checks from the official names: fine 4 (beaver) and 30 (dolphin) -> aquatic mammals (0),
    # local labels by rank among {4, 30, 55, 72, 95}.
    assert COARSE_TO_FINE[0] == (4, 30, 55, 72, 95)
    assert FINE_TO_LOCAL[30] == 1 and FINE_TO_LOCAL[95] == 4


# --- synthetic generator and reader ---------------------------------------------------------------------


def test_synthetic_round_trip(synth_dir: Path, synth: Cifar100) -> None:
    assert len(synth) == 700
    assert (synth_dir / "train.bin").stat().st_size == 700 * RECORD_BYTES
    assert np.array_equal(synth.class_counts(), np.full(20, 35))
    assert np.array_equal(np.bincount(synth.fine_labels, minlength=100), np.full(100, 7))
    assert np.array_equal(np.asarray(FINE_TO_COARSE)[synth.fine_labels], synth.coarse_labels)
    raw = np.frombuffer((synth_dir / "train.bin").read_bytes(), dtype=np.uint8).reshape(-1, RECORD_BYTES)
    assert np.array_equal(synth.pixels, raw[:, 2:])
    assert np.array_equal(synth.records, raw) and not isinstance(synth.records, np.memmap)  # a copy, read
    test = Cifar100(synth_dir / "test.bin")
    assert len(test) == 200
    assert "synthetic CIFAR-100 train.bin (700 records, seed 0" in synth.describe()
    assert str(synth_dir / "train.bin") in synth.source and synth.is_synthetic


def test_synthetic_is_deterministic_reused_and_learnable(tmp_path: Path, synth_dir: Path) -> None:
    again = write_synthetic_cifar100(tmp_path / "a", per_fine_class=7, test_per_fine_class=2)
    assert (again / "train.bin").read_bytes() == (synth_dir / "train.bin").read_bytes()
    mtime = (again / "train.bin").stat().st_mtime_ns
    write_synthetic_cifar100(tmp_path / "a", per_fine_class=7, test_per_fine_class=2)
    assert (again / "train.bin").stat().st_mtime_ns == mtime  # reused, not rewritten
    other = write_synthetic_cifar100(tmp_path / "b", per_fine_class=7, test_per_fine_class=0, seed=1)
    assert (other / "train.bin").read_bytes() != (synth_dir / "train.bin").read_bytes()
    assert not (other / "test.bin").exists()
    assert not [p for p in again.iterdir() if p.name.endswith(".tmp")]
    # Learnable: nearest class mean of the train split classifies the test split well.
    train, test = Cifar100(again / "train.bin"), Cifar100(again / "test.bin")
    x = train.pixels.astype(np.float64)
    means = np.stack([x[train.fine_labels == f].mean(axis=0) for f in range(100)])
    xt = test.pixels.astype(np.float64)
    d = (means**2).sum(axis=1)[None, :] - 2 * xt @ means.T  # squared distance, less a per-row constant
    assert (d.argmin(axis=1) == test.fine_labels).mean() > 0.9


def test_load_without_path_writes_synthetic_into_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MONADL_CACHE_DIR", str(tmp_path / "cache"))
    assert default_cache_dir() == tmp_path / "cache"
    ds = open_cifar100(per_fine_class=2)
    assert ds.path.is_relative_to(tmp_path / "cache")
    assert len(ds) == 200 and ds.describe().startswith("synthetic CIFAR-100 train.bin (200 records, seed 0")
    explicit = open_cifar100(None, split="test", cache_dir=tmp_path / "c2", per_fine_class=2, seed=3)
    assert explicit.path.is_relative_to(tmp_path / "c2") and "seed 3" in explicit.source
    assert len(explicit) == 1000
    with pytest.raises(ValueError, match="test_per_fine_class"):
        synthetic_cifar100(tmp_path / "d", split="test", per_fine_class=1, test_per_fine_class=0)


def test_plain_bin_describes_itself_and_load_finds_it_in_a_directory(tmp_path: Path) -> None:
    (tmp_path / "cifar-100-binary").mkdir()
    path = tmp_path / "cifar-100-binary" / "test.bin"
    write_records(path, *valid_labels(30))
    ds = open_cifar100(tmp_path, split="test")
    assert ds.path == path
    assert ds.describe() == f"CIFAR-100 test.bin (30 records) at {path}" and not ds.is_synthetic
    assert open_cifar100(path).path == path
    with pytest.raises(FileNotFoundError, match=r"train\.bin"):
        open_cifar100(tmp_path)
    with pytest.raises(FileNotFoundError, match="nope"):
        open_cifar100(tmp_path / "nope.bin")


# --- batching -----------------------------------------------------------------------------------------


def test_batches_share_a_coarse_class_and_match_the_raw_bytes(synth_dir: Path, synth: Cifar100) -> None:
    raw = np.frombuffer((synth_dir / "train.bin").read_bytes(), dtype=np.uint8).reshape(-1, RECORD_BYTES)
    batches = list(synth.batches(8, seed=0))
    plan = list(synth.batch_indices(8, seed=0))
    assert len(batches) == len(plan) == synth.num_batches(8) == 20 * 4
    for b, (c, ix) in zip(batches, plan, strict=True):
        assert isinstance(b, Batch) and b.coarse == c
        x, coarse, fine_local = b  # unpacks as the column model takes it
        assert x.shape == (8, IMAGE_BYTES) and x.dtype == np.float32
        assert fine_local.shape == (8,) and fine_local.dtype == np.int64
        assert np.all(raw[ix, 0] == coarse)
        assert np.array_equal(b.fine, raw[ix, 1])
        assert np.all((fine_local >= 0) & (fine_local < 5))
        assert [COARSE_TO_FINE[coarse][k] for k in fine_local] == raw[ix, 1].tolist()
        assert np.all((x >= 0) & (x < 1))
        assert np.array_equal(x, raw[ix, 2:] / np.float32(256))
    seen = np.concatenate([ix for _, ix in plan])
    assert len(np.unique(seen)) == len(seen)  # each record at most once per pass
    b64 = next(synth.batches(8, seed=0, dtype=np.float64))
    assert b64.x.dtype == np.float64 and np.array_equal(b64.x, batches[0].x.astype(np.float64))
    with pytest.raises(TypeError, match="float"):
        synth.batches(8, dtype=np.int32)
    with pytest.raises(ValueError, match="batch_size"):
        synth.batches(0)


def test_shuffling_is_deterministic_under_a_seed(synth: Cifar100) -> None:
    def order(seed: int | None) -> list[tuple[int, list[int]]]:
        return [(c, ix.tolist()) for c, ix in synth.batch_indices(8, seed=seed)]

    assert order(0) == order(0)
    assert order(1) == order(1)
    assert order(0) != order(1)
    assert [c for c, _ in order(0)] != sorted(c for c, _ in order(0))  # classes interleaved
    assert [ix for _, ix in order(0)] != [sorted(ix) for _, ix in order(0)]  # samples shuffled
    unshuffled = order(None)
    assert [c for c, _ in unshuffled] == sorted(c for c, _ in unshuffled)
    assert all(ix == sorted(ix) for _, ix in unshuffled)
    xs0 = [b.x for b in synth.batches(8, seed=0)]
    assert all(np.array_equal(a, b.x) for a, b in zip(xs0, synth.batches(8, seed=0), strict=True))


def test_epochs_reshuffle_and_none_repeats_forever(synth: Cifar100) -> None:
    two = [(c, ix.tolist()) for c, ix in synth.batch_indices(8, seed=5, epochs=2)]
    assert len(two) == 160
    assert two[:80] == [(c, ix.tolist()) for c, ix in synth.batch_indices(8, seed=5)]
    assert two[80:] != two[:80]
    assert sorted(map(str, two[80:])) != sorted(map(str, two[:80]))  # new batches, not just a new order
    forever = synth.batch_indices(8, seed=5, epochs=None)
    assert [(c, ix.tolist()) for c, ix in itertools.islice(forever, 160)] == two
    assert len(list(itertools.islice(forever, 1000))) == 1000  # and on
    assert len(list(synth.batches(8, epochs=0))) == 0
    with pytest.raises(ValueError, match="endless"):
        synth.batches(36, epochs=None)


def test_keep_or_drop_the_last_short_batch(synth: Cifar100) -> None:
    dropped = list(synth.batches(8, seed=2))
    kept = list(synth.batches(8, seed=2, drop_last=False))
    assert len(dropped) == 80 and all(len(b.fine_local) == 8 for b in dropped)
    assert len(kept) == synth.num_batches(8, drop_last=False) == 100
    assert Counter(len(b.fine_local) for b in kept) == {8: 80, 3: 20}
    kept_ix = [ix for _, ix in synth.batch_indices(8, seed=2, drop_last=False)]
    assert len(np.unique(np.concatenate(kept_ix))) == len(synth)  # all records once
    assert synth.num_batches(35) == 20 and synth.num_batches(36) == 0
    assert synth.num_batches(36, drop_last=False) == 20


def test_batch_of_given_indices(synth: Cifar100) -> None:
    ix = np.flatnonzero(synth.coarse_labels == 3)[:4]
    b = synth.batch(ix)
    assert b.coarse == 3 and np.array_equal(b.fine, synth.fine_labels[ix])
    mixed = [int(np.flatnonzero(synth.coarse_labels == c)[0]) for c in (1, 2)]
    with pytest.raises(ValueError, match="share one coarse class"):
        synth.batch(mixed)
    assert np.array_equal(synth.batch(np.asarray(ix, dtype=np.uint16)).x, b.x)  # any integer type
    for wrong in ([float(ix[0])], [True], np.asarray(ix, dtype=np.float64)):
        with pytest.raises(TypeError, match="record indices must be integers"):
            synth.batch(wrong)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"batch_size": 16.5}, TypeError, "batch_size must be an integer, got 16.5"),
        ({"batch_size": True}, TypeError, "batch_size must be an integer"),
        (
            {"batch_size": 16, "epochs": 1.5},
            TypeError,
            "epochs must be None .forever. or an integer, got 1.5",
        ),
        ({"batch_size": 16, "epochs": -1}, ValueError, "at least 0, got -1"),
    ],
)
def test_counts_of_the_wrong_type_are_named(
    synth: Cifar100, kwargs: dict[str, object], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        synth.batches(**kwargs)  # type: ignore[arg-type]
    eight, one = np.int64(8), np.int64(1)  # NumPy integers are counts too (typed int, accepted as such)
    assert len(list(synth.batches(eight, epochs=one))) == 80  # type: ignore[arg-type]


@pytest.mark.parametrize("split", ["../escaped", "valid", ""])
def test_a_split_other_than_train_or_test_is_refused(tmp_path: Path, split: str) -> None:
    with pytest.raises(ValueError, match="split must be 'train' or 'test'"):
        open_cifar100(None, split=split, cache_dir=tmp_path)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="split must be 'train' or 'test'"):
        synthetic_cifar100(tmp_path / "s", split=split)  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []  # refused before anything was written


def test_a_directory_given_as_the_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(IsADirectoryError, match="a directory, not a CIFAR-100 binary file"):
        Cifar100(tmp_path)


# --- validation -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("size", [0, RECORD_BYTES - 1, 3 * RECORD_BYTES + 100])
def test_size_not_a_positive_multiple_of_the_record(tmp_path: Path, size: int) -> None:
    path = tmp_path / "train.bin"
    path.write_bytes(bytes(size))
    with pytest.raises(CifarFormatError) as e:
        Cifar100(path)
    assert str(path) in str(e.value) and f"size {size:,} bytes" in str(e.value)


@pytest.mark.parametrize(
    ("coarse", "fine", "expected"),
    [
        (25, 4, "coarse label 25 is out of range 0..19"),
        (4, 150, "fine label 150 is out of range 0..99"),
        (3, 4, "fine label 4 belongs to coarse class 0, not to coarse label 3"),
    ],
)
def test_bad_labels_name_the_file_and_the_first_bad_record(
    tmp_path: Path, coarse: int, fine: int, expected: str
) -> None:
    c, f = valid_labels(12)
    c[7], f[7] = coarse, fine
    c[9], f[9] = coarse, fine
    path = tmp_path / "train.bin"
    write_records(path, c, f)
    with pytest.raises(CifarFormatError) as e:
        Cifar100(path)
    msg = str(e.value)
    assert msg.startswith(f"{path}: record 7 ")
    assert expected in msg and "(1 more bad record follows)" in msg


def test_malformed_synthetic_description_is_named(tmp_path: Path) -> None:
    write_records(tmp_path / "train.bin", *valid_labels(3))
    sidecar = tmp_path / "synthetic.json"
    sidecar.write_text('{"format": "monadl synthetic CIFAR-100", "per_fine_class": {"train": 1}}')
    with pytest.raises(CifarFormatError, match="malformed") as e:
        Cifar100(tmp_path / "train.bin")
    assert str(sidecar) in str(e.value)
    sidecar.write_text('{"format": "something else"}')  # not ours: refused, never taken for the real set
    with pytest.raises(CifarFormatError, match="not a description of monadl's synthetic data"):
        Cifar100(tmp_path / "train.bin")


# --- archives -------------------------------------------------------------------------------------------


def make_archive(path: Path, members: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_archive_extracts_into_the_cache_dir_or_beside_it(tmp_path: Path, synth_dir: Path) -> None:
    train = (synth_dir / "train.bin").read_bytes()
    test = (synth_dir / "test.bin").read_bytes()
    archive = make_archive(
        tmp_path / "cifar-100-binary.tar.gz",
        {
            "cifar-100-binary/train.bin": train,
            "cifar-100-binary/test.bin": test,
            "cifar-100-binary/a.txt": b"x",
        },
    )
    ds = open_cifar100(archive, split="test", cache_dir=tmp_path / "cache")
    assert ds.path == tmp_path / "cache" / "cifar-100-binary" / "test.bin" and len(ds) == 200
    assert ds.describe() == f"CIFAR-100 test.bin (200 records) from {archive} at {ds.path}"
    assert not (tmp_path / "cache" / "cifar-100-binary" / "a.txt").exists()  # only .bin members
    files = extract_cifar100(archive)
    assert files == {"train.bin": tmp_path / "cifar-100-binary" / "train.bin", "test.bin": files["test.bin"]}
    assert files["train.bin"].read_bytes() == train
    assert len(open_cifar100(tmp_path)) == 700  # the extracted directory, beside the archive
    leftovers = [p for p in (tmp_path / "cache").iterdir() if p.name.startswith(".extract-")]
    assert not leftovers


@pytest.mark.parametrize("name", ["../evil.bin", "/tmp/evil.bin", "cifar-100-binary/../../evil.bin"])
def test_archive_with_path_traversal_is_refused(tmp_path: Path, name: str) -> None:
    archive = make_archive(tmp_path / "a.tar.gz", {name: bytes(RECORD_BYTES)})
    with pytest.raises(CifarFormatError) as e:
        open_cifar100(archive, cache_dir=tmp_path / "cache")
    assert str(archive) in str(e.value) and repr(name) in str(e.value)
    assert not (tmp_path / "evil.bin").exists()


def test_archive_with_a_link_member_is_refused(tmp_path: Path) -> None:
    archive = tmp_path / "a.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        info = tarfile.TarInfo("cifar-100-binary/train.bin")
        info.type = tarfile.SYMTYPE
        info.linkname = "/etc/passwd"
        tar.addfile(info)
    with pytest.raises(CifarFormatError, match="not a regular file") as e:
        open_cifar100(archive, cache_dir=tmp_path / "cache")
    assert str(archive) in str(e.value)


def test_archive_without_the_bin_member(tmp_path: Path) -> None:
    archive = make_archive(tmp_path / "a.tar.gz", {"cifar-100-binary/test.bin": bytes(RECORD_BYTES)})
    with pytest.raises(CifarFormatError) as e:
        open_cifar100(archive, cache_dir=tmp_path / "cache")
    assert str(archive) in str(e.value) and "no member named train.bin" in str(e.value)


def test_archive_that_is_not_a_tar(tmp_path: Path) -> None:
    archive = tmp_path / "a.tar.gz"
    archive.write_bytes(os.urandom(1000))
    with pytest.raises(CifarFormatError, match="not a readable tar archive") as e:
        open_cifar100(archive, cache_dir=tmp_path / "cache")
    assert str(archive) in str(e.value)


def test_extracted_corrupt_member_is_named(tmp_path: Path) -> None:
    archive = make_archive(tmp_path / "a.tar.gz", {"cifar-100-binary/train.bin": bytes(RECORD_BYTES + 1)})
    with pytest.raises(CifarFormatError) as e:
        open_cifar100(archive, cache_dir=tmp_path / "cache")
    assert str(tmp_path / "cache" / "cifar-100-binary" / "train.bin") in str(e.value)


def _uncompressed_gzip_tar(path: Path, members: dict[str, bytes]) -> Path:
    """A .tar.gz whose deflate blocks are stored (level 0), so a byte of a member's data is a byte
    of the file: corrupting it leaves a readable tar with wrong data and a wrong CRC."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    path.write_bytes(gzip.compress(buffer.getvalue(), compresslevel=0))
    return path


def test_archive_with_corrupt_compressed_data_is_refused(tmp_path: Path, synth_dir: Path) -> None:
    train = (synth_dir / "train.bin").read_bytes()
    archive = _uncompressed_gzip_tar(tmp_path / "a.tar.gz", {"cifar-100-binary/train.bin": train})
    data = bytearray(archive.read_bytes())
    pixel = data.index(train[1000:1100]) + 50  # a pixel byte: the labels' check cannot see it
    data[pixel] ^= 0xFF
    archive.write_bytes(bytes(data))
    with pytest.raises(CifarFormatError, match="CRC check failed") as e:
        open_cifar100(archive, cache_dir=tmp_path / "cache")
    assert str(archive) in str(e.value)
    assert not list((tmp_path / "cache").rglob("*.bin"))  # nothing extracted


def test_extraction_is_redone_for_another_archive_of_the_same_sizes(tmp_path: Path, synth_dir: Path) -> None:
    train = (synth_dir / "train.bin").read_bytes()
    other = bytearray(train)
    other[2:RECORD_BYTES] = bytes(RECORD_BYTES - 2)  # the first record's pixels: black
    archive = make_archive(tmp_path / "a.tar.gz", {"cifar-100-binary/train.bin": train})
    cache = tmp_path / "cache"
    first = extract_cifar100(archive, cache)["train.bin"]
    assert first.read_bytes() == train
    stamp = cache / ".a.tar.gz.extracted.json"
    assert stamp.is_file()
    modified = first.stat().st_mtime_ns
    assert extract_cifar100(archive, cache)["train.bin"].stat().st_mtime_ns == modified  # reused
    make_archive(archive, {"cifar-100-binary/train.bin": bytes(other)})  # replaced, same sizes
    os.utime(archive, ns=(archive.stat().st_atime_ns, archive.stat().st_mtime_ns + 10**9))
    assert extract_cifar100(archive, cache)["train.bin"].read_bytes() == bytes(other)
    stamp.write_text("{not json")  # a stamp that cannot be read: extracted again, not an error
    assert extract_cifar100(archive, cache)["train.bin"].read_bytes() == bytes(other)


# --- rewriting synthetic data ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [("seed", 1.9), ("seed", 1e400), ("seed", True), ("noise", "x"), ("noise", float("inf"))],
)
def test_a_description_of_the_wrong_types_is_malformed(tmp_path: Path, field: str, value: object) -> None:
    write_synthetic_cifar100(tmp_path, per_fine_class=1, test_per_fine_class=0)
    sidecar = tmp_path / "synthetic.json"
    meta = json.loads(sidecar.read_text())
    meta[field] = "VALUE"
    # the value as JSON text: 1e400 as written (json.dumps would write Infinity)
    sidecar.write_text(json.dumps(meta).replace('"VALUE"', "1e400" if value == 1e400 else json.dumps(value)))
    with pytest.raises(CifarFormatError, match="malformed synthetic-data description"):
        Cifar100(tmp_path / "train.bin")


def test_a_rewrite_without_a_split_removes_it(tmp_path: Path) -> None:
    write_synthetic_cifar100(tmp_path, per_fine_class=1, test_per_fine_class=2, seed=0)
    assert (tmp_path / "test.bin").is_file()
    write_synthetic_cifar100(tmp_path, per_fine_class=1, test_per_fine_class=0, seed=7)
    assert not (tmp_path / "test.bin").exists()  # else seed 0's test split, taken for the real one
    assert Cifar100(tmp_path / "train.bin").is_synthetic


def test_data_not_written_by_the_generator_is_not_overwritten(tmp_path: Path) -> None:
    written = write_records(tmp_path / "train.bin", *valid_labels(3))  # the user's own, no sidecar
    with pytest.raises(FileExistsError, match=r"train\.bin was not written by monadl's synthetic generator"):
        write_synthetic_cifar100(tmp_path, per_fine_class=1, test_per_fine_class=0)
    assert (tmp_path / "train.bin").read_bytes() == written.tobytes()


def test_an_interrupted_write_is_named_and_a_new_write_finishes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from monadl.data import cifar100

    real = cifar100._write_split
    written: list[str] = []

    def interrupted(path: Path, *args: object) -> None:
        if written:  # the second split: as if the process were killed here
            raise KeyboardInterrupt
        written.append(path.name)
        real(path, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(cifar100, "_write_split", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_synthetic_cifar100(tmp_path, per_fine_class=1, test_per_fine_class=1)
    with pytest.raises(CifarFormatError, match="not finished being written"):
        Cifar100(tmp_path / "train.bin")  # neither real nor finished synthetic data
    monkeypatch.setattr(cifar100, "_write_split", real)
    write_synthetic_cifar100(tmp_path, per_fine_class=1, test_per_fine_class=1)
    assert Cifar100(tmp_path / "test.bin").is_synthetic and len(Cifar100(tmp_path / "test.bin")) == 100
