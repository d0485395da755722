"""Every prompt the models see, in one place, so that warm-start data, rollouts, evaluation and the
demo build byte-identical contexts (a model is only as good as the match between the prompts it
was trained on and the prompts it is run on).

Actor turn (ChatML through the tokenizer's chat template):
    system:    ACTOR_SYSTEM with the env's action format
    user:      task, optional experience block, the last few (observation, action) pairs, the
               current observation
    assistant: one action, or <search_and_ask>query</search_and_ask>, ended by <|im_end|>

Extractor (docs/method.md step 3): task, outcome, the previous memories shown (numbered), the
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

from trainers.parsing import parse_action

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
# Actor as critic (docs/method.md, optional): the actor judges a retrieved entry before the episode uses it.
ACTOR_CRITIC = (
    "Task: {task}\nAn entry from the experience library:\n{entry}\n"
    "Will this entry help you with this task? Reply with one word: accept, refine or reject."
)

EXTRACTOR_SYSTEM = (
    "You maintain a library of short lessons (experience entries) that help an agent solve tasks. "
    "Each entry has the form '## Title: ...\\n## Description: ...\\n## Content: ...'."
)
# The trajectory comes last: how the episode ended (a MiniHack debrief says where the staircase was) sits right
# before the answer, which quotes it; with the instructions after it, the quote was 124 tokens back and a tiny
# extractor copied 0 of 36 debriefs after 500 steps (docs/results.md, thirteenth round).
EXTRACTOR_HEAD = "Task: {task}\nOutcome: {outcome} after {num_actions} actions.\nPrevious memories shown to the agent:\n{previous}\n"
EXTRACTOR_RULES = (
    "Write at most {budget} operations. Answer as <think>your reasoning</think><answer>[...]</answer> where the list holds "
    '{{"function": "add", "new_memory": "..."}} or {{"function": "update", "idx_list": [indices of previous memories], '
    '"updated_memory": "..."}}; an empty list [] when nothing new was learned.\n'
)
EXTRACTOR_TRAJECTORY = "Trajectory:\n{trajectory}"
EXTRACTOR_USER = EXTRACTOR_HEAD + EXTRACTOR_RULES + EXTRACTOR_TRAJECTORY
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

# -- the chat set (rollout.prompt_style: chat): for pretrained instruction-tuned models -----------------------
# A real chat model given the compact prompt above copies the observation (SmolLM2-135M-Instruct: 0 of 12
# valid actions on MiniHack and on ALFWorld). What fixed it: the admissible actions in the prompt, one
# example exchange in front, and a multi-turn layout (each past observation a user message, each past
# action an assistant message). The layout also makes each turn's prompt extend the last one, so a
# back end that keeps an episode's KV cache prefills only the new turn (trainers/backends/hf.py sessions).
#
#   system:    CHAT_SYSTEM (the reply grammar and the env's rules)
#   user:      CHAT_EXAMPLE_USER       } one or more example exchanges, separated by a line "---"
#   assistant: CHAT_EXAMPLE_ASSISTANT  }
#   user:      CHAT_FIRST (task, experience block) + CHAT_TURN (first kept observation)
#   assistant: action    } the history window, moved in strides so the prefix stays put between moves
#   user:      CHAT_TURN  }
#   user:      ... the current observation with its admissible actions (CHAT_ACTIONS), "Your action:"
CHAT_SYSTEM = (
    "You are playing a text game. Each turn, choose one action from the list of admissible actions and reply with "
    "that action only, exactly as written.\nRules of this game: {action_format}{tool}"
)
CHAT_TOOL = ("\nIf you are stuck you may instead ask the experience library, replying "
             "<search_and_ask>your question</search_and_ask>.")
# Two made-up exchanges, a household and a grid (measured on SmolLM2-135M-Instruct: with none it copies the
# observation or the task sentence; with one whose answer resembles the task, "take mug 2 …", it wrote "put …").
CHAT_EXAMPLE_USER = (
    "Task: put a clean mug on the shelf.\nObservation:\nYou are in the kitchen. Looking quickly around you, you see a "
    "cabinet 1, a shelf 1, a sinkbasin 1 and a countertop 1.\n\nYour task is to: put a clean mug on the shelf.\n"
    "Admissible actions:\n- go to cabinet 1\n- go to countertop 1\n- go to shelf 1\n- go to sinkbasin 1\n- inventory\n- look\n"
    "Which action do you take?"
    "\n---\n"
    "Task: reach the door.\nObservation:\nYou stand in a corridor. The door is 2 squares north of you.\n"
    "Admissible actions:\n- north\n- east\n- south\n- west\nWhich action do you take?"
)
CHAT_EXAMPLE_ASSISTANT = "go to countertop 1\n---\nnorth"
CHAT_FIRST = "Task: {task}\n{experience_block}"
CHAT_EXPERIENCE_BLOCK = "Experience from earlier episodes (it may be wrong; check it against what you see):\n{experience}\n"
CHAT_TURN = "Observation:\n{observation}\n{actions_block}Which action do you take?"
CHAT_ACTIONS = "Admissible actions:\n{actions}\n"  # {actions}: one "- action" line each
# "" (the default): past turns are user/assistant messages. A text such as "Earlier observation:\n{observation}\n
# You did: {action}\n" puts them inside the current user message instead, so the model sees no assistant turns of
# its own to repeat (on 12 ALFWorld turn-2/3 states SmolLM2 gave 8 valid of 12 this way, 5 with assistant turns).
CHAT_PAST_INLINE = ""

TEMPLATE_NAMES = ("ACTOR_SYSTEM", "ACTOR_SYSTEM_NO_TOOL", "EXPERIENCE_BLOCK", "ACTOR_USER", "HISTORY_ITEM", "TOOL_RESULT", "ACTOR_CRITIC",
                  "EXTRACTOR_SYSTEM", "EXTRACTOR_USER", "MERGE_USER", "REWRITE_USER",
                  "CHAT_SYSTEM", "CHAT_TOOL", "CHAT_EXAMPLE_USER", "CHAT_EXAMPLE_ASSISTANT", "CHAT_FIRST", "CHAT_EXPERIENCE_BLOCK",
                  "CHAT_TURN", "CHAT_ACTIONS", "CHAT_PAST_INLINE")
PROMPT_STYLES = ("compact", "chat")
MAX_LISTED_ACTIONS = 60  # admissible actions shown per turn (ALFWorld lists ~20-50)

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
                keep_first: bool = False, stride: int = 1) -> list[tuple[str, str]]:
    """The most recent (observation, action) pairs within a turn and character budget.

    `keep_first` also keeps the episode's first pair, ahead of the recent ones and inside the same
    character budget (ALFWorld names the room's receptacles only in its first observation).

    `stride` > 1 moves the window's start only in steps of `stride` pairs (the chat set): between
    moves each turn's history extends the previous one, so a kept KV cache covers it; the window
    then holds between max_turns - stride + 1 and max_turns pairs."""
    pairs = list(history)
    first: list[tuple[str, str]] = []
    if keep_first and pairs and max_turns > 0 and len(pairs[0][0]) + len(pairs[0][1]) <= max_chars:
        first, pairs = pairs[:1], pairs[1:]
        max_chars -= len(first[0][0]) + len(first[0][1])
    if stride > 1 and max_turns > 0:
        n = len(pairs)
        start = -(-max(0, n - max_turns) // stride) * stride  # the first multiple of stride that fits the turn budget
        while start < n and sum(len(o) + len(a) for o, a in pairs[start:]) > max_chars:
            start += stride
        return first + pairs[start:]
    out: list[tuple[str, str]] = []
    used = 0
    for o, a in reversed(pairs[-max_turns:] if max_turns > 0 else []):
        used += len(o) + len(a)
        if used > max_chars:
            break
        out.append((o, a))
    return first + out[::-1]


def parse_actor_reply(text: str, admissible: Sequence[str] | None = None) -> tuple[str, str]:
    """("tool", query) for a search-and-ask call, else ("action", the action): trainers/parsing.py
    `parse_action` reads it (first non-empty line; with `admissible`, tolerant of extra words,
    quotes and "Action: …")."""
    m = SEARCH_AND_ASK.search(text)
    if m:
        return "tool", m.group(1).strip()
    return "action", parse_action(text, admissible)


def chat_actor_messages(
    *,
    action_format: str,
    task: str,
    observation: str,
    experience: str = "",
    history: Sequence[tuple[str, str]] = (),
    admissible: Sequence[str] = (),
    allow_tool: bool = False,
    templates: Templates = DEFAULT_TEMPLATES,
) -> list[dict[str, str]]:
    """The chat set's conversation for one actor turn (see CHAT_SYSTEM above): rules, example
    exchange(s), then the episode as alternating user (observation) / assistant (action) messages.
    Only the current observation lists the admissible actions, so past turns render the same every
    turn and the prompt grows by appending."""
    t = templates
    msgs = [{"role": "system", "content": t["CHAT_SYSTEM"].format(action_format=action_format.strip(),
                                                                  tool=t["CHAT_TOOL"] if allow_tool else "")}]
    users = [u.strip() for u in t["CHAT_EXAMPLE_USER"].split("\n---\n") if u.strip()]
    replies = [a.strip() for a in t["CHAT_EXAMPLE_ASSISTANT"].split("\n---\n") if a.strip()]
    for u, a in zip(users, replies):
        msgs += [{"role": "user", "content": u}, {"role": "assistant", "content": a}]
    exp = experience.strip()
    head = t["CHAT_FIRST"].format(task=task, experience_block=t["CHAT_EXPERIENCE_BLOCK"].format(experience=exp) if exp else "")
    inline = "".join(t["CHAT_PAST_INLINE"].format(observation=o.strip(), action=a) for o, a in history) \
        if t["CHAT_PAST_INLINE"] else None
    turns = [(o, a) for o, a in history] + [(observation, None)] if inline is None else [(observation, None)]
    for i, (o, a) in enumerate(turns):
        listed = [x for x in admissible][:MAX_LISTED_ACTIONS] if a is None else []
        block = t["CHAT_ACTIONS"].format(actions="\n".join(f"- {x}" for x in listed)) if listed else ""
        body = (inline or "") + t["CHAT_TURN"].format(observation=o.strip(), actions_block=block)
        msgs.append({"role": "user", "content": (head + body) if i == 0 else body})
        if a is not None:
            msgs.append({"role": "assistant", "content": a})
    return msgs


def turn_messages(style: str, *, action_format: str, task: str, observation: str, experience: str = "",
                  history: Sequence[tuple[str, str]] = (), admissible: Sequence[str] = (), allow_tool: bool = False,
                  templates: Templates = DEFAULT_TEMPLATES) -> list[dict[str, str]]:
    """One actor turn's conversation in either prompt style (rollouts, evaluation and the demo all call this)."""
    if style == "chat":
        return chat_actor_messages(action_format=action_format, task=task, observation=observation, experience=experience,
                                   history=history, admissible=admissible, allow_tool=allow_tool, templates=templates)
    if style != "compact":
        raise ValueError(f"prompt style must be one of {', '.join(PROMPT_STYLES)}, not {style!r}")
    return actor_messages(action_format=action_format, task=task, observation=observation, experience=experience,
                          history=history, allow_tool=allow_tool, templates=templates)


def history_stride(style: str, history_turns: int) -> int:
    """How far the history window moves at once: half the window, in both styles, so that between moves each turn's
    prompt extends the last one's past the point where the last one's current observation began (chat: its user
    message, which loses its action list; compact: "Observation:", which becomes that pair's history item) and a
    prefix cache (vLLM's, the hf back end's episode sessions) serves it. A window moved every turn (stride 1, the
    compact set's before) kept only the system text and the task line in common once it was full. history_turns 0
    (the embedded policy's default) has no window: the prompt is the same either way."""
    del style  # one rule for both prompt sets
    return max(1, history_turns // 2)


def reply_stops(style: str) -> list[str]:
    """Stop strings for an actor reply: the compact set's one-line reply ends at a newline; a chat
    model's reply ends at its end-of-turn token (a leading newline must not end it empty)."""
    return [] if style == "chat" else ["\n"]


CRITIC_SCORES = {"accept": 1.0, "refine": 0.5, "reject": 0.0}


def critic_messages(*, task: str, entry: str, templates: Templates = DEFAULT_TEMPLATES) -> list[dict[str, str]]:
    """The conversation in which the actor judges one retrieved entry (actor as critic)."""
    return [{"role": "system", "content": "You judge advice before you use it."},
            {"role": "user", "content": templates["ACTOR_CRITIC"].format(task=task, entry=entry.strip())}]


def parse_critic_reply(text: str) -> float | None:
    """accept -> 1, refine -> 0.5, reject -> 0 (docs/method.md); the first of those words in the reply, or None."""
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
