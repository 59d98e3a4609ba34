"""The compiled engine (setup.py, monadl/_compiled.py): it runs compiled exactly when its mypyc
extensions are built, match their sources and ``MONADL_PURE`` is unset; otherwise every module runs
from its ``.py``, never a mix. The tests that need extensions skip where none are built (no C
compiler, ``MONADL_BUILD=pure``)."""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import time
import zipfile
from collections.abc import Mapping
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path
from typing import Any

import pytest

import monadl
from monadl import _compiled

PACKAGE = Path(monadl.__file__).parent
MANIFEST = PACKAGE / "_engine.json"
SETUP = PACKAGE.parent / "setup.py"
PURE_ENV = os.environ.get("MONADL_PURE", "") not in ("", "0")


def _extensions(package: Path) -> list[Path]:
    return sorted(p for p in package.rglob("*") if any(p.name.endswith(s) for s in EXTENSION_SUFFIXES))


def _manifest() -> dict[str, Any]:
    if not _extensions(PACKAGE) or not MANIFEST.exists():
        pytest.skip("no mypyc extensions are built here (no C compiler, or MONADL_BUILD=pure)")
    manifest: dict[str, Any] = json.loads(MANIFEST.read_text())
    return manifest


def _module_name(path: str) -> str:
    return path.removesuffix(".py").replace("/", ".")


def _is_extension(file: str | None) -> bool:
    return file is not None and any(file.endswith(s) for s in EXTENSION_SUFFIXES)


def _sources_match(manifest: Mapping[str, Any], root: Path) -> bool:
    return all(
        hashlib.sha256((root / path).read_bytes()).hexdigest() == digest
        for path, digest in {**manifest["modules"], **manifest.get("native", {})}.items()
    )


def _python(code: str, package_root: Path | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    """``code`` run by a fresh interpreter, MONADL_PURE unset unless given, importing monadl from
    ``package_root`` (default: where this process imports it from)."""
    environ = {k: v for k, v in os.environ.items() if k != "MONADL_PURE"}
    environ["PYTHONPATH"] = str(package_root or PACKAGE.parent)
    environ.update(env)
    return subprocess.run(
        [sys.executable, "-W", "always", "-c", code],
        env=environ,
        cwd=package_root or PACKAGE.parent,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


# Imports every compiled module, runs a small program, and prints where each module came from.
REPORT = """
import importlib, json, sys
import monadl
names = {names!r}
files = {{name: importlib.import_module(name).__file__ for name in names}}
files.update({{n: m.__file__ for n, m in list(sys.modules.items()) if n.startswith("monadl.")}})
w = monadl.FloatWeight(3.0)
loss, gradients = monadl.compute_gradients(w * w + 1.0)
print(json.dumps({{"compiled": monadl.compiled(), "reason": monadl._compiled.reason(),
                  "package": monadl.__file__, "files": files, "loss": loss, "gradient": gradients[w]}}))
"""


def _report(manifest: Mapping[str, Any], package_root: Path | None = None, **env: str) -> dict[str, Any]:
    names = sorted(_module_name(path) for path in manifest["modules"])
    done = _python(REPORT.format(names=names), package_root, **env)
    assert done.returncode == 0, done.stderr
    report: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    report["stderr"] = done.stderr
    assert report["loss"] == 10.0 and report["gradient"] == 6.0
    return report


def test_this_process_runs_compiled_iff_current_extensions_are_built_and_pure_mode_is_off() -> None:
    built = bool(_extensions(PACKAGE)) and MANIFEST.exists()
    current = built and _sources_match(json.loads(MANIFEST.read_text()), PACKAGE.parent)
    assert monadl.compiled() == (current and not PURE_ENV), _compiled.reason()
    # Never a mix: every monadl module loaded so far comes from an extension iff the engine is compiled.
    loaded = {name: module.__file__ for name, module in sys.modules.items() if name.startswith("monadl.")}
    compiled_here = {name for name, file in loaded.items() if _is_extension(file)}
    if monadl.compiled():
        assert "monadl.do.do" in compiled_here and "monadl.do.scheduler" in compiled_here
        assert "monadl._compiled" not in compiled_here  # it decides, so it is never compiled
    else:
        assert compiled_here == set()


def _compiled_modules() -> list[str]:
    """``COMPILED_MODULES`` of setup.py: the modules it compiles."""
    tree = ast.parse(SETUP.read_text())
    listed: list[str] = next(
        ast.literal_eval(node.value)
        for node in tree.body
        if isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "COMPILED_MODULES" for t in node.targets)
    )
    return listed


def _native_modules() -> dict[str, str]:
    """``NATIVE_MODULES`` of setup.py: its hand-written C extensions, by module, to their sources."""
    tree = ast.parse(SETUP.read_text())
    listed: dict[str, str] = next(
        ast.literal_eval(node.value)
        for node in tree.body
        if isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "NATIVE_MODULES" for t in node.targets)
    )
    return listed


