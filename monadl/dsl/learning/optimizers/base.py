"""What the optimizers share: the :class:`Optimizer` and :class:`GradientTransform` protocols, the
optional capabilities a training step may use (:class:`UpdatesInPlace`, :class:`ChecksUpdate`,
:class:`TransformsGradients`, :class:`ChecksState`, found once per class by :func:`capabilities`),
the checks of their settings, the learning rate at a step, weight decay, a sparse gradient's rows,
and the helpers that keep a weight's type and build the fused CuPy kernels
(``monadl.dsl.fused``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final, Protocol, runtime_checkable
from weakref import WeakKeyDictionary

import numpy as np

from monadl.dsl.learning.schedules import LearningRate
from monadl.typeclasses.backend import namespace
from monadl.typeclasses.sparse import SparseRows, dense


@runtime_checkable
class Optimizer(Protocol):
    """An update rule with its hyper-parameters: what a training step requires of an optimizer.

    Any object whose class has these two methods is one (no base class to inherit); a step given
    one that lacks either fails with a ``TypeError`` naming it. A class may declare more, which a
    step then uses: ``transform_gradients``, to see the gradients of all its weights at once (a
    chain's clipping), and ``check_state``, to check a checkpoint's state (see the how-to "Write an
    optimizer")."""

    def init(self, data: Any) -> Any:
        """The initial state for a weight holding ``data``."""
        ...

    def update(self, data: Any, gradient: Any, state: Any) -> tuple[Any, Any]:
        """The weight's new data and the new state (without modifying the old ones)."""
        ...


@runtime_checkable
class UpdatesInPlace(Protocol):
    """An optimizer that can write a weight's new data into its gradient's memory, where the training
    step owns that memory (nothing else holds it): the same result as ``update``, bit for bit. A
    step uses it only where the class that defines it defines ``update`` too (or derives from the
    one that does): a subclass that overrides ``update`` alone is updated by its ``update``."""

    def update_owned(self, data: Any, gradient: Any, state: Any) -> tuple[Any, Any]:
        """``update``, allowed to write into ``gradient``."""
        ...


@runtime_checkable
class ChecksUpdate(Protocol):
    """An optimizer updating in place (:class:`UpdatesInPlace`) that says, as it writes a weight's
    new data, whether all of it is finite: a step that checks its updates then reads the weight
    once, not twice. A step uses it only where the class that defines it defines ``update_owned``
    too (or derives from the one that does): a subclass that overrides ``update_owned`` (or
    ``update``) alone is updated by it, and its results are checked by the step."""

    def update_owned_checked(self, data: Any, gradient: Any, state: Any) -> tuple[Any, Any, bool | None]:
        """``update_owned``, and whether every element of the new data is finite (None: not
        known)."""
        ...


@runtime_checkable
class TransformsGradients(Protocol):
    """An optimizer that sees the gradients of all the weights it updates in a step together, before
    updating any (a :func:`~monadl.chain`: clipping by their global norm)."""

    def transform_gradients(self, gradients: list[Any]) -> list[Any]:
        """The new gradients, in order, as many as given; the given ones unchanged."""
        ...


@runtime_checkable
class ChecksState(Protocol):
    """An optimizer that can say what is wrong with a state from outside a step (a checkpoint's)."""

    def check_state(self, state: object, data: Any) -> str | None:
        """The problem with ``state`` for a weight holding ``data``, or None."""
        ...


@runtime_checkable
class GradientTransform(Protocol):
    """A change of the gradients of all the weights that one optimizer updates in a step, seen
    together (a global norm needs them all). Used in a :func:`chain`."""

    def transform(self, gradients: list[Any]) -> list[Any]:
        """The new gradients, in order; the given ones unchanged."""
        ...


@dataclass(frozen=True)
class Capabilities:
    """What a training step may ask of an optimizer beyond :class:`Optimizer`'s two methods."""

    updates_in_place: bool
    """Its class is an :class:`UpdatesInPlace`."""
    transforms_gradients: bool
    """Its class is a :class:`TransformsGradients`."""
    checks_update: bool = False
    """It updates in place, and its class is a :class:`ChecksUpdate` whose
    ``update_owned_checked`` stands for its ``update_owned``."""


NONE: Final = Capabilities(False, False)
"""The capabilities of an optimizer that declares none (or whose methods are its object's own)."""
_KNOWN: WeakKeyDictionary[type, Capabilities] = WeakKeyDictionary()  # (a class defined in a loop is freed)


def capabilities(optimizer: object) -> Capabilities:
    """The capabilities ``optimizer``'s class declares (its methods, by the protocols above), found
    once per class: a step looks them up for each optimizer it uses, and an ``isinstance`` of a
    protocol costs tens of microseconds. Raises ``TypeError`` naming the method of
    :class:`Optimizer` that ``optimizer`` lacks."""
    kind = type(optimizer)
    known = _KNOWN.get(kind)
    if known is not None:
        return known
    if not issubclass(kind, Optimizer):
        if isinstance(optimizer, Optimizer):  # methods of the object's own, not of its class
            return NONE
        missing = [name for name in ("init", "update") if not callable(getattr(optimizer, name, None))]
        raise TypeError(
            f"{optimizer!r} is not an optimizer: it has no {' and no '.join(missing)} method (an "
            "optimizer has init(data) -> state and update(data, gradient, state) -> (data, state))"
        )
    # An in-place update counts where the class that defines it defines ``update`` too, or is a
    # subclass of the one that does: a subclass that overrides ``update`` alone is updated by it.
    in_place = issubclass(kind, UpdatesInPlace) and issubclass(
        _defining(kind, "update_owned"), _defining(kind, "update")
    )
    checked = (
        in_place
        and issubclass(kind, ChecksUpdate)
        and issubclass(_defining(kind, "update_owned_checked"), _defining(kind, "update_owned"))
    )
    found = Capabilities(in_place, issubclass(kind, TransformsGradients), checked)
    _KNOWN[kind] = found
    return found


def _defining(kind: type, name: str) -> type:
    """The class of ``kind``'s method resolution order that defines ``name`` (``kind`` has it)."""
    return next(base for base in kind.__mro__ if name in base.__dict__)


def check_learning_settings(learning_rate: LearningRate, weight_decay: float) -> None:
    if not callable(learning_rate) and not learning_rate > 0.0:
        raise ValueError(f"learning_rate must be > 0 or a schedule, got {learning_rate}")
    if not weight_decay >= 0.0:
        raise ValueError(f"weight_decay must be >= 0, got {weight_decay}")


def check_betas(beta1: float, beta2: float) -> None:
    if not (0.0 <= beta1 < 1.0 and 0.0 <= beta2 < 1.0):
        raise ValueError(f"betas must be in [0, 1), got {beta1}, {beta2}")


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


def numpy_of_one_kind(*arrays: Any) -> bool:
    """Whether these are NumPy arrays (not 0-d: NumPy's ufuncs give a 0-d array's result as a
    scalar) of one shape and dtype: an update may then compute into fresh arrays with ``out=``."""
    first = arrays[0]
    if type(first) is not np.ndarray or not first.ndim:
        return False
    for a in arrays:
        if type(a) is not np.ndarray or a.shape != first.shape or a.dtype != first.dtype:
            return False
    return True


def contiguous_numpy_of_one_kind(*arrays: Any) -> bool:
    """:func:`numpy_of_one_kind`, and each C-contiguous: a loop over the arrays' memory (a chunk of
    rows, a native kernel's elements) reads them as they are laid out."""
    return numpy_of_one_kind(*arrays) and all(a.flags.c_contiguous for a in arrays)


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
