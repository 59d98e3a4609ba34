"""The device check's figures: the issues' targets from the JSON files ``device-check.sh`` wrote.

``python scripts/device_summary.py OUT_DIR``: reads what is there of ``models-cuda.json``,
``models-cuda-unfused.json``, ``treelstm-cuda.json``, ``treelstm-cuda-256.json``,
``columns-pool.json``, ``columns-pool-wide.json`` and ``treelstm-pool.json`` (and of
``columns-cuda.json`` and ``overhead-cuda.json``, or a ``-pure`` one: run on the pure-Python
engine), and of ``scripts/cpu-suite.sh``'s files in ``cpu/`` or ``logs/cpu/``, and prints each figure
as a ratio measured in one run (the median of the rounds' paired ratios), with any peer whose
first loss disagreed with monadl's.
"""

from __future__ import annotations

import json
import math
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


def _engine(data: dict[str, Any], default: str) -> str:
    compiled = data.get("compiled", data.get("run", {}).get("compiled"))
    return default if compiled is None else ("compiled" if compiled else "pure")


def _models(folder: Path) -> list[str]:
    out: list[str] = []
    for name in ("models-cuda.json", "models-cuda-unfused.json"):
        models = _load(folder, name)
        if models is not None:
            out += _models_of(models)
    return out


def _models_of(models: dict[str, Any]) -> list[str]:
    engine = _engine(models, "?") + ("" if models.get("fused", True) else ", unfused")
    out = [f"bench models on {models.get('device')} ({engine} engine), monadl / torch there:"]
    for r in models["results"]:
        if r.get("ratio") is None:
            out.append(f"  {r['name']}: monadl {r['monadl_rate']:.1f} steps/s, torch not measured")
            continue
        low, high = min(r["ratios"]), max(r["ratios"])
        out.append(
            f"  {r['name']} ({r['what']}): monadl {r['monadl_rate']:.1f} steps/s, torch "
            f"{r['torch_rate']:.1f}: {r['ratio']:.2f}x [{low:.2f}-{high:.2f}] (must {r['must']}x)"
        )
        first = r.get("first_losses") or []
        if len(first) == 2 and not math.isclose(first[0], first[1], rel_tol=1e-3):
            out.append(f"    warning: first losses differ: monadl {first[0]:.6g}, torch {first[1]:.6g}")
    return out


_TREE_PEERS = (("torch", "torch eager"), ("torch-levels", "torch by level"))


_Pairs = list[tuple[str, int, dict[str, Any], list[tuple[str, dict[str, Any]]]]]


def _tree_pairs(tree: dict[str, Any], peers: tuple[tuple[str, str], ...]) -> _Pairs:
    """A Tree-LSTM run's configurations, ``(phase, batch, monadl's result, [(peer's label, its
    result)])``, for the ``(implementation, label)`` peers it measured."""
    found: _Pairs = []
    for phase in ("train", "infer"):
        for batch in tree["run"]["batches"]:
            mine = _pick(tree["results"], implementation="monadl", phase=phase, batch=batch)
            if mine is None:
                continue
            theirs = [
                (label, r)
                for impl, label in peers
                if (r := _pick(tree["results"], implementation=impl, phase=phase, batch=batch))
            ]
            found.append((phase, batch, mine, theirs))
    return found


def _trees_on_gpu(folder: Path) -> list[str]:
    out: list[str] = []
    for name in ("treelstm-cuda-pure.json", "treelstm-cuda.json", "treelstm-cuda-256.json"):
        tree = _load(folder, name)
        if tree is None:
            continue
        engine = _engine(tree, "pure" if "pure" in name else "?")
        out.append(f"Tree-LSTM on {tree['run'].get('device')} ({engine} engine), monadl / each peer:")
        for phase, batch, mine, peers in _tree_pairs(tree, _TREE_PEERS):
            cells = [f"monadl {mine['median']:.1f} trees/s"]
            cells += [
                f"{label} {theirs['median']:.1f}: {paired(mine, theirs):.2f}x" for label, theirs in peers
            ]
            out.append(f"  {phase} batch {batch}: " + "; ".join(cells))
        for r in tree["results"]:
            if r.get("agrees") is False:
                what = f"{r['implementation']} at {r['phase']} batch {r['batch']}"
                out.append(f"    warning: the first result of {what} differs from monadl's")
    return out


def _columns_on_gpu(folder: Path) -> list[str]:
    out: list[str] = []
    for name, engine in (("columns-cuda-pure.json", "pure"), ("columns-cuda.json", "compiled")):
        cols = _load(folder, name)
        if cols is None:
            continue
        out.append(f"CIFAR columns on {cols['run'].get('device')} ({_engine(cols, engine)} engine):")
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
    return out