def test_the_build_record_lists_exactly_the_modules_setup_py_compiles() -> None:
    manifest = _manifest()
    listed = _compiled_modules()
    assert sorted(manifest["modules"]) == sorted(listed)
    natives = _native_modules()
    assert sorted(manifest["native"]) == sorted(natives.values())
    # One extension per compiled module beside its .py, the group's shared library, and each C module.
    stems = {str(p.relative_to(PACKAGE.parent)).split(".")[0] for p in _extensions(PACKAGE)}
    group = manifest["group"].replace(".", "/") + "__mypyc"
    c_modules = {p.removesuffix(".c") for p in natives.values()}
    assert stems == {p.removesuffix(".py") for p in listed} | {group} | c_modules
    assert all(name.replace(".", "/") + ".c" == path for name, path in natives.items())


def test_compiled_mode_loads_every_listed_module_from_its_extension() -> None:
    manifest = _manifest()
    if not _sources_match(manifest, PACKAGE.parent):
        pytest.skip("the build is stale here (sources edited since it was built)")
    report = _report(manifest)
    assert report["compiled"], report["reason"]
    for name in manifest["modules"]:
        assert _is_extension(report["files"][_module_name(name)]), name
    assert "StaleBuildWarning" not in report["stderr"]


def test_monadl_pure_imports_every_module_from_its_source() -> None:
    manifest = _manifest()
    report = _report(manifest, MONADL_PURE="1")
    assert not report["compiled"]
    assert report["reason"] == "MONADL_PURE is set"
    assert all(file.endswith(".py") for file in report["files"].values()), report["files"]
    assert "StaleBuildWarning" not in report["stderr"]  # pure on purpose: nothing to warn about


