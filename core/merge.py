"""Merging the library: near-duplicate clusters, one merge with lineage (undoable), and the
chunked sliding-window merge of docs/method.md step 4 as a driver over any `merge_fn`.

The driver does not know who decides: a person in the workbench, or the extractor (the trainer
passes a function that prompts it). `merge_fn(chunk) -> list[Operation] | None` gets the entries of
one chunk; in its operations `ids` are entry ids from that chunk. `update` merges the named
entries into one new entry, `discard` archives them, `add` writes a new one; entries it does not
name are kept. `None`, a string (the reason), an exception, or any invalid operation means the
answer did not parse: the whole chunk keeps its originals (never half-applied), and the report says why.

`merge_walks` runs several such walks side by side (one per task, or a task's library cut into
`walks` pieces) and hands each round's chunks to one batched decider; `similarity_order` orders a
task's entries so that entries saying the same thing share a chunk.
"""
from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Sequence, Union

import numpy as np

from core.store import ExperienceStore, NewEntry, StoreError
from core.types import Experience, Operation, Source

log = logging.getLogger(__name__)

MergeFn = Callable[[list[Experience]], "list[Operation] | str | None"]
MergeOutcome = Union[list[Operation], None, str, Exception]  # a chunk's operations, no parse, why not, or what the decider raised
BatchMergeFn = Callable[[list[list[Experience]]], list[MergeOutcome]]  # chunks -> one outcome per chunk


# -- near duplicates -----------------------------------------------------------------------------


def near_duplicate_clusters(ids: np.ndarray, vectors: np.ndarray, groups: Sequence[str], *, threshold: float = 0.9,
                            across_groups: bool = False, block: int = 4096) -> list[list[int]]:
    """Clusters (connected components) of entries whose unit vectors have cosine >= threshold.

    ids (n,), vectors (n, d) unit norm, groups (n,) task keys. Blocked matrix products keep memory
    at block×n floats. Returned clusters have >= 2 members, largest first.
    """
    n = len(ids)
    parent = list(range(n))

    def find(a: int) -> int:
        while parent[a] != a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a

    g = np.asarray(groups, dtype=object)
    for start in range(0, n, block):
        sims = vectors[start:start + block] @ vectors.T  # (b, n)
        rows, cols = np.nonzero(sims >= threshold)
        for r, c in zip(rows.tolist(), cols.tolist()):
            a = start + r
            if c <= a or (not across_groups and g[a] != g[c]):
                continue
            ra, rc = find(a), find(c)
            if ra != rc:
                parent[ra] = rc
    clusters: dict[int, list[int]] = {}
    for i in range(n):
        clusters.setdefault(find(i), []).append(int(ids[i]))
    return sorted((sorted(c) for c in clusters.values() if len(c) > 1), key=lambda c: (-len(c), c[0]))


def find_near_duplicates(store: ExperienceStore, *, threshold: float = 0.9, across_tasks: bool = False) -> list[list[int]]:
    """Near-duplicate clusters of the active library, by entry text embedding, within a task unless asked."""
    ids, vecs, entries = store.active_vectors("text")
    if len(ids) < 2:
        return []
    return near_duplicate_clusters(ids, vecs, [e.task for e in entries], threshold=threshold, across_groups=across_tasks)


# -- one merge -------------------------------------------------------------------------------------


def merge_entries(store: ExperienceStore, ids: Sequence[int], text: str, *, actor: str = "human", note: str = "",
                  expected_versions: dict[int, int] | None = None, generation=None, step: int = 0,
                  run_id: int | None = None) -> int:
    """One new MERGED entry with the given entries as parents; the parents are archived. Atomic.

    The new entry inherits the first parent's env, task and query key, so retrieval still finds it
    where the parents were found. Undo with `undo_merge`.
    """
    ids = [int(i) for i in ids]
    if len(ids) < 2:
        raise StoreError("a merge needs at least two entries")
    return store.replace_entries(ids, NewEntry(text=text, source=Source.MERGED, generation=generation, created_step=step,
                                               run_id=run_id),
                                 actor=actor, action="merge", note=note, expected_versions=expected_versions)


def undo_merge(store: ExperienceStore, merged_id: int, *, actor: str = "human") -> list[int]:
    """Archive the merged entry and restore its parents; returns the parents."""
    return store.undo_replace(merged_id, actor=actor)


# -- the periodic sliding-window merge (docs/method.md step 4) ------------------------------------------


