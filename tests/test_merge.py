"""Near-duplicates, one merge with lineage and undo, and the sliding-window merge driver."""
from __future__ import annotations

import numpy as np

from core.config import IndexConfig, ManagerConfig
from core.manager import ExperienceManager
from core.merge import find_near_duplicates, merge_entries, near_duplicate_clusters, sliding_window_merge, undo_merge
from core.store import NewEntry
from core.types import Operation, Source, Status


def test_clusters_by_hand():
    v = np.array([[1, 0], [0.99, 0.141], [0, 1], [0.1, 0.995], [-1, 0]], dtype=np.float32)
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    ids = np.array([10, 11, 12, 13, 14])
    assert near_duplicate_clusters(ids, v, ["t"] * 5, threshold=0.95) == [[10, 11], [12, 13]]
    # 12 and 13 are in different tasks: not a cluster unless asked
    assert near_duplicate_clusters(ids, v, ["t", "t", "a", "b", "t"], threshold=0.95) == [[10, 11]]
    assert near_duplicate_clusters(ids, v, ["t", "t", "a", "b", "t"], threshold=0.95, across_groups=True) == [[10, 11], [12, 13]]
    # blocked product gives the same answer as one block
    assert near_duplicate_clusters(ids, v, ["t"] * 5, threshold=0.95, block=2) == [[10, 11], [12, 13]]


def test_find_near_duplicates_with_real_embeddings(store, embedder):
    texts = ["Apples are usually kept in the fridge.", "Apples are usually stored in the fridge.",
             "Walk diagonally to reach the stairs."]
    vecs = embedder.embed(texts)
    store.add_entries([NewEntry(text=t, task="t", text_embedding=v, query_embedding=v) for t, v in zip(texts, vecs)])
    assert find_near_duplicates(store, threshold=0.9) == [[1, 2]]


def test_merge_and_undo(store):
    a, b = store.add_entry("a", task="t"), store.add_entry("b", task="t")
    m = merge_entries(store, [a, b], "a and b", actor="alice")
    e = store.get(m)
    assert e.parent_ids == [a, b] and e.source is Source.MERGED and e.task == "t"
    assert {store.get(a).status, store.get(b).status} == {Status.ARCHIVED}
    assert undo_merge(store, m) == [a, b]
    assert store.get(m).status is Status.ARCHIVED and store.get(a).status is Status.ACTIVE


def test_sliding_window_carries_merges_and_keeps_unparsed_chunks(store, embedder):
    mgr = ExperienceManager(store, embedder, ManagerConfig(), IndexConfig(use_gpu="never"))
    try:
        ids = store.add_entries([NewEntry(text=f"tip {i}", env="e", task="t") for i in range(9)])
        entries = [store.get(i) for i in ids]
        calls: list[list[int]] = []

        def merge_fn(chunk):
            calls.append([e.id for e in chunk])
            if len(calls) == 2:
                return None  # the extractor's answer did not parse: keep the chunk's originals
            # merge the first two of the chunk, discard the last one when there is a third
            ops = [Operation("update", ids=[chunk[0].id, chunk[1].id], text=f"merged {chunk[0].text} + {chunk[1].text}")]
            return ops + ([Operation("discard", ids=[chunk[-1].id])] if len(chunk) > 2 else [])

        rep = sliding_window_merge(store, entries, merge_fn, chunk_size=4, on_written=mgr.sync)
        # chunk 1: ids 1-4 -> merged(1,2)=10, discard 4; 10 is carried into chunk 2 with 5,6,7
        assert calls[0] == ids[:4]
        assert calls[1] == [10, *ids[4:7]]
        # chunk 2 unparsed: nothing of it changes; chunk 3 takes the rest (8, 9)
        assert calls[2] == ids[7:9]
        assert rep.chunks == 3 and rep.unparsed_chunks == 1 and rep.merges == 2 and rep.discards == 1
        assert store.get(10).parent_ids == [1, 2] and store.get(10).status is Status.ACTIVE
        assert all(store.get(i).status is Status.ACTIVE for i in ids[4:7])
        assert store.get(11).parent_ids == ids[7:9]
        assert rep.before == 9 and rep.after == store.count() == 6  # 3, 5, 6, 7, 10, 11
        assert len(mgr.index) == 6  # the manager followed the writes
    finally:
        mgr.close()


def test_sliding_window_rejects_ops_naming_foreign_ids(store):
    ids = store.add_entries([NewEntry(text=f"tip {i}", task="t") for i in range(3)])
    rep = sliding_window_merge(store, [store.get(i) for i in ids], lambda c: [Operation("discard", ids=[999])], chunk_size=5)
    assert rep.unparsed_chunks == 1 and store.count() == 3
    rep = sliding_window_merge(store, [store.get(i) for i in ids], lambda c: 1 / 0, chunk_size=5)
    assert rep.unparsed_chunks == 1 and "ZeroDivisionError" in rep.errors[0] and store.count() == 3
