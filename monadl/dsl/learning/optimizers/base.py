"""What the optimizers share: the :class:`Optimizer` and :class:`GradientTransform` protocols, the
checks of their settings, the learning rate at a step, weight decay, a sparse gradient's rows, and
the helpers that keep a weight's type and build the fused CuPy kernels (``monadl.dsl.fused``). The
underscore names are the package's own, used by its optimizer modules."""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from monadl.dsl.learning.schedules import LearningRate
from monadl.typeclasses.backend import namespace
from monadl.typeclasses.sparse import SparseRows, dense


class Optimizer(Protocol):
    """An update rule with its hyper-parameters."""

    def init(self, data: Any) -> Any:
        """The initial state for a weight holding ``data``."""
        ...

    def update(self, data: Any, gradient: Any, state: Any) -> tuple[Any, Any]:
        """The weight's new data and the new state (without modifying the old ones)."""
        ...


class GradientTransform(Protocol):
    """A change of the gradients of all the weights that one optimizer updates in a step, seen
    together (a global norm needs them all). Used in a :func:`chain`."""

    def transform(self, gradients: list[Any]) -> list[Any]:
        """The new gradients, in order; the given ones unchanged."""
        ...


def check_learning_settings(learning_rate: LearningRate, weight_decay: float) -> None:
    if not callable(learning_rate) and not learning_rate > 0.0:
        raise ValueError(f"learning_rate must be > 0 or a schedule, got {learning_rate}")
    if not weight_decay >= 0.0:
        raise ValueError(f"weight_decay must be >= 0, got {weight_decay}")


def check_epsilon(epsilon: float) -> None:
    if not epsilon >= 0.0:  # (a negative one can cancel the denominator's root: a division by 0)
        raise ValueError(f"epsilon must be >= 0, got {epsilon}")


def rate_at_step(learning_rate: LearningRate, step: int) -> float:
    """The learning rate at ``step`` (a Python float: a NumPy scalar would promote float32 data)."""
    return float(learning_rate(step)) if callable(learning_rate) else learning_rate


def with_weight_decay(gradient: Any, data: Any, weight_decay: float) -> Any:
    gradient = dense(gradient)
    return gradient + weight_decay * data if weight_decay else gradient


def summed_rows(gradient: Any) -> tuple[Any, Any, Any] | None:
    """For a sparse gradient: the namespace, the distinct row indices and their summed rows (summed
    in the order ``to_dense`` sums them, so each equals the dense gradient's row bit for bit).
    None for a dense gradient, or where the namespace has no scatter (the array API)."""
    if type(gradient) is not SparseRows:
        return None
    sums = gradient.summed()
    return None if sums is None else (namespace(sums[1]), *sums)  # (None: the array API: densify)


def lazy_rows(gradient: Any, data: Any, weight_decay: float) -> tuple[Any, Any, Any] | None:
    """``summed_rows`` with weight decay added to the touched rows (a lazy update's gradient)."""
    sparse = summed_rows(gradient)
    if sparse is None or not weight_decay:
        return sparse
    xp, rows, g = sparse
    return xp, rows, g + weight_decay * data[rows]


def keep_array(result: Any, data: Any) -> Any:
    """``result`` as a 0-d array where ``data`` is a NumPy array: NumPy's arithmetic on 0-d arrays
    gives scalars, and a weight that changed type would change the structure of the next graph
    (which then is not replayed). The value is kept bit for bit."""
    if type(result) is not np.ndarray and type(data) is np.ndarray:
        return np.asarray(result)
    return result


def with_rows(xp: Any, array: Any, rows: Any, values: Any) -> Any:
    """A copy of ``array`` with ``rows`` set to ``values``."""
    new = xp.asarray(array, copy=True)
    new[rows] = values
    return new


# --------------------------------------------------------------------------- fused CuPy updates
# On CuPy arrays, each dense rule of the optimizers runs as one kernel (``monadl.dsl.fused``) of the
# rule's own operations in the rule's order: one pass over a weight and its state, where the rule as
# written makes a kernel and a temporary array per operator. The scalars are the rule's Python
# floats, given to the kernel in the weight's type, as the operators would convert them.
# ``decay``: the weight decay added to the gradient first (``with_weight_decay``).


def decay_parts(decay: bool) -> tuple[tuple[str, ...], tuple[str, ...], str]:
    """The scalar, the statement and the gradient's name of a kernel with L2 weight decay or none."""
    return (("wd",), ("gd = g + wd * d",), "gd") if decay else ((), (), "g")
