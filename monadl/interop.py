"""PyTorch interop: a PyTorch ``state_dict`` loaded into monadl's modules, and a monadl model
exported as one, in PyTorch's names and layouts; a safetensors file of either, read and written
without PyTorch.

``state_dict(model)`` gives a dict of NumPy arrays named as PyTorch names the parameters and
buffers of the matching ``torch.nn`` modules; ``load_state_dict(model, state_dict)`` puts such a
dict (NumPy arrays or torch tensors) into ``model``. ``save_safetensors`` and ``load_safetensors``
write and read the same as a safetensors file (``safetensors.torch.load_file`` reads it, and
``safetensors.torch.save_file(module.state_dict(), path)`` writes one this reads). Importing this
module imports no PyTorch, and the safetensors path needs none installed.

A model's names follow its fields, as ``module.weights()`` does (a module reached by two paths is
named by the first): a field ``encoder`` holding a ``Linear`` gives ``encoder.weight`` and
``encoder.bias``, as an attribute ``encoder`` holding an ``nn.Linear`` does in PyTorch; lists,
tuples and dicts of modules are PyTorch's ``ModuleList`` and ``ModuleDict`` (``layers.0.weight``).
Each module kind below is converted as a whole, in the layout of its PyTorch counterpart:

| ``monadl.nn`` | ``torch.nn``: keys (layouts) |
|---|---|
| ``Linear`` | ``Linear``: ``weight`` (out, in: ``w`` transposed), ``bias`` |
| ``MLP`` | ``Sequential(Linear, act, Linear, ...)``: layer ``k`` at index ``2k`` (``0.weight``, ...) |
| ``Embedding`` | ``Embedding``: ``weight`` (the ``table``) |
| ``Conv1d``, ``Conv2d`` | the same: ``weight`` (O, C // groups, ...), ``bias`` |
| ``ConvTranspose2d`` | the same: ``weight`` (C, O // groups, KH, KW), ``bias`` |
| ``BatchNorm1d``, ``2d`` | the same: ``weight``, ``bias``, ``running_mean``, ``running_var``, |
| | ``num_batches_tracked`` |
| ``LayerNorm`` | the same, over the last axis: ``weight``, ``bias`` |
| ``GroupNorm`` | the same: ``weight``, ``bias`` |
| ``RMSNorm`` | the same: ``weight`` |
| ``LSTM``, ``GRU`` | the same: ``weight_ih_l{k}``, ``weight_hh_l{k}``, ``bias_ih_l{k}``, ``bias_hh_l{k}`` |
| | (``..._l{k}_reverse``: the backward direction) |
| ``LSTMCell``, ``GRUCell`` | the same: ``weight_ih``, ``weight_hh``, ``bias_ih``, ``bias_hh`` |
| ``MultiHeadAttention`` | ``MultiheadAttention``: ``in_proj_weight`` (3E, E: ``qkv.w`` transposed), |
| | ``in_proj_bias``, ``out_proj.weight``, ``out_proj.bias`` |
| | (``q_proj_weight``, ``k_proj_weight``, ``v_proj_weight`` when kdim or vdim is not E) |
| ``TransformerEncoderLayer`` | the same: ``self_attn.*`` (``attention``), ``linear1.*`` (``ff1``), |
| | ``linear2.*`` (``ff2``), ``norm1.*``, ``norm2.*`` |
| ``TransformerDecoderLayer`` | the same: ``self_attn.*`` (``attention``), ``multihead_attn.*`` |
| | (``cross_attention``), ``linear1.*``, ``linear2.*``, ``norm1.*``, ``norm2.*``, ``norm3.*`` |
| ``Sequential`` | the same: layer ``k`` at index ``k`` (``0.weight``; a function, such as |
| | ``ml.relu``, takes an index as PyTorch's ``nn.ReLU()`` does) |
| an ``ArrayWeight``, | an ``nn.Parameter`` or a registered buffer of its name, as it is |
| ``FloatWeight``, ``ArrayBuffer`` | |

Other modules (a ``Module`` of your own, ``Dropout``, pooling, ``Flatten``) are walked into by
their fields.
State that PyTorch has no place for (a dropout's generator, a buffer of your own kind) is left out.

The recurrent layouts: PyTorch's ``weight_ih`` stacks the gates' input matrices, in the order
i, f, g, o for an LSTM (monadl's cell gates ``i``, ``f``, ``u``, ``o``) and r, z, n for a GRU;
``weight_hh`` the hidden ones. A monadl gate's matrix is ``[W_ih_gate; W_hh_gate]`` transposed,
the input's rows first, with one bias, PyTorch's ``b_ih + b_hh`` (the same function): a load adds
them, an export puts the sum in ``bias_ih`` and zeros in ``bias_hh`` (for a GRU's candidate, whose
hidden bias is inside the reset gate's product, both stay apart: ``n_x.b`` and ``n_h.b``). So a
round trip from PyTorch gives the same outputs, with the biases split otherwise.

A ``state_dict`` holds no settings: build the monadl module with the PyTorch one's (heads,
``eps``, ``momentum``, strides and padding, ``norm_first``, the activation; PyTorch's ``"gelu"``
is the exact one, monadl's ``ml.gelu`` the tanh approximation). ``num_batches_tracked`` is read
and checked but not kept (monadl's batch norm always uses its ``momentum``; PyTorch reads the count
only when ``momentum=None``); an export writes 0.

A load checks everything before it changes anything: a missing key, an unexpected one (unless
``strict=False``), a shape or a kind of dtype (floats, integers) that does not fit, a NaN or
infinite value (unless ``allow_non_finite=True``): an :class:`InteropError` naming every key at
fault, its shape and the shape the model takes. Then every weight and buffer loaded is committed
at once, as a training step's are (a prediction beside it sees all of the old values or all of the
new). Values are cast to the model's dtypes (a float32 file into a float64 model), and put on its
weights' array namespace and device (a CuPy model's GPU). A weight loaded starts its optimizer
afresh: its optimizer state (Adam's moments) is dropped.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from monadl.checkpoint import CheckpointError
from monadl.data.files import atomic_write_bytes, read_regular_file
from monadl.dsl.core.weights import ArrayWeight, FloatWeight
from monadl.nn.attention import MultiHeadAttention, TransformerDecoderLayer, TransformerEncoderLayer
from monadl.nn.batchnorm import BatchNorm1d, BatchNorm2d
from monadl.nn.buffer import ArrayBuffer
from monadl.nn.container import Sequential
from monadl.nn.conv import Conv1d, Conv2d, ConvTranspose2d
from monadl.nn.embedding import Embedding
from monadl.nn.gru import GRUCell
from monadl.nn.linear import MLP, Linear
from monadl.nn.lstm import LSTMCell
from monadl.nn.module import children_of, moved_to
from monadl.nn.norm import GroupNorm, LayerNorm, RMSNorm
from monadl.nn.sequence import GRU, LSTM
from monadl.runtime.versions import COMMIT_LOCK, publish, read
from monadl.typeclasses.backend import dtype_name, is_array, namespace, to_numpy

__all__ = [
    "InteropError",
    "LoadResult",
    "load_safetensors",
    "load_state_dict",
    "save_safetensors",
    "state_dict",
]

NDArray = np.ndarray[Any, Any]
Arrays = dict[str, NDArray]
Target = ArrayWeight | FloatWeight | ArrayBuffer
"""What a load writes: a weight's data or an array buffer's."""
Write = tuple[Target, NDArray]
"""A target and its new value, in monadl's layout, on the host."""


