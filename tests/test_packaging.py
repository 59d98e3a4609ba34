"""The README's editable install (``pip install -e .``) must be one that mypy sees: a user's own
file, outside the repository, type-checks against monadl with ``mypy --strict``. And the package is
whole without the checkout: ``python -m monadl.bench`` runs from a copy of ``monadl/`` alone.

setuptools installs a flat layout in editable mode as an import hook (a ``MetaPathFinder`` in a
``.pth`` file) that Python runs and mypy cannot see ("Cannot find implementation or library stub
for module named monadl"); ``package-dir = {"" = "."}`` in ``pyproject.toml`` makes it a plain path
entry instead. This test installs a copy of the package, editable, into a new virtual environment
and runs mypy there, as a user would.

Offline and in about ten seconds: the new environment sees this one's packages (pip, setuptools,
mypy, numpy, returns) through a ``.pth`` entry rather than downloading them, pip builds without
isolation (``--no-build-isolation --no-index``), and ``MONADL_BUILD=pure`` compiles nothing. A copy,
not this checkout: an install writes into the tree it installs (``build/``, ``*.egg-info``, and a
pure build removes the compiled engine's extensions).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SETUPTOOLS = (77,)  # pyproject.toml's [build-system] requires setuptools>=77 (PEP 639: an SPDX license)

USER_FILE = """\
from typing import TypeVar, assert_type

import numpy as np

import monadl as ml
from monadl._packaging_probe import PROBE

L = TypeVar("L", ml.FloatLayer, ml.ArrayLayer)


def swish(x: L) -> L:
    return x * ml.sigmoid(x)


