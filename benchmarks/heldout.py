"""Held-out success of several policies on the same seeds, side by side: the starting policy against
a run's end checkpoints, with enough episodes to tell a change from sampling noise (a run's own
periodic evaluation uses 32–64 and its sampled read moves by about 0.1 between two seeds of the
same model).

    python benchmarks/heldout.py --policy start=comprl_data/models/policy \
        --policy seed0=benchmarks/results/study_cpu_default_runs/grpo-seed0/runs/1/checkpoints/step_40/policy \
        --episodes 512 --modes sampled,greedy --out heldout_cpu_default

Every policy plays the same held-out seeds (configs' `env.eval_seed_offset` on), without experience,
on the config's env and turn limit; sampled episodes at the config's rollout temperature with the
same sampling seeds. Each row after the first is compared with the first by a two-proportion
z-test. Writes benchmarks/results/<out>.json and .md.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from benchmarks.common import environment, write_results  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default=str(ROOT / "configs" / "minihack_room_cpu.yaml"))
    ap.add_argument("--policy", action="append", required=True, metavar="NAME=FOLDER",
                    help="a policy model folder; the first is the reference (repeat)")
    ap.add_argument("--episodes", type=int, default=256, help="held-out seeds per policy and mode")
    ap.add_argument("--modes", default="sampled,greedy", help="comma-separated: sampled, greedy")
    ap.add_argument("--seed", type=int, default=0, help="sampling seed (the same for every policy)")
    ap.add_argument("--out", default="heldout")
    args = ap.parse_args(argv)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or set(modes) - {"sampled", "greedy"}:
        ap.error("--modes takes sampled and/or greedy")
    policies = []
    for item in args.policy:
        name, sep, folder = item.partition("=")
        if not sep or not name or not (Path(folder) / "config.json").is_file():
            ap.error(f"--policy wants NAME=MODEL_FOLDER (a folder with config.json), got {item!r}")
        policies.append((name, folder))

    import torch

    from core.metrics import two_proportion_test
    from trainers.config import load_run_config
    from trainers.evaluate import _roller_for, evaluate_policy

    torch.set_num_threads(1)
    cfg = load_run_config(args.config)
    cfg.run.seed = args.seed  # the Roller's sampling seed: the same for every policy
    envs = list(cfg.env.names)
    rows: list[dict] = []
    for name, folder in policies:
        roller, router, pool = _roller_for(cfg, folder, None, min(args.episodes, 64))
        t0 = time.time()
        try:
            res = evaluate_policy(roller, router, envs, n=args.episodes, seed_offset=cfg.env.eval_seed_offset,
                                  with_experience=(False,), sampled="sampled" in modes, greedy_decoding="greedy" in modes)
        finally:
            pool.close()
        for cond, c in res.conditions.items():
            rows.append({"policy": name, "folder": folder, "mode": "sampled" if cond.endswith("_sampled") else "greedy",
                         **c.summary(), "seconds": round(time.time() - t0, 1)})
        print(f"{name}: done in {time.time() - t0:.0f} s", flush=True)
    ref = {r["mode"]: r for r in rows if r["policy"] == policies[0][0]}
    for r in rows:
        b = ref[r["mode"]]
        r["diff_vs_first"], r["p_value_vs_first"] = two_proportion_test(r["successes"], r["n"], b["successes"], b["n"])
    lines = [f"{args.episodes} held-out seeds (from {cfg.env.eval_seed_offset}) of {', '.join(envs)}, without experience, "
             f"turn limit {cfg.env.max_turns}; sampled at temperature {cfg.actor.temperature} with sampling seed {args.seed}. "
             f"Differences are against `{policies[0][0]}` (two-proportion z-test).", "",
             "| policy | mode | success | 95% CI | mean actions | diff vs first | p |", "|---|---|---:|---|---:|---:|---:|"]
    for r in sorted(rows, key=lambda r: (r["mode"], [p for p, _ in policies].index(r["policy"]))):
        lines.append(f"| {r['policy']} | {r['mode']} | {r['successes']}/{r['n']} = {r['rate']:.3f} | "
                     f"[{r['ci_low']:.3f}, {r['ci_high']:.3f}] | {r['mean_actions']:.2f} | {r['diff_vs_first']:+.3f} | "
                     f"{r['p_value_vs_first']:.3g} |")
    write_results(args.out, {"benchmark": "heldout", "environment": environment(),
                             "argv": ["python", "benchmarks/heldout.py", *(argv if argv is not None else sys.argv[1:])],
                             "config": str(Path(args.config).resolve().relative_to(ROOT)) if Path(args.config).resolve().is_relative_to(ROOT) else args.config,
                             "episodes": args.episodes, "modes": modes, "rows": rows}, "\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
