"""The device check's table: the issue's targets from the JSON files ``device-check.sh`` wrote.

``python scripts/device_summary.py OUT_DIR``: reads ``treelstm-cuda[-pure].json``,
``columns-cuda[-pure].json``, ``overhead-cuda.json``, ``columns-pool.json`` and
``treelstm-pool.json`` where present (``-pure``: run on the pure-Python engine), and prints
each figure as a ratio measured in one run (the median of the rounds' paired ratios).
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any


def paired(a: dict[str, Any], b: dict[str, Any]) -> float:
    """``a`` / ``b``: the median of their rounds' ratios (their segments ran in turn)."""
    xs, ys = a["samples"], b["samples"]
    if xs and len(xs) == len(ys):
        return float(statistics.median(x / y for x, y in zip(xs, ys, strict=True)))
    return float(a["median"]) / float(b["median"])


def _load(folder: Path, name: str) -> dict[str, Any] | None:
    path = folder / name
    if not path.is_file():
        return None
    loaded: dict[str, Any] = json.loads(path.read_text())
    return loaded


def _pick(results: list[dict[str, Any]], **match: Any) -> dict[str, Any] | None:
    for r in results:
        if all(r.get(k) == v for k, v in match.items()):
            return r
    return None


def lines(folder: Path) -> list[str]:
    """The table's lines: one per figure found."""
    out: list[str] = []
    for name, engine in (("treelstm-cuda-pure.json", "pure"), ("treelstm-cuda.json", "compiled")):
        tree = _load(folder, name)
        if tree is None:
            continue
        out.append(f"Tree-LSTM on {tree['run'].get('device')} ({engine} engine):")
        for phase in ("train", "infer"):
            for batch in tree["run"]["batches"]:
                mine = _pick(tree["results"], implementation="monadl", phase=phase, batch=batch)
                theirs = _pick(tree["results"], implementation="torch", phase=phase, batch=batch)
                if mine and theirs:
                    out.append(
                        f"  {phase} batch {batch}: monadl {mine['median']:.1f} trees/s, torch CUDA "
                        f"{theirs['median']:.1f}: {paired(mine, theirs):.2f}x"
                    )
    for name, engine in (("columns-cuda-pure.json", "pure"), ("columns-cuda.json", "compiled")):
        cols = _load(folder, name)
        if cols is None:
            continue
        out.append(f"CIFAR columns on {cols['run'].get('device')} ({engine} engine):")
        for r in cols["results"]:
            if r["implementation"] != "monadl":
                continue
            torch = _pick(cols["results"], implementation="torch", columns=r["columns"], variant=r["variant"])
            if torch:
                out.append(
                    f"  {r['columns']} columns {r['variant']}: monadl {r['median']:.0f} steps/s, torch CUDA "
                    f"{torch['median']:.0f}: {paired(r, torch):.2f}x"
                )
    if over := _load(folder, "overhead-cuda.json"):
        out.append(f"per-op overhead on {over['environment'].get('device')} (us/op, fwd+bwd):")
        for row in over["rows"]:
            if row["mode"] == "fwd+bwd":
                base = row.get("numpy") or {}
                torch = row.get("torch") or {}
                out.append(
                    f"  {row['case']}: monadl {row['monadl']['median']:.1f}, plain CuPy "
                    f"{base.get('median', float('nan')):.1f}, torch {torch.get('median', float('nan')):.1f}"
                )
    if pool := _load(folder, "columns-pool.json"):
        out.append(f"CIFAR columns on the CPU, pool k / pool 1 ({pool['run'].get('machine')}):")
        for r in pool["results"]:
            if r["implementation"] != "monadl" or r["pool"] == 1:
                continue
            one = _pick(
                pool["results"], implementation="monadl", columns=r["columns"], variant=r["variant"], pool=1
            )
            if one:
                out.append(f"  {r['columns']} columns {r['variant']} pool {r['pool']}: {paired(r, one):.2f}x")
    if tree_pool := _load(folder, "treelstm-pool.json"):
        out.append("Tree-LSTM on the CPU, k workers / 1 worker:")
        for r in tree_pool["results"]:
            if not str(r["implementation"]).startswith("monadl@"):
                continue
            one = _pick(tree_pool["results"], implementation="monadl", phase=r["phase"], batch=r["batch"])
            if one:
                workers = str(r["implementation"]).partition("@")[2]
                out.append(f"  {r['phase']} batch {r['batch']}, {workers} workers: {paired(r, one):.2f}x")
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python scripts/device_summary.py OUT_DIR", file=sys.stderr)
        return 2
    found = lines(Path(argv[0]))
    print("\n".join(found) if found else "no results found")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