@dataclass
class MergeReport:
    before: int = 0
    after: int = 0
    chunks: int = 0
    unparsed_chunks: int = 0
    merges: int = 0
    discards: int = 0
    adds: int = 0
    new_ids: list[int] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def metrics(self) -> dict[str, float]:
        return {"library/merge_before": self.before, "library/merge_after": self.after, "library/merges": self.merges,
                "library/merge_discards": self.discards, "library/merge_unparsed": self.unparsed_chunks}


def _valid_chunk_ops(ops: object, chunk_ids: set[int]) -> str:
    if not isinstance(ops, list):
        return "merge answer is not a list of operations"
    named: set[int] = set()
    for op in ops:
        if not isinstance(op, Operation) or op.kind not in ("add", "update", "discard"):
            return f"not a valid operation: {op!r}"
        if op.kind in ("add", "update") and not (op.text or "").strip():
            return f"{op.kind} with empty text"
        if op.kind in ("update", "discard"):
            if not op.ids or not set(op.ids) <= chunk_ids:
                return f"{op.kind} names ids outside the chunk: {op.ids}"
            if named & set(op.ids):
                return f"an entry is named by two operations: {op.ids}"
            named |= set(op.ids)
    return ""


def sliding_window_merge(store: ExperienceStore, entries: Sequence[Experience], merge_fn: MergeFn, *, chunk_size: int = 5,
                         actor: str = "extractor", step: int = 0, run_id: int | None = None,
                         on_written: Callable[[], None] | None = None) -> MergeReport:
    """Walk `entries` (one task's) in chunks; what a chunk merged is carried into the next one.

    Each chunk holds the carried entries plus fresh ones up to `chunk_size`. `on_written` is called
    after each chunk that changed the store (the manager passes its sync).
    """
    def one_by_one(chunks: list[list[Experience]]) -> list[MergeOutcome]:
        out: list[MergeOutcome] = []
        for c in chunks:  # an exception is this chunk's outcome, not the walk's end
            try:
                out.append(merge_fn(c))
            except Exception as e:  # noqa: BLE001 - reported per chunk
                out.append(e)
        return out

    return merge_walks(store, [entries], one_by_one, chunk_size=chunk_size, batch=1, actor=actor, step=step,
                       run_id=run_id, on_written=on_written)


class _Walk:
    """One sliding window over an ordered list of entries (docs/method.md step 4)."""

    def __init__(self, entries: Sequence[Experience], chunk_size: int) -> None:
        self.queue = list(entries)
        self.carried: list[Experience] = []
        self.survivors: list[int] = []
        self.chunk_size = chunk_size

    def next_chunk(self) -> list[Experience] | None:
        """The carried entries plus fresh ones up to chunk_size; None when the walk is over."""
        if not (self.queue or self.carried):
            return None
        room = max(1, self.chunk_size - len(self.carried))
        chunk = self.carried + self.queue[:room]
        self.queue = self.queue[room:]
        self.carried = []
        if len(chunk) < 2 and not self.queue:
            self.survivors.extend(e.id for e in chunk)
            return None
        return chunk

    def apply(self, store: ExperienceStore, chunk: list[Experience], outcome: MergeOutcome, report: MergeReport, *,
              actor: str, step: int, run_id: int | None) -> bool:
        """Write one chunk's decision; True when the store changed."""
        if isinstance(outcome, Exception):
            why = f"merge_fn raised {type(outcome).__name__}: {outcome}"
        elif isinstance(outcome, str):
            why = f"answer did not parse: {outcome}"
        else:
            why = "merge_fn returned nothing parseable" if outcome is None else _valid_chunk_ops(outcome, {e.id for e in chunk})
        if why:  # never half-applied: the chunk keeps its originals, nothing is carried
            report.unparsed_chunks += 1
            report.errors.append(why)
            self.survivors.extend(e.id for e in chunk)
            return False
        by_id = {e.id: e for e in chunk}
        touched: set[int] = set()
        new_entries: list[int] = []
        for op in outcome or []:
            try:
                if op.kind == "update":
                    if len(op.ids) >= 2:
                        nid = merge_entries(store, op.ids, op.text, actor=actor, step=step, run_id=run_id,
                                            generation=op.generation, expected_versions={i: by_id[i].version for i in op.ids})
                        report.merges += 1
                    else:
                        # A one-entry update rewrites it: same lineage mechanics, one parent.
                        nid = store.replace_entries(op.ids, NewEntry(text=op.text, source=Source.MERGED, created_step=step, run_id=run_id,
                                                                     generation=op.generation),
                                                    actor=actor, action="merge", expected_versions={op.ids[0]: by_id[op.ids[0]].version})
                    new_entries.append(nid)
                    touched |= set(op.ids)
                elif op.kind == "discard":
                    store.archive(op.ids, actor=actor, note="discarded by merge", expected_versions={i: by_id[i].version for i in op.ids},
                                  run_id=run_id, step=step if run_id is not None else None)
                    report.discards += len(op.ids)
                    touched |= set(op.ids)
                else:
                    first = chunk[0]
                    nid = store.add_entries([NewEntry(text=op.text, env=first.env, task=first.task, query=first.query,
                                                      source=Source.MERGED, created_step=step, run_id=run_id,
                                                      generation=op.generation)], actor=actor)[0]
                    new_entries.append(nid)
                    report.adds += 1
            except StoreError as e:  # e.g. a person edited an entry meanwhile: keep it, report why
                report.errors.append(str(e))
        report.new_ids.extend(new_entries)
        # Carry the merged output into the next chunk (the sliding window); untouched entries are kept.
        self.carried = list(store.get_many(new_entries).values()) if self.queue else []
        self.survivors.extend(e.id for e in chunk if e.id not in touched)
        if not self.queue:
            self.survivors.extend(new_entries)
        return bool(new_entries or touched)


