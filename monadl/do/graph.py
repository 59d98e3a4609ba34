"""The node store: a graph as rows of a few growable columns, not a Python object per node.

Every node of the differentiable program is a *row* of a :class:`Graph`, appended when the user's
code makes it (an op called, a batchable function called, a weight or a constant read by one), and
named by its index. A layer the user holds is a handle: its graph and its row. A row's inputs are
rows made before it, so the rows are in topological order as they are made, and a run walks no
objects: its scheduler reads the columns (``scheduler.py``). Freeing a graph is dropping its columns.

========  ======================================================================================
tag       a row is
========  ======================================================================================
OP        a primitive (its object) applied to its input rows, with static ``params``
CALL      a call of a batchable operation (its object: a ``do.Call``); its value is its first
          result
RESULT    result ``params`` (1 or more) of the CALL row it reads
WEIGHT    a weight (its object), read as of the run's snapshot: one row per weight per graph
CONST     a constant: its object is the data (a literal's tape's)
NODE      a node of the monad (its object: a ``Pure``, ``Delay``, ``Defer``, ``Bind`` or
          ``Kernel``), whose inputs are the rows of its sources
========  ======================================================================================

Where rows go: each thread records into its *recording graph* (:func:`recording`), made when first
needed. A run detaches the graph it runs from its thread, so what the user records next goes to a
fresh graph and a step's graph is freed with the step's layers; while it runs, the run's graph is
its thread's recording graph, so that the ops a ``flat_map`` makes join the graph they read. A layer
of another graph used by an op is *taken*: its rows (those it reads, transitively) are copied into
the recording graph once, and shared there as the layer would be.
"""

from __future__ import annotations

import threading
from _thread import get_ident
from types import CodeType
from typing import Any, Final, final

from librt.vecs import append, vec
from mypy_extensions import i64

from monadl.do.do import BIND, PURE, REF, VARIABLE, Bind, Call, Node, Operation, Pure, Ref, Variable
from monadl.do.tape import Tape

OP: Final[i64] = 0
CALL: Final[i64] = 1
RESULT: Final[i64] = 2
WEIGHT: Final[i64] = 3
CONST: Final[i64] = 4
NODE: Final[i64] = 5


