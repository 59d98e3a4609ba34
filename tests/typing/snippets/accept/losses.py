"""A loss is a FloatLayer for reduction "mean" (the default) or "sum", an ArrayLayer for "none"; a
reduction typed as ml.Reduction gives either."""

from typing import assert_type

import numpy as np

import monadl as ml
from monadl import ArrayLayer, ArrayWeight, FloatLayer

w = ArrayWeight(np.zeros((3, 4)))
t = np.zeros((3, 4))
labels = np.array([0, 1, 2])

assert_type(ml.mse_loss(w, t), FloatLayer)
assert_type(ml.mse_loss(w, t, reduction="sum"), FloatLayer)
assert_type(ml.mse_loss(w, t, reduction="none"), ArrayLayer)
assert_type(ml.l1_loss(w * 2.0, t, reduction="none"), ArrayLayer)
assert_type(ml.huber_loss(w, t, delta=0.5), FloatLayer)
assert_type(ml.smooth_l1_loss(w, w, reduction="none", beta=0.5), ArrayLayer)
assert_type(ml.binary_cross_entropy(ml.sigmoid(w), t), FloatLayer)
assert_type(ml.binary_cross_entropy_with_logits(w, t, reduction="none"), ArrayLayer)
assert_type(ml.nll_loss(ml.log_softmax(w), labels, weight=np.ones(4), ignore_index=-100), FloatLayer)
assert_type(ml.cross_entropy(w, labels), FloatLayer)
assert_type(ml.cross_entropy(w, labels, reduction="sum", label_smoothing=0.1), FloatLayer)
assert_type(ml.cross_entropy(w[0], 2, reduction="none"), ArrayLayer)


def loss(reduction: ml.Reduction) -> FloatLayer | ArrayLayer:
    return ml.cross_entropy(w, labels, reduction=reduction)
