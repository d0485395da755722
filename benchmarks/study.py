"""The comparison study: variants × seeds on one env, same budget, evaluated on held-out seeds with
and without experience (the shape of the paper's Table 1). Resumable: a finished run is not rerun.

    python benchmarks/study.py --quick                               # smoke: 2 variants, 1 seed, 2 steps
    python benchmarks/study.py --variants grpo,complementary --seeds 0,1,2 --steps 30
    python benchmarks/study.py --ablations --steps 30                # complementary's ablation switches

Each run is a real `comprl train` process on the embedded default (configs/minihack_room_cpu.yaml
unless --config), with `run.eval_at_start` so the starting policy is measured by the same code.
Results: benchmarks/results/study[_quick].json and .md (per run and mean ± sd per variant).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import RESULTS, environment, write_results  # noqa: E402

ABLATIONS = {
    "joint_normalization": ["loss.joint_normalization=true"],
    "all_with_experience": ["rollout.with_experience=8"],
    "no_merge": ["extractor.merge_every=0"],
    "no_search_and_ask": ["rollout.search_and_ask=0"],
    "no_diversification": ["library.manager.diversify=false"],
    "no_reweighting": ["extractor.reweight=false"],
}
KEYS = ("success_with_exp", "success_without_exp", "actions_with_exp", "actions_without_exp")


def run_one(name: str, config: Path, sets: list[str], data: Path, log: Path, timeout: int) -> dict:
    """One `comprl train` in its own data dir (its own library); returns its start and end eval metrics."""
    from core.store import ExperienceStore

    data.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "app.cli", "train", str(config), "--data-dir", str(data), "--name", name,
           "--set", "run.eval_at_start=true"] + [a for s in sets for a in ("--set", s)]
    models = ROOT / "comprl_data" / "models"  # share the built embedded models instead of rebuilding per run
    if models.exists() and not (data / "models").exists():
        (data / "models").symlink_to(models, target_is_directory=True)
    t0 = time.time()
    with log.open("w") as f:
        rc = subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, timeout=timeout,
                            env={**os.environ, "HF_HUB_OFFLINE": "1"}).returncode
    if rc != 0:
        raise RuntimeError(f"{name} failed (exit {rc}); see {log}")
    store = ExperienceStore(f"sqlite:///{data / 'workbench.db'}")
    run = store.list_runs()[0]
    rows = store.metrics_since(run["id"], [f"eval/{k}" for k in KEYS])
    first = min(s for _, _, s, _, _ in rows)
    last = max(s for _, _, s, _, _ in rows)
    pick = lambda step: {k.removeprefix("eval/"): v for _, k, s, v, _ in rows if s == step}  # noqa: E731
    lib = store.latest_metrics(run["id"])
    return {"name": name, "start": pick(first), "end": pick(last), "steps": run["step"], "seconds": time.time() - t0,
            "library_size": lib.get("library/size"), "extractor_updates": lib.get("extractor/updates"),
            "merges": lib.get("library/merges")}


def mean_sd(xs: list[float]) -> str:
    xs = [x for x in xs if x is not None]
    if not xs:
        return "–"
    return f"{statistics.mean(xs):.3f} ± {statistics.stdev(xs):.3f}" if len(xs) > 1 else f"{xs[0]:.3f}"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="a smoke run: tiny budget, one seed")
    ap.add_argument("--config", default=str(ROOT / "configs" / "minihack_room_cpu.yaml"))
    ap.add_argument("--variants", default="grpo,complementary")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--eval-episodes", type=int, default=32)
    ap.add_argument("--ablations", action="store_true", help="also run complementary with each ablation switch")
    ap.add_argument("--set", action="append", default=[], help="extra config overrides for every run")
    ap.add_argument("--out", default="", help="results name (default study or study_quick)")
    ap.add_argument("--timeout", type=int, default=4 * 3600)
    args = ap.parse_args()
    if args.quick:
        args.variants, args.seeds, args.steps, args.eval_episodes = "grpo,complementary", "0", 2, 4
        args.set += ["rollout.tasks_per_step=1", "rollout.group_size=4", "rollout.with_experience=2", "env.max_turns=6",
                     "extractor.buffer_size=4", "extractor.merge_every=2", "run.warmup_steps=0", "run.eval_every=0"]
    name = args.out or ("study_quick" if args.quick else "study")
    work = RESULTS / f"{name}_runs"
    work.mkdir(parents=True, exist_ok=True)
    plan = [(v, s, []) for v in args.variants.split(",") for s in (int(x) for x in args.seeds.split(","))]
    if args.ablations:
        plan += [(f"complementary-{a}", s, extra) for a, extra in ABLATIONS.items() for s in (int(x) for x in args.seeds.split(","))]
    results = []
    for label, seed, extra in plan:
        variant = label.split("-")[0]
        tag = f"{label}-seed{seed}"
        done = work / f"{tag}.json"
        if done.exists():  # resumable
            results.append(json.loads(done.read_text()))
            continue
        sets = [f"run.variant={variant}", f"run.seed={seed}", f"run.max_steps={args.steps}",
                f"run.eval_episodes={args.eval_episodes}", "run.checkpoint_every=1000", *args.set, *extra]
        print(f"== {tag}", flush=True)
        r = run_one(tag, Path(args.config), sets, work / tag, work / f"{tag}.log", args.timeout)
        r.update({"label": label, "variant": variant, "seed": seed})
        done.write_text(json.dumps(r, indent=2))
        results.append(r)
    # table: per label, mean ± sd over seeds of the end-of-training eval, and the start for reference
    labels = list(dict.fromkeys(r["label"] for r in results))
    lines = [f"Budget: {args.steps} steps per run; eval on {args.eval_episodes} held-out seeds per condition, greedy.", "",
             "| variant | seeds | success without exp (start → end) | success with exp (end) | actions without (end) | actions with (end) | library | extractor updates |",
             "|---|---:|---|---|---|---|---:|---:|"]
    for lab in labels:
        rs = [r for r in results if r["label"] == lab]
        start = mean_sd([r["start"].get("success_without_exp") for r in rs])
        lines.append(f"| {lab} | {len(rs)} | {start} → {mean_sd([r['end'].get('success_without_exp') for r in rs])} | "
                     f"{mean_sd([r['end'].get('success_with_exp') for r in rs])} | {mean_sd([r['end'].get('actions_without_exp') for r in rs])} | "
                     f"{mean_sd([r['end'].get('actions_with_exp') for r in rs])} | {mean_sd([r.get('library_size') for r in rs])} | "
                     f"{mean_sd([r.get('extractor_updates') for r in rs])} |")
    write_results(name, {"benchmark": name, "environment": environment(), "args": vars(args), "runs": results}, "\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
