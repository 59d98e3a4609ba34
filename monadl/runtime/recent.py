"""A bounded map that drops the least recently used entry, safe across threads."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable
from typing import Any


class Recent:
    """A bounded map, the least recently used entry dropped, safe across threads: an executor's
    compiled programs, the roots it ran lately, and its batchable bodies' programs."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.items: OrderedDict[Any, Any] = OrderedDict()
        self.lock = threading.Lock()

    def get(self, key: Hashable) -> Any:
        """The value of ``key`` (None if it has none), now the most recently used."""
        with self.lock:
            value = self.items.get(key)
            if value is not None:
                self.items.move_to_end(key)
            return value

    def put(self, key: Hashable, value: Any) -> None:
        with self.lock:
            self.items[key] = value
            self.items.move_to_end(key)
            while len(self.items) > self.size:
                self.items.popitem(last=False)