class InteropError(CheckpointError):
    """A state dict or a safetensors file that does not fit the model (a missing or unexpected key,
    a shape or dtype that does not fit, a non-finite value: the message names each key and its
    shapes), or a model that has no PyTorch form. A :class:`~monadl.CheckpointError`: one
    ``except`` catches both kinds of load."""


class LoadResult(NamedTuple):
    """What a load did not match (as PyTorch's ``load_state_dict`` returns): the model's keys the
    state dict lacked and the state dict's keys the model has no place for. Both empty after a
    ``strict`` load (which refuses either)."""

    missing_keys: list[str]
    unexpected_keys: list[str]


# ------------------------------------------------------------------------------------ the kinds


@dataclass(frozen=True)
class _Kind:
    """A module kind's PyTorch form: ``export(module)`` gives its arrays by PyTorch's names (relative
    to the module) in PyTorch's layouts; ``convert(module, arrays)``, given arrays of the same names,
    shapes and dtypes, gives the new value of each of its weights and buffers in monadl's layouts."""

    name: str
    export: Callable[[Any], Arrays]
    convert: Callable[[Any, Arrays], list[Write]]


def _host(target: Target) -> NDArray:
    """A weight's or a buffer's newest committed value as a NumPy array (read under the commit lock
    by the callers: every value as of one commit)."""
    data = read(target.head, None).data
    return np.asarray(data, dtype=np.float64) if isinstance(data, float) else np.asarray(to_numpy(data))