@pytest.fixture
def package_copy(tmp_path: Path) -> Path:
    """A copy of the installed package, extensions and build record included, to break safely."""
    _manifest()
    shutil.copytree(PACKAGE, tmp_path / "monadl", ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


def test_an_edited_compiled_module_makes_the_whole_engine_pure_with_one_warning(package_copy: Path) -> None:
    manifest = json.loads((package_copy / "monadl" / "_engine.json").read_text())
    if _sources_match(manifest, package_copy):
        untouched = _report(manifest, package_copy)
        assert untouched["compiled"] and untouched["package"].startswith(str(package_copy))
    edited = package_copy / "monadl" / "do" / "stats.py"  # compiled, and imported by the scheduler
    edited.write_text(edited.read_text() + "\n# edited after the build\n")
    report = _report(manifest, package_copy)
    assert report["package"].startswith(str(package_copy))
    assert not report["compiled"]
    assert report["reason"] == "stale build: monadl/do/stats.py changed since it was compiled"
    assert all(file.endswith(".py") for file in report["files"].values()), report["files"]
    assert report["stderr"].count("StaleBuildWarning") == 1, report["stderr"]
    assert "monadl/do/stats.py changed since it was compiled" in report["stderr"]


def test_an_edited_c_module_makes_the_whole_engine_pure_with_one_warning(package_copy: Path) -> None:
    manifest = json.loads((package_copy / "monadl" / "_engine.json").read_text())
    edited = package_copy / "monadl" / "_native.c"
    edited.write_text(edited.read_text() + "\n/* edited after the build */\n")
    report = _report(manifest, package_copy)
    assert not report["compiled"]
    assert report["reason"] == "stale build: monadl/_native.c changed since it was compiled"
    assert all(file.endswith(".py") for file in report["files"].values()), report["files"]
    assert report["stderr"].count("StaleBuildWarning") == 1, report["stderr"]


def test_extensions_without_their_build_record_are_not_run(package_copy: Path) -> None:
    manifest = json.loads((package_copy / "monadl" / "_engine.json").read_text())
    (package_copy / "monadl" / "_engine.json").unlink()
    report = _report(manifest, package_copy)
    assert not report["compiled"] and report["reason"].startswith("stale build: extension modules without")
    assert all(file.endswith(".py") for file in report["files"].values())
    assert report["stderr"].count("StaleBuildWarning") == 1


def test_a_missing_extension_makes_the_whole_engine_pure(package_copy: Path) -> None:
    manifest = json.loads((package_copy / "monadl" / "_engine.json").read_text())
    for extension in _extensions(package_copy / "monadl"):
        if extension.name.startswith("stats."):
            extension.unlink()
    report = _report(manifest, package_copy)
    assert not report["compiled"] and "incomplete build: monadl/do/stats" in report["reason"]
    assert all(file.endswith(".py") for file in report["files"].values())


def test_the_source_finder_finds_only_sources() -> None:
    finder = _compiled.SourceFinder()
    spec = finder.find_spec("monadl.do.do", [str(PACKAGE / "do")])
    assert spec is not None and spec.origin == str(PACKAGE / "do" / "do.py")
    assert finder.find_spec("monadl._engine__mypyc", [str(PACKAGE)]) is None  # no source: not ours
    assert finder.find_spec("json", None) is None  # not monadl's


def _python_classes(tree: ast.Module) -> set[str]:
    """The classes of a module that mypyc makes plain Python classes: protocols, and those marked
    ``@mypyc_attr(native_class=False)``."""
    plain = set()
    for node in tree.body:
        if not isinstance(node, ast.ClassDef):
            continue
        marks = [ast.unparse(d) for d in node.decorator_list] + [ast.unparse(b) for b in node.bases]
        if any("native_class=False" in m or m.startswith("Protocol") for m in marks):
            plain.add(node.name)
    return plain


def test_no_compiled_class_has_a_dict_or_weak_references() -> None:
    """A compiled class given an interpreted base (``Generic``, an ABC) gets an instance dictionary
    and a weak-reference slot, which on Python 3.11 its deallocator leaves dangling (mypyc issue
    1102: dropping a weakly referenced object crashed the interpreter). The engine's compiled
    classes have neither, so the build needs no patch of mypyc's C."""
    manifest = _manifest()
    if PURE_ENV or not monadl.compiled():
        pytest.skip("the engine runs from its sources here")
    checked = 0
    for path in manifest["modules"]:
        module = sys.modules.get(_module_name(path)) or __import__(_module_name(path), fromlist=["_"])
        plain = _python_classes(ast.parse((PACKAGE.parent / path).read_text()))
        for name, cls in vars(module).items():
            if isinstance(cls, type) and cls.__module__ == module.__name__ and name not in plain:
                assert (cls.__weakrefoffset__, cls.__dictoffset__) == (0, 0), f"{module.__name__}.{name}"
                checked += 1
    assert checked > 30


# The build's type check (setup.py runs mypyc, which runs mypy): what it reads, and which NumPy stubs
# it passes. mypy, run as setup.py runs it, is run here without mypyc's C, which takes minutes.

# Packages whose array types array_api_compat names for type checking: installed (or their names
# shadowed by empty packages, as here), mypy would read them all (torch alone: over a thousand files).
ARRAY_LIBRARIES = ("torch", "jax", "jaxlib", "dask", "cupy", "cupyx", "dpnp", "ndonnx", "sparse")


def _pyproject() -> dict[str, Any]:
    import tomllib

    with open(SETUP.parent / "pyproject.toml", "rb") as f:
        return tomllib.load(f)


def _package_name(requirement: str) -> str:
    """The importable name of a requirement (``typing-extensions>=4.6``: ``typing_extensions``)."""
    return re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0].strip().lower().replace("-", "_")


