"""Whether the engine runs compiled (mypyc) or as Python source: decided once, on ``import monadl``,
before any other module of the package is imported.

``setup.py`` compiles the engine's hot modules with mypyc where a C compiler is present, into one
group (a shared library, ``monadl/_engine__mypyc.*.so``, and one extension per module beside its
``.py``), and records them in ``monadl/_engine.json`` with a hash of the source each was compiled
from. Compiled modules call each other natively, so the engine runs all compiled or all from source,
never mixed:

* ``MONADL_PURE=1`` (any value but empty or ``0``): every ``monadl`` module from its ``.py``, even
  where extensions are built;
* a stale build (a compiled module's ``.py`` differs from the source it was compiled from: edited in
  an editable install, another branch checked out) or an incomplete one: every module from its
  ``.py`` too, with one :class:`StaleBuildWarning`; rebuild with ``pip install -e .``;
* otherwise the extensions, where they are installed.

Running from source is done by a meta path finder, first on ``sys.meta_path``, that finds
``monadl.*`` modules among ``.py`` files only. :func:`compiled` says which way the engine runs.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import warnings
from collections.abc import Sequence
from importlib.abc import MetaPathFinder
from importlib.machinery import EXTENSION_SUFFIXES, SOURCE_SUFFIXES, FileFinder, ModuleSpec, SourceFileLoader
from types import ModuleType
from typing import Any

__all__ = ["StaleBuildWarning", "compiled", "reason"]

_PACKAGE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(_PACKAGE)
_MANIFEST = os.path.join(_PACKAGE, "_engine.json")


class StaleBuildWarning(RuntimeWarning):
    """The compiled extensions do not match the sources: the engine runs from the sources."""


class SourceFinder(MetaPathFinder):
    """Finds ``monadl``'s submodules among ``.py`` files only (never an extension module)."""

    def __init__(self) -> None:
        self._finders: dict[str, FileFinder] = {}

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if not fullname.startswith("monadl.") or path is None:
            return None
        for entry in path:
            finder = self._finders.get(entry)
            if finder is None:
                finder = self._finders[entry] = FileFinder(entry, (SourceFileLoader, SOURCE_SUFFIXES))
            spec = finder.find_spec(fullname, target)
            if spec is not None and spec.loader is not None:
                return spec
        return None  # not a source module: left to the other finders


def _built() -> dict[str, str]:
    """The extension modules in the package: their path without suffix, relative to the package's
    parent (``monadl/do/do``), to the file's path."""
    found: dict[str, str] = {}
    for directory, subdirectories, files in os.walk(_PACKAGE):
        subdirectories[:] = [d for d in subdirectories if d != "__pycache__"]
        for name in files:
            for suffix in EXTENSION_SUFFIXES:
                if name.endswith(suffix):
                    stem = os.path.join(directory, name[: -len(suffix)])
                    found[os.path.relpath(stem, _ROOT).replace(os.sep, "/")] = os.path.join(directory, name)
                    break
    return found


def _record() -> dict[str, Any] | None:
    """The build record, ``monadl/_engine.json``, or None where it cannot be read."""
    try:
        with open(_MANIFEST, encoding="utf-8") as f:
            record = json.load(f)
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def _stale(built: dict[str, str], record: dict[str, Any] | None) -> str | None:
    """Why the extensions in ``built`` must not run, or None if they match the sources in ``record``."""
    unreadable = "extension modules without a readable build record (monadl/_engine.json)"
    if record is None:
        return unreadable
    try:
        sources: dict[str, str] = record["modules"]
        group = record["group"].replace(".", "/") + "__mypyc"
    except (KeyError, TypeError, AttributeError):
        return unreadable
    natives = record.get("native", {})  # hand-written C modules, beside mypyc's (monadl/_native.c)
    if not isinstance(natives, dict):
        return unreadable
    expected = {path.removesuffix(".py") for path in sources} | {group}
    expected |= {path.removesuffix(".c") for path in natives}
    if set(built) != expected:
        odd = sorted(set(built) ^ expected)
        more = " ..." if len(odd) > 3 else ""
        return f"an incomplete build: {', '.join(odd[:3])}{more} missing or unexpected"
    for path, digest in {**sources, **natives}.items():
        try:
            with open(os.path.join(_ROOT, path), "rb") as f:
                source = f.read()
        except OSError:
            return f"{path} is missing"
        if hashlib.sha256(source).hexdigest() != digest:
            return f"{path} changed since it was compiled"
    return None


def _choose() -> tuple[bool, str, dict[str, Any]]:
    """Decides how the engine runs, and installs the source finder unless it runs compiled; the
    build record's docs of the compiled modules where it runs compiled."""
    built = _built()
    why: str | None
    if os.environ.get("MONADL_PURE", "") not in ("", "0"):
        why = "MONADL_PURE is set"
    elif not built:
        return False, "no compiled extensions are installed", {}
    else:
        record = _record()
        stale = _stale(built, record)
        if stale is None and record is not None:
            docs = record.get("docs")
            return True, "compiled with mypyc", docs if isinstance(docs, dict) else {}
        why = f"stale build: {stale}"
        warnings.warn(
            f"monadl: the compiled engine is out of date ({stale}); running the pure-Python engine. "
            "Rebuild it (pip install -e .), or set MONADL_PURE=1.",
            StaleBuildWarning,
            stacklevel=4,
        )
    if not any(isinstance(finder, SourceFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, SourceFinder())
    return False, why, {}


_COMPILED, _REASON, _DOCS = _choose()


def compiled() -> bool:
    """Whether the engine runs compiled with mypyc (else every module runs from its ``.py``)."""
    return _COMPILED


def reason() -> str:
    """Why the engine runs as it does (``"MONADL_PURE is set"``, ``"stale build: ..."``, ...)."""
    return _REASON


def docs() -> dict[str, Any]:
    """The docstrings and signatures of the compiled modules' public functions and classes, by
    module and name, as the build recorded them from the sources (empty unless compiled): mypyc
    keeps neither, ``monadl/_documented.py`` gives them back."""
    return _DOCS
