"""The PyTorch peers of ``python -m monadl.bench models``: each the same model as monadl's side,
from the same weights (copied), trained the same way, written as a PyTorch user would write it.

Imported only where torch is installed (``common.torch_available``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from monadl.bench.suite_data import TaggedSentence
from monadl.bench.suite_dynet import fused_lstm

if TYPE_CHECKING:
    # Absent where torch is not installed (CI): there mypy sees torch as Any.
    import torch  # type: ignore[import-not-found, unused-ignore]


def _tensor(array: Any, grad: bool = True, device: str = "cpu") -> torch.Tensor:
    import torch  # type: ignore[import-not-found, unused-ignore]

    return torch.tensor(np.asarray(array), requires_grad=grad, device=device)


class _OnDevice:
    """A peer whose tensors live on ``device`` (``"cpu"`` or ``"cuda"``)."""

    device: str

    def put(self, array: Any) -> torch.Tensor:
        """``array`` (NumPy) as a tensor on the peer's device: a step's inputs, moved there once."""
        import torch  # type: ignore[import-not-found, unused-ignore]

        return torch.as_tensor(array, device=self.device)


class TorchConv(_OnDevice):
    """One 3x3 convolution (padding 1) forward and backward: the gradients of the sum of its output
    by its kernel, bias and, if ``input_grad``, its input (as inside a network, past its first
    layer)."""

    def __init__(
        self, w: np.ndarray, b: np.ndarray, x: np.ndarray, *, input_grad: bool, device: str = "cpu"
    ) -> None:
        self.device = device
        self.w, self.b = _tensor(w, device=device), _tensor(b, device=device)
        self.x = _tensor(x, grad=input_grad, device=device)

    def step(self) -> float:
        import torch  # type: ignore[import-not-found, unused-ignore]

        for t in (self.w, self.b, self.x):
            t.grad = None
        loss = torch.nn.functional.conv2d(self.x, self.w, self.b, padding=1).sum()
        loss.backward()  # type: ignore[no-untyped-call, unused-ignore]
        return float(loss.item())


class TorchCNN(_OnDevice):
    """examples/cnn.py's CNN: conv-relu-pool twice, a dense layer; Adam on the mean cross-entropy."""

    def __init__(self, params: Mapping[str, np.ndarray], learning_rate: float, device: str = "cpu") -> None:
        import torch  # type: ignore[import-not-found, unused-ignore]

        self.device = device
        names = ["conv1.w", "conv1.b", "conv2.w", "conv2.b", "head.w", "head.b"]
        self.t = {
            name: _tensor(params[name].T if name == "head.w" else params[name], device=device)
            for name in names
        }
        self.optimizer = torch.optim.Adam(list(self.t.values()), lr=learning_rate, foreach=True)

    def step(self, images: Any, labels: Any) -> float:
        """One step on ``images`` and ``labels``: NumPy arrays, or tensors already there (``put``)."""
        import torch  # type: ignore[import-not-found, unused-ignore]

        f, t = torch.nn.functional, self.t
        self.optimizer.zero_grad(set_to_none=True)
        x = self.put(images)
        h = f.max_pool2d(f.relu(f.conv2d(x, t["conv1.w"], t["conv1.b"], padding=1)), 2)
        h = f.max_pool2d(f.relu(f.conv2d(h, t["conv2.w"], t["conv2.b"], padding=1)), 2)
        logits = f.linear(h.reshape(h.shape[0], -1), t["head.w"], t["head.b"])
        loss = f.cross_entropy(logits, self.put(labels))
        loss.backward()  # type: ignore[no-untyped-call, unused-ignore]
        self.optimizer.step()
        return float(loss.item())