def _transposed(weight: ArrayWeight) -> NDArray:
    return _host(weight).T


def _bias(linear: Linear) -> ArrayWeight:
    if linear.b is None:  # (the kinds ask only where the exported keys said there was one)
        raise InteropError(f"{linear!r} has no bias")
    return linear.b


def _prefixed(prefix: str, arrays: Arrays) -> Arrays:
    return {prefix + name: array for name, array in arrays.items()}


def _part(arrays: Arrays, prefix: str) -> Arrays:
    """The arrays under ``prefix``, named without it."""
    return {name[len(prefix) :]: array for name, array in arrays.items() if name.startswith(prefix)}


def _identity_export(target: Target) -> Arrays:
    return {"": _host(target)}


def _identity_convert(target: Target, arrays: Arrays) -> list[Write]:
    return [(target, arrays[""])]


def _linear_export(m: Linear) -> Arrays:
    out = {"weight": _transposed(m.w)}
    if m.b is not None:
        out["bias"] = _host(m.b)
    return out


def _linear_convert(m: Linear, t: Arrays) -> list[Write]:
    writes: list[Write] = [(m.w, t["weight"].T)]
    if m.b is not None:
        writes.append((m.b, t["bias"]))
    return writes


def _mlp_export(m: MLP) -> Arrays:
    out: Arrays = {}
    for k, layer in enumerate(m.layers):
        out.update(_prefixed(f"{2 * k}.", _linear_export(layer)))
    return out


def _mlp_convert(m: MLP, t: Arrays) -> list[Write]:
    return [w for k, layer in enumerate(m.layers) for w in _linear_convert(layer, _part(t, f"{2 * k}."))]


def _embedding_export(m: Embedding) -> Arrays:
    return {"weight": _host(m.table)}


def _embedding_convert(m: Embedding, t: Arrays) -> list[Write]:
    return [(m.table, t["weight"])]


def _conv_export(m: Conv1d | Conv2d | ConvTranspose2d) -> Arrays:
    out = {"weight": _host(m.w)}
    if m.b is not None:
        out["bias"] = _host(m.b)
    return out


def _conv_convert(m: Conv1d | Conv2d | ConvTranspose2d, t: Arrays) -> list[Write]:
    writes: list[Write] = [(m.w, t["weight"])]
    if m.b is not None:
        writes.append((m.b, t["bias"]))
    return writes


def _batch_norm_export(m: BatchNorm1d | BatchNorm2d) -> Arrays:
    return {
        "weight": _host(m.weight),
        "bias": _host(m.bias),
        "running_mean": _host(m.running_mean),
        "running_var": _host(m.running_var),
        # monadl counts no batches: its momentum is always set (PyTorch reads the count only
        # when its momentum is None)
        "num_batches_tracked": np.zeros((), dtype=np.int64),
    }


def _batch_norm_convert(m: BatchNorm1d | BatchNorm2d, t: Arrays) -> list[Write]:
    return [
        (m.weight, t["weight"]),
        (m.bias, t["bias"]),
        (m.running_mean, t["running_mean"]),
        (m.running_var, t["running_var"]),
    ]


def _layer_norm_export(m: LayerNorm | GroupNorm) -> Arrays:
    out = {}
    if m.weight is not None:
        out["weight"] = _host(m.weight)
    if m.bias is not None:
        out["bias"] = _host(m.bias)
    return out


def _layer_norm_convert(m: LayerNorm | GroupNorm, t: Arrays) -> list[Write]:
    return [(w, t[name]) for name, w in (("weight", m.weight), ("bias", m.bias)) if w is not None]


def _rms_norm_export(m: RMSNorm) -> Arrays:
    return {} if m.weight is None else {"weight": _host(m.weight)}


def _rms_norm_convert(m: RMSNorm, t: Arrays) -> list[Write]:
    return [] if m.weight is None else [(m.weight, t["weight"])]


# An LSTM cell's gates in PyTorch's order (i, f, g, o): monadl's candidate gate is ``u``.
def _lstm_gates(cell: LSTMCell) -> tuple[Linear, Linear, Linear, Linear]:
    return cell.i, cell.f, cell.u, cell.o


def _lstm_cell_export(cell: LSTMCell) -> Arrays:
    """PyTorch's ``nn.LSTMCell`` arrays: the gates' input rows stacked, their hidden rows stacked,
    and each gate's bias in ``bias_ih`` (``bias_hh`` zeros: the sum is the same)."""
    n = cell.inputs
    ws = [_host(gate.w) for gate in _lstm_gates(cell)]  # each (inputs + hidden, hidden)
    b_ih = np.concatenate([_host(_bias(gate)) for gate in _lstm_gates(cell)])
    return {
        "weight_ih": np.concatenate([w[:n].T for w in ws]),
        "weight_hh": np.concatenate([w[n:].T for w in ws]),
        "bias_ih": b_ih,
        "bias_hh": np.zeros_like(b_ih),
    }


