"""Multi-turn rollouts: many episodes in lockstep, one batched generate call per turn.

    metrics = {}
    episodes = Roller(actor, pool, manager, ...).collect(specs, step=3, metrics=metrics)

Per episode: reset -> (retrieve experience with the task as query, when the spec says so) ->
turns of [prompt (system + task + experience + recent history + observation) -> reply -> action
or search-and-ask] until the env ends the episode or the turn limit. Each actor turn is one
training row: the prompt ids exactly as generated from, the reply ids, their log-probs under the
sampling model. Only reply tokens ever carry loss (observation, experience and tool-result text
lives in the prompt part of a row, which the learner masks).

Every episode anywhere is played here: training and evaluation on a process pool, the warm start's DAgger
rollouts and scripted demonstrations (no model: the env's expert plays) on a pool in this process
(envs.pool.LocalPool), and the workbench's demo a turn at a time through `begin` / `play_turn`
(trainers/player.py).
"""
from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from core.types import Step, Trajectory
from envs.base import instance_task
from envs.pool import EnvPool, SlotResult
from trainers import prompts as P
from trainers.backends.choices import ActionChoice  # plain Python: env and manager processes import this module without torch

# (task, query, env, step) -> (answer text, entry ids used, generation dict or None)
ToolFn = Callable[[str, str, str, int], tuple[str, list[int], Any]]
# Env families whose info["admissible_actions"] names only some valid commands (SWE lists ls, cat, run_tests and
# submit, not grep/edit/replace/write/python): rollout.constrain_actions leaves their replies free.
OPEN_ACTION_ENVS = ("swe",)


@dataclass
class EpisodeSpec:
    env: str
    seed: int
    with_experience: bool
    group_id: int
    task_id: int | None = None  # a recurring task's instance id (env.task_set): named in the task text
    options: dict[str, Any] | None = None  # the env's reset options (the warm start's teacher: the entry's condition)


@dataclass
class TurnSample:
    """One actor reply as a training row: loss on `response_ids` only."""

    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float]  # (len(response_ids),) under the sampling-time model (raw, temperature 1)
    kind: str = "action"  # action | tool


@dataclass
class Episode:
    spec: EpisodeSpec
    traj: Trajectory
    turns: list[TurnSample] = field(default_factory=list)
    tool_generations: list[Any] = field(default_factory=list)  # extractor rewrites (search-and-ask)
    tool_entry_ids: list[int] = field(default_factory=list)
    invalid_actions: int = 0
    error: str = ""
    store_id: int | None = None  # the stored episode's id, once the run has saved it
    critic_scores: dict[int, float] = field(default_factory=dict)  # entry id -> the actor's judgement (actor as critic)

    @property
    def reward(self) -> float:
        return self.traj.reward

    @property
    def success(self) -> bool:
        return self.traj.success


def derive_seed(*parts: Any) -> int:
    """A stable 63-bit seed from (run seed, step, index, …): reproducible sampling per sample."""
    h = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(h, "little") & ((1 << 63) - 1)


def turn_choice(env: str, admissible: Sequence[str], *, tool: bool) -> ActionChoice | None:
    """A constrained turn's choice: one of the env's admissible actions, or a search-and-ask call when `tool` (its budget
    lasts); None (a free reply) where the env lists no actions or lists only some (OPEN_ACTION_ENVS). An entry with a
    placeholder ("search[<query>]") leaves its argument free.

    The learner sees the sampled ids with their unmasked log-probs (HFBackend.generate): the PPO ratio starts at 1 and
    the update raises the model's own probability of the action the mask let it pick."""
    if not admissible or env.split("/")[0] in OPEN_ACTION_ENVS:
        return None
    return ActionChoice.of(admissible, ["<search_and_ask>"] if tool else ()) or None


@dataclass
class _Live:
    ep: Episode
    slot: int
    action_format: str
    observation: str
    history: list[tuple[str, str]] = field(default_factory=list)
    tool_calls: int = 0
    turns: int = 0
    max_turns: int = 0
    done: bool = False
    keep_intro: bool = False
    admissible: list[str] = field(default_factory=list)  # the env's valid actions now, where it lists them
    given: bool = False  # the env named the experience this episode shows (reset info "experience"): no retrieval
    # The env's scripted action for the current state, where its info names one ("expert_action": the warm start's
    # teachers; kept on each Step as its DAgger label), and the one an expert-played episode takes ("expert_play":
    # the label, or a noisy demonstration's random action).
    expert: str | None = None
    expert_play: str | None = None


