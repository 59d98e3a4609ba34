"""Do: monad and applicative laws, sharing, stack safety, failure semantics, the pool."""

from __future__ import annotations

import functools
import operator
import threading
import time
import traceback
from collections.abc import Callable, Iterator

import pytest
from cycles import cyclic_garbage
from hypothesis import given, settings
from hypothesis import strategies as st

from monadl.do import Do, Executor, defer, delay, from_coroutine, gather, gather_all, kernel, pure
from monadl.do.do import kernel_n, map_n

IntFn = Callable[[int], int]
KleisliFn = Callable[[int], Do[int]]


@pytest.fixture(scope="module", params=[1, 2], ids=["sequential", "pool2"])
def executor(request: pytest.FixtureRequest) -> Iterator[Executor]:
    # min_pool_cost=0 sends every kernel to the pool when there is one: the concurrent paths are tested.
    with Executor(request.param, min_pool_cost=0) as ex:
        yield ex


# --------------------------------------------------------------------------- generated programs

int_fns: st.SearchStrategy[IntFn] = st.sampled_from(
    [lambda x: x + 1, lambda x: 2 * x, lambda x: x * x % 1009, lambda x: -x, lambda x: x - 7]
)


def _leaf(n: int, kind: int) -> Do[int]:
    if kind == 0:
        return pure(n)
    if kind == 1:
        return delay(lambda: n)
    if kind == 2:
        return kernel(lambda v: v, n, cost=1.0)
    return defer(lambda: pure(n))


leaves: st.SearchStrategy[Do[int]] = st.builds(_leaf, st.integers(-100, 100), st.integers(0, 3))


def _extend(children: st.SearchStrategy[Do[int]]) -> st.SearchStrategy[Do[int]]:
    return st.one_of(
        st.builds(lambda d, f: d.map(f), children, int_fns),
        st.builds(lambda d, f, k: d.flat_map(lambda x: _leaf(f(x), k)), children, int_fns, st.integers(0, 3)),
        st.builds(lambda a, b: gather(a, b).map(lambda t: t[0] + t[1]), children, children),
        st.builds(lambda d: defer(lambda: d), children),
        st.builds(lambda d, f: d.map_kernel(f, cost=1.0), children, int_fns),
    )


programs: st.SearchStrategy[Do[int]] = st.recursive(leaves, _extend, max_leaves=12)
kleislis: st.SearchStrategy[KleisliFn] = st.builds(
    lambda f, k: lambda x: _leaf(f(x), k), int_fns, st.integers(0, 3)
)
law_settings = settings(max_examples=60, deadline=None)


# ------------------------------------------------------------------------------------ monad laws


@law_settings
@given(a=st.integers(-100, 100), f=kleislis)
def test_left_identity(executor: Executor, a: int, f: KleisliFn) -> None:
    assert executor.run(pure(a).flat_map(f)) == executor.run(f(a))


@law_settings
@given(m=programs)
def test_right_identity(executor: Executor, m: Do[int]) -> None:
    assert executor.run(m.flat_map(pure)) == executor.run(m)


@law_settings
@given(m=programs, f=kleislis, g=kleislis)
def test_associativity(executor: Executor, m: Do[int], f: KleisliFn, g: KleisliFn) -> None:
    left = m.flat_map(f).flat_map(g)
    right = m.flat_map(lambda x: f(x).flat_map(g))
    assert executor.run(left) == executor.run(right)


# ------------------------------------------------------------------------ functor / applicative


@law_settings
@given(m=programs)
def test_functor_identity(executor: Executor, m: Do[int]) -> None:
    assert executor.run(m.map(lambda x: x)) == executor.run(m)


@law_settings
@given(m=programs, f=int_fns, g=int_fns)
def test_functor_composition(executor: Executor, m: Do[int], f: IntFn, g: IntFn) -> None:
    assert executor.run(m.map(f).map(g)) == executor.run(m.map(lambda x: g(f(x))))


