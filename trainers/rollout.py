"""Multi-turn rollouts: many episodes in lockstep, one batched generate call per turn.

    metrics = {}
    episodes = Roller(actor, pool, manager, ...).collect(specs, step=3, metrics=metrics)

Per episode: reset -> (retrieve experience with the task as query, when the spec says so) ->
turns of [prompt (system + task + experience + recent history + observation) -> reply -> action
or search-and-ask] until the env ends the episode or the turn limit. Each actor turn is one
training row: the prompt ids exactly as generated from, the reply ids, their log-probs under the
sampling model. Only reply tokens ever carry loss (observation, experience and tool-result text
lives in the prompt part of a row, which the learner masks).

`EpisodePlayer` plays one episode a turn at a time for the workbench's demo, with the same prompt
code, so what a person watches is what training does.
"""
from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from core.types import Step, Trajectory
from envs.base import instance_task, keeps_intro
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
        if len({i for i, _ in pairs}) != len(pairs) or any(not 0 <= i < self.pool.num_slots for i, _ in pairs):
            raise ValueError(f"slots must be distinct and within the pool's {self.pool.num_slots}")
        specs = [s for _, s in pairs]
        t0 = time.perf_counter()
        starts = self.pool.reset_many([(i, s.seed, None) for i, s in pairs])
        lives = [self._start(i, s, r) for (i, s), r in zip(pairs, starts)]
        # Retrieval at episode start (METHOD.md step 1): one call, batched by the manager.
        t_ret = 0.0
        same_task: float | None = None
        critic: dict[str, float] = {}
        want = [lv for lv in lives if lv.ep.spec.with_experience and not lv.done]
        if want and retrieval and self.manager is not None:
            t1 = time.perf_counter()
            hits = self.manager.search_sync([lv.ep.traj.task for lv in want], task=[lv.ep.spec.env for lv in want],
                                            scope=[lv.ep.traj.task for lv in want])
            t_ret = time.perf_counter() - t1
            for lv, hs in zip(want, hits):
                lv.ep.traj.experience_ids = [h.entry_id for h in hs]
                lv.ep.traj.experience_text = "\n\n".join(h.text for h in hs)
            # How often a retrieval returns an entry written for the episode's own task (on recurring tasks
            # the entries that can be right; on random seeds every episode shares one task text).
            found = [h.task == lv.ep.traj.task for lv, hs in zip(want, hits) for h in hs]
            if found:
                same_task = sum(found) / len(found)
            if self.rc.actor_critic:
                critic = self._critique(want, hits, step)
        tokens = replies = cut = prefill = 0
        turn = 0
        computed0 = getattr(self.actor, "prefill_computed", 0)
        while True:
            active = [lv for lv in lives if not lv.done]
            if not active:
                break
            prompts = [self.prompt_ids(lv) for lv in active]
            extra: dict[str, Any] = {"sessions": [id(lv) for lv in active]} if self._sessions() else {}
            if getattr(self.rc, "constrain_actions", False):
                extra["choices"] = [self.choice(lv) for lv in active]
            outs = self.actor.generate(prompts, max_new_tokens=self.ac.max_new_tokens, temperature=self.ac.temperature,
                                       top_p=self.ac.top_p, stop=P.reply_stops(self.style), seed=derive_seed(self.seed, step, turn),
                                       **extra)
            prefill += sum(len(p) for p in prompts)
            turn += 1
            to_step: list[tuple[_Live, str]] = []
            for lv, p, o in zip(active, prompts, outs):
                tokens += len(o.token_ids)
                replies += 1
                cut += o.finish_reason == "length"
                kind, content = P.parse_actor_reply(o.text, lv.admissible if self.style == "chat" else None)
                if kind == "tool" and (lv.tool_calls >= self.rc.search_and_ask or self.tool_fn is None):
                    kind, content = "action", o.text.strip()  # over the budget: the env judges it as an action
                lv.ep.turns.append(TurnSample(p, list(o.token_ids), list(o.logprobs), kind))
                if kind == "tool":
                    self._tool_turn(lv, content, step)
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
        if self._sessions():
            self.actor.drop_sessions([id(lv) for lv in lives])
        dt = time.perf_counter() - t0
        stats = {"rollout/seconds": dt, "rollout/episodes_per_s": len(specs) / max(dt, 1e-9),
                 "rollout/tokens_per_s": tokens / max(dt, 1e-9), "rollout/retrieval_s": t_ret,
                 "rollout/env_restarts": float(self.pool.restarts()),
                 # replies that ran out of actor.max_new_tokens before an end token or newline: a share
                 # near 1 means the budget cuts actions short (ALFWorld's "take X from Y" needs 9+ tokens)
                 "rollout/cut_replies": cut / max(1, replies), "rollout/turns": float(turn),
                 "rollout/prompt_tokens": float(prefill), **critic}
        if hasattr(self.actor, "prefill_computed"):
            # prompt tokens the model actually ran (the rest came from a kept cache, a shared prefix or a duplicate prompt)
            stats["rollout/prefill_tokens"] = float(self.actor.prefill_computed - computed0)
        if same_task is not None:
            stats["retrieval/same_task_rate"] = same_task
        tool_ms = [s.info["latency_ms"] for lv in lives for s in lv.ep.traj.steps if s.kind == "tool"]
        if tool_ms:  # one search-and-ask call, retrieval and the extractor's rewrite, as the actor waits for it
            stats["search_and_ask/latency_ms"] = sum(tool_ms) / len(tool_ms)
        if metrics is not None:
            metrics.update(stats)
        return [lv.ep for lv in lives]

    def _critique(self, lives: Sequence[_Live], hits: Sequence[Sequence[Any]], step: int) -> dict[str, float]:
        """Actor as critic (METHOD.md, optional): one batched call judges every retrieved entry;
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
        lv = _Live(ep, slot, r.action_format, r.obs, max_turns=max(1, limit), keep_intro=r.keep_intro,
                   admissible=[str(a) for a in (r.info or {}).get("admissible_actions") or []])
        if r.error:  # the env failed to start: a failed episode, the run goes on
            ep.error = r.error
            self._finish(lv, truncated=False)
        return lv

    def _tool_turn(self, lv: _Live, query: str, step: int) -> None:
        """Search-and-ask (METHOD.md step 2): the answer becomes the next observation; no env step."""
        lv.tool_calls += 1
        t0 = time.perf_counter()
        answer, ids, gen = self.tool_fn(lv.ep.traj.task, query, lv.ep.spec.env, step)
        ms = (time.perf_counter() - t0) * 1000
        obs = self.templates["TOOL_RESULT"].format(answer=answer or "(nothing relevant found)")
        lv.ep.traj.steps.append(Step(observation=lv.observation, action=f"<search_and_ask>{query}</search_and_ask>",
                                     kind="tool", tool_query=query, tool_answer=answer, info={"latency_ms": ms}))
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
                                     kind="invalid" if invalid else "action"))
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


class EpisodePlayer:
    """One episode, a turn at a time, for the workbench's demo: the same prompts as training, greedy.

        p = EpisodePlayer("minihack/Room-5x5", 3, data_dir=..., db_url=...)
        p.reset() -> turn dict; p.step() -> turn dict, until turn["done"]

    A turn dict: turn, observation, experience, action, reward, done, success, tool_query, tool_answer.
    A search-and-ask call is answered with the best library entry as it stands (the demo runs no
    extractor to rewrite it).
    """

    def __init__(self, env_name: str, seed: int, *, data_dir: str, db_url: str, checkpoint: str = "", use_library: bool = True,
                 max_new_tokens: int = 24, search_and_ask: int = 2, history_turns: int | None = None,
                 history_chars: int | None = None, prompt_style: str = "compact", actor: Any = None,
                 constrain_actions: bool = False):
        from core.config import LibraryConfig
        from envs.registry import make_env
        from trainers.config import RolloutSection, resolve_model_path
        from trainers.models import HFBackend

        path = checkpoint
        if checkpoint and (Path(checkpoint) / "policy" / "config.json").exists():
            path = str(Path(checkpoint) / "policy")  # a training checkpoint folder
        if not path:
            from trainers.warmstart import ensure_models

            ensure_models(data_dir)
            path = resolve_model_path("embedded:policy", data_dir)
        # `actor`: any back end (an openai endpoint serving the policy, for instance) instead of the folder
        self.actor = actor if actor is not None else HFBackend(path, device="cpu" if not _cuda() else "auto", num_threads=1)
        self.prompt_style = prompt_style
        self.constrain_actions = bool(constrain_actions)  # replies decoded constrained to the admissible actions, as training's
        self.admissible: list[str] = []
        self.env = make_env(env_name)
        self.env_name, self.seed = env_name, seed
        self.max_new_tokens, self.search_budget = max_new_tokens, search_and_ask
        defaults = RolloutSection()  # the prompt the embedded policy was trained on, unless told otherwise
        self.history_turns = defaults.history_turns if history_turns is None else history_turns
        self.history_chars = defaults.history_chars if history_chars is None else history_chars
        self.manager = None
        if use_library:
            import dataclasses

            from core.embedding import Embedder
            from core.manager import ExperienceManager
            from core.store import ExperienceStore

            lib = LibraryConfig()
            self.manager = ExperienceManager(ExperienceStore(db_url), Embedder(lib.embedding),
                                             dataclasses.replace(lib.manager, record_usage=False, random_demote=False), lib.index)
        self.history: list[tuple[str, str]] = []
        self.turn = 0
        self.done = False
        self.experience = ""
        self.observation = ""
        self.tool_calls = 0

    def reset(self) -> dict[str, Any]:
        self.observation, info = self.env.reset(seed=self.seed)
        self.admissible = [str(a) for a in info.get("admissible_actions") or []]
        self.history, self.turn, self.done, self.tool_calls = [], 0, False, 0
        self.experience = ""
        if self.manager is not None:
            hits = self.manager.search_sync([self.env.task], task=self.env_name)[0]
            self.experience = "\n\n".join(h.text for h in hits)
        return self._turn_dict(action="", reward=0.0, success=None)

    def step(self) -> dict[str, Any]:
        if self.done:
            raise RuntimeError("the episode is over; call reset() to play it again")
        allow_tool = self.manager is not None and self.tool_calls < self.search_budget
        history = P.fit_history(self.history, max_turns=self.history_turns, max_chars=self.history_chars,
                                keep_first=keeps_intro(self.env), stride=P.history_stride(self.prompt_style, self.history_turns))
        msgs = P.turn_messages(self.prompt_style, action_format=self.env.action_format, task=self.env.task,
                               observation=self.observation, experience=self.experience, history=history,
                               admissible=self.admissible, allow_tool=allow_tool)
        ids = list(self.actor.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True))
        choice = turn_choice(self.env_name, self.admissible, tool=allow_tool) if self.constrain_actions else None
        out = self.actor.generate([ids], max_new_tokens=self.max_new_tokens, temperature=0.0,
                                  stop=P.reply_stops(self.prompt_style), **({"choices": [choice]} if choice else {}))[0]
        kind, content = P.parse_actor_reply(out.text, self.admissible if self.prompt_style == "chat" else None)
        self.turn += 1
        if kind == "tool" and allow_tool:
            self.tool_calls += 1
            hits = self.manager.search_sync([content or self.env.task], task=self.env_name)[0]
            answer = hits[0].text if hits else "(nothing relevant found)"
            self.history.append((self.observation, f"<search_and_ask>{content}</search_and_ask>"))
            self.observation = f"{P.TOOL_RESULT.format(answer=answer)}\n\n{self.observation}"
            d = self._turn_dict(action=f"<search_and_ask>{content}</search_and_ask>", reward=0.0, success=None)
            d.update(tool_query=content, tool_answer=answer)
            return d
        action = content if kind == "action" else out.text.strip()
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.admissible = [str(a) for a in info.get("admissible_actions") or []]
        self.history.append((self.observation, action))
        self.observation = obs
        self.done = terminated or truncated
        return self._turn_dict(action=action, reward=float(reward), success=bool(info.get("success")) if self.done else None)

    def _turn_dict(self, *, action: str, reward: float, success: bool | None) -> dict[str, Any]:
        return {"turn": self.turn, "observation": self.observation, "experience": self.experience, "action": action,
                "reward": reward, "done": self.done, "success": success, "tool_query": "", "tool_answer": ""}

    def close(self) -> None:
        if self.manager is not None:
            self.manager.close()
        self.env.close()


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()
