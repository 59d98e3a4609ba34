"""Labelled binary trees: the sentences of the Stanford Sentiment Treebank and their synthetic twins.

A leaf holds a word; an inner node holds exactly two children. Every node has a sentiment label
(0-4 in SST: very negative .. very positive).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Tree:
    """A labelled binary tree: a leaf (``word`` set, no children) or a node with two children."""

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