def _builds_mypy(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, *args: str, **env: str
) -> subprocess.CompletedProcess[str]:
    """mypy run with the command line setup.py gives mypyc (its configuration and the compiled
    modules), ``args`` added, in setup.py's folder and a fresh interpreter, ``env`` added to its
    environment."""
    build = pytest.importorskip("mypyc.build")
    setuptools = pytest.importorskip("setuptools")
    monkeypatch.setenv("MONADL_BUILD", "compiled")  # never pure: a pure build empties the tree
    monkeypatch.delenv("MONADL_MYPY_VERBOSE", raising=False)
    monkeypatch.setattr(setuptools, "setup", lambda **kwargs: None)
    runs: list[subprocess.CompletedProcess[str]] = []

    def mypycify(paths: list[str], **kwargs: Any) -> list[Any]:
        command = [sys.executable, "-m", "mypy", "--no-incremental", "--cache-dir", str(tmp_path / "cache")]
        environ = {k: v for k, v in os.environ.items() if k not in ("MYPYPATH", "PYTHONPATH")} | env
        runs.append(
            subprocess.run(
                [*command, *args, *paths],
                cwd=SETUP.parent,
                env=environ,
                capture_output=True,
                text=True,
                timeout=600,
                check=False,
            )
        )
        return []

    monkeypatch.setattr(build, "mypycify", mypycify)
    namespace: dict[str, Any] = {"__name__": "monadl_setup", "__file__": str(SETUP)}
    exec(compile(SETUP.read_text(), str(SETUP), "exec"), namespace)
    namespace["_has_c_compiler"] = lambda: True  # mypy's reading is the same without one
    namespace["_mypyc_extensions"]()
    assert len(runs) == 1
    return runs[0]


def _read_by_mypy(log: str) -> dict[str, str]:
    """The modules mypy's verbose log says it parsed, to their files."""
    found = re.findall(r"^\s*LOG:  Parsing (.+) \(([\w.]+)\)$", log, re.MULTILINE)
    return {module: path for path, module in found}


def _top_level(module: str) -> str:
    return module.split(".")[0]


