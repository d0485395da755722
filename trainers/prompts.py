"""Every prompt the models see, in one place, so that warm-start data, rollouts, evaluation and the
demo build byte-identical contexts (a model is only as good as the match between the prompts it
was trained on and the prompts it is run on).

Actor turn (ChatML through the tokenizer's chat template):
    system:    ACTOR_SYSTEM with the env's action format
    user:      task, optional experience block, the last few (observation, action) pairs, the
               current observation
    assistant: one action, or <search_and_ask>query</search_and_ask>, ended by <|im_end|>

Extractor (METHOD.md step 3): task, outcome, the previous memories shown (numbered), the
trajectory, the operation budget -> `<think>…</think><answer>[ops]</answer>`.

Templates are plain `str.format` strings; a user overrides them by config
(`extractor.templates_file`: a YAML mapping template name -> text).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import yaml

ACTOR_SYSTEM = (
    "You are an agent playing a text game. Reply with exactly one action and nothing else.\n"
    "{action_format}\n"
    "If you are stuck you may instead ask the experience library: <search_and_ask>your question</search_and_ask>"
)
ACTOR_SYSTEM_NO_TOOL = "You are an agent playing a text game. Reply with exactly one action and nothing else.\n{action_format}"
EXPERIENCE_BLOCK = "Experience from earlier episodes (it may be wrong; check it against what you see):\n{experience}\n"
# The experience block comes last, right before the answer: a tiny model learns to act on what sits next to its
# answer (the lit room's heading at the end of the observation) long before it learns to look back across the
# prompt (an entry placed before the history stayed unread after 300 SFT steps; docs/results.md, eleventh round).
ACTOR_USER = "Task: {task}\n{history}Observation:\n{observation}\n{experience_block}Your action:"
HISTORY_ITEM = "Earlier observation:\n{observation}\nYour action then: {action}\n"
TOOL_RESULT = "Answer from the experience library:\n{answer}"
# Actor as critic (METHOD.md, optional): the actor judges a retrieved entry before the episode uses it.
ACTOR_CRITIC = (
    "Task: {task}\nAn entry from the experience library:\n{entry}\n"
    "Will this entry help you with this task? Reply with one word: accept, refine or reject."
)

EXTRACTOR_SYSTEM = (
    "You maintain a library of short lessons (experience entries) that help an agent solve tasks. "
    "Each entry has the form '## Title: ...\\n## Description: ...\\n## Content: ...'."
)
EXTRACTOR_USER = (
    "Task: {task}\nOutcome: {outcome} after {num_actions} actions.\n"
    "Previous memories shown to the agent:\n{previous}\n"
    "Trajectory:\n{trajectory}\n"
    "Write at most {budget} operations. Answer as <think>your reasoning</think><answer>[...]</answer> where the list holds "
    '{{"function": "add", "new_memory": "..."}} or {{"function": "update", "idx_list": [indices of previous memories], '
    '"updated_memory": "..."}}; an empty list [] when nothing new was learned.'
)
MERGE_USER = (
    "Task: {task}\nThese library entries are numbered:\n{entries}\n"
    "Merge entries that say the same thing, discard wrong or useless ones, keep the rest. Answer as "
    "<think>...</think><answer>[...]</answer> with operations "
    '{{"function": "merge", "idx_list": [...]}} (keeps the first listed entry\'s text for the group; add '
    '"merged_memory": "..." to write a new text) or {{"function": "discard", "idx_list": [...]}}; [] keeps everything.'
)
REWRITE_USER = (
    "The agent is working on: {task}\nIts question: {query}\nThe most relevant library entry:\n{entry}\n"
    "Rewrite the entry as a short, direct answer to the question for this situation. "
    "Answer as <think>...</think><answer>your answer</answer>."
)

TEMPLATE_NAMES = ("ACTOR_SYSTEM", "ACTOR_SYSTEM_NO_TOOL", "EXPERIENCE_BLOCK", "ACTOR_USER", "HISTORY_ITEM", "TOOL_RESULT", "ACTOR_CRITIC",
                  "EXTRACTOR_SYSTEM", "EXTRACTOR_USER", "MERGE_USER", "REWRITE_USER")

SEARCH_AND_ASK = re.compile(r"<search_and_ask>(.*?)(?:</search_and_ask>|$)", re.S)


@dataclass
class Templates:
    """The prompt texts; `load_templates` overrides any of them from a YAML file."""

    texts: dict[str, str] = field(default_factory=lambda: {n: globals()[n] for n in TEMPLATE_NAMES})

    def __getitem__(self, name: str) -> str:
        return self.texts[name]


def load_templates(path: str | None) -> Templates:
    t = Templates()
    if not path:
        return t
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"templates file {p} {'is a folder' if p.is_dir() else 'does not exist'}; give a YAML file")
    data = yaml.safe_load(p.read_text()) or {}
    if not isinstance(data, dict):
        raise ValueError(f"templates file {p} must be a mapping of template name -> text")
    unknown = sorted(set(data) - set(TEMPLATE_NAMES))
    if unknown:
        raise ValueError(f"unknown template {unknown[0]!r} in {p}; known: {', '.join(TEMPLATE_NAMES)}")
    t.texts.update({k: str(v) for k, v in data.items()})
    return t


DEFAULT_TEMPLATES = Templates()


def actor_messages(
    *,
    action_format: str,
    task: str,
    observation: str,
    experience: str = "",
    history: Sequence[tuple[str, str]] = (),
    allow_tool: bool = False,
    templates: Templates = DEFAULT_TEMPLATES,
) -> list[dict[str, str]]:
    """The conversation for one actor turn. `history` holds (observation, action) pairs, oldest first,
    already cut to the budget by the caller (`fit_history`)."""
    system = templates["ACTOR_SYSTEM" if allow_tool else "ACTOR_SYSTEM_NO_TOOL"].format(action_format=action_format)
    exp_block = templates["EXPERIENCE_BLOCK"].format(experience=experience.strip()) if experience.strip() else ""
    hist = "".join(templates["HISTORY_ITEM"].format(observation=o, action=a) for o, a in history)
    user = templates["ACTOR_USER"].format(task=task, experience_block=exp_block, history=hist, observation=observation)
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def fit_history(history: Sequence[tuple[str, str]], *, max_turns: int, max_chars: int,
                keep_first: bool = False) -> list[tuple[str, str]]:
    """The most recent (observation, action) pairs within a turn and character budget.

    `keep_first` also keeps the episode's first pair, ahead of the recent ones and inside the same
    character budget (ALFWorld names the room's receptacles only in its first observation)."""
    pairs = list(history)
    first: list[tuple[str, str]] = []
    if keep_first and pairs and max_turns > 0 and len(pairs[0][0]) + len(pairs[0][1]) <= max_chars:
        first, pairs = pairs[:1], pairs[1:]
        max_chars -= len(first[0][0]) + len(first[0][1])
    out: list[tuple[str, str]] = []
    used = 0
    for o, a in reversed(pairs[-max_turns:] if max_turns > 0 else []):
        used += len(o) + len(a)
        if used > max_chars:
            break
        out.append((o, a))
    return first + out[::-1]


def parse_actor_reply(text: str) -> tuple[str, str]:
    """("tool", query) for a search-and-ask call, else ("action", the first non-empty line)."""
    m = SEARCH_AND_ASK.search(text)
    if m:
        return "tool", m.group(1).strip()
    for line in text.strip().splitlines():
        if line.strip():
            return "action", line.strip()
    return "action", ""


CRITIC_SCORES = {"accept": 1.0, "refine": 0.5, "reject": 0.0}


def critic_messages(*, task: str, entry: str, templates: Templates = DEFAULT_TEMPLATES) -> list[dict[str, str]]:
    """The conversation in which the actor judges one retrieved entry (actor as critic)."""
    return [{"role": "system", "content": "You judge advice before you use it."},
            {"role": "user", "content": templates["ACTOR_CRITIC"].format(task=task, entry=entry.strip())}]


def parse_critic_reply(text: str) -> float | None:
    """accept -> 1, refine -> 0.5, reject -> 0 (METHOD.md); the first of those words in the reply, or None."""
    m = re.search(r"\b(accept|refine|reject)", text.lower())
    return CRITIC_SCORES[m.group(1)] if m else None


def trajectory_text(steps: Sequence[tuple[str, str]], *, max_chars: int = 3000, final: str = "") -> str:
    """(observation, action) pairs as the extractor reads them, then the observation after the last
    action (`final`: how it ended); the middle is elided when too long, never the end."""
    parts = [f"[{i}] Observation: {o.strip()}\n[{i}] Action: {a}" for i, (o, a) in enumerate(steps)]
    if final.strip():
        parts.append(f"[{len(steps)}] Final observation: {final.strip()}")
    text = "\n".join(parts)
    if len(text) <= max_chars:
        return text
    head, tail = text[: max_chars // 3], text[-(2 * max_chars) // 3:]
    return f"{head}\n…\n{tail}"


def numbered(texts: Sequence[str]) -> str:
    return "\n".join(f"[{i}] {t}" for i, t in enumerate(texts)) if texts else "(none)"
