"""The suite's models in PyTorch eager on the CPU, for ``python -m monadl.bench suite``.

They follow the suite's ``pytorch`` scripts (neulab/dynet-benchmark), from the initial weights of the
monadl models (``monadl.bench.suite_monadl``), with ``torch.nn.LSTM`` as the scripts use it:

=========================  ==========================================================================
model                      follows
=========================  ==========================================================================
:class:`TorchTagger`       ``pytorch/bilstm-tagger.py``: per sentence, one bidirectional ``nn.LSTM``
                           over its embeddings; and with ``chars``
                           ``pytorch/bilstm-tagger-withchar.py``: a sentence's rare words spelled by
                           a forward and a reversed char ``nn.LSTM`` each over all of them, padded
                           with ``<*>``, read at each word's last character
:class:`TorchRnnLm`        ``pytorch/rnnlm.py``: the mini-batch padded into one (steps, batch) tensor,
                           one ``nn.LSTM`` over it, padding ignored by the loss
=========================  ==========================================================================

Where the scripts differ from the DyNet model the suite times, these follow DyNet's, so that every
implementation computes one function: the taggers' MLP is ``O tanh(H x)`` without biases (the tagger
script takes a softmax of ``tanh(proj2(proj1(x)))`` before its cross-entropy, the char script has no
``tanh``); a rare word's vector is its spelling's alone (the char script adds it to the unknown
word's embedding, zero there); the language model reads ``<s>`` first and predicts every word of a
sentence and the final ``<s>`` (the script starts at the first word). There is no PyTorch script for
``treenn`` in the suite, and so no PyTorch figure for it.

A mini-batch's losses (per word, ``reduction="sum"``) are summed, one ``backward``, one step of
``torch.optim.Adam`` (learning rate 0.001, ``foreach``). torch is imported lazily; its thread count is
the caller's business.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from monadl.bench.suite_data import PAD_CHAR, START, Sentence, TaggedSentence, TaskData
from monadl.bench.suite_dynet import fused_lstm

if TYPE_CHECKING:
    # Absent where torch is not installed (CI): there mypy sees torch as Any.
    import torch  # type: ignore[import-not-found, unused-ignore]

TASKS = ("bilstm-tagger", "bilstm-tagger-withchar", "rnnlm-batch")


def _tensor(array: np.ndarray) -> torch.Tensor:
    import torch  # type: ignore[import-not-found, unused-ignore]

    return torch.tensor(np.asarray(array), requires_grad=True)


def _lstm(params: Mapping[str, np.ndarray], prefixes: Sequence[str]) -> Any:
    """An ``nn.LSTM`` (bidirectional if two ``prefixes``: forward, backward) with the weights of the
    monadl cells ``prefixes``; PyTorch's gate order is i, f, g, o. Its second bias (``bias_hh``) is
    zero and frozen: trained, it would double the bias's Adam step, which DyNet's and monadl's
    single bias take once."""
    import torch  # type: ignore[import-not-found, unused-ignore]

    first = fused_lstm(params, prefixes[0], "ifuo")
    lstm = torch.nn.LSTM(first[0].shape[1], first[1].shape[1], 1, bidirectional=len(prefixes) == 2)
    with torch.no_grad():
        for prefix, suffix in zip(prefixes, ("", "_reverse"), strict=False):
            w_x, w_h, b = fused_lstm(params, prefix, "ifuo")
            getattr(lstm, f"weight_ih_l0{suffix}").copy_(torch.from_numpy(w_x))
            getattr(lstm, f"weight_hh_l0{suffix}").copy_(torch.from_numpy(w_h))
            getattr(lstm, f"bias_ih_l0{suffix}").copy_(torch.from_numpy(b))
            getattr(lstm, f"bias_hh_l0{suffix}").zero_()
            getattr(lstm, f"bias_hh_l0{suffix}").requires_grad_(False)
    return lstm


def _trained(module: Any) -> list[torch.Tensor]:
    return [p for p in module.parameters() if p.requires_grad]


class _TorchModel:
    """What the PyTorch models share: their tensors, the Adam optimizer, a step."""

    def _optimizer(self, tensors: list[torch.Tensor]) -> None:
        import torch  # type: ignore[import-not-found, unused-ignore]

        self.optimizer = torch.optim.Adam(tensors, lr=0.001, foreach=True)

    def total(self, batch: Sequence[Any]) -> torch.Tensor:
        """The summed loss of ``batch``, with its graph."""
        raise NotImplementedError

    def step(self, batch: Sequence[Any]) -> float:
        """One Adam step on the summed loss of ``batch``; returns that loss (before the step)."""
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.total(batch)
        loss.backward()  # type: ignore[no-untyped-call, unused-ignore]
        self.optimizer.step()
        return float(loss.item())

    def evaluate(self, batch: Sequence[Any]) -> float:
        """The summed loss of ``batch``, forward only."""
        import torch  # type: ignore[import-not-found, unused-ignore]

        with torch.no_grad():
            return float(self.total(batch).item())


class TorchTagger(_TorchModel):
    """The BiLSTM tagger (``chars``: with the char BiLSTM of rare words)."""

    def __init__(self, params: Mapping[str, np.ndarray], *, chars: bool) -> None:
        self.words = _tensor(params["words.table"])
        self.lstm = _lstm(params, ("forward_lstm", "backward_lstm"))
        self.h = _tensor(params["mlp_hidden.w"])
        self.o = _tensor(params["mlp_output.w"])
        tensors = [self.words, *_trained(self.lstm), self.h, self.o]
        self.chars = chars
        if chars:
            self.char_table = _tensor(params["chars.table"])
            self.char_forward = _lstm(params, ("char_forward",))
            self.char_backward = _lstm(params, ("char_backward",))
            tensors += [self.char_table, *_trained(self.char_forward), *_trained(self.char_backward)]
        self._optimizer(tensors)

    def _embeddings(self, sentence: TaggedSentence) -> torch.Tensor:
        import torch  # type: ignore[import-not-found, unused-ignore]

        embeddings = self.words[torch.tensor(sentence.words)]
        rare = [k for k, s in enumerate(sentence.spellings) if s is not None]
        if not self.chars or not rare:
            return embeddings
        spellings = [sentence.spellings[k] or () for k in rare]
        longest = max(len(s) for s in spellings)
        forward = [[*s, *[PAD_CHAR] * (longest - len(s))] for s in spellings]
        backward = [[*s[::-1], *[PAD_CHAR] * (longest - len(s))] for s in spellings]
        ends = torch.tensor([len(s) - 1 for s in spellings])
        columns = torch.arange(len(rare))
        f = self.char_forward(self.char_table[torch.tensor(forward).t()])[0]  # (longest, rare, dim)
        b = self.char_backward(self.char_table[torch.tensor(backward).t()])[0]
        spelled = torch.cat([f[ends, columns], b[ends, columns]], 1)
        return embeddings.index_copy(0, torch.tensor(rare), spelled)

    def total(self, batch: Sequence[TaggedSentence]) -> torch.Tensor:
        import torch  # type: ignore[import-not-found, unused-ignore]
        import torch.nn.functional as F  # type: ignore[import-not-found, unused-ignore]

        losses = []
        for sentence in batch:
            states = self.lstm(self._embeddings(sentence).unsqueeze(1))[0].squeeze(1)  # (words, 2 hidden)
            scores = torch.tanh(states @ self.h) @ self.o
            losses.append(F.cross_entropy(scores, torch.tensor(sentence.tags), reduction="sum"))
        return torch.stack(losses).sum()


class TorchRnnLm(_TorchModel):
    """The LSTM language model on a padded mini-batch."""

    def __init__(self, params: Mapping[str, np.ndarray]) -> None:
        self.table = _tensor(params["words.table"])
        self.lstm = _lstm(params, ("lstm",))
        self.w = _tensor(params["softmax.w"])
        self.b = _tensor(params["softmax.b"])
        self._optimizer([self.table, *_trained(self.lstm), self.w, self.b])

    def total(self, batch: Sequence[Sentence]) -> torch.Tensor:
        import torch  # type: ignore[import-not-found, unused-ignore]
        import torch.nn.functional as F  # type: ignore[import-not-found, unused-ignore]

        steps = max(len(s) for s in batch)
        inputs = torch.full((steps, len(batch)), START, dtype=torch.int64)
        targets = torch.full((steps, len(batch)), -100, dtype=torch.int64)  # -100: ignored
        for k, s in enumerate(batch):
            inputs[1 : len(s), k] = torch.tensor(s[:-1])
            targets[: len(s), k] = torch.tensor(s)
        outputs = self.lstm(self.table[inputs])[0]  # (steps, batch, hidden)
        scores = torch.addmm(self.b, outputs.reshape(-1, outputs.shape[-1]), self.w)
        return F.cross_entropy(scores, targets.reshape(-1), ignore_index=-100, reduction="sum")


def torch_model(data: TaskData, params: Mapping[str, np.ndarray]) -> _TorchModel:
    """A fresh PyTorch model of ``data``'s task (one of ``TASKS``), from ``params``."""
    if data.task == "rnnlm-batch":
        return TorchRnnLm(params)
    if data.task in TASKS:
        return TorchTagger(params, chars=data.task == "bilstm-tagger-withchar")
    raise ValueError(f"no PyTorch model for {data.task!r} (the suite has no PyTorch script for it)")
