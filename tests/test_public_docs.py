"""Every public name keeps its docstring and its real signature, whichever way the engine runs:
mypyc keeps neither, so the build records them and ``monadl/_documented.py`` gives them back.
``help()`` and the API reference (pdoc, built from the compiled engine in CI) read them.

Run in both forms: as it is (compiled where the extensions are built) and with ``MONADL_PURE=1``."""

from __future__ import annotations

import importlib
import inspect
import json
import os
import pickle
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import monadl

# The modules of the API reference (.ci/run's pdoc command, the README).
PUBLIC_MODULES = [
    "monadl",
    "monadl.nn",
    "monadl.data",
    "monadl.checkpoint",
    "monadl.gradcheck",
    "monadl.distributed",
    "monadl.interop",
]
MYPYC_FILLER = "mypyc filler docstring"  # what mypyc gives a class compiled as a Python class


def _public_callables() -> list[tuple[str, str]]:
    """(module, name) of every function and class in the ``__all__`` of a public module."""
    found = []
    for module_name in PUBLIC_MODULES:
        module = importlib.import_module(module_name)
        for name in module.__all__:
            obj = getattr(module, name)
            if inspect.isclass(obj) or inspect.isroutine(obj):
                found.append((module_name, name))
    return found


PUBLIC = _public_callables()
IDS = [f"{module}.{name}" for module, name in PUBLIC]


def _get(module: str, name: str) -> Any:
    return getattr(importlib.import_module(module), name)


def _is_protocol(obj: object) -> bool:
    # (A protocol cannot be instantiated: its signature is (*args, **kwargs), from source too.)
    return bool(getattr(obj, "_is_protocol", False))


def _keeps_exception_constructor(obj: object) -> bool:
    """An exception class with the builtin constructor: no signature to show, from source too."""
    return inspect.isclass(obj) and issubclass(obj, BaseException) and "__init__" not in vars(obj)


def test_the_public_modules_export_functions_and_classes() -> None:
    names = {name for _, name in PUBLIC}
    assert {"train_blocking", "Executor", "ArrayLayer", "batchable", "ShapeError"} <= names, names


@pytest.mark.parametrize(("module", "name"), PUBLIC, ids=IDS)
def test_every_public_function_and_class_has_its_docstring(module: str, name: str) -> None:
    obj = _get(module, name)
    # Its own: inspect.getdoc would give a class a base class's docstring.
    own = obj.__doc__
    assert isinstance(own, str) and own.strip() and own != MYPYC_FILLER, f"{module}.{name}: {own!r}"
    assert inspect.getdoc(obj), f"{module}.{name}"


@pytest.mark.parametrize(("module", "name"), PUBLIC, ids=IDS)
def test_every_public_function_and_class_has_its_real_signature(module: str, name: str) -> None:
    obj = _get(module, name)
    if _is_protocol(obj):
        pytest.skip("a protocol cannot be instantiated")
    try:
        signature = inspect.signature(obj)
    except ValueError:
        assert _keeps_exception_constructor(obj), f"{module}.{name}: no signature"
        return
    assert str(signature) != "(*args, **kwargs)", f"{module}.{name}"
    # The real one is the source's, annotated (every public function is); a compiled function's
    # text signature has no annotations.
    unannotated = [p.name for p in signature.parameters.values() if p.annotation is inspect.Parameter.empty]
    assert not unannotated, f"{module}.{name}{signature}: {unannotated} without annotations"
    if inspect.isroutine(obj):
        assert signature.return_annotation is not inspect.Signature.empty, f"{module}.{name}{signature}"


@pytest.mark.parametrize(("module", "name"), PUBLIC, ids=IDS)
def test_a_public_function_is_a_python_function_of_its_module_with_its_source(module: str, name: str) -> None:
    """``inspect.getsource`` (the API reference's source link) finds its ``def``; the module that
    defines it holds it (so that it pickles by name, as Ray sends functions)."""
    obj = _get(module, name)
    if inspect.isclass(obj):
        pytest.skip("a class (one compiled with mypyc lives in an extension: no source to find)")
    assert inspect.isfunction(obj), f"{module}.{name}: {type(obj).__name__}"
    source = inspect.getsource(obj)
    assert re.search(rf"^\s*def {obj.__name__}\(", source, re.MULTILINE), source[:300]
    assert getattr(sys.modules[obj.__module__], obj.__name__) is obj
    assert pickle.loads(pickle.dumps(obj)) is obj


# Prints, as JSON, each public function's and class's docstring and signature.
REPORT = """
import importlib, inspect, json
out = {}
for module_name, name in %r:
    obj = getattr(importlib.import_module(module_name), name)
    try:
        signature = str(inspect.signature(obj))
    except ValueError as e:
        signature = type(e).__name__
    out[module_name + "." + name] = [inspect.getdoc(obj), signature]
print(json.dumps(out))
"""


def _report(**env: str) -> dict[str, list[str | None]]:
    environ = {k: v for k, v in os.environ.items() if k != "MONADL_PURE"}
    environ["PYTHONPATH"] = str(Path(monadl.__file__).parent.parent)
    environ.update(env)
    done = subprocess.run(
        [sys.executable, "-c", REPORT % (PUBLIC,)],
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    report: dict[str, list[str | None]] = json.loads(done.stdout)
    # (a default's repr may hold an address)
    return json.loads(re.sub(r" at 0x[0-9a-f]+", "", json.dumps(report)))  # type: ignore[no-any-return]


def test_the_compiled_engine_documents_its_names_as_the_sources_do() -> None:
    if not monadl.compiled():
        pytest.skip("the engine runs from its sources here")
    compiled, source = _report(), _report(MONADL_PURE="1")
    differ = {k: (compiled[k], source[k]) for k in source if compiled.get(k) != source[k]}
    assert compiled.keys() == source.keys() and not differ, json.dumps(differ, indent=1)[:4000]
