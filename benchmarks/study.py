"""The comparison study: variants × seeds on one env, same budget, evaluated on held-out seeds with
and without experience (the shape of the paper's Table 1). Resumable: a finished run is not rerun.

    python benchmarks/study.py --quick                               # smoke: 2 variants, 1 seed, 2 steps
    python benchmarks/study.py --variants grpo,static,exp_only,complementary --seeds 0,1,2 --steps 30
    python benchmarks/study.py --variants complementary --ablations --ablation-seeds 0 --steps 30

An interrupted run continues from its latest checkpoint; `--extend` continues finished runs to a larger
--steps (the same run: its curves, library and start evaluation carry on).

Each run is a real `comprl train` process on the embedded default (configs/minihack_room_cpu.yaml
unless --config), with `run.eval_at_start` so the starting policy is measured by the same code.
Models: when <data-dir>/models/{policy,extractor} exist, every run's data dir links `models` to them;
otherwise `--quick` builds tiny models once into <results-dir>/<name>_runs/_models (a fresh clone
works), and a full study lets each run build the defaults itself (`comprl train` does).
Results: <results-dir>/<name>.json (per run: start/end eval, learning curves) and .md (per variant
mean ± sd over seeds, pooled Wilson 95% CI of the end success, the commit that ran it).
`benchmarks/report.py` turns them into docs/results.md with figures.
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
KEYS = ("success_with_exp", "success_without_exp", "actions_with_exp", "actions_without_exp",
        "success_with_exp_sampled", "success_without_exp_sampled")
VARIANTS = ("grpo", "static", "exp_only", "complementary")  # METHOD.md "Baselines"
CURVES = ("policy/success_with_exp", "policy/success_without_exp", "policy/reward_with_exp", "policy/reward_without_exp",
          "policy/actions_with_exp", "policy/actions_without_exp", "policy/entropy", "policy/frac_nonzero_adv",
          "extractor/reward_mean", "extractor/updates", "library/size")  # plus every eval/* key
QUICK_SETS = ["rollout.tasks_per_step=1", "rollout.group_size=4", "rollout.with_experience=2", "env.max_turns=6",
              "extractor.buffer_size=4", "extractor.merge_every=2", "run.warmup_steps=0", "run.eval_every=0"]


def tiny_warmstart(config: Path):
    """A warm start that builds in about a minute on a busy 2-core CPU: a 0.2M-parameter policy that
    reaches the stairs about half the time and an extractor whose answers parse, so the quick study
    exercises retrieval and the library (measured: 45 s; 20+10 SFT steps left the extractor unparseable)."""
    import yaml

    from trainers.warmstart import WarmStartConfig

    try:
        names = list((yaml.safe_load(config.read_text()) or {}).get("env", {}).get("names", {}))
    except (OSError, yaml.YAMLError, AttributeError):
        names = []
    envs = [n for n in names if n.startswith(("minihack/", "alfworld/"))] or ["minihack/Room-Random-5x5"]
    return WarmStartConfig(envs=envs, demo_episodes=24, dagger_episodes=0, policy_steps=300, extractor_steps=300,
                           eval_episodes=1, eval_extractor=2, batch_size=4, extractor_batch_size=2, lr=3e-3, warmup_steps=10,
                           policy_hidden=64, policy_layers=2, policy_heads=2, policy_kv_heads=1, extractor_hidden=64,
                           extractor_layers=2, extractor_heads=2, extractor_kv_heads=1, max_seq_len=4000,
                           extractor_max_new_tokens=200)


def prepare_models(data_dir: Path, work: Path, quick: bool, config: Path) -> tuple[Path | None, list[str]]:
    """(the models folder every run links to, extra --set overrides). Existing models in data_dir are
    shared; with --quick and none, tiny ones are built once under work/_models and named by path, so
    a run never calls ensure_models with the default config on them (that would rebuild them)."""
    models = data_dir / "models"
    if (models / "policy").is_dir() and (models / "extractor").is_dir():
        from trainers.warmstart import MARKER, WarmStartConfig

        try:
            built = json.loads((models / "policy" / MARKER).read_text()).get("hash")
        except (OSError, json.JSONDecodeError):
            built = None
        if built != WarmStartConfig().digest():  # comprl train's ensure_models would rebuild them through the link
            print(f"note: {models} was not built with the current default WarmStartConfig; the first run "
                  "rebuilds it there (about 10 minutes)", flush=True)
        return models, []
    if not quick:
        return None, []  # each run builds the defaults into its own data dir (comprl train -> ensure_models)
    from trainers.warmstart import ensure_models

    t0 = time.time()
    print(f"== tiny models (built once, then reused) in {work / '_models'}", flush=True)
    paths = ensure_models(work / "_models", tiny_warmstart(config), progress=False)
    print(f"   ready in {time.time() - t0:.0f} s", flush=True)
    return work / "_models" / "models", [f"actor.path={paths['policy']}", f"extractor.model.path={paths['extractor']}"]


def read_curves(store, run_id: int) -> dict[str, list[list[float]]]:
    """{key: [[step, value], ...]} for CURVES and every eval/* key; a step logged twice keeps its last value."""
    keys = [k for k in CURVES] + [k for k in store.metric_keys(run_id) if k.startswith("eval/")]
    out: dict[str, list[list[float]]] = {}
    for key in keys:
        ser = store.metric_series_since(run_id, key)
        if not len(ser["step"]):
            continue
        by_step = {int(st): float(v) for st, v in zip(ser["step"], ser["value"])}
        out[key] = [[st, by_step[st]] for st in sorted(by_step)]
    return out


def curves_of(data: Path) -> dict[str, list[list[float]]]:
    """The curves of the (only) run in a finished run's data dir."""
    from core.store import ExperienceStore

    store = ExperienceStore(f"sqlite:///{data / 'workbench.db'}")
    try:
        return read_curves(store, store.list_runs()[0]["id"])
    finally:
        store.close()


def eval_n(run: dict, fallback: int) -> int:
    """Held-out episodes per eval condition: run.eval_episodes × the number of envs in the run's config."""
    import yaml

    try:
        cfg = yaml.safe_load(run.get("config") or "") or {}
        return int(cfg["run"]["eval_episodes"]) * max(1, len(cfg["env"]["names"]))
    except (yaml.YAMLError, KeyError, TypeError, ValueError):
        return fallback


def resumable_run(data: Path) -> tuple[int, int] | None:
    """(run id, checkpointed step) of the run an earlier invocation left in `data`, if it has a checkpoint."""
    from core.store import ExperienceStore
    from trainers.engine import latest_checkpoint

    if not (data / "workbench.db").is_file():
        return None
    store = ExperienceStore(f"sqlite:///{data / 'workbench.db'}")
    try:
        runs = store.list_runs()
    finally:
        store.close()
    for run in sorted(runs, key=lambda r: r["id"]):  # the study makes one run per data dir: the first
        ckpt = latest_checkpoint(Path(run["checkpoint_dir"])) if run.get("checkpoint_dir") else None
        if ckpt is not None:
            return run["id"], int(ckpt.name.rsplit("_", 1)[-1])
        return None
    return None


def run_one(name: str, config: Path, sets: list[str], data: Path, log: Path, timeout: int, models: Path | None,
            eval_episodes: int) -> dict:
    """One `comprl train` in its own data dir (its own library); returns its start and end eval metrics and curves.
    A run an earlier invocation left there (interrupted, or finished with fewer steps: --extend) continues from
    its latest checkpoint with `--resume`, so its curves, library and start evaluation carry on."""
    from core.store import ExperienceStore

    data.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "app.cli", "train", str(config), "--data-dir", str(data), "--name", name,
           "--set", "run.eval_at_start=true"] + [a for s in sets for a in ("--set", s)]
    prior = resumable_run(data)
    if prior is not None:
        cmd[cmd.index("--name"):cmd.index("--name")] = ["--resume", str(prior[0])]
        print(f"   continuing run {prior[0]} of {data.name} from its step-{prior[1]} checkpoint", flush=True)
    if models is not None and not (data / "models").exists():  # share the built models instead of rebuilding per run
        (data / "models").symlink_to(models.resolve(), target_is_directory=True)
    t0 = time.time()
    with log.open("a" if prior is not None else "w") as f:
        rc = subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, timeout=timeout,
                            env={**os.environ, "HF_HUB_OFFLINE": "1"}).returncode
    if rc != 0:
        raise RuntimeError(f"{name} failed (exit {rc}); see {log}")
    store = ExperienceStore(f"sqlite:///{data / 'workbench.db'}")
    try:
        run = store.list_runs()[0]
        rows = store.metrics_since(run["id"], [f"eval/{k}" for k in KEYS])
        first = min(s for _, _, s, _, _ in rows)
        last = max(s for _, _, s, _, _ in rows)
        pick = lambda step: {k.removeprefix("eval/"): v for _, k, s, v, _ in rows if s == step}  # noqa: E731
        lib = store.latest_metrics(run["id"])
        curves = read_curves(store, run["id"])
    finally:
        store.close()
    return {"name": name, "start": pick(first), "end": pick(last), "steps": run["step"], "seconds": time.time() - t0,
            "eval_n": eval_n(run, eval_episodes), "library_size": lib.get("library/size"),
            "extractor_updates": lib.get("extractor/updates"), "merges": lib.get("library/merges"),
            "command": cmd, "curves": curves, **({"continued_from_step": prior[1]} if prior is not None else {})}


def mean_sd(xs: list[float]) -> str:
    xs = [x for x in xs if x is not None]
    if not xs:
        return "–"
    return f"{statistics.mean(xs):.3f} ± {statistics.stdev(xs):.3f}" if len(xs) > 1 else f"{xs[0]:.3f}"


def mean_of(xs: list[float]) -> str:
    xs = [x for x in xs if x is not None]
    return f"{statistics.mean(xs):.2f}" if xs else "–"


def pooled_ci(runs: list[dict], key: str, fallback_n: int) -> str:
    """Pooled end success over seeds (successes / episodes) with its Wilson 95% interval."""
    from core.metrics import wilson_interval

    k = n = 0
    for r in runs:
        rate = r["end"].get(key)
        if rate is None:
            continue
        m = int(r.get("eval_n") or fallback_n)
        k, n = k + round(rate * m), n + m
    if not n:
        return "–"
    lo, hi = wilson_interval(k, n)
    return f"{k}/{n} [{lo:.2f}, {hi:.2f}]"


def table(results: list[dict], args: argparse.Namespace, commit: str) -> str:
    """Per label: mean ± sd over seeds of the start and end eval, pooled end success with its CI, and the commit."""
    labels = list(dict.fromkeys(r["label"] for r in results))
    lines = [f"Budget: {args.steps} steps per run; eval on {args.eval_episodes} held-out seeds per condition, greedy, and "
             f"sampled at the rollout temperature where the run measured it (runs before the sampled eval show –). "
             f"Study written at commit {commit}; the commit column is the one each run was made with.", "",
             "| variant | seeds | success without exp (start → end) | without, end pooled [95% CI] | success with exp (start → end) "
             "| with, end pooled [95% CI] | sampled without (start → end) | sampled with (start → end) "
             "| actions without (start → end) | actions with (start → end) | library | extractor updates | commit |",
             "|---|---:|---|---|---|---|---|---|---|---|---:|---:|---|"]
    for lab in labels:
        rs = [r for r in results if r["label"] == lab]
        col = lambda when, k: [r[when].get(k) for r in rs]  # noqa: E731
        commits = ", ".join(dict.fromkeys(r.get("commit") or "?" for r in rs))
        lines.append(
            f"| {lab} | {len(rs)} | {mean_sd(col('start', 'success_without_exp'))} → {mean_sd(col('end', 'success_without_exp'))} | "
            f"{pooled_ci(rs, 'success_without_exp', args.eval_episodes)} | "
            f"{mean_sd(col('start', 'success_with_exp'))} → {mean_sd(col('end', 'success_with_exp'))} | "
            f"{pooled_ci(rs, 'success_with_exp', args.eval_episodes)} | "
            f"{mean_sd(col('start', 'success_without_exp_sampled'))} → {mean_sd(col('end', 'success_without_exp_sampled'))} | "
            f"{mean_sd(col('start', 'success_with_exp_sampled'))} → {mean_sd(col('end', 'success_with_exp_sampled'))} | "
            f"{mean_of(col('start', 'actions_without_exp'))} → {mean_of(col('end', 'actions_without_exp'))} | "
            f"{mean_of(col('start', 'actions_with_exp'))} → {mean_of(col('end', 'actions_with_exp'))} | "
            f"{mean_sd([r.get('library_size') for r in rs])} | {mean_sd([r.get('extractor_updates') for r in rs])} | {commits} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="a smoke run: tiny budget, one seed, tiny models if none are built")
    ap.add_argument("--config", default=str(ROOT / "configs" / "minihack_room_cpu.yaml"))
    ap.add_argument("--variants", default="grpo,complementary", help=f"comma-separated, of {','.join(VARIANTS)}")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--steps", type=int, default=None, help="steps per run (default 30; 2 with --quick)")
    ap.add_argument("--eval-episodes", type=int, default=32)
    ap.add_argument("--ablations", action="store_true", help="also run complementary with each ablation switch")
    ap.add_argument("--ablation-seeds", default="0", help="seeds of the ablation runs (fewer than --seeds is usual)")
    ap.add_argument("--set", action="append", default=[], help="extra config overrides for every run")
    ap.add_argument("--out", default="", help="results name (default study or study_quick)")
    ap.add_argument("--results-dir", default=str(RESULTS), help="where <name>.json/.md and <name>_runs/ go")
    ap.add_argument("--data-dir", default=str(ROOT / "comprl_data"), help="where built models are taken from (<data-dir>/models)")
    ap.add_argument("--timeout", type=int, default=4 * 3600)
    ap.add_argument("--extend", action="store_true",
                    help="continue finished runs that have fewer than --steps from their last checkpoint (same library)")
    argv = sys.argv[1:] if argv is None else argv
    args = ap.parse_args(argv)
    if args.quick:
        args.variants, args.seeds, args.eval_episodes = "grpo,complementary", "0", 4
        args.steps = args.steps or 2
        args.ablation_seeds = "0"
        args.set = QUICK_SETS + args.set
    args.steps = args.steps or 30
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    bad = [v for v in variants if v not in VARIANTS]
    if bad:
        ap.error(f"unknown variant(s) {bad}; choose from {', '.join(VARIANTS)}")
    seeds = [int(x) for x in args.seeds.split(",")]
    ablation_seeds = [int(x) for x in args.ablation_seeds.split(",")]
    name = args.out or ("study_quick" if args.quick else "study")
    results_dir = Path(args.results_dir).resolve()
    config = Path(args.config).resolve()
    work = results_dir / f"{name}_runs"
    work.mkdir(parents=True, exist_ok=True)
    t_study = time.time()
    env = environment()
    models, model_sets = prepare_models(Path(args.data_dir).expanduser().resolve(), work, args.quick, config)
    plan = [(v, s, []) for v in variants for s in seeds]
    if args.ablations:
        plan += [(f"complementary-{a}", s, extra) for a, extra in ABLATIONS.items() for s in ablation_seeds]
    results = []
    for label, seed, extra in plan:
        variant = label.split("-")[0]
        tag = f"{label}-seed{seed}"
        done = work / f"{tag}.json"
        before = None
        if done.exists():  # resumable
            r = json.loads(done.read_text())
            if "curves" not in r and (work / tag / "workbench.db").exists():  # a run from before curves were saved
                r["curves"] = curves_of(work / tag)
                done.write_text(json.dumps(r, indent=2))
            if not (args.extend and r.get("steps", 0) < args.steps):
                results.append(r)
                continue
            before = r  # --extend: continue this finished run to --steps
        sets = [f"run.variant={variant}", f"run.seed={seed}", f"run.max_steps={args.steps}",
                f"run.eval_episodes={args.eval_episodes}", "run.checkpoint_every=1000", *model_sets, *args.set, *extra]
        print(f"== {tag}", flush=True)
        r = run_one(tag, config, sets, work / tag, work / f"{tag}.log", args.timeout, models, args.eval_episodes)
        r.update({"label": label, "variant": variant, "seed": seed, "commit": env["commit"]})
        if before is not None:  # extended: the time and commits of every invocation
            r["seconds"] += before.get("seconds", 0.0)
            r["commit"] = ", ".join(dict.fromkeys([*(before.get("commit") or "?").split(", "), env["commit"]]))
        done.write_text(json.dumps(r, indent=2))
        results.append(r)
    write_results(name, {"benchmark": name, "environment": env, "argv": ["python", "benchmarks/study.py", *argv],
                         "args": vars(args), "models": str(models) if models else "built by each run",
                         "wall_s_this_invocation": round(time.time() - t_study, 1), "runs": results},
                  table(results, args, env["commit"]), results_dir=results_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
