"""Building blocks of models: :class:`Module`, a typed container whose weights are found by name,
and builders made of it: :class:`Linear`, :class:`MLP`, :class:`Embedding`, :class:`Dropout`, and
the recurrent cells :class:`LSTMCell`, :class:`GRUCell` and :class:`TreeLSTMCell`, whose calls
merge under dynamic batching."""

from monadl.nn.dropout import Dropout
from monadl.nn.embedding import Embedding
from monadl.nn.gru import GRUCell
from monadl.nn.linear import MLP, Linear
from monadl.nn.lstm import LSTMCell
from monadl.nn.module import Module, weights_of
from monadl.nn.tree_lstm import TreeLSTMCell

__all__ = [
    "MLP",
    "Dropout",
    "Embedding",
    "GRUCell",
    "LSTMCell",
    "Linear",
    "Module",
    "TreeLSTMCell",
    "weights_of",
]
