"""A loader over (images, labels) gives tuples of arrays: a batch is not a layer to train."""
# expect: "tuple[ndarray[tuple[Any, ...], dtype[floating[_32Bit]]],
# expect: ndarray[tuple[Any, ...], dtype[signedinteger[_64Bit]]]]"
# expect: has no attribute "train_blocking" [attr-defined]

import numpy as np
import numpy.typing as npt

import monadl as ml

x: npt.NDArray[np.float32] = np.zeros((10, 3), dtype=np.float32)
y: npt.NDArray[np.int64] = np.zeros(10, dtype=np.int64)

for batch in ml.DataLoader((x, y), batch_size=4):
    batch.train_blocking(ml.SGD(0.1))  # error
