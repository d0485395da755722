"""Evaluation on held-out seeds, with and without experience, and A/B tests of two library states.

- `evaluate_policy`: episodes of a Roller on seeds it never trained on, greedy and (optionally) sampled
  at the rollout temperature; success with Wilson 95% intervals and mean actions (a failed episode
  counts every action it took, up to the limit). GRPO trains the sampler, so the sampled read is the
  one that measures what the learner optimises; greedy decoding of a high-entropy tiny policy can
  stay flat (or fall) while the sampler improves (docs/results.md, second round).
- `run_eval(run_id)`: `comprl eval RUN_ID` — the run's latest checkpoint on its envs.
- `run_ab_test(ab_id)`: `comprl eval --ab-test ID` — two arms, each a library state (current, a past
  version, a JSONL file, current minus or plus chosen entries, or none) loaded into its own
  temporary store and ExperienceManager, so an A/B test never touches the live library's counters.
"""
from __future__ import annotations

import copy
import dataclasses
import re
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from core.config import AbTestConfig, ConfigError, LibraryConfig, from_dict
from core.embedding import Embedder
from core.library_io import import_library
from core.manager import ExperienceManager
from core.metrics import two_proportion_test, wilson_interval
from core.store import ExperienceStore, NewEntry
from core.types import Source
from envs.base import task_seed
from envs.pool import EnvPool
from envs.registry import list_envs
from trainers.config import ModelSection, RunConfig, load_run_config, resolve_model_path
from trainers.engine import latest_checkpoint
from trainers.models import inference_backend
from trainers.rollout import Episode, EpisodeSpec, Roller, trajectory_record
from trainers.slots import SlotRouter, env_factory, play
from trainers.warmstart import ensure_models


@dataclass
class ConditionResult:
    n: int = 0
    successes: int = 0
    actions: int = 0
    invalid: int = 0  # actions the env refused
    by_task: dict[str, list[int]] = field(default_factory=dict)  # task -> [successes, n]

    def add(self, e: Episode) -> None:
        self.n += 1
        self.successes += int(e.success)
        self.actions += e.traj.num_actions
        self.invalid += e.invalid_actions
        t = self.by_task.setdefault(f"{e.spec.env}: {e.traj.task}"[:200], [0, 0])
        t[0] += int(e.success)
        t[1] += 1

    def summary(self) -> dict[str, float]:
        lo, hi = wilson_interval(self.successes, self.n) if self.n else (0.0, 1.0)
        return {"n": self.n, "successes": self.successes, "rate": self.successes / self.n if self.n else 0.0,
                "ci_low": lo, "ci_high": hi, "mean_actions": self.actions / self.n if self.n else 0.0,
                "invalid_share": self.invalid / self.actions if self.actions else 0.0}


