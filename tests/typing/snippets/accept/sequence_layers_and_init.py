"""The sequence layers and initialisers of monadl.nn: outputs per step, final states typed per
cell kind, and ``init=`` taking the initialisers and partials of them."""

import functools
from typing import Any, assert_type

import numpy as np

from monadl import ArrayLayer
from monadl.nn import GRU, LSTM, Embedding, Linear, LSTMCell, SequenceOutput, init

lstm = LSTM.new(3, 4, layers=2, bidirectional=True, init=init.orthogonal)
out = lstm([np.ones((5, 3)), [np.ones(3), Embedding.new(10, 3)(2)]])
assert_type(out, SequenceOutput[tuple[ArrayLayer, ArrayLayer]])
assert_type(out.outputs[0][1], ArrayLayer)
h, c = out.states[1][0]
assert_type(c, ArrayLayer)
gru = GRU.new(3, 4, seed=np.random.default_rng(0))
assert_type(gru([np.ones((2, 3))]).states[0][0], ArrayLayer)

drawn = init.xavier_uniform((3, 4), gain=init.calculate_gain("tanh"), seed=1, dtype=np.float32)
assert_type(drawn, np.ndarray[Any, np.dtype[np.floating[Any]]])
Linear.new(3, 2, init=functools.partial(init.kaiming_normal, mode="fan_out"))
LSTMCell.new(3, 2, init=init.xavier_normal)
