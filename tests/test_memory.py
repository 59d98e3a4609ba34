"""Large blocks kept between steps (``monadl/_memory.c``, ``monadl.runtime.memory``): inside
``large_blocks_kept`` NumPy's arrays of 32 MiB or more reuse blocks freed before. Arrays never share
memory, zeroed arrays read zero, the limits hold, the handler in place before is put back, and a
training step runs with it. Built with the compiled engine only (the pure form: a no-op)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy._core.multiarray import get_handler_name

import monadl as ml
from monadl._compiled import compiled
from monadl.runtime import memory
from monadl.runtime.memory import large_blocks_kept, release_kept_blocks

MiB = 1 << 20
compiled_only = pytest.mark.skipif(not compiled(), reason="the handler is built with the compiled engine")


def _kept() -> list[int]:
    return sorted(memory._MEMORY.kept_blocks())


def _size_class(n: int) -> int:
    power = 1 << (n.bit_length() - 1)
    step = power // 8
    return -(-n // step) * step


@pytest.fixture(autouse=True)
def _nothing_kept() -> Iterator[None]:
    release_kept_blocks()
    yield
    release_kept_blocks()


def test_release_gives_back_the_bytes_kept_and_the_pure_form_keeps_none() -> None:
    with large_blocks_kept():
        a = np.ones(4 * MiB)  # 32 MiB
    del a
    assert release_kept_blocks() == (0 if not compiled() else 32 * MiB)


@compiled_only
def test_a_freed_large_block_is_kept_and_handed_out_again_for_its_size_class() -> None:
    outside = np.empty(MiB)
    with large_blocks_kept():
        inside = np.empty(MiB)
        assert get_handler_name(inside) == "monadl_large_blocks"
        a = np.full(5 * MiB, 7.0)  # 40 MiB: its own size class
        address = a.ctypes.data
        del a
        assert _kept() == [40 * MiB]
        b = np.zeros(5 * MiB - 1000)  # another size of the class, zeroed: from the kept block
        assert b.ctypes.data == address and not b.any()
        assert _kept() == []
        smaller = np.ones(4 * MiB - 1)  # (below 32 MiB: NumPy's own)
        del smaller
        assert _kept() == []
    assert get_handler_name(outside) == get_handler_name(np.empty(3)) == "default_allocator"
    del b
    assert _kept() == [40 * MiB]  # freed by the handler that allocated it, outside the block too
    assert release_kept_blocks() == 40 * MiB and _kept() == []


@compiled_only
@settings(max_examples=15, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(4 * MiB, 7 * MiB), st.integers(0, 3)), max_size=12))
def test_live_arrays_never_share_memory_and_zeroed_ones_read_zero(steps: list[tuple[bool, int, int]]) -> None:
    """A random sequence of large arrays made (empty, zeros, ones, full) and freed: every live
    array keeps its own fill, and at most 8 blocks of 256 MiB together stay kept."""
    release_kept_blocks()
    live: dict[int, tuple[np.ndarray, float]] = {}
    with large_blocks_kept():
        for i, (make, n, how) in enumerate(steps):
            if make or not live:
                fill = float(i + 1)
                if how == 0:
                    a = np.zeros(n)
                    assert not a.any()
                    a += fill
                elif how == 1:
                    a = np.empty(n)
                    a.fill(fill)
                elif how == 2:
                    a = np.ones(n) * fill  # (a temporary of the same size, freed at once)
                else:
                    a = np.full(n, fill)
                live[i] = (a, fill)
            else:
                live.pop(next(iter(live)))
            kept = _kept()
            assert len(kept) <= 8 and sum(kept) <= 256 * MiB
        for a, fill in live.values():
            assert np.all(a == fill)


@compiled_only
def test_the_limits_of_what_is_kept() -> None:
    with large_blocks_kept():
        arrays = [np.empty(4 * MiB) for _ in range(9)]  # (not written: no page is touched)
        del arrays
        assert _kept() == [32 * MiB] * 8  # (the ninth went back to NumPy's handler)
        release_kept_blocks()
        big = [np.empty(96 * MiB, dtype=np.uint8) for _ in range(3)]
        del big
        assert _kept() == [96 * MiB] * 2  # (a third would pass 256 MiB)


@compiled_only
def test_a_resized_array_is_kept_by_the_size_class_it_has_now() -> None:
    with large_blocks_kept():
        a = np.full(4 * MiB, 3.0)
        np.ndarray.resize(a, (9 * MiB + 5,), refcheck=False)
        assert np.all(a[: 4 * MiB] == 3.0) and not a[4 * MiB :].any()
        a[:] = 5.0
        del a
        assert _kept() == [_size_class(72 * MiB + 40)]
        b = np.full(9 * MiB + 5, 6.0)  # the resized block, whole: it is that size class
        assert np.all(b == 6.0) and _kept() == []


@compiled_only
def test_threads_each_in_their_own_block_never_share_memory() -> None:
    errors: list[BaseException] = []

    def work(k: int) -> None:
        try:
            with large_blocks_kept():
                for step in range(8):
                    fill = float(100 * k + step)
                    arrays = [np.full((4 + (step + j) % 3) * MiB, fill + j) for j in range(2)]
                    for j, a in enumerate(arrays):
                        assert np.all(a == fill + j)
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


@compiled_only
def test_a_training_step_keeps_its_large_blocks_for_the_next() -> None:
    """A step whose logits are 32 MiB: after it, their blocks are kept; the next step takes them,
    and the losses equal those of the same steps where nothing was kept."""

    def losses(keep: bool) -> list[float]:
        rng = np.random.default_rng(0)
        x = rng.standard_normal((2048, 16)).astype(np.float32)
        w = ml.ArrayWeight(rng.standard_normal((16, 4096)).astype(np.float32) * 0.1)
        labels = rng.integers(0, 4096, 2048)
        out = []
        for _ in range(3):
            if not keep:
                release_kept_blocks()
            loss = ml.cross_entropy(ml.matmul(x, w), labels)
            out.append(loss.train_blocking(ml.SGD(0.1)).unwrap())
            if keep:
                assert _kept(), "the step's large blocks were not kept"
        return out

    assert losses(True) == losses(False)


def test_the_environment_switch_leaves_numpys_allocation_alone() -> None:
    """``MONADL_KEEP_LARGE_BLOCKS=0``, read at import: no handler, nothing kept (a process of its
    own, as the switch is read once)."""
    code = (
        "import numpy as np\n"
        "from numpy._core.multiarray import get_handler_name\n"
        "from monadl.runtime import memory\n"
        "assert memory._MEMORY is None\n"
        "with memory.large_blocks_kept():\n"
        "    a = np.ones(5 * 2**20)\n"
        "    assert get_handler_name(a) == 'default_allocator', get_handler_name(a)\n"
        "del a\n"
        "assert memory.release_kept_blocks() == 0\n"
    )
    env = {**os.environ, "MONADL_KEEP_LARGE_BLOCKS": "0"}
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=120)


@compiled_only
def test_the_smallest_kept_block_that_fits_is_handed_out_and_larger_ones_take_the_place_of_smaller() -> None:
    """Batches vary in size: a block serves any array of up to its size and at least half of it,
    the smallest such first; freed into a full cache, a larger block gives smaller ones back."""
    with large_blocks_kept():
        sizes = [48, 40, 64]  # MiB
        arrays = [np.empty(n * MiB, dtype=np.uint8) for n in sizes]
        addresses = {n: a.ctypes.data for n, a in zip(sizes, arrays, strict=True)}
        del arrays
        assert _kept() == [40 * MiB, 48 * MiB, 64 * MiB]
        a = np.full(36 * MiB // 8, 1.0)  # 36 MiB: the 40 MiB block
        assert a.ctypes.data == addresses[40] and _kept() == [48 * MiB, 64 * MiB]
        b = np.full(33 * MiB // 8, 2.0)  # the 48 MiB block (64 is too large: more than twice)
        assert b.ctypes.data == addresses[48] and _kept() == [64 * MiB]
        del a, b  # back with their real sizes
        assert _kept() == [40 * MiB, 48 * MiB, 64 * MiB]
        more = [np.empty(n * MiB, dtype=np.uint8) for n in (64, 56)]  # (fresh: none kept fits them all)
        del more
        # 256 MiB at most: the 56 and the second 64 took the 40's and the 48's places
        assert _kept() == [56 * MiB, 64 * MiB, 64 * MiB] or sum(_kept()) <= 256 * MiB
