"""The extractor's credit, audited after the fact from a run's store: does an entry whose claim is right raise its
readers' success more than a wrong one, once the task's difficulty is taken out, and where are right entries written?

    python benchmarks/credit_audit.py /work/diag/comp-s0 /work/diag/comp-s1 --out credit_audit_coevolution

For every with-experience episode of a run (its training episodes, not its evaluations) the audit takes the entry it
read (top-1), checks its claim against the task's layout (envs/entry_check.py, the checker the run's library curves
use) and compares the episode's success with the same task's experience-free episodes of the same step (the
GRPO group's other half): the *gain* an entry of that verdict brought. It also counts every entry the run wrote by
verdict, by where its source episode came from (its debrief stated the layout or not; merged), and by how hard its
task is without experience (the task's experience-free success over the run). The online metrics
(extractor/reward_gap, extractor/relative_reward_gap) average per step and drop steps without a right entry; this
reads every episode at once. Needs nothing but the data dirs (a study's `--results-dir` keeps them).
"""
from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import environment, write_results  # noqa: E402

VERDICTS = ("right", "wrong", "no_claim")


def audit(data_dir: Path) -> dict[str, Any]:
    """The audit of the (first) run in `data_dir`."""
    from core.store import ExperienceStore
    from envs.entry_check import EntryChecker

    store = ExperienceStore(f"sqlite:///{data_dir / 'workbench.db'}")
    checker = EntryChecker()
    try:
        run = store.list_runs()[0]
        entries = store.list_entries(status=None, limit=10**7).entries
        entries = [e for e in entries if e.run_id in (None, run["id"])]
        verdict = {e.id: checker.verdict(e.env, e.task, e.text) for e in entries}
        trajs = [t for t in store.list_trajectories(run_id=run["id"], limit=10**7) if t["ab_test_id"] is None]
        free: dict[tuple[int, str], list[bool]] = collections.defaultdict(list)
        task_free: dict[str, list[bool]] = collections.defaultdict(list)
        for t in trajs:
            if not t["with_experience"]:
                free[(t["step"], t["task"])].append(bool(t["success"]))
                task_free[t["task"]].append(bool(t["success"]))
        created = {e.id: e.created_step for e in entries}
        read: dict[str, list[tuple[bool, float, int]]] = collections.defaultdict(list)
        for t in trajs:
            if not t["with_experience"] or not free[(t["step"], t["task"])]:
                continue
            ids = store.get_trajectory(t["id"])["experience_ids"]
            if not ids:
                continue
            same = free[(t["step"], t["task"])]
            age = t["step"] - created.get(int(ids[0]), t["step"])  # steps between the entry's writing and this read
            read[verdict.get(int(ids[0]), "deleted")].append((bool(t["success"]), sum(same) / len(same), age))
        rows = []
        for v in (*VERDICTS, "deleted"):
            rs = read.get(v, [])
            if rs:
                s, b = sum(r[0] for r in rs) / len(rs), sum(r[1] for r in rs) / len(rs)
                rows.append({"verdict": v, "episodes": len(rs), "success": round(s, 3), "free_success": round(b, 3),
                             "gain": round(s - b, 3), "mean_age_steps": round(sum(r[2] for r in rs) / len(rs), 2),
                             "read_within_5_steps": round(sum(r[2] <= 5 for r in rs) / len(rs), 3)})

        def origin(e: Any) -> str:
            if e.source.value == "merged":
                return "merged"
            prompt = e.generation.prompt if e.generation else ""
            return "stated" if "Debrief: the staircase" in prompt else "unstated" if "never saw" in prompt else "other"

        written = collections.Counter((origin(e), verdict[e.id]) for e in entries)
        by_ease: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        for e in entries:
            f = task_free.get(e.task, [])
            ease = sum(f) / len(f) if f else float("nan")
            band = "no free episodes" if not f else "<0.25" if ease < 0.25 else "0.25-0.5" if ease < 0.5 else ">=0.5"
            by_ease[band][verdict[e.id]] += 1
        return {"data_dir": str(data_dir), "run": data_dir.name, "run_name": run["name"], "variant": run.get("variant", ""), "steps": run["step"],
                "read": rows, "written": [{"origin": o, "verdict": v, "entries": n} for (o, v), n in sorted(written.items())],
                "written_by_task_free_success": {b: dict(c) for b, c in sorted(by_ease.items())}}
    finally:
        checker.close()
        store.close()


def table(results: list[dict[str, Any]]) -> str:
    md = ["Per with-experience training episode, the top entry it read, by the checker's verdict on that entry's "
          "claim: its success, the success of the same task's experience-free episodes of the same step, and the "
          "difference (the gain); and how old the entry was when read (steps since it was written; the share read "
          "within 5 steps of its writing).", "",
          "| run | steps | entry read | episodes | success | experience-free, same step | gain | age (steps) | read within 5 steps |",
          "|---|---:|---|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        md += [f"| {r['run']} | {r['steps']} | {x['verdict']} | {x['episodes']} | {x['success']:.3f} | {x['free_success']:.3f} | "
               f"{x['gain']:+.3f} | {x.get('mean_age_steps', float('nan')):.1f} | {x.get('read_within_5_steps', float('nan')):.3f} |"
               for x in r["read"]]
    md += ["", "Every entry the run wrote, by where it came from (the source episode's debrief stated where the staircase "
           "was, or not; merged) and its verdict; and by its task's success without experience over the run.", "",
           "| run | written from | right | wrong | no claim | right share |", "|---|---|---:|---:|---:|---:|"]
    for r in results:
        by: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        for w in r["written"]:
            by[w["origin"]][w["verdict"]] += w["entries"]
        for o, c in sorted(by.items()):
            n = sum(c.values())
            md.append(f"| {r['run']} | {o} | {c['right']} | {c['wrong']} | {c['no_claim']} | {c['right'] / max(1, n):.3f} |")
    md += ["", "| run | task's experience-free success | right | wrong | no claim |", "|---|---|---:|---:|---:|"]
    for r in results:
        md += [f"| {r['run']} | {b} | {c.get('right', 0)} | {c.get('wrong', 0)} | {c.get('no_claim', 0)} |"
               for b, c in r["written_by_task_free_success"].items()]
    return "\n".join(md)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("data_dirs", nargs="+", type=Path, help="run data dirs (each with workbench.db)")
    ap.add_argument("--out", default="credit_audit")
    args = ap.parse_args(argv)
    missing = [d for d in args.data_dirs if not (d / "workbench.db").is_file()]
    if missing:
        raise SystemExit(f"no workbench.db in {', '.join(map(str, missing))}: pass run data dirs")
    results = [audit(d) for d in args.data_dirs]
    write_results(args.out, {"benchmark": "credit_audit", "environment": environment(), "argv": sys.argv, "runs": results},
                  table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
