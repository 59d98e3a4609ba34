"""Where the user's code made an op: the nearest frame of code outside monadl.

Interpreted, not compiled: reading a frame's attributes is an attribute lookup from compiled code,
several times dearer than the interpreter's specialised one, and this runs for every op recorded.
"""

from __future__ import annotations

import os
import sys
from types import CodeType, FrameType
from typing import Final

# The package's folder (from its __init__, which is never compiled: a compiled module's own
# ``__file__`` names its extension, elsewhere).
_LIBRARY: Final = os.path.dirname(os.path.abspath(str(sys.modules["monadl"].__file__))) + os.sep
_CLIENTS: Final = _LIBRARY + "bench" + os.sep  # monadl's benchmarks use it as a user does
_getframe: Final = sys._getframe
_library: dict[int, bool] = {}  # id(code) -> whether the code is the library's (not a user's)
_kept: list[CodeType] = []  # those code objects, kept so that their ids stay theirs


def users_code() -> tuple[CodeType | None, int]:
    """The code and instruction of the nearest frame of code outside monadl (compiled functions
    have no frames: from one, the first frame is its interpreted caller's); ``(None, 0)`` if none.
    Whether a code object is the library's is worked out once per code object (kept: a program's
    code objects are few)."""
    frame: FrameType | None = _getframe(1)
    known = _library
    while frame is not None:
        code = frame.f_code
        library = known.get(id(code))  # (by identity: a code object hashes its contents)
        if library is None:
            name = code.co_filename
            library = known[id(code)] = name.startswith(_LIBRARY) and not name.startswith(_CLIENTS)
            _kept.append(code)
        if not library:
            return code, frame.f_lasti
        frame = frame.f_back
    return None, 0
