"""The embedded default models: build a tiny policy and a tiny extractor and warm-start both.

    paths = ensure_models("~/.comprl")          # {"policy": .../models/policy, "extractor": .../models/extractor}

One pipeline, top to bottom (`_build`):
  1. collect scripted-expert episodes from the envs: no entry (~40%), a correct entry whose advice
     the expert follows (~45%), a wrong or irrelevant entry that the expert ignores (~15%); some
     episodes are played by an epsilon-noisy expert (random moves, invalid words) whose states are
     labelled with the expert's action, so the demonstrations show recovering from mistakes;
  2. train a byte-level BPE tokenizer on that text (prompts, actions, extractor answers);
  3. build two Qwen2 models of a few million parameters;
  4. SFT the policy on (actor prompt -> expert action); part-way, roll out the partly trained
     policy and relabel its own states with the expert (DAgger), then continue on the union;
  5. SFT the extractor on well-formed `<think>…</think><answer>[ops]</answer>` answers written by a
     rule-based teacher from expert and noisy trajectories, plus search-and-ask rewrites and merges;
  6. measure (greedy success and mean actions on held-out seeds with no / a correct / a wrong entry;
     the share of extractor answers that parse) and save both folders with a `warmstart.json`.

Every prompt comes from trainers/prompts.py, exactly as rollouts build them (FIELD-NOTES: a model
is only as good as the match between its training prompts and the prompts it is run on).
Folders are built in a temporary directory and renamed into place, so an interrupted build never
leaves a half model; a `warmstart.json` marker with the config hash makes `ensure_models` idempotent.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import random
import shutil
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from core.build_progress import BuildProgress, one_build_at_a_time
from core.types import format_entry_text
from envs.base import keeps_intro
from trainers import prompts as P
from trainers.models import BackendError, build_tiny_qwen2, build_tokenizer, load_backend, save_model_folder
from trainers.parsing import OP_BUDGET, parse_extractor_answer

__all__ = [
    "WarmStartConfig",
    "ensure_models",
    "models_command",
    "Demo",
    "SFTExample",
    "collect_demos",
    "policy_examples",
    "extractor_examples",
    "parse_extractor_answer",
    "MARKER",
    "FORMAT_VERSION",
]

MARKER = "warmstart.json"
# Bump when the pipeline changes in a way that should rebuild existing folders. 4: the tokenizer splits
# as the loaded one does; ALFWorld keeps its first observation in the prompt (env.keep_intro). 5: the policy's
# reply starts with a space (ACTION_LEAD); the dark room's teacher reads its entry's heading.
FORMAT_VERSION = 7  # (MiniHack teacher: the think quotes the debrief; add when it states the place, else nothing)
# The policy's demonstrated reply is " south", not "south": the byte-level tokenizer makes "south" at the start of a
# reply a different token from the " south" that the prompt holds ("head south.", "a step south brings you closer").
# With the models' tied embeddings, copying a token the prompt holds is close to an identity map, while "south" for
# " south" is a mapping to learn as well: on the dark room's readable turns, 100 short-prompt SFT steps reached a
# held-out accuracy of 0.96 (entry's heading) and 0.66 (observation's) with the space, 0.13 and 0.11 without
# (docs/results.md, twelfth round). parse_action strips it, so the env sees "south".
ACTION_LEAD = " "
IGNORE = -100  # label of a token that carries no loss

# Words a confused agent types: invalid in every MiniHack task, so the noisy expert's states teach recovery.
_INVALID_WORDS = ("go to the staircase", "look", "wait", "search", "up", "descend", "stairs", "forward", "move")
_DELTAS = {
    "north": (-1, 0), "east": (0, 1), "south": (1, 0), "west": (0, -1),
    "northeast": (-1, 1), "southeast": (1, 1), "southwest": (1, -1), "northwest": (-1, -1),
}


@dataclass
class WarmStartConfig:
    """How the embedded default models are built. Defaults fit ~10 minutes on a 2-core CPU."""

    # Registered env names to learn. One env by default: with two, Room-Ultimate's long episodes made
    # 3/4 of the examples and the policy never learned Room-Random's heading (per-turn accuracy 0.13).
    # The default is the recurring dark room (env.task_set configs): there an entry holds what the actor cannot see
    # (where the staircase is), so the demonstrations teach reading one (walk where it points) and writing one (the
    # extractor copies the env's debrief). On the lit Room-Random-5x5 the observation names the heading itself.
    envs: list[str] = field(default_factory=lambda: ["minihack/Room-Ultimate-5x5"])
    # Demonstrations name a task instance ("Dungeon 1017: ..."), as runs with env.task_set show it. Their ids start
    # at 1000, so a demonstrated level is never one of a run's tasks (ids 0..task_set-1 and the unseen ones after).
    task_ids: bool = True
    max_turns: int = 8  # turn limit of demonstrations and evaluation episodes (0 = the env's own); match env.max_turns
    demo_episodes: int = 3000  # scripted-expert episodes per env (with 300 the policy memorised maps instead of reading the heading)
    share_no_entry: float = 0.40  # share of demonstrations without an experience entry
    share_correct_entry: float = 0.45  # share with a correct entry the expert follows (the rest: a wrong entry, ignored)
    noisy_share: float = 0.35  # share of demo episodes played by an epsilon-noisy expert (states still labelled by the expert)
    noise_eps: float = 0.25  # per-turn chance that the noisy expert takes a random move or an invalid word
    dagger_episodes: int = 24  # per env: episodes of the partly trained policy whose states the expert relabels
    dagger_at: float = 0.55  # fraction of the policy's SFT steps after which the DAgger episodes are collected
    dagger_temperature: float = 1.0  # sampling temperature of the DAgger rollouts
    dagger_max_turns: int = 8  # a DAgger episode stops after this many turns (later states of a lost episode repeat)
    vocab_size: int = 2048  # byte-level BPE vocabulary size (both models share the tokenizer)
    policy_hidden: int = 128  # policy hidden size
    policy_layers: int = 4  # policy transformer layers
    policy_heads: int = 4  # policy attention heads
    policy_kv_heads: int = 2  # policy key/value heads (grouped-query attention)
    extractor_hidden: int = 128  # extractor hidden size
    extractor_layers: int = 4  # extractor transformer layers
    extractor_heads: int = 4  # extractor attention heads
    extractor_kv_heads: int = 2  # extractor key/value heads
    max_positions: int = 4096  # position embeddings of both models (the rollout's prompt + reply must fit)
    # Policy SFT optimiser steps. Deliberately short: on Room-Random-5x5, 150 steps already give greedy
    # success 1.00 on held-out seeds, which leaves an RL run nothing to show. Before ~75 steps the policy
    # has not learned to read the heading and is close to uniform over the 8 moves (70 steps: reply
    # entropy 1.17 nats per token), where GRPO found no signal in 10 steps; 90 steps sit just past it
    # (greedy 1.00 on the build's held-out seeds): the cliff is in docs/results.md. On the recurring dark room,
    # 400 steps on full prompts alone learned nothing but the marginal over moves (loss 1.0 per token: "northeast"
    # every turn, the entry unread); the short-prompt curriculum below comes first.
    policy_steps: int = 300
    # Policy SFT steps before the main ones on short prompts: the task line and the current observation,
    # without the system text, the history or an entry (its own optimiser and schedule). On ALFWorld a
    # policy trained on full prompts never learned to copy the task's object into "take"/"move" (1,400
    # steps: 0 of 24 held-out takes right); the same model copies after ~150 steps of short prompts, and
    # the skill carries over to full prompts within ~50 (a synthetic check: benchmarks/results/copy_probe.md).
    short_prompt_steps: int = 200  # with ACTION_LEAD the readable turns are learnt in ~100 (twelfth round)
    extractor_steps: int = 300  # extractor SFT optimiser steps on every example kind (~0.9 s each here, loaded)
    # Extractor SFT steps before the main ones on short extraction prompts (`_extractor_prompt(short=True)`: no
    # instructions, the trajectory only the final observation's last line, the debrief), where what the answer copies
    # lies as many tokens back as in a full prompt. 500-step builds on full prompts at batch 4 copied no offset right
    # (0/19, 0/13, 0/36); 400 short steps at batch 16 copied the debrief into the think right on 34/60 (thirteenth round).
    extractor_short_steps: int = 500
    extractor_short_batch_size: int = 16  # its sequences are ~290 tokens, a full one ~810: 4x the batch at ~1.5x the cost
    batch_size: int = 16  # sequences per policy SFT step
    extractor_batch_size: int = 4  # sequences per extractor SFT step (its sequences are about twice as long)
    threads: int = 0  # torch CPU threads while building; 0 = the cores left free by the current load (>= 1)
    # Train the extractor in a second process beside the policy on a machine with two or more cores (each takes half):
    # the two models share only the demonstrations and the tokenizer. The extractor then learns from the expert's
    # demonstrations alone, not the policy's DAgger episodes (24 of ~3,000). False: one after the other, in-process.
    parallel: bool = True
    # Weight of a language-model loss on the prompt tokens of each policy example, beside the loss on
    # the action's tokens (0 = action tokens only). The prompt repeats names (the task's object in the
    # task line, the listing and the observation), a signal for copying; measured, it did not help: at
    # 0.5 the synthetic copy probe stays at chance after 300 steps (benchmarks/results/copy_probe.md), as
    # does the 4.25M ALFWorld policy's "take" (0 of 24 after 300 more steps).
    prompt_loss_weight: float = 0.0
    lr: float = 2e-3  # peak AdamW learning rate (linear warm-up, cosine decay to 10%)
    warmup_steps: int = 15  # linear warm-up steps
    weight_decay: float = 0.01  # AdamW weight decay
    max_seq_len: int = 1280  # longer SFT sequences are dropped (and counted), never cut
    # Actor prompt: at most this many earlier (observation, action) pairs (must match the run's rollout.history_turns).
    # None on the dark room: its reader needs the task, the observation and the entry, and each history item (a whole
    # observation, ~150 tokens) made a step of SFT and of the run's rollouts and learner ~2x longer.
    history_turns: int = 0
    history_chars: int = 1200  # actor prompt: character budget of the history (must match the rollout)
    allow_tool: bool = False  # actor prompt: the system text that offers search-and-ask (must match the rollout)
    trajectory_chars: int = 1500  # extractor prompt: trajectory_text max_chars (must match the extractor consumer)
    op_budget: int = OP_BUDGET  # extractor prompt: the operation budget shown (must match extractor.op_budget)
    merge_every_demos: int = 4  # extractor SFT: one merge chunk (5 entries of a task) per this many demos of the task
    # Tokens generated per actor turn in the evaluation and DAgger rollouts: at least this many, and never
    # fewer than the longest demonstrated action and its end token. ALFWorld's "take soapbar 1 from
    # countertop 1" is 8 tokens even when every word is one (digits split off), more for a name that is
    # not; a fixed 8 would cut any longer action short.
    action_max_new_tokens: int = 8
    extractor_max_new_tokens: int = 320  # tokens generated per extractor answer in the parse-rate measurement
    eval_episodes: int = 8  # held-out episodes per env and condition (no / correct / wrong entry)
    eval_extractor: int = 24  # held-out trajectories for the extractor parse rate
    rollout_batch: int = 36  # episodes played in lockstep (one batched generate per turn) in DAgger and evaluation
    seed: int = 0  # one seed for everything (demo seeds, model init, batches)

    def __post_init__(self) -> None:
        if not self.envs:
            raise ValueError("WarmStartConfig.envs is empty: name at least one env, e.g. ['minihack/Room-5x5']")
        bad = [e for e in self.envs if not (e.startswith("minihack/") or e.startswith("alfworld/"))]
        if bad:
            raise ValueError(f"WarmStartConfig.envs: no warm-start demonstrations for {bad}; use minihack/* or alfworld/* envs")
        if not 0 <= self.share_no_entry + self.share_correct_entry <= 1:
            raise ValueError("WarmStartConfig.share_no_entry + share_correct_entry must lie in [0, 1]")
        if not 0 <= self.dagger_at <= 1:
            raise ValueError("WarmStartConfig.dagger_at must lie in [0, 1] (a fraction of policy_steps)")
        for name in ("demo_episodes", "policy_steps", "extractor_steps", "batch_size", "vocab_size", "max_seq_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"WarmStartConfig.{name} must be at least 1")
        if self.policy_hidden % self.policy_heads or self.extractor_hidden % self.extractor_heads:
            raise ValueError("WarmStartConfig: *_hidden must be divisible by *_heads")

    def digest(self) -> str:
        """Hash of everything that shapes the models: a changed config rebuilds them."""
        blob = json.dumps({"config": asdict(self), "format": FORMAT_VERSION}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


# ============================================================================ demonstrations

@dataclass
class Turn:
    """One state the expert labelled: what the actor saw and what it should have typed."""

    observation: str
    history: list[tuple[str, str]]  # full (observation, action) history before this turn, oldest first
    label: str  # the expert's action here (the SFT target)
    taken: str  # the action actually played (differs from label on a noisy turn)


@dataclass
class Demo:
    """One episode with the context the actor saw and the expert's labels."""

    env: str
    seed: int
    task: str
    action_format: str
    condition: str  # "none" | "correct" | "wrong"
    entry: str  # the experience entry shown ("" for none)
    turns: list[Turn]
    success: bool
    source: str  # "expert" | "noisy" | "dagger" | "eval"
    facts: dict[str, Any] = field(default_factory=dict)  # what the teacher knows: stairs offset, monsters, ...
    keep_intro: bool = False  # the env keeps its first observation in the prompt (envs/base.py)
    invalid_actions: int = 0  # played actions the env refused (its info["invalid_action"]); model rollouts only
    final_observation: str = ""  # what the env said after the last action (MiniHack's debrief: where the stairs were)


