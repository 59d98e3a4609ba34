"""A bounded map that drops the least recently used entry, safe across threads."""

from __future__ import annotations

import threading
from collections.abc import Hashable
from typing import Any


class Recent:
    """A bounded map, the least recently used entry dropped, safe across threads: an executor's
    compiled programs, the roots it ran lately, and its batchable bodies' programs.

    Each entry holds when it was last used (a count of uses); a look-up stamps its entry and moves
    nothing, where an ordered map would hash its key again to move it (a body's program is looked
    up for every group of a batchable operation's calls, and a call alone is a group). The least
    recently used entry is found by a pass over the entries when a put makes them one too many
    (an executor's maps hold 8 to 256 entries)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.items: dict[Any, list[Any]] = {}  # key -> [value, its last use]
        self.uses = 0
        self.lock = threading.Lock()

    def get(self, key: Hashable) -> Any:
        """The value of ``key`` (None if it has none), now the most recently used."""
        with self.lock:
            entry = self.items.get(key)
            if entry is None:
                return None
            self.uses += 1
            entry[1] = self.uses
            return entry[0]

    def put(self, key: Hashable, value: Any) -> None:
        """Sets ``key`` to ``value``, the most recently used; the least recently used entry is
        dropped while there are more than ``size``."""
        with self.lock:
            self.uses += 1
            items = self.items
            items[key] = [value, self.uses]
            while len(items) > self.size:
                oldest: Any = None
                least = self.uses + 1
                for k, entry in items.items():
                    if entry[1] < least:
                        oldest, least = k, entry[1]
                del items[oldest]
