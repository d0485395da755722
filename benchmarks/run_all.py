"""`make bench`: every benchmark, one after the other, then one combined JSON and markdown table.

    python benchmarks/run_all.py [--quick]
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
BENCHES = ["bench_retrieval", "bench_ray_manager", "bench_envs", "bench_training", "bench_merge", "bench_ui"]


def main() -> int:
    extra = [a for a in sys.argv[1:] if a == "--quick"]
    failed = []
    for name in BENCHES:
        script = ROOT / "benchmarks" / f"{name}.py"
        if not script.exists():
            failed.append(f"{name} (missing)")
            continue
        print(f"== {name}", flush=True)
        if subprocess.run([sys.executable, str(script), *extra], cwd=ROOT).returncode != 0:
            failed.append(name)
    combined, md = {}, ["# All benchmarks", ""]
    for name in BENCHES:
        j, m = RESULTS / f"{name}.json", RESULTS / f"{name}.md"
        if j.exists():
            combined[name] = json.loads(j.read_text())
            md += [m.read_text(), ""]
    (RESULTS / "all.json").write_text(json.dumps(combined, indent=2))
    (RESULTS / "all.md").write_text("\n".join(md))
    if failed:
        print("failed: " + ", ".join(failed), file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
