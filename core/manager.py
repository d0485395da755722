"""The ExperienceManager: stores, retrieves, updates and merges entries asynchronously (docs/method.md 1–4).

Retrieval path (per micro-batch):
    queries from many callers --(flush at B queries or t_max)--> LRU embedding cache, misses
    embedded in one batch --> per-group vector search split over W workers under a reader lock
    --> Eq. 6 re-ranking of N×k candidates --> top k Hits; retrieval counters written behind.

Writes (extractor operations, merges) take the writer lock. Other processes' writes (a person
editing in the workbench) are picked up by polling the store's library version every
`sync_interval_s`, so they reach retrieval within about that long.

The manager runs its own asyncio loop in a background thread: `await manager.search(...)` from
async code, `manager.search_sync(...)` from threads; concurrent callers of either are gathered
into the same micro-batches. The public methods are plain values in and out, so a Ray actor
handle can stand in for the object at scale.
"""
from __future__ import annotations

import asyncio
import logging
import queue
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from core.config import IndexConfig, ManagerConfig
from core.diversify import diversify, eq6_scores, random_demotion, s_rank
from core.embedding import Embedder
from core.index import VectorIndex
from core.store import ExperienceStore, NewEntry, StoreError
from core.types import Experience, Generation, Hit, Operation, OpResult, Source, Status

log = logging.getLogger(__name__)
_SEP = "\x1f"  # joins a filter group and a task into one index group name (manager.task_scope)


