"""Parsers for the extractor's answers: the one place that reads what a model wrote.

    parse_extraction(text, previous_ids, budget=3)  -> Parsed(ops, error)   distillation answers
    parse_merge_answer(text, chunk)                 -> Parsed(ops, error)   merge answers
    parse_merge(text, chunk)                        -> ops or None          the same, yes/no view
    parse_extractor_answer(text, n_previous=0)      -> ops or None          the warm start's parse rate
    parse_rewrite(text)                             -> str                  search-and-ask rewrites
    parse_action(text, admissible=None)             -> str                  the actor's action reply

A model answer never raises, whatever it is: each bad answer is one no-op with a reason in
`Parsed.error`, so a batch of answers loses only its bad ones (the training loop counts them).
The warm start measures its parse rate with these same functions, so the rate it reports is the
rate training sees.

Like the authors' release, the LAST `<answer>…</answer>` block is read (a draft inside `<think>`
must not hide the real answer) and `<think>` is not required. Two operation formats are accepted,
item by item:

- the project's: {"function": "add", "new_memory": str},
  {"function": "update", "idx_list": [int, ...], "updated_memory": str}; indices 0-based, as
  trainers/prompts.py numbers previous entries ([0], [1], …);
- the release's: {"function_name": "add" | "update" | "return", "parameters": {"new_memory" |
  "updated_memory": str, "idx": [int, ...]}}; indices 1-based, as the release numbers its
  "Memory Entry 1, 2, …" and applies `idx - 1`; "return" ends the list (later items are not
  operations), as the release stops there. A lone object is read as a one-item list, as there.

Stricter than the release, on purpose: an answer is all or nothing (one bad operation voids it),
the operation budget is enforced rather than only asked for, and indices must be real integers
(JSON true/false are not 1/0), in range and not repeated.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Sequence

from core.types import Experience, Operation

OP_BUDGET = 3  # operations per distillation answer: the release's memory_model_max_functional_operations

ANSWER = re.compile(r"<answer>(.*?)</answer>", re.S | re.I)


@dataclass
class Parsed:
    ops: list[Operation] = field(default_factory=list)
    error: str = ""  # why the whole answer is a no-op ("" = parsed)


def answer_block(text: str) -> str | None:
    """The body of the last complete <answer>…</answer> block, or None."""
    last = None
    for last in ANSWER.finditer(text):
        pass
    return None if last is None else last.group(1).strip()


def _answer_json(text: str) -> tuple[Any, str]:
    """(the last answer block as JSON, "") or (None, why not). Never raises."""
    body = answer_block(text)
    if body is None:
        return None, "no <answer>…</answer> block"
    try:
        return json.loads(body), ""
    except json.JSONDecodeError as e:
        return None, f"answer is not JSON ({e.msg})"
    except ValueError as e:  # an integer literal over Python's int-string limit (4,300 digits)
        return None, f"answer is not usable JSON ({str(e)[:80]})"
    except RecursionError:  # JSON nested deeper than the interpreter's recursion limit
        return None, "answer JSON is nested too deeply"


def _name(fn: Any) -> str:
    """A function name for a reason: never repr a model's arbitrary (possibly very deep) JSON."""
    return repr(fn[:40]) if isinstance(fn, str) else f"of type {type(fn).__name__}"


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)  # JSON true/false load as bool, a subclass of int


def _memory(mem: Any, what: str, max_chars: int) -> tuple[str, str]:
    """(stripped text, "") or ("", why not)."""
    if not isinstance(mem, str) or not mem.strip():
        return "", f"{what} needs a non-empty {'new_memory' if what == 'add' else 'updated_memory'}"
    if len(mem) > max_chars:
        return "", f"{what}: memory over {max_chars} characters"
    return mem.strip(), ""