@law_settings
@given(a=st.integers(), b=st.integers())
def test_applicative_homomorphism(executor: Executor, a: int, b: int) -> None:
    assert executor.run(gather(pure(a), pure(b))) == (a, b)


@law_settings
@given(m=programs, n=programs)
def test_applicative_agrees_with_monadic_sequencing(executor: Executor, m: Do[int], n: Do[int]) -> None:
    """gather(m, n) gives what sequencing them with flat_map gives: independence is only a license."""
    sequenced = m.flat_map(lambda x: n.map(lambda y: (x, y)))
    assert executor.run(gather(m, n)) == executor.run(sequenced)


@law_settings
@given(m=programs, n=programs, o=programs)
def test_applicative_associativity(executor: Executor, m: Do[int], n: Do[int], o: Do[int]) -> None:
    left = gather(gather(m, n), o).map(lambda t: (t[0][0], t[0][1], t[1]))
    right = gather(m, gather(n, o)).map(lambda t: (t[0], t[1][0], t[1][1]))
    assert executor.run(left) == executor.run(right) == executor.run(gather(m, n, o))


# --------------------------------------------------------------------------------------- sharing


def test_a_node_reached_twice_is_evaluated_once_per_run(executor: Executor) -> None:
    calls: list[int] = []

    def evaluate() -> int:
        calls.append(1)
        return 21

    shared = delay(evaluate)
    program = gather(shared.map(lambda x: x + 1), shared.map(lambda x: x * 2), shared)
    assert executor.run(program) == (22, 42, 21)
    assert len(calls) == 1
    executor.run(program)
    assert len(calls) == 2  # a new run evaluates it again


def test_sharing_holds_for_a_node_still_running_on_the_pool() -> None:
    calls: list[int] = []
    started = threading.Event()

    def slow(x: int) -> int:
        calls.append(x)
        started.set()
        return x + 1

    with Executor(2, min_pool_cost=0) as ex:
        shared = kernel(slow, 1, cost=1.0)
        users = [shared.map(functools.partial(operator.add, i)) for i in range(5)]
        assert ex.run(gather_all(users)) == (2, 3, 4, 5, 6)
    assert calls == [1]


# ---------------------------------------------------------------------------------- stack safety


def test_100000_chained_flat_maps(executor: Executor) -> None:
    program: Do[int] = pure(0)
    for _ in range(100_000):
        program = program.flat_map(lambda x: pure(x + 1))
    assert executor.run(program) == 100_000


def test_100000_nested_maps_and_kernels(executor: Executor) -> None:
    program: Do[int] = pure(0)
    for i in range(100_000):
        program = program.map(lambda x: x + 1) if i % 2 else program.map_kernel(lambda x: x + 1)
    assert executor.run(program) == 100_000


def test_10000_deep_non_tail_recursion(executor: Executor) -> None:
    def depth(n: int) -> Do[int]:
        if n == 0:
            return pure(0)
        return defer(lambda: depth(n - 1)).map(lambda d: d + 1)

    assert executor.run(depth(10_000)) == 10_000


def test_10000_deep_binary_recursion_through_gather(executor: Executor) -> None:
    """A deep tree: each level gathers a deep child and a leaf."""

    def tree(n: int) -> Do[int]:
        if n == 0:
            return pure(1)
        return defer(lambda: map_n(lambda a, b: a + b, tree(n - 1), kernel(lambda: 1, cost=1.0)))

    assert executor.run(tree(10_000)) == 10_001


def test_coroutine_awaiting_100000_times(executor: Executor) -> None:
    async def count() -> int:
        total = 0
        for _ in range(100_000):
            total += await pure(1)
        return total

    assert executor.run(from_coroutine(count())) == 100_000


# --------------------------------------------------------------------------------------- failure


class Boom(Exception):
    pass


def _explode(x: int) -> int:
    raise Boom(f"kernel failed on {x}")


