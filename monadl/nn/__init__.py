"""Building blocks of models: :class:`Module`, a typed container whose weights and buffers (state
gradients do not train: :class:`ArrayBuffer`, :class:`GeneratorBuffer`, your own :class:`Buffer`)
are found by name, and builders made of it: :class:`Linear`, :class:`MLP`, :class:`Embedding`,
:class:`Dropout`, and the recurrent cells :class:`LSTMCell`, :class:`GRUCell` and
:class:`TreeLSTMCell`, whose calls merge under dynamic batching; :class:`LayerNorm`,
:class:`MultiHeadAttention` and :class:`TransformerEncoderLayer`."""

from monadl.nn.attention import MultiHeadAttention, TransformerEncoderLayer
from monadl.nn.buffer import ArrayBuffer, Buffer, BufferState, GeneratorBuffer
from monadl.nn.dropout import Dropout
from monadl.nn.embedding import Embedding
from monadl.nn.gru import GRUCell
from monadl.nn.linear import MLP, Linear
from monadl.nn.lstm import LSTMCell
from monadl.nn.module import Module, buffers_of, weights_of
from monadl.nn.norm import LayerNorm
from monadl.nn.tree_lstm import TreeLSTMCell

__all__ = [
    "MLP",
    "ArrayBuffer",
    "Buffer",
    "BufferState",
    "Dropout",
    "Embedding",
    "GRUCell",
    "GeneratorBuffer",
    "LSTMCell",
    "Linear",
    "Module",
    "TreeLSTMCell",
    "buffers_of",
    "weights_of",
    "LayerNorm",
    "MultiHeadAttention",
    "TransformerEncoderLayer",
]