@dataclass
class SFTExample:
    """Token ids with labels: IGNORE everywhere except the target tokens."""

    input_ids: list[int]
    labels: list[int]
    kind: str = ""  # what it teaches (condition / source / extractor task), for counts


def _sign(x: int) -> int:
    return (x > 0) - (x < 0)


# ---------------------------------------------------------------------------- MiniHack

def _minihack_entry(task: str, facts: dict[str, Any], *, wrong: bool, rng: random.Random) -> str:
    """A correct entry states where the staircase is and how to get there; a wrong one points elsewhere."""
    dr, dc = facts["offset"] or (0, 0)
    if wrong:
        choices = [(a, b) for a in range(-4, 5) for b in range(-4, 5) if (a, b) != (0, 0)
                   and (_sign(a), _sign(b)) != (_sign(dr), _sign(dc))]
        if rng.random() < 0.3:  # irrelevant: advice for another kind of task
            return format_entry_text("Pick up the key first", "Locked rooms with a key",
                                     "Pick up the key, stand next to the locked door and apply the key, then walk in.")
        dr, dc = rng.choice(choices)
    # The form the extractor's teacher writes (_lesson), so the actor learns to read what a run's library holds.
    return format_entry_text("Where the staircase is", "Reaching the staircase down", _stairs_lesson(dr, dc))


def _stairs_lesson(dr: int, dc: int) -> str:
    """The content of a MiniHack entry: the env's debrief sentence word for word (the offset and the first
    heading; the extractor copies one span, `claimed_offset` reads it back), nothing before it: each token in front
    puts the copy one place further from the think's quote it repeats."""
    from envs.minihack import stairs_sentence

    s = stairs_sentence(dr, dc)
    return f"{s[0].upper()}{s[1:]}."


def _named_step(env: Any) -> str:
    """The step the observation names once the staircase is on the map ("a step south brings you closer"),
    '' before: the move toward it, read off the prompt."""
    from envs.minihack import heading_word

    for r, line in enumerate(env.grid):
        c = line.find(">")
        if c >= 0:
            return heading_word(r - env.agent_pos[0], c - env.agent_pos[1])
    return ""


# ---------------------------------------------------------------------------- ALFWorld

class _NoPlacement:
    """Priors without placement knowledge: the ALFWorld expert then searches receptacles in the
    order the room lists them, which is what an agent without an entry can do."""

    def __init__(self, priors: Any) -> None:
        self._priors = priors

    def placement(self, object_type: str) -> dict[str, float]:
        return {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._priors, name)


def _alfworld_action(env: Any, informed: bool) -> str:
    from envs.alfworld import alfworld_expert

    if informed:
        return alfworld_expert(env, mode="prior")
    real = env.priors
    env.priors = _NoPlacement(real)
    try:
        return alfworld_expert(env, mode="prior")
    finally:
        env.priors = real


def _a(noun: str) -> str:
    return f"{'an' if noun[:1] in 'aeiou' else 'a'} {noun}"


def _alfworld_entry(env: Any, *, wrong: bool, rng: random.Random) -> str:
    from envs.alfworld import prior_hint

    kind = env.goal.object_type
    if wrong:
        others = [o for o in env.priors.objects if o != kind and env.priors.placement(o) != env.priors.placement(kind)]
        other = rng.choice(others) if others else kind
        return format_entry_text(f"Where to find {_a(other)}", f"Finding {_a(other)} in a household", prior_hint(other, env.priors))
    return format_entry_text(f"Where to find {_a(kind)}", f"Finding {_a(kind)}: {env.task}", env.placement_hint())


# ---------------------------------------------------------------------------- episodes

def _condition(rng: random.Random, cfg: WarmStartConfig) -> str:
    u = rng.random()
    if u < cfg.share_no_entry:
        return "none"
    if u < cfg.share_no_entry + cfg.share_correct_entry:
        return "correct"
    return "wrong"


