"""The warm start's settings (WarmStartConfig, its format version) and the records it passes between stages:
demonstrated episodes (Demo, Turn) and SFT rows (SFTExample)."""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any

from trainers.config import PROMPT_DEFAULTS


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

    # Registered env names to learn: the recurring dark room (env.task_set configs), where an entry holds what the
    # actor cannot see (where the staircase is), so the demonstrations teach reading one (walk where it points) and
    # writing one (the extractor copies the env's debrief). One env: with two, the longer episodes of one crowd out
    # the other's examples (docs/history/results_discussion.md).
    envs: list[str] = field(default_factory=lambda: ["minihack/Room-Ultimate-5x5"])
    # Demonstrations name a task instance ("Dungeon 1017: ..."), as runs with env.task_set show it. Their ids start
    # at 1000, so a demonstrated level is never one of a run's tasks (ids 0..task_set-1 and the unseen ones after).
    task_ids: bool = True
    max_turns: int = 8  # turn limit of demonstrations and evaluation episodes (0 = the env's own); match env.max_turns
    demo_episodes: int = 3000  # scripted-expert episodes per env (far fewer: the policy memorises maps, not the heading)
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
    # Policy SFT optimiser steps on full prompts, after the short-prompt curriculum below (without it, full prompts
    # teach only the marginal over moves and the entry stays unread). More steps and DAgger episodes did not change
    # what the policy reads (docs/history/results_discussion.md).
    policy_steps: int = 300
    # Policy SFT steps first, on short prompts: the task line, the entry when there is one and the current
    # observation, without the system text or the history (its own optimiser and schedule). Copying what the action
    # depends on is learnable there and carries over to full prompts (benchmarks/results/copy_probe.md).
    short_prompt_steps: int = 200
    extractor_steps: int = 300  # extractor SFT optimiser steps on every example kind (~0.9 s each here, loaded)
    # Extractor SFT steps first, on short extraction prompts (`_extractor_prompt(short=True)`: no instructions, the
    # trajectory only the final observation's last line, the debrief), where what the answer copies lies as many
    # tokens back as in a full prompt: the copy is learnt there, not on full prompts alone.
    extractor_short_steps: int = 500
    extractor_short_batch_size: int = 16  # its sequences are ~290 tokens, a full one ~810: 4x the batch at ~1.5x the cost
    batch_size: int = 16  # sequences per policy SFT step
    extractor_batch_size: int = 4  # sequences per extractor SFT step (its sequences are about twice as long)
    threads: int = 0  # torch CPU threads while building; 0 = the cores left free by the current load (>= 1)
    # Train the extractor in a second process beside the policy on a machine with two or more cores (each takes half):
    # the two models share only the demonstrations and the tokenizer. The extractor then learns from the expert's
    # demonstrations alone, not the policy's DAgger episodes (24 of ~3,000). False: one after the other, in-process.
    parallel: bool = True
    # Weight of a language-model loss on the prompt tokens of each policy example, beside the loss on the action's
    # tokens (0 = action tokens only). It did not help copying (benchmarks/results/copy_probe.md).
    prompt_loss_weight: float = 0.0
    lr: float = 2e-3  # peak AdamW learning rate (linear warm-up, cosine decay to 10%)
    warmup_steps: int = 15  # linear warm-up steps
    weight_decay: float = 0.01  # AdamW weight decay
    max_seq_len: int = 1280  # longer SFT sequences are dropped (and counted), never cut
    # The prompt's shape, each field the run's setting of the same name (allow_tool: rollout.search_and_ask > 0). The
    # defaults are the run's: trainers/config.py PROMPT_DEFAULTS, where each is explained; a run that uses the
    # embedded models with other values is warned (embedded_build_mismatches).
    history_turns: int = PROMPT_DEFAULTS.history_turns  # actor prompt: earlier (observation, action) pairs
    history_chars: int = PROMPT_DEFAULTS.history_chars  # actor prompt: character budget of the history
    allow_tool: bool = PROMPT_DEFAULTS.search_and_ask > 0  # actor prompt: the system text offers search-and-ask
    trajectory_chars: int = PROMPT_DEFAULTS.trajectory_chars  # extractor prompt: trajectory_text max_chars
    op_budget: int = PROMPT_DEFAULTS.op_budget  # extractor prompt: the operation budget shown
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