@dataclass
class Batch:
    """Episodes under way in lockstep: Roller.begin makes one, play_turn advances it, end says what it measured."""

    lives: list[_Live]
    step: int
    t0: float
    computed0: int = 0  # the actor's prefill_computed when the first turn starts
    t_ret: float = 0.0
    same_task: float | None = None
    critic: dict[str, float] = field(default_factory=dict)
    tokens: int = 0
    replies: int = 0
    cut: int = 0
    prefill: int = 0
    turn: int = 0


class Roller:
    """Collects episodes with an actor back end, an EnvPool and (optionally) an ExperienceManager."""

    def __init__(self, actor, pool: EnvPool, manager=None, *, rollout_cfg, actor_cfg, max_turns: int = 0,
                 tool_fn: ToolFn | None = None, templates: P.Templates = P.DEFAULT_TEMPLATES, seed: int = 0):
        self.actor = actor
        self.pool = pool
        self.manager = manager
        self.rc = rollout_cfg
        self.ac = actor_cfg
        self.max_turns = max_turns
        self.tool_fn = tool_fn
        self.templates = templates
        self.seed = seed

    @property
    def style(self) -> str:
        return getattr(self.rc, "prompt_style", "compact")

    def prompt_ids(self, live: _Live) -> list[int]:
        msgs = P.turn_messages(
            self.style, action_format=live.action_format, task=live.ep.traj.task, observation=live.observation,
            experience=live.ep.traj.experience_text,
            history=P.fit_history(live.history, max_turns=self.rc.history_turns, max_chars=self.rc.history_chars,
                                  keep_first=live.keep_intro, stride=P.history_stride(self.style, self.rc.history_turns)),
            admissible=live.admissible, allow_tool=self.rc.search_and_ask > 0 and self.tool_fn is not None,
            templates=self.templates)
        return list(self.actor.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True))

    def _sessions(self) -> bool:
        """Whether the actor keeps each episode's KV cache between turns: hf back end, rollout.reuse_cache, and the
        chat prompts, whose turns extend each other. The compact prompt's turns share only the system text and task,
        which the batch's shared-prefix cache already runs once: there the sessions' per-row cache copies made
        the tiny default's rollouts 1.7x slower for 5% fewer prompt tokens (bench_training_sessions_tiny.md)."""
        return (bool(getattr(self.rc, "reuse_cache", False)) and self.style == "chat"
                and hasattr(self.actor, "drop_sessions"))

    def choice(self, lv: _Live) -> ActionChoice | None:
        """What a constrained reply may be this turn (rollout.constrain_actions; `turn_choice`)."""
        tool = self.rc.search_and_ask > 0 and self.tool_fn is not None and lv.tool_calls < self.rc.search_and_ask
        return turn_choice(lv.ep.spec.env, lv.admissible, tool=tool)

    def collect(self, specs: Sequence[EpisodeSpec], *, step: int, retrieval: bool = True,
                metrics: dict[str, float] | None = None) -> list[Episode]:
        """Play spec i on pool slot i."""
        return self.collect_on(list(enumerate(specs)), step=step, retrieval=retrieval, metrics=metrics)

    def collect_on(self, pairs: Sequence[tuple[int, EpisodeSpec]], *, step: int, retrieval: bool = True,
                   metrics: dict[str, float] | None = None) -> list[Episode]:
        """Play each (slot, spec) to its end, all in lockstep; episodes come back in the given order.

        `metrics`, when given, receives what this call measured (rollout/*, critic/*, retrieval/same_task_rate,
        search_and_ask/latency_ms): the caller's own dict, so concurrent collects (a prefetch thread beside an
        evaluation) never read each other's numbers."""
        batch = self.begin(pairs, step=step, retrieval=retrieval)
        while self.play_turn(batch):
            pass
        stats = self.end(batch)
        if metrics is not None:
            metrics.update(stats)
        return [lv.ep for lv in batch.lives]

    def begin(self, pairs: Sequence[tuple[int, EpisodeSpec]], *, step: int, retrieval: bool = True) -> Batch:
        """Reset each (slot, spec) and retrieve the experience its episode shows: the batch `play_turn` then
        advances a turn at a time (`collect_on` to the end; the workbench's demo one turn per click)."""
        if len({i for i, _ in pairs}) != len(pairs) or any(not 0 <= i < self.pool.num_slots for i, _ in pairs):
            raise ValueError(f"slots must be distinct and within the pool's {self.pool.num_slots}")
        batch = Batch([], step, time.perf_counter())
        starts = self.pool.reset_many([(i, s.seed, s.options) for i, s in pairs])
        batch.lives = [self._start(i, s, r) for (i, s), r in zip(pairs, starts)]
        # Retrieval at episode start (docs/method.md step 1): one call, batched by the manager.
        want = [lv for lv in batch.lives if lv.ep.spec.with_experience and not lv.done and not lv.given]
        if want and retrieval and self.manager is not None:
            t1 = time.perf_counter()
            hits = self.manager.search_sync([lv.ep.traj.task for lv in want], task=[lv.ep.spec.env for lv in want],
                                            scope=[lv.ep.traj.task for lv in want], step=step)
            batch.t_ret = time.perf_counter() - t1
            for lv, hs in zip(want, hits):
                lv.ep.traj.experience_ids = [h.entry_id for h in hs]
                lv.ep.traj.experience_text = "\n\n".join(h.text for h in hs)
            # How often a retrieval returns an entry written for the episode's own task (on recurring tasks
            # the entries that can be right; on random seeds every episode shares one task text).
            found = [h.task == lv.ep.traj.task for lv, hs in zip(want, hits) for h in hs]
            if found:
                batch.same_task = sum(found) / len(found)
            if self.rc.actor_critic:
                batch.critic = self._critique(want, hits, step)
        batch.computed0 = getattr(self.actor, "prefill_computed", 0)  # the turns' prefill, not the critic's
        return batch

    def play_turn(self, batch: Batch) -> bool:
        """One turn of every episode still under way (one batched generate call); False when none was."""
        active = [lv for lv in batch.lives if not lv.done]
        if not active:
            return False
        to_step: list[tuple[_Live, str]] = []
        if self.actor is None:  # no model: the env's scripted expert plays (the warm start's demonstrations, the demo)
            # the action its info named (a teacher's), else the env family's expert (envs/experts.py) asked of the pool
            ask = [lv for lv in active if (lv.expert_play or lv.expert) is None]
            told = dict(zip((id(lv) for lv in ask), self.pool.expert_many([lv.slot for lv in ask]))) if ask else {}
            to_step = [(lv, lv.expert_play or lv.expert or told.get(id(lv)) or "") for lv in active]
            batch.turn += 1
        else:
            prompts = [self.prompt_ids(lv) for lv in active]
            extra: dict[str, Any] = {"sessions": [id(lv) for lv in active]} if self._sessions() else {}
            if getattr(self.rc, "constrain_actions", False):
                extra["choices"] = [self.choice(lv) for lv in active]
            outs = self.actor.generate(prompts, max_new_tokens=self.ac.max_new_tokens, temperature=self.ac.temperature,
                                       top_p=self.ac.top_p, stop=P.reply_stops(self.style),
                                       seed=derive_seed(self.seed, batch.step, batch.turn), **extra)
            batch.prefill += sum(len(p) for p in prompts)
            batch.turn += 1
            for lv, p, o in zip(active, prompts, outs):
                batch.tokens += len(o.token_ids)
                batch.replies += 1
                batch.cut += o.finish_reason == "length"
                kind, content = P.parse_actor_reply(o.text, lv.admissible if self.style == "chat" else None)
                if kind == "tool" and (lv.tool_calls >= self.rc.search_and_ask or self.tool_fn is None):
                    kind, content = "action", o.text.strip()  # over the budget: the env judges it as an action
                lv.ep.turns.append(TurnSample(p, list(o.token_ids), list(o.logprobs), kind))
                if kind == "tool":
                    self._tool_turn(lv, content, batch.step)
                else:
                    to_step.append((lv, content))
        if to_step:
            results = self.pool.step_many([(lv.slot, a) for lv, a in to_step])
            for (lv, a), r in zip(to_step, results):
                self._after_step(lv, a, r)
        for lv in active:
            if not lv.done and lv.turns >= lv.max_turns:
                self._finish(lv, truncated=True)
        if self._sessions():
            self.actor.drop_sessions([id(lv) for lv in active if lv.done])
        return True

    def end(self, batch: Batch) -> dict[str, float]:
        """What the batch measured (rollout/*, critic/*, retrieval/same_task_rate, search_and_ask/latency_ms)."""
        if self._sessions():
            self.actor.drop_sessions([id(lv) for lv in batch.lives])
        dt = time.perf_counter() - batch.t0
        stats = {"rollout/seconds": dt, "rollout/episodes_per_s": len(batch.lives) / max(dt, 1e-9),
                 "rollout/tokens_per_s": batch.tokens / max(dt, 1e-9), "rollout/retrieval_s": batch.t_ret,
                 "rollout/env_restarts": float(self.pool.restarts()),
                 # replies that ran out of actor.max_new_tokens before an end token or newline: a share
                 # near 1 means the budget cuts actions short (ALFWorld's "take X from Y" needs 9+ tokens)
                 "rollout/cut_replies": batch.cut / max(1, batch.replies), "rollout/turns": float(batch.turn),
                 "rollout/prompt_tokens": float(batch.prefill), **batch.critic}
        if hasattr(self.actor, "prefill_computed"):
            # prompt tokens the model actually ran (the rest came from a kept cache, a shared prefix or a duplicate prompt)
            stats["rollout/prefill_tokens"] = float(self.actor.prefill_computed - batch.computed0)
        if batch.same_task is not None:
            stats["retrieval/same_task_rate"] = batch.same_task
        tool_ms = [s.info["latency_ms"] for lv in batch.lives for s in lv.ep.traj.steps if s.kind == "tool"]
        if tool_ms:  # one search-and-ask call, retrieval and the extractor's rewrite, as the actor waits for it
            stats["search_and_ask/latency_ms"] = sum(tool_ms) / len(tool_ms)
        return stats

    def _critique(self, lives: Sequence[_Live], hits: Sequence[Sequence[Any]], step: int) -> dict[str, float]:
        """Actor as critic (docs/method.md, optional): one batched call judges every retrieved entry;
        rejected entries are not shown. An unparsable judgement counts as accept (the entry is
        used, as without the critic) and is counted in `critic/unparsed`."""
        pairs = [(lv, h) for lv, hs in zip(lives, hits) for h in hs]
        if not pairs:
            return {}
        t0 = time.perf_counter()
        prompts = [list(self.actor.apply_chat_template(P.critic_messages(task=lv.ep.traj.task, entry=h.text, templates=self.templates),
                                                       add_generation_prompt=True, tokenize=True)) for lv, h in pairs]
        outs = self.actor.generate(prompts, max_new_tokens=4, temperature=self.ac.temperature, top_p=self.ac.top_p,
                                   stop=["\n"], seed=derive_seed(self.seed, step, "critic"))
        unparsed = 0
        for (lv, h), o in zip(pairs, outs):
            score = P.parse_critic_reply(o.text)
            if score is None:
                unparsed += 1
                score = 1.0
            lv.ep.critic_scores[h.entry_id] = score
        for lv, hs in zip(lives, hits):
            shown = [h for h in hs if lv.ep.critic_scores[h.entry_id] > 0.0]
            lv.ep.traj.experience_ids = [h.entry_id for h in shown]
            lv.ep.traj.experience_text = "\n\n".join(h.text for h in shown)
        scores = [lv.ep.critic_scores[h.entry_id] for lv, h in pairs]
        return {"critic/judged": float(len(pairs)), "critic/unparsed": float(unparsed),
                "critic/accept_rate": sum(s == 1.0 for s in scores) / len(scores),
                "critic/reject_rate": sum(s == 0.0 for s in scores) / len(scores),
                "critic/latency_ms": (time.perf_counter() - t0) * 1000}

    def _start(self, slot: int, spec: EpisodeSpec, r: SlotResult) -> _Live:
        task = r.task or ""
        if spec.task_id is not None:
            task = instance_task(spec.env, spec.task_id, task)
        traj = Trajectory(env=spec.env, task=task, seed=spec.seed, with_experience=spec.with_experience,
                          group_id=spec.group_id)
        ep = Episode(spec, traj)
        limit = min(r.max_turns, self.max_turns) if self.max_turns else r.max_turns
        info = r.info or {}
        lv = _Live(ep, slot, r.action_format, r.obs, max_turns=max(1, limit), keep_intro=r.keep_intro,
                   admissible=[str(a) for a in info.get("admissible_actions") or []])
        if "experience" in info:  # the env shows its own entry (the warm start's teacher): retrieval has no say
            lv.given = True
            traj.experience_text = str(info["experience"])
        self._expert(lv, info)
        if r.error:  # the env failed to start: a failed episode, the run goes on
            ep.error = r.error
            self._finish(lv, truncated=False)
        return lv

    def _tool_turn(self, lv: _Live, query: str, step: int) -> None:
        """Search-and-ask (docs/method.md step 2): the answer becomes the next observation; no env step."""
        lv.tool_calls += 1
        t0 = time.perf_counter()
        answer, ids, gen = self.tool_fn(lv.ep.traj.task, query, lv.ep.spec.env, step)
        ms = (time.perf_counter() - t0) * 1000
        obs = self.templates["TOOL_RESULT"].format(answer=answer or "(nothing relevant found)")
        lv.ep.traj.steps.append(Step(observation=lv.observation, action=f"<search_and_ask>{query}</search_and_ask>",
                                     kind="tool", tool_query=query, tool_answer=answer,
                                     info={"latency_ms": ms, **self._label(lv)}))
        lv.ep.tool_entry_ids.extend(ids)
        if gen is not None:
            lv.ep.tool_generations.append(gen)
        lv.history.append((lv.observation, f"<search_and_ask>{query}</search_and_ask>"))
        lv.observation = f"{obs}\n\n{lv.observation}"
        lv.turns += 1

    def _after_step(self, lv: _Live, action: str, r: SlotResult) -> None:
        invalid = bool(r.info.get("invalid_action"))
        lv.ep.invalid_actions += invalid
        lv.ep.traj.steps.append(Step(observation=lv.observation, action=action, reward=float(r.reward),
                                     kind="invalid" if invalid else "action", info=self._label(lv)))
        self._expert(lv, r.info or {})
        lv.ep.traj.reward += float(r.reward)
        lv.history.append((lv.observation, action))
        lv.observation = r.obs
        lv.admissible = [str(a) for a in (r.info or {}).get("admissible_actions") or []]
        lv.turns += 1
        if r.error:
            lv.ep.error = r.error
        if r.done:
            lv.ep.traj.final_observation = r.obs
            lv.ep.traj.success = bool(r.info.get("success", False))
            self._finish(lv, truncated=r.truncated and not r.terminated)

    @staticmethod
    def _expert(lv: _Live, info: dict[str, Any]) -> None:
        lv.expert, lv.expert_play = info.get("expert_action"), info.get("expert_play")

    @staticmethod
    def _label(lv: _Live) -> dict[str, str]:
        return {"expert_action": lv.expert} if lv.expert is not None else {}

    @staticmethod
    def _finish(lv: _Live, *, truncated: bool) -> None:
        lv.done = True
        lv.ep.traj.truncated = truncated