def _pools(folder: Path) -> list[str]:
    out: list[str] = []
    for name in ("columns-pool.json", "columns-pool-wide.json"):
        pool = _load(folder, name)
        if pool is None:
            continue
        run = pool["run"]
        out.append(
            f"CIFAR columns on the CPU, batch {run.get('batch')}, hidden {run.get('hidden')}, "
            f"pool k / pool 1 ({run.get('machine')}):"
        )
        for r in pool["results"]:
            if r["implementation"] != "monadl" or r["pool"] == 1:
                continue
            one = _pick(
                pool["results"], implementation="monadl", columns=r["columns"], variant=r["variant"], pool=1
            )
            if one:
                out.append(f"  {r['columns']} columns {r['variant']} pool {r['pool']}: {paired(r, one):.2f}x")
    if tree_pool := _load(folder, "treelstm-pool.json"):
        out.append(f"Tree-LSTM on the CPU, hidden {tree_pool['run'].get('hidden')}, k workers / 1 worker:")
        for r in tree_pool["results"]:
            if not str(r["implementation"]).startswith("monadl@"):
                continue
            one = _pick(tree_pool["results"], implementation="monadl", phase=r["phase"], batch=r["batch"])
            if one:
                workers = str(r["implementation"]).partition("@")[2]
                out.append(f"  {r['phase']} batch {r['batch']}, {workers} workers: {paired(r, one):.2f}x")
    return out


_SUITE_PEERS = (
    ("dynet-autobatch", "DyNet with autobatching"),
    ("dynet", "DyNet"),
    ("torch", "PyTorch eager"),
)
_CPU_TREE_PEERS = (("torch-levels", "torch by level"), ("dynet-autobatch", "DyNet with autobatching"))


def _rounds(a: dict[str, Any], b: dict[str, Any]) -> str:
    """``a`` / ``b`` paired by round: the median [min-max] of the rounds' ratios."""
    xs, ys = a["samples"], b["samples"]
    if not xs or len(xs) != len(ys):
        return f"{paired(a, b):.2f}"
    ratios = [x / y for x, y in zip(xs, ys, strict=True)]
    return f"{statistics.median(ratios):.2f} [{min(ratios):.2f}-{max(ratios):.2f}]"


def _cpu_suite(folder: Path) -> list[str]:
    """The ratios of ``scripts/cpu-suite.sh``'s runs (its folder ``cpu/`` or ``logs/cpu/``): the
    suite's per configuration, with any held-out loss that is not monadl's, a configuration that
    left no result, and the Tree-LSTM's."""
    where = next((d for d in (folder / "cpu", folder / "logs" / "cpu") if d.is_dir()), None)
    if where is None:
        return []
    out: list[str] = []
    suites = [(path, _load(where, path.name) or {}) for path in where.glob("suite-*.json")]
    suites.sort(key=lambda found: (sorted(found[1]["run"]["tasks"]), found[1]["run"]["batches"]))
    if suites:
        machine = suites[0][1]["run"].get("machine")
        out.append(f"DyNet's suite on the CPU, one process a configuration ({machine}), monadl / each peer:")
    for _, suite in suites:
        for task in suite["run"]["tasks"]:
            for batch in suite["run"]["batches"]:
                cells = [
                    f"{label} {r['median']:.2f} [{r['low']:.2f}-{r['high']:.2f}]"
                    for other, label in _SUITE_PEERS
                    for r in suite["ratios"]
                    if (r["task"], r["batch"], r["other"]) == (task, batch, other)
                ]
                out.append(f"  {task} at {batch}: " + "; ".join(cells))
                mine = _pick(suite["results"], task=task, batch=batch, implementation="monadl")
                for r in suite["results"]:
                    if mine is None or (r["task"], r["batch"]) != (task, batch) or r is mine:
                        continue
                    if not math.isclose(r["loss_after"], mine["loss_after"], rel_tol=1e-3):
                        out.append(
                            f"    held-out loss after: monadl {mine['loss_after']:.4f}, "
                            f"{r['implementation']} {r['loss_after']:.4f}"
                        )
    for log in sorted(where.glob("suite-*.log")):
        if not log.with_suffix(".json").is_file():
            out.append(f"  {log.stem.removeprefix('suite-')}: no result (out of time or failed: its log)")
    for path in sorted(where.glob("treelstm-*.json")):
        for phase, batch, mine, peers in _tree_pairs(_load(where, path.name) or {}, _CPU_TREE_PEERS):
            cells = [f"monadl {mine['median']:.0f} trees/s"]
            cells += [f"{label} {_rounds(mine, theirs)}" for label, theirs in peers]
            out.append(f"Tree-LSTM on the CPU, {phase} batch {batch}: " + "; ".join(cells))
    return out


def lines(folder: Path) -> list[str]:
    """The figures' lines: one per figure found."""
    return [
        *_models(folder),
        *_trees_on_gpu(folder),
        *_columns_on_gpu(folder),
        *_pools(folder),
        *_cpu_suite(folder),
    ]


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python scripts/device_summary.py OUT_DIR", file=sys.stderr)
        return 2
    found = lines(Path(argv[0]))
    print("\n".join(found) if found else "no results found")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
