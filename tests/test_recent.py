"""The bounded map of an executor's programs (``monadl.runtime.recent.Recent``): it keeps the
``size`` most recently used entries, as an ordered map that moves each entry used to its end would."""

from __future__ import annotations

from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor

from hypothesis import example, given, settings
from hypothesis import strategies as st

from monadl.runtime.recent import Recent

_OPS = st.lists(st.tuples(st.booleans(), st.integers(0, 4), st.integers(1, 99)), max_size=40)


class _Reference:
    """The least recently used policy as written: an ordered map, each use moved to its end."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.items: OrderedDict[int, int] = OrderedDict()

    def get(self, key: int) -> int | None:
        value = self.items.get(key)
        if value is not None:
            self.items.move_to_end(key)
        return value

    def put(self, key: int, value: int) -> None:
        self.items[key] = value
        self.items.move_to_end(key)
        while len(self.items) > self.size:
            self.items.popitem(last=False)


@settings(max_examples=300)
@given(st.integers(0, 4), _OPS)
@example(2, [(True, 1, 1), (True, 2, 2), (False, 1, 0), (True, 3, 3)])  # the use of 1 keeps it
def test_recent_keeps_what_a_least_recently_used_map_keeps(
    size: int, ops: list[tuple[bool, int, int]]
) -> None:
    recent, reference = Recent(size), _Reference(size)
    for is_put, key, value in ops:
        if is_put:
            recent.put(key, value)
            reference.put(key, value)
        else:
            assert recent.get(key) == reference.get(key)
        assert {k: v for k, (v, _) in recent.items.items()} == dict(reference.items)


def test_recent_stays_bounded_and_consistent_under_threads() -> None:
    recent = Recent(8)

    def work(seed: int) -> None:
        for i in range(2000):
            key = (seed * 7 + i) % 13
            got = recent.get(key)
            assert got is None or got == key * 10
            recent.put(key, key * 10)

    with ThreadPoolExecutor(4) as pool:
        for done in [pool.submit(work, k) for k in range(4)]:
            done.result()  # (a thread's failed assertion raises here)
    assert len(recent.items) == 8
