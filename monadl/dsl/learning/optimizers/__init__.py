"""Optimizers: immutable configurations with a pure update rule.

One module per family: ``sgd`` (SGD, Momentum), ``adam`` (Adam, AdamW), ``adagrad`` (Adagrad,
RMSprop) and ``clipping`` (the gradient transformations and ``chain``); ``base`` holds the
protocols and what the rules share, ``checks`` the checks of a state (a checkpoint's). This
package names the optimizers a checkpoint may rebuild and a state's kind (:func:`state_kind`).

``update(data, gradient, state) -> (new_data, new_state)`` computes new values without touching the
old ones, so a training step can compute every weight's update first and commit them all at once
(or none, if anything fails). The rules use only operators and ``** 0.5``, so they serve floats and
arrays of any array-API library alike. ``weight_decay`` adds L2 regularisation:
``gradient + weight_decay * data``. All optimizers are deterministic (no randomness).

**Hyper-parameters and state are apart.** An optimizer is a value holding hyper-parameters only; a
weight's state (moments, sums, velocities, and the number of updates so far: the *step*) is kept
beside the weight's data. A training step keeps a weight's state as long as its optimizer is of the
same kind (:func:`state_kind`: its class, or the class of a :class:`Chain`'s optimizer): a new
``Adam`` with another learning rate goes on with the old one's moments and step count. A learning
rate may be a schedule of the step (``monadl.dsl.learning.schedules``); the step a rate is asked for is the
number of updates before this one (0 for a weight's first), counted in the weight's state (SGD's
state is that count: ``None``, from earlier versions, counts as 0).

**Capabilities are declared.** An optimizer is any object whose class has ``init`` and ``update``
(``base.Optimizer``). What a training step may use besides is declared by the class's methods, one
protocol each in ``base``, and found once per class (``base.capabilities``): ``update_owned``
(``UpdatesInPlace``: the same rule, allowed to write into the memory of a gradient that nothing else
holds; SGD's saves two weight-sized arrays), ``update_owned_checked`` (``ChecksUpdate``: that
update, saying whether what it wrote is finite, so a step's check reads no more),
``transform_gradients`` (``TransformsGradients``: a chain's) and ``check_state`` (``ChecksState``: a
checkpoint's state checked).

**Gradient transformations** (:func:`clip_by_global_norm`, :func:`clip_by_value`) go before an
optimizer in a :func:`chain`, which is an optimizer itself: ``chain(clip_by_global_norm(1.0),
Adam(1e-3))``. A training step first hands a chain's ``transform_gradients`` the gradients of every
weight of the step that the chain updates (all of them, where it is the step's default and no
weight has its own optimizer), then updates each weight with its transformed gradient; so the
global norm is over all those weights, inside the all-or-nothing step.

A gradient may be a :class:`~monadl.typeclasses.sparse.SparseRows` (an embedding table's). SGD and
Adagrad without weight decay then update the touched rows only (NumPy and CuPy; elsewhere they
densify): the untouched rows have a zero gradient, so the dense rule leaves them (and Adagrad's sum)
exactly as they are, and the touched rows are computed by the dense rule's own operations on the
summed rows, so the result is bit for bit the dense one. Momentum and Adam decay their moments on
every row, and weight decay touches every row: by default they densify the gradient first, so a
sparse gradient gives bit for bit what its dense equivalent (``gradient.to_dense()``) gives.
``lazy=True`` (Momentum, Adam) updates the touched rows only: an untouched row keeps its data and
its moments (they are not decayed), and the step count goes up on every update. Lazy Momentum gives
a touched row the dense rule's result for that row. Lazy Adam is PyTorch's ``SparseAdam``, operation
for operation: on a touched row ``m += (1 - beta1) * (g - m)``, ``v += (1 - beta2) * (g * g - v)``,
``data -= lr * sqrt(1 - beta2**t) / (1 - beta1**t) * (m / (sqrt(v) + epsilon))``. Its bias
correction is on the step size, so epsilon is not scaled by it as in the dense rule
(``m_hat / (sqrt(v_hat) + epsilon)``): a touched row differs from the dense rule's by about
``epsilon / sqrt(v_hat)`` relatively. Weight decay, which SparseAdam lacks, is added to the touched
rows' gradient. On a dense gradient, and where the namespace has no scatter (array-API), lazy is
the dense rule. Clipping a sparse gradient reads its summed rows (repeated indices added first).

**A weight keeps its type, shape and dtype** across every update: NumPy's arithmetic on a 0-d array
gives a scalar, so a 0-d weight's results (data and state) are made 0-d arrays again.

**States are checked** where they come from outside a training step (a checkpoint):
``check_state(state, data)`` says what is wrong with ``state`` for a weight holding ``data``
(``None`` if nothing): its shape, the type, shape and dtype of its arrays (the weight's, for every
optimizer here, lazy ones included), step counts (Python ints from 0 to ``2**63 - 1``), sums of
squares >= 0.
"""

from __future__ import annotations

from monadl.dsl.learning.optimizers.adagrad import Adagrad, RMSprop
from monadl.dsl.learning.optimizers.adam import Adam, AdamW
from monadl.dsl.learning.optimizers.base import Optimizer
from monadl.dsl.learning.optimizers.clipping import Chain
from monadl.dsl.learning.optimizers.sgd import SGD, Momentum

OPTIMIZER_CLASSES: tuple[type[SGD | Momentum | Adam | AdamW | Adagrad | RMSprop | Chain], ...] = (
    SGD,
    Momentum,
    Adam,
    AdamW,
    Adagrad,
    RMSprop,
    Chain,
)
"""monadl's optimizers (each has ``check_state``): what a checkpoint may rebuild as a weight's."""


def state_kind(optimizer: Optimizer) -> type:
    """The class whose state an optimizer keeps: its own, or a chain's optimizer's. A training step
    keeps a weight's state while its optimizers are of one kind, and starts afresh otherwise."""
    while type(optimizer) is Chain:
        optimizer = optimizer.optimizer
    return type(optimizer)