@final
class Graph:
    """Rows of a program (see the module). Columns, by row: ``tags``; ``objs`` (a row's primitive,
    call, weight, constant data or monad node); ``params`` (an op's parameters, a result's index);
    its inputs ``args[starts[r]:starts[r + 1]]``; ``depths`` (ops and calls count one, leaves zero);
    where the user's code made it (``codes``, ``lastis``: a code object and an instruction).
    ``body``: the batchable operation whose body this graph records ("" for a step's graph): it
    may not take layers computed elsewhere."""

    def __init__(self, body: str = "") -> None:
        # The integer columns are vectors of machine integers (librt's ``vec``, mypyc's native
        # type): compiled, reading or writing one is a load or a store, where a list of Python
        # ints boxes every value above 256.
        self.tags = vec[i64]()
        self.objs: list[Any] = []
        self.params: list[Any] = []
        self.starts = vec[i64]([0])
        self.args = vec[i64]()
        self.depths = vec[i64]()
        self.codes: list[CodeType | None] = []
        self.lastis = vec[i64]()
        self.leaves: dict[Any, int] = {}  # weight -> its row
        self.imported: dict[Node, int] = {}  # a node of the monad (or a weight's) -> its row
        self.copies: dict[Graph, dict[int, int]] = {}  # another graph -> its rows' rows here
        self.statics: dict[int, Any] = {}  # a row's static shape and dtype, once asked for
        # A batchable operation -> its last call's Call, shared by the calls after it of the same
        # static arguments (``dsl/extend/operation.py``): a tree's cells make one, not one each.
        self.calls: dict[Operation, Call] = {}
        self.body = body
        self.dynamic = False  # a NODE row was recorded: a run may append rows (``flat_map``)
        self.lock = threading.RLock()  # held by a run that may append rows (a nested run too)

    def __len__(self) -> int:
        return len(self.tags)

    def add(self, tag: i64, obj: Any, params: Any, args: list[int], code: CodeType | None, lasti: i64) -> i64:
        """Appends a row, after its inputs ``args``; returns its index."""
        row: i64 = len(self.tags)
        depths = self.depths
        depth: i64 = 0
        inputs = self.args
        for a in args:
            d = depths[a]
            if d > depth:
                depth = d
            inputs = append(inputs, a)
        if tag != RESULT:
            depth += 1
        self.args = inputs
        self.tags = append(self.tags, tag)
        self.objs.append(obj)
        self.params.append(params)
        self.starts = append(self.starts, len(inputs))
        self.depths = append(depths, depth)
        self.codes.append(code)
        self.lastis = append(self.lastis, lasti)
        return row

    def op(self, prim: Any, args: list[int], params: Any, code: CodeType | None, lasti: i64) -> i64:
        """An op's row."""
        return self.add(OP, prim, params, args, code, lasti)

    def leaf(self, weight: Any) -> int:
        """The row of ``weight`` (one per graph)."""
        row = self.leaves.get(weight)
        if row is None:
            row = self.leaves[weight] = self._leaf_row(WEIGHT, weight)
        return row

    def const(self, data: Any) -> int:
        """A new constant's row."""
        return self._leaf_row(CONST, data)

    def _leaf_row(self, tag: i64, obj: Any) -> i64:
        row: i64 = len(self.tags)
        self.tags = append(self.tags, tag)
        self.objs.append(obj)
        self.params.append(None)
        self.starts = append(self.starts, len(self.args))
        self.depths = append(self.depths, 0)
        self.codes.append(None)
        self.lastis = append(self.lastis, 0)
        return row

    def postorder(self, root: i64, static: bool = False) -> list[int] | None:
        """The rows ``root`` reads (itself included), each after its inputs, in the order a walk
        from ``root`` over the inputs in their order meets them: the same for two graphs of one
        structure, however their rows are numbered. Iterative (a graph 100,000 rows deep).
        ``static``: None as soon as a row is not an op, a weight or a constant."""
        seen = vec[bool]([False] * (root + 1))
        order: list[int] = []
        starts, args = self.starts, self.args
        stack = [root]  # a row, or -1 - row: its inputs are walked, it comes next
        while stack:
            r = stack.pop()
            if r < 0:
                order.append(-1 - r)
                continue
            if seen[r]:
                continue
            if static:
                tag = self.tags[r]
                if tag != OP and tag != WEIGHT and tag != CONST:
                    return None
            seen[r] = True
            stack.append(-1 - r)
            for k in range(starts[r + 1] - 1, starts[r] - 1, -1):  # the first input walked first
                a = args[k]
                if not seen[a]:
                    stack.append(a)
        return order

    def ref(self, row: int) -> Ref:
        """The ``Do`` of row ``row``."""
        return Ref(self, row)

    def inputs(self, row: i64) -> list[int]:
        """The input rows of ``row``."""
        args = self.args
        return [args[k] for k in range(self.starts[row], self.starts[row + 1])]

    # ------------------------------------------------------------------------------- imports

    def node(self, root: Node) -> int:
        """The row of a ``Do`` (a layer's or a weight's forward, or the monad's nodes over them):
        its nodes not imported yet become rows, once each (walked iteratively)."""
        imported = self.imported
        row = imported.get(root)
        if row is not None:
            return row
        tag = root.tag
        if tag == REF:
            assert type(root) is Ref
            return root.row if root.graph is self else self.take(root.graph, root.row)
        if tag == VARIABLE:
            assert type(root) is Variable
            return self.leaf(root.weight)
        stack: list[Node] = [root]
        while stack:
            node = stack[-1]
            if node in imported:
                stack.pop()
                continue
            waiting = False
            for source in node.sources:
                if source not in imported and source.tag != REF and source.tag != VARIABLE:
                    stack.append(source)
                    waiting = True
            if waiting:
                continue
            stack.pop()
            imported[node] = self._import(node)
        return imported[root]

    def _import(self, node: Node) -> int:
        """The row of ``node``, whose sources have rows."""
        tag = node.tag
        if tag == PURE:
            assert type(node) is Pure
            value = node.value
            if type(value) is Tape:  # a literal: a constant
                return self.const(value.data)
        elif tag == REF:
            assert type(node) is Ref
            return node.row if node.graph is self else self.take(node.graph, node.row)
        elif tag == VARIABLE:
            assert type(node) is Variable
            return self.leaf(node.weight)
        args: list[int] = []
        if tag == BIND:
            assert type(node) is Bind
            for source in node.sources:
                args.append(self.node(source))
        self.dynamic = True
        return self.add(NODE, node, None, args, None, 0)

    def take(self, other: Graph, root: int) -> int:
        """The row here of row ``root`` of ``other``: its rows and those they read, copied (once
        per row of ``other``; weights map to this graph's)."""
        mapping = self.copies.get(other)
        if mapping is None:
            mapping = self.copies[other] = {}
        found = mapping.get(root)
        if found is not None:
            return found
        # The rows ``root`` reads that have no copy yet, in their order (inputs first).
        needed: list[int] = []
        seen: set[int] = set()
        stack = [root]
        tags, starts, args = other.tags, other.starts, other.args
        while stack:
            r = stack.pop()
            if r in seen or r in mapping:
                continue
            seen.add(r)
            needed.append(r)
            for k in range(starts[r], starts[r + 1]):
                stack.append(args[k])
        needed.sort()
        for r in needed:
            tag = tags[r]
            if self.body and (tag == OP or tag == CALL or tag == RESULT or tag == NODE):
                raise RuntimeError(
                    f"batchable {self.body}: its body reads a layer computed outside it: pass "
                    "that layer to it as an argument"
                )
            obj = other.objs[r]
            if tag == WEIGHT:
                mapping[r] = self.leaf(obj)
                continue
            if tag == CONST:
                mapping[r] = self.const(obj)
                continue
            ins = [mapping[args[k]] for k in range(starts[r], starts[r + 1])]
            mapping[r] = self.add(tag, obj, other.params[r], ins, other.codes[r], other.lastis[r])
            if tag == NODE:
                self.dynamic = True
                self.imported.setdefault(obj, mapping[r])
        return mapping[root]

    def made_at(self, row: int) -> str | None:
        """``file:line`` of the user's code that made row ``row`` (None if unknown)."""
        code = self.codes[row]
        if code is None:
            return None
        lasti = self.lastis[row]
        for start, end, line in code.co_lines():
            if start <= lasti < end and line is not None:
                return f"{code.co_filename}:{line}"
        return code.co_filename


