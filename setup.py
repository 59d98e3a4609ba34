"""Builds monadl, compiling the engine's hot modules with mypyc where a C compiler is present.

Everything else is in ``pyproject.toml``; this file holds what setuptools cannot declare there: the
mypyc extensions. The same sources run interpreted where no extension was built (no C compiler, or
mypyc could not compile them) and under ``MONADL_PURE=1`` (see ``monadl/_compiled.py``).

``MONADL_BUILD`` picks the build: ``auto`` (default: compiled where possible, else pure with a
warning), ``compiled`` (a failure to compile fails the install: CI) or ``pure`` (no extensions);
``MONADL_OPT_LEVEL`` (3) and ``MONADL_MULTI_FILE`` (1) are mypyc's ``opt_level`` and ``multi_file``;
``MONADL_MYPY_VERBOSE=1`` adds mypy's verbose log (every module it reads) to the build's output
(``pip -v`` shows it).

The compiled modules form one mypyc group: one shared library, ``monadl/_engine__mypyc.*.so``, and
one small shim extension per module, beside its ``.py``. Compiled modules call each other natively,
so they are built, installed and run all together or not at all: a failed compile removes every
extension of the build, and ``monadl/_engine.json``, written last, records the hash of each source
as it was compiled (``monadl/_compiled.py`` runs the extensions only if the sources still match).
It also records the docstrings and signatures of each module's public functions and classes, which
mypyc does not keep: ``monadl/_documented.py`` gives them back to the public names at import.
mypyc runs when ``build_ext`` does, once per build (not for every hook pip calls).
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from importlib.machinery import EXTENSION_SUFFIXES
from typing import Any

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

# The one list of modules compiled with mypyc. Kept interpreted: monadl/dsl/core/deep_learning.py (a
# runtime_checkable protocol), the public surface that validates its own arguments (most op
# families in monadl/dsl/ops/, which hold their public functions, and monadl/dsl/core/weights.py:
# compiled, mypyc's argument checks of ints, strings and floats pre-empt their messages, and
# FloatWeight(True) became 1.0), and optimizers (values users may subclass and tests spy on),
# direct, data/, bench/, cli (not hot). Compiled among the ops: monadl/dsl/ops/operators.py (no
# public function), monadl/dsl/core/arguments.py (the ops' argument checks, whose parameters are
# objects), and the families whose rules run on every step of a recurrent or dense model and whose
# public functions take array operands only (which mypyc does not check: NumPy's arrays are not its
# classes), so that they keep their own messages: linalg.py (dense layers, a cell's gates),
# recurrent.py (the cells' gate arithmetic) and monadl/dsl/fused.py (the native kernels' calls); and
# concatenation.py, the concatenation's rules without its public function (a cell's [x; h]).
COMPILED_MODULES = [
    "monadl/do/do.py",
    "monadl/do/graph.py",
    "monadl/do/primitive.py",
    "monadl/runtime/versions.py",
    "monadl/runtime/recent.py",
    "monadl/do/kinds.py",
    "monadl/do/record.py",
    "monadl/do/steps.py",
    "monadl/do/batching.py",
    "monadl/do/bodies.py",
    "monadl/do/scheduler.py",
    "monadl/do/stats.py",
    "monadl/do/executor.py",
    "monadl/tape/backward.py",
    "monadl/typeclasses/backend.py",
    "monadl/typeclasses/sparse.py",
    "monadl/dsl/core/apply.py",
    "monadl/dsl/core/base.py",
    "monadl/dsl/core/layers.py",
    "monadl/dsl/core/indices.py",
    "monadl/dsl/core/arguments.py",
    "monadl/dsl/ops/operators.py",
    "monadl/dsl/ops/linalg.py",
    "monadl/dsl/ops/concatenation.py",
    "monadl/dsl/ops/recurrent.py",
    "monadl/dsl/fused.py",
    "monadl/dsl/extend/operation.py",
    "monadl/dsl/learning/finite.py",
    "monadl/dsl/learning/training.py",
]

# Hand-written C extensions (module -> source), built and recorded with the mypyc group (all or
# none): kernels NumPy cannot fuse, each equal bit for bit to a NumPy rule that runs where they are
# not built (see monadl/_native.c), and a NumPy memory handler that keeps a step's large blocks for
# the next (monadl/_memory.c; not built, NumPy allocates as always).
NATIVE_MODULES = {"monadl._native": "monadl/_native.c", "monadl._memory": "monadl/_memory.c"}

# Compiler flags of the native modules (GCC and Clang): no contraction of a product and a sum into a
# fused multiply-add (NumPy rounds the product: the results would differ), and no errno from sqrt
# (which keeps its loop from vectorizing); the loops vectorize at -O3.
NATIVE_FLAGS = ["-O3", "-ffp-contract=off", "-fno-math-errno"]

# The group's shared library (``monadl/_engine__mypyc.<suffix>``: inside the package, so that an
# editable install finds it) and the build's record, read by monadl/_compiled.py.
GROUP = "monadl._engine"
MANIFEST = "monadl/_engine.json"
ROOT = os.path.dirname(os.path.abspath(__file__))

# mypy's configuration for the build (mypyc type-checks what it compiles), in place of any
# configuration file where the build runs: the project's mypy.ini is for development (strict) and is
# not in the sdist. mypy reads the sources and the packages whose types the compiled code uses, the
# build's own requirements ([build-system] in pyproject.toml), and nothing else: every other import
# is Any to the build, whether or not its package is installed, so that every machine compiles the
# same code in about the same time. (Followed, array_api_compat's imports for type checking lead
# into torch, jax, dask and cupy where they are installed: thousands of files, and minutes.) Stub
# files (the standard library's, NumPy's) are read wherever they are imported.
MYPY_CONFIG = """\
[mypy]
follow_imports = skip
ignore_missing_imports = True