class TorchTagger(_OnDevice):
    """examples/bilstm_tagger.py's tagger: embedding, a bidirectional ``nn.LSTM`` over the batch's
    sentences packed (``pack_sequence``, no padding computed), an MLP without biases; Adam on the
    mean cross-entropy per word. ``nn.LSTM``'s second bias is zero and frozen (monadl's cell has
    one bias per gate)."""

    def __init__(self, params: Mapping[str, np.ndarray], learning_rate: float, device: str = "cpu") -> None:
        import torch  # type: ignore[import-not-found, unused-ignore]

        self.device = device
        w_x, _, _ = fused_lstm(params, "lstm.forward_cells.0", "ifuo")
        hidden = w_x.shape[0] // 4
        self.lstm = torch.nn.LSTM(w_x.shape[1], hidden, 1, bidirectional=True)
        with torch.no_grad():
            for prefix, suffix in (("lstm.forward_cells.0", ""), ("lstm.backward_cells.0", "_reverse")):
                w_x, w_h, b = fused_lstm(params, prefix, "ifuo")
                getattr(self.lstm, f"weight_ih_l0{suffix}").copy_(torch.from_numpy(w_x))
                getattr(self.lstm, f"weight_hh_l0{suffix}").copy_(torch.from_numpy(w_h))
                getattr(self.lstm, f"bias_ih_l0{suffix}").copy_(torch.from_numpy(b))
                getattr(self.lstm, f"bias_hh_l0{suffix}").zero_()
                getattr(self.lstm, f"bias_hh_l0{suffix}").requires_grad_(False)
        self.lstm.to(device)
        self.table = _tensor(params["words.table"], device=device)
        self.h = _tensor(params["mlp.layers.0.w"].T, device=device)
        self.o = _tensor(params["mlp.layers.1.w"].T, device=device)
        trained = [p for p in self.lstm.parameters() if p.requires_grad]
        self.optimizer = torch.optim.Adam(
            [self.table, *trained, self.h, self.o], lr=learning_rate, foreach=True
        )

    def step(self, sentences: Sequence[TaggedSentence]) -> float:
        import torch  # type: ignore[import-not-found, unused-ignore]

        f, rnn = torch.nn.functional, torch.nn.utils.rnn
        self.optimizer.zero_grad(set_to_none=True)
        dev = self.device
        packed = rnn.pack_sequence(
            [self.table[torch.tensor(s.words, device=dev)] for s in sentences], enforce_sorted=False
        )
        tags = rnn.pack_sequence([torch.tensor(s.tags, device=dev) for s in sentences], enforce_sorted=False)
        states = self.lstm(packed)[0].data  # every word's [f; b], in the packed order, as the tags
        scores = f.linear(torch.tanh(f.linear(states, self.h)), self.o)
        loss = f.cross_entropy(scores, tags.data)
        loss.backward()  # type: ignore[no-untyped-call, unused-ignore]
        self.optimizer.step()
        return float(loss.item())


def encoder_layer(
    params: Mapping[str, np.ndarray], prefix: str, heads: int, *, norm_first: bool = True, device: str = "cpu"
) -> torch.nn.TransformerEncoderLayer:
    """PyTorch's ``nn.TransformerEncoderLayer`` (batch first, no dropout, ReLU, of the weights'
    dtype, on ``device``) with the weights of monadl's ``nn.TransformerEncoderLayer`` named ``prefix +
    "attention.qkv.w"``, ... in ``params``. Its fused ``in_proj`` is monadl's ``qkv`` (both q, k, v
    in that order); PyTorch's linear weights are monadl's transposed."""
    import torch  # type: ignore[import-not-found, unused-ignore]

    qkv = _tensor(params[prefix + "attention.qkv.w"], grad=False)
    hidden = params[prefix + "ff1.w"].shape[1]
    layer = torch.nn.TransformerEncoderLayer(
        qkv.shape[0], heads, hidden, dropout=0.0, batch_first=True, norm_first=norm_first, dtype=qkv.dtype
    )
    theirs = {
        "attention.qkv.w": layer.self_attn.in_proj_weight,
        "attention.qkv.b": layer.self_attn.in_proj_bias,
        "attention.out.w": layer.self_attn.out_proj.weight,
        "attention.out.b": layer.self_attn.out_proj.bias,
        "norm1.weight": layer.norm1.weight,
        "norm1.bias": layer.norm1.bias,
        "norm2.weight": layer.norm2.weight,
        "norm2.bias": layer.norm2.bias,
        "ff1.w": layer.linear1.weight,
        "ff1.b": layer.linear1.bias,
        "ff2.w": layer.linear2.weight,
        "ff2.b": layer.linear2.bias,
    }
    with torch.no_grad():
        for name, tensor in theirs.items():
            mine = np.asarray(params[prefix + name])
            tensor.copy_(_tensor(mine.T if mine.ndim == 2 else mine, grad=False))
    return layer.to(device)


class TorchEncoderLayer(_OnDevice):
    """One post-norm ``nn.TransformerEncoderLayer`` (PyTorch's default) of monadl's layer's weights
    (named ``attention.qkv.w``, ...); Adam on the mean squared error of its output to a target."""

    def __init__(
        self, params: Mapping[str, np.ndarray], heads: int, learning_rate: float, device: str = "cpu"
    ) -> None:
        import torch  # type: ignore[import-not-found, unused-ignore]

        self.device = device
        self.layer = encoder_layer(params, "", heads, norm_first=False, device=device)
        self.optimizer = torch.optim.Adam(self.layer.parameters(), lr=learning_rate, foreach=True)

    def step(self, x: Any, target: Any) -> float:
        """One step on ``x`` (batch, length, width) and ``target`` (NumPy, or tensors there)."""
        import torch  # type: ignore[import-not-found, unused-ignore]

        self.optimizer.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(self.layer(self.put(x)), self.put(target))
        loss.backward()  # type: ignore[no-untyped-call, unused-ignore]
        self.optimizer.step()
        return float(loss.item())