def _lstm_cell_convert(cell: LSTMCell, t: Arrays) -> list[Write]:
    h = cell.hidden
    writes: list[Write] = []
    for k, gate in enumerate(_lstm_gates(cell)):
        rows = slice(k * h, (k + 1) * h)
        writes.append((gate.w, np.concatenate([t["weight_ih"][rows].T, t["weight_hh"][rows].T])))
        writes.append((_bias(gate), t["bias_ih"][rows] + t["bias_hh"][rows]))
    return writes


def _gru_cell_export(cell: GRUCell) -> Arrays:
    """PyTorch's ``nn.GRUCell`` arrays (gates r, z, n): the reset and update gates' biases in
    ``bias_ih`` (``bias_hh`` zeros there), the candidate's input and hidden biases apart."""
    n = cell.inputs
    r, z = _host(cell.r.w), _host(cell.z.w)  # each (inputs + hidden, hidden)
    b_nh = _host(_bias(cell.n_h))
    return {
        "weight_ih": np.concatenate([r[:n].T, z[:n].T, _transposed(cell.n_x.w)]),
        "weight_hh": np.concatenate([r[n:].T, z[n:].T, _transposed(cell.n_h.w)]),
        "bias_ih": np.concatenate([_host(_bias(g)) for g in (cell.r, cell.z, cell.n_x)]),
        "bias_hh": np.concatenate([np.zeros_like(b_nh), np.zeros_like(b_nh), b_nh]),
    }


def _gru_cell_convert(cell: GRUCell, t: Arrays) -> list[Write]:
    h = cell.hidden
    w_ih, w_hh, b_ih, b_hh = t["weight_ih"], t["weight_hh"], t["bias_ih"], t["bias_hh"]
    writes: list[Write] = []
    for k, gate in enumerate((cell.r, cell.z)):
        rows = slice(k * h, (k + 1) * h)
        writes.append((gate.w, np.concatenate([w_ih[rows].T, w_hh[rows].T])))
        writes.append((_bias(gate), b_ih[rows] + b_hh[rows]))
    candidate = slice(2 * h, 3 * h)
    writes += [
        (cell.n_x.w, w_ih[candidate].T),
        (_bias(cell.n_x), b_ih[candidate]),
        (cell.n_h.w, w_hh[candidate].T),
        (_bias(cell.n_h), b_hh[candidate]),
    ]
    return writes


def _directions(m: LSTM | GRU) -> list[tuple[list[Any], str]]:
    return (
        [(m.forward_cells, ""), (m.backward_cells, "_reverse")]
        if m.backward_cells
        else [(m.forward_cells, "")]
    )


def _stacked_export(cell_export: Callable[[Any], Arrays]) -> Callable[[Any], Arrays]:
    """A stacked layer's arrays, in PyTorch's order: layer by layer, the forward direction first."""

    def export(m: LSTM | GRU) -> Arrays:
        out: Arrays = {}
        for layer in range(m.layers):
            for cells, suffix in _directions(m):
                for name, array in cell_export(cells[layer]).items():
                    out[f"{name}_l{layer}{suffix}"] = array
        return out

    return export


def _stacked_convert(
    cell_convert: Callable[[Any, Arrays], list[Write]],
) -> Callable[[Any, Arrays], list[Write]]:
    def convert(m: LSTM | GRU, t: Arrays) -> list[Write]:
        writes: list[Write] = []
        for layer in range(m.layers):
            for cells, suffix in _directions(m):
                names = ("weight_ih", "weight_hh", "bias_ih", "bias_hh")
                writes += cell_convert(cells[layer], {name: t[f"{name}_l{layer}{suffix}"] for name in names})
        return writes

    return convert


def _attention_parts(m: MultiHeadAttention) -> tuple[Linear, Linear, Linear] | None:
    """The separate query, key and value projections (None: one packed ``qkv``)."""
    return None if m.k is None or m.v is None else (m.qkv, m.k, m.v)


