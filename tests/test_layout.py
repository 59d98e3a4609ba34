"""The package's layout: no import cycles inside ``monadl``, and dependencies that point one way.

Read from the sources (not from what happens to be imported): every ``import`` and ``from ...
import`` of a ``monadl`` module that runs, at module level or inside a function, is an edge; imports
under ``if TYPE_CHECKING:`` are for the type checker only and are not.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "monadl"

LAYERS = {
    # package: the packages it may import (its own modules aside)
    "monadl.typeclasses": set(),
    "monadl.runtime": set(),
    "monadl.do": {"monadl.typeclasses", "monadl.runtime"},
    "monadl.tape": {"monadl.do", "monadl.typeclasses", "monadl.runtime"},
    "monadl.dsl": {"monadl.tape", "monadl.do", "monadl.typeclasses", "monadl.runtime"},
}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports(path: Path, known: set[str]) -> set[str]:
    """The ``monadl`` modules that ``path`` imports at run time."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for branch in node.orelse:
                visit(branch)
            return
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith("monadl"))
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("monadl"):
            for alias in node.names:  # ``from monadl.dsl import primitives``: the submodule
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in known else node.module)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(), str(path)))
    return found


def graph() -> dict[str, set[str]]:
    found = modules()
    known = set(found)
    return {name: imports(path, known) - {name} for name, path in found.items()}


def cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """A cycle of ``edges`` (its modules in order, the first repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the path, 2: done
    for start in sorted(edges):
        if start in state:
            continue
        path = [start]
        pending = [iter(sorted(edges.get(start, ())))]
        state[start] = 1
        while pending:
            child = next(pending[-1], None)
            if child is None:
                state[path.pop()] = 2
                pending.pop()
                continue
            if state.get(child) == 1:
                return [*path[path.index(child) :], child]
            if child not in state:
                state[child] = 1
                path.append(child)
                pending.append(iter(sorted(edges.get(child, ()))))
    return None


def test_the_cycle_finder_finds_cycles() -> None:
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_the_import_reader_reads_runtime_imports_only(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "import monadl.do.do\n"
        "from monadl.dsl import ops\n"
        "if TYPE_CHECKING:\n    from monadl.tape import backward\n"
        "def f():\n    from monadl.typeclasses.sparse import add\n"
    )
    known = {"monadl.dsl.ops", "monadl.typeclasses.sparse", "monadl.do.do", "monadl.tape.backward"}
    assert imports(source, known) == {"monadl.do.do", "monadl.dsl.ops", "monadl.typeclasses.sparse"}


def test_monadl_has_no_import_cycles() -> None:
    edges = graph()
    # The package's __init__ modules re-export their modules: an edge from a module to its own
    # package's __init__ would be a cycle by construction, and none imports one.
    found = cycle(edges)
    assert found is None, "import cycle: " + " -> ".join(found or [])


@pytest.mark.parametrize("package", sorted(LAYERS))
def test_dependencies_point_one_way(package: str) -> None:
    """``dsl -> tape -> do``, with ``typeclasses`` and ``runtime`` used by all and depending on
    nothing of monadl."""
    allowed = LAYERS[package] | {package, "monadl._compiled"}  # (the build's decision: below all)
    wrong = {
        (name, target)
        for name, targets in graph().items()
        if name == package or name.startswith(package + ".")
        for target in targets
        if not any(target == p or target.startswith(p + ".") for p in allowed)
    }
    assert not wrong, f"{package} imports outside its layer: {sorted(wrong)}"


def test_the_build_decision_imports_nothing_of_monadl() -> None:
    """``monadl._compiled`` (whether the engine runs compiled) is below every layer: any may ask it
    (the optimizers, whether the native kernels are loaded), so it imports nothing of monadl."""
    assert graph().get("monadl._compiled", set()) == set()


ROOMS = {
    # a room of monadl.dsl: the rooms, or modules of them, it may import (besides LAYERS' packages)
    "monadl.dsl.core": {
        "monadl.dsl.fused",
        "monadl.dsl.ops.operators",  # the ops behind the layers' operators
        "monadl.dsl.ops.registry",  # (what operators.py declares its ops with)
        "monadl.dsl.ops.shape_rules",  # what the static walk reads
        "monadl.dsl.learning",  # a layer's train and predict run a step; a weight holds its optimizer
    },
    "monadl.dsl.ops": {
        "monadl.dsl.core",
        "monadl.dsl.fused",
        "monadl.dsl.learning.training",  # batch norm reads the step's training mode
    },
    "monadl.dsl.learning": {
        "monadl.dsl.fused",
        "monadl.dsl.core.weights",  # apply_gradients updates weights
    },
    "monadl.dsl.extend": {"monadl.dsl.core", "monadl.dsl.ops", "monadl.dsl.learning", "monadl.dsl.fused"},
    "monadl.dsl.fused": set(),
}
"""``monadl.dsl`` by role: the layer types and operators (core), the ops by family (ops), training
(learning) and the extension points (extend: a user's op, ``@batchable``, direct style), which
nothing else in ``monadl.dsl`` imports."""


def _room(module: str) -> str | None:
    return next((r for r in ROOMS if module == r or module.startswith(r + ".")), None)


def test_every_dsl_module_is_in_a_room() -> None:
    loose = {m for m in modules() if m.startswith("monadl.dsl.") and _room(m) is None}
    assert not loose, f"modules of monadl.dsl in no room of ROOMS: {sorted(loose)}"


@pytest.mark.parametrize("room", sorted(ROOMS))
def test_the_rooms_of_dsl_import_what_their_role_needs(room: str) -> None:
    allowed = ROOMS[room]
    wrong = {
        (name, target)
        for name, targets in graph().items()
        if _room(name) == room
        for target in targets
        if target.startswith("monadl.dsl.")
        and _room(target) != room
        and not any(target == a or target.startswith(a + ".") for a in allowed)
    }
    assert not wrong, f"{room} imports outside what its role needs: {sorted(wrong)}"