def merge_walks(store: ExperienceStore, walks: Sequence[Sequence[Experience]], merge_batch: BatchMergeFn, *,
                chunk_size: int = 5, batch: int = 16, actor: str = "extractor", step: int = 0, run_id: int | None = None,
                on_written: Callable[[], None] | None = None) -> MergeReport:
    """Independent sliding windows side by side (one per task, or several per task): each round takes
    the next chunk of up to `batch` unfinished walks and decides them in one `merge_batch` call, so a
    batched generator decodes them together. Writes stay sequential; walks hold disjoint entries.
    `on_written` is called after each round that changed the store."""
    if batch < 1:
        raise ValueError("batch must be >= 1")
    report = MergeReport(before=sum(len(w) for w in walks))
    waiting = deque(_Walk(w, chunk_size) for w in walks)  # walks not started yet
    done: list[_Walk] = []
    live: list[_Walk] = []
    while waiting or live:
        while len(live) < batch and waiting:
            live.append(waiting.popleft())
        round_: list[tuple[_Walk, list[Experience]]] = []
        for w in live:
            chunk = w.next_chunk()
            if chunk is None:
                done.append(w)
            else:
                round_.append((w, chunk))
        live = [w for w, _ in round_]
        if not round_:
            continue
        report.chunks += len(round_)
        try:
            outcomes = list(merge_batch([list(c) for _, c in round_]))
            if len(outcomes) != len(round_):
                raise ValueError(f"merge_batch answered {len(outcomes)} chunks for {len(round_)}")
        except Exception as e:  # an extractor that crashes on one round must not stop the merge
            outcomes = [e] * len(round_)
        changed = False
        for (w, chunk), outcome in zip(round_, outcomes):
            changed |= w.apply(store, chunk, outcome, report, actor=actor, step=step, run_id=run_id)
        if changed and on_written:
            on_written()
    report.after = len({i for w in done for i in w.survivors})
    return report


def similarity_order(entries: Sequence[Experience], vectors: dict[int, np.ndarray]) -> list[Experience]:
    """A nearest-neighbour chain over the entries' unit text embeddings: start at the oldest entry and
    step to the most similar one not yet visited, so entries that say the same thing end up in the
    same chunk. Entries without a vector follow in id order. O(n^2 d): 2,000 entries take well under a second."""
    have = sorted((e for e in entries if e.id in vectors), key=lambda e: e.id)
    rest = sorted((e for e in entries if e.id not in vectors), key=lambda e: e.id)
    if len(have) < 3:
        return have + rest
    v = np.stack([vectors[e.id] for e in have]).astype(np.float32)
    v /= np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-12)
    visited = np.zeros(len(have), dtype=bool)
    order = [0]
    visited[0] = True
    for _ in range(len(have) - 1):
        sims = v @ v[order[-1]]
        sims[visited] = -np.inf
        nxt = int(np.argmax(sims))
        visited[nxt] = True
        order.append(nxt)
    return [have[i] for i in order] + rest


def split_walks(entries: Sequence[Experience], walks: int, chunk_size: int) -> list[list[Experience]]:
    """Cut an ordered list into up to `walks` contiguous walks of near-equal length, none shorter than
    two chunks (a short walk would rarely see a merge carried)."""
    n = max(1, min(walks, len(entries) // (2 * chunk_size)))
    bounds = [round(i * len(entries) / n) for i in range(n + 1)]
    return [list(entries[a:b]) for a, b in zip(bounds, bounds[1:]) if b > a]
