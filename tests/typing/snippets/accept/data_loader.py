"""A DataLoader's batches have the types of its data: over a tuple of arrays, a tuple of arrays of
the same types; with a collate, its result; over a list of examples, the collate's (default: Any,
as stacking or a list depends on the examples)."""

from typing import Any, assert_type

import numpy as np
import numpy.typing as npt

import monadl as ml
from monadl import nn
from monadl.data import DataLoader

Images = npt.NDArray[np.float32]
Labels = npt.NDArray[np.int64]

x: Images = np.zeros((10, 3), dtype=np.float32)
y: Labels = np.zeros(10, dtype=np.int64)

loader = DataLoader((x, y), batch_size=4, shuffle=True, seed=0, drop_last=True, prefetch=1)
for images, labels in loader:
    assert_type(images, Images)
    assert_type(labels, Labels)
    logits = nn.Linear.new(3, 2)(images)
    loss = ml.cross_entropy(logits, labels)
    assert_type(loss, ml.FloatLayer)

assert_type(ml.DataLoader(x, 2), ml.DataLoader[Images])
assert_type(len(loader), int)


def as_float64(batch: tuple[Images, Labels]) -> tuple[npt.NDArray[np.float64], list[int]]:
    return batch[0].astype(np.float64), batch[1].tolist()


assert_type(DataLoader((x, y), 4, collate=as_float64), DataLoader[tuple[npt.NDArray[np.float64], list[int]]])

sentences = [["a", "b"], ["c"]]
assert_type(DataLoader(sentences, 2, collate=list), DataLoader[list[list[str]]])
assert_type(DataLoader(sentences, 2, collate=lambda batch: len(batch)), DataLoader[int])
assert_type(DataLoader([np.ones((k, 3)) for k in range(1, 4)], 2), DataLoader[Any])

for number, batches in loader.epochs(3):
    assert_type(number, int)
    for batch in batches:
        assert_type(batch, tuple[Images, Labels])