[mypy-monadl.*,numpy.*,returns.*,typing_extensions.*,mypy_extensions.*]
follow_imports = normal
ignore_missing_imports = False
"""


def _mode() -> str:
    mode = os.environ.get("MONADL_BUILD", "auto").strip().lower() or "auto"
    if mode not in ("auto", "compiled", "pure"):
        sys.exit(f"MONADL_BUILD={mode!r}: expected auto, compiled or pure")
    return mode


def _give_up(why: str) -> None:
    if _mode() == "compiled":
        sys.exit(f"monadl: MONADL_BUILD=compiled, but {why}")
    print(f"WARNING: monadl: {why}; installing the pure-Python engine", file=sys.stderr)


def _read(path: str) -> bytes:
    with open(os.path.join(ROOT, path), "rb") as f:
        return f.read()


def _signature(function: ast.FunctionDef) -> dict[str, Any]:
    """A function's parameters and return annotation as source text, and its first line."""
    args = function.args
    call = [a.arg for a in args.posonlyargs + args.args]
    call += [f"*{args.vararg.arg}"] if args.vararg else []
    call += [f"{a.arg}={a.arg}" for a in args.kwonlyargs]
    call += [f"**{args.kwarg.arg}"] if args.kwarg else []
    return {
        "line": min([function.lineno] + [d.lineno for d in function.decorator_list]),
        "args": ast.unparse(args),
        "returns": None if function.returns is None else ast.unparse(function.returns),
        "call": ", ".join(call),  # the arguments passed on, each as it was given
    }


def _is_overload(function: ast.FunctionDef) -> bool:
    return any(ast.unparse(d) in ("overload", "typing.overload") for d in function.decorator_list)


def _functions(body: list[ast.stmt]) -> dict[str, ast.FunctionDef]:
    """The functions defined in ``body``, by name (an overloaded one's implementation)."""
    return {s.name: s for s in body if isinstance(s, ast.FunctionDef) and not _is_overload(s)}