def test_the_builds_type_check_reads_the_sources_stubs_and_build_requirements_only(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Which packages are installed beside monadl changes neither what mypyc's type check reads nor
    how long it takes: it reads monadl's sources, stub files, and the build's own requirements
    (``[build-system]`` in pyproject.toml; mypy_extensions is mypy's). Every array library is
    installed here, as an empty typed package on MYPYPATH (shadowing any real one), so that the check
    holds without them."""
    installed = tmp_path / "installed"
    for name in ARRAY_LIBRARIES:
        (installed / name).mkdir(parents=True)
        (installed / name / "__init__.py").write_text("ARRAY_LIBRARY: int = 1\n")
        (installed / name / "py.typed").write_text("")
        (installed / name / "array.py").write_text("ARRAY: int = 1\n")  # dask.array and the like
    done = _builds_mypy(monkeypatch, tmp_path, "--verbose", MYPYPATH=str(installed))
    assert done.returncode == 0, done.stdout[-3000:]
    read = _read_by_mypy(done.stderr)
    assert "monadl.do.do" in read and "numpy" in read, sorted(read)[:50]
    libraries = sorted(m for m in read if _top_level(m) in ARRAY_LIBRARIES)
    assert libraries == [], f"mypy read array libraries into the build: {libraries}"

    import mypy

    typeshed = Path(mypy.__file__).resolve().parent / "typeshed"
    requirements = {_package_name(r) for r in _pyproject()["build-system"]["requires"]}
    allowed = requirements | {"mypy_extensions", "monadl"}
    others = {
        module: path
        for module, path in read.items()
        if _top_level(module) not in allowed and not Path(path).resolve().is_relative_to(typeshed)
    }
    assert others == {}, f"mypy read packages that are not the build's requirements: {sorted(others)}"


# A Python that the newest NumPy has wheels for: its stubs are checked as they are read there (the
# newest NumPy may need a newer Python than this one).
NEWEST_PYTHON = "3.14"


def _numpy_stubs(requirement: str, python: str, folder: Path) -> tuple[str, Path]:
    """The stubs of the NumPy that pip picks for ``requirement`` on ``python``, unpacked from its
    wheel into ``folder``: the wheel's name, and the folder to put on MYPYPATH."""
    wheels = folder / "wheels"
    command = [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check"]
    command += ["--no-deps", "--only-binary=:all:", "--python-version", python, "-d", str(wheels)]
    done = subprocess.run([*command, requirement], capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, f"pip download {requirement} (Python {python}):\n{done.stderr[-2000:]}"
    (wheel,) = wheels.glob("numpy-*.whl")
    stubs = folder / "stubs"
    with zipfile.ZipFile(wheel) as archive:
        typed = [
            n
            for n in archive.namelist()
            if n.startswith("numpy/") and n.endswith((".pyi", ".py", "py.typed"))
        ]
        archive.extractall(stubs, members=typed)
    return wheel.name, stubs


@pytest.mark.skipif(
    os.environ.get("MONADL_TEST_NUMPY_STUBS", "") in ("", "0"),
    reason="downloads NumPy's wheels from PyPI: set MONADL_TEST_NUMPY_STUBS=1 (CI does)",
)
@pytest.mark.parametrize("numpy_release", ["oldest", "newest"])
def test_numpys_stubs_accept_the_compiled_modules(
    numpy_release: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The build's type check passes with the stubs of the oldest NumPy the build allows (the floor
    of its requirement in pyproject.toml's ``[build-system]``) and of the newest on PyPI (what an
    isolated build installs): where mypyc rejects the engine, ``MONADL_BUILD=auto`` installs it
    interpreted, 2-3x slower. The stubs' own errors (reported here, as they are read from MYPYPATH)
    aside."""
    pyproject = _pyproject()
    if numpy_release == "oldest":
        (floor,) = [r for r in pyproject["build-system"]["requires"] if _package_name(r) == "numpy"]
        version = re.fullmatch(r"numpy\s*>=\s*([\d.]+)", floor)
        assert version is not None, floor
        requirement = f"numpy=={version.group(1)}.*"
        python = pyproject["project"]["requires-python"].removeprefix(">=")
    else:
        requirement, python = "numpy", NEWEST_PYTHON
    wheel, stubs = _numpy_stubs(requirement, python, tmp_path)
    done = _builds_mypy(monkeypatch, tmp_path, "--verbose", "--python-version", python, MYPYPATH=str(stubs))
    numpy = _read_by_mypy(done.stderr).get("numpy", "")
    assert Path(numpy).is_relative_to(stubs), f"mypy read NumPy from {numpy!r}, not {wheel}'s stubs"
    compiled = len(_compiled_modules())
    # Every module checked: not stopped by a blocking error (in the stubs, say).
    assert re.search(rf"(checked|found in) {compiled} source files", done.stdout), done.stdout[-2000:]
    ours = [line for line in done.stdout.splitlines() if re.match(r"monadl[/\\].*: error:", line)]
    assert ours == [], f"{wheel}'s stubs (Python {python}) reject the compiled modules:\n" + "\n".join(ours)


# Packages of the array libraries above that an installation of them adds beside them.
ARRAY_LIBRARY_COMPANIONS = ("torchgen", "functorch", "jax_plugins", "cupy_backends")


def _python_without(names: tuple[str, ...], folder: Path) -> Path:
    """The Python of a new virtual environment that sees this one's packages but ``names`` (top-level
    packages, their distributions' metadata too): a folder of links to the rest, on its path."""
    view = folder / "site"
    view.mkdir(parents=True)
    stdlib = {Path(sysconfig.get_paths()[key]).resolve() for key in ("stdlib", "platstdlib")}
    for entry in sys.path:
        directory = Path(entry or ".").resolve()
        if (
            not directory.is_dir()
            or directory in stdlib
            or directory.name == "lib-dynload"
            or directory in (SETUP.parent, SETUP.parent / "tests")  # put on the path by pytest
        ):
            continue
        for child in sorted(directory.iterdir()):
            top = re.split(r"[-.]", child.name, maxsplit=1)[0].lower()
            if top in names or child.name == "__pycache__" or (view / child.name).exists():
                continue
            (view / child.name).symlink_to(child)
    venv = folder / "venv"
    made = subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)], capture_output=True, check=False
    )
    assert made.returncode == 0, made.stderr
    python = venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    found = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    )
    (Path(found.stdout.strip()) / "monadl_test_view.pth").write_text(f"{view}\n")
    return python