def _attention_export(m: MultiHeadAttention) -> Arrays:
    parts = _attention_parts(m)
    linears = [m.qkv, m.out, *(parts or ())]
    biased = {linear.b is not None for linear in linears}
    if len(biased) > 1:
        raise InteropError(
            "MultiHeadAttention: PyTorch's has a bias on every projection or on none; this one has "
            "biases on some projections only"
        )
    out: Arrays = {}
    if parts is None:
        out["in_proj_weight"] = _transposed(m.qkv.w)
    elif m.kdim == m.vdim == m.features:  # (PyTorch packs projections of one size)
        out["in_proj_weight"] = np.concatenate([_transposed(p.w) for p in parts])
    else:
        for name, p in zip("qkv", parts, strict=True):
            out[f"{name}_proj_weight"] = _transposed(p.w)
    if biased == {True}:
        out["in_proj_bias"] = (
            _host(_bias(m.qkv)) if parts is None else np.concatenate([_host(_bias(p)) for p in parts])
        )
    out.update(_prefixed("out_proj.", _linear_export(m.out)))
    return out


def _attention_convert(m: MultiHeadAttention, t: Arrays) -> list[Write]:
    parts = _attention_parts(m)
    e = m.features
    writes = _linear_convert(m.out, _part(t, "out_proj."))
    if parts is None:
        writes.append((m.qkv.w, t["in_proj_weight"].T))
        if "in_proj_bias" in t:
            writes.append((_bias(m.qkv), t["in_proj_bias"]))
        return writes
    thirds = [slice(k * e, (k + 1) * e) for k in range(3)]
    for name, p, rows in zip("qkv", parts, thirds, strict=True):
        packed = t.get("in_proj_weight")
        writes.append((p.w, (t[f"{name}_proj_weight"] if packed is None else packed[rows]).T))
        if "in_proj_bias" in t:
            writes.append((_bias(p), t["in_proj_bias"][rows]))
    return writes


def _encoder_export(m: TransformerEncoderLayer) -> Arrays:
    return {
        **_prefixed("self_attn.", _attention_export(m.attention)),
        **_prefixed("linear1.", _linear_export(m.ff1)),
        **_prefixed("linear2.", _linear_export(m.ff2)),
        **_prefixed("norm1.", _layer_norm_export(m.norm1)),
        **_prefixed("norm2.", _layer_norm_export(m.norm2)),
    }


def _encoder_convert(m: TransformerEncoderLayer, t: Arrays) -> list[Write]:
    return [
        *_attention_convert(m.attention, _part(t, "self_attn.")),
        *_linear_convert(m.ff1, _part(t, "linear1.")),
        *_linear_convert(m.ff2, _part(t, "linear2.")),
        *_layer_norm_convert(m.norm1, _part(t, "norm1.")),
        *_layer_norm_convert(m.norm2, _part(t, "norm2.")),
    ]


def _decoder_export(m: TransformerDecoderLayer) -> Arrays:
    return {
        **_prefixed("self_attn.", _attention_export(m.attention)),
        **_prefixed("multihead_attn.", _attention_export(m.cross_attention)),
        **_prefixed("linear1.", _linear_export(m.ff1)),
        **_prefixed("linear2.", _linear_export(m.ff2)),
        **_prefixed("norm1.", _layer_norm_export(m.norm1)),
        **_prefixed("norm2.", _layer_norm_export(m.norm2)),
        **_prefixed("norm3.", _layer_norm_export(m.norm3)),
    }


def _decoder_convert(m: TransformerDecoderLayer, t: Arrays) -> list[Write]:
    return [
        *_attention_convert(m.attention, _part(t, "self_attn.")),
        *_attention_convert(m.cross_attention, _part(t, "multihead_attn.")),
        *_linear_convert(m.ff1, _part(t, "linear1.")),
        *_linear_convert(m.ff2, _part(t, "linear2.")),
        *_layer_norm_convert(m.norm1, _part(t, "norm1.")),
        *_layer_norm_convert(m.norm2, _part(t, "norm2.")),
        *_layer_norm_convert(m.norm3, _part(t, "norm3.")),
    ]


