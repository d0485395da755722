"""The comparison study: variants × seeds on one env, same budget, evaluated on held-out seeds with
and without experience (the shape of the paper's Table 1). Resumable: a finished run is not rerun.

    python benchmarks/study.py --quick                               # smoke: 2 variants, 1 seed, 2 steps
    python benchmarks/study.py --variants grpo,static,exp_only,complementary --seeds 0,1,2 --steps 30
    python benchmarks/study.py --variants complementary --ablations --ablation-seeds 0 --steps 30

An interrupted run continues from its latest checkpoint; `--extend` continues finished runs to a larger
--steps (the same run: its curves, library and start evaluation carry on). `--jobs N` runs N runs at
once, each its own process: the CPU configs train with one thread (`run.threads: 1`), so on this
2-core machine `--jobs 2` uses the second core that one run at a time leaves idle.

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
import subprocess
import sys
import time
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import RESULTS, environment, run_in, write_results  # noqa: E402
from benchmarks.study_tables import PROBE_KEYS, credit_table, paired_table, paired_tests, probe_table, table  # noqa: E402

ABLATIONS = {
    "joint_normalization": ["loss.joint_normalization=true"],
    "all_with_experience": ["rollout.with_experience=8"],
    "no_merge": ["extractor.merge_every=0"],
    "no_search_and_ask": ["rollout.search_and_ask=0"],
    "no_diversification": ["library.manager.diversify=false"],
    "no_reweighting": ["extractor.reweight=false"],
}
KEYS = ("success_with_exp", "success_without_exp", "actions_with_exp", "actions_without_exp",
        "success_with_exp_sampled", "success_without_exp_sampled",
        # recurring task sets (env.task_set): the same conditions on tasks never trained on
        "success_unseen_with_exp", "success_unseen_without_exp", "actions_unseen_with_exp", "actions_unseen_without_exp")
VARIANTS = ("grpo", "static", "exp_only", "complementary")  # docs/method.md "The four variants"
CURVES = ("policy/success_with_exp", "policy/success_without_exp", "policy/reward_with_exp", "policy/reward_without_exp",
          "policy/actions_with_exp", "policy/actions_without_exp", "policy/entropy", "policy/frac_nonzero_adv",
          "extractor/reward_mean", "extractor/updates", "library/size",
          "library/entry_correct_share", "extractor/new_entry_correct_share", "retrieval/same_task_rate",
          # the extractor probe (trainers/probe.py) and the density of the extractor's reward signal
          "extractor/probe_correct", "extractor/probe_wrong", "extractor/probe_unverifiable", "extractor/probe_valid",
          "extractor/probe_stated_right", "extractor/probe_heading_right", "extractor/frac_nonzero_adv", "extractor/episodes_per_entry_reward",
          "extractor/entries_rewarded",
          # does the reward tell a right lesson from a wrong one (trainers/cotrain.py EntryAudit.credit_metrics)
          "extractor/reward_gap", "extractor/relative_reward_gap", "extractor/rewarded_right_share")  # plus every eval/* key
FULL_CONFIGS = ("configs/minihack_room_cpu.yaml", "configs/alfworld_cpu.yaml")  # the two environments
FULL_MULTITASK = "configs/multitask_cpu.yaml"  # one complementary run over MiniHack + ALFWorld + WebShop
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
                           short_prompt_steps=0, extractor_short_steps=0,  # a smoke: no curricula
                           eval_episodes=1, eval_extractor=2, batch_size=4, extractor_batch_size=2, lr=3e-3, warmup_steps=10,
                           policy_hidden=64, policy_layers=2, policy_heads=2, policy_kv_heads=1, extractor_hidden=64,
                           extractor_layers=2, extractor_heads=2, extractor_kv_heads=1, max_seq_len=4000,
                           extractor_max_new_tokens=200)


def prepare_models(data_dir: Path, work: Path, quick: bool, config: Path, jobs: int = 1) -> tuple[Path | None, list[str]]:
    """(the models folder every run links to, extra --set overrides). Existing models in data_dir are
    shared; with --quick and none, tiny ones are built once under work/_models and named by path, so
    a run never calls ensure_models with the default config on them (that would rebuild them). With
    `jobs` > 1 the default models are built (or rebuilt) here, once, before any run: runs started
    together would otherwise each build them, or rebuild one shared folder at the same time."""
    from trainers.warmstart import MARKER, WarmStartConfig, ensure_models

    models = data_dir / "models"
    if (models / "policy").is_dir() and (models / "extractor").is_dir():
        try:
            marker = json.loads((models / "policy" / MARKER).read_text())
        except (OSError, json.JSONDecodeError):
            marker = {}
        built, envs = marker.get("hash"), (marker.get("config") or {}).get("envs")
        other_envs = envs is not None and envs != WarmStartConfig().envs
        if built != WarmStartConfig().digest() and (other_envs or marker.get("custom")):
            # a custom warm start (`comprl models init --envs ...` or `--policy-steps N`): named by path, since
            # `embedded:` means the default build (ensure_models refuses to replace a custom one)
            print(f"custom models, warm-started on {', '.join(envs or [])} ({models})", flush=True)
            return models, [f"actor.path={models / 'policy'}", f"extractor.model.path={models / 'extractor'}"]
        if built != WarmStartConfig().digest():  # comprl train's ensure_models would rebuild them through the link
            print(f"note: {models} was not built with the current default WarmStartConfig; "
                  + ("it is rebuilt now, once, before the runs" if jobs > 1 else "the first run rebuilds it there")
                  + " (about 10 minutes)", flush=True)
            if jobs > 1:
                ensure_models(data_dir, progress=False)
        return models, []
    if not quick:
        if jobs > 1:  # one build, shared, instead of one per concurrent run
            print(f"== default models (built once, then shared) in {models}", flush=True)
            ensure_models(data_dir, progress=False)
            return models, []
        return None, []  # each run builds the defaults into its own data dir (comprl train -> ensure_models)
    t0 = time.time()
    print(f"== tiny models (built once, then reused) in {work / '_models'}", flush=True)
    paths = ensure_models(work / "_models", tiny_warmstart(config), progress=False)
    print(f"   ready in {time.time() - t0:.0f} s", flush=True)
    return work / "_models" / "models", [f"actor.path={paths['policy']}", f"extractor.model.path={paths['extractor']}"]


def prepare_weak(plan: list[dict], data_dir: Path, model_sets: list[str], user_sets: list[str]) -> None:
    """Build the weak extractor start once, before any run, when a run of the plan uses `embedded:extractor-weak`
    (runs started together would otherwise each build it into the shared models folder)."""
    from trainers.config import load_run_config, parse_overrides

    over = parse_overrides([*model_sets, *user_sets]) if model_sets or user_sets else None
    if any(load_run_config(item["config"], overrides=over).extractor.model.path == "embedded:extractor-weak"
           for item in plan if item["variant"] != "grpo"):
        from trainers.warmstart.weak import ensure_weak_extractor

        print(f"== the weak extractor start (built once, then shared) in {data_dir / 'models'}", flush=True)
        ensure_weak_extractor(data_dir, progress=False)


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
    found = run_in(data)
    if found is None or found[1] is None:
        return None
    return found[0]["id"], int(found[1].name.rsplit("_", 1)[-1])


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
        correct = [v for _, _, _, v, _ in store.metrics_since(run["id"], ["library/entry_correct_share"])]
        curves = read_curves(store, run["id"])
    finally:
        store.close()
    start, end = pick(first), pick(last)
    for when, series in (("start", 0), ("end", -1)):  # the extractor probe's first and last reads
        for k in PROBE_KEYS:
            pts = curves.get(f"extractor/{k}")
            if pts:
                (start if when == "start" else end)[f"extractor_{k}"] = pts[series][1]
    by_task = {}
    for when, step in (("start", first), ("end", last)):  # each task's outcome per condition (a paired test's input)
        f = data / "runs" / str(run["id"]) / "evals" / f"step_{step}.json"
        if f.is_file():
            by_task[when] = json.loads(f.read_text())
    return {"name": name, "start": start, "end": end, "steps": run["step"], "seconds": time.time() - t0,
            "complete": run["status"] == "finished", "eval_by_task": by_task,
            "eval_n": eval_n(run, eval_episodes), "library_size": lib.get("library/size"),
            "entry_correct_end": correct[-1] if correct else None, "entry_correct_first": correct[0] if correct else None,
            "extractor_updates": lib.get("extractor/updates"), "merges": lib.get("library/merges"),
            "command": cmd, "curves": curves, **({"continued_from_step": prior[1]} if prior is not None else {})}


def build_plan(configs: list[Path], variants: list[str], seeds: list[int], ablations: bool | list[str], ablation_seeds: list[int],
               multitask: Path | None, by_seed: bool = False) -> list[dict]:
    """Every run of the study, in order: variants × seeds on each config (`by_seed`: seed by seed, every variant of a
    seed before the next seed's, so a study stopped part-way has whole seeds to compare), then (on the first config) the
    ablations, then the multi-task run. Labels on the first config are the variant names; other configs'
    labels are prefixed with the config's file stem (e.g. `alfworld_cpu-grpo`)."""
    plan = []
    for i, config in enumerate(configs):
        prefix = "" if i == 0 else f"{config.stem}-"
        order = [(v, s) for s in seeds for v in variants] if by_seed else [(v, s) for v in variants for s in seeds]
        plan += [{"config": config, "label": f"{prefix}{v}", "variant": v, "seed": s, "extra": []} for v, s in order]
    if ablations:
        plan += [{"config": configs[0], "label": f"complementary-{a}", "variant": "complementary", "seed": s, "extra": list(extra)}
                 for a, extra in ABLATIONS.items() if ablations is True or a in ablations for s in ablation_seeds]
    if multitask is not None:
        plan.append({"config": multitask, "label": f"{multitask.stem}-complementary", "variant": "complementary",
                     "seed": seeds[0], "extra": []})
    return plan


def run_sets(item: dict, steps: int, eval_episodes: int, model_sets: list[str], user_sets: list[str]) -> list[str]:
    # grpo shows no experience: said explicitly and last, since the configs (and --quick) set K/2, which a
    # grpo config refuses rather than silently ignores
    no_exp = ["rollout.with_experience=0"] if item["variant"] == "grpo" else []
    return [f"run.variant={item['variant']}", f"run.seed={item['seed']}", f"run.max_steps={steps}",
            f"run.eval_episodes={eval_episodes}", "run.checkpoint_every=1000", *model_sets, *user_sets, *item["extra"], *no_exp]


def measured_costs(results_dir: Path) -> dict:
    """Seconds per training episode and per evaluation episode on this machine, from bench_training.json
    (a grpo step of the CPU default: rollout + learner; the rollout's episodes/s for evaluation)."""
    try:
        b = json.loads((results_dir / "bench_training.json").read_text())
        return {"train_s_per_episode": b["step_s"] / b["episodes_per_step"], "eval_s_per_episode": 1.0 / b["rollout_episodes_per_s"],
                "rollout_s_per_episode": (b["step_s"] - b["learner_s"]) / b["episodes_per_step"],
                "source": f"bench_training.json (commit {b.get('environment', {}).get('commit', '?')}, {b['env']})"}
    except (OSError, KeyError, ValueError, ZeroDivisionError):
        return {"train_s_per_episode": 1.30, "eval_s_per_episode": 0.37, "rollout_s_per_episode": 0.37,
                "source": "the figures measured at commit e98e850 (no bench_training.json here)"}


def estimate(item: dict, steps: int, sets: list[str], costs: dict) -> dict:
    """Episodes and seconds one run will take, from its resolved config and the measured per-episode costs."""
    from trainers.config import load_run_config, parse_overrides

    over = parse_overrides(["run.eval_at_start=true", *sets])
    over.setdefault("run", {})["max_steps"] = steps
    cfg = load_run_config(item["config"], overrides=over)
    per_step = cfg.rollout.tasks_per_step * cfg.rollout.group_size
    evals = 1 + (steps // cfg.run.eval_every if cfg.run.eval_every else 0)
    if not (cfg.run.eval_every and steps % cfg.run.eval_every == 0):
        evals += 1  # the final evaluation
    per_eval = cfg.run.eval_episodes * len(cfg.env.names) * (2 if cfg.uses_experience else 1) * (2 if cfg.run.eval_sampled else 1)
    train_eps, eval_eps = per_step * steps, per_eval * evals if cfg.run.eval_episodes else 0
    per_episode = costs["train_s_per_episode"] if cfg.trains_actor else costs["rollout_s_per_episode"]  # exp_only: no actor update
    return {"episodes_per_step": per_step, "train_episodes": train_eps, "eval_episodes": eval_eps,
            "seconds": train_eps * per_episode + eval_eps * costs["eval_s_per_episode"],
            "seconds_per_step": per_step * per_episode,
            "seconds_eval": eval_eps * costs["eval_s_per_episode"]}


def makespan(seconds: list[float], jobs: int) -> float:
    """Wall time of runs taken in plan order by `jobs` workers, each starting the next run when it is free."""
    free = [0.0] * max(1, jobs)
    for sec in seconds:
        i = free.index(min(free))
        free[i] += sec
    return max(free)


def plan_text(plan: list[dict], steps: int, ests: list[dict], costs: dict, jobs: int = 1) -> str:
    total = makespan([e["seconds"] for e in ests], jobs)
    at_once = "one run at a time" if jobs == 1 else f"{jobs} runs at a time, each on cores of its own"
    lines = [f"{len(plan)} runs of {steps} steps; estimate from {costs['source']}: "
             f"{costs['train_s_per_episode']:.2f} s per training episode, {costs['eval_s_per_episode']:.2f} s per evaluation "
             f"episode ({costs['rollout_s_per_episode']:.2f} s for exp_only, which does not update the actor), {at_once}, "
             f"nothing else on the machine. Experience variants also train the extractor and merge, and ALFWorld prompts "
             f"are longer, so their runs take longer than this.", "",
             "| run | config | episodes/step | training episodes | evaluation episodes | estimate |", "|---|---|---:|---:|---:|---:|"]
    for item, e in zip(plan, ests):
        lines.append(f"| {item['label']}-seed{item['seed']} | {item['config'].name} | {e['episodes_per_step']} | "
                     f"{e['train_episodes']} | {e['eval_episodes']} | {e['seconds'] / 60:.0f} min |")
    lines.append(f"| **total** | | | {sum(e['train_episodes'] for e in ests)} | {sum(e['eval_episodes'] for e in ests)} | "
                 f"**{total / 3600:.1f} h** |")
    return "\n".join(lines)


def unseen_families(plan: list[dict], models: Path) -> list[str]:
    """Warnings for configs whose env families (minihack, alfworld, webshop, swe) the warm start of the
    shared models never played: such runs start from a policy that has never seen those tasks."""
    from trainers.config import load_run_config
    from trainers.warmstart import MARKER

    try:
        seen = {e.split("/")[0] for e in json.loads((models / "policy" / MARKER).read_text())["config"]["envs"]}
    except (OSError, KeyError, TypeError, ValueError):
        return []
    out = []
    for config in dict.fromkeys(item["config"] for item in plan):
        fams = sorted({e.split("/")[0] for e in load_run_config(config).env.names} - seen)
        if fams:
            out.append(f"warning: {config.name} plays {', '.join(fams)}, which the warm start of {models} never played "
                       f"(it played {', '.join(sorted(seen))}): those runs start from a policy that has not seen the task")
    return out


def fit_steps(plan: list[dict], budget_h: float, sets_of, costs: dict, jobs: int = 1) -> int:
    """The most steps per run (at least 1) whose estimated study time (`jobs` runs at a time) fits the budget."""
    wall = lambda st: makespan([estimate(item, st, sets_of(item, st), costs)["seconds"] for item in plan], jobs)  # noqa: E731
    one = [estimate(item, 1, sets_of(item, 1), costs) for item in plan]
    fixed = sum(e["seconds_eval"] for e in one)  # the start and final evaluations (no periodic ones at 1 step)
    per_step = sum(e["seconds_per_step"] for e in one)
    hi = max(1, int((budget_h * 3600 * max(1, jobs) - fixed) // per_step))  # as if the work split evenly: an upper bound
    lo = 1
    while lo < hi:  # the wall time grows with the steps: the largest that fits
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if wall(mid) <= budget_h * 3600 else (lo, mid - 1)
    return lo


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="a smoke run: tiny budget, one seed, tiny models if none are built")
    ap.add_argument("--config", default=str(ROOT / "configs" / "minihack_room_cpu.yaml"),
                    help="a run config, or several comma-separated (variants × seeds on each; ablations on the first)")
    ap.add_argument("--multitask", default="", help="also one complementary run on this (multi-task) config")
    ap.add_argument("--full", action="store_true",
                    help=f"the whole design: all variants, seeds 0,1,2, on {' and '.join(FULL_CONFIGS)}, the ablations and "
                         f"a multi-task run on {FULL_MULTITASK} (explicit --variants/--seeds/--config still win)")
    ap.add_argument("--plan", action="store_true", help="print the runs and the estimated time, run nothing")
    ap.add_argument("--budget-hours", type=float, default=0.0,
                    help="choose --steps so that the estimated study time fits this many hours")
    ap.add_argument("--variants", default=None, help=f"comma-separated, of {','.join(VARIANTS)}")
    ap.add_argument("--seeds", default=None, help="comma-separated (default 0,1,2)")
    ap.add_argument("--steps", type=int, default=None, help="steps per run (default 30; 2 with --quick)")
    ap.add_argument("--eval-episodes", type=int, default=32)
    ap.add_argument("--ablations", nargs="?", const=True, default=False,
                    help=f"also run complementary with each ablation switch, or with those named (comma-separated, of {','.join(ABLATIONS)})")
    ap.add_argument("--ablation-seeds", default="0", help="seeds of the ablation runs (fewer than --seeds is usual)")
    ap.add_argument("--set", action="append", default=[], help="extra config overrides for every run")
    ap.add_argument("--out", default="", help="results name (default study or study_quick)")
    ap.add_argument("--results-dir", default=str(RESULTS), help="where <name>.json/.md and <name>_runs/ go")
    ap.add_argument("--data-dir", default=str(ROOT / "comprl_data"), help="where built models are taken from (<data-dir>/models)")
    ap.add_argument("--timeout", type=int, default=4 * 3600)
    ap.add_argument("--jobs", type=int, default=1,
                    help="runs at once, each its own process (the CPU configs use one thread per run: on 2 cores, 2)")
    ap.add_argument("--by-seed", action="store_true",
                    help="run seed by seed (every variant of seed 0, then of seed 1, ...): a study stopped part-way has whole seeds")
    ap.add_argument("--extend", action="store_true",
                    help="continue finished runs that have fewer than --steps from their last checkpoint (same library)")
    argv = sys.argv[1:] if argv is None else argv
    args = ap.parse_args(argv)
    if args.quick:
        args.variants, args.seeds, args.eval_episodes = "grpo,complementary", "0", 4
        args.steps = args.steps or 2
        args.ablation_seeds = "0"
        args.set = QUICK_SETS + args.set
    explicit_config = any(a == "--config" or a.startswith("--config=") for a in argv)
    if args.full:
        args.variants = args.variants or ",".join(VARIANTS)
        args.ablations = True
        args.multitask = args.multitask or str(ROOT / FULL_MULTITASK)
        if not explicit_config:
            args.config = ",".join(str(ROOT / c) for c in FULL_CONFIGS)
    args.variants = args.variants or "grpo,complementary"
    args.seeds = args.seeds or "0,1,2"
    if args.budget_hours and args.steps:
        ap.error("give --steps or --budget-hours, not both")
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    bad = [v for v in variants if v not in VARIANTS]
    if bad:
        ap.error(f"unknown variant(s) {bad}; choose from {', '.join(VARIANTS)}")
    seeds = [int(x) for x in args.seeds.split(",")]
    if args.jobs < 1:
        ap.error(f"--jobs must be at least 1, not {args.jobs}")
    if args.jobs > (os.cpu_count() or 1):
        print(f"warning: --jobs {args.jobs} on {os.cpu_count()} cores: runs will share cores and each take longer than "
              "the estimate", file=sys.stderr, flush=True)
    ablation_seeds = [int(x) for x in args.ablation_seeds.split(",")]
    if isinstance(args.ablations, str):
        args.ablations = [a.strip() for a in args.ablations.split(",") if a.strip()]
        bad = [a for a in args.ablations if a not in ABLATIONS]
        if bad:
            ap.error(f"unknown ablation(s) {bad}; choose from {', '.join(ABLATIONS)}")
    name = args.out or ("study_quick" if args.quick else "study")
    results_dir = Path(args.results_dir).resolve()
    configs = [Path(c.strip()).resolve() for c in args.config.split(",") if c.strip()]
    multitask = Path(args.multitask).resolve() if args.multitask else None
    for c in configs + ([multitask] if multitask else []):
        if not c.is_file():
            ap.error(f"no config file {c}")
    config = configs[0]
    plan = build_plan(configs, variants, seeds, args.ablations, ablation_seeds, multitask, by_seed=args.by_seed)
    costs = measured_costs(results_dir)
    if args.budget_hours:
        args.steps = fit_steps(plan, args.budget_hours, lambda item, st: run_sets(item, st, args.eval_episodes, [], args.set), costs,
                               args.jobs)
        print(f"--budget-hours {args.budget_hours:g}: {args.steps} steps per run", flush=True)
    args.steps = args.steps or 30
    if args.plan:
        for w in unseen_families(plan, Path(args.data_dir).expanduser().resolve() / "models"):
            print(w, file=sys.stderr)
        print(plan_text(plan, args.steps, [estimate(item, args.steps, run_sets(item, args.steps, args.eval_episodes, [], args.set), costs)
                                           for item in plan], costs, args.jobs))
        return 0
    work = results_dir / f"{name}_runs"
    work.mkdir(parents=True, exist_ok=True)
    t_study = time.time()
    env = environment()
    models, model_sets = prepare_models(Path(args.data_dir).expanduser().resolve(), work, args.quick, config, args.jobs)
    for w in unseen_families(plan, models) if models is not None else []:
        print(w, file=sys.stderr, flush=True)
    prepare_weak(plan, Path(args.data_dir).expanduser().resolve(), model_sets, args.set)

    # Across sessions (a fresh machine has no <name>_runs/): a run the committed <name>.json holds as complete counts
    # as done, so a study continues where the last session's results stop.
    committed = {}
    try:
        committed = {r["name"]: r for r in json.loads((results_dir / f"{name}.json").read_text()).get("runs", [])
                     if r.get("complete")}
    except (OSError, json.JSONDecodeError, AttributeError):
        pass

    def one(item: dict) -> dict:
        label, variant, seed = item["label"], item["variant"], item["seed"]
        tag = f"{label}-seed{seed}"
        done = work / f"{tag}.json"
        before = None
        if not done.exists() and tag in committed and committed[tag].get("steps", 0) >= args.steps:
            done.write_text(json.dumps(committed[tag], indent=2))
            print(f"   {tag}: complete in {name}.json (an earlier session)", flush=True)
        if done.exists():  # resumable
            r = json.loads(done.read_text())
            if "curves" not in r and (work / tag / "workbench.db").exists():  # a run from before curves were saved
                r["curves"] = curves_of(work / tag)
                done.write_text(json.dumps(r, indent=2))
            if not (args.extend and r.get("steps", 0) < args.steps):
                with write_lock:  # in every partial write too, not only in the last one
                    finished[tag] = r
                return r
            before = r  # --extend: continue this finished run to --steps
        sets = run_sets(item, args.steps, args.eval_episodes, model_sets, args.set)
        print(f"== {tag}", flush=True)
        r = run_one(tag, item["config"], sets, work / tag, work / f"{tag}.log", args.timeout, models, args.eval_episodes)
        r.update({"label": label, "variant": variant, "seed": seed, "commit": env["commit"],
                  "config": str(item["config"].relative_to(ROOT)) if item["config"].is_relative_to(ROOT) else str(item["config"])})
        if before is not None:  # extended: the time and commits of every invocation
            r["seconds"] += before.get("seconds", 0.0)
            r["commit"] = ", ".join(dict.fromkeys([*(before.get("commit") or "?").split(", "), env["commit"]]))
        r["complete"] = bool(r.get("complete")) and r.get("steps", 0) >= args.steps
        done.write_text(json.dumps(r, indent=2))
        print(f"   {tag} finished", flush=True)
        with write_lock:  # the results so far, so a study stopped part-way has them (and says which runs are complete)
            finished[tag] = r
            write(list(finished.values()), partial=True)
        return r

    finished: dict[str, dict] = {}
    write_lock = threading.Lock()

    def write(results: list[dict], partial: bool) -> None:
        order = {f"{it['label']}-seed{it['seed']}": i for i, it in enumerate(plan)}
        results = sorted(results, key=lambda r: order.get(r["name"], 10**6))
        tags = [f"{it['label']}-seed{it['seed']}" for it in plan]
        complete = [r["name"] for r in results if r.get("complete", True)]
        paired = paired_tests(results)
        md = "\n\n".join(x for x in (table(results, args, env["commit"]), probe_table(results), credit_table(results), paired_table(paired)) if x)
        if partial:
            md = (f"**Partial: {len(complete)} of {len(tags)} runs complete** (pending: "
                  f"{', '.join(t for t in tags if t not in complete) or 'none'}).\n\n" + md)
        write_results(name, {"benchmark": name, "environment": env, "argv": ["python", "benchmarks/study.py", *argv],
                             "args": vars(args), "models": str(models) if models else "built by each run",
                             "wall_s_this_invocation": round(time.time() - t_study, 1), "partial": partial,
                             "runs_complete": complete, "runs_pending": [t for t in tags if t not in complete],
                             "paired": paired, "runs": results}, md, results_dir=results_dir)

    # each run is its own `comprl train` process: threads here only wait on them. After a failed run no new
    # run starts; the ones already running finish, and the study reports the failure (finished runs are kept
    # for a rerun, which resumes).
    failed = threading.Event()

    def guarded(item: dict) -> dict | None:
        if failed.is_set():
            return None  # not started
        try:
            return one(item)
        except BaseException:
            failed.set()
            raise

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = [pool.submit(guarded, item) for item in plan]
    results = [f.result() for f in futures]  # the first failure in plan order raises (runs start in plan order)
    write(results, partial=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
