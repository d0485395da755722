"""The library's tables: entries, their version history and usage counters, the library version and its change
feed, whole-library snapshots; and the plain results (`NewEntry`, `VersionInfo`, `Page`) handed to callers."""
from __future__ import annotations

import difflib
import json
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import numpy as np
from sqlalchemy import func, or_, select, update
from sqlalchemy import text as text_sql
from sqlalchemy.orm import Session

from core.types import Experience, Generation, Source, Status
from core.store.schema import (
    EntryCountRow, EntryRow, EntryUsageRow, EntryVersionRow, LibraryState, NotFoundError, StaleWriteError, StoreError,
)


# ---------------------------------------------------------------------------------------------
# Plain results handed to callers


@dataclass
class VersionInfo:
    entry_id: int
    version: int
    text: str
    status: str
    action: str
    actor: str
    note: str
    library_version: int
    created_at: float


@dataclass
class Page:
    entries: list[Experience]
    total: int
    offset: int
    limit: int


SORTABLE = {
    "id", "created_at", "updated_at", "retrieved_count", "trained_count", "last_retrieved_at",
    "last_trained_step", "successes", "failures", "version", "created_step",
}


def _vec_to_bytes(v: np.ndarray | None) -> bytes | None:
    return None if v is None else np.ascontiguousarray(v, dtype=np.float32).tobytes()


def _bytes_to_vec(b: bytes | None) -> np.ndarray | None:
    return None if b is None else np.frombuffer(b, dtype=np.float32).copy()


def _to_experience(r: EntryRow) -> Experience:
    gen = None
    if r.gen_prompt is not None or r.gen_response is not None:
        tok = json.loads(r.gen_tokens) if r.gen_tokens else {}
        gen = Generation(
            prompt=r.gen_prompt or "",
            response=r.gen_response or "",
            prompt_ids=tok.get("prompt_ids", []),
            response_ids=tok.get("response_ids", []),
            response_logprobs=tok.get("response_logprobs", []),
            model_version=tok.get("model_version", 0),
        )
    return Experience(
        id=r.id, text=r.text, env=r.env, task=r.task, query=r.query, source=Source(r.source),
        status=Status(r.status), version=r.version, parent_ids=json.loads(r.parent_ids or "[]"),
        created_step=r.created_step, run_id=r.run_id, source_episode_id=r.source_episode_id,
        retrieved_count=r.retrieved_count, trained_count=r.trained_count,
        last_retrieved_at=r.last_retrieved_at, last_trained_step=r.last_trained_step,
        successes=r.successes, failures=r.failures, generation=gen,
        created_at=r.created_at, updated_at=r.updated_at,
    )


def _gen_columns(gen: Generation | None) -> dict[str, Any]:
    if gen is None:
        return {"gen_prompt": None, "gen_response": None, "gen_tokens": None}
    return {
        "gen_prompt": gen.prompt,
        "gen_response": gen.response,
        "gen_tokens": json.dumps({
            "prompt_ids": list(gen.prompt_ids), "response_ids": list(gen.response_ids),
            "response_logprobs": [float(x) for x in gen.response_logprobs], "model_version": gen.model_version,
        }),
    }


@dataclass
class NewEntry:
    """What a writer supplies for one new entry (embeddings optional: the manager fills them in)."""

    text: str
    env: str = ""
    task: str = ""
    query: str = ""
    source: Source = Source.EXTRACTED
    status: Status = Status.ACTIVE
    parent_ids: Sequence[int] = ()
    created_step: int = 0
    run_id: int | None = None
    source_episode_id: int | None = None
    generation: Generation | None = None
    query_embedding: np.ndarray | None = None
    text_embedding: np.ndarray | None = None
    embedder: str = ""
    id: int | None = None  # only imports keep a given id
    counters: dict[str, Any] | None = None  # only imports restore counters


def _by_run(run_id: int | None, step: int | None) -> dict[str, int | None]:
    """A version row's run and step: set only for a training run's writes (what a resume may take back)."""
    return {"run_id": run_id, "step": step} if run_id is not None else {}