def _docs(source: bytes) -> dict[str, Any]:
    """The docstrings and signatures of a module's public functions and classes (``__init__``'s
    for a class), by name, and its imports for type checking only (the names its annotations
    use): what mypyc drops and ``monadl/_documented.py`` gives back."""
    tree = ast.parse(source)
    names: dict[str, dict[str, Any]] = {}
    for name, function in _functions(tree.body).items():
        if not name.startswith("_"):
            names[name] = {"doc": ast.get_docstring(function, clean=False), **_signature(function)}
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            init = _functions(node.body).get("__init__")
            names[node.name] = {
                "doc": ast.get_docstring(node, clean=False),
                "init": None if init is None else _signature(init),
            }
    type_checking = [
        ast.unparse(statement)
        for node in tree.body
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")
        for statement in node.body
        if isinstance(statement, (ast.Import, ast.ImportFrom))
    ]
    return {"names": names, "type_checking": "\n".join(type_checking)}


def _has_c_compiler() -> bool:
    """Whether the C compiler that would build the extensions compiles a trivial file (a second
    where mypyc would spend ten before the compiler failed)."""
    from setuptools._distutils.ccompiler import new_compiler
    from setuptools._distutils.sysconfig import customize_compiler

    compiler: Any = new_compiler()
    customize_compiler(compiler)
    with tempfile.TemporaryDirectory() as tmp:
        source = os.path.join(tmp, "probe.c")
        with open(source, "w") as f:
            f.write("int monadl_probe(void) { return 0; }\n")
        try:
            compiler.compile([source], output_dir=tmp)
        except Exception:  # noqa: BLE001 - no compiler, or a broken one: a pure install
            return False
    return True


def _mypyc_extensions() -> tuple[list[Any], dict[str, Any]]:
    """The extensions, and the build record of the sources mypyc compiles into them (their hashes
    and docs); none, with a warning, where they cannot be built."""
    try:
        from mypyc.build import mypycify
    except ImportError:
        _give_up("mypyc is not installed")
        return [], {}
    try:  # the native modules read NumPy's array struct (its C API): NumPy is a build requirement
        import numpy
    except ImportError:
        _give_up("NumPy, a build requirement, is not installed where the build runs")
        return [], {}
    if not _has_c_compiler():
        _give_up("no working C compiler")
        return [], {}
    sources = {path: _read(path) for path in COMPILED_MODULES}  # what mypyc reads next
    record = {
        "modules": {path: hashlib.sha256(source).hexdigest() for path, source in sources.items()},
        "docs": {
            path.removesuffix(".py").replace("/", "."): _docs(source) for path, source in sources.items()
        },
    }
    verbose = ["--verbose"] if os.environ.get("MONADL_MYPY_VERBOSE", "") not in ("", "0") else []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            config = os.path.join(tmp, "mypy.ini")
            with open(config, "w") as f:
                f.write(MYPY_CONFIG)
            extensions: list[Any] = mypycify(
                ["--config-file", config, *verbose, *COMPILED_MODULES],  # mypy's command line
                group_name=GROUP,
                opt_level=os.environ.get("MONADL_OPT_LEVEL", "3"),
                # One C file per module, compiled in parallel (BuildEngine): 16 s, not 27, on 2
                # cores; the compiled code runs as fast.
                multi_file=os.environ.get("MONADL_MULTI_FILE", "1") != "0",
            )
    except SystemExit as e:  # mypyc reports type or compile errors, then exits
        _give_up(f"mypyc failed to compile the engine (exit status {e.code})")
        return [], {}
    natives = {path: _read(path) for path in NATIVE_MODULES.values()}
    record["native"] = {path: hashlib.sha256(source).hexdigest() for path, source in natives.items()}
    extensions += [
        Extension(name, sources=[path], include_dirs=[numpy.get_include()])
        for name, path in NATIVE_MODULES.items()
    ]
    for extension in extensions:
        # mypyc writes a dotted group's headers under build/monadl/ but its multi_file sources, which
        # include them, under build/ (mypy 2.4): let the compiler look there too.
        extension.include_dirs.append(os.path.join("build", *GROUP.split(".")[:-1]))
    return extensions, record


_METADATA = {"egg_info", "dist_info", "sdist"}
_MYPYC: list[tuple[list[Any], dict[str, Any]]] = []


