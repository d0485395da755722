"""Held-out success of several policies on the same seeds, side by side: the starting policy against
a run's end checkpoints, with enough episodes to tell a change from sampling noise (a run's own
periodic evaluation uses 32–64 and its sampled read moves by about 0.1 between two seeds of the
same model).

    python experiments/heldout.py --policy start=comprl_data/models/policy \
        --policy seed0=benchmarks/results/study_cpu_default_runs/grpo-seed0/runs/1/checkpoints/step_40/policy \
        --episodes 512 --modes sampled,greedy --out heldout_cpu_default

Every policy plays the same held-out seeds (configs' `env.eval_seed_offset` on), without experience,
on the config's env and turn limit; a run given by its data dir (`--run NAME=DATA_DIR`) plays its latest
checkpoint without and, if it uses experience, with its own end-of-run library (the paper's with/without
gap, at Table-1 sample sizes); sampled episodes at the config's rollout temperature with the
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

from benchmarks.common import environment, run_in, write_results  # noqa: E402


def run_policy(data_dir: Path) -> tuple[str, str]:
    """(the run's stored config, its latest checkpoint's policy folder) for a study run's data dir."""
    found = run_in(data_dir)
    if found is None:
        raise ValueError(f"{data_dir} has no workbench.db with a run: give a run's data dir "
                         "(e.g. benchmarks/results/<study>_runs/<tag>)")
    run, ck = found
    if ck is None or not (ck / "policy" / "config.json").is_file():
        raise ValueError(f"run {run['id']} in {data_dir} has no checkpoint with a policy")
    return run["config"], str(ck / "policy")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default=str(ROOT / "configs" / "minihack_room_cpu.yaml"))
    ap.add_argument("--policy", action="append", dest="items", default=[], type=lambda v: ("policy", v), metavar="NAME=FOLDER",
                    help="a policy model folder, played without experience; the first policy or run is the reference (repeat)")
    ap.add_argument("--run", action="append", dest="items", type=lambda v: ("run", v), metavar="NAME=DATA_DIR",
                    help="a run's data dir: its latest checkpoint, played without and (if the run uses experience) "
                         "with its own library at its end (repeat)")
    ap.add_argument("--episodes", type=int, default=256, help="held-out seeds per policy and mode")
    ap.add_argument("--modes", default="sampled,greedy", help="comma-separated: sampled, greedy")
    ap.add_argument("--seed", type=int, default=0, help="sampling seed (the same for every policy)")
    ap.add_argument("--out", default="heldout")
    argv = sys.argv[1:] if argv is None else argv
    args = ap.parse_args(argv)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or set(modes) - {"sampled", "greedy"}:
        ap.error("--modes takes sampled and/or greedy")
    if not args.items:
        ap.error("give at least one --policy NAME=MODEL_FOLDER or --run NAME=DATA_DIR")
    policies: list[tuple[str, str, str | None, Path | None]] = []  # (name, model folder, a run's config and data dir)
    for kind, item in args.items:  # in command-line order
        name, sep, folder = item.partition("=")
        if kind == "policy":
            if not sep or not name or not (Path(folder) / "config.json").is_file():
                ap.error(f"--policy wants NAME=MODEL_FOLDER (a folder with config.json), got {item!r}")
            policies.append((name, folder, None, None))
        else:
            if not sep or not name:
                ap.error(f"--run wants NAME=DATA_DIR, got {item!r}")
            try:
                run_cfg, policy = run_policy(Path(folder))
            except ValueError as e:
                ap.error(f"--run {item!r}: {e}")
            policies.append((name, policy, run_cfg, Path(folder)))
    if len({p[0] for p in policies}) < len(policies):
        ap.error("policy and run names must differ")

    import torch

    from core.metrics import two_proportion_test
    from core.store import ExperienceStore
    from trainers.config import load_run_config
    from trainers.evaluate import _roller_for, eval_manager, evaluate_policy

    torch.set_num_threads(1)
    cfg = load_run_config(args.config)
    cfg.run.seed = args.seed  # the Roller's sampling seed: the same for every policy
    envs = list(cfg.env.names)
    rows: list[dict] = []
    for name, folder, run_cfg, data_dir in policies:
        manager, pcfg = None, cfg
        if run_cfg is not None:
            pcfg = load_run_config(run_cfg)
            if list(pcfg.env.names) != envs or pcfg.env.max_turns != cfg.env.max_turns:
                ap.error(f"run {name!r} played {list(pcfg.env.names)} with {pcfg.env.max_turns} turns, not the "
                         f"--config's {envs} with {cfg.env.max_turns}")
            pcfg.run.seed = args.seed
            if pcfg.uses_experience:
                store = ExperienceStore(f"sqlite:///{data_dir / 'workbench.db'}")
                manager = eval_manager(store, pcfg)
        roller, router, pool = _roller_for(pcfg, folder, manager, min(args.episodes, 64))
        t0 = time.time()
        try:
            res = evaluate_policy(roller, router, envs, n=args.episodes, seed_offset=cfg.env.eval_seed_offset,
                                  with_experience=(False, True) if manager is not None else (False,),
                                  sampled="sampled" in modes, greedy_decoding="greedy" in modes)
        finally:
            pool.close()
            if manager is not None:
                manager.close()
                store.close()
        for cond, c in res.conditions.items():
            rows.append({"policy": name, "folder": folder, "mode": "sampled" if cond.endswith("_sampled") else "greedy",
                         "experience": cond.startswith("with_exp"), **c.summary(), "seconds": round(time.time() - t0, 1)})
        print(f"{name}: done in {time.time() - t0:.0f} s", flush=True)
    ref = {r["mode"]: r for r in rows if r["policy"] == policies[0][0] and not r["experience"]}
    for r in rows:
        b = ref[r["mode"]]
        r["diff_vs_first"], r["p_value_vs_first"] = two_proportion_test(r["successes"], r["n"], b["successes"], b["n"])
    names = [p[0] for p in policies]
    lines = [f"{args.episodes} held-out seeds (from {cfg.env.eval_seed_offset}) of {', '.join(envs)}, "
             f"turn limit {cfg.env.max_turns}; sampled at temperature {cfg.actor.temperature} with sampling seed {args.seed}. "
             f"A run (`--run`) plays its latest checkpoint, with its own end-of-run library where it has one. "
             f"Differences are against `{names[0]}` without experience (two-proportion z-test).", "",
             "| policy | experience | mode | success | 95% CI | mean actions | diff vs first | p |",
             "|---|---|---|---:|---|---:|---:|---:|"]
    for r in sorted(rows, key=lambda r: (r["mode"], names.index(r["policy"]), r["experience"])):
        lines.append(f"| {r['policy']} | {'with' if r['experience'] else 'without'} | {r['mode']} | "
                     f"{r['successes']}/{r['n']} = {r['rate']:.3f} | [{r['ci_low']:.3f}, {r['ci_high']:.3f}] | "
                     f"{r['mean_actions']:.2f} | {r['diff_vs_first']:+.3f} | {r['p_value_vs_first']:.3g} |")
    gaps = []
    for name in names:
        for mode in modes:
            w = [r for r in rows if (r["policy"], r["mode"]) == (name, mode)]
            if len(w) == 2:
                wo, wi = sorted(w, key=lambda r: r["experience"])
                d, p = two_proportion_test(wi["successes"], wi["n"], wo["successes"], wo["n"])
                gaps.append({"policy": name, "mode": mode, "with": wi["rate"], "without": wo["rate"], "diff": d, "p_value": p})
    if gaps:
        lines += ["", "With experience against without, per policy (the paper's with/without gap):", "",
                  "| policy | mode | without | with | with − without | p |", "|---|---|---:|---:|---:|---:|"]
        lines += [f"| {g['policy']} | {g['mode']} | {g['without']:.3f} | {g['with']:.3f} | {g['diff']:+.3f} | {g['p_value']:.3g} |"
                  for g in gaps]
    write_results(args.out, {"benchmark": "heldout", "environment": environment(),
                             "argv": ["python", "experiments/heldout.py", *argv],
                             "config": str(Path(args.config).resolve().relative_to(ROOT)) if Path(args.config).resolve().is_relative_to(ROOT) else args.config,
                             "episodes": args.episodes, "modes": modes, "rows": rows, "gaps": gaps}, "\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
