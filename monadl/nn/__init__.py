"""Building blocks of models: :class:`Module`, a typed container whose weights and buffers (state
gradients do not train: :class:`ArrayBuffer`, :class:`GeneratorBuffer`, your own :class:`Buffer`)
are found by name, and builders made of it: :class:`Linear`, :class:`MLP`, :class:`Embedding`,
:class:`Dropout`, the container :class:`Sequential` and :class:`Flatten`, :class:`Conv1d`,
:class:`Conv2d`, :class:`ConvTranspose2d`, :class:`MaxPool2d`, :class:`AvgPool2d`,
:class:`AdaptiveAvgPool2d`, the recurrent cells :class:`LSTMCell`, :class:`GRUCell` and
:class:`TreeLSTMCell`, whose calls merge under dynamic batching, the sequence layers :class:`LSTM`
and :class:`GRU` over them, :class:`LayerNorm`, :class:`GroupNorm`, :class:`RMSNorm`,
:class:`MultiHeadAttention`, :class:`TransformerEncoderLayer` and
:class:`TransformerDecoderLayer`, and initialisers (:mod:`monadl.nn.init`)."""

from monadl.nn import init
from monadl.nn.attention import MultiHeadAttention, TransformerDecoderLayer, TransformerEncoderLayer
from monadl.nn.batchnorm import BatchNorm1d, BatchNorm2d
from monadl.nn.buffer import ArrayBuffer, Buffer, BufferState, GeneratorBuffer
from monadl.nn.container import Flatten, Sequential
from monadl.nn.conv import AdaptiveAvgPool2d, AvgPool2d, Conv1d, Conv2d, ConvTranspose2d, MaxPool2d
from monadl.nn.dropout import Dropout
from monadl.nn.embedding import Embedding
from monadl.nn.gru import GRUCell
from monadl.nn.linear import MLP, Linear
from monadl.nn.lstm import LSTMCell
from monadl.nn.module import Module, buffers_of, parameter_count, summary, to_device, weights_of
from monadl.nn.norm import GroupNorm, LayerNorm, RMSNorm
from monadl.nn.sequence import GRU, LSTM, SequenceOutput
from monadl.nn.tree_lstm import TreeLSTMCell

__all__ = [
    # modules, weights and buffers
    "Module",
    "weights_of",
    "buffers_of",
    "parameter_count",
    "summary",
    "to_device",
    "Buffer",
    "BufferState",
    "ArrayBuffer",
    "GeneratorBuffer",
    "init",
    # dense layers and containers
    "Linear",
    "MLP",
    "Embedding",
    "Dropout",
    "Sequential",
    "Flatten",
    # convolution and pooling
    "Conv1d",
    "Conv2d",
    "ConvTranspose2d",
    "MaxPool2d",
    "AvgPool2d",
    "AdaptiveAvgPool2d",
    # recurrent cells and sequence layers
    "LSTMCell",
    "GRUCell",
    "TreeLSTMCell",
    "LSTM",
    "GRU",
    "SequenceOutput",
    # normalisation
    "LayerNorm",
    "GroupNorm",
    "RMSNorm",
    "BatchNorm1d",
    "BatchNorm2d",
    # attention and transformers
    "MultiHeadAttention",
    "TransformerEncoderLayer",
    "TransformerDecoderLayer",
]
