"""The Tree-LSTM of ``examples/tree_lstm.py`` in PyTorch eager: the benchmark's peers, node by node
(:class:`TorchTreeLstm`, below) and batched by tree level by hand (:class:`TorchLevelTreeLstm`).

The node-by-node peer is the same model with no manual batching: the trees are walked in post-order with a
loop (children before parents, like the example), and every node runs its own small ops:

* a leaf, from its word's embedding ``x``: ``c = x W_c + b_c``, ``h = sigmoid(x W_o + b_o) * tanh(c)``;
* an inner node, from its children ``(h_l, c_l)``, ``(h_r, c_r)``: ``children = [h_l; h_r]``;
  ``i, f_l, f_r, o = sigmoid(children U_g + b_g)``, ``u = tanh(children U_u + b_u)``,
  ``c = i * u + f_l * c_l + f_r * c_r``, ``h = o * tanh(c)``;
* a classifier ``h W + b`` (hidden -> classes) and a cross-entropy at every node; a tree's loss is the
  sum over its nodes, a step's loss the mean over its trees.

Idiomatic, fast eager PyTorch: states are (1, hidden) rows so every gate is one ``torch.addmm``, a
tree's words are looked up in one indexing op (then one row per leaf, as the example's
``take_rows``), a tree's node losses are summed by one ``torch.stack(...).sum()``, and Adagrad
(``foreach=True``, epsilon 1e-8 like monadl's) runs at 0.05, 0.1 for the embeddings. The five gates
stay five ``addmm`` (not one fused (2H, 5H) matmul): the peer does the example's work, op for op.

The weights are copies of the given arrays (by the example's names: ``embeddings``, ``leaf_c.w``,
``leaf_c.b``, ..., ``classifier.b``; ``w`` is (inputs, outputs)), so the peer starts from the very
weights of a monadl ``TreeLstm``. torch is imported lazily; ``monadl.bench.common.torch_available``
says whether it can be. Torch's thread count is the caller's business.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from monadl.data.trees import Tree

if TYPE_CHECKING:
    # Absent where torch is not installed (CI): there mypy sees torch as Any.
    import torch  # type: ignore[import-not-found, unused-ignore]

WordId = Callable[[str], int]

#: The gates of a leaf and of an inner node, as the example names them.
LEAF_GATES = ("leaf_c", "leaf_o")
INNER_GATES = ("i", "f_left", "f_right", "o", "u")
PARAMETERS = (
    "embeddings",
    *(f"{gate}.{part}" for gate in (*LEAF_GATES, *INNER_GATES, "classifier") for part in ("w", "b")),
)


class TorchTreeLstm:
    """The Tree-LSTM in PyTorch eager: ``step`` trains on a batch of trees, ``predict_roots`` infers.

    ``params``: every array of ``PARAMETERS`` (copied into leaf tensors of their dtype);
    ``numpy_params()`` gives their current values back.
    """

    def __init__(
        self,
        params: Mapping[str, np.ndarray],
        *,
        learning_rate: float = 0.05,
        embedding_learning_rate: float = 0.1,
        device: str = "cpu",
    ) -> None:
        import torch  # type: ignore[import-not-found, unused-ignore]

        missing = [name for name in PARAMETERS if name not in params]
        if missing:
            raise ValueError(f"TorchTreeLstm: missing parameters {missing}")
        self.device = device
        self.params: dict[str, torch.Tensor] = {
            name: torch.tensor(np.asarray(params[name]), device=device, requires_grad=True)
            for name in PARAMETERS
        }
        p = self.params
        self._affine = {gate: (p[f"{gate}.b"], p[f"{gate}.w"]) for gate in (*LEAF_GATES, *INNER_GATES)}
        self._classifier = (p["classifier.b"], p["classifier.w"])
        others = [t for name, t in p.items() if name != "embeddings"]
        self.optimizer = torch.optim.Adagrad(
            [
                {"params": [p["embeddings"]], "lr": embedding_learning_rate},
                {"params": others, "lr": learning_rate},
            ],
            eps=1e-8,
            foreach=True,
        )

    def step(self, trees: Sequence[Tree], word_id: WordId) -> float:
        """One Adagrad step on the mean loss per tree of the batch; returns that mean (before the step)."""
        self.optimizer.zero_grad(set_to_none=True)
        loss = self._loss(trees, word_id)
        loss.backward()  # type: ignore[no-untyped-call, unused-ignore]  # (torch leaves it unannotated)
        self.optimizer.step()
        return float(loss.item())

    def loss(self, trees: Sequence[Tree], word_id: WordId) -> float:
        """The mean loss per tree of the batch, forward only."""
        import torch  # type: ignore[import-not-found, unused-ignore]

        with torch.no_grad():
            return float(self._loss(trees, word_id).item())

    def predict_roots(self, trees: Sequence[Tree], word_id: WordId) -> np.ndarray:
        """The classifier's scores at every tree's root, (len(trees), classes): one forward, no gradients."""
        import torch  # type: ignore[import-not-found, unused-ignore]

        with torch.inference_mode():
            b, w = self._classifier
            roots = [self._states(tree, word_id)[-1][0] for tree in trees]
            logits = torch.cat([torch.addmm(b, h, w) for h in roots])
            return np.asarray(logits.cpu().numpy())

    def numpy_params(self) -> dict[str, np.ndarray]:
        """The parameters' current values, as NumPy arrays (copies)."""
        return {name: t.detach().cpu().numpy().copy() for name, t in self.params.items()}

    def _states(self, tree: Tree, word_id: WordId) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Every node's ``(h, c)``, each (1, hidden), in post-order (the root last)."""
        import torch  # type: ignore[import-not-found, unused-ignore]

        nodes = list(tree.nodes())
        words = torch.tensor(
            [word_id(n.word) for n in nodes if n.word is not None], dtype=torch.int64, device=self.device
        )
        embedded = self.params["embeddings"][words]  # the tree's words in one lookup
        a = self._affine
        states: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # by id(node)
        leaves = 0
        for node in nodes:
            if node.left is None or node.right is None:
                x = embedded[leaves : leaves + 1]
                leaves += 1
                c = torch.addmm(a["leaf_c"][0], x, a["leaf_c"][1])
                h = torch.sigmoid(torch.addmm(a["leaf_o"][0], x, a["leaf_o"][1])) * torch.tanh(c)
            else:
                h_l, c_l = states[id(node.left)]
                h_r, c_r = states[id(node.right)]
                children = torch.cat([h_l, h_r], dim=1)
                i, f_l, f_r, o = (
                    torch.sigmoid(torch.addmm(a[g][0], children, a[g][1]))
                    for g in ("i", "f_left", "f_right", "o")
                )
                u = torch.tanh(torch.addmm(a["u"][0], children, a["u"][1]))
                c = i * u + f_l * c_l + f_r * c_r
                h = o * torch.tanh(c)
            states[id(node)] = (h, c)
        return [states[id(node)] for node in nodes]

    def _loss(self, trees: Sequence[Tree], word_id: WordId) -> torch.Tensor:
        import torch  # type: ignore[import-not-found, unused-ignore]
        import torch.nn.functional as F  # type: ignore[import-not-found, unused-ignore]

        if not trees:
            raise ValueError("loss: needs at least one tree")
        b, w = self._classifier
        losses = []
        for tree in trees:
            labels = torch.tensor(
                [node.label for node in tree.nodes()], dtype=torch.int64, device=self.device
            )
            node_losses = [
                F.cross_entropy(torch.addmm(b, h, w), labels[k : k + 1], reduction="sum")
                for k, (h, _) in enumerate(self._states(tree, word_id))
            ]
            losses.append(torch.stack(node_losses).sum())
        return torch.stack(losses).sum() * (1.0 / len(trees))


