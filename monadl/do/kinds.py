"""Value kinds, interned: a batching signature (``batching.py``) holds small ints rather than
(type, shape, dtype) tuples.

The table is bounded (a program whose input shapes keep changing would grow it without end): the
oldest kinds are dropped first, and ids are never reused, so a cached program or body whose key
holds a dropped kind's id is only missed, never matched by another kind. A kind's id carries its
rank in its low bits, so that the rank needs no table.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable
from typing import Any, Final

MAX_KINDS: Final = 4096
RANK_BITS: Final = 8  # NumPy arrays have at most 64 axes
_kinds: Final[dict[Hashable, int]] = {}  # key -> id, the oldest first
_keys: Final[dict[int, Any]] = {}  # id -> key
_rows: Final[dict[int, int]] = {}  # id -> its rows' kind, once asked for
_kinds_lock: Final = threading.Lock()
_serial = 0


def kind_id(key: Hashable, rank: int) -> int:
    """A small int standing for a value kind (``value_key``), the same while the kind is in use."""
    global _serial
    k = _kinds.get(key)
    if k is None:
        with _kinds_lock:
            k = _kinds.get(key)
            if k is None:
                if len(_kinds) >= MAX_KINDS:
                    oldest = _kinds.pop(next(iter(_kinds)))
                    del _keys[oldest]
                    _rows.pop(oldest, None)
                _serial += 1
                k = (_serial << RANK_BITS) | rank
                _kinds[key] = k
                _keys[k] = key
    return k


def row_kind(k: int) -> int:
    """The kind of a row of stacked values of kind ``k``; -1 if ``k`` was dropped from the table
    (then the caller makes it from the value)."""
    r = _rows.get(k)
    if r is None:
        key = _keys.get(k)
        if key is None:
            return -1
        kind, shape, dtype = key
        r = _rows[k] = kind_id((kind, shape[1:], dtype), len(shape) - 1)
    return r


def kind_rank(k: int) -> int:
    """The rank of the values of kind ``k`` (0 for floats)."""
    return k & ((1 << RANK_BITS) - 1)


def interned_kinds() -> int:
    """How many value kinds the table holds now (at most ``MAX_KINDS``)."""
    return len(_kinds)
