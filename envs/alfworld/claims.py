"""What an experience entry claims about a household, and what the household is: the ALFWorld half of the entry
checker (envs/entry_check.py).

    claimed_location("## Title: Watch\\n## Description: Household 17\\n## Content: The watch is in drawer 3.",
                     "watch")                                   # -> "drawer 3"
    household_facts(env, task_seed("alfworld/pick_and_place", 17))
    # -> {"task": ..., "object": "watch", "targets": {"watch": ["drawer 3"]}, "placements": {...}, ...}

On a recurring household (env.task_set; envs/base.py `instance_task`: "Household 17: put a watch in safe.") the
placements are fixed, so "in household 17 the watch is in drawer 3" is true or false of it. A claim names a numbered
receptacle ("drawer 3"): a type-level sentence ("watches are usually in a drawer", the placement prior an entry of
a random-seed run holds) is no claim about the household. Claims are read per object type, not per instance: for a
task about a watch, "the watch is in drawer 3" is right when some watch starts in drawer 3 (a pick-two task has two).
"""
from __future__ import annotations

import functools
import re
from typing import Any, Iterable

from envs.alfworld.generation import load_priors

_HEADERS = re.compile(r"^\s*#+\s*(?:title|description|content)\s*:\s*", re.I | re.M)
_ART = r"(?:(?:the|a|an|one|some|every)\s+)?"
_NUM = r"(?:\s+\d+)?"
_BE = (r"(?:is|was|are|were|lies|lay|sits|sat|stands|stood|rests|rested|(?:can|could)\s+be\s+found|"
       r"(?:is|was|are|were)\s+(?:found|kept|located|stored|placed|lying|sitting|standing))")
_ADV = r"(?:\s+(?:usually|always|still|initially|already|right|here|there))*"
_IN = r"(?:in/on|inside|in|on\s+top\s+of|on|at)"
_SEE = r"(?:found|find|finds|saw|see|sees|spotted|spot|located|noticed)"
_TAKE = r"(?:took|take|takes|taking|picked\s+up|pick\s+up|picks\s+up|grab|grabbed|got|get)"
_HAS = r"(?:holds|held|has|had|contains|contained|is\s+holding|was\s+holding)"
_LOOK = r"(?:look|looked|search|searched|check|checked|open|opened|go\s+to|went\s+to|goes\s+to)"


@functools.lru_cache(maxsize=1)
def receptacle_types() -> tuple[str, ...]:
    """Every receptacle type a household can have (the priors' scenes and ALFWorld's receptacle table, less the
    objects that can hold others, such as a bowl), longest first so that 'sidetable' is read before 'table'."""
    priors = load_priors()
    names = {r for s in priors.scenes.values() for r in s.receptacles}
    names |= set(priors.can_contain) - set(priors.objects) - set(priors.lights)
    return tuple(sorted(names, key=lambda n: (-len(n), n)))


def _object_forms(object_type: str) -> list[str]:
    priors = load_priors()
    plural = priors.objects[object_type].plural if object_type in priors.objects else f"{object_type}s"
    forms = {object_type, plural, f"{object_type}s", f"{object_type}es"}
    return sorted(forms, key=lambda n: (-len(n), n))


@functools.lru_cache(maxsize=256)
def _patterns(object_types: tuple[str, ...], receps: tuple[str, ...]) -> list[tuple[re.Pattern[str], int, int]]:
    """(pattern, group of the object word, group of the receptacle's name) for each claim form."""
    forms = {f: t for t in object_types for f in _object_forms(t)}
    obj = "(" + "|".join(re.escape(f) for f in sorted(forms, key=lambda n: (-len(n), n))) + ")"
    rec = "((?:" + "|".join(re.escape(r) for r in receps) + r")\s+\d+)"
    specs = [
        # "the watch is in drawer 3", "watch 2 was on top of dresser 1", "the watches are usually in drawer 3"
        (rf"\b{_ART}{obj}{_NUM},?\s+{_BE}{_ADV}\s+{_IN}\s+{_ART}{rec}\b", 1, 2),
        # "found the watch in drawer 3", "you see a watch 1 on dresser 1"
        (rf"\b{_SEE}\s+{_ART}{obj}{_NUM}\s+{_IN}\s+{_ART}{rec}\b", 1, 2),
        # "take watch 1 from drawer 3" (an action copied into an entry)
        (rf"\b{_TAKE}\s+{_ART}{obj}{_NUM}\s+(?:from|out\s+of|off)\s+{_ART}{rec}\b", 1, 2),
        # "drawer 3 holds the watch"
        (rf"\b{_ART}{rec},?\s+{_HAS}\s+{_ART}{obj}\b", 2, 1),
        # "look in drawer 3 for the watch", "go to drawer 3 to find the watch"
        (rf"\b{_LOOK}\s+(?:{_IN}\s+)?{_ART}{rec}\s+(?:for|to\s+(?:find|get|take))\s+{_ART}{obj}\b", 2, 1),
        # "go to drawer 3 and take the watch", "go to drawer 3, open it, take watch 1"
        (rf"\bgo\s+to\s+{_ART}{rec}(?:\s*(?:,|and|then)\s*)+(?:open\s+it(?:\s*(?:,|and|then)\s*)+)?{_TAKE}\s+{_ART}{obj}\b", 2, 1),
    ]
    return [(re.compile(p, re.I), og, rg) for p, og, rg in specs]


