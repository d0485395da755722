"""The ExperienceManager with the real MiniLM embedder, faiss and SQLite."""
from __future__ import annotations

import asyncio
import math
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from core.config import IndexConfig, ManagerConfig
from core.manager import ExperienceManager, OpContext
from core.store import ExperienceStore
from core.types import Operation, Status, format_entry_text

ROOT = Path(__file__).resolve().parents[1]
# Every test that takes a database runs on SQLite and on Postgres (tests/conftest.py).
pytestmark = pytest.mark.both_backends

APPLE = format_entry_text("Apples", "where apples are", "Apples are usually on a countertop or in the fridge.")
STAIRS = format_entry_text("Stairs", "MiniHack rooms", "Walk diagonally towards the > to reach it in fewer moves.")
KEYS = format_entry_text("Keys", "door rooms", "Pick up the key first, then apply it towards the locked door.")


@pytest.fixture()
def manager(store, embedder):
    m = ExperienceManager(store, embedder, ManagerConfig(random_demote=False, sync_interval_s=0.2), IndexConfig(use_gpu="never"))
    yield m
    m.close()


def add(m, text, env, task):
    r = m.apply_operations([Operation("add", text=text)], OpContext(env=env, task=task))[0]
    assert r.ok, r.error
    return r.new_id


def test_add_and_search_by_query_key(manager):
    a = add(manager, APPLE, "alfworld", "put a clean apple in the fridge")
    s = add(manager, STAIRS, "minihack", "reach the staircase down")
    hits = manager.search_sync(["put an apple in the fridge", "go down the stairs"], k=1)
    assert [h[0].entry_id for h in hits] == [a, s]
    assert hits[0][0].text == APPLE and 0 < hits[0][0].score <= 1.0001
    # restricted to a group (the actor's env), an unrelated query still only sees that env
    assert manager.search_sync(["go down the stairs"], k=3, task="alfworld")[0][0].entry_id == a
    assert manager.search_sync(["anything"], task="no-such-env") == [[]]


def test_operations_apply_one_by_one_and_malformed_are_refused(manager, store):
    a = add(manager, APPLE, "alfworld", "apple task")
    b = add(manager, KEYS, "alfworld", "key task")
    v = store.library_version()
    res = manager.apply_operations([
        Operation("add", text=""),                      # empty text
        Operation("explode", text="x"),                 # unknown function
        Operation("update", ids=[], text="x"),          # no ids
        Operation("update", ids=[a, 999], text="m"),     # unknown id: refused whole, `a` untouched
        Operation("update", ids=[a, a], text="m"),       # repeated id
        Operation("add", text="x" * 5000),              # over the cap
        Operation("update", ids=[a, b], text="apples and keys"),  # valid
        Operation("discard", ids=[a]),                   # a was just archived by the update
    ], OpContext(env="alfworld", task="apple task"))
    assert [r.ok for r in res] == [False, False, False, False, False, False, True, False]
    assert "non-empty" in res[0].error and "unknown operation" in res[1].error and "999" in res[3].error
    assert "over the cap" in res[5].error and "archived" in res[7].error
    merged = store.get(res[6].new_id)
    assert merged.parent_ids == [a, b] and merged.status is Status.ACTIVE
    assert store.get(a).status is Status.ARCHIVED and store.get(b).status is Status.ARCHIVED
    assert store.library_version() == v + 1  # only the valid op wrote
    assert manager.search_sync(["apple task"], k=5)[0][0].entry_id == merged.id  # index in step at once
    assert a not in manager.index and b not in manager.index


def test_concurrent_callers_share_micro_batches(store, embedder):
    m = ExperienceManager(store, embedder, ManagerConfig(batch_size=16, max_wait_ms=20, random_demote=False),
                          IndexConfig(use_gpu="never"))
    try:
        add(m, APPLE, "e", "apple")

        async def many():
            return await asyncio.gather(*[m.search([f"query {i}"]) for i in range(48)])

        before = m.stats["batches"]
        hits, misses = embedder.cache_hits, embedder.cache_misses
        res = asyncio.run(many())
        assert len(res) == 48 and all(r[0][0].entry_id == 1 for r in res)
        assert m.stats["batches"] - before <= 4  # 48 callers, flushed at B=16
        # every caller's query went through the query cache exactly once (48 distinct queries)
        assert (embedder.cache_hits - hits) + (embedder.cache_misses - misses) == 48
        hits, misses = embedder.cache_hits, embedder.cache_misses
        again = asyncio.run(many())  # the same 48 queries: all answered from the cache, none embedded again
        assert embedder.cache_hits - hits == 48 and embedder.cache_misses == misses
        assert [r[0][0].entry_id for r in again] == [r[0][0].entry_id for r in res]
    finally:
        m.close()


