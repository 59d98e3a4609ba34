"""Gives the compiled engine's public names back their docstrings and real signatures.

mypyc keeps neither: a compiled function has no ``__doc__`` and a text signature without
annotations (none at all where a default is not a literal), a compiled class has no docstring, and
an exception class compiled as a Python class has mypyc's filler docstring. The build records them
from the sources (``setup.py``, in ``monadl/_engine.json``); :func:`restore` gives them back to the
names a public module exports, so that ``help()``, ``inspect`` and the API reference show what the
pure-Python engine shows:

* a class gets its ``__doc__``, and a ``__signature__`` made from its ``__init__``'s source;
* a function is replaced, in the public module and in the module that defines it, by an interpreted
  function with its signature, docstring, module and name that calls it (a compiled function takes
  no attributes). Its code is placed at the ``def``'s line of the source file, so that
  ``inspect.getsource`` and the API reference's source links find it. Compiled callers still call
  the compiled function directly; a call through the public name costs one Python call more.
  The names the module imports for type checking only are imported into it, as pdoc does for a
  module whose source it can read, so that the annotations resolve.

It is used only where the engine runs compiled (see ``monadl/__init__.py``).
"""

from __future__ import annotations
import __future__

import inspect
import os
import sys
from collections.abc import Mapping, MutableMapping
from types import BuiltinFunctionType, FunctionType, ModuleType
from typing import Any

# Annotations stay strings, as in the sources (every module has ``from __future__ import annotations``).
_FLAGS = __future__.annotations.compiler_flag
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def restore(namespace: MutableMapping[str, Any], docs: Mapping[str, Any]) -> None:
    """Gives the compiled functions and classes that ``namespace`` (a public module's globals)
    exports in its ``__all__`` their docstrings and signatures from ``docs``, the build record's
    (by defining module: its public ``names`` and its ``type_checking`` imports)."""
    wrapped: set[str] = set()
    for name in namespace.get("__all__", ()):
        obj = namespace.get(name)
        module = sys.modules.get(str(getattr(obj, "__module__", "")))
        names = docs.get(module.__name__, {}).get("names", {}) if module is not None else {}
        record = names.get(str(getattr(obj, "__name__", "")))
        if module is None or record is None:
            continue
        if isinstance(obj, type):
            _restore_class(obj, module, record)
        elif isinstance(obj, BuiltinFunctionType) and "call" in record:
            compiled: BuiltinFunctionType = obj
            function = _interpreted(compiled, module, record)
            namespace[name] = function
            if getattr(module, compiled.__name__, None) is compiled:  # as where it runs from source
                setattr(module, compiled.__name__, function)
            wrapped.add(module.__name__)
    for module_name in sorted(wrapped):
        _import_type_checking(sys.modules[module_name], docs[module_name].get("type_checking", ""))


def _restore_class(cls: type, module: ModuleType, record: Mapping[str, Any]) -> None:
    if record.get("doc") is not None:
        cls.__doc__ = record["doc"]
    init = record.get("init")
    if init is not None and "__signature__" not in vars(cls):
        cls.__signature__ = _ClassSignature(cls, module, init)  # type: ignore[attr-defined]


def _interpreted(
    function: BuiltinFunctionType, module: ModuleType, record: Mapping[str, Any]
) -> FunctionType:
    """An interpreted function with ``function``'s source signature and docstring that calls it."""
    interpreted = _compile(module, record, function.__name__, f"return __impl({record['call']})", function)
    interpreted.__doc__ = record.get("doc")
    return interpreted


def _compile(
    module: ModuleType, record: Mapping[str, Any], name: str, body: str, impl: object
) -> FunctionType:
    """``def name(<record's parameters>) -> <its return annotation>: <body>``, compiled at its line
    of the module's source file, where ``body`` calls ``impl`` as ``__impl``. It is made by a
    factory ``__make(__impl)`` run in the module's globals, so that its defaults are evaluated and
    its annotations resolved there, and nothing is added to the module's namespace but
    ``__builtins__``."""
    returns = f" -> {record['returns']}" if record["returns"] is not None else ""
    line = max(int(record["line"]), 2)
    source = (
        "\n" * (line - 2)
        + f"def __make(__impl):\n def {name}({record['args']}){returns}: {body}\n return {name}\n"
    )
    local: dict[str, Any] = {}
    _run(source, module, local)
    function = local["__make"](impl)
    assert isinstance(function, FunctionType)
    function.__qualname__ = name
    return function


def _import_type_checking(module: ModuleType, imports: str) -> None:
    """Runs a module's imports for type checking only, now that the package is imported."""
    try:
        _run(imports, module, vars(module))
    except ImportError:
        pass  # (those annotations stay unresolved, as where pdoc cannot read a module's source)


def _run(source: str, module: ModuleType, local: dict[str, Any]) -> None:
    """Runs ``source`` as part of ``module``'s source file, in its globals. (``exec`` adds
    ``__builtins__`` to an extension module's globals: a function defined there needs it, since C
    code it calls, an import by NumPy say, looks it up in the calling frame's globals.)"""
    code = compile(source, _source_file(module), "exec", flags=_FLAGS, dont_inherit=True)
    exec(code, vars(module), local)


def _source_file(module: ModuleType) -> str:
    """The ``.py`` file a compiled module was built from (its extension's ``__file__`` does not
    name it)."""
    return os.path.join(_ROOT, *module.__name__.split(".")) + ".py"


class _ClassSignature:
    """A compiled class's ``__signature__``: its ``__init__``'s, less ``self``, made from the source
    when first asked for. ``inspect.signature`` reads ``__signature__`` before all else, on
    subclasses too: for any other class, and for instances, it is None (look further)."""

    def __init__(self, cls: type, module: ModuleType, init: Mapping[str, Any]) -> None:
        self._cls = cls
        self._module = module
        self._init = init
        self._signature: inspect.Signature | None = None

    def __get__(self, instance: object, owner: type | None = None) -> inspect.Signature | None:
        if instance is not None or owner is not self._cls:
            return None
        if self._signature is None:
            init = _compile(self._module, self._init, "__init__", "pass", None)
            signature = inspect.signature(init)
            self._signature = signature.replace(parameters=list(signature.parameters.values())[1:])
        return self._signature
