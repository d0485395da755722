"""Demonstrations into SFT rows: the policy's (actor prompt -> expert action, with the short-prompt
curriculum) and the extractor's (the rule-based teacher's answers, search-and-ask rewrites, merges)."""
from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from typing import Any

from core.types import format_entry_text
from trainers import prompts as P
from trainers.warmstart.common import ACTION_LEAD, Demo, IGNORE, SFTExample, Turn, WarmStartConfig, _INVALID_WORDS
from trainers.warmstart.teachers import CONSTRAINED_ENVS, _claimed, _stairs_lesson, household_lesson


def _actor_prompt(cfg: WarmStartConfig, demo: Demo, turn: Turn) -> list[dict[str, str]]:
    # the window moves as a rollout's does (the compact set, what the tiny models are built on), so a policy built
    # with history_turns > 0 trains on the prompts its rollouts show
    hist = P.fit_history(turn.history, max_turns=cfg.history_turns, max_chars=cfg.history_chars, keep_first=demo.keep_intro,
                         stride=P.history_stride("compact", cfg.history_turns))
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
        return _alfworld_copyable(demo, turn)
    if f"a step {turn.label} brings" in turn.observation:
        return True
    return bool(demo.entry) and f"head {turn.label}." in demo.entry and "not seen the staircase" in turn.observation


def _alfworld_copyable(demo: Demo, turn: Turn) -> bool:
    """ALFWorld: every turn but a search's "go to X" to a receptacle that neither the entry nor the observation
    names and whose type is not the task's (which one comes next in the search depends on the receptacles already
    looked into, which the short prompt does not show)."""
    if not turn.label.startswith("go to "):
        return True
    recep = turn.label[len("go to "):]
    return recep in demo.entry or recep in turn.observation or recep.rpartition(" ")[0] in demo.task


def action_lead(demo: Demo) -> str:
    """What a demonstrated reply starts with: ACTION_LEAD, but nothing where the policy plays within the env's
    admissible commands (teachers.CONSTRAINED_ENVS): a constrained reply is exactly "go to drawer 3", so the policy
    is taught the tokens the constraint lets it write, not " go" for a "go" it may never start with."""
    return "" if demo.env.startswith(CONSTRAINED_ENVS) else ACTION_LEAD


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
            ex = _join(tokenizer, _chat_ids(tokenizer, msgs), action_lead(d) + t.label, f"policy/{'short/' if short else ''}{d.source}/{d.condition}")
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
        # Only what the trajectory shows: the first observation in which the task's object is seen or taken says
        # where it was (`_alfworld_seen`, the sentence the think quotes), as the household's entry says it
        # (teachers.household_lesson); an episode that never saw it can only say where it was not.
        obj = demo.facts.get("object", "object")
        seen = _alfworld_seen(demo)
        title, desc = f"Where the {obj} is", f"Finding the {obj}"
        if seen is not None:
            content = household_lesson(obj, seen[0], demo.facts.get("household"))
            reason = (f"The agent solved the task in {len(taken)} actions; where the {obj} was is worth keeping." if demo.success
                      else f"The agent failed, but it saw the {obj}: where it was is worth keeping.")
        else:
            content = f"The {obj} was not seen in {len(taken)} actions: look in the receptacles this episode did not open."
            reason = f"The agent failed after {len(taken)} actions without seeing the {obj}; the lesson is where it is not."
    return format_entry_text(title, desc, content), reason


def _alfworld_seen(demo: Demo) -> tuple[str, str] | None:
    """(receptacle, sentence) of the first observation after an action in which the task's object is seen or taken
    (envs/alfworld/claims.py `seen_location`); None when the episode never saw one."""
    from envs.alfworld.claims import seen_location

    obj = demo.facts.get("object")
    if not obj:
        return None
    return seen_location([t.observation for t in demo.turns[1:]] + [demo.final_observation], obj)


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
    distance for every level (the debrief's shape is fixed too, `stairs_sentence`). ALFWorld the same way, with the
    observation that shows where the task's object was as the quote."""
    lesson, reason = _lesson(demo)
    ops: list[dict[str, Any]]
    if demo.env.startswith("minihack/"):
        ops = [{"new_memory": lesson, "function": "add"}] if _debrief_quote(demo) else []
        return ops, _answer(_debrief(demo) or reason, ops)
    # ALFWorld, as MiniHack: the think quotes the observation that shows where the task's object was and the lesson
    # says it; an episode that never saw the object writes nothing ([]), whatever memory was shown.
    seen = _alfworld_seen(demo)
    ops = [{"new_memory": lesson, "function": "add"}] if seen is not None else []
    return ops, _answer(seen[1] if seen is not None else reason, ops)


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
    # (ALFWorld's wrong entries name the household's own object in another receptacle: nothing to discard them by.)
    wrong = [d.entry for d in group if d.condition == "wrong" and d.entry and d.task not in d.entry
             and not d.env.startswith("alfworld/")]
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


def extractor_examples(demos: Sequence[Demo], tokenizer: Any, cfg: WarmStartConfig, *,
                       taught: Callable[[Demo], Demo] | None = None) -> tuple[list[SFTExample], int]:
    """Extraction answers for every demo, plus search-and-ask rewrites and merges (step 5). `taught` maps a demo to the
    one whose answer its prompt is taught (default: its own; trainers/warmstart/weak.py teaches another layout's)."""
    rng = random.Random(f"{cfg.seed}/extractor")
    pairs: list[tuple[list[dict[str, str]], str, str]] = []
    for d in demos:
        _, ans = _extractor_target(taught(d) if taught else d)
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

