"""Checkpoint metadata held in typed variables, not only literals: a ``list[float]`` of losses, a
``dict[str, int]`` of counts, nested."""

import monadl as ml

weight = ml.FloatWeight(1.0)
losses: list[float] = [0.5, 0.25]
counts: dict[str, int] = {"steps": 2}
history: list[dict[str, float]] = [{"loss": 0.5}]
tags: list[str | None] = ["a", None]
ml.save(
    "m.safetensors", weight, metadata={"losses": losses, "counts": counts, "history": history, "tags": tags}
)
metadata: dict[str, list[float]] = {"losses": losses}
ml.save("m.safetensors", weight, metadata=metadata)
