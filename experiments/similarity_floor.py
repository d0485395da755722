"""Does the retrieval similarity floor (library.manager.min_similarity) help on unseen tasks? A finished run's latest
checkpoint and library, evaluated twice on the same held-out seeds: with the run's floor and with none (0).

    python experiments/similarity_floor.py DATA_DIR [RUN_ID] [--floor 0.99] [--episodes 16] [--out similarity_floor]

Unseen dungeons have no entry of their own: without the floor each is shown the nearest other dungeon's lesson (its
task text differs only in the id, cosine <= 0.979), with the floor none. Seen dungeons are played too (their own
entries sit at 1.0: the floor must not change them). Writes benchmarks/results/<out>.{json,md}."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import environment, write_results  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("data_dir")
    ap.add_argument("run_id", type=int, nargs="?", default=0, help="default: the data dir's only (first) run")
    ap.add_argument("--floor", type=float, default=0.99)
    ap.add_argument("--episodes", type=int, default=16)
    ap.add_argument("--out", default="similarity_floor")
    args = ap.parse_args(argv)
    from core.metrics import mcnemar_test, paired_outcomes
    from core.store import ExperienceStore
    from trainers.evaluate import run_eval

    data = Path(args.data_dir).resolve()
    db = f"sqlite:///{data / 'workbench.db'}"
    store = ExperienceStore(db)
    try:
        run_id = args.run_id or store.list_runs()[0]["id"]
    finally:
        store.close()
    arms = {}
    for name, floor in (("no floor", 0.0), (f"floor {args.floor:g}", args.floor)):
        res = run_eval(run_id, data_dir=str(data), db_url=db, episodes=args.episodes, log=False,
                       overrides={"library": {"manager": {"min_similarity": floor}}})
        arms[name] = {c: {"summary": r.summary(), "by_task": r.by_task} for c, r in res.conditions.items()}
    a, b = list(arms)
    rows, out = [], []
    for cond in ("with_exp", "without_exp", "unseen_with_exp", "unseen_without_exp"):
        if cond not in arms[a]:
            continue
        x, y = arms[a][cond], arms[b][cond]
        t = paired_outcomes({k: v[0] > 0 for k, v in x["by_task"].items()}, {k: v[0] > 0 for k, v in y["by_task"].items()})
        p, method = mcnemar_test(t["a_only"], t["b_only"])
        sx, sy = x["summary"], y["summary"]
        out.append({"condition": cond, a: sx, b: sy, "paired": {**t, "p": p, "method": method}})
        rows.append(f"| {cond} | {sx['successes']}/{sx['n']} ({sx['mean_actions']:.2f} actions) | "
                    f"{sy['successes']}/{sy['n']} ({sy['mean_actions']:.2f} actions) | {t['a_only']} / {t['b_only']} | {p:.3g} |")
    md = "\n".join([f"Run {run_id} of {data} (its latest checkpoint and library), greedy, the same seeds in both arms.", "",
                    f"| condition | {a} | {b} | discordant ({a} only / {b} only) | McNemar p |", "|---|---|---|---|---|", *rows])
    write_results(args.out, {"benchmark": args.out, "environment": environment(), "argv": ["experiments/similarity_floor.py", *(argv or sys.argv[1:])],
                             "run_id": run_id, "data_dir": str(data), "floor": args.floor, "conditions": out}, md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