class TorchMLP(_OnDevice):
    """monadl's ``nn.MLP`` (ReLU between its ``nn.Linear`` layers, named ``layers.k.w`` and
    ``layers.k.b``) as ``F.linear`` and ``F.relu``; Adam on the mean cross-entropy."""

    def __init__(self, params: Mapping[str, np.ndarray], learning_rate: float, device: str = "cpu") -> None:
        import torch  # type: ignore[import-not-found, unused-ignore]

        self.device = device
        count = len({name.split(".")[1] for name in params})
        self.layers = [
            (
                _tensor(params[f"layers.{k}.w"].T, device=device),
                _tensor(params[f"layers.{k}.b"], device=device),
            )
            for k in range(count)
        ]
        weights = [t for layer in self.layers for t in layer]
        self.optimizer = torch.optim.Adam(weights, lr=learning_rate, foreach=True)

    def step(self, x: Any, labels: Any) -> float:
        """One step on ``x`` (batch, inputs) and ``labels`` (NumPy, or tensors there)."""
        import torch  # type: ignore[import-not-found, unused-ignore]

        f = torch.nn.functional
        self.optimizer.zero_grad(set_to_none=True)
        h = self.put(x)
        for k, (w, b) in enumerate(self.layers):
            h = f.linear(h, w, b)
            if k < len(self.layers) - 1:
                h = f.relu(h)
        loss = f.cross_entropy(h, self.put(labels))
        loss.backward()  # type: ignore[no-untyped-call, unused-ignore]
        self.optimizer.step()
        return float(loss.item())


class TorchTransformerLm(_OnDevice):
    """examples/transformer_lm.py's model: embeddings of characters and positions, pre-norm
    ``nn.TransformerEncoderLayer``s (causal), a last ``nn.LayerNorm`` and the readout; Adam on the
    mean cross-entropy of the next characters, the gradients clipped to a global norm of
    ``max_norm`` first (``clip_grad_norm_``)."""

    def __init__(
        self,
        params: Mapping[str, np.ndarray],
        heads: int,
        learning_rate: float,
        max_norm: float,
        device: str = "cpu",
    ) -> None:
        import torch  # type: ignore[import-not-found, unused-ignore]

        self.device = device
        count = len({name.split(".")[1] for name in params if name.startswith("layers.")})
        self.layers = [encoder_layer(params, f"layers.{k}.", heads, device=device) for k in range(count)]
        self.table = _tensor(params["embedding.table"], device=device)
        self.positions = _tensor(params["positions"], device=device)
        self.norm_weight = _tensor(params["norm.weight"], device=device)
        self.norm_bias = _tensor(params["norm.bias"], device=device)
        self.readout_w = _tensor(params["readout.w"].T, device=device)
        self.readout_b = _tensor(params["readout.b"], device=device)
        self.parameters = [
            self.table,
            self.positions,
            *(p for layer in self.layers for p in layer.parameters()),
            self.norm_weight,
            self.norm_bias,
            self.readout_w,
            self.readout_b,
        ]
        self.max_norm = max_norm
        self.optimizer = torch.optim.Adam(self.parameters, lr=learning_rate, foreach=True)
        self.mask = torch.nn.Transformer.generate_square_subsequent_mask(
            self.positions.shape[0], device=torch.device(device)
        )

    def step(self, windows: Any) -> float:
        """One training step on ``windows`` (batch, context + 1) of character ids (NumPy, or a
        tensor there)."""
        import torch  # type: ignore[import-not-found, unused-ignore]

        f = torch.nn.functional
        self.optimizer.zero_grad(set_to_none=True)
        ids = self.put(windows)
        x = f.embedding(ids[:, :-1], self.table) + self.positions
        for layer in self.layers:
            x = layer(x, src_mask=self.mask, is_causal=True)
        x = f.layer_norm(x, self.norm_weight.shape, self.norm_weight, self.norm_bias)
        logits = f.linear(x, self.readout_w, self.readout_b)
        loss = f.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
        loss.backward()  # type: ignore[no-untyped-call, unused-ignore]
        torch.nn.utils.clip_grad_norm_(self.parameters, self.max_norm, foreach=True)
        self.optimizer.step()
        return float(loss.item())