def _copy_of_the_sources(destination: Path) -> Path:
    """What a build reads (the project's files, the package's sources), without build outputs."""
    destination.mkdir(parents=True)
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy2(SETUP.parent / name, destination / name)
    ignored = shutil.ignore_patterns("__pycache__", "*.so", "*.pyd", "_engine.json", "*.egg-info")
    shutil.copytree(PACKAGE, destination / "monadl", ignore=ignored)
    return destination


def _timed_build(python: Path, source: Path, wheels: Path) -> tuple[float, str]:
    """The seconds ``python`` takes to build a compiled wheel of ``source`` (in its own environment,
    offline), and the build's output with mypy's verbose log."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MYPYPATH", "MONADL_PURE")}
    env |= {"MONADL_BUILD": "compiled", "MONADL_MYPY_VERBOSE": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    command = [str(python), "-m", "pip", "wheel", "-v", "--no-deps", "--no-build-isolation", "--no-index"]
    start = time.perf_counter()
    done = subprocess.run(
        [*command, "-w", str(wheels), str(source)],
        cwd=source.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=3600,
        check=False,
    )
    seconds = time.perf_counter() - start
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    (wheel,) = wheels.glob("monadl-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        assert "monadl/_engine.json" in archive.namelist(), f"{wheel.name} has no compiled engine"
    return seconds, output


@pytest.mark.skipif(
    os.environ.get("MONADL_TEST_BUILDS", "") in ("", "0"),
    reason="four compiled builds (minutes): set MONADL_TEST_BUILDS=1, with torch or jax installed",
)
def test_installed_array_libraries_leave_the_build_time_alone(tmp_path: Path) -> None:
    """Where torch, jax or dask is installed (the usual machine of a deep-learning user), the compiled
    build takes about the time it takes without them (at most twice), and mypy's log names none of
    their modules: the same build, by this Python, and by one that sees its packages but those."""
    present = [name for name in ARRAY_LIBRARIES if importlib.util.find_spec(name) is not None]
    if not present:
        pytest.skip("none of the array libraries is installed here (pip install torch, or jax jaxlib)")
    if shutil.which(os.environ.get("CC", "cc").split()[0]) is None:
        pytest.skip("no C compiler")
    without = _python_without(ARRAY_LIBRARIES + ARRAY_LIBRARY_COMPANIONS, tmp_path / "without")
    hidden = subprocess.run(
        [
            str(without),
            "-c",
            f"import importlib.util as u; print([n for n in {present!r} if u.find_spec(n)])",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert hidden.stdout.strip() == "[]", hidden.stdout
    # Each build twice, alternately, with them first (a cold start counts against the claim); each
    # its best time: what another process on the machine takes from one run is not the build's.
    pythons = {"with": Path(sys.executable), "without": without}
    seconds: dict[str, list[float]] = {"with": [], "without": []}
    logs: dict[str, str] = {}
    for run in range(2):
        for kind, python in pythons.items():
            folder = tmp_path / f"{kind}-{run}"
            took, logs[kind] = _timed_build(python, _copy_of_the_sources(folder / "src"), folder)
            seconds[kind].append(took)
    mypy = {kind: re.findall(r"Build finished in ([\d.]+) seconds", log)[-1:] for kind, log in logs.items()}
    print(f"builds, in seconds, with {', '.join(present)}: {seconds['with']}, mypy {mypy['with']}")
    print(f"builds, in seconds, without them: {seconds['without']}, mypy {mypy['without']}")
    read_with, read_without = _read_by_mypy(logs["with"]), _read_by_mypy(logs["without"])
    assert "monadl.do.do" in read_with and "monadl.do.do" in read_without, logs["with"][-3000:]
    libraries = sorted(m for m in read_with if _top_level(m) in ARRAY_LIBRARIES + ARRAY_LIBRARY_COMPANIONS)
    assert libraries == [], f"mypy read array libraries into the build: {libraries[:20]}"
    assert sorted(read_with) == sorted(read_without)
    assert min(seconds["with"]) <= 2 * min(seconds["without"]), seconds
