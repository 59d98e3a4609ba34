"""Recording an op: a primitive applied to operands becomes an ``Apply`` node of the program.

Nothing runs here: ``apply_primitive`` turns each operand into its forward computation (a layer's
or a weight's own, or a literal's constant tape) and makes one node of the primitive, its inputs
and its static parameters. The scheduler (``monadl.do.scheduler``) runs it, merged with the ops of
equal signature that are ready with it.

The node records where it was made: the file and line of the nearest caller outside monadl (the
user's line, through ``ops.py`` and ``monadl.nn``), so that an error found when it runs names
that line (a note on the exception: ``e.__notes__``, printed with its traceback).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from types import FrameType
from typing import Any, Final, cast

from monadl.do.do import Apply, Node, Pure, as_node
from monadl.do.primitive import Primitive
from monadl.do.tape import Tape
from monadl.dsl.base import Differentiable
from monadl.dsl.deep_learning import DeepLearning
from monadl.typeclasses.backend import NDARRAY, check_float_array, is_array


def forward_of(x: object, where: str) -> Node:
    """The forward computation of an operand: a layer's or weight's, or a literal's constant tape.

    Raises a TypeError naming ``where`` for anything that is not a float, a floating-point array,
    a weight or a layer.
    """
    if isinstance(x, Differentiable):
        return cast(Node, x.forward)
    if type(x) is NDARRAY and x.dtype.kind == "f":  # the common constant, without the general checks
        return Pure(Tape(x))
    if isinstance(x, (float, int)) and not isinstance(x, bool):
        return Pure(Tape(float(x)))
    if is_array(x):
        check_float_array(x, where)
        return Pure(Tape(x))
    if isinstance(x, DeepLearning):  # a user's own differentiable type
        return as_node(x.forward)
    raise TypeError(
        f"{where}: expected a float, a floating-point array, a weight or a layer, got {type(x).__name__}"
    )


def apply_primitive(prim: Primitive, operands: Sequence[object], params: dict[str, Any]) -> Node:
    """The forward computation of ``prim`` applied to ``operands``: one ``Apply`` node."""
    sources = []
    for x in operands:  # a loop, not a comprehension (a call of its own in Python 3.11): every op
        sources.append(forward_of(x, prim.name))
    frame = _users_frame()
    if frame is None:
        return Apply(prim, tuple(sources), params)
    # The code and the instruction, not the line: the line is looked up only if an error needs it.
    return Apply(prim, tuple(sources), params, frame.f_code, frame.f_lasti)


# The package's folder (from its __init__, which is never compiled: a compiled module's own
# ``__file__`` names its extension, elsewhere).
_LIBRARY: Final = os.path.dirname(os.path.abspath(str(sys.modules["monadl"].__file__))) + os.sep
_getframe: Final = sys._getframe
_CLIENTS: Final = _LIBRARY + "bench" + os.sep  # monadl's benchmarks use it as a user does


def _users_frame() -> FrameType | None:
    """The nearest frame of code outside monadl (compiled functions have no frames: from one, the
    first frame is its interpreted caller's). (Each frame's file name is compared, not looked up:
    a code object's hash is computed from its contents on every lookup.)"""
    frame: FrameType | None = _getframe(0)
    while frame is not None:
        name = frame.f_code.co_filename
        if not name.startswith(_LIBRARY) or name.startswith(_CLIENTS):
            return frame
        frame = frame.f_back
    return None
