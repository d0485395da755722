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
            "torch": torch.__version__, "torch_threads": torch.get_num_threads(), "time": time.strftime("%Y-%m-%d %H:%M:%S")}


def write_results(name: str, result: dict[str, Any], table_md: str, results_dir: Path | None = None) -> None:
    out = Path(results_dir) if results_dir is not None else RESULTS
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(result, indent=2))
    env = result.get("environment", {})
    head = f"# {name}\n\ncommit {env.get('commit', '?')}, {env.get('cpus', '?')} CPUs, {env.get('time', '')}\n\n"
    (out / f"{name}.md").write_text(head + table_md + "\n")
    print(table_md)
