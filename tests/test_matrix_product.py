"""``backend.matrix_product``: the engine's product of NumPy matrices calls ``np.matmul`` for large
products (``np.dot`` zeroes its result first) and must give ``np.dot``'s bits for every shape,
dtype and memory layout, on either side of its threshold."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from monadl._compiled import compiled
from monadl.typeclasses import backend
from monadl.typeclasses.backend import matrix_product

LAYOUTS = ("c", "f", "strided")


def _laid_out(x: np.ndarray, layout: str) -> np.ndarray:
    """``x`` (C-ordered) with the same values in another memory layout."""
    if layout == "f":
        return np.asfortranarray(x)
    if layout == "strided":  # every other column of a wider array: no unit stride on one side
        wide = np.zeros((x.shape[0], 2 * x.shape[1]), dtype=x.dtype)
        wide[:, ::2] = x
        return wide[:, ::2]
    return x


@settings(max_examples=120, deadline=None)
@given(
    st.integers(1, 300),
    st.integers(1, 40),
    st.integers(1, 300),
    st.sampled_from([np.float32, np.float64]),
    st.sampled_from(LAYOUTS),
    st.sampled_from(LAYOUTS),
    st.integers(0, 2**32 - 1),
)
def test_the_product_is_np_dots_bit_for_bit(
    m: int, k: int, n: int, dtype: Any, left: str, right: str, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    a = _laid_out(rng.standard_normal((m, k)).astype(dtype), left)
    b = _laid_out(rng.standard_normal((k, n)).astype(dtype), right)
    got = matrix_product(a, b)
    want = np.dot(a, b)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert got.tobytes() == np.ascontiguousarray(want).tobytes()


@settings(max_examples=30, deadline=None)
@given(
    st.integers(130, 260),
    st.integers(1, 20),
    st.sampled_from([np.float32, np.float64]),
    st.integers(0, 2**32 - 1),
)
def test_a_matrix_by_its_own_transpose_is_np_dots_bit_for_bit(m: int, k: int, dtype: Any, seed: int) -> None:
    """``x @ x.T`` (one buffer on both sides: BLAS's symmetric product in both NumPy calls)."""
    x = np.random.default_rng(seed).standard_normal((m, k)).astype(dtype)
    assert matrix_product(x, x.T).tobytes() == np.ascontiguousarray(np.dot(x, x.T)).tobytes()


@pytest.mark.skipif(compiled(), reason="compiled code reads NumPy's functions where no spy can stand in")
def test_large_contiguous_products_take_matmul_and_the_rest_dot(monkeypatch: Any) -> None:
    """The switch itself (a spy on both NumPy calls, in the pure form: the compiled one is the same
    source): matmul from the threshold up, for C- and F-ordered operands; dot below it, for a
    single row or column, and for a strided operand."""
    calls: list[str] = []
    real_dot, real_matmul = np.dot, np.matmul

    class Spy:
        def __getattr__(self, name: str) -> Any:
            return getattr(np, name)

        @staticmethod
        def dot(a: Any, b: Any) -> Any:
            calls.append("dot")
            return real_dot(a, b)

        @staticmethod
        def matmul(a: Any, b: Any) -> Any:
            calls.append("matmul")
            return real_matmul(a, b)

    monkeypatch.setattr(backend, "np", Spy())
    big = np.ones((256, 8)), np.ones((8, 64))  # 16,384 elements: the threshold
    cases = [
        (big, "matmul"),
        ((np.asfortranarray(big[0]), big[1]), "matmul"),
        ((big[0].T.copy().T, big[1]), "matmul"),
        ((np.ones((255, 8)), np.ones((8, 64))), "dot"),
        ((np.ones((1, 8)), np.ones((8, 20000))), "dot"),
        ((np.ones((20000, 8)), np.ones((8, 1))), "dot"),
        ((_laid_out(np.ones((256, 8)), "strided"), big[1]), "dot"),
    ]
    for (a, b), expected in cases:
        calls.clear()
        matrix_product(a, b)
        assert calls == [expected], (a.shape, b.shape, a.strides, calls)


@settings(max_examples=40, deadline=None)
@given(
    st.integers(2, 300), st.integers(1, 8), st.integers(2, 4), st.integers(64, 200), st.integers(0, 2**32 - 1)
)
def test_a_vector_or_a_stack_is_np_dots(m: int, k: int, stack: int, n: int, seed: int) -> None:
    """Operands that are not both matrices are ``np.dot``'s whatever their size (a stack's product
    by ``np.dot`` is not ``np.matmul``'s: another shape)."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, k))
    for b in (rng.standard_normal(k), rng.standard_normal((stack, k, n))):
        got, want = matrix_product(a, b), np.dot(a, b)
        assert got.shape == want.shape and got.tobytes() == want.tobytes()
    rows, b = rng.standard_normal((stack, m, k)), rng.standard_normal((k, n))
    got, want = matrix_product(rows, b), np.dot(rows, b)
    assert got.shape == want.shape == (stack, m, n) and got.tobytes() == want.tobytes()