_KINDS: tuple[tuple[type | tuple[type, ...], _Kind], ...] = (
    (Linear, _Kind("Linear", _linear_export, _linear_convert)),
    (MLP, _Kind("MLP", _mlp_export, _mlp_convert)),
    (Embedding, _Kind("Embedding", _embedding_export, _embedding_convert)),
    ((Conv1d, Conv2d, ConvTranspose2d), _Kind("convolution", _conv_export, _conv_convert)),
    ((BatchNorm1d, BatchNorm2d), _Kind("batch norm", _batch_norm_export, _batch_norm_convert)),
    (LayerNorm, _Kind("LayerNorm", _layer_norm_export, _layer_norm_convert)),
    (GroupNorm, _Kind("GroupNorm", _layer_norm_export, _layer_norm_convert)),
    (RMSNorm, _Kind("RMSNorm", _rms_norm_export, _rms_norm_convert)),
    (LSTMCell, _Kind("LSTMCell", _lstm_cell_export, _lstm_cell_convert)),
    (GRUCell, _Kind("GRUCell", _gru_cell_export, _gru_cell_convert)),
    (LSTM, _Kind("LSTM", _stacked_export(_lstm_cell_export), _stacked_convert(_lstm_cell_convert))),
    (GRU, _Kind("GRU", _stacked_export(_gru_cell_export), _stacked_convert(_gru_cell_convert))),
    (MultiHeadAttention, _Kind("MultiHeadAttention", _attention_export, _attention_convert)),
    (TransformerEncoderLayer, _Kind("TransformerEncoderLayer", _encoder_export, _encoder_convert)),
    (TransformerDecoderLayer, _Kind("TransformerDecoderLayer", _decoder_export, _decoder_convert)),
    ((ArrayWeight, FloatWeight), _Kind("weight", _identity_export, _identity_convert)),
    (ArrayBuffer, _Kind("buffer", _identity_export, _identity_convert)),
)


# ------------------------------------------------------------------------------ the model's parts


@dataclass(frozen=True)
class _Leaf:
    """A part of the model converted as a whole: a module of a known kind, or a weight or buffer."""

    path: str
    kind: _Kind
    module: Any

    def key(self, name: str) -> str:
        """The PyTorch key of the part's array ``name``."""
        return f"{self.path}.{name}" if self.path and name else self.path or name

    def describe(self) -> str:
        return (
            f"the model's {self.kind.name} at {self.path!r}" if self.path else f"the model's {self.kind.name}"
        )


def _kind_of(value: object) -> _Kind | None:
    return next((kind for cls, kind in _KINDS if isinstance(value, cls)), None)


def _leaves(model: object) -> list[_Leaf]:
    """The model's parts of known kinds by path, depth first in the order of the fields (as
    :func:`~monadl.nn.weights_of` walks), each listed once, under its first path."""
    found: list[_Leaf] = []
    seen: set[int] = set()
    root = _kind_of(model)
    if root is not None and isinstance(model, (ArrayWeight, FloatWeight, ArrayBuffer)):
        name = model.name if isinstance(model, (ArrayWeight, FloatWeight)) and model.name else None
        return [_Leaf(name or ("buffer" if isinstance(model, ArrayBuffer) else "weight"), root, model)]
    stack: list[tuple[str, object]] = [("", model)]
    while stack:
        path, value = stack.pop()
        if id(value) in seen:
            continue
        kind = _kind_of(value)
        if kind is not None:
            seen.add(id(value))
            found.append(_Leaf(path, kind, value))
            continue
        children = (
            [(str(k), layer) for k, layer in enumerate(value.layers)]  # PyTorch's names: "0.weight"
            if isinstance(value, Sequential)
            else children_of(value, path, "monadl.interop")
        )
        if children is None:
            continue
        seen.add(id(value))
        stack.extend(reversed([(f"{path}.{key}" if path else key, child) for key, child in children]))
    return found


def _exported(model: object, caller: str) -> list[tuple[_Leaf, Arrays]]:
    """Every part of the model with its arrays by their names in the part, read as of one commit
    (the caller holds :data:`~monadl.runtime.versions.COMMIT_LOCK`)."""
    parts: list[tuple[_Leaf, Arrays]] = []
    owners: dict[str, _Leaf] = {}
    for leaf in _leaves(model):
        arrays = leaf.kind.export(leaf.module)
        for name in arrays:
            key = leaf.key(name)
            if key in owners:
                raise InteropError(
                    f"{caller}: two parts of the model have the PyTorch name {key!r}: "
                    f"{owners[key].describe()} and {leaf.describe()}"
                )
            owners[key] = leaf
        parts.append((leaf, arrays))
    return parts


# ------------------------------------------------------------------------------------------- export


def state_dict(model: object) -> dict[str, NDArray]:
    """``model``'s weights and array buffers as a PyTorch ``state_dict`` would hold them: new
    NumPy arrays (C order, the weights' dtypes) by PyTorch's names, in PyTorch's layouts (see the
    module), read as of one commit. ``torch_module.load_state_dict({k: torch.from_numpy(v) for k, v
    in state_dict(model).items()})`` loads it into the matching PyTorch module. Raises
    :class:`InteropError` for a model with no PyTorch form (two parts of one name, an attention
    with biases on some projections only)."""
    with COMMIT_LOCK:
        parts = _exported(model, "state_dict")
    return {
        leaf.key(name): np.array(array, copy=True, order="C")
        for leaf, arrays in parts
        for name, array in arrays.items()
    }