class _Teacher:
    """Per env: the entry for a task and condition, and the expert's action under that condition.

    MiniHack: with a correct entry the expert walks where it points until the staircase is in view
    (then straight to it); with a wrong one it also walks where the entry points, and when that leads
    nowhere it explores as with no entry (so a demonstration shows recovering from a wrong lesson);
    with none it explores."""

    def __init__(self, env: Any, *, task_ids: bool = False) -> None:
        from envs.entry_check import EntryChecker

        self.env = env
        self.minihack = env.name.startswith("minihack/")
        self.task_ids = task_ids
        self.task = ""
        self.facts: dict[str, Any] = {}
        self.heading = ""
        self.following = False  # walking where the entry points (MiniHack)
        self._last_pos: tuple[int, int] | None = None  # where the agent stood when it last took the entry's heading
        self._levels = EntryChecker() if self.minihack else None  # learns each level with a long turn budget

    def start(self, seed: int, condition: str, rng: random.Random) -> tuple[str, str, dict[str, Any]]:
        """Reset the env on `seed` (with task_ids: on task instance `seed`); returns (first observation,
        entry text, facts). `self.task` is the task text the actor sees."""
        from envs.base import instance_task, task_seed

        env_seed = task_seed(self.env.name, seed) if self.task_ids else seed
        if self.minihack:
            self.task = instance_task(self.env.name, seed, self.env.task) if self.task_ids else self.env.task
            self.facts = self._levels.level(self.env.name, env_seed)
            obs, _ = self.env.reset(seed=env_seed)
            entry = ""
            self.heading, self.following, self._last_pos = "", False, None
            if condition != "none" and self.facts["offset"] is not None:
                entry = _minihack_entry(self.task, self.facts, wrong=condition == "wrong", rng=rng)
                claim = _claimed(entry)
                if claim is not None:  # an irrelevant wrong entry claims nothing: the expert ignores it
                    from envs.minihack import first_heading

                    self.heading, self.following = first_heading(*claim), True
        else:
            obs, _ = self.env.reset(seed=env_seed)
            self.facts = {"object": self.env.goal.object_type, "hint": self.env.placement_hint()}
            entry = "" if condition == "none" else _alfworld_entry(self.env, wrong=condition == "wrong", rng=rng)
        self.task = instance_task(self.env.name, seed, self.env.task) if self.task_ids else self.env.task
        return obs, entry, dict(self.facts)

    def action(self, condition: str) -> str:
        if self.minihack:
            from envs.experts import expert_action

            env = self.env
            if "cannot escape" in env.message.lower():
                return expert_action(env)
            seen = _named_step(env)
            if seen:  # the observation names the step ("a step south brings you closer"): take it
                return seen
            if self.following:
                # A reader of the entry: its heading, every turn until the staircase is in view. A bump (the last
                # step left the agent where it was and no monster stands in the way: a wall) ends the reading;
                # then it explores.
                dr, dc = _DELTAS[self.heading]
                ahead = (env.agent_pos[0] + dr, env.agent_pos[1] + dc)
                if self._last_pos != env.agent_pos or ahead in env.monsters:
                    self._last_pos = env.agent_pos
                    return self.heading
            self.following = False
            return expert_action(env)
        return _alfworld_action(self.env, informed=condition == "correct")

    def random_action(self, rng: random.Random) -> str:
        if rng.random() < 0.35:
            return rng.choice(_INVALID_WORDS) if self.minihack else rng.choice(["search the room", "take it", "go to kitchen"])
        if self.minihack:
            return rng.choice(list(_DELTAS))
        adm = list(self.env._state.admissible_commands)
        return rng.choice(adm) if adm else "look"


def _claimed(entry: str) -> tuple[int, int] | None:
    from envs.minihack import claimed_offset

    return claimed_offset(entry)


def _play_expert(teacher: _Teacher, env_name: str, seed: int, condition: str, eps: float, rng: random.Random, source: str) -> Demo:
    obs, entry, facts = teacher.start(seed, condition, rng)
    env = teacher.env
    turns: list[Turn] = []
    history: list[tuple[str, str]] = []
    info: dict[str, Any] = {}
    while True:
        label = teacher.action(condition)
        taken = teacher.random_action(rng) if eps > 0 and rng.random() < eps else label
        turns.append(Turn(obs, list(history), label, taken))
        history.append((obs, taken))
        obs, _, term, trunc, info = env.step(taken)
        if term or trunc:
            break
    return Demo(env_name, seed, teacher.task, env.action_format, condition, entry, turns, bool(info.get("success")), source, facts,
                keep_intro=keeps_intro(env), final_observation=obs)


def collect_demos(cfg: WarmStartConfig, *, tick: Callable[[int], None] | None = None) -> list[Demo]:
    """Scripted-expert episodes from every env of `cfg` (step 1), seeds disjoint from evaluation's."""
    demos: list[Demo] = []
    for ei, name in enumerate(cfg.envs):
        env = _make_env(cfg, name)
        try:
            teacher = _Teacher(env, task_ids=cfg.task_ids)
            rng = random.Random(f"{cfg.seed}/demos/{name}")
            for i in range(cfg.demo_episodes):
                noisy = rng.random() < cfg.noisy_share
                seed = _demo_seed(cfg, ei, i)
                demos.append(_play_expert(teacher, name, seed, _condition(rng, cfg), cfg.noise_eps if noisy else 0.0,
                                          rng, "noisy" if noisy else "expert"))
                if tick:
                    tick(1)
        finally:
            env.close()
    return demos


def _make_env(cfg: WarmStartConfig, name: str) -> Any:
    from envs.registry import make_env

    return make_env(name, max_turns=cfg.max_turns) if cfg.max_turns else make_env(name)


# With task_ids these numbers are task instance ids (ids from 1000 on: never one of a run's tasks), else env seeds.
def _demo_seed(cfg: WarmStartConfig, env_index: int, i: int) -> int:
    if cfg.task_ids:
        return 1_000 + 100_000 * (cfg.seed * 10 + env_index) + i
    return 1_000_000 * (cfg.seed + 1) + 10_000 * env_index + i


def _dagger_seed(cfg: WarmStartConfig, env_index: int, i: int) -> int:
    if cfg.task_ids:
        return 1_000 + 100_000 * (cfg.seed * 10 + env_index) + 50_000 + i
    return 1_000_000 * (cfg.seed + 1) + 10_000 * env_index + 5_000 + i


def _eval_seed(env_index: int, i: int) -> int:
    return 900_000_000 + 10_000 * env_index + i  # held out: never a demo or DAgger seed (or task id)


# ============================================================================ SFT examples

def _actor_prompt(cfg: WarmStartConfig, demo: Demo, turn: Turn) -> list[dict[str, str]]:
    hist = P.fit_history(turn.history, max_turns=cfg.history_turns, max_chars=cfg.history_chars, keep_first=demo.keep_intro)
    return P.actor_messages(action_format=demo.action_format, task=demo.task, observation=turn.observation,
                            experience=demo.entry, history=hist, allow_tool=cfg.allow_tool)


