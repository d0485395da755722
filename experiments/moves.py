"""What a MiniHack run's policy does, by blocks of training steps, from the episodes the run stored:
success, mean actions, the share of moves that walked into rock or a wall (the next observation
says "It's solid stone" or similar), and the most frequent moves. It tells a policy that learns to
react to what it sees (bumps fall, the move mix follows the observation) from one whose move
marginal drifts toward whatever the last steps' layouts rewarded.

    python experiments/moves.py RUN_DATA_DIR [RUN_DATA_DIR ...] [--block 5] [--out moves_cpu_default]

RUN_DATA_DIR is a run's data folder (holding workbench.db), e.g. benchmarks/results/study_cpu_default_runs/grpo-seed0.
Only training episodes are read (held-out evaluation episodes are not stored). Writes
benchmarks/results/<out>.json and .md.
"""
from __future__ import annotations

import argparse
import collections
import json
import sqlite3
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import environment, write_results  # noqa: E402

BUMP = ("solid stone", "You can't move", "There is a wall", "It's a wall")


def blocks(db_path: Path, block: int) -> list[dict]:
    db = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
    try:
        rows = db.execute("select step, success, num_actions, steps from trajectories where run_id is not null "
                          "and env like 'minihack/%' order by step").fetchall()
    finally:
        db.close()
    acc: dict[int, dict] = {}
    for step, success, actions, steps in rows:
        b = acc.setdefault((step - 1) // block, {"episodes": 0, "successes": 0, "actions": 0, "turns": 0, "bumps": 0,
                                                   "moves": collections.Counter()})
        turns = [t for t in json.loads(steps) if t.get("kind", "action") == "action"]
        b["episodes"] += 1
        b["successes"] += int(success)
        b["actions"] += actions
        for i, t in enumerate(turns):
            nxt = turns[i + 1]["observation"] if i + 1 < len(turns) else ""
            b["turns"] += 1
            b["bumps"] += any(m in nxt for m in BUMP)
            b["moves"][t["action"]] += 1
    out = []
    for k in sorted(acc):
        b = acc[k]
        out.append({"steps": [k * block + 1, k * block + block], "episodes": b["episodes"],
                    "success": b["successes"] / b["episodes"], "mean_actions": b["actions"] / b["episodes"],
                    "bump_rate": b["bumps"] / max(1, b["turns"]),
                    "top_moves": [[m, c / max(1, b["turns"])] for m, c in b["moves"].most_common(4)]})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("runs", nargs="+", help="run data folders (each with workbench.db)")
    ap.add_argument("--block", type=int, default=5, help="training steps per row")
    ap.add_argument("--out", default="moves")
    args = ap.parse_args(argv)
    res, lines = {}, ["| run | steps | episodes | success | mean actions | bumps per move | most frequent moves |",
                      "|---|---|---:|---:|---:|---:|---|"]
    for r in args.runs:
        db = Path(r) / "workbench.db"
        if not db.is_file():
            ap.error(f"{db} does not exist: give a run's data folder")
        rows = blocks(db, args.block)
        label = "/".join(Path(r).resolve().parts[-2:])  # e.g. study_runs/grpo-seed0: names repeat across studies
        res[label] = rows
        for b in rows:
            top = ", ".join(f"{m} {f:.2f}" for m, f in b["top_moves"])
            lines.append(f"| {label} | {b['steps'][0]}–{b['steps'][1]} | {b['episodes']} | {b['success']:.3f} | "
                         f"{b['mean_actions']:.2f} | {b['bump_rate']:.3f} | {top} |")
    write_results(args.out, {"benchmark": "moves", "environment": environment(),
                             "argv": ["python", "experiments/moves.py", *(argv if argv is not None else sys.argv[1:])],
                             "block": args.block, "runs": res}, "\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