@pytest.mark.parametrize(
    "make",
    [
        lambda: kernel(_explode, 3, cost=1.0),
        lambda: pure(3).map(_explode),
        lambda: pure(3).flat_map(lambda x: pure(_explode(x))),
        lambda: delay(lambda: _explode(3)),
        lambda: gather(pure(1), kernel(_explode, 3, cost=1.0)).map(lambda t: t[0]),
    ],
    ids=["kernel", "map", "flat_map", "delay", "gather"],
)
def test_failure_reaches_the_caller_with_its_traceback(
    executor: Executor, make: Callable[[], Do[int]]
) -> None:
    with pytest.raises(Boom, match="kernel failed on 3") as info:
        executor.run(make())
    frames = [frame.name for frame in traceback.extract_tb(info.value.__traceback__)]
    assert "_explode" in frames  # the original frame, even when it ran on a pool thread
    assert executor.run(pure(1).map_kernel(lambda x: x + 1)) == 2  # the executor stays usable


def test_failure_lets_started_work_finish_and_starts_nothing_new() -> None:
    finished = threading.Event()
    after_failure: list[int] = []

    def slow() -> int:
        finished.wait(0.2)  # still running when the other kernel fails
        finished.set()
        return 1

    def failing() -> int:
        raise Boom("fails first")

    with Executor(2, min_pool_cost=0) as ex:
        program = gather(kernel(slow, cost=1.0), kernel(failing, cost=1.0)).flat_map(
            lambda t: delay(lambda: after_failure.append(1))
        )
        threads_before = threading.active_count()
        with pytest.raises(Boom):
            ex.run(program)
        assert finished.is_set()  # run() returned only after the started kernel finished
        assert after_failure == []  # nothing after the failure ran
        assert ex.run(kernel(lambda: 5, cost=1.0)) == 5
        assert threading.active_count() <= threads_before + 2  # no threads leaked beyond the pool


def test_a_failed_backward_pass_lets_started_vjps_finish() -> None:
    """A vjp that fails on the pass's own thread while a heavy one runs on the pool: the training
    step fails only once the running one is done (nothing of the failed step is left computing),
    and no weight changed. (A kernel that fails on the pool is waited for by the pool itself.)"""
    import numpy as np

    import monadl as ml

    started, finished = threading.Event(), threading.Event()
    threads: dict[str, str] = {}

    def slow_vjp(xp: object, d: object, out: object, x: object) -> object:
        threads["slow"] = threading.current_thread().name
        started.set()
        finished.wait(0.3)  # still running when the other vjp fails
        finished.set()
        return d

    def failing_vjp(xp: object, d: object, out: object, x: object) -> object:
        threads["failing"] = threading.current_thread().name
        started.wait(1.0)
        raise Boom("vjp failed")

    slow = ml.custom_op("slow", lambda xp, x: x * 1.0, (slow_vjp,))
    failing = ml.custom_op("failing", lambda xp, x: x * 1.0, (failing_vjp,))
    # A weight of a million elements: its vjp worth the pool; one of two: not (its own thread's).
    a, b = ml.ArrayWeight(np.ones((1024, 1024))), ml.ArrayWeight(np.ones(2))
    loss = ml.sum(failing(b)) + ml.sum(slow(a))
    with Executor(2) as ex:
        failure = loss.train_blocking(ml.SGD(0.1), executor=ex).failure()
        done_then = finished.is_set()  # (not after the executor's exit, which waits for its threads)
    assert isinstance(failure, Boom) and str(failure) == "vjp failed"
    assert threads == {"failing": threading.current_thread().name, "slow": threads["slow"]}
    assert threads["slow"] != threading.current_thread().name  # the two vjps ran at once
    assert done_then  # the step failed only after the running vjp was done
    assert (a.data == 1.0).all() and (b.data == 1.0).all()


