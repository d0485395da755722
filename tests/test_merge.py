"""Near-duplicates, one merge with lineage and undo, and the sliding-window merge driver."""
from __future__ import annotations

import numpy as np

from core.config import IndexConfig, ManagerConfig
from core.manager import ExperienceManager
from core.merge import (find_near_duplicates, merge_entries, merge_walks, near_duplicate_clusters, similarity_order,
                        sliding_window_merge, split_walks, undo_merge)
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


def test_walks_run_side_by_side_and_each_carries_its_own_merges(store):
    """Two walks, decided two chunks per call: every round holds one chunk of each walk, a walk's merged
    entry is carried into that walk's next chunk only, and the store is synced once per round."""
    a = store.add_entries([NewEntry(text=f"a{i}", task="A") for i in range(6)])
    b = store.add_entries([NewEntry(text=f"b{i}", task="B") for i in range(3)])
    rounds: list[list[list[int]]] = []
    synced: list[int] = []

    def merge_batch(chunks):
        rounds.append([[e.id for e in c] for c in chunks])
        return [[Operation("update", ids=[c[0].id, c[1].id], text=c[0].text + "+" + c[1].text)] for c in chunks]

    rep = merge_walks(store, [[store.get(i) for i in a], [store.get(i) for i in b]], merge_batch, chunk_size=3, batch=2,
                      on_written=lambda: synced.append(1))
    # round 1: a1-a3 and b1-b3; a1+a2 -> 10, b1+b2 -> 11; only walk A has entries left: 10 is carried with a4, a5
    assert rounds[0] == [a[:3], b]
    assert rounds[1] == [[10, *a[3:5]]]
    assert rounds[2] == [[12, a[5]]]  # 10+a4 -> 12, carried with a6
    assert len(rounds) == 3 and len(synced) == 3 and rep.chunks == 4 and rep.merges == 4
    assert store.get(11).task == "B" and store.get(13).parent_ids == [12, a[5]]
    # survivors: A keeps a3, a5 and the last merge; B keeps b3 and its merge
    assert rep.before == 9 and rep.after == store.count() == 5


def test_a_round_whose_decider_raises_keeps_every_chunk(store):
    ids = store.add_entries([NewEntry(text=f"t{i}", task=t) for t in "AB" for i in range(3)])
    walks = [[store.get(i) for i in ids[:3]], [store.get(i) for i in ids[3:]]]
    rep = merge_walks(store, walks, lambda chunks: 1 / 0, chunk_size=5, batch=4)
    assert rep.unparsed_chunks == 2 and store.count() == 6 and rep.after == 6
    rep = merge_walks(store, walks, lambda chunks: [None], chunk_size=5, batch=4)  # one answer for two chunks
    assert rep.unparsed_chunks == 2 and "answered 1 chunks for 2" in rep.errors[0] and store.count() == 6


def test_similarity_order_puts_entries_that_say_the_same_thing_side_by_side(store, embedder):
    texts = ["Apples are usually kept in the fridge.", "Walk diagonally to reach the stairs.",
             "A knife is often found on the countertop.", "Apples are usually stored in the fridge.",
             "Move diagonally towards the staircase.", "Look for knives on the kitchen countertop."]
    vecs = embedder.embed(texts)
    ids = store.add_entries([NewEntry(text=t, task="t", text_embedding=v) for t, v in zip(texts, vecs)])
    entries = [store.get(i) for i in ids]
    order = [e.text for e in similarity_order(entries, store.embeddings(ids, "text"))]
    pos = {t: k for k, t in enumerate(order)}
    for x, y in ((0, 3), (1, 4), (2, 5)):  # each pair of paraphrases ends up adjacent
        assert abs(pos[texts[x]] - pos[texts[y]]) == 1, order
    assert order[0] == texts[0]  # the chain starts at the oldest entry
    # entries without an embedding follow, oldest first
    extra = store.add_entries([NewEntry(text="no vector yet", task="t")])
    got = similarity_order([store.get(i) for i in [*ids, *extra]], store.embeddings([*ids, *extra], "text"))
    assert got[-1].id == extra[0] and len(got) == 7


def test_split_walks_is_contiguous_and_never_too_short():
    es = list(range(23))
    parts = split_walks(es, 4, 5)  # 23 // 10 = 2 walks at most
    assert [len(p) for p in parts] == [12, 11] and sum(parts, []) == es
    assert split_walks(es, 1, 5) == [es] and split_walks(es[:3], 8, 5) == [es[:3]]
    assert [len(p) for p in split_walks(list(range(100)), 3, 5)] == [33, 34, 33]