class _Levels(NamedTuple):
    """A batch of trees laid out by height, as index tensors: its nodes numbered leaves first, then
    each height's inner nodes in turn (``bounds``: where each height's run starts and ends), and
    for the inner nodes, in that order, the numbers of their left and right children."""

    words: torch.Tensor  # the leaves' word ids
    left: torch.Tensor
    right: torch.Tensor
    bounds: list[tuple[int, int]]  # each height's [start, end) among the nodes, heights 1, 2, ...
    labels: torch.Tensor  # every node's label, in the nodes' order
    roots: torch.Tensor  # each tree's root's number
    nodes: int


class TorchLevelTreeLstm:
    """The Tree-LSTM in PyTorch batched by tree level by hand, as DGL's Tree-LSTM example and
    careful users write it: the strong peer. The same model and training as :class:`TorchTreeLstm`
    (the same equations, weights, loss and Adagrad), computed level by level over a whole batch:

    * the batch's nodes are numbered leaves first, then by height (every node's children come at a
      lower height, so before it), with index tensors made once per batch;
    * all the leaves in one lookup and one product, their two gates fused (``[W_c W_o]``);
    * then each height's inner nodes at once: their children's states gathered by index, the five
      gates in one product of the stacked children with ``[U_i U_fl U_fr U_o U_u]``, the states
      written into the batch's state buffers at that height's rows;
    * the classifier and the cross-entropy over all the nodes at once (the sum over the nodes, over
      the batch's size: the mean over the trees of each tree's sum).

    The fused weights are the model's parameters here (Adagrad is elementwise, so a fused matrix
    trains as its parts do); ``numpy_params`` gives them back under the example's names.
    """

    def __init__(
        self,
        params: Mapping[str, np.ndarray],
        *,
        learning_rate: float = 0.05,
        embedding_learning_rate: float = 0.1,
        device: str = "cpu",
    ) -> None:
        import torch  # type: ignore[import-not-found, unused-ignore]

        missing = [name for name in PARAMETERS if name not in params]
        if missing:
            raise ValueError(f"TorchLevelTreeLstm: missing parameters {missing}")
        p = {name: np.asarray(params[name]) for name in PARAMETERS}
        self.hidden = p["i.w"].shape[1]
        self.device = device
        fused = {
            "embeddings": p["embeddings"],
            "leaf.w": np.concatenate([p[f"{g}.w"] for g in LEAF_GATES], axis=1),
            "leaf.b": np.concatenate([p[f"{g}.b"] for g in LEAF_GATES]),
            "inner.w": np.concatenate([p[f"{g}.w"] for g in INNER_GATES], axis=1),
            "inner.b": np.concatenate([p[f"{g}.b"] for g in INNER_GATES]),
            "classifier.w": p["classifier.w"],
            "classifier.b": p["classifier.b"],
        }
        self.params: dict[str, torch.Tensor] = {
            name: torch.tensor(array, device=device, requires_grad=True) for name, array in fused.items()
        }
        others = [t for name, t in self.params.items() if name != "embeddings"]
        self.optimizer = torch.optim.Adagrad(
            [
                {"params": [self.params["embeddings"]], "lr": embedding_learning_rate},
                {"params": others, "lr": learning_rate},
            ],
            eps=1e-8,
            foreach=True,
        )

    def step(self, trees: Sequence[Tree], word_id: WordId) -> float:
        """One Adagrad step on the mean loss per tree of the batch; returns that mean (before the step)."""
        self.optimizer.zero_grad(set_to_none=True)
        loss = self._loss(trees, word_id)
        loss.backward()  # type: ignore[no-untyped-call, unused-ignore]
        self.optimizer.step()
        return float(loss.item())

    def loss(self, trees: Sequence[Tree], word_id: WordId) -> float:
        """The mean loss per tree of the batch, forward only."""
        import torch  # type: ignore[import-not-found, unused-ignore]

        with torch.no_grad():
            return float(self._loss(trees, word_id).item())

    def predict_roots(self, trees: Sequence[Tree], word_id: WordId) -> np.ndarray:
        """The classifier's scores at every tree's root, (len(trees), classes): one forward."""
        import torch  # type: ignore[import-not-found, unused-ignore]

        if not trees:
            raise ValueError("predict_roots: needs at least one tree")
        with torch.inference_mode():
            levels = self._levels(trees, word_id)
            h = self._states(levels)
            logits = torch.addmm(self.params["classifier.b"], h[levels.roots], self.params["classifier.w"])
            return np.asarray(logits.cpu().numpy())

    def numpy_params(self) -> dict[str, np.ndarray]:
        """The parameters' current values under the example's names (copies)."""
        t = {name: x.detach().cpu().numpy() for name, x in self.params.items()}
        out = {
            "embeddings": t["embeddings"],
            "classifier.w": t["classifier.w"],
            "classifier.b": t["classifier.b"],
        }
        for fused, gates in (("leaf", LEAF_GATES), ("inner", INNER_GATES)):
            for k, gate in enumerate(gates):
                columns = slice(k * self.hidden, (k + 1) * self.hidden)
                out[f"{gate}.w"] = t[f"{fused}.w"][:, columns]
                out[f"{gate}.b"] = t[f"{fused}.b"][columns]
        return {name: np.array(array) for name, array in out.items()}

    def _levels(self, trees: Sequence[Tree], word_id: WordId) -> _Levels:
        """The batch's layout by height (see :class:`_Levels`), its index tensors on the device."""
        import torch  # type: ignore[import-not-found, unused-ignore]

        by_height: list[list[tuple[int, Tree]]] = [[]]  # (tree's number, node), per height
        for k, tree in enumerate(trees):
            heights: dict[int, int] = {}
            for node in tree.nodes():  # children first
                if node.left is None or node.right is None:
                    height = 0
                else:
                    height = 1 + max(heights[id(node.left)], heights[id(node.right)])
                heights[id(node)] = height
                while len(by_height) <= height:
                    by_height.append([])
                by_height[height].append((k, node))
        number: dict[tuple[int, int], int] = {}  # (tree's number, id(node)) -> the node's number
        for k, node in (entry for level in by_height for entry in level):
            number[k, id(node)] = len(number)
        words = [word_id(node.word) if node.word is not None else 0 for _, node in by_height[0]]
        left = [number[k, id(node.left)] for level in by_height[1:] for k, node in level]
        right = [number[k, id(node.right)] for level in by_height[1:] for k, node in level]
        bounds, start = [], len(by_height[0])
        for level in by_height[1:]:
            bounds.append((start, start + len(level)))
            start += len(level)
        labels = [node.label for level in by_height for _, node in level]
        roots = [number[k, id(tree)] for k, tree in enumerate(trees)]

        def tensor(values: list[int]) -> torch.Tensor:
            return torch.as_tensor(np.asarray(values, dtype=np.int64), device=self.device)

        return _Levels(
            tensor(words), tensor(left), tensor(right), bounds, tensor(labels), tensor(roots), len(number)
        )

    def _states(self, levels: _Levels) -> torch.Tensor:
        """Every node's ``h`` (nodes, hidden), in the layout's order."""
        import torch  # type: ignore[import-not-found, unused-ignore]

        p, hidden = self.params, self.hidden
        x = p["embeddings"][levels.words]  # all the leaves' words in one lookup
        leaf = torch.addmm(p["leaf.b"], x, p["leaf.w"])  # both leaf gates in one product
        c_leaf = leaf[:, :hidden]
        shape, dtype = (levels.nodes, hidden), p["inner.w"].dtype
        h = torch.empty(shape, dtype=dtype, device=self.device)
        c = torch.empty(shape, dtype=dtype, device=self.device)
        leaves = len(levels.words)
        h[:leaves] = torch.sigmoid(leaf[:, hidden:]) * torch.tanh(c_leaf)
        c[:leaves] = c_leaf
        done = 0  # inner nodes so far: where this height's children indices start
        for start, end in levels.bounds:
            left = levels.left[done : done + end - start]
            right = levels.right[done : done + end - start]
            done += end - start
            children = torch.cat([h[left], h[right]], dim=1)  # the children's states, gathered
            gates = torch.addmm(p["inner.b"], children, p["inner.w"])  # five gates, one product
            i, f_left, f_right, o = torch.sigmoid(gates[:, : 4 * hidden]).chunk(4, dim=1)
            u = torch.tanh(gates[:, 4 * hidden :])
            c_new = i * u + f_left * c[left] + f_right * c[right]
            h[start:end] = o * torch.tanh(c_new)
            c[start:end] = c_new
        return h

    def _loss(self, trees: Sequence[Tree], word_id: WordId) -> torch.Tensor:
        import torch  # type: ignore[import-not-found, unused-ignore]
        import torch.nn.functional as F  # type: ignore[import-not-found, unused-ignore]

        if not trees:
            raise ValueError("loss: needs at least one tree")
        levels = self._levels(trees, word_id)
        h = self._states(levels)
        logits = torch.addmm(self.params["classifier.b"], h, self.params["classifier.w"])  # every node
        return F.cross_entropy(logits, levels.labels, reduction="sum") * (1.0 / len(trees))
