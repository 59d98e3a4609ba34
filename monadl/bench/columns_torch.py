"""The CIFAR-100 column model in PyTorch eager on the CPU: the same math as ``columns_numpy``.

Idiomatic, fast eager PyTorch: every parameter a leaf tensor with ``requires_grad`` (a copy of the
given array, float32 or float64 as given), linear layers as ``torch.addmm``, the loss through
``F.cross_entropy(..., reduction="sum") / (B * K)`` (the spec's ``-sum(onehot * log_softmax) / (B * K)``),
``loss.backward()``, and ``torch.optim.SGD(foreach=True)`` after ``zero_grad(set_to_none=True)``.

In skip only fine classifier ``c`` runs, so only the columns', the coarse classifier's and its
parameters get gradients (the others' stay ``None``, and SGD leaves them alone); in noskip all 20 run
and their losses join the loss weighted by ``0.0``, so all get (zero) gradients and are "updated".

torch is imported lazily (on first use), so this module imports without it;
``monadl.bench.common.torch_available`` says whether it can be. Torch's thread count is the
caller's business.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from monadl.bench.columns_numpy import VARIANTS, Variant
from monadl.bench.columns_params import (
    COARSE_CLASSES,
    COARSE_PARAMS,
    COLUMN_PARAMS,
    FINE_CLASSES,
    FINE_PARAMS,
    FINE_PER_COARSE,
    check_batch,
    check_params,
)

if TYPE_CHECKING:
    # Absent where torch is not installed (CI): there mypy sees torch as Any.
    import torch  # type: ignore[import-not-found, unused-ignore]


class TorchColumns:
    """The column model in PyTorch eager: ``step`` trains on a batch, ``gradients`` only computes.

    ``params`` (as made by ``init_params``) are copied into leaf tensors of their dtype;
    ``numpy_params()`` gives their current values back as NumPy arrays.
    """

    def __init__(
        self,
        params: dict[str, np.ndarray],
        variant: Variant,
        learning_rate: float = 1e-4,
        device: str = "cpu",
    ):
        import torch  # type: ignore[import-not-found, unused-ignore]

        if variant not in VARIANTS:
            raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
        self.n_columns, self.hidden, self.dtype = check_params(params)
        self.variant: Variant = variant
        self.learning_rate = float(learning_rate)
        self.device = device
        self.params: dict[str, torch.Tensor] = {
            name: torch.tensor(value, device=device, requires_grad=True) for name, value in params.items()
        }
        p = self.params
        self._columns = [tuple(p[f"column{i}.{n}"] for n in COLUMN_PARAMS) for i in range(self.n_columns)]
        self._coarse = tuple(p[f"coarse.{n}"] for n in COARSE_PARAMS)
        self._fine = [tuple(p[f"fine{j}.{n}"] for n in FINE_PARAMS) for j in range(FINE_CLASSES)]
        # foreach: one multi-tensor update instead of torch's default on the CPU, a Python loop over the
        # parameters (138 in noskip at 4 columns); measured 0.1-0.15 ms faster per noskip step.
        self.optimizer = torch.optim.SGD(list(p.values()), lr=self.learning_rate, foreach=True)

    def on_device(self, x: np.ndarray, c: int, fine_local: np.ndarray) -> tuple[Any, int, Any]:
        """A batch as tensors on the model's device (``step`` takes either form): a benchmark moves
        its batches there once, as it does monadl's."""
        import torch  # type: ignore[import-not-found, unused-ignore]

        check_batch(x, c, fine_local)
        tx = torch.tensor(np.ascontiguousarray(x, dtype=self.dtype), device=self.device)
        return tx, c, torch.tensor(fine_local.astype(np.int64), device=self.device)

    def step(self, x: Any, c: int, fine_local: Any) -> float:
        """One SGD step on the batch; returns its loss (before the update)."""
        self.optimizer.zero_grad(set_to_none=True)
        loss = self._loss(x, c, fine_local)
        loss.backward()  # type: ignore[no-untyped-call, unused-ignore]  # (torch leaves it unannotated)
        self.optimizer.step()
        return float(loss.item())

    def gradients(self, x: np.ndarray, c: int, fine_local: np.ndarray) -> tuple[float, dict[str, np.ndarray]]:
        """The batch's loss and the gradients of every parameter that gets one (see the module); no update."""
        self.optimizer.zero_grad(set_to_none=True)
        loss = self._loss(x, c, fine_local)
        loss.backward()  # type: ignore[no-untyped-call, unused-ignore]  # (torch leaves it unannotated)
        grads = {
            n: t.grad.detach().cpu().numpy().copy() for n, t in self.params.items() if t.grad is not None
        }
        return float(loss.item()), grads

    def loss(self, x: np.ndarray, c: int, fine_local: np.ndarray) -> float:
        """The batch's loss, forward only (under ``no_grad``)."""
        import torch  # type: ignore[import-not-found, unused-ignore]

        with torch.no_grad():
            return float(self._loss(x, c, fine_local).item())

    def numpy_params(self) -> dict[str, np.ndarray]:
        """The parameters' current values, as NumPy arrays (copies)."""
        return {n: t.detach().cpu().numpy().copy() for n, t in self.params.items()}

    def _loss(self, x: Any, c: int, fine_local: Any) -> torch.Tensor:
        import torch  # type: ignore[import-not-found, unused-ignore]
        import torch.nn.functional as F  # type: ignore[import-not-found, unused-ignore]

        if isinstance(x, torch.Tensor):  # a batch from on_device
            tx, fine_labels = x, fine_local
        else:
            x = np.asarray(x)
            fine_local = np.asarray(fine_local)
            check_batch(x, c, fine_local)
            tx = torch.from_numpy(np.ascontiguousarray(x, dtype=self.dtype)).to(self.device)
            fine_labels = torch.from_numpy(fine_local.astype(np.int64, copy=False)).to(self.device)
        batch = len(tx)
        coarse_labels = torch.full((batch,), c, dtype=torch.int64, device=self.device)

        h: torch.Tensor | None = None
        for w1, b1, w2, b2 in self._columns:
            a = torch.relu(torch.addmm(b2, torch.relu(torch.addmm(b1, tx, w1)), w2))
            h = a if h is None else h + a
        assert h is not None
        cw, cb = self._coarse
        loss = F.cross_entropy(torch.addmm(cb, h, cw), coarse_labels, reduction="sum") / (
            batch * COARSE_CLASSES
        )
        for j in range(FINE_CLASSES) if self.variant == "noskip" else (c,):
            fw1, fb1, fw2, fb2, fw3, fb3 = self._fine[j]
            f = torch.relu(torch.addmm(fb2, torch.relu(torch.addmm(fb1, h, fw1)), fw2))
            ce = F.cross_entropy(torch.addmm(fb3, f, fw3), fine_labels, reduction="sum") / (
                batch * FINE_PER_COARSE
            )
            loss = loss + (ce if j == c else 0.0 * ce)
        return loss