def text_diff(old: str, new: str, from_label: str, to_label: str) -> str:
    """Unified diff of two texts, one line per line. (difflib on `splitlines(True)` joins a last line without a newline
    to the next one: "-old last+new last" on one line, the added line never shown as added.)"""
    return "\n".join(difflib.unified_diff(old.splitlines(), new.splitlines(), from_label, to_label, lineterm=""))


class LibraryTables:
    """ExperienceStore's reads and writes of the library (core/store/__init__.py builds the store from these parts;
    the engine, `_tx`, `_session` and `_bump` are its own)."""

    # -- library version and change feed -----------------------------------------------------

    def library_version(self) -> int:
        with self._session() as s:
            return s.execute(select(LibraryState.version).where(LibraryState.id == 1)).scalar_one()

    def changes_since(self, version: int) -> tuple[int, list[Experience]]:
        """(current library version, entries whose last change is newer than `version`)."""
        with self._tx() as s:
            current = s.execute(select(LibraryState.version).where(LibraryState.id == 1)).scalar_one()
            rows = s.scalars(select(EntryRow).where(EntryRow.changed_version > version).order_by(EntryRow.id)).all()
            return current, [_to_experience(r) for r in rows]

    # -- entries: create -----------------------------------------------------------------------

    def add_entries(self, new: Sequence[NewEntry], *, actor: str = "extractor", action: str = "create", note: str = "") -> list[int]:
        """Insert entries in one transaction (all or none); returns their ids."""
        if not new:
            return []
        for n in new:
            if not n.text or not n.text.strip():
                raise StoreError("an entry's text must not be empty")
        with self._tx() as s:
            lv = self._bump(s)
            ids = []
            now = time.time()
            for n in new:
                row = EntryRow(
                    text=n.text, env=n.env, task=n.task, query=n.query or n.task, source=Source(n.source).value,
                    status=Status(n.status).value, version=1, parent_ids=json.dumps([int(p) for p in n.parent_ids]),
                    created_step=n.created_step, run_id=n.run_id, source_episode_id=n.source_episode_id,
                    query_embedding=_vec_to_bytes(n.query_embedding), text_embedding=_vec_to_bytes(n.text_embedding),
                    embedder=n.embedder, changed_version=lv, created_at=now, updated_at=now, **_gen_columns(n.generation),
                )
                if n.id is not None:
                    row.id = int(n.id)
                for k, v in (n.counters or {}).items():
                    setattr(row, k, v)
                s.add(row)
                s.flush()
                s.add(EntryVersionRow(entry_id=row.id, version=1, text=row.text, status=row.status, action=action,
                                      actor=actor, note=note, library_version=lv, created_at=now, **_by_run(n.run_id, n.created_step)))
                ids.append(row.id)
            if any(n.id is not None for n in new) and self.engine.dialect.name == "postgresql":
                # Explicit ids bypass the sequence; move it past them so later inserts do not collide.
                s.execute(text_sql("SELECT setval(pg_get_serial_sequence('entries', 'id'), (SELECT MAX(id) FROM entries))"))
            return ids

    def remap_parents(self, parents: dict[int, list[int]]) -> None:
        """Set lineage after an import that gave entries fresh ids (no content change, no version bump)."""
        with self._tx() as s:
            for i, p in parents.items():
                s.execute(update(EntryRow).where(EntryRow.id == i).values(parent_ids=json.dumps([int(x) for x in p])))

    def add_entry(self, text: str, **kw: Any) -> int:
        actor = kw.pop("actor", "extractor")
        return self.add_entries([NewEntry(text=text, **kw)], actor=actor)[0]

    # -- entries: read ---------------------------------------------------------------------------

    def get(self, entry_id: int) -> Experience:
        with self._session() as s:
            r = s.get(EntryRow, entry_id)
            if r is None:
                raise NotFoundError(f"no entry with id {entry_id}")
            return _to_experience(r)

    def get_many(self, ids: Iterable[int]) -> dict[int, Experience]:
        ids = list({int(i) for i in ids})
        if not ids:
            return {}
        with self._session() as s:
            return {r.id: _to_experience(r) for r in s.scalars(select(EntryRow).where(EntryRow.id.in_(ids)))}

    def list_entries(
        self,
        *,
        env: str | None = None,
        task: str | None = None,
        source: str | None = None,
        status: str | None = "active",
        text: str | None = None,
        ids: Sequence[int] | None = None,
        sort: str = "id",
        descending: bool = False,
        offset: int = 0,
        limit: int = 50,
    ) -> Page:
        """Filter, sort by any counter, and page. `status=None` lists every status."""
        if sort not in SORTABLE:
            raise StoreError(f"cannot sort by {sort!r}; sortable columns: {', '.join(sorted(SORTABLE))}")
        conds = []
        if env:
            conds.append(EntryRow.env == env)
        if task:
            conds.append(EntryRow.task == task)
        if source:
            conds.append(EntryRow.source == Source(source).value)
        if status:
            conds.append(EntryRow.status == Status(status).value)
        if text:
            like = f"%{text}%"
            conds.append(or_(EntryRow.text.ilike(like), EntryRow.task.ilike(like)))
        if ids is not None:
            conds.append(EntryRow.id.in_([int(i) for i in ids]))
        col = getattr(EntryRow, sort)
        order = [col.desc() if descending else col.asc(), EntryRow.id.asc()]
        with self._session() as s:
            total = s.execute(select(func.count()).select_from(EntryRow).where(*conds)).scalar_one()
            rows = s.scalars(select(EntryRow).where(*conds).order_by(*order).offset(offset).limit(limit)).all()
            return Page([_to_experience(r) for r in rows], total, offset, limit)

    def count(self, *, status: str | None = "active") -> int:
        return self.list_entries(status=status, limit=0).total

    def active_vectors(self, key: str = "query") -> tuple[np.ndarray, np.ndarray, list[Experience]]:
        """(ids (n,), vectors (n, d), entries) of every active entry that has an embedding for `key`."""
        col = EntryRow.query_embedding if key == "query" else EntryRow.text_embedding
        with self._session() as s:
            rows = s.scalars(select(EntryRow).where(EntryRow.status == Status.ACTIVE.value, col.is_not(None)).order_by(EntryRow.id)).all()
            if not rows:
                return np.zeros(0, dtype=np.int64), np.zeros((0, 0), dtype=np.float32), []
            vecs = np.stack([_bytes_to_vec(getattr(r, col.key)) for r in rows])
            return np.array([r.id for r in rows], dtype=np.int64), vecs, [_to_experience(r) for r in rows]

    def embeddings(self, ids: Sequence[int], key: str = "query") -> dict[int, np.ndarray]:
        col = EntryRow.query_embedding if key == "query" else EntryRow.text_embedding
        ids = [int(i) for i in ids]
        out: dict[int, np.ndarray] = {}
        with self._session() as s:
            for a in range(0, len(ids), 10_000):  # SQLite caps the parameters of one statement
                rows = s.execute(select(EntryRow.id, col).where(EntryRow.id.in_(ids[a:a + 10_000]))).all()
                out.update((i, _bytes_to_vec(b)) for i, b in rows if b is not None)
        return out

    def missing_embeddings(self, limit: int = 10_000) -> list[Experience]:
        """Active entries lacking a query or text embedding (written by a process without an embedder)."""
        with self._session() as s:
            rows = s.scalars(select(EntryRow).where(
                EntryRow.status == Status.ACTIVE.value,
                or_(EntryRow.query_embedding.is_(None), EntryRow.text_embedding.is_(None)),
            ).limit(limit)).all()
            return [_to_experience(r) for r in rows]

    def set_embeddings(self, items: Sequence[tuple[int, np.ndarray | None, np.ndarray | None]], embedder: str) -> None:
        """Fill in (id, query_vec, text_vec) without bumping the library version: same content, new cache."""
        with self._tx() as s:
            for entry_id, qv, tv in items:
                vals: dict[str, Any] = {"embedder": embedder}
                if qv is not None:
                    vals["query_embedding"] = _vec_to_bytes(qv)
                if tv is not None:
                    vals["text_embedding"] = _vec_to_bytes(tv)
                s.execute(update(EntryRow).where(EntryRow.id == entry_id).values(**vals))

    # -- entries: change -----------------------------------------------------------------------

    def update_text(
        self,
        entry_id: int,
        text: str,
        *,
        expected_version: int,
        actor: str = "human",
        note: str = "",
        text_embedding: np.ndarray | None = None,
        embedder: str = "",
    ) -> Experience:
        """Replace an entry's text if it is still at `expected_version`; a stale write raises StaleWriteError."""
        if not text or not text.strip():
            raise StoreError("an entry's text must not be empty")
        with self._tx() as s:
            row = s.get(EntryRow, entry_id)
            if row is None:
                raise NotFoundError(f"no entry with id {entry_id}")
            lv = self._bump(s)
            # Compare-and-set in SQL: correct even on databases without BEGIN IMMEDIATE (Postgres).
            res = s.execute(
                update(EntryRow)
                .where(EntryRow.id == entry_id, EntryRow.version == expected_version)
                .values(text=text, version=EntryRow.version + 1, changed_version=lv, updated_at=time.time(),
                        text_embedding=_vec_to_bytes(text_embedding), embedder=embedder or row.embedder)
                .execution_options(synchronize_session=False)
            )
            if res.rowcount != 1:
                raise StaleWriteError(entry_id, expected_version, row.version)  # the transaction rolls back
            s.refresh(row)
            s.add(EntryVersionRow(entry_id=entry_id, version=row.version, text=text, status=row.status, action="edit",
                                  actor=actor, note=note, library_version=lv))
            return _to_experience(row)

    def _set_status(self, s: Session, row: EntryRow, status: Status, lv: int, *, action: str, actor: str, note: str,
                    run_id: int | None = None, step: int | None = None) -> None:
        row.status = status.value
        row.version += 1
        row.changed_version = lv
        row.updated_at = time.time()
        s.add(EntryVersionRow(entry_id=row.id, version=row.version, text=row.text, status=row.status, action=action,
                              actor=actor, note=note, library_version=lv, **_by_run(run_id, step)))

    def set_status(self, ids: Sequence[int], status: Status | str, *, actor: str = "human", note: str = "",
                   expected_versions: dict[int, int] | None = None, run_id: int | None = None,
                   step: int | None = None) -> list[int]:
        """Archive (soft delete) or restore entries in one transaction; returns the ids that changed. run_id, step: the
        training run and step doing it (a discard by its extractor or merge), which a resume may take back."""
        status = Status(status)
        action = "archive" if status is Status.ARCHIVED else "restore"
        with self._tx() as s:
            rows = [s.get(EntryRow, int(i)) for i in ids]
            missing = [i for i, r in zip(ids, rows) if r is None]
            if missing:
                raise NotFoundError(f"no entry with id {missing[0]}")
            for r in rows:
                if expected_versions and r.id in expected_versions and r.version != expected_versions[r.id]:
                    raise StaleWriteError(r.id, expected_versions[r.id], r.version)
            todo = [r for r in rows if r.status != status.value]
            if not todo:
                return []
            lv = self._bump(s)
            for r in todo:
                self._set_status(s, r, status, lv, action=action, actor=actor, note=note, run_id=run_id, step=step)
            return [r.id for r in todo]

    def archive(self, ids: Sequence[int], **kw: Any) -> list[int]:
        return self.set_status(ids, Status.ARCHIVED, **kw)

    def restore(self, ids: Sequence[int], **kw: Any) -> list[int]:
        return self.set_status(ids, Status.ACTIVE, **kw)

    def replace_entries(self, old_ids: Sequence[int], new: NewEntry, *, actor: str, action: str, note: str = "",
                        expected_versions: dict[int, int] | None = None) -> int:
        """Write one new entry whose parents are `old_ids` and archive those, atomically (update op, merge)."""
        old_ids = [int(i) for i in old_ids]
        if len(set(old_ids)) != len(old_ids):
            raise StoreError(f"entry ids repeat in {old_ids}")
        if not new.text or not new.text.strip():
            raise StoreError("the replacing entry's text must not be empty")
        with self._tx() as s:
            rows = [s.get(EntryRow, i) for i in old_ids]
            for i, r in zip(old_ids, rows):
                if r is None:
                    raise NotFoundError(f"no entry with id {i}")
                if r.status != Status.ACTIVE.value:
                    raise StoreError(f"entry {i} is archived; restore it before merging or updating it")
                if expected_versions and i in expected_versions and r.version != expected_versions[i]:
                    raise StaleWriteError(i, expected_versions[i], r.version)
            lv = self._bump(s)
            now = time.time()
            row = EntryRow(
                text=new.text, env=new.env or rows[0].env, task=new.task or rows[0].task,
                query=new.query or new.task or rows[0].query, source=Source(new.source).value,
                status=Status.ACTIVE.value, version=1, parent_ids=json.dumps(old_ids), created_step=new.created_step,
                run_id=new.run_id, source_episode_id=new.source_episode_id,
                query_embedding=_vec_to_bytes(new.query_embedding) if new.query_embedding is not None else rows[0].query_embedding,
                text_embedding=_vec_to_bytes(new.text_embedding), embedder=new.embedder or rows[0].embedder,
                changed_version=lv, created_at=now, updated_at=now, **_gen_columns(new.generation),
            )
            s.add(row)
            s.flush()
            by_run = _by_run(new.run_id, new.created_step)
            s.add(EntryVersionRow(entry_id=row.id, version=1, text=row.text, status=row.status, action=action,
                                  actor=actor, note=note or f"replaces {old_ids}", library_version=lv, created_at=now, **by_run))
            for r in rows:
                self._set_status(s, r, Status.ARCHIVED, lv, action=action, actor=actor, note=f"replaced by {row.id}", **by_run)
            return row.id

    def undo_replace(self, new_id: int, *, actor: str = "human") -> list[int]:
        """Undo a merge/update: archive the replacing entry and restore its parents. Returns the parents."""
        with self._tx() as s:
            row = s.get(EntryRow, new_id)
            if row is None:
                raise NotFoundError(f"no entry with id {new_id}")
            parents = json.loads(row.parent_ids or "[]")
            if not parents:
                raise StoreError(f"entry {new_id} has no parents: it is not the result of a merge or update")
            lv = self._bump(s)
            if row.status == Status.ACTIVE.value:
                self._set_status(s, row, Status.ARCHIVED, lv, action="unmerge", actor=actor, note="merge undone")
            for pid in parents:
                p = s.get(EntryRow, pid)
                if p is not None and p.status != Status.ACTIVE.value:
                    self._set_status(s, p, Status.ACTIVE, lv, action="unmerge", actor=actor, note=f"merge {new_id} undone")
            return parents

    # -- history, diff, revert -----------------------------------------------------------------

    def history(self, entry_id: int) -> list[VersionInfo]:
        with self._session() as s:
            rows = s.scalars(select(EntryVersionRow).where(EntryVersionRow.entry_id == entry_id).order_by(EntryVersionRow.version)).all()
            if not rows and s.get(EntryRow, entry_id) is None:
                raise NotFoundError(f"no entry with id {entry_id}")
            return [VersionInfo(r.entry_id, r.version, r.text, r.status, r.action, r.actor, r.note, r.library_version,
                                r.created_at) for r in rows]

    def version_text(self, entry_id: int, version: int) -> str:
        for v in self.history(entry_id):
            if v.version == version:
                return v.text
        raise NotFoundError(f"entry {entry_id} has no version {version}")

    def diff(self, entry_id: int, v_from: int, v_to: int) -> str:
        """Unified diff of the entry's text between two versions."""
        a, b = self.version_text(entry_id, v_from), self.version_text(entry_id, v_to)
        return text_diff(a, b, f"v{v_from}", f"v{v_to}")

    def revert(self, entry_id: int, to_version: int, *, expected_version: int, actor: str = "human") -> Experience:
        """Make an old version's text current again, as a new version (history is never rewritten)."""
        text = self.version_text(entry_id, to_version)
        return self.update_text(entry_id, text, expected_version=expected_version, actor=actor, note=f"revert to v{to_version}")

    # -- counters (statistics: no library version bump) ----------------------------------------
    #
    # Lock order: the counters are written from several threads of one run at once (the manager's
    # retrieval recorder beside the extractor's outcomes and training marks), each transaction locking the rows
    # it updates. Each takes its rows in entry-id order, so two of them never wait on each other in a circle:
    # Postgres reported "deadlock detected" (and the run died) when two took the same entries in opposite orders.

    def record_retrievals(self, entry_ids: Sequence[int], at: float | dict[int, float] | None = None, *,
                          run_id: int | None = None, step: int | None = None) -> None:
        """Retrieval counters (Eq. 6): each id once per retrieval; `at` the time (or entry id -> its latest time).
        With a training run's run_id and step, the step's additions are kept as rows that a resume from an earlier
        checkpoint takes back (EntryCountRow)."""
        if not entry_ids:
            return
        now = time.time()
        counts = Counter(int(i) for i in entry_ids)
        when = at if isinstance(at, dict) else {}
        with self._tx() as s:
            before = self._last_values(s, EntryRow.last_retrieved_at, counts, run_id, step)
            after = {}
            for i, n in sorted(counts.items()):  # rows in id order (see the note above)
                after[i] = when.get(i, now) if isinstance(at, dict) else (now if at is None else at)
                s.execute(update(EntryRow).where(EntryRow.id == i).values(
                    retrieved_count=EntryRow.retrieved_count + n, last_retrieved_at=after[i]))
            self._add_count_rows(s, "retrieved", counts, before, after, run_id, step)

    def record_outcomes(self, usages: Sequence[tuple[int, bool, float]], *, run_id: int | None = None,
                        episode_ids: Sequence[int | None] | None = None, step: int = 0) -> None:
        """(entry_id, success, reward) per use: successes/failures counters and the reward history."""
        if not usages:
            return
        tally: dict[int, list[int]] = {}  # entry id -> [successes, failures] to add
        for i, ok, _ in usages:
            tally.setdefault(int(i), [0, 0])[0 if ok else 1] += 1
        with self._tx() as s:
            for i, (won, lost) in sorted(tally.items()):  # rows in id order (see the note above)
                s.execute(update(EntryRow).where(EntryRow.id == i).values(
                    successes=EntryRow.successes + won, failures=EntryRow.failures + lost))
            for n, (i, ok, reward) in enumerate(usages):
                s.add(EntryUsageRow(entry_id=int(i), run_id=run_id, episode_id=episode_ids[n] if episode_ids else None,
                                    step=step, success=bool(ok), reward=float(reward)))

    def record_trained(self, entry_ids: Sequence[int], step: int, *, run_id: int | None = None,
                       run_step: int | None = None) -> None:
        """Eq. 7 bookkeeping: how often each entry's generation was trained on, and when last (`step`: the extractor's
        update index, Eq. 7's clock). With the training run's run_id and run_step, the additions are kept as rows that
        a resume from an earlier checkpoint takes back (EntryCountRow)."""
        counts = Counter(int(i) for i in entry_ids)
        if not counts:
            return
        with self._tx() as s:
            before = self._last_values(s, EntryRow.last_trained_step, counts, run_id, run_step)
            for i, n in sorted(counts.items()):  # rows in id order (see the note above)
                s.execute(update(EntryRow).where(EntryRow.id == i).values(
                    trained_count=EntryRow.trained_count + n, last_trained_step=step))
            self._add_count_rows(s, "trained", counts, before, dict.fromkeys(counts, step), run_id, run_step)

    @staticmethod
    def _last_values(s: Session, col: Any, counts: Counter, run_id: int | None, step: int | None) -> dict[int, Any]:
        """Entry id -> `col` before this write, for a run's write that keeps count rows ({} otherwise)."""
        if run_id is None or step is None:
            return {}
        return dict(s.execute(select(EntryRow.id, col).where(EntryRow.id.in_(sorted(counts)))).all())

    @staticmethod
    def _add_count_rows(s: Session, kind: str, counts: Counter, before: dict[int, Any], after: dict[int, Any],
                        run_id: int | None, step: int | None) -> None:
        if run_id is None or step is None:
            return
        s.add_all([EntryCountRow(entry_id=i, run_id=run_id, step=step, kind=kind, n=n, before=before[i], after=after[i])
                   for i, n in sorted(counts.items()) if i in before])  # an id the store does not hold counts nothing

    def training_stats(self, entry_ids: Sequence[int]) -> dict[int, tuple[int, int | None]]:
        """entry id -> (trained_count, last_trained_step): what Eq. 7 needs, keyed by entry id."""
        with self._session() as s:
            rows = s.execute(select(EntryRow.id, EntryRow.trained_count, EntryRow.last_trained_step)
                             .where(EntryRow.id.in_([int(i) for i in entry_ids]))).all()
            return {i: (c, last) for i, c, last in rows}

    def usage(self, entry_id: int, limit: int = 200) -> list[dict[str, Any]]:
        with self._session() as s:
            rows = s.scalars(select(EntryUsageRow).where(EntryUsageRow.entry_id == entry_id)
                             .order_by(EntryUsageRow.id.desc()).limit(limit)).all()
            return [{"run_id": r.run_id, "episode_id": r.episode_id, "step": r.step, "success": r.success,
                     "reward": r.reward, "time": r.created_at} for r in rows]

    def children(self, entry_id: int) -> list[int]:
        """Entries that list `entry_id` among their parents (forward lineage)."""
        with self._session() as s:
            like = f"%{entry_id}%"
            rows = s.execute(select(EntryRow.id, EntryRow.parent_ids).where(EntryRow.parent_ids.like(like))).all()
            return [i for i, p in rows if entry_id in json.loads(p or "[]")]

    # -- whole-library snapshots (A/B arms, exports) -------------------------------------------

    def snapshot_at(self, library_version: int) -> list[VersionInfo]:
        """The active entries as they were at a past library version (from the version history)."""
        with self._session() as s:
            sub = (select(EntryVersionRow.entry_id, func.max(EntryVersionRow.id).label("vid"))
                   .where(EntryVersionRow.library_version <= library_version).group_by(EntryVersionRow.entry_id).subquery())
            rows = s.scalars(select(EntryVersionRow).join(sub, EntryVersionRow.id == sub.c.vid)
                             .order_by(EntryVersionRow.entry_id)).all()
            return [VersionInfo(r.entry_id, r.version, r.text, r.status, r.action, r.actor, r.note, r.library_version,
                                r.created_at) for r in rows if r.status == Status.ACTIVE.value]

    # -- read-only queries for the workbench ------------------------------------------------------
    # Added for app/ (the live curves' series and edit markers, the library table's filters); nothing above
    # depends on them.


    def human_edits_since(self, after_id: int = 0, actors: Sequence[str] = ("human", "cli"),
                          limit: int = 10_000) -> list[dict[str, Any]]:
        """Version rows written by people (not the extractor), newer than cursor `after_id`, oldest first."""
        with self._session() as s:
            rows = s.execute(
                select(EntryVersionRow.id, EntryVersionRow.entry_id, EntryVersionRow.version, EntryVersionRow.action,
                       EntryVersionRow.actor, EntryVersionRow.created_at)
                .where(EntryVersionRow.id > after_id, EntryVersionRow.actor.in_(list(actors)))
                .order_by(EntryVersionRow.id).limit(limit)).all()
            return [r._asdict() for r in rows]

    def entry_facets(self) -> dict[str, list[str]]:
        """Distinct envs and sources present in the library (for filter menus)."""
        with self._session() as s:
            envs = s.scalars(select(EntryRow.env).distinct().order_by(EntryRow.env)).all()
            sources = s.scalars(select(EntryRow.source).distinct().order_by(EntryRow.source)).all()
            return {"env": [e for e in envs if e], "source": list(sources)}
