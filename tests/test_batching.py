"""Dynamic batching of primitive ops (the scheduler's merging, ``monadl.do.scheduler``): results with
batching on equal results with it off (to 1e-10 in float64) on random trees through the Tree-LSTM
example and on random DAGs of ops, replayed or not; merged calls launch fewer kernels; a shared
weight gets one delta per group; calls that must not merge do not; and a failure inside a merged
group names the call that failed and leaves nothing behind.

The equality tests of work that must merge also assert that merging happened in the batched run
(``Executor.stats``), so they cannot pass vacuously by running everything alone.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from batching_check import Gradients, Layer, Weight, assert_close, gradients_of
from cycles import cyclic_garbage
from hypothesis import given, note, settings
from hypothesis import strategies as st
from returns.result import Failure, Success

import monadl as ml
from examples.tree_lstm import TreeLstm
from monadl import ArrayLayer, ArrayWeight, FloatLayer, FloatWeight
from monadl.data.trees import Tree
from monadl.do.batching import SCAN, Groups, merge_params
from monadl.do.primitive import ELEMENTWISE, Primitive, value_key
from monadl.dsl.core.indices import row_params
from monadl.dsl.core.layers import apply_array
from monadl.dsl.ops.classification import CROSS_ENTROPY_FUSED, LABEL_PARAMS
from monadl.dsl.ops.linalg import LINEAR
from monadl.dsl.ops.operators import TAKE_ROWS
from monadl.gradcheck import check_gradients
from monadl.typeclasses.backend import NUMPY
from monadl.typeclasses.sparse import SparseRows

SETTINGS = settings(max_examples=40, deadline=None)


# ------------------------------------------------------------------------------------ helpers


def assert_same_gradients(
    loss: Layer, names: Mapping[str, Weight] | None = None
) -> tuple[Gradients, Gradients]:
    """Computes ``loss``'s gradients with batching off and on, and on again on an executor that
    never replays (a static graph is replayed from its program the second time an executor meets
    its structure: ``check_gradients`` compares those), and asserts they are equal; returns the
    batched and the unbatched ones."""
    batched, alone = gradients_of(loss, True), gradients_of(loss, False)
    interpreted = gradients_of(loss, True, replay=False)
    assert alone.stats.groups == alone.stats.merged == 0
    assert not alone.stats.replayed and not batched.stats.replayed  # a first run of its structure
    label = {w: n for n, w in (names or {}).items()}
    for other in (batched, interpreted):
        assert_close(other.value, alone.value, "loss")
        assert set(other.gradients) == set(alone.gradients)
        for w, g in alone.gradients.items():
            assert_close(other.gradients[w], g, f"gradient of {label.get(w, repr(w))}")
    return batched, alone


def value_of(layer: Layer, executor: ml.Executor) -> Any:
    result = layer.predict_blocking(executor=executor)
    assert isinstance(result, Success), result
    return result.unwrap()


# ------------------------------------------------------------------- random trees, Tree-LSTM

WORDS = ("good", "bad", "movie", "the", "plot", "unknown")


def word_id(word: str) -> int:
    return WORDS.index(word) % 5  # "unknown" shares row 0 with "good": repeated rows in one lookup


INNER_GATES = {"i", "f_left", "f_right", "o", "u"}  # weights of inner nodes only


@st.composite
def trees(draw: st.DrawFn, depth: int = 6) -> Tree:
    """A random binary tree of height at most ``depth``: random shape, words and labels."""
    label = draw(st.integers(0, 4))
    if depth == 0 or draw(st.integers(0, 9)) < 4:
        return Tree(label, word=draw(st.sampled_from(WORDS)))
    return Tree(label, left=draw(trees(depth - 1)), right=draw(trees(depth - 1)))


def warm_operations() -> None:
    """Calls the Tree-LSTM's batchable cells once: an operation's first call ever runs its body
    directly (to learn its result's structure), and the tests below count the merged calls."""
    model = TreeLstm(5, embedding=2, hidden=2, dtype=np.float64)
    model.loss([Tree(0, left=Tree(1, word="good"), right=Tree(2, word="bad"))], word_id)


@SETTINGS
@given(batch=st.lists(trees(), min_size=2, max_size=4), seed=st.integers(0, 2**16))
def test_tree_lstm_gradients_are_equal_with_batching_on_and_off(batch: list[Tree], seed: int) -> None:
    warm_operations()
    note(f"heights {[t.height() for t in batch]}, leaves {[len(t) for t in batch]}")
    model = TreeLstm(5, embedding=3, hidden=4, seed=seed, dtype=np.float64)
    loss = model.loss(batch, word_id)
    batched, alone = assert_same_gradients(loss, model.weights)
    inner = max(t.height() for t in batch) > 0
    taking_part = {w for n, w in model.weights.items() if inner or n.split(".")[0] not in INNER_GATES}
    assert set(alone.gradients) == taking_part
    # The agenda merges every node of one height across the trees: all the leaves in one launch of
    # the leaf cell (and one lookup), and one launch of the inner cell per height.
    kinds = batched.stats.kinds
    assert kinds["take_rows"] == 1 and kinds["TreeLSTMCell.leaf"] == 1, kinds
    assert kinds.get("TreeLSTMCell.compose", 0) == max(t.height() for t in batch), kinds
    assert batched.stats.groups > 0 and batched.stats.merged >= sum(len(t) for t in batch)
    assert batched.stats.kernels < alone.stats.kernels


def test_tree_lstm_predictions_are_equal_with_batching_on_and_off() -> None:
    warm_operations()
    batch = [
        Tree(
            3, left=Tree(4, word="good"), right=Tree(2, left=Tree(2, word="the"), right=Tree(1, word="bad"))
        ),
        Tree(1, word="plot"),
        Tree(0, left=Tree(0, word="bad"), right=Tree(2, word="movie")),
    ]
    on = TreeLstm(5, embedding=3, hidden=4, seed=3, dtype=np.float64, executor=ml.Executor(batching=True))
    off = TreeLstm(5, embedding=3, hidden=4, seed=3, dtype=np.float64, executor=ml.Executor(batching=False))
    assert_close(on.predict_roots(batch, word_id), off.predict_roots(batch, word_id), "root scores")
    assert on.executor is not None and on.executor.last_stats.groups > 0


# --------------------------------------------------------------------------- random DAGs of ops

Shape = tuple[int, ...]
FLOAT: Shape = ()  # a FloatLayer (no 0-d arrays are made here)
V, M, V8, M8 = (4,), (2, 4), (8,), (2, 8)
ROWS = 6  # of the lookup table
GATES = 3  # linears of different weights that read one node (a cell's gates)


@dataclass(frozen=True)
class Inputs:
    """The weights every DAG is built from (and one constant, lifted)."""

    a: ArrayWeight  # (2, 4)
    row: ArrayWeight  # (4,): a row vector that rows broadcast against
    s: FloatWeight
    w4: ArrayWeight  # linear (4, 4), shared by every linear of 4 inputs
    w8: ArrayWeight  # linear (8, 4)
    bias: ArrayWeight  # (4,)
    table: ArrayWeight  # (ROWS, 4): take_rows
    constant: np.ndarray  # (2, 4)
    gates: tuple[ArrayWeight, ...]  # GATES linears (4, 4) that read one node: they fan out
    gate_biases: tuple[ArrayWeight, ...]  # (4,) each

    @staticmethod
    def new(seed: int) -> Inputs:
        rng = np.random.default_rng(seed)
        return Inputs(
            ArrayWeight(rng.uniform(-1.5, 1.5, M)),
            ArrayWeight(rng.uniform(-1.5, 1.5, V)),
            FloatWeight(float(rng.uniform(-1.5, 1.5))),
            ArrayWeight(rng.normal(0.0, 0.5, (4, 4))),
            ArrayWeight(rng.normal(0.0, 0.35, (8, 4))),
            ArrayWeight(rng.uniform(-0.5, 0.5, V)),
            ArrayWeight(rng.uniform(-1.5, 1.5, (ROWS, 4))),
            rng.uniform(-1.5, 1.5, M),
            tuple(ArrayWeight(rng.normal(0.0, 0.5, (4, 4))) for _ in range(GATES)),
            tuple(ArrayWeight(rng.uniform(-0.5, 0.5, V)) for _ in range(GATES)),
        )

    def weights(self) -> dict[str, Weight]:
        names = ("a", "row", "s", "w4", "w8", "bias", "table")
        gates = {f"gate {g}": w for g, w in enumerate(self.gates)}
        gate_biases = {f"gate bias {g}": b for g, b in enumerate(self.gate_biases)}
        return {name: getattr(self, name) for name in names} | gates | gate_biases

    def pool(self) -> list[Any]:
        """The first nodes of every DAG (shapes POOL): the weights a, row and s, and a constant."""
        return [self.a, self.row, self.s, ml.lift_array(self.constant)]


POOL = (M, V, FLOAT, M)
S_NODE = 2  # the FloatWeight s in the pool


@dataclass(frozen=True)
class Unary:
    """An op of one node (which may also read the shared inputs): where it applies, its result's
    shape, how many primitive ops it makes, and how to build it from the inputs, the node, its
    shape and a label seed ``k``."""

    name: str
    applies: Callable[[Shape], bool]
    result: Callable[[Shape], Shape]
    build: Callable[[Inputs, Any, Shape, int], Any]
    ops: int = 1


def _any(shape: Shape) -> bool:
    return True


def _array(shape: Shape) -> bool:
    return shape != FLOAT


def _same(shape: Shape) -> Shape:
    return shape


def _labels(shape: Shape, k: int) -> np.ndarray:
    classes = shape[-1]
    return np.asarray((np.arange(int(np.prod(shape[:-1]))) + k) % classes, dtype=np.int64).reshape(shape[:-1])


UNARY = [
    Unary("tanh", _any, _same, lambda i, x, s, k: ml.tanh(x)),
    Unary("sigmoid", _any, _same, lambda i, x, s, k: ml.sigmoid(x)),
    Unary("relu", _any, _same, lambda i, x, s, k: ml.relu(x)),
    Unary("exp", _any, _same, lambda i, x, s, k: ml.exp(ml.tanh(x)), ops=2),  # exp of small values
    Unary("0.5 - x", _any, _same, lambda i, x, s, k: 0.5 - x),  # a float constant on the left
    Unary("x * 1.5", _any, _same, lambda i, x, s, k: x * 1.5),
    Unary("s * x", _any, _same, lambda i, x, s, k: i.s * x),  # a shared FloatWeight
    Unary("x * row", lambda s: s in (V, M), _same, lambda i, x, s, k: x * i.row),  # broadcast vs a weight
    Unary("a + x", lambda s: s in (V, M), lambda s: M, lambda i, x, s, k: i.a + x),
    Unary(
        "linear",
        lambda s: s != FLOAT and s[-1] in (4, 8),
        lambda s: (*s[:-1], 4),
        lambda i, x, s, k: ml.linear(x, i.w4 if s[-1] == 4 else i.w8, i.bias),
    ),
    Unary(
        "concatenate [x, x]",
        lambda s: s in (V, M),
        lambda s: (*s[:-1], 8),
        lambda i, x, s, k: ml.concatenate([x, x], axis=-1),  # one op reading a node twice
    ),
    Unary("softmax", _array, _same, lambda i, x, s, k: ml.softmax(x)),
    Unary("sum", _array, lambda s: FLOAT, lambda i, x, s, k: ml.sum(x)),
    Unary("mean", _array, lambda s: FLOAT, lambda i, x, s, k: ml.mean(x)),
    Unary("sum rows", lambda s: len(s) == 2, lambda s: s[:1], lambda i, x, s, k: ml.sum(x, axis=-1)),
    Unary("mean rows", lambda s: len(s) == 2, lambda s: s[:1], lambda i, x, s, k: ml.mean(x, axis=-1)),
    Unary(
        "cross_entropy",
        lambda s: s in (V, M, V8, M8),
        lambda s: FLOAT,
        lambda i, x, s, k: ml.cross_entropy(x, _labels(s, k)),
    ),
]
UNARIES = {u.name: u for u in UNARY}

# One instruction of a DAG program (plain tuples, so that hypothesis prints a failing program):
#   ("lanes", indices, names)      independent lookups table[i], then each named Unary on every one
#   ("unary", name, node, k)       ("map", name, nodes, k): the same Unary on several nodes
#   ("binary", "+" | "-" | "*", node, node)
#   ("add_n", nodes)               ("concatenate", node, node)      ("take_rows", index)
#   ("stack", node, node)          two vectors stacked
#   ("fan", node, gates)           linears of one node by several gate weights (they fan out)
#   ("loss", on_path, off_path)    the loss; off_path nodes are evaluated but not differentiated
Program = list[tuple[Any, ...]]


def broadcast(a: Shape, b: Shape) -> Shape | None:
    try:
        return tuple(np.broadcast_shapes(a, b))
    except ValueError:
        return None


@st.composite
def programs(draw: st.DrawFn) -> Program:
    """A random DAG over the pool of :meth:`Inputs.pool`: first, maybe, 2-4 *lanes*, independent
    rows on which the same ops run (they must merge), then random ops on any earlier nodes (reuse:
    a node may be read by several), then a loss over some nodes while others stay off its path."""
    shapes = list(POOL)
    program: Program = []
    lanes = draw(st.integers(0, 4))
    if lanes >= 2:
        rows = draw(st.lists(st.integers(0, ROWS - 1), min_size=lanes, max_size=lanes, unique=True))
        pairs = draw(st.booleans())  # lookups of 2 rows each: (2, 4) lanes
        indices = [(r, (r + 1) % ROWS) for r in rows] if pairs else rows
        shape: Shape = M if pairs else V
        names = []
        for _ in range(draw(st.integers(1, 4))):
            unary = draw(st.sampled_from([u for u in UNARY if u.applies(shape)]))
            names.append(unary.name)
            shape = unary.result(shape)
        program.append(("lanes", tuple(indices), tuple(names)))
        shapes += [shape] * lanes
    lane_nodes = range(len(POOL), len(POOL) + lanes) if lanes >= 2 else range(0)
    if lanes >= 2 and shapes[-1] == V:  # the lanes' rows stacked: one gather
        program.append(("stack", lane_nodes[-1], lane_nodes[0]))
        shapes.append(M)
    for _ in range(draw(st.integers(1, 10))):
        kinds = ["unary", "map", "binary", "add_n", "concatenate", "stack", "take_rows", "fan"]
        kind = draw(st.sampled_from(kinds))
        nodes = st.integers(0, len(shapes) - 1)
        if kind == "fan":
            node = draw(st.sampled_from([n for n, s in enumerate(shapes) if s in (V, M)]))
            gates = draw(st.lists(st.integers(0, GATES - 1), min_size=2, max_size=GATES, unique=True))
            program.append(("fan", node, tuple(gates)))
            shapes += [shapes[node]] * len(gates)
        elif kind == "take_rows":
            index = draw(st.one_of(st.integers(0, ROWS - 1), st.tuples(*[st.integers(0, ROWS - 1)] * 2)))
            program.append(("take_rows", index))
            shapes.append(V if isinstance(index, int) else M)
        elif kind in ("unary", "map"):
            name = draw(st.sampled_from(list(UNARIES)))
            candidates = [n for n, s in enumerate(shapes) if UNARIES[name].applies(s)]
            if not candidates:
                continue
            k = draw(st.integers(0, 7))
            if kind == "unary":
                node = draw(st.sampled_from(candidates))
                program.append(("unary", name, node, k))
                shapes.append(UNARIES[name].result(shapes[node]))
            else:
                targets = draw(st.lists(st.sampled_from(candidates), min_size=2, max_size=3))
                program.append(("map", name, tuple(targets), k))
                shapes += [UNARIES[name].result(shapes[n]) for n in targets]
        elif kind == "binary":
            i, j = draw(nodes), draw(nodes)
            joint = broadcast(shapes[i], shapes[j])
            if joint is None:
                continue
            program.append(("binary", draw(st.sampled_from("+-*")), i, j))
            shapes.append(joint)
        elif kind == "add_n":
            first = draw(nodes)
            same = [n for n, s in enumerate(shapes) if s == shapes[first]]
            others = draw(st.lists(st.sampled_from(same), min_size=1, max_size=2))
            program.append(("add_n", (first, *others)))
            shapes.append(shapes[first])
        elif kind == "stack":
            vectors = st.sampled_from([n for n, s in enumerate(shapes) if s == V])
            program.append(("stack", draw(vectors), draw(vectors)))
            shapes.append(M)
        else:
            i, j = draw(nodes), draw(nodes)
            if shapes[i] != shapes[j] or shapes[i] not in (V, M):
                continue
            program.append(("concatenate", i, j))
            shapes.append((*shapes[i][:-1], 8))
    count = len(shapes)
    on_path = draw(st.lists(st.integers(0, count - 1), min_size=1, max_size=4, unique=True))
    off_path = [n for n in range(count) if n not in on_path and (n in lane_nodes or draw(st.booleans()))]
    program.append(("loss", tuple(on_path), tuple(off_path)))
    return program


def build(program: Program, inputs: Inputs) -> tuple[FloatLayer, int]:
    """The loss of ``program``, and how many primitive ops each lane runs (lookups included)."""
    pool, shapes = inputs.pool(), list(POOL)

    def add(node: Any, shape: Shape) -> None:
        pool.append(node)
        shapes.append(shape)

    lane_ops = 0
    for instruction in program:
        kind = instruction[0]
        if kind == "lanes":
            _, indices, names = instruction
            shape: Shape = V if isinstance(indices[0], int) else M
            lanes = [ml.take_rows(inputs.table, i) for i in indices]
            lane_ops = 1
            for name in names:
                unary = UNARIES[name]
                lanes = [unary.build(inputs, x, shape, k) for k, x in enumerate(lanes)]
                shape = unary.result(shape)
                lane_ops += unary.ops
            for lane in lanes:
                add(lane, shape)
        elif kind == "unary":
            _, name, n, k = instruction
            add(UNARIES[name].build(inputs, pool[n], shapes[n], k), UNARIES[name].result(shapes[n]))
        elif kind == "map":
            _, name, targets, k = instruction
            for n in targets:
                add(UNARIES[name].build(inputs, pool[n], shapes[n], k), UNARIES[name].result(shapes[n]))
        elif kind == "binary":
            _, op, i, j = instruction
            a, b = pool[i], pool[j]
            result = a + b if op == "+" else a - b if op == "-" else a * b
            joint = broadcast(shapes[i], shapes[j])
            assert joint is not None
            add(result, joint)
        elif kind == "add_n":
            add(ml.add_n([pool[n] for n in instruction[1]]), shapes[instruction[1][0]])
        elif kind == "concatenate":
            _, i, j = instruction
            add(ml.concatenate([pool[i], pool[j]], axis=-1), (*shapes[i][:-1], 8))
        elif kind == "stack":
            add(ml.stack([pool[instruction[1]], pool[instruction[2]]]), M)
        elif kind == "fan":
            _, n, gates = instruction
            for g in gates:
                add(ml.linear(pool[n], inputs.gates[g], inputs.gate_biases[g]), shapes[n])
        elif kind == "take_rows":
            index = instruction[1]
            add(ml.take_rows(inputs.table, index), V if isinstance(index, int) else M)
        else:
            _, on_path, off_path = instruction
            total = ml.add_n([pool[n] if shapes[n] == FLOAT else ml.sum(pool[n]) for n in on_path])
            return with_evaluated(total, [pool[n] for n in off_path]), lane_ops
    raise AssertionError("a program ends with its loss")


def with_evaluated(loss: FloatLayer, others: Sequence[Any]) -> FloatLayer:
    """``loss``, with ``others`` evaluated in the same run, alongside it, but not differentiated
    (their tapes get no delta: they are released at the end of the step)."""
    if not others:
        return loss

    @ml.direct
    async def evaluated() -> FloatLayer:
        await ml.parallel(*others, loss)
        return loss

    return evaluated()


@SETTINGS
@given(program=programs(), seed=st.integers(0, 2**16))
def test_random_dags_have_equal_gradients_with_batching_on_and_off(program: Program, seed: int) -> None:
    inputs = Inputs.new(seed)
    loss, lane_ops = build(program, inputs)
    batched, _ = assert_same_gradients(loss, inputs.weights())
    if lane_ops:  # independent lanes of equal ops: every op of every lane ran merged
        lanes = len(program[0][1])
        assert batched.stats.groups >= lane_ops, (batched.stats, program[0])
        assert batched.stats.merged >= lanes * lane_ops, (batched.stats, program[0])


def test_the_dag_generator_makes_lanes_and_reuse() -> None:
    """The strategy above is not vacuous: it draws lanes, shared nodes, off-path nodes, fans and
    stacks of lanes' rows."""
    seen: dict[str, int] = {"lanes": 0, "reuse": 0, "off path": 0, "fan": 0, "stacked lanes": 0}

    @settings(max_examples=200, deadline=None)  # (drawing alone: cheap)
    @given(programs())
    def count(program: Program) -> None:
        seen["lanes"] += program[0][0] == "lanes"
        reads = [n for ins in program[:-1] for n in _reads(ins)]
        seen["reuse"] += len(reads) != len(set(reads))
        seen["off path"] += bool(program[-1][2])
        seen["fan"] += any(ins[0] == "fan" for ins in program)
        if program[0][0] == "lanes" and isinstance(program[0][1][0], int):  # lanes of vectors
            lanes = range(len(POOL), len(POOL) + len(program[0][1]))
            seen["stacked lanes"] += any(ins[0] == "stack" and ins[1] in lanes for ins in program)

    count()
    assert all(n > 5 for n in seen.values()), seen


def _reads(instruction: tuple[Any, ...]) -> Iterator[int]:
    kind = instruction[0]
    if kind == "unary":
        yield instruction[2]
    elif kind == "map":
        yield from instruction[2]
    elif kind in ("binary", "concatenate", "stack"):
        yield from instruction[-2:]
    elif kind == "add_n":
        yield from instruction[1]
    elif kind == "fan":
        yield instruction[1]


def test_a_float_layer_combined_with_arrays_in_merged_calls() -> None:
    s = FloatWeight(0.3)
    f = ml.tanh(s)  # a float layer: stacked (not shared, as a weight or a constant would be)
    loss = ml.sum(f * np.full((4,), 2.0)) + ml.sum(f * np.ones((4,)))  # two muls of one signature
    value, gradients = ml.compute_gradients(loss, executor=ml.Executor(batching=False))
    assert value == pytest.approx(12.0 * np.tanh(0.3))
    assert gradients[s] == pytest.approx(12.0 * (1.0 - np.tanh(0.3) ** 2))
    assert_same_gradients(loss)  # raises the TypeError in the batched backward


# ----------------------------------------------------------------------------- kernel launches


def chains(count: int = 32, seed: int = 0) -> tuple[FloatLayer, ArrayWeight, ArrayWeight, list[np.ndarray]]:
    """``sum_k sum(tanh(linear(x_k, w, b)))`` over ``count`` independent rows ``x_k``."""
    rng = np.random.default_rng(seed)
    w, b = ArrayWeight(rng.normal(size=(4, 3))), ArrayWeight(rng.normal(size=(3,)))
    xs = [rng.normal(size=(4,)) for _ in range(count)]
    return ml.add_n([ml.sum(ml.tanh(ml.linear(x, w, b))) for x in xs]), w, b, xs


def test_equal_independent_chains_launch_one_kernel_per_op() -> None:
    loss, w, b, xs = chains(32)
    expected = sum(float(np.sum(np.tanh(x @ w.data + b.data))) for x in xs)
    on, off = ml.Executor(batching=True), ml.Executor(batching=False)
    assert value_of(loss, on) == pytest.approx(expected, rel=1e-12)
    assert on.last_stats.kinds == {"linear": 1, "tanh": 1, "sum": 1, "add_n": 1}
    # one gather of the 32 rows x_k, then linear, tanh and sum merged, and the sum of the sums' rows
    assert (on.last_stats.kernels, on.last_stats.groups, on.last_stats.merged) == (5, 3, 96)
    assert value_of(loss, off) == pytest.approx(expected, rel=1e-12)
    assert (off.last_stats.kernels, off.last_stats.groups, off.last_stats.merged) == (97, 0, 0)
    # The backward is merged too: one stacking and one vjp kernel per input of each group, instead
    # of one vjp per call (add_n's own vjp still gives each of its 32 operands a delta).
    ml.compute_gradients(loss, executor=on)
    ml.compute_gradients(loss, executor=off)
    assert on.last_stats.kernels * 4 < off.last_stats.kernels, (on.last_stats, off.last_stats)


def test_batching_per_run_overrides_the_executors_default() -> None:
    loss, *_ = chains(8)
    forward = loss.forward
    on, off = ml.Executor(batching=True), ml.Executor(batching=False)
    alone = on.run(forward, batching=False).data
    assert (on.last_stats.groups, on.last_stats.kernels) == (0, 25)
    merged = off.run(forward, batching=True).data
    assert (off.last_stats.groups, off.last_stats.kernels) == (3, 5)  # a gather of the rows, 4 ops
    assert merged == pytest.approx(alone, rel=1e-12)
    on.run(forward)  # and each executor's default is back for the next run
    off.run(forward)
    assert on.last_stats.groups == 3 and off.last_stats.groups == 0
    assert on.stats.groups == 0 + 3 and on.stats.kernels == 25 + 5  # stats sum the runs


def test_stats_count_a_call_that_merged_with_nobody_as_a_launch_not_a_group() -> None:
    x = ArrayWeight(np.ones(3))
    executor = ml.Executor(batching=True)
    assert value_of(ml.sum(ml.tanh(rows_of(x))), executor) == pytest.approx(3 * np.tanh(1.0))
    assert executor.last_stats.kinds == {"mul": 1, "tanh": 1, "sum": 1}
    assert executor.last_stats.groups == executor.last_stats.merged == 0


# --------------------------------------------------------------- shared weights: one delta a group


def test_a_shared_weight_gets_one_delta_per_group() -> None:
    loss, w, b, xs = chains(32)
    on = gradients_of(loss, True)
    off = gradients_of(loss, False)
    # The group's one vjp gives w its delta, and one b (the rows x_k are constants: none for them);
    # unmerged, every call's own vjps do. Either way each weight's summed delta is taken once.
    assert on.stats.vjps["linear"] == 2 and off.stats.vjps["linear"] == 2 * 32
    assert on.stats.backwards["weight"] == off.stats.backwards["weight"] == 2
    for weight in (w, b):
        assert_close(on.gradients[weight], off.gradients[weight], repr(weight))
    # And the gradient is right: d/dw of sum_k sum(tanh(x_k w + b)).
    slopes = [1.0 - np.tanh(x @ w.data + b.data) ** 2 for x in xs]
    np.testing.assert_allclose(on.gradients[w], sum(np.outer(x, d) for x, d in zip(xs, slopes, strict=True)))
    np.testing.assert_allclose(on.gradients[b], sum(slopes), rtol=1e-12)


@SETTINGS
@given(picks=st.lists(st.integers(0, 3), min_size=2, max_size=8), seed=st.integers(0, 2**16))
def test_rows_of_one_group_read_in_any_order_have_the_unbatched_gradients(
    picks: list[int], seed: int
) -> None:
    # The tanh calls merge into one group of 4 rows; the products read its rows in the order of
    # ``picks`` (repeated, out of order, consecutive or not), merged into one gather of that one
    # group's rows: a repeated row's deltas must add up, as they do with each call alone.
    rng = np.random.default_rng(seed)
    w, v = ArrayWeight(rng.standard_normal(3)), ArrayWeight(rng.standard_normal(3))
    xs = [ml.tanh(w * rng.uniform(0.5, 2.0, 3)) for _ in range(4)]
    loss = ml.add_n([ml.sum(xs[j] * v) for j in picks])
    note(f"picks {picks}")
    batched, _ = assert_same_gradients(loss, {"w": w, "v": v})
    assert batched.stats.kinds["mul"] == 2  # one launch for the scalings, one for the products


def test_an_embedding_table_gets_one_sparse_delta_per_group() -> None:
    table = ArrayWeight(np.arange(12.0).reshape(6, 2))
    rows = [4, 1, 4, 0]
    loss = ml.add_n([ml.sum(ml.take_rows(table, r) * float(k + 1)) for k, r in enumerate(rows)])
    executor = ml.Executor(batching=True)
    value, gradients = ml.compute_gradients(loss, executor=executor)
    assert executor.last_stats.vjps["take_rows"] == 1  # one delta for the four lookups
    gradient = gradients[table]
    assert isinstance(gradient, SparseRows)  # the rows looked up, not a dense table
    expected = np.zeros((6, 2))
    for k, r in enumerate(rows):
        expected[r] += k + 1.0  # row 4 looked up twice: both deltas added
    np.testing.assert_array_equal(gradient.to_dense(), expected)
    assert value == sum((k + 1.0) * float(np.sum(table.data[r])) for k, r in enumerate(rows))


# ---------------------------------------------------------------------- calls that must not merge


def rows_of(w: ArrayWeight) -> ArrayLayer:
    """``w`` as a layer whose data is stacked when its calls merge: an op's inputs that are all
    weights (or float constants) are shared, and calls of shared inputs only never merge (see
    test_calls_of_weights_only_do_not_merge)."""
    return w * np.ones(w.data.shape, dtype=w.data.dtype)


def launches(layer: Layer) -> tuple[dict[str, int], int]:
    """The launches by kind and the merged groups of ``layer``'s forward, with batching on."""
    executor = ml.Executor(batching=True)
    value_of(layer, executor)
    return executor.last_stats.kinds, executor.last_stats.groups


def test_calls_of_different_shapes_do_not_merge() -> None:
    x, y = ArrayWeight(np.full(4, 0.5)), ArrayWeight(np.full((2, 3), 0.25))
    loss = ml.sum(ml.tanh(rows_of(x))) + ml.sum(ml.tanh(rows_of(y)))
    kinds, groups = launches(loss)
    assert kinds == {"mul": 2, "tanh": 2, "sum": 2, "add": 1} and groups == 0
    batched, _ = assert_same_gradients(loss)
    assert batched.value == pytest.approx(4 * np.tanh(0.5) + 6 * np.tanh(0.25))


def test_calls_with_different_weights_do_not_merge() -> None:
    rng = np.random.default_rng(1)
    w1, w2 = ArrayWeight(rng.normal(size=(3, 2))), ArrayWeight(rng.normal(size=(3, 2)))
    b = ArrayWeight(np.zeros(2))
    x1, x2 = rng.normal(size=3), rng.normal(size=3)
    loss = ml.add_n([ml.sum(ml.linear(x1, w1, b)), ml.sum(ml.linear(x2, w2, b))])
    kinds, _ = launches(loss)
    assert kinds["linear"] == 2  # the sums after them still merge
    batched, _ = assert_same_gradients(loss)
    np.testing.assert_allclose(batched.gradients[w1], np.outer(x1, np.ones(2)))
    np.testing.assert_allclose(batched.gradients[w2], np.outer(x2, np.ones(2)))
    np.testing.assert_allclose(batched.gradients[b], np.full(2, 2.0))


@settings(max_examples=30, deadline=None)
@given(
    lead=st.lists(st.integers(1, 3), max_size=2),
    gates=st.integers(2, 4),
    bias=st.sampled_from(["weight", "constant", "float", "float weight"]),
    x_is_weight=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_linears_of_one_input_and_different_weights_fan_out_into_one_kernel(
    lead: list[int], gates: int, bias: str, x_is_weight: bool, seed: int
) -> None:
    """A cell's gates: linears of one x with different weights merge with nothing as rows, and run
    as one matmul by the stacked weights instead, with the results and gradients of running alone."""
    rng = np.random.default_rng(seed)
    source = ArrayWeight(rng.normal(size=(*lead, 3)))
    x = source if x_is_weight else ml.tanh(source)

    def new_bias() -> Any:
        if bias == "weight":
            return ArrayWeight(rng.normal(size=2))
        if bias == "constant":
            return rng.normal(size=2)
        value = float(rng.normal())
        return FloatWeight(value) if bias == "float weight" else value

    outputs = [ml.linear(x, ArrayWeight(rng.normal(size=(3, 2))), new_bias()) for _ in range(gates)]
    heads: list[Callable[[ArrayLayer], ArrayLayer]] = [lambda y: y * y, ml.sigmoid, ml.tanh, ml.exp]
    loss = ml.add_n([ml.sum(heads[j](y)) for j, y in enumerate(outputs)])
    kinds, _ = launches(loss)
    assert kinds["linear"] == 1, kinds  # the gates at once, not one after the other
    assert_same_gradients(loss)


def test_fanned_out_linears_have_the_gradients_of_finite_differences() -> None:
    def loss(x: Any, w1: Any, w2: Any, w3: Any, b1: Any, b2: Any, b3: Any) -> FloatLayer:
        h = ml.tanh(x)
        return (
            ml.sum(ml.linear(h, w1, b1) ** 2.0)
            + ml.sum(ml.sigmoid(ml.linear(h, w2, b2)))
            + ml.sum(ml.tanh(ml.linear(h, w3, b3)))
        )

    rng = np.random.default_rng(3)
    inputs = [rng.normal(size=(2, 3)), *(rng.normal(size=(3, 4)) for _ in range(3))]
    inputs += [rng.normal(size=4) for _ in range(3)]
    check_gradients(loss, *inputs)  # its taped run fans out: checked here
    kinds, _ = launches(loss(*(ArrayWeight(v) for v in inputs)))
    assert kinds["linear"] == 1, kinds


def fan_of(x: Any, weights: list[Any], biases: list[Any]) -> ArrayLayer:
    """The k linears of ``x`` (a fan), their results side by side."""
    h = ml.tanh(x)
    return ml.concatenate([ml.linear(h, w, b) for w, b in zip(weights, biases, strict=True)], axis=-1)


def test_a_fan_follows_its_weights_new_versions_and_arrays_changed_in_place() -> None:
    """On NumPy a fan of small weights runs as one product by the weights joined, joined once and
    kept: a training step's new weights, other float biases, or a writeable constant changed in
    place must give the values the linears give alone."""
    rng = np.random.default_rng(7)
    x = ArrayWeight(rng.normal(size=(5, 3)))
    weights = [ArrayWeight(rng.normal(size=(3, 2))) for _ in range(3)]
    biases = [ArrayWeight(rng.normal(size=2)) for _ in range(3)]
    on, off = ml.Executor(batching=True), ml.Executor(batching=False)

    def expected(ws: list[Any], bs: list[Any]) -> Any:
        h = np.tanh(x.data)
        return np.concatenate(
            [h @ np.asarray(w) + np.asarray(b) for w, b in zip(ws, bs, strict=True)], axis=-1
        )

    for _ in range(3):
        layer = fan_of(x, weights, biases)
        np.testing.assert_allclose(
            value_of(layer, on), expected([w.data for w in weights], [b.data for b in biases]), rtol=1e-12
        )
        assert on.last_stats.kinds["linear"] == 1
        np.testing.assert_allclose(value_of(layer, on), value_of(layer, off), rtol=1e-12)
        assert isinstance(ml.sum(layer * layer).train_blocking(ml.SGD(0.1), executor=on), Success)
    ws = [w.data for w in weights]
    for floats in ([0.5, -1.0, 0.5], [0.5, 2.0, 0.5]):  # the same weights, other float biases
        np.testing.assert_allclose(
            value_of(fan_of(x, weights, list(floats)), on), expected(ws, floats), rtol=1e-12
        )
    constant = rng.normal(size=(3, 2))  # writeable: never kept joined
    layer = fan_of(x, [weights[0], constant, weights[2]], biases)
    first = np.asarray(value_of(layer, on))
    constant *= 2.0
    np.testing.assert_allclose(
        value_of(layer, on), expected([ws[0], constant, ws[2]], [b.data for b in biases]), rtol=1e-12
    )
    assert not np.allclose(first, value_of(layer, on))


@settings(max_examples=25, deadline=None)
@given(
    steps=st.integers(1, 4),
    sequences=st.integers(1, 3),
    gates=st.integers(2, 4),
    shared_gate=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_a_fans_weights_over_a_sequence_get_the_unbatched_gradients(
    steps: int, sequences: int, gates: int, shared_gate: bool, seed: int
) -> None:
    """A cell's gates fan out at every step of its sequences; each gate's weights are given one
    product for all the steps, with every gate's rows side by side. Gates whose weights are also
    read alone (by a linear outside the cell), and a cell whose two gates share one weight, get the
    gradients that running without batching gives."""
    rng = np.random.default_rng(seed)
    weights = [ArrayWeight(rng.normal(size=(3, 3))) for _ in range(gates)]
    biases = [ArrayWeight(rng.normal(size=3)) for _ in range(gates)]
    if shared_gate:  # the last gate reads the first one's weight with a bias of its own
        weights[-1] = weights[0]

    @ml.batchable
    def cell(h: ml.AnyArray) -> ArrayLayer:
        outputs = [ml.linear(h, w, b) for w, b in zip(weights, biases, strict=True)]
        return ml.tanh(ml.add_n([y * float(j + 1) for j, y in enumerate(outputs)]))  # a delta each

    starts = [rng.normal(size=3) for _ in range(sequences)]
    cell(starts[0])  # the operation's first call learns its results
    losses: list[FloatLayer] = []
    for start in starts:
        h: Any = start
        for _ in range(steps):
            h = cell(h)
        losses.append(ml.sum(h * h))
    # The first gate's weight and the second's bias read alone too: products of their own.
    losses.append(ml.sum(ml.tanh(ml.linear(rng.normal(size=3), weights[0], biases[1]))))
    loss = ml.add_n(losses)
    kinds, _ = launches(loss)
    assert kinds["linear"] == steps + 1, kinds  # a fan a step (the sequences' rows merged), one alone
    assert_same_gradients(loss)


def test_a_shape_error_in_fanned_out_linears_names_the_call() -> None:
    x = ArrayWeight(np.ones(3))
    w1, w2 = ArrayWeight(np.ones((4, 2))), ArrayWeight(np.ones((4, 2)))  # 3 != 4
    before = (w1.data.copy(), w2.data.copy())
    loss = ml.sum(ml.linear(ml.tanh(x), w1, 0.0)) + ml.sum(ml.linear(ml.tanh(x), w2, 0.0))
    result = loss.train_blocking(ml.SGD(0.1), executor=ml.Executor())
    assert isinstance(result, Failure) and isinstance(result.failure(), ml.ShapeError)
    assert "linear" in str(result.failure()) and "(3,) and (4, 2)" in str(result.failure())
    np.testing.assert_array_equal(w1.data, before[0])
    np.testing.assert_array_equal(w2.data, before[1])


def test_calls_with_different_float_constants_do_not_merge() -> None:
    x, y = ArrayWeight(np.ones(3)), ArrayWeight(np.full(3, 2.0))
    # rows_of's two muls (by different weights) do not merge; then the muls by equal constants do,
    # and those by different ones do not.
    assert launches(ml.sum(rows_of(x) * 2.0) + ml.sum(rows_of(y) * 2.0))[0]["mul"] == 2 + 1
    loss = ml.sum(rows_of(x) * 2.0) + ml.sum(rows_of(y) * 3.0)
    assert launches(loss)[0]["mul"] == 2 + 2
    batched, _ = assert_same_gradients(loss)
    assert batched.value == pytest.approx(6.0 + 18.0)
    np.testing.assert_array_equal(batched.gradients[x], np.full(3, 2.0))
    np.testing.assert_array_equal(batched.gradients[y], np.full(3, 3.0))


def test_calls_of_different_dtypes_do_not_merge() -> None:
    x32 = ArrayWeight(np.full(3, 0.5, dtype=np.float32))
    x64 = ArrayWeight(np.full(3, 0.5))
    t32, t64 = ml.tanh(rows_of(x32)), ml.tanh(rows_of(x64))
    kinds, groups = launches(ml.sum(t32) + ml.sum(t64))
    assert kinds == {"mul": 2, "tanh": 2, "sum": 2, "add": 1} and groups == 0
    executor = ml.Executor(batching=True)
    value_32, value_64 = value_of(t32, executor), value_of(t64, executor)
    assert value_32.dtype == np.float32 and value_64.dtype == np.float64  # each kept its own
    _, gradients = ml.compute_gradients(ml.sum(t32) + ml.sum(t64), executor=executor)
    assert gradients[x32].dtype == np.float32 and gradients[x64].dtype == np.float64
    np.testing.assert_allclose(gradients[x64], np.full(3, 1.0 - np.tanh(0.5) ** 2), rtol=1e-14)
    np.testing.assert_allclose(gradients[x32], np.full(3, 1.0 - np.tanh(0.5) ** 2), rtol=1e-6)


def test_calls_of_weights_only_do_not_merge() -> None:
    """An op whose inputs are all shared (weights, float constants) has nothing to stack: it runs
    on its own, with batching on or off."""
    x, y = ArrayWeight(np.ones(3)), ArrayWeight(np.full(3, 2.0))
    loss = ml.sum(ml.tanh(x)) + ml.sum(ml.tanh(y))
    kinds, groups = launches(loss)
    assert kinds["tanh"] == 2 and kinds["sum"] == 1 and groups == 1  # the sums of layers merge
    batched, _ = assert_same_gradients(loss)
    np.testing.assert_allclose(batched.gradients[y], np.full(3, 1.0 - np.tanh(2.0) ** 2), rtol=1e-14)


# A primitive of the tests' own whose parameter is a list: unhashable, so its calls cannot be keyed.
scale_by = Primitive(
    "scale_by",
    lambda xp, x, factors: x * xp.asarray(factors),
    (lambda xp, d, o, x, factors: d * xp.asarray(factors),),
    batch=ELEMENTWISE,
)


@pytest.mark.parametrize(
    ("factors", "launched"),
    [((1.0, -2.0), 1), ([1.0, -2.0], 3), (np.array([1.0, -2.0]), 3)],
    ids=["tuple", "list", "array"],
)
def test_calls_with_unhashable_parameters_run_alone(factors: Any, launched: int) -> None:
    """Calls on computed rows with equal parameters, each call its own copy: a tuple's merge; equal
    lists, or arrays (whose ``==`` is no truth value), run each call alone."""
    xs = [ArrayWeight(np.full(2, float(k + 1))) for k in range(3)]

    def copy() -> Any:
        return factors.copy() if isinstance(factors, (list, np.ndarray)) else tuple(list(factors))

    loss = ml.add_n([ml.sum(apply_array(scale_by, ml.tanh(x), factors=copy())) for x in xs])
    kinds, _ = launches(loss)
    assert kinds["scale_by"] == launched
    batched, _ = assert_same_gradients(loss)
    assert batched.value == pytest.approx(sum(float(np.tanh(k + 1.0)) * -1.0 for k in range(3)))
    for k, x in enumerate(xs):
        np.testing.assert_allclose(batched.gradients[x], np.asarray(factors) * (1.0 - np.tanh(k + 1.0) ** 2))


PARAMETER_VALUES: list[Any] = [
    None,
    0,
    1,
    -1,
    "indices",
    (1,),
    np.array(3),
    np.array([3, 4]),
    np.array([[3, 4]]),
    np.array(3, dtype=np.int32),
]


PARAMETERS = st.dictionaries(
    st.sampled_from(["indices", "targets", "labels", "axis"]), st.sampled_from(PARAMETER_VALUES)
)


@SETTINGS
@given(prim=st.sampled_from([TAKE_ROWS, CROSS_ENTROPY_FUSED]), a=PARAMETERS, b=PARAMETERS, same=st.booleans())
def test_a_signatures_flat_parameters_are_equal_exactly_when_their_static_keys_are(
    prim: Primitive, a: dict[str, Any], b: dict[str, Any], same: bool
) -> None:
    """A signature holds an op's parameters flat (their number, then each name and value, a
    per-run one's by its type, shape and dtype): two calls' are equal iff their pairs of name and
    value are, whatever names, values and numbers of parameters they have; unhashable
    (``signature_items`` False: the call runs alone) iff the pairs are."""
    if same:  # a call like ``a`` (its arrays other objects of the same kinds)
        b = {name: value.copy() if isinstance(value, np.ndarray) else value for name, value in a.items()}

    def pairs(params: dict[str, Any]) -> tuple[Any, ...] | None:
        """The parameters as (name, value) pairs, a per-run value by its kind; None if unhashable."""
        key = tuple((name, value_key(v) if name in prim.per_run else v) for name, v in params.items())
        try:
            hash(key)
        except TypeError:
            return None
        return key

    flat: list[tuple[Any, ...]] = []
    for params in (a, b):
        items: list[Any] = []
        hashable = prim.signature_items(items, params)
        assert hashable == (pairs(params) is not None)
        if not hashable:
            return
        flat.append(tuple(items))
        hash(flat[-1])
    assert (flat[0] == flat[1]) == (pairs(a) == pairs(b))


# Signature parts as the scheduler makes them: kind ids and slots (fresh int objects, most above the
# small ints Python caches), float keys (0.0 and -0.0 apart), strings, tuples.
SIGNATURE_PARTS: list[Any] = [
    0,
    1,
    300,
    70_000,
    -1,
    -2,
    0.0,
    (0.0, -1.0),
    2.5,
    "axis",
    None,
    (1,),
    ("value", 3),
]


def _fresh(part: Any) -> Any:
    """An equal part that is another object (as each row's signature is made anew)."""
    if isinstance(part, int):
        return int(str(part))
    if isinstance(part, tuple):
        return tuple(_fresh(p) for p in part)
    return part


@SETTINGS
@given(
    st.lists(
        st.lists(st.sampled_from(SIGNATURE_PARTS), min_size=1, max_size=3), min_size=1, max_size=3 * SCAN
    ),
    st.lists(st.integers(0, 10**6), min_size=1, max_size=60),
)
def test_groups_are_the_rows_of_equal_signatures_in_order_of_first_meeting(
    signatures: list[list[Any]], picks: list[int]
) -> None:
    """``Groups`` gives a dictionary of tuples' grouping (before and past ``SCAN`` groups, the
    keys' parts other objects in each row): the same groups in the same order, each its rows in
    order, each group's hash its tuple's."""
    # distinct signatures (a number of their own appended), met in any order, each many times
    signatures = [[*key, k] for k, key in enumerate(signatures)]
    keys = [signatures[p % len(signatures)] for p in picks]
    groups = Groups()
    expected: dict[tuple[Any, ...], list[int]] = {}
    for r, key in enumerate(keys):
        expected.setdefault(tuple(key), []).append(r)
        assert groups.join([_fresh(part) for part in key], r)
    assert groups.join(None, len(keys)) is False
    found = {tuple(key): rows for key, rows in zip(groups.keys, groups.rows, strict=True)}
    assert list(found) == list(expected)  # the same groups, in the order first met
    assert found == expected
    assert [groups.hash_of(g) for g in range(len(found))] == [hash(key) for key in found]


def test_calls_that_differ_in_a_constant_each_run_alone_past_the_groups_scanned() -> None:
    """Calls of one op each with a constant of its own are as many groups, more than ``SCAN``:
    each runs on its own (no merge), with its own constant."""
    xs = [ArrayWeight(np.full(2, float(k + 1))) for k in range(3 * SCAN)]
    loss = ml.add_n([ml.sum(x * (0.5 + k)) for k, x in enumerate(xs)])
    kinds, _ = launches(loss)
    assert kinds["mul"] == 3 * SCAN  # none merged
    batched, _ = assert_same_gradients(loss)
    for k, x in enumerate(xs):
        np.testing.assert_array_equal(batched.gradients[x], np.full(2, 0.5 + k))


@settings(max_examples=30, deadline=None)
@given(
    calls=st.integers(2, 5),
    lead=st.sampled_from([(), (1,), (3,)]),
    classes=st.integers(2, 40),
    dtype=st.sampled_from([np.float32, np.float64]),
    seed=st.integers(0, 2**32 - 1),
)
def test_merged_cross_entropy_of_labels_is_each_calls_own_arithmetic(
    calls: int, lead: tuple[int, ...], classes: int, dtype: type[np.floating[Any]], seed: int
) -> None:
    """Calls of ``cross_entropy`` of integer labels merged compute each call's loss and gradient
    as the call alone does, in the same order: equal in float32 too, where a sum in another order
    (over a one-hot's zeros) differs in the last bits."""
    rng = np.random.default_rng(seed)
    logits = [ArrayWeight((rng.standard_normal((*lead, classes)) * 3).astype(dtype)) for _ in range(calls)]
    labels = [rng.integers(0, classes, lead) for _ in range(calls)]
    loss = ml.add_n([ml.cross_entropy(x, t) for x, t in zip(logits, labels, strict=True)])
    kinds, _ = launches(loss)
    assert kinds["cross_entropy"] == 1  # merged
    batched, _ = assert_same_gradients(loss)
    assert all(batched.gradients[x].dtype == dtype for x in logits)


@settings(max_examples=20, deadline=None)
@given(labels=st.lists(st.integers(0, 6), min_size=2, max_size=6), seed=st.integers(0, 2**32 - 1))
def test_python_int_labels_merge_and_leave_their_shared_parameters_as_they_were(
    labels: list[int], seed: int
) -> None:
    """An op given a Python int label reads parameters shared by every op given that label (one
    dict per label): merged, each call computes what it computes alone, and neither a run nor a
    training step changes a shared dict."""
    before = [(params, dict(params)) for params in LABEL_PARAMS[:7]]
    rng = np.random.default_rng(seed)
    logits = [ArrayWeight(rng.standard_normal(7) * 3) for _ in labels]
    loss = ml.add_n([ml.cross_entropy(x, t) for x, t in zip(logits, labels, strict=True)])
    kinds, _ = launches(loss)
    assert kinds["cross_entropy"] == 1  # merged
    assert_same_gradients(loss)
    loss.train_blocking(ml.SGD(0.1)).unwrap()
    for params, copy in before:
        assert params.keys() == copy.keys() and all(params[k] is copy[k] for k in copy)


def test_lookups_of_python_int_rows_share_their_parameters_and_leave_them_as_they_were() -> None:
    """A lookup of one small row index (``take_rows(table, 3)``, ``table[3]``) reads parameters
    shared by every lookup of that row; merged, the lookups give each row, and a training step
    changes neither the shared dicts nor their index arrays."""
    assert row_params(3) is row_params(3) and row_params(3) is not row_params(4)
    before = {k: (row_params(k), dict(row_params(k))) for k in range(5)}
    table = ArrayWeight(np.arange(15.0).reshape(5, 3))
    rows = [ml.take_rows(table, 3), table[1], ml.take_rows(table, 3), table[4]]
    recorded = []
    for r in rows:
        assert r.graph is not None
        recorded.append(r.graph.params[r.row])
    assert all(p is row_params(k) for p, k in zip(recorded, (3, 1, 3, 4), strict=True))
    kinds, _ = launches(ml.add_n([ml.sum(r) for r in rows]))
    assert kinds["take_rows"] == 1  # merged
    loss = ml.add_n([ml.sum(r * (k + 1.0)) for k, r in enumerate(rows)])
    loss.train_blocking(ml.SGD(1.0)).unwrap()
    np.testing.assert_array_equal(table.data[3], np.arange(9.0, 12.0) - 4.0)  # (1 + 3) of the step
    for params, copy in before.values():
        assert params.keys() == copy.keys() and all(params[k] is copy[k] for k in copy)
        assert int(params["indices"]) in range(5) and not params["indices"].flags.writeable


def test_probability_targets_and_integer_labels_do_not_merge() -> None:
    logits = [ArrayWeight(np.array([0.1 * k, -0.2, 0.3])) for k in range(4)]
    targets = [np.array(1), np.array([0.2, 0.5, 0.3]), np.array(2), np.array([1.0, 0.0, 0.0])]
    loss = ml.add_n([ml.cross_entropy(x, t) for x, t in zip(logits, targets, strict=True)])
    kinds, _ = launches(loss)
    assert kinds["cross_entropy"] == 2  # the labels merge, the probabilities merge
    assert_same_gradients(loss)


def test_lookups_and_products_of_one_computed_value_merge_reading_it_once() -> None:
    """A table or a weight that is an op's result (a layer's output rows, a weight scaled), not a
    weight itself, is one value for all the calls that read it whole: the lookups merge into one,
    the products by it into one, and its delta is summed once."""
    w = ArrayWeight(np.random.default_rng(0).normal(size=(5, 3)))
    xs = [ArrayWeight(np.random.default_rng(k).normal(size=(3,))) for k in range(1, 5)]
    table = ml.tanh(w * 2.0)
    rows = [ml.take_rows(table, r) for r in (4, 0, 4, 2)]
    top = table[:3, :]
    products = [ml.linear(x, top, 0.5) for x in xs]
    loss = ml.add_n([ml.sum(r * p) for r, p in zip(rows, products, strict=True)])
    on, off = gradients_of(loss, True), gradients_of(loss, False)
    assert_close(on.value, off.value, "loss")
    for weight in (w, *xs):
        assert_close(on.gradients[weight], off.gradients[weight], "gradient")
    assert off.stats.kinds["take_rows"] == 4 and off.stats.kinds["linear"] == 4, off.stats.kinds
    assert on.stats.kinds["take_rows"] == 1 and on.stats.kinds["linear"] == 1, on.stats.kinds


# -------------------------------------------------------------------------------------- failures


def test_an_out_of_range_row_in_a_merged_lookup_names_that_call() -> None:
    table = ArrayWeight(np.ones((6, 4)))
    loss = ml.add_n([ml.sum(ml.take_rows(table, r)) for r in (1, 2, 9, 3)])
    executor = ml.Executor(batching=True)
    with pytest.raises(ml.ShapeError, match=r"take_rows: row index 9 is out of range .* shape \(6, 4\)"):
        ml.compute_gradients(loss, executor=executor)
    assert executor.last_stats.kinds == {"take_rows": 1} and executor.last_stats.merged == 4


def test_a_shape_error_in_a_merged_group_names_the_calls_shapes_not_the_stacked_ones() -> None:
    # Three equal calls that do not fit: they merge (equal signatures), and the error is the one a
    # call alone raises: its own shapes (3,) and (4,), not the stacked (3, 3) and (3, 4).
    terms = [ml.sum(ml.tanh(ArrayWeight(np.ones(3))) + ml.tanh(ArrayWeight(np.ones(4)))) for _ in range(3)]
    loss = ml.add_n(terms)
    for batching in (True, False):
        executor = ml.Executor(batching=batching)
        with pytest.raises(ml.ShapeError, match=r"^add: operands of shapes \(3,\) and \(4,\) do not fit"):
            ml.compute_gradients(loss, executor=executor)
        assert executor.last_stats.kinds["add"] == 1  # the three adds merged; or the first alone, failing
        assert executor.last_stats.merged == (3 if batching else 0)


def test_a_wrong_label_in_a_merged_loss_fails_the_step() -> None:
    logits = [ArrayWeight(np.zeros(3)) for _ in range(3)]
    loss = ml.add_n([ml.cross_entropy(x, np.array(k * 3)) for k, x in enumerate(logits)])  # 3, 6 wrong
    executor = ml.Executor(batching=True)
    with pytest.raises(ValueError, match="label 3 is out of range for 3 classes"):  # the first call's
        ml.compute_gradients(loss, executor=executor)
    assert executor.last_stats.kinds == {"cross_entropy": 1} and executor.last_stats.merged == 3


def _fails(check: Callable[[], object]) -> bool:
    try:
        check()
    except (ValueError, ml.ShapeError):
        return True
    return False


def _recorded_params(layer: ArrayLayer | FloatLayer) -> dict[str, Any]:
    """The parameters recording gave an op's call."""
    assert layer.graph is not None
    params: dict[str, Any] = layer.graph.params[layer.row]
    return params


def _merged_check_agrees(prim: Primitive, first: tuple[Any, ...], calls: list[dict[str, Any]]) -> None:
    """``prim``'s one check of merged calls fails exactly when one of the calls' own checks does."""
    spec = prim.batch
    assert spec is not None and spec.check_merged is not None and prim.check_values is not None
    merged = merge_params(prim, calls, first[0])
    check, together = prim.check_values, spec.check_merged
    one_fails = any(_fails(functools.partial(check, *first, **call)) for call in calls)
    assert _fails(functools.partial(together, first, merged)) == one_fails


@settings(max_examples=200, deadline=None)
@given(
    rows=st.lists(st.lists(st.integers(-2, 7), min_size=2, max_size=2) | st.integers(-2, 7), min_size=1),
    table_rows=st.integers(1, 6),
    empty=st.booleans(),
)
def test_one_check_of_merged_lookups_fails_exactly_when_a_calls_check_does(
    rows: list[list[int] | int], table_rows: int, empty: bool
) -> None:
    shape_of_first = np.shape(rows[0])
    rows = [r for r in rows if np.shape(r) == shape_of_first]  # a signature's indices: one shape
    table = ArrayWeight(np.ones((table_rows, 2)))
    indices = [np.zeros((0,), dtype=np.int64) if empty else np.asarray(r) for r in rows]
    calls = [_recorded_params(ml.take_rows(table, i)) for i in indices]
    _merged_check_agrees(TAKE_ROWS, (table.data,), calls)


@settings(max_examples=200, deadline=None)
@given(classes=st.integers(1, 4), data=st.data())
def test_one_check_of_merged_losses_fails_exactly_when_a_calls_check_does(
    classes: int, data: st.DataObject
) -> None:
    label = st.integers(-1, classes)  # one out of range at either end
    labels = data.draw(st.lists(st.lists(label, min_size=3, max_size=3), min_size=1, max_size=6))
    logits = ArrayWeight(np.zeros((3, classes)))
    calls = [_recorded_params(ml.cross_entropy(logits, np.asarray(t))) for t in labels]
    _merged_check_agrees(CROSS_ENTROPY_FUSED, (logits.data,), calls)


def test_a_wrong_label_in_a_merged_loss_names_its_call_and_changes_nothing() -> None:
    # Twelve merged losses, one label out of range: the group's one check of them fails, and then
    # each call's own check, so that the error is that call's.
    w = ArrayWeight(np.ones((3, 3)))
    labels = [k % 3 for k in range(12)]
    labels[7] = 5
    loss = ml.add_n([ml.cross_entropy(ml.linear(np.ones(3), w, 0.0), np.array(k)) for k in labels])
    before = w.data.copy()
    result = loss.train_blocking(ml.SGD(0.1), executor=ml.Executor())
    assert isinstance(result, Failure)
    assert "cross_entropy: label 5 is out of range for 3 classes" in str(result.failure())
    np.testing.assert_array_equal(w.data, before)


def failing_step(table: ArrayWeight, w: ArrayWeight, bad_row: int) -> FloatLayer:
    """Eight merged lookups and linears, one of whose rows is ``bad_row``."""
    rows = [0, 1, 2, bad_row, 3, 4, 5, 0]
    return ml.add_n([ml.sum(ml.tanh(ml.linear(ml.take_rows(table, r), w, 0.0))) for r in rows])


def test_a_failed_batched_step_changes_no_weight() -> None:
    rng = np.random.default_rng(0)
    table, w = ArrayWeight(rng.normal(size=(6, 4))), ArrayWeight(rng.normal(size=(4, 4)))
    executor = ml.Executor(batching=True)
    assert isinstance(failing_step(table, w, 2).train_blocking(ml.SGD(0.1), executor=executor), Success)
    before = {name: x.data.tobytes() for name, x in (("table", table), ("w", w))}
    result = failing_step(table, w, 6).train_blocking(ml.SGD(0.1), executor=executor)
    assert isinstance(result, Failure) and isinstance(result.failure(), ml.ShapeError)
    assert "row index 6 is out of range" in str(result.failure())
    assert executor.last_stats.groups > 0  # it failed inside merged work
    assert {name: x.data.tobytes() for name, x in (("table", table), ("w", w))} == before
    assert isinstance(failing_step(table, w, 2).train_blocking(ml.SGD(0.1), executor=executor), Success)


def garbage_after_a_failed_step(good: FloatLayer, bad: FloatLayer, batching: bool) -> list[str]:
    """The objects that only the cyclic garbage collector would free after a successful step of
    ``good`` and a failed step of ``bad`` (the pattern of test_training's reference-cycle test)."""
    executor = ml.Executor(batching=batching)
    assert isinstance(good.train_blocking(ml.SGD(0.1), executor=executor), Success)

    def good_and_bad_steps() -> None:
        assert isinstance(good.train_blocking(ml.SGD(0.1), executor=executor), Success)
        assert isinstance(bad.train_blocking(ml.SGD(0.1), executor=executor), Failure)

    return cyclic_garbage(good_and_bad_steps)


@pytest.mark.parametrize("batching", [False, True])
def test_a_failed_step_in_merged_lookups_leaves_no_reference_cycles(batching: bool) -> None:
    rng = np.random.default_rng(0)
    table, w = ArrayWeight(rng.normal(size=(6, 4))), ArrayWeight(rng.normal(size=(4, 4)))
    assert garbage_after_a_failed_step(failing_step(table, w, 2), failing_step(table, w, 6), batching) == []


@pytest.mark.parametrize("batching", [False, True])
def test_a_failure_in_a_first_operand_leaves_no_reference_cycles(batching: bool) -> None:
    p, q = ArrayWeight(np.ones(3)), ArrayWeight(np.ones(4))
    good = ml.sum(p * np.ones(3)) + ml.sum(q)
    bad = ml.sum(p * np.ones(4)) + ml.sum(q)  # (3,) * (4,): the first operand of + fails
    assert garbage_after_a_failed_step(good, bad, batching) == []


@pytest.mark.parametrize("uses", [1, 2])
@pytest.mark.parametrize("replay", [False, True])
def test_zero_and_minus_zero_keep_their_signs_when_calls_merge(replay: bool, uses: int) -> None:
    # 0.0 == -0.0 in Python: keyed by value alone, the calls merged and every row got the first
    # call's zero, whose sign is wrong for half of them (forward and backward). And a merged
    # backward that summed a row's deltas from 0.0 gave 0.0 for 0.0 + -0.0 (an h used once, its
    # group's other rows 0.0) and for -0.0 + -0.0 (an h used twice).
    signs = [k % 2 == 1 for k in range(16)]
    xs = [ArrayWeight(np.full(3, 1.0 + k)) for k in range(16)]
    hs = [ml.tanh(x * 1.0) for x in xs]
    outs = [h * (-0.0 if minus else 0.0) for _ in range(uses) for h, minus in zip(hs, signs, strict=True)]
    executor = ml.Executor(batching=True, replay=replay)
    for run in range(2):  # the second run of the structure is replayed, where the executor replays
        forward = ml.concatenate(outs).predict_blocking(executor=executor).unwrap()
        assert np.array_equal(np.signbit(forward), np.tile(np.repeat(signs, 3), uses))
        # the x * 1.0 on their own (one weight each), the calls by a zero merged: one group per zero
        assert executor.last_stats.kinds["mul"] == 16 + 2
        assert executor.last_stats.replayed == int(replay and run == 1)
    for _ in range(2):
        value, gradients = ml.compute_gradients(ml.sum(ml.concatenate(outs)), executor=executor)
        assert value == 0.0
        for x, minus in zip(xs, signs, strict=True):
            assert np.all(np.signbit(gradients[x]) == minus), (minus, gradients[x])


@pytest.mark.parametrize("batching", [False, True])
def test_a_sums_delta_of_minus_zero_reaches_its_input_as_minus_zero(batching: bool) -> None:
    # The unmerged sum broadcast its float delta as zeros + delta: 0.0 + -0.0 is 0.0.
    xs = [ArrayWeight(np.full(3, 1.0 + k)) for k in range(10)]
    loss = ml.add_n([ml.sum(ml.tanh(x * 1.0)) * -0.0 for x in xs])
    executor = ml.Executor(batching=batching)
    for run in range(2):  # interpreted, then replayed
        gradients = ml.compute_gradients(loss, executor=executor)[1]
        assert executor.last_stats.replayed == run
        for x in xs:
            assert np.all(np.signbit(gradients[x])), (run, gradients[x])


# ----------------------------------------- graphs that must not merge the way their rows suggest

_EXECUTORS: dict[str, Callable[[], ml.Executor]] = {
    "merged": ml.Executor,
    "unbatched": lambda: ml.Executor(batching=False),
}


def _shared_operand_computed(
    rng: np.random.Generator,
) -> tuple[FloatLayer, list[Any], Callable[[float], float]]:
    # matmul's b and take_rows' table must be one value for all merged calls: here each call's is
    # its own row of a computed group (a weight times a matrix), so the calls must not merge.
    a, x = rng.standard_normal((16, 3, 3)), rng.standard_normal((16, 3))
    s = FloatWeight(0.5)
    terms = [ml.sum(x[i] @ (ml.lift_array(a[i]) * s)) for i in range(16)]
    terms += [ml.sum(ml.take_rows(ml.lift_array(a[i]) * s, [0, 2])) for i in range(16)]
    value = lambda v: sum(float((x[i] @ (a[i] * v)).sum() + (a[i][[0, 2]] * v).sum()) for i in range(16))
    return ml.add_n(terms), [s], value


def _stacked_weight(rng: np.random.Generator) -> tuple[FloatLayer, list[Any], Callable[[float], float]]:
    # a weight of three axes (a stack of matrices): rows stacked on a new first axis would meet its own
    x = rng.standard_normal((16, 2, 4))
    w = ArrayWeight(rng.standard_normal((16, 4, 5)))
    scale = FloatWeight(1.0)
    terms = [ml.sum(ml.tanh(x[i] @ w * scale)) for i in range(16)]
    value = lambda v: sum(float(np.tanh(x[i] @ w.data * v).sum()) for i in range(16))
    return ml.add_n(terms), [scale], value


@pytest.mark.parametrize("graph", [_shared_operand_computed, _stacked_weight])
@pytest.mark.parametrize("mode", _EXECUTORS)
def test_every_mode_computes_what_numpy_does(
    graph: Callable[[np.random.Generator], tuple[FloatLayer, list[Any], Callable[[float], float]]], mode: str
) -> None:
    loss, (weight,), value = graph(np.random.default_rng(0))
    computed, gradients = ml.compute_gradients(loss, executor=_EXECUTORS[mode]())
    assert computed == pytest.approx(value(weight.data), rel=1e-12)
    step = 1e-6  # the float weight's gradient by central differences
    numeric = (value(weight.data + step) - value(weight.data - step)) / (2 * step)
    assert gradients[weight] == pytest.approx(numeric, rel=1e-6)


@pytest.mark.parametrize("mode", _EXECUTORS)
@pytest.mark.parametrize("op", [ml.sum, ml.mean])
def test_an_out_of_range_axis_fails_in_every_mode(mode: str, op: Callable[..., ArrayLayer]) -> None:
    w = ArrayWeight(np.ones((3, 2)))
    loss = ml.add_n([ml.sum(op(w * float(i), axis=-3)) for i in range(40)])  # merged: a row axis
    result = loss.predict_blocking(executor=_EXECUTORS[mode]())
    assert isinstance(result, Failure)
    assert str(result.failure()) == f"{op.__name__}: axis -3 is out of range for shape (3, 2)"


@settings(max_examples=60, deadline=None)
@given(
    inputs=st.integers(1, 40),
    outputs=st.integers(1, 40),
    gates=st.integers(1, 5),
    dtype=st.sampled_from([np.float32, np.float64]),
    float_bias=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_a_fan_of_one_row_is_its_rows_first_row_bit_for_bit(
    inputs: int, outputs: int, gates: int, dtype: Any, float_bias: bool, seed: int
) -> None:
    """A fan of small frozen weights (a recurrent cell's gates, joined into one product) given one
    vector x computes the k blocks and x's delta of x as a row of a matrix, bit for bit: the same
    BLAS call, the bias added by the same additions; and the products of the weights one by one,
    to rounding."""
    rng = np.random.default_rng(seed)
    ws = tuple(rng.normal(size=(inputs, outputs)).astype(dtype) for _ in range(gates))
    bs: tuple[Any, ...] = tuple(
        float(rng.normal()) if float_bias else rng.normal(size=outputs).astype(dtype) for _ in range(gates)
    )
    for a in (*ws, *bs):
        if isinstance(a, np.ndarray):
            a.flags.writeable = False  # (weights' values are frozen: what the joined product needs)
    x = rng.normal(size=inputs).astype(dtype)
    d = rng.normal(size=(gates, outputs)).astype(dtype)
    fan = LINEAR.batch.fan if LINEAR.batch is not None else None
    assert fan is not None
    vjp_x = fan.vjps[0]
    one = fan.forward(NUMPY, x, ws, bs)
    rows = fan.forward(NUMPY, x[None], ws, bs)
    assert one.shape == (gates, outputs) and one.dtype == dtype
    assert one.tobytes() == rows[:, 0].tobytes()
    g, g_rows = vjp_x(NUMPY, d, None, x, ws, bs), vjp_x(NUMPY, d[:, None], None, x[None], ws, bs)
    assert g.shape == x.shape and g.dtype == dtype and g.tobytes() == g_rows[0].tobytes()
    tol = 1e-4 if dtype == np.float32 else 1e-10
    for j in range(gates):
        np.testing.assert_allclose(one[j], x @ ws[j] + bs[j], rtol=tol, atol=tol)
    np.testing.assert_allclose(g, sum(d[j] @ ws[j].T for j in range(gates)), rtol=tol, atol=tol)
