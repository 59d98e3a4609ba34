"""Every library op is complete: the registry of declared ops (``monadl.dsl.ops.registry.LIBRARY``)
against the checks an op must pass.

An op declared with ``declare`` (or a ``PerArity``) joins the registry when its family's module is
imported. For each, the tests below ask for a shape rule, a case of the gradient fuzz that applies
it (``tests/test_gradient_fuzz.py``: each case checks the gradients against finite differences and
merged calls against the calls alone), and a reference entry under ``docs/reference/`` for the
public function (or operator, or module) the case exercises. A new op without one fails here, by
name; :data:`EXCEPTIONS` lists the ops a check cannot apply to, and why.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, find, settings
from hypothesis import strategies as st
from hypothesis.errors import NoSuchExample
from test_gradient_fuzz import OPERATORS, OPS, Case, Fuzzed

import monadl
import monadl.nn
from monadl import ArrayLayer
from monadl.do.graph import OP
from monadl.do.primitive import Primitive
from monadl.dsl.ops.attention import self_attention
from monadl.dsl.ops.packed_gru import packed_gru
from monadl.dsl.ops.packed_lstm import packed_lstm
from monadl.dsl.ops.registry import LIBRARY, PerArity
from monadl.gradcheck import make_weights

REFERENCE = Path(__file__).resolve().parent.parent / "docs" / "reference"

EXCEPTIONS: dict[str, str] = {
    # (the name of a registered op: why the gradient fuzz has no case of it)
    "dropout": "random: tests/test_dropout.py checks its gradients, batching and mask streams",
    "mse_loss": "the losses' values and gradients are checked against PyTorch's in tests/test_losses.py",
    "l1_loss": "as mse_loss",
    "huber_loss": "as mse_loss",
    "smooth_l1_loss": "as mse_loss",
    "binary_cross_entropy": "as mse_loss",
    "binary_cross_entropy_with_logits": "as mse_loss",
    "nll_loss": "as mse_loss",
    "cross_entropy": "the fuzz draws its fused common case; its class-loss forms (reduction, weight, "
    "ignore_index, label_smoothing) are checked against PyTorch's in tests/test_losses.py",
}
"""Registered ops without a gradient fuzz case (by name: every primitive of that name may lack
one), each with the test that checks it instead."""

PUBLIC_OF_INTERNAL = {"self_attention": "nn", "packed_lstm": "nn", "packed_gru": "nn", "dropout": "nn"}
"""The reference entry of an op that is not exported: its module's (``nn.MultiHeadAttention``,
``nn.LSTM``, ``nn.GRU``, ``nn.Dropout``)."""


def _label(entry: Primitive | PerArity) -> str:
    return entry.name


def _entries() -> list[Primitive | PerArity]:
    return list(LIBRARY)


EXAMPLES = 30
"""Cases drawn per fuzzed op: enough for each of its primitives (a mask or none, an affine norm or
not, one direction or two) to be met."""


def _applied_by(fuzzed: Fuzzed) -> set[Primitive]:
    """The primitives that :data:`EXAMPLES` cases of a fuzzed op apply (derandomized: the same
    every run)."""
    found: set[Primitive] = set()

    @st.composite
    def cases(draw: st.DrawFn) -> Case:
        return fuzzed.draw(draw)

    def collect(case: Case) -> bool:
        found.update(_applied(case))
        return False

    with contextlib.suppress(NoSuchExample):
        find(
            cases(),
            collect,
            settings=settings(
                max_examples=EXAMPLES,
                database=None,
                derandomize=True,
                suppress_health_check=list(HealthCheck),
            ),
        )
    return found


def _applied(case: Case) -> set[Primitive]:
    """The primitives that ``case``'s op applies (its layer's graph, walked from its row)."""
    layer = case.op(*make_weights(case.inputs))
    graph, row = layer.graph, layer.row
    found: set[Primitive] = set()
    pending, seen = [row], set()
    while pending:
        r = pending.pop()
        if r in seen:
            continue
        seen.add(r)
        if graph.tags[r] == OP:
            found.add(graph.objs[r])
            pending.extend(graph.inputs(r))
    return found


@functools.cache
def fuzzed_by() -> dict[int, set[str]]:
    """For each primitive (by ``id``) that a case of the gradient fuzz applies, the public names of
    the fuzzed ops whose cases apply it."""
    found: dict[int, set[str]] = {}
    for fuzzed in OPS.values():
        for prim in _applied_by(fuzzed):
            found.setdefault(id(prim), set()).add(fuzzed.public)
    return found


def _publics(entry: Primitive | PerArity) -> set[str]:
    """The public names of the fuzzed ops that apply ``entry`` (any arity of a ``PerArity``)."""
    found = fuzzed_by()
    if isinstance(entry, Primitive):
        return found.get(id(entry), set())
    return set().union(*(found.get(id(entry.of(n)), set()) for n in range(1, 9)))


def test_the_registry_holds_the_library_ops() -> None:
    names = {e.name for e in LIBRARY}
    # a sample of every family, and the per-arity ones
    assert {"add", "exp", "tanh", "sum", "reshape", "take_rows", "linear", "cross_entropy"} <= names
    assert {"conv", "max_pool", "layer_norm", "batch_norm", "lstm_c", "dropout", "where"} <= names
    assert {"add_n", "concatenate", "stack"} <= {e.name for e in LIBRARY if isinstance(e, PerArity)}
    assert all(isinstance(e, PerArity) or (e.own and e in LIBRARY) for e in LIBRARY)


def test_a_user_op_is_not_registered() -> None:
    op = monadl.custom_op("twice", lambda xp, x: 2 * x, (lambda xp, d, o, x: 2 * d,))
    assert all(e is not op.primitive for e in LIBRARY)
    assert not op.primitive.own and not op.primitive.fresh  # the engine's defaults, as before


@pytest.mark.parametrize("entry", _entries(), ids=_label)
def test_every_library_op_has_a_shape_rule(entry: Primitive | PerArity) -> None:
    prim = entry.of(2) if isinstance(entry, PerArity) else entry
    assert prim.shape_rule is not None, f"{entry.name}: declared without a shape rule"


@pytest.mark.parametrize("entry", _entries(), ids=_label)
def test_every_library_op_has_a_gradient_and_batching_case(entry: Primitive | PerArity) -> None:
    assert _publics(entry) or entry.name in EXCEPTIONS, (
        f"{entry.name}: no case of tests/test_gradient_fuzz.py applies it (add one to its OPS, or a "
        "justified entry to EXCEPTIONS here)"
    )


@pytest.mark.parametrize("entry", _entries(), ids=_label)
def test_every_library_op_has_a_reference_entry(entry: Primitive | PerArity) -> None:
    publics = _publics(entry) or ({entry.name} if entry.name in EXCEPTIONS else set())
    text = "\n".join(p.read_text() for p in sorted(REFERENCE.glob("*.md")))

    def documented(name: str) -> bool:
        if name in OPERATORS:  # an operator of the layers: documented with them
            return "::: monadl.ArrayOperators" in text
        if name in PUBLIC_OF_INTERNAL:
            return f"::: monadl.{PUBLIC_OF_INTERNAL[name]}\n" in text
        return f"::: monadl.{name}\n" in text

    assert publics, f"{entry.name}: no public function applies it"
    assert any(documented(name) for name in publics), (
        f"{entry.name}: none of {sorted(publics)} in docs/reference"
    )


def test_the_exceptions_are_registered_ops_without_a_case() -> None:
    # an exception that is no longer needed (or names no op) goes
    for name in EXCEPTIONS:
        entries = [e for e in LIBRARY if e.name == name]
        assert entries, f"{name}: no registered op of that name"
        assert any(not _publics(e) for e in entries), f"{name}: every op of that name has a fuzz case now"


def _ones(*shapes: tuple[int, ...]) -> list[np.ndarray[Any, np.dtype[np.float64]]]:
    return [np.ones(shape) for shape in shapes]


_LSTM_GATES = ((4, 2),) * 4 + ((2,),) * 4  # 2 inputs, 2 hidden: a direction's weights, then biases
_GRU_GATES = ((4, 2),) * 2 + ((2, 2), (2, 2)) + ((2,),) * 4

ONE_PRIMITIVE: dict[str, Callable[[Any], ArrayLayer]] = {
    # (an op whose calls differ in a mask, present or not, or in their number of directions)
    "scaled_dot_product_attention": lambda mask: monadl.scaled_dot_product_attention(
        np.ones((5, 4)), np.ones((5, 4)), np.ones((5, 2)), mask
    ),
    "self_attention": lambda mask: self_attention(np.ones((5, 6)), mask),
    "packed_lstm": lambda n: packed_lstm(np.ones((3, 2)), (2, 1), *_ones(*_LSTM_GATES * n)),
    "packed_gru": lambda n: packed_gru(np.ones((3, 2)), (2, 1), *_ones(*_GRU_GATES * n)),
}
"""For each op, its public call given one form or the other (a mask or None; 1 or 2 directions)."""


@pytest.mark.parametrize("name", list(ONE_PRIMITIVE))
def test_an_op_is_one_primitive_whatever_its_calls_parameters(name: str) -> None:
    """A mask (or none) and a number of directions are parameters of a call, not other primitives:
    the registry holds one primitive of the op's name, and the calls of either form apply it."""
    entries = [e for e in LIBRARY if e.name == name]
    assert len(entries) == 1, f"{name}: {len(entries)} primitives registered"
    forms = (None, np.ones((5, 5), dtype=bool)) if "attention" in name else (1, 2)
    applied = []
    for form in forms:
        layer = ONE_PRIMITIVE[name](form)
        graph = layer.graph
        assert graph is not None and graph.tags[layer.row] == OP
        applied.append(graph.objs[layer.row])
    assert applied[0] is applied[1] is entries[0]