def _plain(text: str) -> str:
    """The entry's words on one line: its '## Title: / ## Description: / ## Content:' headers become sentence breaks."""
    return " ".join(_HEADERS.sub(". ", text or "").split())


def claimed_locations(text: str, object_types: Iterable[str] | str | None = None) -> list[tuple[str, str]]:
    """Every (object type, receptacle name) an entry claims, in the order it says them: 'the watch is in drawer 3'
    -> [("watch", "drawer 3")]. `object_types`: the types to read claims about (default: every object and light
    type of the priors). A receptacle with no number is no claim."""
    priors = load_priors()
    if object_types is None:
        types = tuple(sorted(set(priors.objects) | set(priors.lights)))
    elif isinstance(object_types, str):
        types = (object_types,)
    else:
        types = tuple(sorted(set(object_types)))
    if not types:
        return []
    forms = {f: t for t in types for f in _object_forms(t)}
    plain = _plain(text)
    found: list[tuple[int, str, str]] = []
    for pattern, og, rg in _patterns(types, receptacle_types()):
        for m in pattern.finditer(plain):
            word = m.group(og).lower()
            recep = " ".join(m.group(rg).lower().split())
            found.append((m.start(), forms.get(word, word), recep))
    seen: dict[tuple[str, str], int] = {}
    for pos, t, r in sorted(found):
        seen.setdefault((t, r), pos)
    return list(seen)


def claimed_location(text: str, object_type: str | None = None) -> str | None:
    """The receptacle an entry says `object_type` is in ('drawer 3'), its first such claim; None if it names none.
    Without `object_type`, the first receptacle it places any object in."""
    claims = claimed_locations(text, object_type)
    return claims[0][1] if claims else None


def household_facts(env: Any, seed: int) -> dict[str, Any]:
    """The household `env.reset(seed=seed)` builds, in its initial state (a checker's privileged view, never the
    actor's): the task, its object (and light), where each object starts, and for each target type the receptacles
    holding one. Generated households are read from their instance (no engine); official games from the engine's
    first state (which leaves `env` mid-episode: reset it)."""
    if env.official_games is None:
        inst = env.instance_for(seed)
        placements = {name: recep for name, _, recep in inst.objects}
        kinds = {name: kind for name, kind, _ in inst.objects}
        if inst.light is not None:
            placements[inst.light[0]], kinds[inst.light[0]] = inst.light[2], inst.light[1]
        goal, task, receptacles = inst.goal, inst.task, [name for name, _ in inst.receptacles]
    else:
        env.reset(seed=seed)
        view = env.world
        placements, kinds = dict(view.where), {o: view.kind.get(o, o.rpartition(" ")[0]) for o in view.where}
        goal, task, receptacles = env.goal, env.task.rstrip("."), list(view.receptacles)
    types = [goal.object_type] + ([goal.toggle_type] if goal.toggle_type else [])
    targets = {t: sorted({r for o, r in placements.items() if kinds[o] == t}) for t in types}
    return {"task": task, "task_type": goal.task_type, "object": goal.object_type,
            "receptacle": goal.receptacle_type, "light": goal.toggle_type, "targets": targets,
            "placements": placements, "receptacles": receptacles}


def location_verdict(text: str, facts: dict[str, Any]) -> str:
    """'right' if every receptacle the entry places a target (the task's object, or its light) in holds one at the
    start, 'wrong' if one does not, 'no_claim' if it places none."""
    claims = claimed_locations(text, list(facts["targets"]))
    if not claims:
        return "no_claim"
    return "right" if all(r in facts["targets"][t] for t, r in claims) else "wrong"


_AT = re.compile(r"\b(?:arrive at|open the|close the|On the|In the)\s+([a-z]+ \d+)\b", re.I)


def seen_location(observations: Iterable[str], object_type: str) -> tuple[str, str] | None:
    """(receptacle, the sentence that shows it) of the first observation in which an object of `object_type` is seen
    in or taken from a numbered receptacle: "You pick up the watch 1 from the drawer 3." or "You open the drawer 3.
    The drawer 3 is open. In it, you see a watch 1, ..." -> ("drawer 3", ...). What a reader of the trajectory can
    know of where the object was (the extractor's teacher writes its lesson from it); None when it was never seen."""
    obj = re.escape(object_type)
    take = re.compile(rf"\bYou pick up the {obj} \d+ from the ([a-z]+ \d+)\.", re.I)
    seen = re.compile(rf"\byou see\b[^.]*?\b(?:a|an|the)\s+{obj} \d+\b", re.I)
    for obs in observations:
        for line in (obs or "").splitlines():
            m = take.search(line)
            if m:
                return m.group(1).lower(), m.group(0)
            at = _AT.search(line)
            if at and seen.search(line):
                return at.group(1).lower(), line.strip()
    return None
