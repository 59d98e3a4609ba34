"""``monadl.data.DataLoader``: batches of arrays or of examples, a seeded order that is new each epoch
and the same in every run, the last short batch kept or dropped, collation (ragged sequences as
lists, as the sequence layers take them), and a prefetching thread that passes on the errors of
collate and never outlives its consumer."""

from __future__ import annotations

import gc
import threading
import time
import traceback
from collections.abc import Iterator
from typing import Any, NamedTuple

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import monadl as ml
from monadl import nn
from monadl.data import DataLoader, default_collate

THREAD = "monadl DataLoader prefetch"


def prefetch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == THREAD]


@pytest.fixture(autouse=True)
def no_thread_left() -> Iterator[None]:
    """Every test ends with no prefetching thread alive (each it started was joined)."""
    yield
    if prefetch_threads():  # (an iterator in a reference cycle is closed by the collector)
        gc.collect()
    assert prefetch_threads() == []


def data(n: int = 10) -> tuple[np.ndarray, np.ndarray]:
    return np.arange(2 * n, dtype=np.float32).reshape(n, 2), np.arange(n) * 10


# ------------------------------------------------------------------------------------------- batches


def test_batches_of_arrays_in_order_with_the_last_short_one() -> None:
    x, y = data(10)
    loader = DataLoader((x, y), batch_size=4)
    assert len(loader) == 3 and loader.examples == 10
    batches = list(loader)
    assert [len(b[0]) for b in batches] == [4, 4, 2]
    for k, (xb, yb) in enumerate(batches):
        np.testing.assert_array_equal(xb, x[4 * k : 4 * k + 4])
        np.testing.assert_array_equal(yb, y[4 * k : 4 * k + 4])
    dropped = DataLoader((x, y), batch_size=4, drop_last=True)
    assert len(dropped) == 2 and [len(b[0]) for b in dropped] == [4, 4]


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(0, 40),
    batch_size=st.integers(1, 12),
    drop_last=st.booleans(),
    shuffle=st.booleans(),
    seed=st.integers(0, 2**32),
)
def test_an_epoch_is_its_order_cut_into_batches(
    n: int, batch_size: int, drop_last: bool, shuffle: bool, seed: int
) -> None:
    x = np.arange(n)
    loader = DataLoader(x, batch_size, shuffle=shuffle, seed=seed, drop_last=drop_last)
    batches = list(loader.epoch(3))
    assert len(batches) == len(loader) == (n // batch_size if drop_last else -(-n // batch_size))
    assert all(len(b) == batch_size for b in batches[:-1])
    if drop_last and batches:
        assert len(batches[-1]) == batch_size
    order = loader.order(3)
    assert sorted(order.tolist()) == list(range(n))
    flat = np.concatenate(batches) if batches else np.array([], dtype=np.int64)
    np.testing.assert_array_equal(flat, order[: len(flat)])


def test_a_seed_gives_a_new_order_each_epoch_the_same_in_every_run() -> None:
    x, y = data(50)
    loader = DataLoader((x, y), batch_size=8, shuffle=True, seed=7)
    first, second = [np.concatenate([b[1] for b in loader]) for _ in range(2)]
    assert loader.next_epoch == 2
    assert not np.array_equal(first, second)  # a new order each epoch
    assert sorted(first.tolist()) == sorted(second.tolist()) == sorted(y.tolist())
    np.testing.assert_array_equal(first, y[np.random.default_rng([7, 0]).permutation(50)])
    again = DataLoader((x, y), batch_size=8, shuffle=True, seed=7)
    again.next_epoch = 1  # a run resumed at epoch 1 takes its batches, whatever came before
    np.testing.assert_array_equal(np.concatenate([b[1] for b in again]), second)
    np.testing.assert_array_equal(np.concatenate([b[1] for b in again.epoch(0)]), first)
    other = DataLoader((x, y), batch_size=8, shuffle=True, seed=8)
    assert not np.array_equal(np.concatenate([b[1] for b in other]), first)


def test_a_generator_as_seed_gives_its_permutations_in_turn() -> None:
    x = np.arange(20)
    loader = DataLoader(x, 6, shuffle=True, seed=np.random.default_rng(3))
    reference = np.random.default_rng(3)
    for _ in range(3):
        np.testing.assert_array_equal(np.concatenate(list(loader)), reference.permutation(20))


def test_epochs_gives_numbered_epochs_and_closes_the_one_left_unfinished() -> None:
    loader = DataLoader(np.arange(12), 4, shuffle=True, seed=1, prefetch=1)
    seen = []
    for number, batches in loader.epochs(3):
        first = next(batches)  # the rest of the epoch is left: closed when the next one begins
        seen.append(number)
        np.testing.assert_array_equal(first, loader.order(number)[:4])
        assert len(prefetch_threads()) == 1
    assert seen == [0, 1, 2] and loader.next_epoch == 3
    assert [n for n, _ in loader.epochs(2)] == [3, 4]


def test_collate_over_arrays_takes_the_tuple_of_the_rows() -> None:
    x, y = data(6)
    loader = DataLoader((x, y), 4, collate=lambda b: (b[0] * 2.0, b[1].tolist()))
    xb, yb = next(iter(loader))
    np.testing.assert_array_equal(xb, x[:4] * 2.0)
    assert yb == [0, 10, 20, 30]


def test_a_named_tuple_of_arrays_gives_batches_of_its_type() -> None:
    class Pair(NamedTuple):
        images: np.ndarray
        labels: np.ndarray

    x, y = data(5)
    batch = next(iter(DataLoader(Pair(x, y), 2, shuffle=True)))
    assert isinstance(batch, Pair) and batch.images.shape == (2, 2)


def test_examples_are_stacked_and_ragged_sequences_kept_as_lists() -> None:
    same = [np.full((3, 2), k, dtype=np.float32) for k in range(5)]
    stacked = next(iter(DataLoader(same, 4)))
    assert isinstance(stacked, np.ndarray) and stacked.shape == (4, 3, 2) and stacked.dtype == np.float32
    ragged = [np.ones((k + 1, 2)) for k in range(5)]
    batch = next(iter(DataLoader(ragged, 3)))
    assert isinstance(batch, list) and [len(s) for s in batch] == [1, 2, 3]


def test_over_a_list_a_ragged_field_is_a_list_in_every_batch() -> None:
    """A batch of sequences that happen to be equally long (or of one sequence) is a list too, as in
    the other batches: the field is ragged somewhere in the list."""
    examples = [(np.ones((n, 2)), np.ones(3), k) for k, n in enumerate([2, 2, 3, 3, 1])]
    batches = list(DataLoader(examples, 2))
    assert [type(b[0]) for b in batches] == [list, list, list]
    assert all(isinstance(b[1], np.ndarray) and b[1].shape == (len(b[0]), 3) for b in batches)
    np.testing.assert_array_equal(batches[2][2], [4])
    assert isinstance(default_collate(examples[:2])[0], np.ndarray)  # a batch alone cannot know


def test_default_collate_goes_through_tuples_and_dicts() -> None:
    class Example(NamedTuple):
        tokens: np.ndarray
        label: int

    examples = [Example(np.arange(k + 1), k % 2) for k in range(3)]
    batch = default_collate(examples)
    assert isinstance(batch, Example)
    assert [len(t) for t in batch.tokens] == [1, 2, 3]
    np.testing.assert_array_equal(batch.label, [0, 1, 0])
    dicts = default_collate([{"x": np.zeros(2), "name": "a"}, {"x": np.ones(2), "name": "b"}])
    np.testing.assert_array_equal(dicts["x"], [[0, 0], [1, 1]])
    assert dicts["name"] == ["a", "b"]
    assert default_collate([1.5, 2.5]).tolist() == [1.5, 2.5]
    assert default_collate([]) == []
    trees = [object(), object()]
    assert default_collate(trees) == trees


def test_ragged_sequences_batched_run_the_lstm() -> None:
    """Sequences of different lengths and their labels: each batch is the list of sequences the
    LSTM takes and an array of labels, trained on."""
    rng = np.random.default_rng(0)
    examples = [(rng.normal(size=(int(rng.integers(1, 6)), 3)), int(rng.integers(2))) for _ in range(9)]
    lstm, head = nn.LSTM.new(3, 4, seed=0), nn.Linear.new(4, 2, seed=1)
    loader = DataLoader(examples, 4, shuffle=True, seed=2)
    for sequences, labels in loader:
        out = lstm(sequences)
        last = ml.stack([steps[-1] for steps in out.outputs])
        loss = ml.cross_entropy(head(last), labels)
        assert np.isfinite(ml.train_blocking(loss, ml.Adam(0.01)).unwrap())
    assert [len(s) for s, _ in DataLoader(examples, 4)] == [4, 4, 1]


def test_any_object_with_a_length_and_indexing_is_a_data_set() -> None:
    class Squares:
        def __len__(self) -> int:
            return 7

        def __getitem__(self, index: int) -> int:
            if not 0 <= index < 7:
                raise IndexError(index)
            return index * index

    assert [b.tolist() for b in DataLoader(Squares(), 3)] == [[0, 1, 4], [9, 16, 25], [36]]


def test_arrays_of_another_namespace_are_gathered_there() -> None:
    xp = pytest.importorskip("array_api_strict")
    x = xp.asarray(np.arange(12.0).reshape(6, 2))
    batch = next(iter(DataLoader(x, 4, shuffle=True, seed=0)))
    order = np.random.default_rng([0, 0]).permutation(6)[:4]
    np.testing.assert_array_equal(np.asarray(batch), np.arange(12.0).reshape(6, 2)[order])
    stacked = default_collate([xp.ones(2), xp.zeros(2)])
    assert type(stacked) is type(x) and stacked.shape == (2, 2)


@pytest.mark.parametrize(
    ("arguments", "error", "message"),
    [
        ({"data": (np.zeros(3), np.zeros(4))}, ValueError, r"equally long, got lengths \[3, 4\]"),
        (
            {"data": (np.zeros(3), [1, 2, 3])},
            TypeError,
            "a tuple's items must be arrays of rows.*item 1 is a list",
        ),
        ({"data": (np.zeros(()),)}, TypeError, "item 0 is a 0-d array"),
        ({"data": "text"}, TypeError, "data must be a tuple of equally long arrays.*got a str"),
        ({"data": {"a": 1}}, TypeError, "got a dict"),
        ({"data": np.zeros(3), "batch_size": 0}, ValueError, "batch_size must be positive, got 0"),
        ({"data": np.zeros(3), "batch_size": True}, TypeError, "batch_size must be an int, got True"),
        ({"data": np.zeros(3), "prefetch": -1}, ValueError, "prefetch must be 0"),
        ({"data": np.zeros(3), "seed": 1.5}, TypeError, "seed must be an int or a numpy.random.Generator"),
        ({"data": np.zeros(3), "collate": 3}, TypeError, "collate must be callable"),
    ],
)
def test_bad_arguments_are_errors_naming_them(arguments: dict[str, Any], error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        DataLoader(**arguments)


def test_a_bad_epoch_number_is_an_error() -> None:
    loader = DataLoader(np.zeros(3))
    with pytest.raises(ValueError, match="an epoch's number is an int from 0, got -1"):
        loader.epoch(-1)
    with pytest.raises(ValueError, match="count must be an int from 0"):
        next(loader.epochs(-2))


# ------------------------------------------------------------------------------------------- prefetch


@pytest.mark.parametrize("prefetch", [1, 3])
def test_prefetching_gives_the_same_batches(prefetch: int) -> None:
    x, y = data(23)
    plain = DataLoader((x, y), 5, shuffle=True, seed=4)
    ahead = DataLoader((x, y), 5, shuffle=True, seed=4, prefetch=prefetch)
    for _ in range(2):
        for a, b in zip(plain, ahead, strict=True):
            np.testing.assert_array_equal(a[0], b[0])
            np.testing.assert_array_equal(a[1], b[1])


def test_the_next_batch_is_made_while_the_consumer_works() -> None:
    """With ``prefetch=1`` a batch's collation runs beside the work on the one before: both take a
    while, and together they take about the time of one."""
    made = []

    def slow(batch: list[int]) -> list[int]:
        time.sleep(0.05)
        made.append(threading.current_thread().name)
        return batch

    loader = DataLoader(list(range(8)), 1, collate=slow, prefetch=1)
    start = time.perf_counter()
    for _ in loader:
        time.sleep(0.05)  # the consumer's work on a batch
    elapsed = time.perf_counter() - start
    assert set(made) == {THREAD}
    assert elapsed < 8 * 0.1 * 0.8, elapsed  # sequential would take 8 * (0.05 + 0.05)


def failing_collate(batch: list[int]) -> list[int]:
    if 6 in batch:
        raise ValueError(f"cannot collate {batch}")
    return batch


@pytest.mark.parametrize("prefetch", [0, 1, 2])
def test_an_error_in_collate_reaches_the_consumer_at_its_batch(prefetch: int) -> None:
    loader = DataLoader(list(range(10)), 3, collate=failing_collate, prefetch=prefetch)
    got = []
    with pytest.raises(ValueError, match=r"cannot collate \[6, 7, 8\]") as raised:
        for batch in loader:
            got.append(batch)
    assert got == [[0, 1, 2], [3, 4, 5]]
    frames = [frame.name for frame in traceback.extract_tb(raised.value.__traceback__)]
    assert "failing_collate" in frames  # the error's own traceback, where collate raised it
    assert prefetch_threads() == []


@pytest.mark.parametrize("how", ["break", "raise", "drop", "close"])
def test_a_consumer_that_stops_early_leaves_no_thread(how: str) -> None:
    """However the consumer stops, the thread (waiting to hand over a batch made ahead) stops and
    is joined at once, without waiting on a batch nobody asks for."""
    loader = DataLoader(np.arange(1000), 2, prefetch=2)
    start = time.perf_counter()
    if how == "break":
        for batch in loader:
            if batch[0] == 4:
                break
    elif how == "raise":
        with pytest.raises(KeyError):
            for batch in loader:
                if batch[0] == 4:
                    raise KeyError("the consumer's own error")
    else:
        batches = iter(loader)
        next(batches)
        time.sleep(0.05)  # the thread fills the queue and waits
        assert len(prefetch_threads()) == 1
        if how == "close":
            batches.close()  # type: ignore[attr-defined]
        else:
            del batches
    assert prefetch_threads() == []
    assert time.perf_counter() - start < 2.0


def test_an_iterator_never_started_starts_no_thread() -> None:
    loader = DataLoader(np.arange(10), 2, prefetch=1)
    batches = iter(loader)
    assert prefetch_threads() == []
    del batches


def test_a_batch_that_takes_long_is_waited_for() -> None:
    """The consumer waits on a slow collate as long as it takes (no timeout that gives up)."""

    def slow(batch: list[int]) -> list[int]:
        time.sleep(0.3)
        return batch

    assert list(DataLoader([1, 2, 3], 2, collate=slow, prefetch=1)) == [[1, 2], [3]]
