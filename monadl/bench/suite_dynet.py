"""The suite's models in DyNet, and the worker process that runs them for ``python -m monadl.bench
suite``: DyNet fixes autobatching once per process, at import, so each setting (on, off) runs in a
process of its own, driven request by request from the benchmark (:class:`DynetPeer`; a timed
segment is one request) so that its timed segments interleave with the other implementations'.

The models follow the suite's ``dynet-py`` scripts (neulab/dynet-benchmark), from the initial
weights of the monadl models (``monadl.bench.suite_monadl``; DyNet's matrices are their
transposes, (outputs, inputs)):

=========================  ==========================================================================
model                      follows
=========================  ==========================================================================
:class:`DynetTagger`       ``dynet-py/bilstm-tagger.py``, and with ``chars``
                           ``dynet-py/bilstm-tagger-withchar.py``: ``VanillaLSTMBuilder``'s
                           ``transduce``, ``O * tanh(H * x)``, ``pickneglogsoftmax`` per word
:class:`DynetTreeNN`       ``dynet-py/treenn.py``: the cell node by node (children first, by a loop,
                           not the script's recursion), ``pickneglogsoftmax(W * h)`` at every node
:class:`DynetRnnLm`        ``dynet-py/rnnlm-batch.py``: the mini-batch batched by hand, sentences
                           sorted by length, ``lookup_batch``, ``pickneglogsoftmax_batch``, masks
=========================  ==========================================================================

A mini-batch is one computation graph: its instances' losses summed by ``dy.esum`` (the language
model's by ``sum_batches``), one ``backward``, one ``update`` of an ``AdamTrainer`` (DyNet's
defaults: learning rate 0.001; gradient clipping off and dense updates, as the scripts run with
``SPARSE`` 0).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from monadl.bench import suite_data
from monadl.bench.common import WorkerProcess
from monadl.bench.suite_data import START, Sentence, TaggedSentence, TaskData
from monadl.data.trees import Tree

_MARK = "@@suite "  # the worker's answers on its stdout start with this


def fused_lstm(params: Mapping[str, np.ndarray], prefix: str, order: str) -> tuple[np.ndarray, ...]:
    """The gates of the ``nn.LSTMCell`` ``prefix`` (``prefix.i.w`` ...: ``w`` of shape (inputs +
    hidden, hidden), the input's rows first) fused as DyNet and PyTorch hold them: ``(w_x, w_h, b)``
    of shapes (4 hidden, inputs), (4 hidden, hidden), (4 hidden,), the gates in ``order`` (letters
    of ``ifou``; ``u`` is the candidate memory, DyNet's ``g`` and PyTorch's ``g``)."""
    ws = [np.asarray(params[f"{prefix}.{gate}.w"]) for gate in order]
    hidden = ws[0].shape[1]
    inputs = ws[0].shape[0] - hidden
    w_x = np.concatenate([w[:inputs].T for w in ws])
    w_h = np.concatenate([w[inputs:].T for w in ws])
    b = np.concatenate([np.asarray(params[f"{prefix}.{gate}.b"]) for gate in order])
    return np.ascontiguousarray(w_x), np.ascontiguousarray(w_h), b


def _matrix(pc: Any, w: np.ndarray) -> Any:
    """A DyNet parameter of the transpose of ``w`` (inputs, outputs)."""
    return pc.parameters_from_numpy(np.ascontiguousarray(np.asarray(w).T))


class _DynetModel:
    """What the DyNet models share: the parameter collection, the Adam trainer, a step."""

    def __init__(self, dy: Any) -> None:
        self.dy = dy
        self.pc = dy.ParameterCollection()

    def _trainer(self) -> None:
        self.trainer = self.dy.AdamTrainer(self.pc)  # alpha 0.001, betas 0.9 and 0.999, eps 1e-8
        self.trainer.set_clip_threshold(-1.0)  # no clipping (DyNet clips at 5 by default)
        self.trainer.set_sparse_updates(False)

    def _lstm(self, params: Mapping[str, np.ndarray], prefix: str) -> Any:
        """A ``VanillaLSTMBuilder`` with the weights of the monadl cell ``prefix``."""
        w_x, w_h, b = fused_lstm(params, prefix, "ifou")  # DyNet's gate order: i, f, o, g
        hidden = w_h.shape[1]
        b = b.copy()
        b[hidden : 2 * hidden] -= 1.0  # the builder adds its forget bias of 1 itself
        builder = self.dy.VanillaLSTMBuilder(1, w_x.shape[1], hidden, self.pc)
        for p, value in zip(builder.get_parameters()[0], (w_x, w_h, b), strict=True):
            p.set_value(value)
        return builder

    def total(self, batch: Sequence[Any]) -> Any:
        """The summed loss of ``batch``, an expression of a new computation graph."""
        raise NotImplementedError

    def step(self, batch: Sequence[Any]) -> float:
        """One Adam step on the summed loss of ``batch``; returns that loss."""
        loss = self.total(batch)
        value = float(loss.value())
        loss.backward()
        self.trainer.update()
        return value

    def evaluate(self, batch: Sequence[Any]) -> float:
        """The summed loss of ``batch``, forward only."""
        return float(self.total(batch).value())


class DynetTagger(_DynetModel):
    """The BiLSTM tagger (``chars``: with the char BiLSTM of rare words)."""

    def __init__(self, dy: Any, params: Mapping[str, np.ndarray], *, chars: bool) -> None:
        super().__init__(dy)
        self.words = self.pc.lookup_parameters_from_numpy(np.asarray(params["words.table"]))
        self.forward_lstm = self._lstm(params, "forward_lstm")
        self.backward_lstm = self._lstm(params, "backward_lstm")
        self.p_h = _matrix(self.pc, params["mlp_hidden.w"])
        self.p_o = _matrix(self.pc, params["mlp_output.w"])
        self.chars = chars
        if chars:
            self.char_table = self.pc.lookup_parameters_from_numpy(np.asarray(params["chars.table"]))
            self.char_forward = self._lstm(params, "char_forward")
            self.char_backward = self._lstm(params, "char_backward")
        self._trainer()

    def _word(self, sentence: TaggedSentence, k: int, cf: Any, cb: Any) -> Any:
        spelling = sentence.spellings[k]
        if not self.chars or spelling is None:
            return self.words[sentence.words[k]]
        embs = [self.char_table[c] for c in spelling]
        return self.dy.concatenate([cf.transduce(embs)[-1], cb.transduce(list(reversed(embs)))[-1]])

    def total(self, batch: Sequence[TaggedSentence]) -> Any:
        dy = self.dy
        dy.renew_cg()
        h, o = self.p_h, self.p_o
        f_init, b_init = self.forward_lstm.initial_state(), self.backward_lstm.initial_state()
        cf = cb = None
        if self.chars:
            cf, cb = self.char_forward.initial_state(), self.char_backward.initial_state()
        sentences = []
        for sentence in batch:
            wembs = [self._word(sentence, k, cf, cb) for k in range(len(sentence.words))]
            forward = f_init.transduce(wembs)
            backward = list(reversed(b_init.transduce(list(reversed(wembs)))))
            errs = [
                dy.pickneglogsoftmax(o * dy.tanh(h * dy.concatenate([f, b])), tag)
                for f, b, tag in zip(forward, backward, sentence.tags, strict=True)
            ]
            sentences.append(dy.esum(errs))
        return dy.esum(sentences)


class DynetTreeNN(_DynetModel):
    """The suite's Tree-LSTM with a loss at every node; ``word_ids``: the training words' ids."""

    def __init__(self, dy: Any, params: Mapping[str, np.ndarray], word_ids: Mapping[str, int]) -> None:
        super().__init__(dy)
        self.word_ids = word_ids
        self.table = self.pc.lookup_parameters_from_numpy(np.asarray(params["words.table"]))
        self.ws = [_matrix(self.pc, params[f"cell.w_{g}"]) for g in "iou"]
        self.us = [_matrix(self.pc, params[f"cell.u_{g}"]) for g in "iou"]
        self.ufs = [_matrix(self.pc, params[f"cell.u_f{k}"]) for k in (1, 2)]
        self.bs = [self.pc.parameters_from_numpy(np.asarray(params[f"cell.b_{g}"])) for g in "iouf"]
        self.p_w = _matrix(self.pc, params["classifier.w"])
        self._trainer()

    def total(self, batch: Sequence[Tree]) -> Any:
        dy = self.dy
        dy.renew_cg()
        w_i, w_o, w_u = self.ws
        u_i, u_o, u_u = self.us
        u_f1, u_f2 = self.ufs
        b_i, b_o, b_u, b_f = self.bs
        w = self.p_w
        losses = []
        for tree in batch:
            states: dict[int, tuple[Any, Any]] = {}
            for node in tree.nodes():  # post-order: children first
                if node.left is None or node.right is None:
                    emb = self.table[self.word_ids.get(node.word or "", 0)]
                    i = dy.logistic(dy.affine_transform([b_i, w_i, emb]))
                    o = dy.logistic(dy.affine_transform([b_o, w_o, emb]))
                    u = dy.tanh(dy.affine_transform([b_u, w_u, emb]))
                    c = dy.cmult(i, u)
                else:
                    h1, c1 = states[id(node.left)]
                    h2, c2 = states[id(node.right)]
                    e = dy.concatenate([h1, h2])
                    i = dy.logistic(dy.affine_transform([b_i, u_i, e]))
                    o = dy.logistic(dy.affine_transform([b_o, u_o, e]))
                    f1 = dy.logistic(dy.affine_transform([b_f, u_f1, h1]))
                    f2 = dy.logistic(dy.affine_transform([b_f, u_f2, h2]))
                    u = dy.tanh(dy.affine_transform([b_u, u_u, e]))
                    c = dy.cmult(i, u) + dy.cmult(f1, c1) + dy.cmult(f2, c2)
                h = dy.cmult(o, dy.tanh(c))
                states[id(node)] = h, c
                losses.append(dy.pickneglogsoftmax(w * h, node.label))
        return dy.esum(losses)


class DynetRnnLm(_DynetModel):
    """The LSTM language model, a mini-batch batched by hand as ``rnnlm-batch.py`` does."""

    def __init__(self, dy: Any, params: Mapping[str, np.ndarray]) -> None:
        super().__init__(dy)
        self.table = self.pc.lookup_parameters_from_numpy(np.asarray(params["words.table"]))
        self.rnn = self._lstm(params, "lstm")
        self.p_w = _matrix(self.pc, params["softmax.w"])
        self.p_b = self.pc.parameters_from_numpy(np.asarray(params["softmax.b"]))
        self._trainer()

    def total(self, batch: Sequence[Sentence]) -> Any:
        dy = self.dy
        dy.renew_cg()
        sentences = sorted(batch, key=len, reverse=True)  # the longest first: it sets the steps
        w, b = self.p_w, self.p_b
        state = self.rnn.initial_state().add_input(dy.lookup_batch(self.table, [START] * len(sentences)))
        losses = []
        steps = len(sentences[0])
        for t in range(steps):
            wids = [s[t] if len(s) > t else START for s in sentences]
            loss = dy.pickneglogsoftmax_batch(dy.affine_transform([b, w, state.output()]), wids)
            if len(sentences[-1]) <= t:  # some sentence has ended: mask its loss
                mask = dy.inputVector([1.0 if len(s) > t else 0.0 for s in sentences])
                loss = loss * dy.reshape(mask, (1,), len(sentences))
            losses.append(loss)
            if t + 1 < steps:
                state = state.add_input(dy.lookup_batch(self.table, wids))
        return dy.sum_batches(dy.esum(losses))


def dynet_model(dy: Any, data: TaskData, params: Mapping[str, np.ndarray]) -> _DynetModel:
    """A fresh DyNet model of ``data``'s task, from ``params`` (the monadl model's weights)."""
    if data.task == "treenn":
        return DynetTreeNN(dy, params, data.word_ids())
    if data.task == "rnnlm-batch":
        return DynetRnnLm(dy, params)
    return DynetTagger(dy, params, chars=data.task == "bilstm-tagger-withchar")


# ---------------------------------------------------------------------------------------------------
# The worker process and its driver


def worker(folder: str) -> None:
    """The worker's main. Reads ``config.json`` of ``folder`` (autobatch, mem, seed), sets DyNet up,
    and answers one request a line on stdin:

    ``task NAME``   read ``NAME.json`` (a ``TaskData``) and ``NAME.npz`` (the weights, no pickle)
    ``new``         a fresh model of the task, from those weights
    ``step I...``   one step on the training instances ``I...``; answers the loss
    ``eval I...``   the summed loss of the held-out instances ``I...``, forward only
    ``plan JSON``   the batches of a segment: a list of lists of training instances
    ``segment``     one step on each batch of the plan, in turn (one answer for them all: a timed
                    segment pays for one round trip of the pipe, not one a step)

    An error ends the worker, its traceback on stderr, which the driver reports.
    """
    root = Path(folder)
    config = json.loads((root / "config.json").read_text())
    import dynet_config  # type: ignore[import-not-found, import-untyped, unused-ignore]

    dynet_config.set(mem=config["mem"], random_seed=config["seed"] + 1, autobatch=int(config["autobatch"]))
    import dynet as dy  # type: ignore[import-not-found, import-untyped, unused-ignore]

    data: TaskData | None = None
    params: dict[str, np.ndarray] = {}
    model: _DynetModel | None = None
    plan: list[list[Any]] = []
    print(_MARK + "ready", flush=True)
    for line in sys.stdin:
        command, _, arguments = line.strip().partition(" ")
        rest = arguments.split()
        value = 0.0
        if command == "task":
            data = suite_data.load(root / f"{rest[0]}.json")
            with np.load(root / f"{rest[0]}.npz", allow_pickle=False) as saved:
                params = {name: saved[name] for name in saved.files}
            model = None
        elif command == "new":
            assert data is not None, "new before task"
            model = dynet_model(dy, data, params)
        elif command in ("step", "eval"):
            assert data is not None and model is not None, f"{command} before new"
            indices = [int(i) for i in rest]
            if command == "step":
                value = model.step([data.train[i] for i in indices])
            else:
                value = model.evaluate([data.held_out[i] for i in indices])
        elif command == "plan":
            assert data is not None, "plan before task"
            plan = [[data.train[i] for i in batch] for batch in json.loads(arguments)]
        elif command == "segment":
            assert model is not None, "segment before new"
            for batch in plan:
                model.step(batch)
        else:
            raise ValueError(f"unknown request {command!r}")
        print(f"{_MARK}done {value!r}", flush=True)


class DynetPeer(WorkerProcess):
    """A DyNet worker process (autobatching on or off), run request by request from here. A context
    manager; a worker that cannot start (``dynet`` missing or failing) raises ``RuntimeError``."""

    def __init__(self, autobatch: bool, *, mem: int, seed: int) -> None:
        self.implementation = "dynet-autobatch" if autobatch else "dynet"
        config = json.dumps({"autobatch": autobatch, "mem": str(mem), "seed": seed})
        super().__init__(
            self.implementation,
            "monadl.bench.suite_dynet",
            "worker",
            _MARK,
            lambda folder: (folder / "config.json").write_text(config),
        )

    def load_task(self, data: TaskData, params: Mapping[str, np.ndarray]) -> None:
        """Sends ``data`` and the initial weights ``params`` to the worker."""
        suite_data.dump(data, self.folder / f"{data.task}.json")
        arrays: dict[str, Any] = dict(params)
        np.savez(self.folder / f"{data.task}.npz", allow_pickle=False, **arrays)
        self._ask(f"task {data.task}")

    def new_model(self) -> None:
        """A fresh model of the task, from its initial weights."""
        self._ask("new")

    def step(self, indices: Sequence[int]) -> float:
        """One step on the training instances ``indices``; its loss."""
        return self._ask("step " + " ".join(map(str, indices)))

    def evaluate(self, indices: Sequence[int]) -> float:
        """The summed loss of the held-out instances ``indices``."""
        return self._ask("eval " + " ".join(map(str, indices)))

    def prepare(self, batches: Sequence[Sequence[int]]) -> None:
        """Sets the batches (training instances) that :meth:`segment` steps on, in order."""
        self._ask("plan " + json.dumps([list(b) for b in batches]))

    def segment(self) -> None:
        """One step on each batch of the plan, in turn."""
        self._ask("segment")

    def _ask(self, request: str) -> float:
        words = self.ask(request)
        return float(words[1]) if len(words) > 1 else 0.0
