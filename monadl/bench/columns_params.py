"""Parameters and batches of the CIFAR-100 column model, shared by its reference implementations.

The model is the "columns of experts" of the DeepLearning.scala 2 paper (section 6): ``n_columns``
columns, each two ReLU layers from the 3072 pixels to ``hidden`` units, summed into ``h``; a coarse
classifier ``h @ coarse.w + coarse.b`` over the 20 coarse classes; and 20 fine classifiers, one per
coarse class, each two ReLU layers and a linear layer to the 5 fine classes of its coarse class.

Names and shapes (``H = hidden``)::

    column{i}.w1 (3072, H)  column{i}.b1 (H,)  column{i}.w2 (H, H)  column{i}.b2 (H,)    i < n_columns
    coarse.w (H, 20)        coarse.b (20,)
    fine{j}.w1 (H, H)       fine{j}.b1 (H,)    fine{j}.w2 (H, H)    fine{j}.b2 (H,)
    fine{j}.w3 (H, 5)       fine{j}.b3 (5,)                                                  j < 20

This module imports nothing of monadl's: the reference implementations (``columns_numpy``,
``columns_torch``) are written independently of monadl's layers.
"""

from __future__ import annotations

from typing import Final

import numpy as np
import numpy.typing as npt

INPUT: Final = 3072
"""Pixels of a CIFAR image, 32 x 32 x 3: the width of ``x``."""
COARSE_CLASSES: Final = 20
"""Classes of the coarse classifier."""
FINE_CLASSES: Final = COARSE_CLASSES
"""Fine classifiers: one per coarse class (``fine0`` ... ``fine19``)."""
FINE_PER_COARSE: Final = 5
"""Classes of each fine classifier: the fine classes of its coarse class."""

COLUMN_PARAMS: Final = ("w1", "b1", "w2", "b2")
"""A column's parameters, ``column{i}.NAME``, in forward order."""
COARSE_PARAMS: Final = ("w", "b")
"""The coarse classifier's parameters, ``coarse.NAME``."""
FINE_PARAMS: Final = ("w1", "b1", "w2", "b2", "w3", "b3")
"""A fine classifier's parameters, ``fine{j}.NAME``, in forward order."""


def param_shapes(n_columns: int, hidden: int = 64) -> dict[str, tuple[int, ...]]:
    """Every parameter's name and shape: columns first, then the coarse and the fine classifiers."""
    if n_columns < 1:
        raise ValueError(f"n_columns must be at least 1, got {n_columns}")
    if hidden < 1:
        raise ValueError(f"hidden must be at least 1, got {hidden}")
    h = hidden
    shapes: dict[str, tuple[int, ...]] = {}
    for i in range(n_columns):
        shapes |= {
            f"column{i}.w1": (INPUT, h),
            f"column{i}.b1": (h,),
            f"column{i}.w2": (h, h),
            f"column{i}.b2": (h,),
        }
    shapes |= {"coarse.w": (h, COARSE_CLASSES), "coarse.b": (COARSE_CLASSES,)}
    for j in range(FINE_CLASSES):
        shapes |= {
            f"fine{j}.w1": (h, h),
            f"fine{j}.b1": (h,),
            f"fine{j}.w2": (h, h),
            f"fine{j}.b2": (h,),
            f"fine{j}.w3": (h, FINE_PER_COARSE),
            f"fine{j}.b3": (FINE_PER_COARSE,),
        }
    return shapes


def is_weight(name: str) -> bool:
    """Whether a parameter is a weight matrix (``*.w``, ``*.w1`` ...), not a bias."""
    return name.rpartition(".")[2].startswith("w")