_recording: Final = threading.local()
"""Each thread's recording graph (``graph``, unset until it records) and how many schedulers it
runs (``depth``)."""


@final
class _LastRecording:
    """The last thread to ask for its recording graph, and that graph: most programs record on one
    thread, and a thread-local variable's lookup costs more than the op it records. One tuple, read
    and replaced whole (atomic under the GIL): never one thread's identity with another's graph. (An
    object's attribute, not a module's global: compiled code reads it without a dict lookup.)"""

    def __init__(self) -> None:
        self.pair: tuple[int, Graph | None] = (-1, None)


_last: Final = _LastRecording()
_get_ident: Final = get_ident


def recording() -> Graph:
    """The graph the calling thread records into (see the module)."""
    thread = _get_ident()
    last = _last.pair
    if last[0] == thread:
        graph = last[1]
        if graph is not None:
            return graph
    found: Graph | None = getattr(_recording, "graph", None)
    if found is None:
        found = Graph()
        _recording.graph = found
    _last.pair = (thread, found)
    return found


def swap_recording(graph: Graph | None) -> Graph | None:
    """Makes ``graph`` the calling thread's recording graph (None: a fresh one when next needed);
    returns the one it replaces."""
    previous: Graph | None = getattr(_recording, "graph", None)
    _recording.graph = graph
    _last.pair = (_get_ident(), graph)
    return previous


def running() -> bool:
    """Whether the calling thread is running a scheduler (a run inside a run's user code)."""
    depth: int = getattr(_recording, "depth", 0)
    return depth > 0


def enter_run(graph: Graph) -> Graph | None:
    """A scheduler starts on the calling thread: ``graph`` is its recording graph until
    :func:`leave_run` restores the one returned."""
    _recording.depth = getattr(_recording, "depth", 0) + 1
    return swap_recording(graph)


def leave_run(previous: Graph | None) -> None:
    _recording.depth = getattr(_recording, "depth", 1) - 1
    swap_recording(previous)


def ref(graph: Graph, row: int) -> Ref:
    """A ``Do`` naming ``row`` of ``graph``."""
    return Ref(graph, row)


def row_of(node: Node) -> tuple[Graph, int]:
    """The graph and row of a ``Do``: its own where it names a row, else the recording graph's
    import of it."""
    if type(node) is Ref:
        return node.graph, node.row
    graph = recording()
    return graph, graph.node(node)