def _mypyc_once() -> tuple[list[Any], dict[str, Any]]:
    if not _MYPYC:
        _MYPYC.append(_mypyc_extensions())
    return _MYPYC[0]


class BuildEngine(build_ext):
    """``build_ext`` for the mypyc group: mypyc run here, C files compiled in parallel, and all
    extensions or none."""

    def finalize_options(self) -> None:
        self._record: dict[str, Any] = {}
        self._failed: list[str] = []
        # mypyc runs (once) for a build, not for the metadata hooks, whose egg_info lists our sources.
        if self.distribution.ext_modules and not set(self.distribution.commands) <= _METADATA:
            self.distribution.ext_modules, self._record = _mypyc_once()
        super().finalize_options()
        if self.parallel is None:
            self.parallel = os.cpu_count() or 1

    def run(self) -> None:
        # Extensions of an earlier build (other modules, another group) must not linger in the tree.
        if _in_tree(self):
            _remove_built(ROOT)
        super().run()
        if not self.extensions:
            return
        if self._failed:
            _remove_built(self.build_lib)
            if _in_tree(self):
                _remove_built(ROOT)
            _give_up(f"the C compiler failed on {len(self._failed)} of {len(self.extensions)} extensions")
            return
        manifest = {"group": GROUP, "python": sys.implementation.cache_tag, **self._record}
        for root in [self.build_lib] + ([ROOT] if _in_tree(self) else []):
            with open(os.path.join(root, MANIFEST), "w") as f:
                json.dump(manifest, f, indent=1)
                f.write("\n")

    def get_outputs(self) -> list[str]:
        outputs: list[str] = super().get_outputs()
        if self.extensions and not self._failed:
            outputs.append(os.path.join(self.build_lib, MANIFEST))
        return outputs

    def build_extension(self, ext: Any) -> None:
        if ext.name in NATIVE_MODULES and self.compiler.compiler_type == "unix":
            ext.extra_compile_args = NATIVE_FLAGS
        try:
            self._parallel_compile(ext)
        except Exception as e:  # noqa: BLE001 - any compiler failure means a pure install
            print(f"WARNING: monadl: building {ext.name} failed: {str(e)[:300]}", file=sys.stderr)
            self._failed.append(ext.name)

    def _parallel_compile(self, ext: Any) -> None:
        # distutils compiles one extension's sources one after another; with multi_file the group's
        # library has one C file per module: compile them on every core.
        compiler: Any = self.compiler
        original = compiler.compile
        jobs = self.parallel if isinstance(self.parallel, int) else 1

        def compile_all(sources: list[str], *args: Any, **kwargs: Any) -> list[str]:
            if len(sources) < 2 or jobs < 2:
                return list(original(sources, *args, **kwargs))
            with ThreadPoolExecutor(jobs) as pool:
                parts = pool.map(lambda source: original([source], *args, **kwargs), sources)
                return [obj for part in parts for obj in part]

        compiler.compile = compile_all
        try:
            super().build_extension(ext)
        finally:
            compiler.compile = original


def _in_tree(command: build_ext) -> bool:
    """Whether the extensions also go to the source tree (``--inplace``, an editable install)."""
    return bool(command.inplace or getattr(command, "editable_mode", False))


def _remove_built(root: str) -> None:
    """Removes the engine's extensions and the build record under ``root``."""
    package = os.path.join(root, "monadl")
    for directory, _, files in os.walk(package):
        for name in files:
            if any(name.endswith(suffix) for suffix in EXTENSION_SUFFIXES):
                os.remove(os.path.join(directory, name))
    manifest = os.path.join(root, MANIFEST)
    if os.path.exists(manifest):
        os.remove(manifest)


if _mode() == "pure":
    _remove_built(ROOT)  # no build_ext runs: an earlier build's extensions must not stay in the tree
# A placeholder, so that setuptools runs build_ext (and makes a platform wheel); BuildEngine puts
# mypyc's extensions in its place.
_PLACEHOLDER = [] if _mode() == "pure" else [Extension(GROUP + "__mypyc", sources=[])]
setup(ext_modules=_PLACEHOLDER, cmdclass={"build_ext": BuildEngine})