def save_safetensors(path: str | Path, model: object, *, metadata: Mapping[str, str] | None = None) -> None:
    """Writes :func:`state_dict` of ``model`` to ``path`` as a safetensors file, atomically (as
    :func:`monadl.save` writes), with ``metadata`` (str to str) and ``{"format": "pt"}`` (as
    Hugging Face's tools expect of a PyTorch file) in its header. Needs no PyTorch."""
    from safetensors.numpy import save as encode

    described = {"format": "pt", **(metadata or {})}
    bad = [(k, v) for k, v in described.items() if not isinstance(k, str) or not isinstance(v, str)]
    if bad:
        raise TypeError(f"save_safetensors: metadata must map str to str, got {bad[0][0]!r}: {bad[0][1]!r}")
    atomic_write_bytes(Path(path), encode(state_dict(model), metadata=described))


# ------------------------------------------------------------------------------------------- import


def load_state_dict(
    model: object,
    state_dict: Mapping[str, Any],
    *,
    strict: bool = True,
    allow_non_finite: bool = False,
) -> LoadResult:
    """Puts a PyTorch ``state_dict`` (PyTorch's names and layouts: see the module), a mapping of
    keys to torch tensors or NumPy arrays, into ``model``'s weights and array buffers, all at once
    or not at all (see the module). ``strict``: a missing or unexpected key is an error (else the
    parts the keys name are loaded, and the keys not matched are returned). ``allow_non_finite``:
    load NaN and infinite values. Raises :class:`InteropError` naming each key at fault."""
    if not isinstance(state_dict, Mapping):
        raise TypeError(
            f"load_state_dict: expected a mapping of keys to arrays, got {type(state_dict).__name__}"
        )
    given = {str(key): _as_numpy("load_state_dict", key, value) for key, value in state_dict.items()}
    return _load(model, given, strict, allow_non_finite, "load_state_dict")


def load_safetensors(
    path: str | Path, model: object, *, strict: bool = True, allow_non_finite: bool = False
) -> LoadResult:
    """:func:`load_state_dict` from a safetensors file in PyTorch's names (as
    ``safetensors.torch.save_file(module.state_dict(), path)`` writes, or :func:`save_safetensors`).
    Read as :func:`monadl.load` reads a file (a regular file only; no pickle, no code run); needs
    no PyTorch. A bfloat16 file cannot be read without PyTorch: load it with
    ``safetensors.torch.load_file`` and pass the result to :func:`load_state_dict`."""
    from safetensors.numpy import load as decode

    path = Path(path)
    raw = read_regular_file(path)
    try:
        tensors: dict[str, NDArray] = decode(raw)
    except Exception as e:  # noqa: BLE001 - safetensors' own errors, a torn header, a dtype NumPy lacks
        raise InteropError(f"{path}: not a readable safetensors file ({type(e).__name__}: {e})") from None
    return _load(model, tensors, strict, allow_non_finite, str(path))


def _as_numpy(caller: str, key: object, value: object) -> NDArray:
    """A state dict's value on the host: a torch tensor (detached, bfloat16 widened to float32,
    which holds it exactly), a NumPy array or scalar, an array of another namespace."""
    if not isinstance(key, str):
        raise InteropError(f"{caller}: a state dict's keys are str, got {key!r}")
    if isinstance(value, np.ndarray):
        return value
    if type(value).__module__.split(".")[0] == "torch" and hasattr(value, "detach"):
        tensor: Any = value
        try:
            tensor = tensor.detach().cpu()
            if str(tensor.dtype) == "torch.bfloat16":
                tensor = tensor.float()
            return np.asarray(tensor.numpy())
        except (TypeError, RuntimeError) as e:  # a dtype NumPy lacks (float8), a tensor without data
            raise InteropError(f"{caller}: {key!r} cannot be read as a NumPy array ({e})") from None
    if isinstance(value, (np.generic, int, float)) and not isinstance(value, bool):
        return np.asarray(value)
    if is_array(value):
        return np.asarray(to_numpy(value))
    raise InteropError(f"{caller}: {key!r} is a {type(value).__name__}, not an array or a torch tensor")


def _described(array: NDArray) -> str:
    return f"{array.dtype} {tuple(array.shape)}"


