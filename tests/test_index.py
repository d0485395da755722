"""faiss against brute-force numpy on the same vectors, through adds, updates and removals."""
from __future__ import annotations

import numpy as np
import pytest

from core.config import IndexConfig
from core.index import VectorIndex


def unit(rng, n, d):
    x = rng.standard_normal((n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def brute(q, ids, vecs, k):
    s = q @ vecs.T
    order = np.argsort(-s, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(s, order, 1), ids[order]


def test_flat_equals_brute_force_through_changes():
    rng = np.random.default_rng(0)
    d = 32
    ids = np.arange(100, 600, dtype=np.int64)
    vecs = unit(rng, len(ids), d)
    idx = VectorIndex(d, IndexConfig(kind="flat", use_gpu="never"))
    idx.rebuild(ids, vecs, ["g"] * len(ids))
    q = unit(rng, 20, d)
    s, i = idx.search(q, 5, "g")
    bs, bi = brute(q, ids, vecs, 5)
    assert np.array_equal(i, bi) and np.allclose(s, bs, atol=1e-5)
    # update 50 vectors, remove 30: still equal to brute force over the new state
    upd = ids[:50]
    newv = unit(rng, 50, d)
    idx.upsert(upd, newv, ["g"] * 50)
    vecs[:50] = newv
    idx.remove(ids[50:80])
    keep = np.ones(len(ids), bool)
    keep[50:80] = False
    s, i = idx.search(q, 7, "g")
    bs, bi = brute(q, ids[keep], vecs[keep], 7)
    assert np.array_equal(i, bi) and np.allclose(s, bs, atol=1e-5)
    assert len(idx) == len(ids) - 30


def test_groups_restrict_and_merge():
    rng = np.random.default_rng(1)
    d = 16
    ids = np.arange(1, 41, dtype=np.int64)
    vecs = unit(rng, 40, d)
    groups = ["a" if i % 2 else "b" for i in ids]
    idx = VectorIndex(d, IndexConfig(use_gpu="never"))
    idx.rebuild(ids, vecs, groups)
    q = unit(rng, 3, d)
    _, ia = idx.search(q, 5, "a")
    assert all(x % 2 == 1 for x in ia.ravel())
    s_all, i_all = idx.search(q, 5, None)
    bs, bi = brute(q, ids, vecs, 5)
    assert np.array_equal(i_all, bi) and np.allclose(s_all, bs, atol=1e-5)
    s, i = idx.search(q, 3, "missing")
    assert (i == -1).all() and np.isinf(s).all()
    _, i = idx.search(q, 50, "a")  # more than the group holds: padded with -1
    assert (i[:, 20:] == -1).all() and (i[:, :20] >= 0).all()


@pytest.mark.parametrize("kind", ["hnsw", "ivf"])
def test_approximate_kinds_have_high_recall_and_honour_removals(kind):
    rng = np.random.default_rng(2)
    d = 32
    n = 3000
    # clustered data, like real sentence embeddings (random vectors are the worst case)
    centers = unit(rng, 60, d)
    vecs = centers[rng.integers(0, 60, n)] + 0.3 * rng.standard_normal((n, d)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    ids = np.arange(n, dtype=np.int64)
    idx = VectorIndex(d, IndexConfig(kind=kind, use_gpu="never", ivf_nprobe=16))
    idx.rebuild(ids, vecs, [""] * n)
    q = vecs[rng.integers(0, n, 50)] + 0.05 * unit(rng, 50, d)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    _, i = idx.search(q, 10, "")
    _, bi = brute(q, ids, vecs, 10)
    recall = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(i, bi)])
    assert recall >= 0.9
    removed = bi[:, 0]
    idx.remove(removed)
    _, i = idx.search(q, 10, "")
    assert not np.isin(i, removed).any()


@pytest.mark.parametrize("n", [5, 40])
def test_equal_similarities_come_newest_first_and_a_tie_keeps_its_newest(n):
    """A recurring task's lessons are all keyed by its task text: their similarities tie (exactly, or within float
    noise). The top-k then holds the newest of them, newest first, not an arbitrary subset; a more similar entry still
    comes first."""
    rng = np.random.default_rng(1)
    d = 16
    key = unit(rng, 1, d)
    vecs = np.repeat(key, n, 0) + rng.standard_normal((n, d)).astype(np.float32) * 1e-7
    ids = np.arange(10, 10 + n, dtype=np.int64)
    for kind in ("flat", "hnsw", "ivf"):
        idx = VectorIndex(d, IndexConfig(kind=kind, use_gpu="never"))
        idx.rebuild(ids, vecs, ["g"] * n)
        s, i = idx.search(key, 16, "g")
        got = [x for x in i[0].tolist() if x >= 0]
        assert got == sorted(got, reverse=True), (kind, got)  # newest first within the tie
        assert np.ptp(s[0][: len(got)]) < 1e-4
        if kind == "flat":  # the exact search considers every entry of the tie
            assert got == list(range(9 + n, 9 + n - min(n, 16), -1))
    # an older entry that is more similar still ranks first; the two equal ones follow newest first
    other = unit(rng, 1, d)
    near = key + 0.3 * other
    near /= np.linalg.norm(near)
    idx = VectorIndex(d, IndexConfig(kind="flat", use_gpu="never"))
    idx.rebuild(np.array([1, 2, 3]), np.concatenate([key, near, key]), ["g"] * 3)
    s, i = idx.search(key, 3, "g")
    assert i[0].tolist() == [3, 1, 2]
