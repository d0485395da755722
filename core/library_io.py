"""Library files: JSONL, one entry a line, validated as a whole before anything is written.

Schema of one line (only `text` is required):

    {"id": 12, "text": "## Title: …\\n## Description: …\\n## Content: …",
     "env": "minihack/Room-5x5", "task": "Reach the stairs …", "query": "…",
     "source": "extracted|merged|manual|imported", "status": "active|archived",
     "parent_ids": [3, 7], "created_step": 40,
     "counters": {"retrieved_count": 5, "trained_count": 2, "successes": 3, "failures": 2,
                  "last_retrieved_at": 1764680000.0, "last_trained_step": 38},
     "generation": {"prompt": "…", "response": "…", "prompt_ids": [], "response_ids": [],
                    "response_logprobs": [], "model_version": 0}}

Embeddings are not in the file (they are derived): the ExperienceManager embeds imported entries
when it next syncs. Export is ordered by id with sorted keys, so export → import → export gives
the same bytes.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from core.store import INT32, ExperienceStore, NewEntry
from core.types import Experience, Generation, Source, Status

FIELDS = {"id", "text", "env", "task", "query", "source", "status", "parent_ids", "created_step", "counters", "generation"}
COUNTERS = {"retrieved_count": int, "trained_count": int, "successes": int, "failures": int,
            "last_retrieved_at": (int, float, type(None)), "last_trained_step": (int, type(None))}
GEN_FIELDS = {"prompt": str, "response": str, "prompt_ids": list, "response_ids": list, "response_logprobs": list,
              "model_version": int}
GEN_TYPE_NAMES = {"prompt": "a string", "response": "a string", "prompt_ids": "a list of integers",
                  "response_ids": "a list of integers", "response_logprobs": "a list of numbers", "model_version": "an integer"}


# The longest entry text an import accepts by default, and so the longest a person may save in the workbench:
# anything longer could be exported but not imported again.
MAX_ENTRY_CHARS = 4000


class LibraryFileError(ValueError):
    """A library file that cannot be imported; `problems` lists (line number, reason)."""

    def __init__(self, problems: list[tuple[int, str]], path: str = ""):
        self.problems = problems
        head = "; ".join(f"line {n}: {why}" for n, why in problems[:5])
        more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
        super().__init__(f"{path + ': ' if path else ''}nothing imported — {head}{more}")


def entry_to_record(e: Experience) -> dict[str, Any]:
    rec: dict[str, Any] = {
        "id": e.id, "text": e.text, "env": e.env, "task": e.task, "query": e.query, "source": e.source.value,
        "status": e.status.value, "parent_ids": list(e.parent_ids), "created_step": e.created_step,
        "counters": {"retrieved_count": e.retrieved_count, "trained_count": e.trained_count, "successes": e.successes,
                     "failures": e.failures, "last_retrieved_at": e.last_retrieved_at, "last_trained_step": e.last_trained_step},
    }
    if e.generation is not None:
        g = e.generation
        rec["generation"] = {"prompt": g.prompt, "response": g.response, "prompt_ids": list(g.prompt_ids),
                             "response_ids": list(g.response_ids), "response_logprobs": list(g.response_logprobs),
                             "model_version": g.model_version}
    return rec


# Characters that JSON allows raw in a string but that line-splitting tools (Python's str.splitlines, some
# editors and JSON-lines readers) take for line breaks: export escapes them, so a line is a line everywhere.
_LINE_BREAKS_JSON_KEEPS = {"\u0085": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"}


def _dump_line(rec: dict[str, Any]) -> str:
    line = json.dumps(rec, sort_keys=True, ensure_ascii=False)
    for raw, escaped in _LINE_BREAKS_JSON_KEEPS.items():
        line = line.replace(raw, escaped)  # only ever inside strings: JSON's syntax outside them is ASCII
    return line


def read_library_file(path: str | Path) -> list[str]:
    """The lines of a library file. Lines are split on "\n" only (JSON Lines), never on the other characters
    str.splitlines() treats as breaks (U+2028, U+0085, ...), which may sit raw inside a JSON string. A line
    that is not UTF-8 is named by its number."""
    p = Path(path)
    if not p.exists():
        raise LibraryFileError([(0, f"file {p} does not exist")], str(path))
    if p.is_dir():
        raise LibraryFileError([(0, f"{p} is a folder; give a .jsonl file")], str(path))
    lines, problems = [], []
    for n, raw in enumerate(p.read_bytes().split(b"\n"), start=1):
        try:
            lines.append(raw.decode("utf-8").removesuffix("\r"))
        except UnicodeDecodeError as e:
            problems.append((n, f"not UTF-8 text ({e.reason} at byte {e.start + 1} of the line)"))
            lines.append("")
    if problems:
        raise LibraryFileError(problems, str(path))
    if lines and lines[-1] == "":
        lines.pop()
    return lines


def export_library(store: ExperienceStore, path: str | Path, *, status: str | None = None) -> int:
    """Write every entry (or those with `status`) to `path`; returns how many. Written to a temp file
    first and renamed, so a failed export never leaves a half file behind."""
    path = Path(path)
    tmp = path.with_suffix(path.suffix + ".tmp")
    n = 0
    with tmp.open("w", encoding="utf-8") as f:
        offset = 0
        while True:
            page = store.list_entries(status=status, sort="id", offset=offset, limit=2000)
            for e in page.entries:
                f.write(_dump_line(entry_to_record(e)) + "\n")
                n += 1
            offset += len(page.entries)
            if not page.entries or offset >= page.total:
                break
    tmp.replace(path)
    return n


def _is_int(v: Any) -> bool:
    """An integer the store can keep (its integer columns are 32-bit: core/store/schema.py INT32)."""
    return isinstance(v, int) and not isinstance(v, bool) and INT32[0] <= v <= INT32[1]


def _int_why(field: str, v: Any) -> str:
    if isinstance(v, int) and not isinstance(v, bool):
        return f"{field} {v} is out of range (at most {INT32[1]})"
    return f"{field} must be an integer"


def _check_record(obj: Any, max_chars: int) -> str:
    if not isinstance(obj, dict):
        return "a line must be a JSON object"
    unknown = sorted(set(obj) - FIELDS)
    if unknown:
        return f"unknown field {unknown[0]!r} (known: {', '.join(sorted(FIELDS))})"
    text = obj.get("text")
    if not isinstance(text, str) or not text.strip():
        return "'text' is missing or empty"
    if len(text) > max_chars:
        return f"'text' is {len(text)} characters, over the cap of {max_chars}"
    if "id" in obj:
        if not isinstance(obj["id"], int) or isinstance(obj["id"], bool) or obj["id"] < 1:
            return "'id' must be a positive integer"
        if not _is_int(obj["id"]):
            return _int_why("'id'", obj["id"])
    for k in ("env", "task", "query"):
        if k in obj and not isinstance(obj[k], str):
            return f"'{k}' must be a string"
    for k in ("text", "env", "task", "query"):
        if "\x00" in obj.get(k, ""):
            return f"'{k}' contains a NUL character (\\u0000), which the store cannot keep"
    if len(obj.get("env", "")) > 128:
        return f"'env' is {len(obj['env'])} characters, over the store's cap of 128"
    if "source" in obj and obj["source"] not in {s.value for s in Source}:
        return f"'source' must be one of {', '.join(s.value for s in Source)}"
    if "status" in obj and obj["status"] not in {s.value for s in Status}:
        return f"'status' must be one of {', '.join(s.value for s in Status)}"
    if "parent_ids" in obj:
        if not isinstance(obj["parent_ids"], list):
            return "'parent_ids' must be a list of integers"
        bad = [p for p in obj["parent_ids"] if not _is_int(p)]
        if bad:
            return _int_why("'parent_ids' entry", bad[0])
    if "created_step" in obj and not _is_int(obj["created_step"]):
        return _int_why("'created_step'", obj["created_step"])
    c = obj.get("counters", {})
    if not isinstance(c, dict):
        return "'counters' must be an object"
    for k, v in c.items():
        if k not in COUNTERS:
            return f"unknown counter {k!r}"
        if not isinstance(v, COUNTERS[k]) or isinstance(v, bool):
            return f"counter {k!r} has the wrong type"
        if isinstance(v, int) and k != "last_retrieved_at" and not _is_int(v):
            return _int_why(f"counter {k!r}", v)
        if isinstance(v, (int, float)) and k == "last_retrieved_at" and not math.isfinite(float(v)):
            return "counter 'last_retrieved_at' must be a finite time"
    g = obj.get("generation")
    if g is not None:
        if not isinstance(g, dict):
            return "'generation' must be an object"
        for k, v in g.items():
            if k not in GEN_FIELDS:
                return f"unknown generation field {k!r}"
            if not isinstance(v, GEN_FIELDS[k]) or isinstance(v, bool):
                return f"generation field {k!r} must be {GEN_TYPE_NAMES[k]}"
            # The lists' items too: a wrong item would raise deep in the store instead of naming this line.
            if k in ("prompt_ids", "response_ids") and not all(isinstance(x, int) and not isinstance(x, bool)
                                                                and 0 <= x < 2**31 for x in v):
                return f"generation field {k!r} must be a list of token ids (whole numbers from 0 to {2**31 - 1})"
            if k == "response_logprobs" and not all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                                    and math.isfinite(x) for x in v):
                return f"generation field {k!r} must be a list of finite numbers"
            if k == "model_version" and not _is_int(v):
                return _int_why("generation field 'model_version'", v)
            if k in ("prompt", "response") and "\x00" in v:
                return f"generation field {k!r} contains a NUL character (\\u0000), which the store cannot keep"
    return ""


@dataclass
class ImportReport:
    imported: int
    ids: list[int]


def parse_library_lines(lines: Iterable[str], *, max_chars: int = MAX_ENTRY_CHARS) -> list[tuple[int, dict[str, Any]]]:
    """Validate every line; raise LibraryFileError naming each bad line. Blank lines are skipped."""
    problems: list[tuple[int, str]] = []
    records: list[tuple[int, dict[str, Any]]] = []
    seen: dict[int, int] = {}
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            # e.msg may end in "at" ("Unterminated string starting at"): one "at", then the column
            problems.append((n, f"not valid JSON ({e.msg.removesuffix(' at')} at column {e.colno})"))
            continue
        except (ValueError, RecursionError) as e:  # a number of over 4,300 digits; nesting deeper than Python's stack
            problems.append((n, f"not importable JSON ({str(e).split(';')[0] if isinstance(e, ValueError) else 'nested too deeply'})"))
            continue
        why = _check_record(obj, max_chars)
        if why:
            problems.append((n, why))
            continue
        if "id" in obj:
            if obj["id"] in seen:
                problems.append((n, f"duplicate id {obj['id']} (first on line {seen[obj['id']]})"))
                continue
            seen[obj["id"]] = n
        records.append((n, obj))
    if problems:
        raise LibraryFileError(problems)
    return records


def import_library(store: ExperienceStore, path: str | Path | None = None, *, lines: Iterable[str] | None = None,
                   max_chars: int = MAX_ENTRY_CHARS, keep_ids: bool = True, source: Source | None = None) -> ImportReport:
    """Import all lines or none. With `keep_ids`, a line's id is kept, and an id that already exists in
    the store is an error; without it, every entry gets a fresh id (parents are remapped within the file)."""
    label = str(path) if path is not None else ""
    if lines is None:
        if path is None:
            raise ValueError("give a path or lines")
        lines = read_library_file(path)
    try:
        records = parse_library_lines(lines, max_chars=max_chars)
    except LibraryFileError as e:
        raise LibraryFileError(e.problems, label) from None
    if keep_ids:
        existing = store.get_many([r["id"] for _, r in records if "id" in r])
        clashes = [(n, f"id {r['id']} already exists in the library (import with fresh ids instead)")
                   for n, r in records if r.get("id") in existing]
        if clashes:
            raise LibraryFileError(clashes, label)
    new = []
    for _, r in records:
        g = r.get("generation")
        new.append(NewEntry(
            text=r["text"], env=r.get("env", ""), task=r.get("task", ""), query=r.get("query", ""),
            source=Source(source or r.get("source", Source.IMPORTED.value)), status=Status(r.get("status", "active")),
            parent_ids=r.get("parent_ids", []), created_step=r.get("created_step", 0),
            generation=Generation(**g) if g else None, id=r.get("id") if keep_ids else None,
            counters=r.get("counters") or None,
        ))
    ids = store.add_entries(new, actor="import", action="import")
    if not keep_ids:  # remap lineage inside the file to the fresh ids
        mapping = {r["id"]: i for (_, r), i in zip(records, ids) if "id" in r}
        if mapping and any(r.get("parent_ids") for _, r in records):
            store.remap_parents({i: [mapping.get(p, p) for p in r.get("parent_ids", [])] for (_, r), i in zip(records, ids)
                                 if r.get("parent_ids")})
    return ImportReport(len(ids), ids)