@dataclass
class EvalResult:
    conditions: dict[str, ConditionResult] = field(default_factory=dict)
    episodes: list[Episode] = field(default_factory=list)
    step: int | None = None  # the run step the metrics were logged at (run_eval; None = not logged)

    def metrics(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for name, c in self.conditions.items():
            s = c.summary()
            out[f"eval/success_{name}"] = s["rate"]
            out[f"eval/success_{name}_ci_low"] = s["ci_low"]
            out[f"eval/success_{name}_ci_high"] = s["ci_high"]
            out[f"eval/actions_{name}"] = s["mean_actions"]
        return out

    def table(self) -> str:
        lines = ["| condition | n | success | 95% CI | mean actions |", "|---|---:|---:|---|---:|"]
        for name, c in self.conditions.items():
            s = c.summary()
            lines.append(f"| {name} | {s['n']} | {s['rate']:.3f} | [{s['ci_low']:.3f}, {s['ci_high']:.3f}] | {s['mean_actions']:.2f} |")
        return "\n".join(lines)


def greedy(roller: Roller) -> Roller:
    """The same roller (pool, actor, manager shared) deciding greedily (temperature 0)."""
    r = copy.copy(roller)
    r.ac = dataclasses.replace(roller.ac, temperature=0.0)
    return r


def task_sets(task_set: int, n: int) -> list[tuple[str, list[int] | None]]:
    """What evaluation plays: [("", None)] = n held-out seeds; with a recurring task set (env.task_set = N)
    [("", seen ids 0..min(n, N)-1), ("unseen_", ids N..N+n-1)], the second never drawn in training."""
    if not task_set:
        return [("", None)]
    return [("", list(range(min(n, task_set)))), ("unseen_", list(range(task_set, task_set + n)))]


def evaluate_policy(roller: Roller, router: SlotRouter, envs: Sequence[str], *, n: int, seed_offset: int,
                    with_experience: Sequence[bool] = (False, True), step: int = 0, sampled: bool = False,
                    greedy_decoding: bool = True, task_set: int = 0) -> EvalResult:
    """Conditions `without_exp` / `with_exp` (greedy; skipped with `greedy_decoding=False`) and, with
    `sampled`, `without_exp_sampled` / `with_exp_sampled` (the rollout temperature; sampling seeded by
    (run seed, step), so reproducible). With a recurring task set (`task_set` > 0) the conditions are
    played on the seen tasks, and again, named `unseen_*`, on as many tasks never trained on."""
    modes = ([("", greedy(roller))] if greedy_decoding else []) + ([("_sampled", roller)] if sampled else [])
    res = EvalResult()
    for prefix, ids in task_sets(task_set, n):
        for suffix, r in modes:
            for flag in with_experience:
                name = prefix + ("with_exp" if flag else "without_exp") + suffix
                if ids is None:
                    specs = [EpisodeSpec(env, seed_offset + i, flag, -1 - i) for env in envs for i in range(n)]
                else:
                    specs = [EpisodeSpec(env, task_seed(env, t), flag, -1 - j, t) for env in envs for j, t in enumerate(ids)]
                eps = play(r, router, specs, step=step)
                cond = res.conditions.setdefault(name, ConditionResult())
                for e in eps:
                    cond.add(e)
                res.episodes += eps
    return res


# -- comprl eval RUN_ID ---------------------------------------------------------------------------


def _roller_for(cfg, policy_path: str, manager, n_slots: int):
    # backend openai: the endpoint serves the policy (policy_path gives its tokenizer and chat template)
    actor = inference_backend(cfg.actor, policy_path, num_threads=cfg.run.threads or None)
    slots = [name for name in cfg.env.names for _ in range(n_slots)]
    pool = EnvPool([env_factory(n, cfg) for n in slots], num_workers=cfg.run.threads or 2)
    roller = Roller(actor, pool, manager, rollout_cfg=cfg.rollout, actor_cfg=cfg.actor, max_turns=cfg.env.max_turns,
                    seed=cfg.run.seed)
    return roller, SlotRouter(slots), pool


def eval_manager(store: ExperienceStore, cfg):
    """An ExperienceManager over a run's library for evaluation: it reads, and never counts usage."""
    mcfg = dataclasses.replace(cfg.library.manager, record_usage=False)
    return ExperienceManager(store, Embedder(cfg.library.embedding), mcfg, cfg.library.index, seed=cfg.run.seed)


def run_eval(run_id: int, *, data_dir: str, db_url: str, episodes: int = 0, checkpoint: str = "", log: bool = True,
             overrides: dict[str, Any] | None = None) -> EvalResult:
    """The run's latest checkpoint (or `checkpoint`) on its envs; `overrides` (a nested dict) change the run's config
    for this evaluation only (e.g. {"library": {"manager": {"min_similarity": 0.0}}}); such a result is never logged."""
    store = ExperienceStore(db_url)
    run = store.get_run(run_id)
    cfg = load_run_config(run["config"], overrides=overrides)
    log = log and not overrides
    ck = Path(checkpoint) if checkpoint else latest_checkpoint(Path(run["checkpoint_dir"])) if run["checkpoint_dir"] else None
    policy = str(ck / "policy") if ck is not None and (ck / "policy").exists() else checkpoint or resolve_model_path(cfg.actor.path, data_dir)
    # The step the evaluated weights belong to: a run checkpoint (step_N) logs its eval/* metrics at N; the run's
    # latest weights at its step; any other model folder (e.g. the starting policy) is printed, never logged
    # (logging it at the run's step would draw the wrong model into the run's curves).
    step: int | None = run["step"] if not checkpoint else None
    if ck is not None:
        m = re.fullmatch(r"step_(\d+)", ck.name if (ck / "state.pt").exists() else ck.parent.name)
        step = int(m.group(1)) if m else step
    seed_step = step or 0  # sampling seeds derive from (run seed, step)
    step = step if log else None
    n = episodes or cfg.run.eval_episodes or 16
    manager = eval_manager(store, cfg) if cfg.uses_experience else None
    roller, router, pool = _roller_for(cfg, policy, manager, min(n, 32))
    try:
        res = evaluate_policy(roller, router, list(cfg.env.names), n=n, seed_offset=cfg.env.eval_seed_offset,
                              with_experience=(False, True) if manager is not None else (False,), step=seed_step,
                              sampled=cfg.run.eval_sampled, task_set=cfg.env.task_set)
        res.step = step
        if step is not None:
            store.log_metrics(run_id, step, res.metrics())
        return res
    finally:
        pool.close()
        if manager is not None:
            manager.close()


# -- A/B tests ----------------------------------------------------------------------------------------


def ab_config(c: dict[str, Any]) -> tuple[AbTestConfig | None, str]:
    """(the stored A/B config as an AbTestConfig, "") or (None, why it cannot run): its shape and values
    (`AbTestConfig.problem`), the env's name, a file arm's file, and the actor's back-end fields."""
    if not isinstance(c, dict):
        return None, "the config must be a mapping"
    missing = [k for k in ("env", "seeds", "arms") if k not in c]
    if missing:
        return None, f"the config has no {missing[0]}"
    if c.get("actor") is not None and not isinstance(c["actor"], dict):
        return None, "actor must be a mapping (backend, base_url, path, served_model, prompt_style)"
    try:
        cfg = from_dict(AbTestConfig, c)
    except ConfigError as e:
        return None, str(e)
    why = cfg.problem()
    if not why and cfg.env not in list_envs():
        why = f"unknown env {cfg.env!r}"
    for name, arm in sorted(cfg.arms.items()):
        if not why and arm["kind"] == "file" and not Path(arm["path"]).is_file():
            why = f"arm {name}: library file {arm['path']!r} does not exist"
    if not why and cfg.actor is not None:
        actor = dict(cfg.actor)
        if actor.pop("prompt_style", "compact") not in ("compact", "chat"):
            why = "actor.prompt_style must be compact or chat"
        else:
            try:
                from_dict(ModelSection, actor)
            except (ConfigError, TypeError, ValueError) as e:
                why = f"actor: {e}"
    return (None, why) if why else (cfg, "")


def validate_ab_config(c: dict[str, Any]) -> str:
    """Why an A/B config cannot run, or ""."""
    return ab_config(c)[1]


def ab_specs(c: AbTestConfig, with_experience: bool) -> list[EpisodeSpec]:
    """An arm's episodes: every seed (or recurring task id) once, then again for each further episode per task, in
    the same order in both arms, so episode i of A and episode i of B are a pair (same task, same sampling stream)."""
    specs = []
    for r in range(c.episodes_per_task):
        for j, s in enumerate(c.seeds):
            g = -1 - (r * len(c.seeds) + j)
            if c.task_ids:  # recurring tasks: the instance of each id, its id in the task text
                specs.append(EpisodeSpec(c.env, task_seed(c.env, s), with_experience, g, s))
            else:
                specs.append(EpisodeSpec(c.env, s, with_experience, g))
    return specs


def arm_entries(store: ExperienceStore, arm: dict[str, Any]) -> list[NewEntry] | None:
    """The library an arm plays with (None = no experience at all)."""
    kind = arm["kind"]
    if kind == "none":
        return None
    if kind == "file":
        tmp = ExperienceStore("sqlite://")
        import_library(tmp, arm["path"], keep_ids=False)
        return [NewEntry(text=e.text, env=e.env, task=e.task, query=e.query, source=Source.IMPORTED)
                for e in tmp.list_entries(limit=10**9).entries]
    if kind == "version":
        snap = store.snapshot_at(arm["version"])
        full = store.get_many([s.entry_id for s in snap])
        return [NewEntry(text=s.text, env=full[s.entry_id].env, task=full[s.entry_id].task, query=full[s.entry_id].query)
                for s in snap]
    current = store.list_entries(limit=10**9).entries
    ids = set(arm.get("ids", []))
    if kind == "minus":
        current = [e for e in current if e.id not in ids]
    elif kind == "plus":
        have = {e.id for e in current}
        current += [e for e in store.get_many(ids).values() if e.id not in have]
    return [NewEntry(text=e.text, env=e.env, task=e.task, query=e.query) for e in current]


def run_ab_test(ab_id: int, *, data_dir: str, db_url: str) -> dict[str, Any]:
    store = ExperienceStore(db_url)
    ab = store.get_ab_test(ab_id)
    try:
        c, why = ab_config(ab["config"])
        if c is None:
            raise ValueError(why)
        store.update_ab_test(ab_id, status="running", progress=0.0)
        cfg = RunConfig()
        cfg.env.names = {c.env: 1.0}
        if c.actor:  # the policy's back end and prompts, e.g. {backend: openai, base_url: ..., path: ..., prompt_style: chat}
            actor = dict(c.actor)
            cfg.rollout.prompt_style = actor.pop("prompt_style", cfg.rollout.prompt_style)
            cfg.actor = from_dict(ModelSection, {**dataclasses.asdict(cfg.actor), **actor})
        if c.max_turns:
            cfg.env.max_turns = c.max_turns
        cfg.rollout.constrain_actions = c.constrain_actions
        policy = c.checkpoint or resolve_model_path(cfg.actor.path, data_dir)
        if not c.checkpoint and cfg.actor.path.startswith("embedded:"):
            ensure_models(data_dir)
        lib = LibraryConfig()
        embedder = Embedder(lib.embedding)
        mcfg = dataclasses.replace(lib.manager, random_demote=False)
        results: dict[str, ConditionResult] = {}
        with tempfile.TemporaryDirectory() as tmp:
            roller = router = pool = None
            try:
                for i, (name, arm) in enumerate(sorted(c.arms.items())):
                    entries = arm_entries(store, arm)
                    manager = None
                    if entries is not None:
                        arm_store = ExperienceStore(f"sqlite:///{tmp}/arm_{name}.db")
                        if entries:
                            arm_store.add_entries(entries, actor="ab-test")
                        manager = ExperienceManager(arm_store, embedder, mcfg, lib.index, seed=0)
                    if roller is None:
                        roller, router, pool = _roller_for(cfg, policy, manager, min(len(c.seeds), 16))
                    roller.manager = manager
                    specs = ab_specs(c, manager is not None)
                    eps = play(greedy(roller) if c.decoding == "greedy" else roller, router, specs, step=0)
                    cond = results.setdefault(name, ConditionResult())
                    for e in eps:
                        cond.add(e)
                    store.add_trajectories([trajectory_record(e, run_id=None, step=0, ab_test_id=ab_id) for e in eps])
                    if manager is not None:
                        manager.close()
                    store.update_ab_test(ab_id, progress=(i + 1) / 2)
            finally:
                if pool is not None:
                    pool.close()
        a, b = results["A"].summary(), results["B"].summary()
        diff, p = two_proportion_test(a["successes"], a["n"], b["successes"], b["n"])
        tasks = sorted(set(results["A"].by_task) | set(results["B"].by_task))
        per_task = {t: {arm: (r.by_task[t][0] / r.by_task[t][1]) if t in r.by_task else None for arm, r in results.items()}
                    for t in tasks}
        out = {"arms": {"A": a, "B": b}, "diff": diff, "p_value": p, "per_task": per_task, "finished_at": time.time()}
        store.update_ab_test(ab_id, status="done", progress=1.0, results=out)
        return out
    except Exception as e:
        store.update_ab_test(ab_id, status="failed", error=f"{type(e).__name__}: {e}\n{traceback.format_exc()}"[-4000:])
        raise
    finally:
        store.close()