def test_diversification_spreads_repeated_retrievals(store, embedder):
    m = ExperienceManager(store, embedder, ManagerConfig(random_demote=False, rank_score="cosine"), IndexConfig(use_gpu="never"))
    try:
        ids = [add(m, format_entry_text(f"Stairs {i}", "room", f"tip number {i} about reaching the stairs"), "e",
                   "reach the staircase down") for i in range(4)]
        got = [m.search_sync(["reach the staircase down"], k=1)[0][0].entry_id for _ in range(4)]
        # all four keys are identical (same task query): with the cosine as s_rank, Eq. 6 makes each
        # retrieval pick a fresh one
        assert sorted(got) == sorted(ids)
    finally:
        m.close()
    # identical queries inside ONE micro-batch are spread too (a task's K/2 rollouts ask at once)
    m3 = ExperienceManager(store, embedder, ManagerConfig(random_demote=False, batch_size=16, max_wait_ms=50,
                                                          rank_score="cosine"), IndexConfig(use_gpu="never"))
    try:
        got = [h[0].entry_id for h in m3.search_sync(["reach the staircase down"] * 4, k=1)]
        assert sorted(got) == sorted(ids) and m3.stats["batches"] == 1
    finally:
        m3.close()
    m2 = ExperienceManager(store, embedder, ManagerConfig(diversify=False), IndexConfig(use_gpu="never"))
    try:
        got = {m2.search_sync(["reach the staircase down"], k=1)[0][0].entry_id for _ in range(4)}
        assert len(got) == 1  # the ablation switch: always the top hit
    finally:
        m2.close()
    time.sleep(0.3)
    assert sum(store.get(i).retrieved_count for i in ids) >= 4  # counters were written behind


def test_default_rank_score_is_minus_the_rank(store, embedder):
    # s_rank = −rank (the release's): four equal keys rank 0..3 (ties in a fixed order). In one micro-batch,
    # query 1 takes rank 0 (score 0 − 0 − 0 = 0); for query 2 rank 0 counts as retrieved once, just now:
    # 0 − 0.4·ln 2 − 1 = −1.27726 < −1 of rank 1, so rank 1; query 3: rank 0 (−1.27726) beats rank 1
    # (−1 − 1.27726 = −2.27726) and rank 2 (−2); query 4: rank 0 −0.4·ln 3 − 1 = −1.43944 still beats −2.
    m = ExperienceManager(store, embedder, ManagerConfig(random_demote=False, batch_size=16, max_wait_ms=50),
                          IndexConfig(use_gpu="never"))
    try:
        for i in range(4):
            add(m, format_entry_text(f"Stairs {i}", "room", f"tip number {i} about reaching the stairs"), "e",
                "reach the staircase down")
        hits = [h[0] for h in m.search_sync(["reach the staircase down"] * 4, k=1)]
        a, b = hits[0].entry_id, hits[1].entry_id
        assert a != b and [h.entry_id for h in hits] == [a, b, a, a]
        # each Hit carries the Eq. 6 score its ranking used, not a cosine-based one
        want = [0.0, -1.0, -0.4 * math.log(2) - 1.0, -0.4 * math.log(3) - 1.0]
        assert [h.rank_score for h in hits] == pytest.approx(want)
        assert all(0.5 < h.score <= 1.0001 for h in hits)  # the raw cosine stays in score
    finally:
        m.close()
    m2 = ExperienceManager(store, embedder, ManagerConfig(diversify=False), IndexConfig(use_gpu="never"))
    try:  # diversification off: rank_score is s_rank itself, −rank, and the top hit is always the same
        hits = [m2.search_sync(["reach the staircase down"], k=2)[0] for _ in range(3)]
        assert all([h.rank_score for h in hs] == [0.0, -1.0] for hs in hits)
        assert len({hs[0].entry_id for hs in hits}) == 1
    finally:
        m2.close()


def test_a_tasks_newest_lessons_are_served_first(store, embedder):
    """20 lessons of one task share its key (the task text): every candidate ties. Retrieval starts from the newest
    (the better actor's and extractor's) and spreads over the newest 16 (the oversampled candidates), never an
    arbitrary or oldest subset."""
    m = ExperienceManager(store, embedder, ManagerConfig(random_demote=False, batch_size=16, max_wait_ms=50),
                          IndexConfig(use_gpu="never"))
    try:
        ids = [add(m, format_entry_text(f"Stairs {i}", "room", f"tip number {i} about reaching the stairs"), "e",
                   "Dungeon 3: reach the staircase down") for i in range(20)]
        hits = [h[0].entry_id for h in m.search_sync(["Dungeon 3: reach the staircase down"] * 8, k=1)]
        assert hits[0] == ids[-1]
        assert set(hits) <= set(ids[-16:]), hits
    finally:
        m.close()