def episode_metrics(episodes: Sequence[Episode]) -> dict[str, float]:
    """policy/* metrics split by with/without experience (a failed episode counts all its actions)."""
    out: dict[str, float] = {}
    for tag, flag in (("with_exp", True), ("without_exp", False)):
        eps = [e for e in episodes if e.spec.with_experience == flag]
        if not eps:
            continue
        out[f"policy/reward_{tag}"] = sum(e.reward for e in eps) / len(eps)
        out[f"policy/success_{tag}"] = sum(e.success for e in eps) / len(eps)
        out[f"policy/actions_{tag}"] = sum(e.traj.num_actions for e in eps) / len(eps)
    if episodes:
        out["policy/invalid_action_rate"] = sum(e.invalid_actions for e in episodes) / max(1, sum(e.traj.num_actions for e in episodes))
        out["policy/env_errors"] = float(sum(bool(e.error) for e in episodes))
    return out


def trajectory_record(ep: Episode, *, run_id: int | None, step: int, ab_test_id: int | None = None) -> dict[str, Any]:
    """An episode as the store keeps it for replay."""
    t = ep.traj
    return {"run_id": run_id, "ab_test_id": ab_test_id, "step": step, "env": t.env, "task": t.task, "seed": t.seed,
            "with_experience": t.with_experience, "success": t.success, "reward": t.reward, "num_actions": t.num_actions,
            "experience_ids": list(t.experience_ids), "experience_text": t.experience_text,
            "steps": [{"observation": s.observation, "action": s.action, "reward": s.reward, "kind": s.kind,
                       "tool_query": s.tool_query, "tool_answer": s.tool_answer} for s in t.steps]}