def test_a_failed_run_leaves_no_reference_cycles(executor: Executor) -> None:
    """On the pool too: the run's state is on the failure's traceback (its frames), so neither it
    nor a frame on that traceback may keep the exception."""

    def slow() -> int:
        time.sleep(0.02)  # still running when its sibling's input fails
        return 1

    def failing(a: int, b: int) -> int:
        raise Boom("inner failed")

    def run_failing() -> None:
        inner = kernel_n(failing, kernel(lambda: 1, cost=1.0), kernel(lambda: 2, cost=1.0), cost=1.0)
        with pytest.raises(Boom):
            executor.run(kernel_n(operator.add, kernel(slow, cost=1.0), inner, cost=1.0))

    assert cyclic_garbage(run_failing) == []


# ----------------------------------------------------------------------------------- concurrency


def test_independent_kernels_run_concurrently_on_a_pool_of_two() -> None:
    barrier = threading.Barrier(2, timeout=5)

    def meet(x: int) -> int:
        barrier.wait()  # only returns when both kernels are running at once
        return x

    with Executor(2, min_pool_cost=0) as ex:
        assert ex.run(gather(kernel(meet, 1, cost=1.0), kernel(meet, 2, cost=1.0))) == (1, 2)


def test_a_pool_of_one_is_strictly_sequential() -> None:
    order: list[str] = []
    running = threading.Lock()

    def work(name: str) -> str:
        assert running.acquire(blocking=False), "two kernels overlapped"
        order.append(name)
        running.release()
        return name

    with Executor(1) as ex:
        program = gather_all(kernel(work, str(i), cost=1e12) for i in range(20))
        assert ex.run(program) == tuple(str(i) for i in range(20))
        assert threading.current_thread() is threading.main_thread()
    assert sorted(order) == sorted(str(i) for i in range(20))


def test_small_kernels_run_inline_on_the_calling_thread() -> None:
    with Executor(2, min_pool_cost=1e6) as ex:
        small = ex.run(kernel(lambda: threading.current_thread().name, cost=10.0))
        large = ex.run(kernel(lambda: threading.current_thread().name, cost=1e7))
    assert small == threading.current_thread().name
    assert large.startswith("monadl")


def test_executor_rejects_a_pool_of_zero() -> None:
    with pytest.raises(ValueError, match="workers must be >= 1"):
        Executor(0)


def test_bind_of_no_sources_and_many_sources(executor: Executor) -> None:
    assert executor.run(gather_all([])) == ()
    assert executor.run(map_n(lambda *v: sum(v), *(pure(i) for i in range(50)))) == sum(range(50))


def test_weak_references_to_nodes_tapes_and_layers_are_cleared() -> None:
    """Compiled with mypyc, a class with a Generic base once left its weak references dangling:
    dropping the object crashed the interpreter. Each kind here is referred to weakly where it can
    be (run from source, a class with __slots__ cannot: a TypeError, as for any such class), with a
    callback, and dropped: every reference is cleared and every callback runs."""
    import gc
    import weakref

    import numpy as np

    import monadl as ml
    from monadl.do.tape import Tape

    called: list[int] = []

    def objects() -> list[object]:
        w = ml.ArrayWeight(np.ones(2))
        layer = ml.tanh(w * 2.0)
        user_tape = type("UserTape", (Tape,), {})(1.0)  # a class of the user's own: weakly referable
        return [
            pure(1),
            pure(1).map(lambda x: x),
            Tape(1.0),
            user_tape,
            w,
            layer,
            layer.forward,
            ml.Executor(),
        ]

    def callback(k: int) -> Callable[[weakref.ref[object]], None]:
        return lambda _: called.append(k)

    made = objects()
    refs: list[weakref.ref[object]] = []
    for k, o in enumerate(made):
        try:
            refs.append(weakref.ref(o, callback(k)))
        except TypeError:
            assert not hasattr(o, "__weakref__"), type(o)
    assert refs, "no object took a weak reference"
    del made, o
    gc.collect()
    assert [r() for r in refs] == [None] * len(refs)
    assert len(called) == len(refs)
