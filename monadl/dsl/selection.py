"""Selection: ``where(condition, a, b)``, elementwise ``a`` where a boolean condition holds, else ``b``.

The condition is data (a mask computed from values, not a structure): it goes into the graph as
a constant operand of 0.0 and 1.0 (a layer's data is floating-point), so the op is elementwise in
all three operands and merges under dynamic batching as ``add`` does, the calls' conditions
stacked with their other operands, whatever the three shapes (NumPy's broadcasting).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from monadl.dsl.layers import AnyArray, AnyFloat, ArrayLayer, apply_array
from monadl.dsl.primitives import ELEMENTWISE, Primitive
from monadl.typeclasses.backend import AnyNDArray, is_array, namespace

__all__ = ["where"]


def _where(xp: Any, a: Any, b: Any, condition: Any) -> Any:
    if type(a) is float and type(b) is float:  # (the array API selects between arrays: one at least)
        a = xp.asarray(a, dtype=condition.dtype)
    return xp.where(condition > 0.5, a, b)


def _where_vjp_a(xp: Any, d: Any, o: Any, a: Any, b: Any, condition: Any) -> Any:
    return xp.where(condition > 0.5, d, 0.0 * d)  # (0 * d: the delta's dtype, and a NaN kept, as relu's)


def _where_vjp_b(xp: Any, d: Any, o: Any, a: Any, b: Any, condition: Any) -> Any:
    return xp.where(condition > 0.5, 0.0 * d, d)


def _no_delta(xp: Any, d: Any, o: Any, a: Any, b: Any, condition: Any) -> Any:
    """The condition is a constant: no delta flows into it (none is asked for; this is its shape)."""
    return xp.zeros_like(condition)


where_ = Primitive(
    "where",
    _where,
    (_where_vjp_a, _where_vjp_b, _no_delta),
    broadcasts=True,
    batch=ELEMENTWISE,
    fresh=True,
    own=True,
)


def where(condition: AnyNDArray, a: AnyFloat | AnyArray, b: AnyFloat | AnyArray) -> ArrayLayer:
    """Elementwise ``a`` where ``condition`` is true, else ``b`` (``numpy.where`` of three operands):
    ``condition`` a boolean array of any namespace (a constant: no delta flows into it), ``a`` and
    ``b`` layers, weights or constants; the three broadcast together, and each of ``a`` and ``b``
    gets the result's delta where it was chosen (0 elsewhere), summed back to its shape."""
    if not is_array(condition) or not namespace(condition).isdtype(condition.dtype, "bool"):
        dtype = getattr(condition, "dtype", None)
        what = type(condition).__name__ + ("" if dtype is None else f" of dtype {dtype}")
        raise TypeError(f"where: condition must be a boolean array, got {what}")
    values: Any = condition
    if isinstance(values, np.generic):  # a NumPy bool: a 0-d array (its float would be a float)
        values = np.asarray(values)
    xp = namespace(values)
    mask = xp.astype(values, xp.float64)
    return apply_array(where_, a, b, mask)