w = ml.ArrayWeight.normal((3, 1), seed=0)
b = ml.FloatWeight(0.0)
x = np.ones((4, 3))
loss = ml.mean((x @ w + b) ** 2.0)
assert_type(loss, ml.FloatLayer)
assert_type(swish(x @ w), ml.ArrayLayer)
assert_type(loss.train_blocking(ml.SGD(0.1)).unwrap(), float)
assert_type(PROBE, int)  # this module is in the copy only: mypy found monadl there
"""


def _setuptools_version() -> tuple[int, ...]:
    """The version of the setuptools installed here, as a tuple of ints; () where there is none."""
    try:
        version = importlib.metadata.version("setuptools")
    except importlib.metadata.PackageNotFoundError:
        return ()
    return tuple(int(part) for part in re.findall(r"\d+", version)[:2])


def _run(args: list[str], cwd: Path, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


def _copy_of_the_package(destination: Path) -> Path:
    """What pip builds monadl from (its sources, no build outputs), with a probe module."""
    destination.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy2(ROOT / name, destination / name)
    ignored = shutil.ignore_patterns("__pycache__", "*.so", "*.pyd", "_engine.json", "*.egg-info")
    shutil.copytree(ROOT / "monadl", destination / "monadl", ignore=ignored)
    (destination / "monadl" / "_packaging_probe.py").write_text("PROBE: int = 1\n")
    return destination


def _package_dirs() -> list[str]:
    """The folders this Python imports installed packages from (site-packages, and the folders its
    .pth files add), without the checkout (which pytest puts on the path)."""
    stdlib = {Path(sysconfig.get_paths()[key]).resolve() for key in ("stdlib", "platstdlib")}
    dirs = [Path(entry).resolve() for entry in sys.path if entry and Path(entry).is_dir()]
    kept = [
        d for d in dirs if d not in stdlib and d.name != "lib-dynload" and d not in (ROOT, ROOT / "tests")
    ]
    return list(dict.fromkeys(str(d) for d in kept))


def test_mypy_finds_an_editable_install_from_a_users_own_directory(tmp_path: Path) -> None:
    if _setuptools_version() < SETUPTOOLS:
        pytest.skip(
            f"setuptools>={'.'.join(map(str, SETUPTOOLS))} is not installed (pip install -e '.[dev]')"
        )
    pytest.importorskip("pip")

    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MYPYPATH", "PYTHONHOME")}
    env |= {
        "MONADL_BUILD": "pure",
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "PIP_NO_INPUT": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    env.pop("MONADL_PURE", None)

    source = _copy_of_the_package(tmp_path / "monadl-source")
    venv = tmp_path / "venv"
    made = _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], tmp_path, env, 60)
    assert made.returncode == 0, made.stderr
    python = venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    # The new environment's own site-packages, then this one's (pip, setuptools, mypy, the
    # dependencies): a path in a .pth file, read by Python at start-up and by mypy alike.
    found = _run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], tmp_path, env, 60
    )
    site_packages = Path(found.stdout.strip())
    ours = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
    (site_packages / "zz_monadl_test_packages.pth").write_text("\n".join(ours) + "\n")

    installed = _run(
        [
            str(python),
            "-m",
            "pip",
            "install",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-e",
            str(source),
        ],
        tmp_path,
        env,
        120,
    )
    assert installed.returncode == 0, installed.stdout + installed.stderr
    pth = [p.read_text() for p in site_packages.glob("__editable__*monadl*.pth")]
    assert pth, sorted(p.name for p in site_packages.iterdir())

    # At run time, monadl is the copy's.
    imported = _run([str(python), "-c", "import monadl; print(monadl.__file__)"], tmp_path, env, 60)
    assert imported.returncode == 0, imported.stderr
    assert Path(imported.stdout.strip()).parent == source / "monadl", (imported.stdout, pth)

    # And mypy, run as a user runs it in a directory of their own, finds it there.
    user = tmp_path / "user"
    user.mkdir()
    (user / "mypy.ini").write_text("[mypy]\n")
    (user / "train_model.py").write_text(USER_FILE)
    checked = _run(
        [
            str(python),
            "-m",
            "mypy",
            "--strict",
            "--cache-dir",
            str(tmp_path / "mypy-cache"),
            "train_model.py",
        ],
        user,
        env,
        120,
    )
    report = textwrap.indent(checked.stdout + checked.stderr, "    ")
    assert checked.returncode == 0, f"mypy --strict failed on a user's file (editable .pth: {pth}):\n{report}"


def test_the_benchmarks_run_from_the_package_alone(tmp_path: Path) -> None:
    """``python -m monadl.bench`` needs nothing of the checkout but the package: run from a copy of
    ``monadl/`` alone (no ``examples/`` beside it), in a folder of its own, as from an installed
    package (``.ci/installed-bench`` installs a wheel; this runs offline, on the interpreted engine)."""
    site = tmp_path / "site"
    site.mkdir()
    ignored = shutil.ignore_patterns("__pycache__", "*.so", "*.pyd", "_engine.json", "*.egg-info")
    shutil.copytree(ROOT / "monadl", site / "monadl", ignore=ignored)
    run = tmp_path / "run"
    run.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env |= {"PYTHONPATH": str(site), "MONADL_PURE": "1", "MONADL_CACHE_DIR": str(tmp_path / "cache")}
    # -P: not the working directory, nor anything else, ahead of PYTHONPATH on sys.path.
    where = _run([sys.executable, "-P", "-c", "import monadl; print(monadl.__file__)"], run, env, 60)
    assert Path(where.stdout.strip()) == site / "monadl" / "__init__.py", where.stderr
    for benchmark in ("columns", "treelstm"):
        done = _run([sys.executable, "-P", "-m", "monadl.bench", benchmark, "--smoke"], run, env, 300)
        assert done.returncode == 0, f"{benchmark}:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
        assert "peak RSS" in done.stdout, done.stdout


# A program that prints where monadl is installed from, how its engine runs, and a trained value.
INSTALLED = """
import json, sys
import monadl
w = monadl.FloatWeight(3.0)
loss, gradients = monadl.compute_gradients(w * w + 1.0)
print(json.dumps({"file": monadl.__file__, "prefix": sys.prefix, "compiled": monadl.compiled(),
                  "reason": monadl._compiled.reason(), "loss": loss, "gradient": gradients[w]}))