class RWLock:
    """Many readers or one writer; a waiting writer blocks new readers (no writer starvation)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._readers = 0
        self._writer = False
        self._writers_waiting = 0

    def acquire_read(self) -> None:
        with self._cond:
            while self._writer or self._writers_waiting:
                self._cond.wait()
            self._readers += 1

    def release_read(self) -> None:
        with self._cond:
            self._readers -= 1
            if not self._readers:
                self._cond.notify_all()

    def acquire_write(self) -> None:
        with self._cond:
            self._writers_waiting += 1
            while self._writer or self._readers:
                self._cond.wait()
            self._writers_waiting -= 1
            self._writer = True

    def release_write(self) -> None:
        with self._cond:
            self._writer = False
            self._cond.notify_all()

    class _Ctx:
        def __init__(self, enter, exit_):  # noqa: ANN001
            self._enter, self._exit = enter, exit_

        def __enter__(self) -> None:
            self._enter()

        def __exit__(self, *a: object) -> None:
            self._exit()

    def read(self) -> "RWLock._Ctx":
        return RWLock._Ctx(self.acquire_read, self.release_read)

    def write(self) -> "RWLock._Ctx":
        return RWLock._Ctx(self.acquire_write, self.release_write)


@dataclass
class OpContext:
    """Where a batch of operations comes from: the episode that was distilled (or a merge)."""

    env: str = ""
    task: str = ""
    query: str = ""  # keys new entries in the index (default: task)
    run_id: int | None = None
    step: int = 0
    episode_id: int | None = None
    generation: Generation | None = None
    source: Source = Source.EXTRACTED
    actor: str = "extractor"


@dataclass
class _Pending:
    query: str
    group: str | None
    k: int
    future: asyncio.Future
    scope: str | None = None  # the query's own task (manager.task_scope)
    step: int | None = None  # the run step the retrieval counts toward (a resume may take it back)


@dataclass
class _Meta:
    """What retrieval needs of an entry without going to the database."""

    text: str
    env: str
    task: str
    retrieved: int = 0
    last_retrieved_at: float | None = None


@dataclass
class LatencyWindow:
    """Retrieval latencies, the last 10,000 to 20,000 kept. `count` numbers every value ever added, so each reader
    keeps its own cursor and nothing is reset on read."""

    values_ms: list[float] = field(default_factory=list)
    dropped: int = 0  # values let go from the front
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, ms: float) -> None:
        with self.lock:
            self.values_ms.append(ms)
            if len(self.values_ms) > 20_000:
                del self.values_ms[:10_000]
                self.dropped += 10_000

    def since(self, cursor: int) -> tuple[list[float], int]:
        """The kept values added after the first `cursor`, and the count to pass next time. A cursor past the count
        (the window was rebuilt under the reader: a restarted manager actor) reads from the start."""
        with self.lock:
            count = self.dropped + len(self.values_ms)
            if cursor > count:
                cursor = 0
            return self.values_ms[max(0, cursor - self.dropped):], count


class ExperienceManager:
    def __init__(
        self,
        store: ExperienceStore,
        embedder: Embedder,
        cfg: ManagerConfig | None = None,
        index_cfg: IndexConfig | None = None,
        *,
        seed: int = 0,
        start: bool = True,
        run_id: int | None = None,
    ):
        """run_id: the training run whose retrievals these are: with a search's `step`, the store keeps what each step
        added to the retrieval counters, so a resume from an earlier checkpoint can take it back."""
        self.store = store
        self.run_id = run_id
        self.embedder = embedder
        self.cfg = cfg or ManagerConfig()
        self.index = VectorIndex(embedder.dim, index_cfg)
        self.lock = RWLock()
        self._rng = random.Random(seed)
        self._meta: dict[int, _Meta] = {}
        self.version = -1
        self._sync_lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=self.cfg.workers, thread_name_prefix="expmgr-search")
        self._batcher = ThreadPoolExecutor(max_workers=2, thread_name_prefix="expmgr-batch")
        self._pending: list[_Pending] = []
        self._flush_handle: asyncio.TimerHandle | None = None
        # (time, [(entry id, run step)]) per retrieval batch, written to the store behind retrieval
        self._counter_q: queue.Queue[tuple[float, list[tuple[int, int | None]]] | None] = queue.Queue()
        self._counted = [0, 0]  # batches queued, batches written (flush_counters waits for the second to reach the first)
        self._counted_lock = threading.Lock()
        self.latency = LatencyWindow()
        self.stats = {"queries": 0, "batches": 0, "hits": 0, "empty": 0, "syncs": 0}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._threads: list[threading.Thread] = []
        self._closed = threading.Event()
        if start:
            self.start()

    # -- life cycle ----------------------------------------------------------------------------

    def start(self) -> None:
        self.sync(full=True)
        self._loop = asyncio.new_event_loop()
        ready = threading.Event()

        def run_loop() -> None:
            asyncio.set_event_loop(self._loop)
            self._loop.call_soon(ready.set)
            self._loop.run_forever()

        for target, name in ((run_loop, "expmgr-loop"), (self._counter_writer, "expmgr-counters"), (self._sync_poller, "expmgr-sync")):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)
        ready.wait()

    def close(self) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        self._counter_q.put(None)
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
        for t in self._threads:
            t.join(timeout=5)
        self._pool.shutdown(wait=True)
        self._batcher.shutdown(wait=True)

    def __enter__(self) -> "ExperienceManager":
        return self

    def __exit__(self, *a: object) -> None:
        self.close()

    def _group_of(self, e: Experience | _Meta) -> str:
        group = {"env": e.env, "task": e.task, "none": ""}[self.cfg.filter_by]
        # task_scope: one index group per (filter group, task), so a task's own entries are one search
        return f"{group}{_SEP}{e.task}" if self.cfg.task_scope else group

    def _search_groups(self, group: str | None, scope: str | None, names: list[str]) -> str | tuple[str, ...] | None:
        """The index groups one query searches: its filter group, or with task_scope its own task's
        group when that holds an entry, else every task group of its filter group. `names`: the index's
        groups, listed once per micro-batch (not per query: retrieval is on the rollout's path)."""
        if not self.cfg.task_scope:
            return group
        own = f"{group or ''}{_SEP}{scope or ''}"
        if scope is not None and own in names:
            return (own,)
        if group is None:
            return None
        return tuple(g for g in names if g.startswith(f"{group}{_SEP}"))

    # -- keeping in step with the store ---------------------------------------------------------

    def _sync_poller(self) -> None:
        while not self._closed.wait(self.cfg.sync_interval_s):
            try:
                if self.store.library_version() != self.version:
                    self.sync()
            except Exception:  # a transient database error must not kill the poller
                log.exception("library sync failed; retrying")

    def sync(self, full: bool = False) -> int:
        """Apply the store's changes since our version to the index; returns the new version."""
        with self._sync_lock:
            if full:
                version, changed = self.store.library_version(), []
                self._embed_missing()
                ids, vecs, entries = self.store.active_vectors(self.cfg.key)
                with self.lock.write():
                    self._meta = {e.id: _Meta(e.text, e.env, e.task, e.retrieved_count, e.last_retrieved_at) for e in entries}
                    self.index.rebuild(ids, vecs, [self._group_of(e) for e in entries])
                    self.version = version
                self.stats["syncs"] += 1
                return version
            version, changed = self.store.changes_since(self.version)
            if not changed:
                self.version = version
                return version
            if any(e.status is Status.ACTIVE for e in changed):
                self._embed_missing()
            active = [e for e in changed if e.status is Status.ACTIVE]
            vecs = self.store.embeddings([e.id for e in active], self.cfg.key)
            active = [e for e in active if e.id in vecs]
            with self.lock.write():
                self.index.remove([e.id for e in changed if e.status is not Status.ACTIVE])
                for e in changed:
                    if e.status is not Status.ACTIVE:
                        self._meta.pop(e.id, None)
                if active:
                    self.index.upsert(np.array([e.id for e in active], dtype=np.int64),
                                      np.stack([vecs[e.id] for e in active]), [self._group_of(e) for e in active])
                    for e in active:
                        old = self._meta.get(e.id)
                        self._meta[e.id] = _Meta(e.text, e.env, e.task, e.retrieved_count if old is None else old.retrieved,
                                                 e.last_retrieved_at if old is None else old.last_retrieved_at)
                self.version = version
            self.stats["syncs"] += 1
            return version

    def _embed_missing(self) -> None:
        """Entries written without embeddings (by the UI, an import) get them here, once."""
        while True:
            todo = self.store.missing_embeddings(limit=2048)
            if not todo:
                return
            qv = self.embedder.embed([e.query or e.task or e.text for e in todo])
            tv = self.embedder.embed([e.text for e in todo])
            self.store.set_embeddings([(e.id, q, t) for e, q, t in zip(todo, qv, tv)], self.embedder.name)

    # -- retrieval -------------------------------------------------------------------------------

    async def search(self, queries: Sequence[str], k: int | None = None, task: str | Sequence[str | None] | None = None,
                     scope: Sequence[str | None] | None = None, step: int | None = None) -> list[list[Hit]]:
        """Top-k entries per query. `task` restricts each query to one group of entries (the env name
        when manager.filter_by is 'env', the task text when 'task'); a list gives one per query.
        `scope` (one per query): the query's own task text, searched first when manager.task_scope is on. `step`: the
        training step the retrievals count toward (with the manager's run_id)."""
        if asyncio.get_running_loop() is not self._loop:
            return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(self._search(list(queries), k, task, scope, step),
                                                                              self._loop))
        return await self._search(list(queries), k, task, scope, step)

    def search_sync(self, queries: Sequence[str], k: int | None = None, task: str | Sequence[str | None] | None = None,
                    timeout: float | None = 60.0, scope: Sequence[str | None] | None = None,
                    step: int | None = None) -> list[list[Hit]]:
        if self._loop is None:
            raise RuntimeError("the ExperienceManager is not started")
        fut = asyncio.run_coroutine_threadsafe(self._search(list(queries), k, task, scope, step), self._loop)
        return fut.result(timeout)

    async def _search(self, queries: list[str], k: int | None, task: str | Sequence[str | None] | None,
                      scope: Sequence[str | None] | None = None, step: int | None = None) -> list[list[Hit]]:
        k = k or self.cfg.top_k
        groups = list(task) if isinstance(task, (list, tuple)) else [task] * len(queries)
        scopes = list(scope) if scope is not None else [None] * len(queries)
        if len(groups) != len(queries) or len(scopes) != len(queries):
            raise ValueError("task and scope, when lists, must give one per query")
        loop = asyncio.get_running_loop()
        futs = []
        for q, g, sc in zip(queries, groups, scopes):
            fut = loop.create_future()
            self._pending.append(_Pending(q, g if self.cfg.filter_by != "none" else None, k, fut, sc, step))
            futs.append(fut)
        if len(self._pending) >= self.cfg.batch_size:
            self._flush()
        elif self._flush_handle is None:
            self._flush_handle = loop.call_later(self.cfg.max_wait_ms / 1000.0, self._flush)
        return list(await asyncio.gather(*futs))

    def _flush(self) -> None:
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        while self._pending:
            batch, self._pending = self._pending[: self.cfg.batch_size], self._pending[self.cfg.batch_size:]
            cf = self._batcher.submit(self._process, batch)
            cf.add_done_callback(lambda f, b=batch: self._loop.call_soon_threadsafe(self._resolve, b, f))

    @staticmethod
    def _resolve(batch: list[_Pending], f) -> None:  # noqa: ANN001
        exc = f.exception()
        if exc is not None:
            for p in batch:
                if not p.future.done():
                    p.future.set_exception(exc)
            return
        for p, hits in zip(batch, f.result()):
            if not p.future.done():
                p.future.set_result(hits)

    def _process(self, batch: list[_Pending]) -> list[list[Hit]]:
        t0 = time.perf_counter()
        vecs = self.embedder.embed_queries([p.query for p in batch])  # (B, d), misses embedded in one call
        results = self.retrieve_vectors(vecs, [p.group for p in batch], [p.k for p in batch], [p.scope for p in batch],
                                        [p.step for p in batch])
        ms = (time.perf_counter() - t0) * 1000.0
        for _ in batch:
            self.latency.add(ms)
        self.stats["batches"] += 1
        return results

    def retrieve_vectors(self, vecs: np.ndarray, groups: list[str | None], ks: list[int],
                         scopes: Sequence[str | None] | None = None, steps: Sequence[int | None] | None = None) -> list[list[Hit]]:
        """Search, re-rank and count, for already-embedded queries (B, d); steps: the run step each counts toward."""
        kmax = max(ks)
        n_cand = kmax * (self.cfg.oversample if self.cfg.diversify else 1)
        out: list[list[Hit]] = [[] for _ in groups]
        scopes = list(scopes) if scopes is not None else [None] * len(groups)
        now = time.time()
        chosen_ids: list[tuple[int, int | None]] = []  # (entry id, run step) per pick
        # Picks earlier in this batch count for the later queries (Eq. 6 sees them as retrieved just now):
        # without this, identical queries of one micro-batch (a task's K/2 rollouts) all get the same entry.
        picked: dict[int, int] = {}
        with self.lock.read():
            by_group: dict[str | tuple[str, ...] | None, list[int]] = {}
            names = self.index.groups() if self.cfg.task_scope else []
            for i, (g, sc) in enumerate(zip(groups, scopes)):
                by_group.setdefault(self._search_groups(g, sc, names), []).append(i)
            for g, rows in by_group.items():
                scores, ids = self._parallel_search(vecs[rows], n_cand, g)
                for r, srow, irow in zip(rows, scores, ids):
                    valid = [(float(s), int(i)) for s, i in zip(srow, irow)
                             if i >= 0 and int(i) in self._meta and float(s) >= self.cfg.min_similarity]
                    if not valid:
                        self.stats["empty"] += 1
                        continue
                    metas = [self._meta[i] for _, i in valid]
                    counts = [m.retrieved + picked.get(i, 0) for (_, i), m in zip(valid, metas)]
                    recent = [i in picked or (m.last_retrieved_at is not None and now - m.last_retrieved_at < self.cfg.recent_window_s)
                              for (_, i), m in zip(valid, metas)]
                    base = s_rank([s for s, _ in valid], self.cfg.rank_score)  # valid is in similarity order
                    if self.cfg.diversify:
                        order = diversify(base, counts, recent, k=len(valid), lam=self.cfg.diversity_lambda)
                        ranked = eq6_scores(base, counts, recent, lam=self.cfg.diversity_lambda)
                        if self.cfg.random_demote:
                            order = random_demotion(order, recent, p=self.cfg.random_demote_p, rng=self._rng)
                    else:
                        order, ranked = list(range(len(valid))), base
                    for j in order[: ks[r]]:
                        s, i = valid[j]
                        m = metas[j]
                        out[r].append(Hit(entry_id=i, text=m.text, score=s, rank_score=ranked[j], task=m.task, env=m.env))
                        chosen_ids.append((i, steps[r] if steps is not None else None))
                        if self.cfg.record_usage:
                            picked[i] = picked.get(i, 0) + 1
        self.stats["queries"] += len(groups)
        self.stats["hits"] += len(chosen_ids)
        if not self.cfg.record_usage:
            return out
        # Counters move in memory at once (the next batch's Eq. 6 sees them) and reach the store behind.
        for i, _ in chosen_ids:
            m = self._meta.get(i)
            if m is not None:
                m.retrieved += 1
                m.last_retrieved_at = now
        if chosen_ids:
            with self._counted_lock:
                self._counted[0] += 1
                self._counter_q.put((now, chosen_ids))  # the store gets the same time as _meta (a resume reads it back)
        return out

    def _parallel_search(self, q: np.ndarray, k: int, group: str | tuple[str, ...] | None) -> tuple[np.ndarray, np.ndarray]:
        """Split the batch over W workers (faiss releases the GIL while it searches)."""
        w = min(self.cfg.workers, len(q)) if self.index.split_batches else 1
        if w <= 1:
            return self.index.search(q, k, group)
        parts = np.array_split(np.arange(len(q)), w)
        res = list(self._pool.map(lambda p: self.index.search(q[p], k, group), parts))
        return np.concatenate([r[0] for r in res]), np.concatenate([r[1] for r in res])

    def _counter_writer(self) -> None:
        while True:
            item = self._counter_q.get()
            got = [item]
            while True:  # drain what queued meanwhile: one write per run step for many batches
                try:
                    got.append(self._counter_q.get_nowait())
                except queue.Empty:
                    break
            by_step: dict[int | None, tuple[list[int], dict[int, float]]] = {}
            for it in got:
                if it is None:
                    continue
                at, picks = it
                for i, step in picks:
                    ids, when = by_step.setdefault(step, ([], {}))
                    ids.append(i)
                    when[i] = at  # batches queue in time order: the latest time wins
            for step, (ids, when) in by_step.items():
                try:
                    self.store.record_retrievals(ids, at=when, run_id=self.run_id, step=step)
                except Exception:
                    log.exception("could not record retrieval counters")
            with self._counted_lock:
                self._counted[1] += sum(it is not None for it in got)
            if any(it is None for it in got):
                return
            time.sleep(0.05)

    def flush_counters(self, timeout: float = 60.0) -> None:
        """Block until every retrieval counted before this call is in the store (a checkpoint's counters are all there);
        later ones, a prefetch's, need not wait."""
        t0, target = time.time(), self._counted[0]
        while self._threads and self._counted[1] < target and not self._closed.is_set() and time.time() - t0 < timeout:
            time.sleep(0.01)

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps of the manager: the random demotion's RNG (Eq. 6's counters are the store's, written
        first)."""
        self.flush_counters()
        return {"rng": self._rng.getstate()}

    def load_state_dict(self, st: dict[str, Any]) -> None:
        if st.get("rng") is not None:
            self._rng.setstate(st["rng"])

    def latency_percentiles(self, since: int = 0) -> tuple[dict[str, float], int]:
        """p50/p99 of the retrieval latencies recorded after the first `since` ({} when there are none), and the
        cursor for the next read. Reads only: the training loop's collect phase passes the cursor of its previous
        read (trainers/cotrain.py), any other reader keeps its own."""
        v, count = self.latency.since(since)
        if not v:
            return {}, count
        p50, p99 = np.percentile(v, [50, 99])
        return {"retrieval/latency_p50_ms": float(p50), "retrieval/latency_p99_ms": float(p99)}, count

    # -- writes ----------------------------------------------------------------------------------

    def validate(self, op: Operation) -> str:
        """Why `op` cannot be applied, or "" when it can."""
        if op.kind not in ("add", "update", "discard"):
            return f"unknown operation {op.kind!r} (expected add, update or discard)"
        if op.kind in ("add", "update"):
            if not isinstance(op.text, str) or not op.text.strip():
                return f"{op.kind} needs a non-empty text"
            if len(op.text) > self.cfg.max_text_chars:
                return f"text is {len(op.text)} characters, over the cap of {self.cfg.max_text_chars}"
        if op.kind in ("update", "discard"):
            if not op.ids:
                return f"{op.kind} needs at least one entry id"
            if len(set(op.ids)) != len(op.ids):
                return f"{op.kind} names an entry twice: {op.ids}"
        return ""

    def apply_operations(self, ops: Sequence[Operation], ctx: OpContext | None = None) -> list[OpResult]:
        """Apply each operation on its own (atomically); a bad one is refused with its reason, the
        others still apply. The index reflects the writes when this returns."""
        ctx = ctx or OpContext()
        results: list[OpResult] = []
        for op in ops:
            err = self.validate(op)
            if err:
                results.append(OpResult(op, False, error=err))
                continue
            try:
                if op.kind == "add":
                    new_id = self.store.add_entries([self._new_entry(op, ctx)], actor=ctx.actor)[0]
                    results.append(OpResult(op, True, new_id=new_id))
                elif op.kind == "update" and self._names_other_tasks(op.ids, ctx):
                    # task_scope: an episode checks only its own task's entries; a memory shown from another task
                    # (the fallback when a task has none of its own) stays, and the lesson is added for this task.
                    new_id = self.store.add_entries([self._new_entry(op, ctx)], actor=ctx.actor)[0]
                    results.append(OpResult(op, True, new_id=new_id))
                elif op.kind == "update":
                    new_id = self.store.replace_entries(op.ids, self._new_entry(op, ctx), actor=ctx.actor, action="op_update")
                    results.append(OpResult(op, True, new_id=new_id, archived=list(op.ids)))
                else:
                    self._check_active(op.ids)
                    archived = self.store.archive(op.ids, actor=ctx.actor, note="discarded", run_id=ctx.run_id,
                                                  step=ctx.step if ctx.run_id is not None else None)
                    results.append(OpResult(op, True, archived=archived))
            except StoreError as e:
                results.append(OpResult(op, False, error=str(e)))
        if any(r.ok for r in results):
            self.sync()
        return results

    def _names_other_tasks(self, ids: Sequence[int], ctx: OpContext) -> bool:
        """With task_scope, whether an update from an episode of `ctx.task` names an entry written for another task."""
        if not (self.cfg.task_scope and ctx.task):
            return False
        return any(e.task and e.task != ctx.task for e in self.store.get_many(ids).values())

    def _check_active(self, ids: Sequence[int]) -> None:
        found = self.store.get_many(ids)
        for i in ids:
            if i not in found:
                raise StoreError(f"no entry with id {i}")
            if found[i].status is not Status.ACTIVE:
                raise StoreError(f"entry {i} is already archived")

    def _new_entry(self, op: Operation, ctx: OpContext) -> NewEntry:
        text = op.text
        query = ctx.query or ctx.task or text
        qv = self.embedder.embed_queries([query])[0]
        tv = self.embedder.embed([text])[0]
        return NewEntry(text=text, env=ctx.env, task=ctx.task, query=query, source=ctx.source, created_step=ctx.step,
                        run_id=ctx.run_id, source_episode_id=ctx.episode_id, generation=op.generation or ctx.generation,
                        query_embedding=qv, text_embedding=tv, embedder=self.embedder.name)

    # -- what trainers need ---------------------------------------------------------------------

    def entry_texts(self, ids: Sequence[int]) -> dict[int, str]:
        with self.lock.read():
            return {i: self._meta[i].text for i in ids if i in self._meta}

    def active_count(self) -> int:
        return len(self.index)

    def training_stats(self, entry_ids: Sequence[int]) -> dict[int, tuple[int, int | None]]:
        """Eq. 7 inputs keyed by entry id: (trained_count, last_trained_step)."""
        return self.store.training_stats(entry_ids)

    def record_trained(self, entry_ids: Sequence[int], step: int, **kw) -> None:  # noqa: ANN003
        self.store.record_trained(entry_ids, step, **kw)

    def record_outcomes(self, usages: Sequence[tuple[int, bool, float]], **kw) -> None:  # noqa: ANN003
        self.store.record_outcomes(usages, **kw)
