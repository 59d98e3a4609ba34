"""``python -m monadl.bench phases``: a training step of a suite model timed phase by phase, through
the training step's own passes (``training.forward_pass``, ``backward_pass``, ``commit_step``)."""

from __future__ import annotations

import math

import pytest

from monadl.bench.phases import PHASES, measure


@pytest.mark.parametrize("task", ["bilstm-tagger", "treenn"])
def test_the_phases_of_a_smoke_step_add_up_to_the_step(task: str) -> None:
    result = measure(task, 4, 3, 1, None, smoke=True)
    parts = [result[phase] for phase in PHASES if phase != "step"]
    assert all(part > 0.0 for part in parts), result
    # Medians of the parts need not add up to the median step, but each part is within it.
    assert all(part <= result["step"] for part in parts), result
    assert result["nodes"] > 0 and result["kernels"] > 0 and result["steps"] > 0, result
    assert math.isclose(result["us/node"], 1e3 * result["step"] / result["nodes"])
