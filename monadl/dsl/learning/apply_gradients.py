"""Applying gradients computed earlier: gradient accumulation.

:func:`monadl.compute_gradients` gives a loss's gradients without changing anything. Summed or
averaged over several calls (micro-batches), they are the gradients of the whole batch's loss, and
:func:`apply_gradients` applies them as a training step would: every weight's optimizer update
computed first, then all committed at once, or none (a non-finite new value, a missing optimizer or
a gradient of the wrong shape gives a ``Failure`` and changes nothing).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from returns.result import Result, Success

from monadl.dsl.core.weights import ArrayWeight, FloatWeight
from monadl.dsl.learning.optimizers.base import Optimizer
from monadl.dsl.learning.results import failed
from monadl.dsl.learning.training import commit_gradients
from monadl.typeclasses.backend import is_array
from monadl.typeclasses.sparse import SparseRows

__all__ = ["apply_gradients"]


def apply_gradients(
    gradients: Mapping[FloatWeight | ArrayWeight, Any],
    optimizer: Optimizer | None = None,
    *,
    check_finite: bool = True,
) -> Result[None, Exception]:
    """Updates every weight of ``gradients`` (as :func:`~monadl.compute_gradients` returns them, or
    their sum or mean over several calls) with its optimizer, or ``optimizer`` for weights without
    one, in one atomic commit: ``Success(None)``, or ``Failure(exception)`` with no weight and no
    optimizer state changed.

    The same update as :func:`~monadl.train_blocking` on a loss with these gradients: a chain's
    clipping sees all of its weights' gradients, a frozen weight is skipped, and (unless
    ``check_finite=False``) a non-finite new value is a :class:`~monadl.NonFiniteGradientError`.
    A float weight's gradient is a float; an array weight's an array of its shape (any dtype: it is
    converted to the weight's) or :class:`~monadl.typeclasses.sparse.SparseRows` (a table's: sums
    of them, by ``+``, stay sparse; scale them through the learning rate, or densely by
    ``to_dense()``).

    Accumulating::

        total = None
        for chunk in chunks:
            loss, grads = ml.compute_gradients(model_loss(chunk))
            total = grads if total is None else {w: total[w] + g for w, g in grads.items()}
        ml.apply_gradients({w: g / len(chunks) for w, g in total.items()}, ml.Adam(1e-3))

    Buffer updates staged by the forward passes (batch norm's running statistics) are made only by
    training steps (``train``), not by ``compute_gradients``, so not here either."""
    try:
        commit_gradients(_checked(gradients), optimizer, check_finite=check_finite)
    except Exception as e:  # noqa: BLE001 - every failure is the caller's Failure, not a crash
        return failed(e)
    return Success(None)


def _checked(gradients: Mapping[Any, Any]) -> dict[Any, Any]:
    """``gradients`` as a dict, each checked to fit its weight (a ``TypeError`` or ``ValueError``
    naming the weight otherwise)."""
    if not isinstance(gradients, Mapping):
        raise TypeError(
            f"apply_gradients: expected a dict of weights to gradients, got {type(gradients).__name__}"
        )
    checked: dict[Any, Any] = {}
    for weight, gradient in gradients.items():
        if isinstance(weight, FloatWeight):
            if isinstance(gradient, bool) or not isinstance(gradient, (float, int)):
                what = type(gradient).__name__
                raise TypeError(f"apply_gradients: the gradient of {weight!r} must be a float, got {what}")
            checked[weight] = float(gradient)
            continue
        if not isinstance(weight, ArrayWeight):
            raise TypeError(f"apply_gradients: expected weights as keys, got {type(weight).__name__}")
        shape = tuple(weight.data.shape)
        if type(gradient) is SparseRows or is_array(gradient):
            if tuple(gradient.shape) != shape:
                raise ValueError(
                    f"apply_gradients: the gradient of {weight!r} has shape {tuple(gradient.shape)}, "
                    f"not the weight's {shape}"
                )
        else:
            raise TypeError(
                f"apply_gradients: the gradient of {weight!r} must be an array of shape {shape}, "
                f"got {type(gradient).__name__}"
            )
        checked[weight] = gradient
    return checked
