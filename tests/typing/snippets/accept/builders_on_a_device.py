"""Builders, weight constructors, buffers and initialisers take ``xp=`` and ``device=`` and keep
their result types."""

from typing import assert_type

import array_api_strict
import numpy as np

import monadl as ml
from monadl import nn

device = array_api_strict.Device("device1")
assert_type(nn.Linear.new(3, 2, xp=array_api_strict), nn.Linear)
assert_type(nn.MLP.new([3, 4, 2], xp=array_api_strict, device=device), nn.MLP)
assert_type(nn.Embedding.new(5, 3, xp=np), nn.Embedding)
assert_type(nn.Conv2d.new(1, 2, 3, xp=array_api_strict), nn.Conv2d)
assert_type(nn.Conv1d.new(1, 2, 3, xp=array_api_strict), nn.Conv1d)
assert_type(nn.LayerNorm.new(4, xp=array_api_strict), nn.LayerNorm)
assert_type(nn.BatchNorm1d.new(4, xp=array_api_strict, device=device), nn.BatchNorm1d)
assert_type(nn.MultiHeadAttention.new(4, 2, xp=array_api_strict), nn.MultiHeadAttention)
assert_type(nn.TransformerEncoderLayer.new(4, 2, xp=array_api_strict), nn.TransformerEncoderLayer)
assert_type(nn.LSTMCell.new(3, 2, xp=array_api_strict), nn.LSTMCell)
assert_type(nn.GRUCell.new(3, 2, xp=array_api_strict), nn.GRUCell)
assert_type(nn.TreeLSTMCell.new(3, 2, xp=array_api_strict), nn.TreeLSTMCell)
assert_type(nn.LSTM.new(3, 2, bidirectional=True, xp=array_api_strict), nn.LSTM)
assert_type(nn.GRU.new(3, 2, layers=2, xp=array_api_strict), nn.GRU)
assert_type(ml.ArrayWeight.normal((3, 2), xp=array_api_strict, device=device), ml.ArrayWeight)
assert_type(ml.ArrayWeight.zeros((2,), xp=array_api_strict), ml.ArrayWeight)
assert_type(ml.ArrayWeight(np.ones(2), xp=array_api_strict), ml.ArrayWeight)
assert_type(ml.ArrayBuffer(np.zeros(2), xp=array_api_strict), ml.ArrayBuffer)
nn.init.xavier_uniform((3, 2), xp=array_api_strict, device=device)
