"""Labelled binary trees: the sentences of the Stanford Sentiment Treebank and their synthetic twins.

A leaf holds a word; an inner node holds exactly two children. Every node has a sentiment label
(0-4 in SST: very negative .. very positive).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True, eq=False, repr=False)
class Tree:
    """A labelled binary tree: a leaf (``word`` set, no children) or a node with two children.

    Equality, hashing, ``repr`` and pickling walk the tree with a loop, not recursion, so a tree
    of any depth has them (a degenerate parse thousands of levels deep included)."""

    label: int
    word: str | None = None
    left: Tree | None = None
    right: Tree | None = None

    def __post_init__(self) -> None:
        leaf = self.word is not None
        if leaf == (self.left is not None or self.right is not None) or (self.left is None) != (
            self.right is None
        ):
            raise ValueError("a Tree is either a leaf with a word, or a node with two children")

    @property
    def is_leaf(self) -> bool:
        return self.word is not None

    def leaves(self) -> Iterator[str]:
        """The words, left to right."""
        stack: list[Tree] = [self]
        while stack:
            node = stack.pop()
            if node.word is not None:
                yield node.word
            else:
                assert node.left is not None and node.right is not None
                stack.append(node.right)
                stack.append(node.left)

    def nodes(self) -> Iterator[Tree]:
        """Every node, in post-order (children before their parent)."""
        stack: list[tuple[Tree, bool]] = [(self, False)]
        while stack:
            node, expanded = stack.pop()
            if expanded or node.word is not None:
                yield node
            else:
                assert node.left is not None and node.right is not None
                stack.append((node, True))
                stack.append((node.right, False))
                stack.append((node.left, False))

    def height(self) -> int:
        """0 for a leaf; 1 + the taller child's height otherwise."""
        heights: dict[int, int] = {}
        for node in self.nodes():
            if node.left is None or node.right is None:
                heights[id(node)] = 0
            else:
                heights[id(node)] = 1 + max(heights[id(node.left)], heights[id(node.right)])
        return heights[id(self)]

    def __len__(self) -> int:
        """The number of leaves."""
        return sum(1 for _ in self.leaves())

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Tree):
            return NotImplemented
        pairs: list[tuple[Tree, Tree]] = [(self, other)]
        while pairs:
            a, b = pairs.pop()
            if a is b:
                continue
            if a.label != b.label or a.word != b.word:
                return False
            if a.left is not None and a.right is not None and b.left is not None and b.right is not None:
                pairs.append((a.right, b.right))
                pairs.append((a.left, b.left))
        return True

    def __hash__(self) -> int:
        return hash(tuple(self._post_order()))

    def __repr__(self) -> str:
        return self.render(
            lambda leaf: f"Tree(label={leaf.label!r}, word={leaf.word!r})",
            lambda node: (f"Tree(label={node.label!r}, left=", ", right=", ")"),
        )

    def render(self, leaf: Callable[[Tree], str], node: Callable[[Tree], tuple[str, str, str]]) -> str:
        """The tree as text, by a loop: ``leaf(t)`` for a leaf, and for a node its children's texts
        between the three parts of ``node(t)`` (before, between, after)."""
        parts: list[str] = []
        stack: list[Tree | str] = [self]
        while stack:
            item = stack.pop()
            if isinstance(item, str):
                parts.append(item)
            elif item.left is None or item.right is None:
                parts.append(leaf(item))
            else:
                before, between, after = node(item)
                parts.append(before)
                stack.extend((after, item.right, between, item.left))
        return "".join(parts)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_from_post_order, (self._post_order(),))

    def _post_order(self) -> list[tuple[Any, str | None]]:
        """Every node's label and word (None for an inner node), children before their parent."""
        return [(node.label, node.word) for node in self.nodes()]


def _from_post_order(nodes: list[tuple[Any, str | None]]) -> Tree:
    """The tree of ``Tree._post_order``'s list (pickling's constructor)."""
    stack: list[Tree] = []
    for label, word in nodes:
        if word is not None:
            stack.append(Tree(label, word))
        else:
            right = stack.pop()
            left = stack.pop()
            stack.append(Tree(label, left=left, right=right))
    (tree,) = stack
    return tree