def init_params(
    n_columns: int, hidden: int = 64, seed: int = 0, dtype: npt.DTypeLike = np.float32
) -> dict[str, np.ndarray]:
    """The model's parameters, as the spec draws them.

    Weights ~ normal(0, sqrt(2 / fan_in)) (He; ``fan_in`` is a weight's first dimension), drawn in
    float64 from ``np.random.default_rng(seed)`` one weight after the other in sorted key order, then
    cast to ``dtype``; biases are zero and draw nothing. The dict lists the parameters in
    ``param_shapes``'s order (columns, coarse, fine classifiers).
    """
    shapes = param_shapes(n_columns, hidden)
    rng = np.random.default_rng(seed)
    drawn: dict[str, np.ndarray] = {}
    for name in sorted(shapes):
        shape = shapes[name]
        if is_weight(name):
            std = np.sqrt(2.0 / shape[0])
            drawn[name] = rng.normal(0.0, std, size=shape).astype(dtype)
        else:
            drawn[name] = np.zeros(shape, dtype=dtype)
    return {name: drawn[name] for name in shapes}


def random_batch(
    batch: int = 16, seed: int = 0, dtype: npt.DTypeLike = np.float32
) -> tuple[np.ndarray, int, np.ndarray]:
    """A random batch ``(x, c, fine_local)`` for tests and benchmarks.

    ``x`` (batch, 3072) of ``dtype``: random pixels / 256, in [0, 1); ``c``: the coarse label, an int in
    0..19, one for the whole batch; ``fine_local`` (batch,) int64 in 0..4: each sample's fine class
    among the 5 of coarse class ``c``.
    """
    if batch < 1:
        raise ValueError(f"batch must be at least 1, got {batch}")
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 256, size=(batch, INPUT)).astype(dtype) / np.asarray(256, dtype=dtype)
    c = int(rng.integers(0, COARSE_CLASSES))
    fine_local = rng.integers(0, FINE_PER_COARSE, size=batch, dtype=np.int64)
    return x, c, fine_local


def check_batch(x: np.ndarray, c: int, fine_local: np.ndarray) -> None:
    """Raises ``ValueError`` unless ``(x, c, fine_local)`` is a batch the model takes."""
    if x.ndim != 2 or x.shape[1] != INPUT or x.shape[0] < 1:
        raise ValueError(f"x must have shape (batch, {INPUT}), got {x.shape}")
    if not 0 <= c < COARSE_CLASSES:
        raise ValueError(f"the coarse label c must be in 0..{COARSE_CLASSES - 1}, got {c}")
    if fine_local.shape != (x.shape[0],):
        raise ValueError(f"fine_local must have shape ({x.shape[0]},), got {fine_local.shape}")
    if fine_local.dtype.kind not in "iu":
        raise ValueError(f"fine_local must hold integers, got {fine_local.dtype}")
    if fine_local.min() < 0 or fine_local.max() >= FINE_PER_COARSE:
        raise ValueError(f"fine_local must be in 0..{FINE_PER_COARSE - 1}")


def check_params(params: dict[str, np.ndarray]) -> tuple[int, int, np.dtype[np.floating]]:
    """``(n_columns, hidden, dtype)`` of a parameter dict, or ``ValueError`` if it is not the model's."""
    if "coarse.w" not in params:
        raise ValueError("params lack coarse.w")
    hidden = int(params["coarse.w"].shape[0])
    n_columns = 0
    while f"column{n_columns}.w1" in params:
        n_columns += 1
    want = param_shapes(max(n_columns, 1), hidden)
    if set(params) != set(want):
        missing, extra = sorted(set(want) - set(params)), sorted(set(params) - set(want))
        raise ValueError(f"not the column model's parameters: missing {missing}, unexpected {extra}")
    dtype = params["coarse.w"].dtype
    if dtype not in (np.dtype(np.float32), np.dtype(np.float64)):
        raise ValueError(f"params must be float32 or float64, got {dtype}")
    for name, shape in want.items():
        p = params[name]
        if p.shape != shape or p.dtype != dtype:
            raise ValueError(f"{name} must be {dtype} of shape {shape}, got {p.dtype} of shape {p.shape}")
    return n_columns, hidden, dtype
