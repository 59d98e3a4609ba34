"""Batches of a data set, epoch after epoch: :class:`DataLoader`.

Over arrays, ``DataLoader((x, y), batch_size=32, shuffle=True, seed=0)`` gives tuples
``(x[batch], y[batch])`` of rows taken together (a tuple of equally long arrays, or one array for
batches of it alone). Over a sequence of examples (a list, or any object with ``len`` and integer
indexing), each batch is ``collate(examples)`` of the list of its examples; the default,
:func:`default_collate`, stacks arrays of one shape (and numbers) on a new first axis, keeps
arrays of different shapes (sequences of different lengths) as a list, as ``nn.LSTM`` and
``nn.GRU`` take them, goes field by field through tuples and dicts, and gives anything else (trees,
sentences) as a list. Over a ``list``, a field whose arrays differ in shape anywhere in the list is
a list in every batch, a batch of equally long sequences too (one pass over the list when the
loader is made): a batch's type does not depend on the draw. Over a data set of your own (read
lazily), each batch is collated as it comes.

Iterating a loader gives one epoch, the next each time (``loader.next_epoch`` counts them; assign
it to resume); ``loader.epoch(k)`` gives epoch ``k``, and ``loader.epochs(n)`` the next ``n``
epochs as ``(number, batches)``. With ``shuffle``, epoch ``k``'s order is
``numpy.random.default_rng([seed, k]).permutation(n)``: a new order each epoch, the same in every
run and for a run resumed at epoch ``k``, whatever came before. A ``numpy.random.Generator`` as
``seed`` instead draws each epoch's permutation from it, one after the other (as PyTorch's
``generator=``). ``drop_last`` leaves out the last batch when it is short.

``prefetch=1`` (or more) prepares the next batches on a background thread while the current one
trains (the slicing or collation of a batch runs beside the step that uses the one before). An
exception there is raised to the consumer, at the batch that failed, with its own traceback; a
consumer that stops early (a ``break``, an exception of its own, an iterator dropped) stops and
joins the thread before going on: no thread is left behind, none waits forever. The collate
function then runs on that thread: it must not depend on the thread it runs on.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Generic, Protocol, TypeVar, TypeVarTuple, overload

import numpy as np

from monadl.typeclasses.backend import is_array, namespace

__all__ = ["DataLoader", "Examples", "default_collate"]

B = TypeVar("B")
E = TypeVar("E")
E_co = TypeVar("E_co", covariant=True)
ArrayT = TypeVar("ArrayT", bound=np.ndarray[Any, Any])
Ts = TypeVarTuple("Ts")

Seed = int | np.random.Generator
"""Where shuffled orders come from: an int (epoch ``k``'s order from ``[seed, k]``), or a generator
whose draws give each epoch's order in turn."""

Indices = np.ndarray[tuple[int], np.dtype[np.int64]]


class Examples(Protocol[E_co]):
    """A data set of examples: a length and an example per index ``0 <= i < len`` (a list, a
    tuple, a ``Sequence``, or a class of your own, as PyTorch's map-style ``Dataset``)."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int, /) -> E_co: ...


def default_collate(examples: list[Any]) -> Any:
    """A batch of ``examples``: NumPy arrays (or arrays of another namespace) of one shape and
    dtype stacked on a new first axis, numbers as one array, arrays of different shapes (sequences
    of different lengths) as the list of them; tuples (named ones too) and dicts field by field;
    anything else (strings, trees, sentences) as the list of them."""
    return _collate(examples, frozenset(), ())


Path = tuple[object, ...]
"""A field of an example: the keys and tuple indices that lead to it (``()``: the example)."""


def _collate(examples: list[Any], ragged: frozenset[Path], path: Path) -> Any:
    """:func:`default_collate`, the arrays of the fields ``ragged`` kept as lists whatever their
    shapes in this batch."""
    if not examples:
        return []
    first = examples[0]
    if isinstance(first, tuple) and all(isinstance(e, tuple) and len(e) == len(first) for e in examples):
        fields = [_collate([e[k] for e in examples], ragged, (*path, k)) for k in range(len(first))]
        return type(first)(*fields) if hasattr(first, "_fields") else tuple(fields)
    if isinstance(first, Mapping) and all(
        isinstance(e, Mapping) and e.keys() == first.keys() for e in examples
    ):
        return {key: _collate([e[key] for e in examples], ragged, (*path, key)) for key in first}
    if all(isinstance(e, (bool, int, float, np.generic)) for e in examples):
        return np.asarray(examples)
    if path not in ragged and all(is_array(e) for e in examples):
        shapes = {(tuple(e.shape), str(e.dtype)) for e in examples}
        if len(shapes) == 1 and len({namespace(e) for e in examples}) == 1:
            return namespace(first).stack(examples)
    return list(examples)


def _ragged_fields(examples: list[Any]) -> frozenset[Path]:
    """The fields of ``examples`` whose arrays differ in shape or dtype somewhere (one pass)."""
    seen: dict[Path, tuple[tuple[int, ...], str]] = {}
    ragged: set[Path] = set()
    for example in examples:
        stack: list[tuple[Path, Any]] = [((), example)]
        while stack:
            path, value = stack.pop()
            if isinstance(value, tuple):
                stack.extend(((*path, k), item) for k, item in enumerate(value))
            elif isinstance(value, Mapping):
                stack.extend(((*path, key), item) for key, item in value.items())
            elif is_array(value) and path not in ragged:
                form = (tuple(value.shape), str(value.dtype))
                if seen.setdefault(path, form) != form:
                    ragged.add(path)
    return frozenset(ragged)


class DataLoader(Generic[B]):
    """Batches of ``data`` (see the module): ``batch_size`` examples each, shuffled each epoch under
    ``seed`` when ``shuffle``, the last short batch left out when ``drop_last``, made by
    ``collate`` (over arrays: applied to the tuple of the batch's rows, or the rows themselves; over
    examples: to the list of them, :func:`default_collate` by default), ``prefetch`` batches made
    ahead on a background thread (0: none, made as they are asked for).

    ``len(loader)`` is the number of batches of an epoch. The type of a batch is the loader's type
    parameter: over ``(x, y)`` with no ``collate``, ``DataLoader[tuple[X, Y]]`` for the types of
    ``x`` and ``y``; with a ``collate``, its result's."""

    @overload
    def __init__(
        self: DataLoader[tuple[*Ts]],
        data: tuple[*Ts],
        batch_size: int = 1,
        *,
        shuffle: bool = False,
        seed: Seed = 0,
        drop_last: bool = False,
        collate: None = None,
        prefetch: int = 0,
    ) -> None: ...

    @overload
    def __init__(
        self: DataLoader[B],
        data: tuple[*Ts],
        batch_size: int = 1,
        *,
        shuffle: bool = False,
        seed: Seed = 0,
        drop_last: bool = False,
        collate: Callable[[tuple[*Ts]], B],
        prefetch: int = 0,
    ) -> None: ...

    @overload
    def __init__(
        self: DataLoader[ArrayT],
        data: ArrayT,
        batch_size: int = 1,
        *,
        shuffle: bool = False,
        seed: Seed = 0,
        drop_last: bool = False,
        collate: None = None,
        prefetch: int = 0,
    ) -> None: ...

    @overload
    def __init__(
        self: DataLoader[B],
        data: ArrayT,
        batch_size: int = 1,
        *,
        shuffle: bool = False,
        seed: Seed = 0,
        drop_last: bool = False,
        collate: Callable[[ArrayT], B],
        prefetch: int = 0,
    ) -> None: ...

    @overload
    def __init__(
        self: DataLoader[Any],
        data: Examples[E],
        batch_size: int = 1,
        *,
        shuffle: bool = False,
        seed: Seed = 0,
        drop_last: bool = False,
        collate: None = None,
        prefetch: int = 0,
    ) -> None: ...

    @overload
    def __init__(
        self: DataLoader[B],
        data: Examples[E],
        batch_size: int = 1,
        *,
        shuffle: bool = False,
        seed: Seed = 0,
        drop_last: bool = False,
        collate: Callable[[list[E]], B],
        prefetch: int = 0,
    ) -> None: ...

    def __init__(
        self,
        data: Any,
        batch_size: int = 1,
        *,
        shuffle: bool = False,
        seed: Seed = 0,
        drop_last: bool = False,
        collate: Callable[[Any], Any] | None = None,
        prefetch: int = 0,
    ) -> None:
        for name, value in (("batch_size", batch_size), ("prefetch", prefetch)):
            if isinstance(value, bool) or not isinstance(value, int | np.integer):
                raise TypeError(f"DataLoader: {name} must be an int, got {value!r}")
        if batch_size < 1:
            raise ValueError(f"DataLoader: batch_size must be positive, got {batch_size}")
        if prefetch < 0:
            raise ValueError(f"DataLoader: prefetch must be 0 (none) or more, got {prefetch}")
        if not isinstance(seed, np.random.Generator) and (
            isinstance(seed, bool) or not isinstance(seed, int)
        ):
            raise TypeError(f"DataLoader: seed must be an int or a numpy.random.Generator, got {seed!r}")
        if collate is not None and not callable(collate):
            raise TypeError(f"DataLoader: collate must be callable, got {collate!r}")
        self._arrays: tuple[Any, ...] | None = None
        self._single = False
        self._ragged: frozenset[Path] = frozenset()
        if isinstance(data, tuple):
            self._arrays = _checked_arrays(data)
            self._length = int(self._arrays[0].shape[0]) if self._arrays else 0
        elif is_array(data):
            self._arrays, self._single = _checked_arrays((data,)), True
            self._length = int(data.shape[0])
        elif isinstance(data, (str, bytes, Mapping)) or not (
            hasattr(data, "__len__") and hasattr(data, "__getitem__")
        ):
            raise TypeError(
                "DataLoader: data must be a tuple of equally long arrays, an array, or a sequence of "
                f"examples (a length and integer indexing), got a {type(data).__name__}"
            )
        else:
            self._length = len(data)
        # Over a list (in memory: one cheap pass), a field's arrays of different shapes anywhere
        # are lists in every batch, so that a batch's type does not depend on the draw.
        if isinstance(data, list) and collate is None:
            self._ragged = _ragged_fields(data)
        self._data = data
        self._tuple_type: Any = type(data) if isinstance(data, tuple) and hasattr(data, "_fields") else None
        self.batch_size = int(batch_size)
        self.shuffle = bool(shuffle)
        self.seed = seed
        self.drop_last = bool(drop_last)
        self.collate = collate
        self.prefetch = int(prefetch)
        self.next_epoch = 0
        """The number of the epoch the next ``iter(loader)`` gives (assign it to resume)."""

    def __len__(self) -> int:
        """The number of batches of an epoch."""
        whole, rest = divmod(self._length, self.batch_size)
        return whole + (1 if rest and not self.drop_last else 0)

    @property
    def examples(self) -> int:
        """The number of examples (rows) in the data."""
        return self._length

    def __iter__(self) -> Iterator[B]:
        """The batches of epoch :attr:`next_epoch`, which then counts one more."""
        number = self.next_epoch
        self.next_epoch += 1
        return self.epoch(number)

    def epoch(self, number: int) -> Iterator[B]:
        """The batches of epoch ``number`` (0 first), in its order (see the module)."""
        if isinstance(number, bool) or not isinstance(number, int | np.integer) or number < 0:
            raise ValueError(f"DataLoader.epoch: an epoch's number is an int from 0, got {number!r}")
        order = self.order(int(number))
        stop = len(self) * self.batch_size
        batches = (
            self._batch(order[start : start + self.batch_size]) for start in range(0, stop, self.batch_size)
        )
        return _prefetched(batches, self.prefetch) if self.prefetch else batches

    def epochs(self, count: int) -> Iterator[tuple[int, Iterator[B]]]:
        """The next ``count`` epochs, from :attr:`next_epoch` on: ``(number, batches)`` each. An
        epoch's batches not iterated to the end are closed when the next epoch begins."""
        if isinstance(count, bool) or not isinstance(count, int | np.integer) or count < 0:
            raise ValueError(f"DataLoader.epochs: count must be an int from 0, got {count!r}")
        batches: Iterator[B] | None = None
        try:
            for _ in range(int(count)):
                number = self.next_epoch
                _close(batches)
                batches = iter(self)
                yield number, batches
        finally:
            _close(batches)

    def order(self, number: int) -> Indices:
        """The indices of the examples in epoch ``number``'s order: ``0, 1, ...`` without
        ``shuffle``; else ``default_rng([seed, number]).permutation``, or the seed generator's next
        permutation (a draw: it advances the generator)."""
        if not self.shuffle:
            return np.arange(self._length, dtype=np.int64)
        rng = (
            self.seed
            if isinstance(self.seed, np.random.Generator)
            else np.random.default_rng([self.seed, number])
        )
        return rng.permutation(self._length).astype(np.int64, copy=False)

    def _batch(self, indices: Indices) -> B:
        """The batch of the examples at ``indices``."""
        collate = self.collate
        made: B  # (the overloads of __init__ tie the collate's result to B)
        if self._arrays is None:
            examples = [self._data[int(i)] for i in indices]
            made = _collate(examples, self._ragged, ()) if collate is None else collate(examples)
            return made
        rows = tuple(_take(a, indices, self.shuffle) for a in self._arrays)
        batch: Any = rows[0] if self._single else self._tuple_type(*rows) if self._tuple_type else rows
        made = batch if collate is None else collate(batch)
        return made

    def __repr__(self) -> str:
        return (
            f"DataLoader({self._length} examples, batch_size={self.batch_size}, shuffle={self.shuffle}, "
            f"drop_last={self.drop_last}, prefetch={self.prefetch}: {len(self)} batches an epoch)"
        )


def _checked_arrays(data: tuple[Any, ...]) -> tuple[Any, ...]:
    """The arrays of a tuple, refused unless each is an array of one dimension or more and all are
    equally long."""
    for k, a in enumerate(data):
        if not is_array(a) or len(a.shape) == 0:
            what = "a 0-d array" if is_array(a) else f"a {type(a).__name__}"
            raise TypeError(
                f"DataLoader: a tuple's items must be arrays of rows (a list of examples is a list), "
                f"item {k} is {what}"
            )
    lengths = [int(a.shape[0]) for a in data]
    if len(set(lengths)) > 1:
        raise ValueError(f"DataLoader: the arrays must be equally long, got lengths {lengths}")
    return data


def _take(array: Any, indices: Indices, shuffled: bool) -> Any:
    """The rows of ``array`` at ``indices``: a view where they are consecutive (no shuffle), else a
    gather (NumPy's indexing, or the array's namespace's ``take``)."""
    if not shuffled and len(indices):
        return array[int(indices[0]) : int(indices[-1]) + 1, ...]
    if isinstance(array, np.ndarray):
        return array[indices]
    xp = namespace(array)
    return xp.take(array, xp.asarray(indices, **_device(array)), axis=0)


def _device(array: Any) -> dict[str, Any]:
    device = getattr(array, "device", None)
    return {} if device is None else {"device": device}


def _close(batches: object) -> None:
    close = getattr(batches, "close", None)
    if close is not None:
        close()


# ------------------------------------------------------------------------------------------ prefetch

_BATCH, _DONE, _ERROR = 0, 1, 2
_POLL_S = 0.05
"""How often a thread waiting on the other side of the queue looks whether it should stop."""


def _prefetched(batches: Iterator[B], depth: int) -> Iterator[B]:
    """``batches``, made ``depth`` ahead on a thread of their own (started at the first request,
    stopped and joined when the consumer closes the iterator or drops it)."""
    ready: queue.Queue[tuple[int, Any]] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(item: tuple[int, Any]) -> bool:
        while not stop.is_set():
            try:
                ready.put(item, timeout=_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for batch in batches:
                if not put((_BATCH, batch)):
                    return
            put((_DONE, None))
        except BaseException as e:  # noqa: BLE001 - every error goes to the consumer, raised there
            put((_ERROR, e))

    thread = threading.Thread(target=produce, name="monadl DataLoader prefetch", daemon=True)
    thread.start()
    try:
        while True:
            try:
                tag, value = ready.get(timeout=_POLL_S)
            except queue.Empty:
                if not thread.is_alive() and ready.empty():  # (it always says why it ends: a guard)
                    raise RuntimeError("DataLoader: the prefetching thread ended without a word") from None
                continue
            if tag == _DONE:
                return
            if tag == _ERROR:
                raise value
            yield value
    finally:
        stop.set()
        thread.join()