def _operation(item: Any, previous_ids: Sequence[int], max_chars: int) -> tuple[Operation | None, str, bool]:
    """One list item -> (operation, "", stop): stop is True for the release's "return"."""
    if not isinstance(item, dict):
        return None, "is not an object", False
    if "function_name" in item:  # the release's format
        fn, params, base = item.get("function_name"), item.get("parameters", {}), 1
        if fn == "return":
            return None, "", True
        if not isinstance(params, dict):
            return None, "parameters is not an object", False
        idx = params.get("idx")
        mem = params.get("updated_memory", params.get("new_memory")) if fn == "update" else params.get("new_memory")
    else:
        fn, base = item.get("function"), 0
        idx, mem = item.get("idx_list"), item.get("updated_memory") if fn == "update" else item.get("new_memory")
    if fn == "add":
        text, why = _memory(mem, "add", max_chars)
        return (Operation("add", text=text) if not why else None), why, False
    if fn != "update":
        return None, f"unknown function {_name(fn)} (expected add or update)", False
    if not isinstance(idx, list) or not idx or not all(_is_int(x) for x in idx):
        return None, "update needs a non-empty list of integer indices", False
    pos = [x - base for x in idx]
    if any(p < 0 or p >= len(previous_ids) for p in pos):
        return None, f"update index out of range (there are {len(previous_ids)} previous memories)", False
    if len(set(pos)) != len(pos):
        return None, "update: an index repeats", False
    text, why = _memory(mem, "update", max_chars)
    return (Operation("update", text=text, ids=[int(previous_ids[p]) for p in pos]) if not why else None), why, False


def parse_extraction(text: str, previous_ids: Sequence[int], *, budget: int = OP_BUDGET, max_chars: int = 4000) -> Parsed:
    """A distillation answer -> operations, all or nothing; `update` indices refer to `previous_ids`."""
    data, err = _answer_json(text)
    if err:
        return Parsed(error=err)
    if isinstance(data, dict):
        data = [data]
    if not isinstance(data, list):
        return Parsed(error="answer is not a JSON list")
    ops: list[Operation] = []
    for i, item in enumerate(data):
        op, why, stop = _operation(item, previous_ids, max_chars)
        if stop:
            break
        if why:
            return Parsed(error=f"operation {i}: {why}")
        ops.append(op)
    if len(ops) > budget:
        return Parsed(error=f"{len(ops)} operations, over the budget of {budget}")
    named = [j for op in ops for j in op.ids]
    if len(named) != len(set(named)):
        return Parsed(error="two updates name the same previous memory")
    return Parsed(ops)


def parse_extractor_answer(text: str, *, n_previous: int = 0, budget: int = OP_BUDGET) -> list[Operation] | None:
    """`parse_extraction` for an answer about entries 0..n_previous-1: its operations, or None when
    it does not parse (the warm start's parse rate; ids are the indices themselves)."""
    p = parse_extraction(text, list(range(n_previous)), budget=budget)
    return None if p.error else p.ops


def parse_merge_answer(text: str, chunk: Sequence[Experience]) -> Parsed:
    """A merge answer -> operations on the chunk's entries, all or nothing.

    `{"function": "merge", "idx_list": [i, j, ...], "merged_memory": "..."}` replaces two or more
    entries by one (without `merged_memory`, by entry i's text: the short form a small extractor
    writes reliably, duplicates collapsing into the first listed); `{"function": "discard",
    "idx_list": [...]}` removes entries. Indices are 0-based positions in the chunk."""
    data, err = _answer_json(text)
    if err:
        return Parsed(error=err)
    if not isinstance(data, list):
        return Parsed(error="answer is not a JSON list")
    ops = []
    for n, item in enumerate(data):
        if not isinstance(item, dict):
            return Parsed(error=f"operation {n} is not an object")
        idx = item.get("idx_list")
        if not isinstance(idx, list) or not idx or not all(_is_int(x) for x in idx):
            return Parsed(error=f"operation {n}: idx_list must be a non-empty list of integers")
        if any(x < 0 or x >= len(chunk) for x in idx):
            return Parsed(error=f"operation {n}: index out of range (the chunk has {len(chunk)} entries)")
        if len(set(idx)) != len(idx):  # [0, 0] would "merge" an entry with itself
            return Parsed(error=f"operation {n}: an index repeats")
        ids = [chunk[x].id for x in idx]
        fn = item.get("function")
        if fn == "merge":
            mem = item.get("merged_memory", chunk[idx[0]].text)
            if len(idx) < 2:
                return Parsed(error=f"operation {n}: merge needs two or more entries")
            if not isinstance(mem, str) or not mem.strip():
                return Parsed(error=f"operation {n}: merged_memory must be non-empty text")
            ops.append(Operation("update", text=mem.strip(), ids=ids))
        elif fn == "discard":
            ops.append(Operation("discard", ids=ids))
        else:
            return Parsed(error=f"operation {n}: unknown function {_name(fn)} (expected merge or discard)")
    return Parsed(ops)


