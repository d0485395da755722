"""What every benchmark shares: medians, percentiles, the machine it ran on, and the JSON + markdown writer."""
from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def median(xs: Sequence[float]) -> float:
    return float(statistics.median(xs))


def percentile(xs: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs, dtype=float), q))


def environment() -> dict[str, Any]:
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    except OSError:
        commit = ""
    import torch

    return {"commit": commit, "python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count(),
            "torch": torch.__version__, "torch_threads": torch.get_num_threads(), "time": time.strftime("%Y-%m-%d %H:%M:%S"),
            "load_avg_15min": round(os.getloadavg()[2], 2)}  # other work on the machine while the bench ran


def write_results(name: str, result: dict[str, Any], table_md: str, results_dir: Path | None = None) -> None:
    out = Path(results_dir) if results_dir is not None else RESULTS
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(result, indent=2))
    env = result.get("environment", {})
    load = f", 15-min load average {env['load_avg_15min']} at the end" if "load_avg_15min" in env else ""
    head = f"# {name}\n\ncommit {env.get('commit', '?')}, {env.get('cpus', '?')} CPUs, {env.get('time', '')}{load}\n\n"
    (out / f"{name}.md").write_text(head + table_md + "\n")
    print(table_md)


def run_in(data_dir: Path) -> tuple[dict, Path | None] | None:
    """(the first run in a run's data dir, its latest checkpoint or None), or None when the dir has no run.
    Checkpoints are looked up under the data dir first, so a copied or moved run dir still works."""
    from core.store import ExperienceStore
    from trainers.engine import latest_checkpoint

    if not (data_dir / "workbench.db").is_file():
        return None
    store = ExperienceStore(f"sqlite:///{data_dir / 'workbench.db'}")
    try:
        runs = sorted(store.list_runs(), key=lambda r: r["id"])
    finally:
        store.close()
    if not runs:
        return None
    run = runs[0]
    ck = latest_checkpoint(data_dir / "runs" / str(run["id"]) / "checkpoints")
    if ck is None and run.get("checkpoint_dir"):
        ck = latest_checkpoint(Path(run["checkpoint_dir"]))
    return run, ck
