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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from core.store import ExperienceStore, NewEntry
from core.types import Experience, Generation, Source, Status

FIELDS = {"id", "text", "env", "task", "query", "source", "status", "parent_ids", "created_step", "counters", "generation"}
COUNTERS = {"retrieved_count": int, "trained_count": int, "successes": int, "failures": int,
            "last_retrieved_at": (int, float, type(None)), "last_trained_step": (int, type(None))}
GEN_FIELDS = {"prompt": str, "response": str, "prompt_ids": list, "response_ids": list, "response_logprobs": list,
              "model_version": int}


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
                f.write(json.dumps(entry_to_record(e), sort_keys=True, ensure_ascii=False) + "\n")
                n += 1
            offset += len(page.entries)
            if not page.entries or offset >= page.total:
                break
    tmp.replace(path)
    return n


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
    if "id" in obj and (not isinstance(obj["id"], int) or isinstance(obj["id"], bool) or obj["id"] < 1):
        return "'id' must be a positive integer"
    for k in ("env", "task", "query"):
        if k in obj and not isinstance(obj[k], str):
            return f"'{k}' must be a string"
    if "source" in obj and obj["source"] not in {s.value for s in Source}:
        return f"'source' must be one of {', '.join(s.value for s in Source)}"
    if "status" in obj and obj["status"] not in {s.value for s in Status}:
        return f"'status' must be one of {', '.join(s.value for s in Status)}"
    if "parent_ids" in obj and (not isinstance(obj["parent_ids"], list) or not all(isinstance(p, int) for p in obj["parent_ids"])):
        return "'parent_ids' must be a list of integers"
    if "created_step" in obj and (not isinstance(obj["created_step"], int) or isinstance(obj["created_step"], bool)):
        return "'created_step' must be an integer"
    c = obj.get("counters", {})
    if not isinstance(c, dict):
        return "'counters' must be an object"
    for k, v in c.items():
        if k not in COUNTERS:
            return f"unknown counter {k!r}"
        if not isinstance(v, COUNTERS[k]) or isinstance(v, bool):
            return f"counter {k!r} has the wrong type"
    g = obj.get("generation")
    if g is not None:
        if not isinstance(g, dict):
            return "'generation' must be an object"
        for k, v in g.items():
            if k not in GEN_FIELDS:
                return f"unknown generation field {k!r}"
            if not isinstance(v, GEN_FIELDS[k]):
                return f"generation field {k!r} has the wrong type"
    return ""


@dataclass
class ImportReport:
    imported: int
    ids: list[int]


def parse_library_lines(lines: Iterable[str], *, max_chars: int = 4000) -> list[tuple[int, dict[str, Any]]]:
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
            problems.append((n, f"not valid JSON ({e.msg} at column {e.colno})"))
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
                   max_chars: int = 4000, keep_ids: bool = True, source: Source | None = None) -> ImportReport:
    """Import all lines or none. With `keep_ids`, a line's id is kept, and an id that already exists in
    the store is an error; without it, every entry gets a fresh id (parents are remapped within the file)."""
    label = str(path) if path is not None else ""
    if lines is None:
        if path is None:
            raise ValueError("give a path or lines")
        p = Path(path)
        if not p.exists():
            raise LibraryFileError([(0, f"file {p} does not exist")], label)
        try:
            lines = p.read_text(encoding="utf-8").splitlines()
        except UnicodeDecodeError as e:
            raise LibraryFileError([(0, f"the file is not UTF-8 text ({e.reason})")], label) from None
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