def _load(
    model: object, given: Mapping[str, NDArray], strict: bool, allow_non_finite: bool, where: str
) -> LoadResult:
    with COMMIT_LOCK:  # every check and conversion against one commit's values, then the commit
        parts = _exported(model, where)
        expected = {leaf.key(name): (leaf, array) for leaf, arrays in parts for name, array in arrays.items()}
        missing = [key for key in expected if key not in given]
        unexpected = [key for key in given if key not in expected]
        problems: list[str] = []
        if strict:
            problems += [
                f"missing {key!r} ({_described(expected[key][1])}), for {expected[key][0].describe()}"
                for key in missing
            ]
            problems += [f"unexpected {key!r} ({_described(given[key])})" for key in unexpected]
        for key, array in given.items():
            if key in expected:
                problems += _problems(key, array, *expected[key], allow_non_finite)
        if problems:
            shown = "\n  ".join(problems[:_SHOWN])
            if len(problems) > _SHOWN:
                shown += f"\n  ... and {len(problems) - _SHOWN} more"
            hint = " (strict=False loads the keys they share)" if missing or unexpected else ""
            raise InteropError(f"{where}: the state dict does not fit the model{hint}:\n  {shown}")
        writes: dict[int, tuple[Target, Any, str]] = {}
        for leaf, arrays in parts:
            keys = {name: leaf.key(name) for name in arrays}
            if not any(key in given for key in keys.values()):
                continue  # (a part none of whose keys was given stays as it is, its optimizer state too)
            merged = {
                name: np.asarray(given[keys[name]], dtype=array.dtype) if keys[name] in given else array
                for name, array in arrays.items()
            }
            for target, value in leaf.kind.convert(leaf.module, merged):
                _add_write(writes, target, value, leaf, where)
        publish([(target, value, None) for target, value, _ in writes.values()])
    return LoadResult(missing, unexpected)


_SHOWN = 20
"""The problems a load's error lists one by one (the rest are counted)."""


def _problems(key: str, array: NDArray, leaf: _Leaf, like: NDArray, allow_non_finite: bool) -> list[str]:
    """What keeps the given ``array`` from the model's key ``key`` (whose value is ``like``)."""
    if tuple(array.shape) != tuple(like.shape):
        hint = ""
        if array.ndim == 2 and tuple(array.shape) == tuple(like.shape)[::-1]:
            hint = " (its transpose: is it in PyTorch's layout?)"
        return [f"{key!r} has shape {tuple(array.shape)}, {leaf.describe()} takes {tuple(like.shape)}{hint}"]
    if _dtype_kind(array) != _dtype_kind(like):
        return [f"{key!r} is {array.dtype}, {leaf.describe()} takes {_KIND_NAMES[_dtype_kind(like)]}"]
    if not allow_non_finite and array.dtype.kind == "f" and not np.isfinite(array).all():
        return [f"{key!r} holds NaN or infinite values (allow_non_finite=True loads them)"]
    return []


_KIND_NAMES = {"f": "floats", "i": "integers", "b": "bools"}


def _dtype_kind(array: NDArray) -> str:
    """Floats, integers (signed or not) or bools: a value is cast within its kind, not across."""
    kind: str = array.dtype.kind
    return "i" if kind == "u" else kind


def _add_write(
    writes: dict[int, tuple[Target, Any, str]], target: Target, value: NDArray, leaf: _Leaf, where: str
) -> None:
    """Adds ``target``'s new value, cast to its dtype and put on its namespace and device, to
    ``writes``; a target that two parts write (a weight shared by two modules) must get one value."""
    have = read(target.head, None).data
    if isinstance(have, float):
        new: Any = float(value)
    else:
        if tuple(value.shape) != tuple(have.shape):  # (the keys' shapes fit: the kinds keep to them)
            raise InteropError(
                f"{where}: {leaf.describe()} makes a {tuple(value.shape)} array for a {tuple(have.shape)} one"
            )
        host = np.array(value, dtype=np.dtype(dtype_name(have)), copy=True, order="C")
        if isinstance(have, np.ndarray):
            host.flags.writeable = False
            new = host
        else:  # the model's namespace and device (a CuPy model's GPU), as ``module.to(xp)`` moves
            new = moved_to(host, namespace(have), getattr(have, "device", None))
    earlier = writes.get(id(target))
    if earlier is not None:
        if not np.array_equal(to_numpy(earlier[1]), to_numpy(new)):
            raise InteropError(
                f"{where}: a weight shared by {earlier[2]} and {leaf.describe()} gets two different values"
            )
        return
    writes[id(target)] = (target, new, leaf.describe())