"""


@pytest.mark.parametrize(
    "build",
    [
        "pure",
        pytest.param(
            "compiled",
            marks=pytest.mark.skipif(
                os.environ.get("MONADL_TEST_BUILDS", "") in ("", "0") or shutil.which("cc") is None,
                reason="a compiled build (minutes): set MONADL_TEST_BUILDS=1, with a C compiler",
            ),
        ),
    ],
)
def test_a_wheel_built_once_installs_and_runs_where_there_is_no_compiler(build: str, tmp_path: Path) -> None:
    """A wheel built once (``MONADL_BUILD=compiled``: the engine compiled in it; ``pure``: for any
    platform) installs into a new environment that has no C compiler (none on PATH, ``CC`` pointing
    nowhere), and runs there from the installed package, the engine as the wheel holds it."""
    if _setuptools_version() < SETUPTOOLS:
        pytest.skip(
            f"setuptools>={'.'.join(map(str, SETUPTOOLS))} is not installed (pip install -e '.[dev]')"
        )
    pytest.importorskip("pip")
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "MYPYPATH", "PYTHONHOME", "MONADL_PURE")
    }
    env |= {"MONADL_BUILD": build, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1"}
    source = _copy_of_the_package(tmp_path / "monadl-source")
    dist = tmp_path / "dist"
    wheel_command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index"]
    built = _run([*wheel_command, "-w", str(dist), str(source)], tmp_path, env, 1800)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    # The license as an SPDX expression: the table form setuptools deprecates is gone.
    assert "project.license" not in built.stdout + built.stderr, built.stderr[-3000:]
    (wheel,) = dist.glob("monadl-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        (metadata,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        assert "License-Expression: Apache-2.0" in archive.read(metadata).decode().splitlines()
    assert "monadl/py.typed" in names and "monadl/do/do.py" in names
    if build == "pure":
        assert wheel.name.endswith("-py3-none-any.whl"), wheel.name
        assert "monadl/_engine.json" not in names
    else:
        assert not wheel.name.endswith("-none-any.whl") and "monadl/_engine.json" in names, wheel.name

    venv = tmp_path / "venv"
    made = _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], tmp_path, env, 60)
    assert made.returncode == 0, made.stderr
    bin_dir = venv / ("Scripts" if os.name == "nt" else "bin")
    python = bin_dir / ("python.exe" if os.name == "nt" else "python")
    found = _run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], tmp_path, env, 60
    )
    # pip and monadl's dependencies: this environment's, after the new one's own (the wheel's).
    (Path(found.stdout.strip()) / "zz_monadl_test_packages.pth").write_text("\n".join(_package_dirs()) + "\n")
    machine = {k: v for k, v in env.items() if k not in ("CC", "CXX", "LDSHARED", "MONADL_BUILD")}
    machine |= {"PATH": str(bin_dir), "CC": str(tmp_path / "no-cc"), "CXX": str(tmp_path / "no-c++")}
    installed = _run(
        [str(python), "-m", "pip", "install", "--no-deps", "--no-index", "--only-binary=:all:", str(wheel)],
        tmp_path,
        machine,
        300,
    )
    assert installed.returncode == 0, installed.stdout + installed.stderr
    elsewhere = tmp_path / "run"
    elsewhere.mkdir()
    ran = _run([str(python), "-P", "-c", INSTALLED], elsewhere, machine, 120)
    assert ran.returncode == 0, ran.stderr
    report = json.loads(ran.stdout.strip().splitlines()[-1])
    assert Path(report["file"]).is_relative_to(report["prefix"]), report
    assert report["compiled"] == (build == "compiled"), report["reason"]
    assert (report["loss"], report["gradient"]) == (10.0, 6.0)
