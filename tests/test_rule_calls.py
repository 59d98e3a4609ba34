"""How the engine calls an op's rules: ``call_forward`` and ``call_vjp`` (``monadl.do.primitive``)
write some calls out (few inputs, no parameters or an ``axis`` alone) and take the general call
otherwise; whichever way, a rule gets what ``rule(xp, *inputs, **params)`` would give it."""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from monadl.do.primitive import call_forward, call_vjp

PARAMS = st.one_of(
    st.just({}),
    st.builds(lambda a: {"axis": a}, st.integers(-3, 3)),
    st.builds(lambda a, k: {"axis": a, "keepdims": k}, st.integers(-3, 3), st.booleans()),
    st.builds(lambda k: {"keepdims": k}, st.booleans()),
)


def seen(*args: Any, **kwargs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """What a rule was given."""
    return args, kwargs


@given(n=st.integers(0, 7), params=PARAMS, as_list=st.booleans())
def test_a_rule_gets_the_general_calls_arguments(n: int, params: dict[str, Any], as_list: bool) -> None:
    inputs: Any = [object() for _ in range(n)]
    given_inputs = inputs if as_list else tuple(inputs)
    delta, saved = object(), object()
    assert call_forward(seen, np, given_inputs, params) == seen(np, *inputs, **params)
    assert call_vjp(seen, np, delta, saved, given_inputs, params) == seen(np, delta, saved, *inputs, **params)