def parse_merge(text: str, chunk: Sequence[Experience]) -> list[Operation] | None:
    """`parse_merge_answer` as operations, or None when the answer does not parse."""
    p = parse_merge_answer(text, chunk)
    return None if p.error else p.ops


def parse_rewrite(text: str) -> str:
    """A search-and-ask rewrite: the last answer block's text, or "" (the caller falls back to the entry)."""
    return answer_block(text) or ""


# -- the actor's action replies --------------------------------------------------------------------

_LEAD = re.compile(r"^(?:(?:my |the |next |final )?(?:action|answer|command|move|reply)\s*[:=-]|i (?:will|would|choose to|choose)\b|"
                   r"let'?s\b|>+|[-*•]|\d+[.)])\s*", re.I)
MAX_EXTRA_WORDS = 5  # words around an admissible action in a reply that still count as naming it
_QUOTES = "\"'`“”‘’«»*_"


def _clean(line: str) -> str:
    """One reply line without decoration: 'Action: "go north".' -> 'go north'."""
    s = line.strip()
    for _ in range(3):  # "> Action: `go north`" peels in turns
        s = _LEAD.sub("", s).strip().strip(_QUOTES).strip()
    return s.rstrip(".!;,").strip().strip(_QUOTES).strip()


def _norm(s: str) -> str:
    return " ".join(re.sub(r"[^a-z0-9 ]", " ", s.lower()).split())


def parse_action(text: str, admissible: Sequence[str] | None = None) -> str:
    """An actor's reply -> the action the env is sent. Never raises.

    Without `admissible` (the compact prompts of the tiny models): the first non-empty line, as is.
    With the env's admissible actions (the chat prompts): tolerant of what chat models add around an
    action — "Action: go north", quotes and backticks, a trailing period, a list marker, other case,
    words before or after ("I will go to fridge 1 to look inside"). The first non-empty line that
    names an admissible action wins: equal after normalising case and punctuation, else the longest
    admissible action inside it as whole words (so "go to fridge 1" beats "look") with at most
    MAX_EXTRA_WORDS other words on the line; a reply naming
    none is sent cleaned, and the env judges it invalid."""
    lines = [ln for ln in (text or "").strip().splitlines() if ln.strip()]
    if not admissible:
        return lines[0].strip() if lines else ""
    by_norm: dict[str, str] = {}
    for a in admissible:
        by_norm.setdefault(_norm(a), a)
    by_norm.pop("", None)
    for ln in lines[:4]:
        cleaned = _clean(ln)
        n = _norm(cleaned)
        if n in by_norm:
            return by_norm[n]
        padded, words = f" {n} ", len(n.split())
        # a few words around the action ("I will go to fridge 1 to look inside"), not a copied sentence that
        # happens to name a direction ("You see a door to the north" is no move)
        inside = [k for k in by_norm if f" {k} " in padded and words - len(k.split()) <= MAX_EXTRA_WORDS]
        if inside:
            return by_norm[max(inside, key=len)]
    return _clean(lines[0]) if lines else ""
