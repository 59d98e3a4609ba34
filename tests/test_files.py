"""Atomic writes (``monadl.data.files``): whole or nothing, with the mode a plain ``open`` gives."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from monadl.data.files import atomic_file, atomic_write_bytes


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_new_file_gets_the_mode_of_a_plain_open(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.write_bytes(b"x")  # what open() makes under this process's umask
    atomic_write_bytes(tmp_path / "atomic", b"x")
    assert _mode(tmp_path / "atomic") == _mode(plain)


def test_an_existing_file_keeps_its_mode(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"old")
    os.chmod(path, 0o640)
    atomic_write_bytes(path, b"new")
    assert path.read_bytes() == b"new" and _mode(path) == 0o640


def test_a_symbolic_link_is_written_through(tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.write_bytes(b"old")
    link = tmp_path / "link"
    link.symlink_to(target)
    atomic_write_bytes(link, b"new")
    assert link.is_symlink() and target.read_bytes() == b"new"


def test_a_missing_directory_is_named_not_the_temporary_file(tmp_path: Path) -> None:
    path = tmp_path / "nowhere" / "f.json"
    with pytest.raises(FileNotFoundError) as raised:
        atomic_write_bytes(path, b"x")
    assert "f.json" in str(raised.value) and str(tmp_path / "nowhere") in str(raised.value)
    assert ".tmp" not in str(raised.value)


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"old")
    with pytest.raises(RuntimeError), atomic_file(path) as f:
        f.write(b"half")
        raise RuntimeError("interrupted")
    assert path.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f"]