EDITOR = textwrap.dedent("""
    import sys
    sys.path.insert(0, {root!r})
    from core.store import ExperienceStore
    s = ExperienceStore({url!r})
    e = s.get(int(sys.argv[1]))
    s.update_text(e.id, sys.argv[2], expected_version=e.version, actor="human")
    s.add_entry(sys.argv[3], env="e", task="a brand new task about lanterns", actor="human")
    s.archive([int(sys.argv[4])], actor="human")
""")


@pytest.mark.slow
def test_change_by_another_process_is_seen_within_two_seconds(store, embedder, db_url, tmp_path):
    m = ExperienceManager(store, embedder, ManagerConfig(random_demote=False, diversify=False), IndexConfig(use_gpu="never"))
    try:
        a = add(m, APPLE, "e", "apple task")
        b = add(m, KEYS, "e", "key task")
        script = tmp_path / "edit.py"
        script.write_text(EDITOR.format(root=str(ROOT), url=db_url))
        subprocess.run([sys.executable, str(script), str(a), "EDITED BY A PERSON", LANTERN := "Light the lantern first.", str(b)],
                       check=True, timeout=60)
        t0 = time.monotonic()
        while time.monotonic() - t0 < 2.0:
            hits = m.search_sync(["apple task", "a brand new task about lanterns", "key task"], k=1, task="e")
            if hits[0][0].text == "EDITED BY A PERSON" and hits[1][0].text == LANTERN and all(h.entry_id != b for h in hits[2]):
                break
            time.sleep(0.05)
        else:
            pytest.fail(f"edits from another process not seen within 2 s: {hits}")
    finally:
        m.close()


def test_rebuild_from_store_on_start(store, embedder):
    m = ExperienceManager(store, embedder, ManagerConfig(random_demote=False), IndexConfig(use_gpu="never"))
    a = add(m, APPLE, "e", "apple task")
    m.close()
    store.add_entry(STAIRS, env="e", task="stairs task", actor="human")  # written with no embedder around
    m2 = ExperienceManager(store, embedder, ManagerConfig(random_demote=False), IndexConfig(use_gpu="never"))
    try:
        assert len(m2.index) == 2
        assert m2.search_sync(["stairs task"])[0][0].text == STAIRS
        assert m2.search_sync(["apple task"])[0][0].entry_id == a
    finally:
        m2.close()


def test_latency_and_training_stats(manager):
    a = add(manager, APPLE, "e", "apple")
    manager.search_sync(["apple"] * 3)
    lat, n = manager.latency_percentiles()
    assert lat["retrieval/latency_p50_ms"] > 0 and lat["retrieval/latency_p99_ms"] >= lat["retrieval/latency_p50_ms"]
    assert n == 3 and manager.latency_percentiles() == (lat, 3)  # a read resets nothing
    assert manager.latency_percentiles(since=n) == ({}, 3)  # nothing new since the cursor
    manager.search_sync(["apple"])
    new, n = manager.latency_percentiles(since=n)
    assert n == 4 and new["retrieval/latency_p50_ms"] == new["retrieval/latency_p99_ms"] == manager.latency.values_ms[-1]
    manager.record_trained([a, a], step=7)
    assert manager.training_stats([a]) == {a: (2, 7)}


def test_a_runs_retrievals_are_counted_by_step_and_a_resume_takes_later_steps_back(store, embedder):
    """The counts Eq. 6 reads, written behind retrieval, are tagged with the run and step: a checkpoint's state_dict
    waits until they are in the store, a resume from it takes later steps' back (and the demotion RNG is restored)."""
    run = store.create_run("r")
    m = ExperienceManager(store, embedder, ManagerConfig(sync_interval_s=0.2), IndexConfig(use_gpu="never"), run_id=run)
    try:
        a = add(m, APPLE, "e", "apple")
        m.search_sync(["apple"], step=1)
        m.search_sync(["apple"] * 2, step=2)
        st = m.state_dict()  # the checkpoint at step 2: every count so far is in the store
        at_checkpoint = store.get(a)
        assert at_checkpoint.retrieved_count == 3 and at_checkpoint.last_retrieved_at == m._meta[a].last_retrieved_at
        demotions = [m._rng.random() for _ in range(3)]
        m.search_sync(["apple"], step=3)
        m.state_dict()
        assert store.get(a).retrieved_count == 4
    finally:
        m.close()
    assert store.drop_after_step(run, 2)["retrievals"] == 1
    back = store.get(a)
    assert (back.retrieved_count, back.last_retrieved_at) == (3, at_checkpoint.last_retrieved_at)
    m2 = ExperienceManager(store, embedder, ManagerConfig(), IndexConfig(use_gpu="never"), run_id=run)
    try:
        m2.load_state_dict(st)
        assert [m2._rng.random() for _ in range(3)] == demotions and m2._meta[a].retrieved == 3
    finally:
        m2.close()