def _chat_ids(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    res = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if not isinstance(res, list):
        res = res["input_ids"]
    return [int(t) for t in res]


def _join(tokenizer: Any, prompt_ids: list[int], target: str, kind: str) -> SFTExample:
    """Prompt and target tokenised separately and joined (a BPE merge across the boundary would
    shift the loss mask); the target ends with <|im_end|>, the token generation stops at."""
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    tgt = list(tokenizer(target, add_special_tokens=False)["input_ids"]) + [int(end)]
    return SFTExample(prompt_ids + tgt, [IGNORE] * len(prompt_ids) + tgt, kind)


def _short_prompt(demo: Demo, turn: Turn) -> list[dict[str, str]]:
    """The curriculum's prompt (`short_prompt_steps`): the actor's user message (task, the entry when the
    demonstration shows one, the observation) with no history and no system message. Short enough that
    a tiny model learns to copy what the action depends on: the entry's heading, the observation's."""
    return P.actor_messages(action_format=demo.action_format, task=demo.task, observation=turn.observation,
                            experience=demo.entry)[1:]


def _copyable(demo: Demo, turn: Turn) -> bool:
    """Whether the label can be read off the short prompt. MiniHack: the entry's heading while the staircase
    is out of sight, or the observation's heading once it is in sight (the exploring moves cannot be read off
    anything short, and with them in the curriculum the policy learned only the marginal over moves in 300
    steps). Every turn of other envs (ALFWorld copies the task's object)."""
    if not demo.env.startswith("minihack/"):
        return True
    if f"a step {turn.label} brings" in turn.observation:
        return True
    return bool(demo.entry) and f"head {turn.label}." in demo.entry and "not seen the staircase" in turn.observation


def policy_examples(demos: Sequence[Demo], tokenizer: Any, cfg: WarmStartConfig, *,
                    short: bool = False) -> tuple[list[SFTExample], int]:
    """(examples, number dropped for exceeding max_seq_len): one example per labelled turn, with the
    rollout's prompt, or with the curriculum's short one (`short`: only the turns whose action can be read
    off it, `_copyable`)."""
    out: list[SFTExample] = []
    dropped = 0
    for d in demos:
        for t in d.turns:
            if short and not _copyable(d, t):
                continue
            msgs = _short_prompt(d, t) if short else _actor_prompt(cfg, d, t)
            ex = _join(tokenizer, _chat_ids(tokenizer, msgs), ACTION_LEAD + t.label, f"policy/{'short/' if short else ''}{d.source}/{d.condition}")
            if len(ex.input_ids) > cfg.max_seq_len:
                dropped += 1
                continue
            out.append(ex)
    return out, dropped


# ---------------------------------------------------------------------------- the extractor's teacher

def _compress(actions: Sequence[str]) -> str:
    """'southeast x3, east' for a run of actions."""
    runs: list[list[Any]] = []
    for a in actions:
        if runs and runs[-1][0] == a:
            runs[-1][1] += 1
        else:
            runs.append([a, 1])
    return ", ".join(f"{a} x{n}" if n > 1 else a for a, n in runs)


def _lesson(demo: Demo) -> tuple[str, str]:
    """(entry text, one-line reason) the teacher distils from an episode: what worked, what to avoid."""
    taken = [t.taken for t in demo.turns]
    invalid = sorted({a for a in taken if a in _INVALID_WORDS})
    if demo.env.startswith("minihack/"):
        # Only what the trajectory shows: the debrief in its final observation says where the staircase was
        # (the extractor reads the same text); an episode that never saw it can only say where it was not.
        offset = _claimed(demo.final_observation)
        if offset is not None:
            title = "Where the staircase is"
            content = _stairs_lesson(*offset)
            reason = (f"The agent reached the staircase in {len(taken)} actions; where it is is worth keeping." if demo.success
                      else "The agent failed, but it saw the staircase: where it is is worth keeping.")
        else:
            title = "Mistakes that cost the episode"
            # (no list of the moves: a tiny extractor cannot copy 16 of them, and loops when it tries)
            content = f"The staircase down (>) was not seen in {len(taken)} actions: explore the parts of the room they did not reach."
            reason = f"The agent failed after {len(taken)} actions without seeing the staircase; the lesson is where it is not."
        if invalid:
            content += f" Words like '{invalid[0]}' are not actions and waste a turn: use compass directions only."
        desc = "Reaching the staircase down"  # the same words for every level (the store keeps the entry's task)
    else:
        obj = demo.facts.get("object", "object")
        title = f"Where to find {_a(obj)}"
        desc = f"Finding {_a(obj)}: {demo.task}"
        content = demo.facts.get("hint", "")
        if demo.success:
            content += f" Solved in {len(taken)} actions."
            reason = f"The agent solved the task in {len(taken)} actions; where the {obj} was is worth keeping."
        else:
            content += " Do not repeat an action that did nothing; open closed receptacles before taking from them."
            reason = "The agent failed; the lesson is where to look first and what not to repeat."
        if invalid:
            content += f" '{invalid[0]}' is not a valid action."
    return format_entry_text(title, desc, content), reason


def _answer(think: str, ops: list[dict[str, Any]]) -> str:
    return f"<think>{think}</think><answer>{json.dumps(ops, ensure_ascii=False)}</answer>"


def _debrief(demo: Demo) -> str:
    """The MiniHack debrief, word for word from the final observation ('Debrief: the staircase down (>) was 2 south
    and 0 east ...; from the start, head south.' or 'Debrief: you never saw the staircase down (>).'); '' elsewhere."""
    at = demo.final_observation.rfind("Debrief:")
    return demo.final_observation[at:].strip() if demo.env.startswith("minihack/") and at >= 0 else ""


def _debrief_quote(demo: Demo) -> str:
    """The debrief when it states where the staircase was; '' when it states none."""
    return _debrief(demo) if _claimed(demo.final_observation) is not None else ""


def _extractor_target(demo: Demo) -> tuple[list[dict[str, Any]], str]:
    """(ops, answer) the rule-based teacher writes for an episode.

    MiniHack: the think is the debrief word for word and nothing else. Where it says where the staircase was, the
    lesson repeats it and is added, whatever memory was shown (a right memory gains a twin the merges fold in, a
    wrong one a rival whose retrieval rewards tell them apart); where it says the staircase was never seen, nothing
    is written ([]): such a lesson gives the actor nothing to act on and took the top retrieval slot from a right
    one (thirteenth round: 80% of the library, 14-20% of entries right). So the op follows from the sentence just
    quoted, which a tiny extractor can learn, where v6's "update [0] when a memory was shown" was answered with no
    memory shown in 7 of 8 cases. Each op puts its text first (`{"new_memory": ...}`): the debrief ends the prompt,
    the quote starts the answer and the lesson follows after a fixed run of tokens, so both copies lie at a fixed
    distance for every level (the debrief's shape is fixed too, `stairs_sentence`). ALFWorld: nothing new when a
    correct memory was followed cleanly to success; replace a wrong memory (or refine a right one) with the lesson;
    else add the lesson."""
    lesson, reason = _lesson(demo)
    shown = demo.condition in ("correct", "wrong") and bool(demo.entry)
    ops: list[dict[str, Any]]
    if demo.env.startswith("minihack/"):
        ops = [{"new_memory": lesson, "function": "add"}] if _debrief_quote(demo) else []
        return ops, _answer(_debrief(demo) or reason, ops)
    if demo.condition == "correct" and demo.success and all(t.taken == t.label for t in demo.turns):
        ops = []
        think = "The memory shown was right and the agent followed it to success; nothing new was learned."
    elif shown:
        ops = [{"function": "update", "idx_list": [0], "updated_memory": lesson}]
        think = reason + (" The memory shown was wrong, so it is replaced." if demo.condition == "wrong"
                          else " The memory shown was right; it is updated with what this episode adds.")
    else:
        ops = [{"function": "add", "new_memory": lesson}]
        think = reason
    return ops, _answer(think, ops)


def _extractor_prompt(cfg: WarmStartConfig, demo: Demo, short: bool = False) -> list[dict[str, str]]:
    """The extraction prompt as the run's consumer builds it. `short` (the curriculum): no instructions, and the
    trajectory is only the last line of its final observation (how it ended; a MiniHack debrief says where the
    staircase was). The prompt still ends the same way, so everything the answer repeats lies as many tokens back
    as in the full prompt, and a step of ~180-token sequences teaches that copy at a fraction of a full step's cost."""
    steps = [] if short else [(t.observation, t.taken) for t in demo.turns]
    final = demo.final_observation.strip().splitlines()[-1] if short and demo.final_observation.strip() else demo.final_observation
    fields = dict(task=demo.task, outcome="success" if demo.success else "failure", num_actions=len(demo.turns),
                  previous=P.numbered([demo.entry] if demo.entry else []),
                  trajectory=P.trajectory_text(steps, max_chars=cfg.trajectory_chars, final=final), budget=cfg.op_budget)
    template = P.EXTRACTOR_HEAD + P.EXTRACTOR_TRAJECTORY if short else P.EXTRACTOR_USER
    return [{"role": "system", "content": P.EXTRACTOR_SYSTEM}, {"role": "user", "content": template.format(**fields)}]


_QUESTIONS = ("Which way is the goal?", "I cannot see where to go. What should I do?",
              "I keep bumping into something. What now?", "Where should I look first?")


def _rewrite_example(demo: Demo, rng: random.Random) -> tuple[list[dict[str, str]], str]:
    entry, _ = _lesson(demo) if not demo.entry else (demo.entry, "")
    q = rng.choice(_QUESTIONS)
    content = entry.split("## Content:", 1)[-1].strip()
    first = content.split(". ")[0].rstrip(".") + "."
    user = P.REWRITE_USER.format(task=demo.task, query=q, entry=entry)
    ans = f"<think>The agent asks: {q} The entry answers it directly.</think><answer>{first} {content[len(first):].strip()}".rstrip() + "</answer>"
    return [{"role": "system", "content": P.EXTRACTOR_SYSTEM}, {"role": "user", "content": user}], ans


def _merge_key(entry: str) -> str:
    """What an entry says, for the merge teacher: its title and the first sentence of its content
    (two lessons about the same staircase square or the same object's place say the same thing)."""
    title = entry.split("\n", 1)[0]
    content = entry.split("## Content:", 1)[-1].strip()
    return title + "|" + content.split(". ", 1)[0].rstrip(".")


def _merge_chunk(group: Sequence[Demo], rng: random.Random, size: int = 5) -> tuple[list[str], list[dict[str, Any]], str]:
    """A merge chunk shaped like a run's (`size` lessons of one task, several about the same thing,
    sometimes a wrong entry) and the teacher's answer: entries that say the same thing merge into the
    first listed one (the short form, no merged_memory); entries for another task are discarded."""
    lessons = [_lesson(d)[0] for d in group]
    by_key: dict[str, list[str]] = {}
    for text in lessons:
        by_key.setdefault(_merge_key(text), []).append(text)
    keys = list(by_key)
    rng.shuffle(keys)
    entries: list[str] = []
    for k in keys:
        if len(entries) >= size:
            break
        same = by_key[k]
        take = 1 if rng.random() < 0.5 else rng.randint(2, 3)
        entries += [rng.choice(same) for _ in range(min(take, size - len(entries)))]
    # Discarded: entries written for another kind of task (a wrong entry that names this task is
    # indistinguishable from a right one by reading it, so the teacher does not pretend to know).
    wrong = [d.entry for d in group if d.condition == "wrong" and d.entry and d.task not in d.entry]
    if wrong and rng.random() < 0.4:
        entries[-1] = rng.choice(wrong)
    rng.shuffle(entries)
    wrong_set = set(wrong)
    ops: list[dict[str, Any]] = []
    think: list[str] = []
    seen: dict[str, list[int]] = {}
    for i, e in enumerate(entries):
        if e not in wrong_set:
            seen.setdefault(_merge_key(e), []).append(i)
    for idx in seen.values():
        if len(idx) > 1:
            ops.append({"function": "merge", "idx_list": idx})
            think.append(f"Entries {idx} say the same thing.")
    bad = [i for i, e in enumerate(entries) if e in wrong_set]
    if bad:
        ops.append({"function": "discard", "idx_list": bad})
        think.append(f"Entry {bad[0]} is about another task.")
    ops.sort(key=lambda op: op["idx_list"][0])
    return entries, ops, _answer(" ".join(think) or "Every entry says something different.", ops)


def _merge_messages(task: str, entries: Sequence[str]) -> list[dict[str, str]]:
    user = P.MERGE_USER.format(task=task, entries=P.numbered(list(entries)))
    return [{"role": "system", "content": P.EXTRACTOR_SYSTEM}, {"role": "user", "content": user}]


def extractor_examples(demos: Sequence[Demo], tokenizer: Any, cfg: WarmStartConfig) -> tuple[list[SFTExample], int]:
    """Extraction answers for every demo, plus search-and-ask rewrites and merges (step 5)."""
    rng = random.Random(f"{cfg.seed}/extractor")
    pairs: list[tuple[list[dict[str, str]], str, str]] = []
    for d in demos:
        _, ans = _extractor_target(d)
        pairs.append((_extractor_prompt(cfg, d), ans, "extractor/extract"))
    for d in rng.sample(list(demos), k=min(len(demos), max(8, len(demos) // 6))):
        msgs, ans = _rewrite_example(d, rng)
        pairs.append((msgs, ans, "extractor/rewrite"))
    by_task: dict[str, list[Demo]] = {}
    for d in demos:
        by_task.setdefault(d.task, []).append(d)
    for task, group in by_task.items():
        for _ in range(max(8, len(group) // cfg.merge_every_demos)):
            entries, _, ans = _merge_chunk(rng.sample(group, k=min(len(group), 24)), rng)
            pairs.append((_merge_messages(task, entries), ans, "extractor/merge"))
    out, dropped = [], 0
    for msgs, ans, kind in pairs:
        ex = _join(tokenizer, _chat_ids(tokenizer, msgs), ans, kind)
        if len(ex.input_ids) > cfg.max_seq_len:
            dropped += 1
            continue
        out.append(ex)
    return out, dropped


# ============================================================================ training

def _sft(model: Any, examples: Sequence[SFTExample], steps: int, cfg: WarmStartConfig, *, pad_id: int, seed: int,
         batch_size: int,
         tick: Callable[[int], None] | None = None, start_step: int = 0, total_steps: int | None = None,
         optimizer: torch.optim.Optimizer | None = None,
         prompt_loss_weight: float = 0.0) -> tuple[torch.optim.Optimizer, list[float]]:
    """Supervised fine-tuning: mean cross-entropy over target tokens, plus `prompt_loss_weight` times
    the mean next-token cross-entropy over the prompt's tokens; AdamW, warm-up + cosine.

    Each batch is drawn at random and padded on the right; `start_step`/`total_steps` let the
    schedule continue across the DAgger pause with the same optimiser."""
    total = total_steps or steps
    opt = optimizer or torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.95))
    rng = random.Random(seed)
    losses: list[float] = []
    model.train()
    for s in range(start_step, start_step + steps):
        lr = cfg.lr * min(1.0, (s + 1) / max(1, cfg.warmup_steps))
        if s >= cfg.warmup_steps:
            frac = (s - cfg.warmup_steps) / max(1, total - cfg.warmup_steps)
            lr = cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))
        for g in opt.param_groups:
            g["lr"] = lr
        batch = [examples[rng.randrange(len(examples))] for _ in range(batch_size)]
        width = max(len(e.input_ids) for e in batch)
        ids = torch.full((len(batch), width), pad_id, dtype=torch.long)  # (B, T)
        labels = torch.full((len(batch), width), IGNORE, dtype=torch.long)  # (B, T)
        attn = torch.zeros((len(batch), width), dtype=torch.long)
        for i, e in enumerate(batch):
            ids[i, : len(e.input_ids)] = torch.tensor(e.input_ids)
            labels[i, : len(e.labels)] = torch.tensor(e.labels)
            attn[i, : len(e.input_ids)] = 1
        logits = model(input_ids=ids, attention_mask=attn, use_cache=False).logits[:, :-1].float()  # (B, T-1, V)
        flat = logits.reshape(-1, logits.shape[-1])
        target_loss = torch.nn.functional.cross_entropy(flat, labels[:, 1:].reshape(-1), ignore_index=IGNORE)
        loss = target_loss
        if prompt_loss_weight > 0:  # next-token loss on the prompt: real tokens that carry no target label
            prompt = ((labels[:, 1:] == IGNORE) & (attn[:, 1:] == 1)).reshape(-1)  # (B*(T-1),)
            if prompt.any():
                loss = loss + prompt_loss_weight * torch.nn.functional.cross_entropy(flat[prompt], ids[:, 1:].reshape(-1)[prompt])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(float(target_loss.item()))  # the target's loss alone, comparable across weights
        if tick:
            tick(1)
    model.eval()
    return opt, losses


# ============================================================================ rollouts (DAgger and evaluation)

@dataclass
class _Live:
    teacher: _Teacher
    demo: Demo
    obs: str
    history: list[tuple[str, str]]
    done: bool = False


def action_token_budget(tokenizer: Any, demos: Sequence[Demo], cfg: WarmStartConfig) -> int:
    """Tokens to generate per actor turn: `cfg.action_max_new_tokens`, or the longest demonstrated
    action plus its end token if that is longer."""
    labels = {t.label for d in demos for t in d.turns}
    longest = max((len(tokenizer(ACTION_LEAD + a, add_special_tokens=False)["input_ids"]) for a in labels), default=0)
    return max(cfg.action_max_new_tokens, longest + 1)


def _rollouts(backend: Any, cfg: WarmStartConfig, specs: Sequence[tuple[str, int, str]], *, temperature: float,
              seed: int, source: str, max_turns: int | None = None, max_new_tokens: int | None = None) -> list[Demo]:
    """Play the model on (env name, seed, condition), `cfg.rollout_batch` episodes in lockstep.
    Every state is labelled with the expert's action for that condition (DAgger); the model's own
    action is what is played. `max_turns` cuts episodes short (they then count as failures);
    `max_new_tokens` per turn defaults to `cfg.action_max_new_tokens`."""
    out: list[Demo] = []
    for i in range(0, len(specs), cfg.rollout_batch):
        out += _rollout_chunk(backend, cfg, specs[i : i + cfg.rollout_batch], temperature=temperature,
                              seed=seed + i, source=source, max_turns=max_turns,
                              max_new_tokens=max_new_tokens or cfg.action_max_new_tokens)
    return out


def _rollout_chunk(backend: Any, cfg: WarmStartConfig, specs: Sequence[tuple[str, int, str]], *, temperature: float,
                   seed: int, source: str, max_turns: int | None, max_new_tokens: int) -> list[Demo]:
    rng = random.Random(seed)
    lives: list[_Live] = []
    envs: list[Any] = []
    try:
        for name, s, cond in specs:
            env = _make_env(cfg, name)
            envs.append(env)
            teacher = _Teacher(env, task_ids=cfg.task_ids)
            obs, entry, facts = teacher.start(s, cond, rng)
            demo = Demo(name, s, teacher.task, env.action_format, cond, entry, [], False, source, facts,
                        keep_intro=keeps_intro(env))
            lives.append(_Live(teacher, demo, obs, []))
        turn = 0
        while any(not lv.done for lv in lives):
            active = [lv for lv in lives if not lv.done]
            msgs = [_actor_prompt(cfg, lv.demo, Turn(lv.obs, lv.history, "", "")) for lv in active]
            prompts = [backend.apply_chat_template(m, add_generation_prompt=True, tokenize=True) for m in msgs]
            outs = backend.generate(prompts, max_new_tokens=max_new_tokens, temperature=temperature,
                                    stop=["\n"], seed=seed * 1000 + turn)
            turn += 1
            for lv, out in zip(active, outs):
                _, action = P.parse_actor_reply(out.text)
                label = lv.teacher.action(lv.demo.condition)
                lv.demo.turns.append(Turn(lv.obs, list(lv.history), label, action))
                lv.history.append((lv.obs, action))
                lv.obs, _, term, trunc, info = lv.teacher.env.step(action)
                lv.demo.invalid_actions += bool(info.get("invalid_action"))
                if term or trunc or (max_turns is not None and len(lv.demo.turns) >= max_turns):
                    lv.done = True
                    lv.demo.success = bool(info.get("success"))
                    lv.demo.final_observation = lv.obs if term or trunc else ""
    finally:
        for env in envs:
            env.close()
    return [lv.demo for lv in lives]


def _evaluate_policy(backend: Any, cfg: WarmStartConfig, max_new_tokens: int | None = None) -> tuple[dict[str, Any], list[Demo]]:
    """Greedy success and mean actions (failures count at the turn limit) on held-out seeds."""
    specs = [(name, _eval_seed(ei, i), cond) for ei, name in enumerate(cfg.envs)
             for cond in ("none", "correct", "wrong") for i in range(cfg.eval_episodes)]
    demos = _rollouts(backend, cfg, specs, temperature=0.0, seed=cfg.seed + 7, source="eval", max_new_tokens=max_new_tokens)
    res: dict[str, Any] = {}
    for name in cfg.envs:
        for cond in ("none", "correct", "wrong"):
            ds = [d for d in demos if d.env == name and d.condition == cond]
            ref = [d.facts.get("expert_actions") for d in ds if d.facts.get("expert_actions") is not None]
            res[f"{name}/{cond}"] = {
                "episodes": len(ds),
                "success": sum(d.success for d in ds) / max(1, len(ds)),
                "mean_actions": sum(len(d.turns) for d in ds) / max(1, len(ds)),
                "invalid_share": sum(d.invalid_actions for d in ds) / max(1, sum(len(d.turns) for d in ds)),
                **({"expert_mean_actions": sum(ref) / len(ref)} if ref else {}),
            }
    return res, demos


def _evaluate_extractor(backend: Any, cfg: WarmStartConfig, demos: Sequence[Demo]) -> dict[str, Any]:
    """Share of greedy extraction answers on held-out trajectories that parse as operation lists."""
    rng = random.Random(cfg.seed + 11)
    pick = rng.sample(list(demos), k=min(cfg.eval_extractor, len(demos)))
    prompts = [backend.apply_chat_template(_extractor_prompt(cfg, d), add_generation_prompt=True, tokenize=True) for d in pick]
    outs = backend.generate(prompts, max_new_tokens=cfg.extractor_max_new_tokens, temperature=0.0, seed=cfg.seed)
    parsed = [parse_extractor_answer(o.text, n_previous=1 if d.entry else 0) for o, d in zip(outs, pick)]
    ok = [p for p in parsed if p is not None]
    # MiniHack: is what the entries claim true of the level the trajectory came from (envs/entry_check.py)? And of
    # the trajectories whose debrief says where the staircase was, how many answers wrote an entry that says it?
    right = checkable = stated = copied = quoted = 0
    for p, d, o in zip(parsed, pick, outs):
        offset = d.facts.get("offset") if d.env.startswith("minihack/") else None
        if offset is None:
            continue
        claims = [_claimed(op.text) for op in (p or []) if op.text]
        checkable += sum(c is not None for c in claims)
        right += sum(c == tuple(offset) for c in claims)
        if _debrief_quote(d):
            stated += 1
            copied += tuple(offset) in claims
            quoted += _debrief_quote(d) in o.text.split("</think>", 1)[0]
    merge = _evaluate_merge(backend, cfg, demos)
    return {
        "answers": len(pick),
        "parse_rate": len(ok) / max(1, len(pick)),
        "ops_per_answer": sum(len(p) for p in ok) / max(1, len(ok)),
        "parse_rate_with_ops": sum(1 for p in ok if p) / max(1, len(pick)),  # parsed and not the empty list
        **({"entries_checked": checkable, "entry_correct_share": right / checkable} if checkable else {}),
        **({"debriefs_stated": stated, "debrief_copied_share": copied / stated, "debrief_quoted_share": quoted / stated}
           if stated else {}),
        "example": outs[0].text[:600] if outs else "",
        **merge,
    }


def _evaluate_merge(backend: Any, cfg: WarmStartConfig, demos: Sequence[Demo]) -> dict[str, Any]:
    """Greedy merge answers on held-out chunks (lessons of the evaluation episodes): the share that
    parses, the share with at least one operation, and the share equal to the teacher's answer."""
    from core.types import Experience
    from trainers.parsing import _answer_json, parse_merge

    rng = random.Random(cfg.seed + 13)
    by_task: dict[str, list[Demo]] = {}
    for d in demos:
        by_task.setdefault(d.task, []).append(d)
    chunks = [(task, *_merge_chunk(rng.sample(g, k=min(len(g), 24)), rng)) for task, g in by_task.items()
              for _ in range(max(1, cfg.eval_extractor // max(1, len(by_task))))]
    if not chunks:
        return {}
    prompts = [backend.apply_chat_template(_merge_messages(task, entries), add_generation_prompt=True, tokenize=True)
               for task, entries, _, _ in chunks]
    outs = backend.generate(prompts, max_new_tokens=cfg.extractor_max_new_tokens, temperature=0.0, seed=cfg.seed)
    parsed = exact = with_ops = 0
    for (task, entries, ops, _), o in zip(chunks, outs):
        got = parse_merge(o.text, [Experience(id=i, text=t) for i, t in enumerate(entries)])
        parsed += got is not None
        with_ops += bool(got)
        data, err = _answer_json(o.text)
        exact += not err and data == ops
    n = len(chunks)
    return {"merge_answers": n, "merge_parse_rate": parsed / n, "merge_parse_rate_with_ops": with_ops / n,
            "merge_exact_rate": exact / n, "merge_example": outs[0].text[:400]}


# ============================================================================ the build

def _free_cores() -> int:
    """Cores not taken by other processes: on a loaded 2-core machine one torch thread runs several
    times faster than two that spin against the load (measured: 1.1 s vs 6.5 s per SFT step)."""
    n = os.cpu_count() or 1
    try:
        load = os.getloadavg()[0]
    except OSError:
        return n
    return max(1, min(n, int(n - load + 0.5)))


def _children_cpu_s() -> float:
    t = os.times()
    return t.children_user + t.children_system


def _count_params(model: Any) -> int:
    return sum(p.numel() for p in model.parameters())


def demo_tokenizer(cfg: WarmStartConfig, demos: Sequence[Demo]) -> Any:
    """The byte-level BPE both models share, trained on the prompt templates, sampled actor prompts and the
    extractor teacher's answers (enough text that whole words and phrases become tokens: shorter prompts, faster
    steps)."""
    texts = [P.ACTOR_SYSTEM, P.ACTOR_SYSTEM_NO_TOOL, P.EXPERIENCE_BLOCK, P.ACTOR_USER, P.HISTORY_ITEM, P.TOOL_RESULT,
             P.EXTRACTOR_SYSTEM, P.EXTRACTOR_USER, P.MERGE_USER, P.REWRITE_USER]
    rng = random.Random(cfg.seed)
    for d in demos:
        for t in rng.sample(d.turns, k=min(4, len(d.turns))):
            texts.append("\n".join(m["content"] for m in _actor_prompt(cfg, d, t)) + "\n" + t.label)
        texts.append(_extractor_target(d)[1])
    return build_tokenizer(texts, vocab_size=cfg.vocab_size, model_max_length=cfg.max_positions)


def train_extractor(cfg: WarmStartConfig, demos: Sequence[Demo], tokenizer: Any, *, tick: Callable[[int], None] | None = None,
                    stage: Callable[[str], None] | None = None) -> tuple[Any, list[SFTExample], int, list[float], list[float]]:
    """The extractor's stages (steps 4-5): extraction on short prompts, then every example kind.
    Returns (model, examples, dropped, losses, short-prompt losses)."""
    stage = stage or (lambda name: None)
    pad_id = int(tokenizer.pad_token_id)
    stage("extractor SFT")
    ext_ex, ext_dropped = extractor_examples(demos, tokenizer, cfg)
    if not ext_ex:
        raise RuntimeError(f"no extractor example fits max_seq_len={cfg.max_seq_len}; raise WarmStartConfig.max_seq_len")
    extractor = build_tiny_qwen2(tokenizer, cfg.extractor_hidden, cfg.extractor_layers, cfg.extractor_heads,
                                 cfg.extractor_kv_heads, max_pos=cfg.max_positions, seed=cfg.seed + 1)
    short_losses: list[float] = []
    if cfg.extractor_short_steps > 0:
        stage("extractor SFT (short prompts)")
        short_pairs = [(_extractor_prompt(cfg, d, short=True), _extractor_target(d)[1]) for d in demos if d.final_observation]
        short_ex = [ex for ex in (_join(tokenizer, _chat_ids(tokenizer, m), a, "extractor/short") for m, a in short_pairs)
                    if len(ex.input_ids) <= cfg.max_seq_len]
        if short_ex:
            _, short_losses = _sft(extractor, short_ex, cfg.extractor_short_steps, cfg, pad_id=pad_id, seed=cfg.seed + 5,
                                   batch_size=cfg.extractor_short_batch_size, tick=tick)
        stage("extractor SFT")
    _, losses = _train_extractor(extractor, ext_ex, cfg, pad_id, tick or (lambda n: None))
    return extractor, ext_ex, ext_dropped, losses, short_losses


def _extractor_summary(extractor: Any, ext_ex: Sequence[SFTExample], dropped: int, losses: list[float],
                       short_losses: list[float]) -> dict[str, Any]:
    return {"params": _count_params(extractor), "examples": len(ext_ex), "dropped_too_long": dropped,
            "loss_first": round(sum(losses[:10]) / max(1, len(losses[:10])), 4),
            "loss_last": round(sum(losses[-10:]) / max(1, len(losses[-10:])), 4),
            **({"short_prompt": {"steps": len(short_losses), "loss_first": round(sum(short_losses[:10]) / 10, 4),
                                 "loss_last": round(sum(short_losses[-10:]) / 10, 4)}} if len(short_losses) >= 10 else {}),
            "kinds": dict(Counter(e.kind for e in ext_ex))}


def _extractor_process(cfg: WarmStartConfig, demos: list[Demo], tokenizer: Any, out: str, threads: int, done: Any) -> None:
    """The extractor's build in a child process (spawned: `_build` with `cfg.parallel`): trains, saves the model
    folder to `out` and its summary to `out`/summary.json, or the error to `out`/error.txt. `done` counts its SFT
    steps for the parent's progress bar."""
    out_dir = Path(out)
    try:
        torch.set_num_threads(threads)
        torch.manual_seed(cfg.seed)

        def tick(n: int) -> None:
            with done.get_lock():
                done.value += n

        extractor, ext_ex, dropped, losses, short_losses = train_extractor(cfg, demos, tokenizer, tick=tick)
        save_model_folder(extractor, tokenizer, out_dir)
        (out_dir / "summary.json").write_text(json.dumps(_extractor_summary(extractor, ext_ex, dropped, losses, short_losses)))
    except BaseException as exc:  # noqa: BLE001 - reported by the parent, which raises
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "error.txt").write_text(f"{type(exc).__name__}: {exc}")
        raise


class _ExtractorBeside:
    """The extractor trained in a spawned process while this one trains the policy; `drain` forwards its steps to
    the progress bar, `join` waits for it and returns its summary (raises with its error), `stop` ends it."""

    def __init__(self, cfg: WarmStartConfig, demos: list[Demo], tokenizer: Any, out: Path, threads: int,
                 bar_update: Callable[[int], None]) -> None:
        import multiprocessing as mp

        ctx = mp.get_context("spawn")  # not fork: torch's thread pools do not survive a fork
        self._done = ctx.Value("i", 0)
        self._seen = 0
        self._out, self._bar_update = out, bar_update
        self._proc = ctx.Process(target=_extractor_process, args=(cfg, demos, tokenizer, str(out), threads, self._done),
                                 name="comprl-extractor-build", daemon=True)
        self._proc.start()

    def drain(self) -> None:
        n = self._done.value
        if n > self._seen:
            self._bar_update(n - self._seen)
            self._seen = n

    def join(self) -> dict[str, Any]:
        while self._proc.is_alive():
            self._proc.join(0.5)
            self.drain()
        self.drain()
        err = self._out / "error.txt"
        if self._proc.exitcode != 0 or err.is_file():
            why = err.read_text() if err.is_file() else f"exit code {self._proc.exitcode}"
            raise RuntimeError(f"the extractor's build process failed: {why}")
        return json.loads((self._out / "summary.json").read_text())

    def stop(self) -> None:
        if self._proc.is_alive():
            self._proc.terminate()
            self._proc.join(5)


def _build(tmp: Path, cfg: WarmStartConfig, progress: bool) -> dict[str, Any]:
    """Steps 1-6 into `tmp/policy` and `tmp/extractor`; returns the measured results."""
    t0, c0, children_c0 = time.time(), time.process_time(), _children_cpu_s()
    torch.manual_seed(cfg.seed)
    threads = cfg.threads or _free_cores()
    # With cfg.parallel the extractor trains beside the policy, each process on half the threads (at least one):
    # when threads were asked for, if there are two or more; else on any machine with two cores, even a busy one (two
    # one-thread processes take two shares of a contended CPU, where two threads of one process spin against the load).
    beside_threads = 0
    if cfg.parallel and (threads >= 2 if cfg.threads else (os.cpu_count() or 1) >= 2):
        beside_threads = max(1, threads // 2)
        threads = max(1, threads - beside_threads)
    beside: _ExtractorBeside | None = None
    load_at_start = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    n_envs = len(cfg.envs)
    units = cfg.demo_episodes * n_envs + cfg.short_prompt_steps + cfg.policy_steps + cfg.extractor_short_steps + cfg.extractor_steps + 3
    bar = BuildProgress(tmp.parent, total=units, desc="comprl models init", disable=not progress)  # core/build_progress.py
    timings: dict[str, float] = {}
    old_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    from transformers.utils import logging as hf_logging

    bars_were_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # one progress bar: ours, not a "Loading weights" bar per reload
    try:
        def stage(name: str) -> None:
            bar.set_postfix_str(name)
            timings[name] = round(time.time() - t0, 1)

        stage("demos")
        demos = collect_demos(cfg, tick=bar.update)

        stage("tokenizer")
        tokenizer = demo_tokenizer(cfg, demos)
        bar.update(1)
        pad_id = int(tokenizer.pad_token_id)
        action_tokens = action_token_budget(tokenizer, demos, cfg)
        if beside_threads:
            beside = _ExtractorBeside(cfg, list(demos), tokenizer, tmp / "extractor", beside_threads, bar.update)

        def tick(n: int) -> None:
            bar.update(n)
            if beside is not None:
                beside.drain()

        stage("policy SFT")
        pol_ex, pol_dropped = policy_examples(demos, tokenizer, cfg)
        if not pol_ex:
            raise RuntimeError(f"no policy example fits max_seq_len={cfg.max_seq_len}; raise WarmStartConfig.max_seq_len")
        policy = build_tiny_qwen2(tokenizer, cfg.policy_hidden, cfg.policy_layers, cfg.policy_heads, cfg.policy_kv_heads,
                                  max_pos=cfg.max_positions, seed=cfg.seed)
        short_losses: list[float] = []
        if cfg.short_prompt_steps > 0:
            stage("policy SFT (short prompts)")
            short_ex, _ = policy_examples(demos, tokenizer, cfg, short=True)
            _, short_losses = _sft(policy, short_ex, cfg.short_prompt_steps, cfg, pad_id=pad_id, seed=cfg.seed + 4,
                                   batch_size=cfg.batch_size, tick=tick, prompt_loss_weight=cfg.prompt_loss_weight)
            stage("policy SFT")
        first = int(round(cfg.policy_steps * cfg.dagger_at)) if cfg.dagger_episodes > 0 else cfg.policy_steps
        opt, losses = _sft(policy, pol_ex, first, cfg, pad_id=pad_id, seed=cfg.seed, batch_size=cfg.batch_size,
                           tick=tick, total_steps=cfg.policy_steps, prompt_loss_weight=cfg.prompt_loss_weight)

        dagger_stats: dict[str, Any] = {}
        if cfg.dagger_episodes > 0 and cfg.policy_steps - first > 0:
            stage("DAgger")
            save_model_folder(policy, tokenizer, tmp / "policy")
            backend = load_backend("hf", tmp / "policy", device="cpu", quiet=True)
            crng = random.Random(f"{cfg.seed}/dagger")
            specs = [(name, _dagger_seed(cfg, ei, i), _condition(crng, cfg)) for ei, name in enumerate(cfg.envs)
                     for i in range(cfg.dagger_episodes)]
            dag = _rollouts(backend, cfg, specs, temperature=cfg.dagger_temperature, seed=cfg.seed + 3, source="dagger",
                            max_turns=cfg.dagger_max_turns, max_new_tokens=action_tokens)
            del backend
            dag_ex, d2 = policy_examples(dag, tokenizer, cfg)
            pol_dropped += d2
            dagger_stats = {"episodes": len(dag), "states": len(dag_ex),
                            "sampled_success": sum(d.success for d in dag) / max(1, len(dag)),
                            "disagreement": sum(t.label != t.taken for d in dag for t in d.turns) / max(1, sum(len(d.turns) for d in dag))}
            stage("policy SFT (DAgger)")
            opt, more = _sft(policy, pol_ex + dag_ex, cfg.policy_steps - first, cfg, pad_id=pad_id, seed=cfg.seed + 1,
                             batch_size=cfg.batch_size, tick=tick, start_step=first, total_steps=cfg.policy_steps, optimizer=opt,
                             prompt_loss_weight=cfg.prompt_loss_weight)
            losses += more
            shutil.rmtree(tmp / "policy")
            demos += dag
        del opt

        if beside is None:
            extractor, ext_ex, ext_dropped, ext_losses, ext_short_losses = train_extractor(
                cfg, demos, tokenizer, tick=bar.update, stage=stage)
            save_model_folder(extractor, tokenizer, tmp / "extractor")
            ext_summary = _extractor_summary(extractor, ext_ex, ext_dropped, ext_losses, ext_short_losses)
            del extractor

        stage("save")
        save_model_folder(policy, tokenizer, tmp / "policy")
        bar.update(1)

        stage("evaluate")
        pol_backend = load_backend("hf", tmp / "policy", device="cpu", quiet=True)
        pol_eval, eval_demos = _evaluate_policy(pol_backend, cfg, action_tokens)
        del pol_backend
        if beside is not None:
            stage("waiting for the extractor")
            ext_summary = beside.join()
            beside = None
            stage("evaluate the extractor")
        ext_backend = load_backend("hf", tmp / "extractor", device="cpu", quiet=True)
        ext_eval = _evaluate_extractor(ext_backend, cfg, eval_demos)
        del ext_backend
        bar.update(1)
        timings["done"] = round(time.time() - t0, 1)
    finally:
        if beside is not None:  # the policy's build failed or was interrupted
            beside.stop()
        bar.close()
        torch.set_num_threads(old_threads)
        if bars_were_on:
            hf_logging.enable_progress_bar()

    kinds = Counter(ext_summary.pop("kinds")) + Counter(e.kind for e in pol_ex)
    return {
        "policy": {"params": _count_params(policy), "examples": len(pol_ex), "dropped_too_long": pol_dropped,
                   "loss_first": round(sum(losses[:10]) / max(1, len(losses[:10])), 4),
                   "loss_last": round(sum(losses[-10:]) / max(1, len(losses[-10:])), 4),
                   **({"short_prompt": {"steps": len(short_losses), "loss_first": round(sum(short_losses[:10]) / len(short_losses[:10]), 4),
                                        "loss_last": round(sum(short_losses[-10:]) / len(short_losses[-10:]), 4)}} if short_losses else {}),
                   "dagger": dagger_stats, "eval": pol_eval, "action_max_new_tokens": action_tokens},
        "extractor": {**ext_summary, "eval": ext_eval, "beside_the_policy": bool(beside_threads)},
        "demos": {"episodes": sum(1 for d in demos if d.source in ("expert", "noisy")),
                  "expert_success": sum(d.success for d in demos if d.source == "expert") / max(1, sum(d.source == "expert" for d in demos)),
                  "conditions": {c: sum(d.condition == c for d in demos) for c in ("none", "correct", "wrong")}},
        "example_counts": dict(kinds),
        "vocab": len(tokenizer),
        "timings_s": timings,
        "wall_s": round(time.time() - t0, 1),
        # CPU seconds of this process and, when the extractor trained beside it, of that process too (a child's are
        # counted once it has been waited for): the build's whole CPU cost, not its wall time.
        "cpu_s": round(time.process_time() - c0 + _children_cpu_s() - children_c0, 1),
        "threads": threads + beside_threads,
        "load_avg_at_start": round(load_at_start, 2),
    }


def _train_extractor(model: Any, examples: Sequence[SFTExample], cfg: WarmStartConfig, pad_id: int,
                     tick: Callable[[int], None]) -> tuple[torch.optim.Optimizer, list[float]]:
    return _sft(model, examples, cfg.extractor_steps, cfg, pad_id=pad_id, seed=cfg.seed + 2,
                batch_size=cfg.extractor_batch_size, tick=tick)


# ============================================================================ public entry points

def _marker_ok(folder: Path, digest: str) -> bool:
    try:
        data = json.loads((folder / MARKER).read_text())
    except (OSError, json.JSONDecodeError):
        return False
    return data.get("hash") == digest and (folder / "config.json").is_file()


@one_build_at_a_time  # one build per models folder at a time; others wait (core/build_progress.py)
def ensure_models(data_dir: str | os.PathLike, cfg: WarmStartConfig | None = None, *, force: bool = False,
                  progress: bool = True) -> dict[str, Path]:
    """The default policy and extractor folders under `data_dir/models`, built when missing, built
    with another config, or when `force`; otherwise returned at once. Never leaves a half model:
    both are built in a temporary folder and renamed into place only when complete.

    Called without `cfg` (what `embedded:` model paths do), it will not replace a custom build (one
    made with an explicit config, e.g. `comprl models init --envs ...` or `--policy-steps N`): that
    raises BackendError naming the way out, instead of silently rebuilding over hours of warm start."""
    implied = cfg is None
    cfg = cfg or WarmStartConfig()
    root = Path(data_dir).expanduser() / "models"
    paths = {"policy": root / "policy", "extractor": root / "extractor"}
    digest = cfg.digest()
    if not force and all(_marker_ok(p, digest) for p in paths.values()):
        return paths
    if implied and not force:
        custom = _custom_build(paths["policy"])
        if custom is not None:
            raise BackendError(
                f"{root} holds a custom warm start ({custom}), and `embedded:` model paths mean the default build, which would "
                f"replace it. Name the custom models by path (actor.path: {paths['policy']}, extractor.model.path: "
                f"{paths['extractor']}), use another --data-dir for the default, or replace them with `comprl models init --force`.")
    root.mkdir(parents=True, exist_ok=True)
    for stale in root.glob(".building-*"):  # left by a process killed outright (SIGKILL)
        shutil.rmtree(stale, ignore_errors=True)
    tmp = root / f".building-{os.getpid()}-{int(time.time())}"
    tmp.mkdir()
    try:
        results = _build(tmp, cfg, progress)
        for name in ("policy", "extractor"):
            marker = {"built_by": "trainers/warmstart.py", "role": name, "hash": digest, "format": FORMAT_VERSION,
                      "config": asdict(cfg), "custom": not implied and cfg != WarmStartConfig(), "results": results,
                      "built_at": time.strftime("%Y-%m-%d %H:%M:%S")}
            (tmp / name / MARKER).write_text(json.dumps(marker, indent=2))
        for name, dest in paths.items():
            old = root / f".old-{name}-{os.getpid()}"
            if dest.exists():
                dest.rename(old)
            (tmp / name).rename(dest)
            shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return paths


def _custom_build(folder: Path) -> str | None:
    """What differs from the default in a custom build's config, or None for a default (or no) build."""
    try:
        data = json.loads((folder / MARKER).read_text())
    except (OSError, json.JSONDecodeError):
        return None
    if not data.get("custom"):
        return None
    default = asdict(WarmStartConfig())
    diff = [f"{k}={v}" for k, v in (data.get("config") or {}).items() if default.get(k) != v]
    return ", ".join(diff) or "a non-default config"


def _folder_size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def models_command(action: str, data_dir: str, force: bool = False, envs: list[str] | None = None,
                   policy_steps: int | None = None, extractor_steps: int | None = None,
                   overrides: list[str] | None = None) -> int:
    """`comprl models init [--force] [--envs A,B] [--set FIELD=VALUE ...]` and `comprl models list`; returns
    the exit code. With `envs`, the warm start plays those envs instead of the default's (e.g. ALFWorld for
    an ALFWorld study); `overrides` set any other `WarmStartConfig` field (YAML values, type-checked), e.g.
    `policy_hidden=256`. Such models are used by naming their folders (`actor.path`,
    `extractor.model.path`), since `embedded:` always means the default build."""
    if action == "init":
        cfg = None
        changes: dict[str, Any] = {}
        if envs:
            from envs.registry import list_envs

            unknown = [e for e in envs if e not in list_envs()]
            if unknown:
                raise ValueError(f"unknown env(s) {unknown}; `comprl envs` lists them")
            changes["envs"] = list(envs)
        if policy_steps is not None:
            changes["policy_steps"] = policy_steps
        if extractor_steps is not None:
            changes["extractor_steps"] = extractor_steps
        if overrides:
            from trainers.config import parse_overrides

            parsed = parse_overrides(overrides)
            nested = sorted(k for k, v in parsed.items() if isinstance(v, dict))
            if nested:
                raise ValueError(f"--set {nested[0]}.…: the warm-start config has no sections; "
                                 f"name a field of WarmStartConfig, e.g. --set policy_hidden=256")
            clash = sorted(set(parsed) & set(changes))
            if clash:
                raise ValueError(f"--set {clash[0]} repeats --{clash[0].replace('_', '-')}; give it once")
            changes.update(parsed)
        if changes:
            # ConfigError (a ValueError) for an unknown field or a wrong type; ValueError from __post_init__
            # for envs without a scripted expert, steps < 1, a hidden size the heads do not divide.
            from core.config import from_dict

            cfg = from_dict(WarmStartConfig, changes)
        paths = ensure_models(data_dir, cfg, force=force)
        for name, p in paths.items():
            print(f"{name}: {p}")
        return 0
    if action == "list":
        root = Path(data_dir).expanduser() / "models"
        folders = sorted(p for p in root.glob("*") if p.is_dir() and not p.name.startswith(".")) if root.is_dir() else []
        if not folders:
            print(f"No models under {root}; build the defaults with `comprl models init`.")
            return 0
        for p in folders:
            line = f"{p.name}: {p}  {_folder_size(p) / 1e6:.1f} MB"
            try:
                info = json.loads((p / "comprl_model.json").read_text())
                line += f", {info['params'] / 1e6:.2f}M params"
            except (OSError, json.JSONDecodeError, KeyError):
                pass
            print(line)
            try:
                marker = json.loads((p / MARKER).read_text())
            except (OSError, json.JSONDecodeError):
                continue
            res = marker.get("results", {})
            if marker.get("role") == "policy":
                for key, r in res.get("policy", {}).get("eval", {}).items():
                    print(f"  {key}: success {r['success']:.2f}, mean actions {r['mean_actions']:.1f} ({r['episodes']} held-out episodes)")
            elif marker.get("role") == "extractor":
                r = res.get("extractor", {}).get("eval", {})
                if r:
                    print(f"  parse rate {r['parse_rate']:.2f} on {r['answers']} held-out trajectories")
            print(f"  built {marker.get('built_at', '?')} in {res.get('wall_s', '?')} s, config hash {marker.get('hash')}")
        return 0
    print(f"Unknown models action {action!r}: use `comprl models init [--force]` or `comprl models list`.")
    return 2
