"""Recording an op: a primitive applied to operands becomes a row of the recording graph.

Nothing runs here: ``apply_primitive`` finds each operand's row (a layer's own, a weight's, a new
constant's for a literal) in the calling thread's recording graph (``monadl.do.graph``) and appends
one row of the primitive, its inputs and its static parameters. The scheduler
(``monadl.do.scheduler``) runs it, merged with the ops of equal signature that are ready with it.

The row records where it was made: the code and instruction of the nearest caller outside monadl
(the user's line, through ``ops.py`` and ``monadl.nn``), so that an error found when it runs names
that line (a note on the exception: ``e.__notes__``, printed with its traceback).
"""

from __future__ import annotations

import os
import sys
from types import CodeType, FrameType
from typing import Any, Final, final

from librt.vecs import vec
from mypy_extensions import i64

from monadl.do.do import Node, Variable, as_node
from monadl.do.graph import Graph, recording
from monadl.do.primitive import Primitive
from monadl.dsl.core.base import Differentiable
from monadl.dsl.core.deep_learning import DeepLearning
from monadl.typeclasses.backend import NATIVE_MODULE, NDARRAY, check_float_array, is_array


def forward_of(x: object, where: str) -> Node:
    """The forward computation of an operand: a layer's or weight's, or a literal's constant tape.

    Raises a TypeError naming ``where`` for anything that is not a float, a floating-point array,
    a weight or a layer.
    """
    graph = recording()
    return graph.ref(row_in(graph, x, where))


def row_in(graph: Graph, x: object, where: str) -> int:
    """The row of an operand in ``graph``: a layer's own (taken from its graph if another), a
    weight's, or a new constant's for a literal. Raises a TypeError naming ``where`` for anything
    that is not a float, a floating-point array, a weight or a layer."""
    if isinstance(x, Differentiable):
        own = x.graph
        if own is graph:  # a layer of this graph: the commonest operand, first
            return x.row
        if own is not None:  # a layer of another graph
            return graph.take(own, x.row)
        # A weight: its variable read here (a slot), not through ``node()``, a method that
        # interpreted subclasses may override and so a generic call from compiled code.
        variable = x.variable
        if type(variable) is Variable:
            return graph.leaf(variable.weight)
        return graph.node(x.node())
    if type(x) is NDARRAY and x.dtype.kind == "f":  # the common constant, without the general checks
        return graph.const(x)
    if isinstance(x, (float, int)) and not isinstance(x, bool):
        return graph.const(float(x))
    if is_array(x):
        check_float_array(x, where)
        return graph.const(x)
    if isinstance(x, DeepLearning):  # a user's own differentiable type
        return graph.node(as_node(x.forward))
    raise TypeError(
        f"{where}: expected a float, a floating-point array, a weight or a layer, got {type(x).__name__}"
    )


def apply_primitive(
    prim: Primitive, operands: tuple[object, ...], params: dict[str, Any]
) -> tuple[Graph, int]:
    """``prim`` applied to ``operands``: its row in the recording graph."""
    graph = recording()
    rows = []
    for x in operands:  # a loop, not a comprehension (a call of its own in Python 3.11): every op
        rows.append(row_in(graph, x, prim.name))
    code, lasti = users_code()
    return graph, graph.op(prim, rows, params, code, lasti)


# The package's folder (from its __init__, which is never compiled: a compiled module's own
# ``__file__`` names its extension, elsewhere).
_LIBRARY: Final = os.path.dirname(os.path.abspath(str(sys.modules["monadl"].__file__))) + os.sep
_getframe: Final = sys._getframe
_CLIENTS: Final = _LIBRARY + "bench" + os.sep  # monadl's benchmarks use it as a user does
_USER_SITE: Final[Any] = None if NATIVE_MODULE is None else NATIVE_MODULE.user_site
_library_code: Final[dict[int, bool]] = {}  # id(code) -> whether it is the library's (not a user's)
_codes: Final[list[CodeType]] = []  # the code objects of ``_library_code``, kept so that ids stay theirs


def users_code() -> tuple[CodeType | None, int]:
    """The code and instruction of the nearest frame of code outside monadl (compiled functions
    have no frames: from one, the first frame is its interpreted caller's); ``(None, 0)`` if none.
    Compiled, ``monadl._native.user_site`` walks the frames (each frame's attributes read from
    here are a generic attribute look-up each); otherwise :func:`walk_to_users_code`."""
    if _USER_SITE is not None:
        found: tuple[CodeType | None, int] = _USER_SITE(_LIBRARY, _CLIENTS)
        return found
    return walk_to_users_code()


def walk_to_users_code() -> tuple[CodeType | None, int]:
    """:func:`users_code` in Python: whether a code object is the library's is worked out once per
    code object."""
    frame: FrameType | None = _getframe(0)
    entries = _known.entries
    while frame is not None:
        code = frame.f_code
        key: i64 = id(code)
        slot = (key >> 4) & (_KNOWN_SLOTS - 1)
        entry = entries[slot]
        if entry >> 1 == key:
            library = (entry & 1) == 1
        else:
            library = _is_library(code)
            entries[slot] = key * 2 + (1 if library else 0)
        if not library:
            return code, frame.f_lasti
        frame = frame.f_back
    return None, 0


def _is_library(code: CodeType) -> bool:
    """Whether ``code`` is the library's (not a user's), worked out once per code object."""
    library = _library_code.get(id(code))
    if library is None:
        name = code.co_filename
        library = _library_code[id(code)] = name.startswith(_LIBRARY) and not name.startswith(_CLIENTS)
        _codes.append(code)
    return library


@final
class _KnownCode:
    """The last code objects met, by id, each ``id * 2 + library`` in a direct-mapped table of
    native ints: this is read for every frame walked, where the dict behind it needs a boxed int
    and a hash, and most ops are recorded from a few functions."""

    def __init__(self) -> None:
        self.entries = vec[i64]([0] * _KNOWN_SLOTS)


_KNOWN_SLOTS: Final = 1024  # a power of two; objects are 16-byte aligned, so ids' low 4 bits are 0
_known: Final = _KnownCode()
