"""A griffe extension for the docs site: monadl's docstrings use Sphinx's roles (``:func:`x```) and
literal blocks (``::``); Markdown shows neither. A role becomes a link to the object where the
reference renders it, and plain code where it does not (an optional cross-reference, which never
fails the build); a paragraph's closing ``::`` becomes ``:`` (its indented block is already code).
"""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(?:func|class|meth|mod|attr|data|exc|obj):`(~?)([\w.]+)(?:\(\))?`")
LITERAL = re.compile(r"(\S)::$", re.MULTILINE)


def _target(obj: griffe.Object, name: str) -> str:
    """The full path ``name`` most likely means, read from ``obj``: a dotted name is taken as it is;
    a bare or partly qualified one is looked up in ``obj``'s class, then its module."""
    if name.startswith("monadl."):
        return name
    scopes = [obj, obj.parent, obj.module] if obj.parent is not None else [obj, obj.module]
    head = name.split(".")[0]
    for scope in scopes:
        if isinstance(scope, griffe.Object | griffe.Alias) and head in scope.members:
            return f"{scope.path}.{name}"
    return f"{obj.module.path}.{name}"


def _rewrite(obj: griffe.Object, text: str) -> str:
    def link(match: re.Match[str]) -> str:
        short, name = match.group(1), match.group(2)
        title = name.rsplit(".", 1)[-1] if short else name
        return f'<autoref identifier="{_target(obj, name)}" optional><code>{title}</code></autoref>'

    return LITERAL.sub(r"\1:", ROLE.sub(link, text))


class SphinxRoles(griffe.Extension):
    """Rewrites every docstring of the loaded package (see the module)."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        stack: list[griffe.Object] = [pkg]
        while stack:
            obj = stack.pop()
            if obj.docstring is not None:
                obj.docstring.value = _rewrite(obj, obj.docstring.value)
            stack.extend(m for m in obj.members.values() if not m.is_alias)  # type: ignore[misc]
