"""The vector index: the only code that touches faiss (DESIGN.md habit 6).

Inner product over unit vectors (= cosine). One faiss index per filter group (an env or a task,
or one group for the whole library), id-mapped by entry id, so that retrieval restricted to the
actor's own env never scans or filters other envs' entries, and an update or delete touches one
id instead of rebuilding.

- flat: exact. On a CPU one matrix product and a top-k over a dense matrix kept in step with adds and removes
        (`_DenseFlat`): faiss's `IndexFlatIP` measured 8-10x the matrix-product floor here at 100k entries with one
        or two threads alike, this ~1x (benchmarks/results/bench_retrieval.md). On a GPU, faiss-gpu's flat index.
- ivf:  approximate, `IndexIVFFlat` (inner product), trained on the group's vectors at build
        time; add and remove by id.
- hnsw: approximate, `IndexHNSWFlat`. HNSW cannot remove, so removed ids become tombstones that
        searches skip, and the group is rebuilt once tombstones pass a quarter of its size.

GPU faiss is used for flat groups when it is importable and a GPU is present (config
`index.use_gpu`); the choice is logged once.
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Sequence

import faiss
import numpy as np

from core.config import ConfigError, IndexConfig

log = logging.getLogger(__name__)


# Similarities count as equal to this many decimals, and equal ones come newest entry (highest id) first. Entries keyed
# by the same text (a recurring task's lessons, all keyed by its task text) tie exactly or within float noise; without
# an order the top-k kept an arbitrary subset of them (faiss: the oldest; torch's top-k: any), so an oversampled
# candidate list of 16 never reached a task's newer lessons, those of the better actor and the trained extractor.
SCORE_DECIMALS = 4
_SCALE = 10.0 ** SCORE_DECIMALS
_ID_SPAN = 1 << 32


def _tie_order(s: np.ndarray, i: np.ndarray) -> np.ndarray:
    """Per row, the positions of (scores, ids) best first: score to SCORE_DECIMALS places, then the newer id."""
    return np.lexsort((-i, -np.round(s.astype(np.float64), SCORE_DECIMALS)), axis=1)


def gpu_available() -> bool:
    return hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0


class _DenseFlat:
    """Exact inner-product search: scores = queries @ matrix.T, then a top-k, both in torch (its matmul and topk release
    the GIL, so concurrent searches overlap). The faiss index interface the groups use (ntotal, add_with_ids,
    remove_ids, search); rows are removed by moving the last row into the hole, so a change costs one row."""

    def __init__(self, dim: int) -> None:
        self.dim = dim
        self._mat = np.zeros((0, dim), np.float32)  # (capacity, d); rows [0, ntotal) are live
        self._ids = np.zeros(0, np.int64)  # (capacity,)
        self._row: dict[int, int] = {}  # id -> row
        self.ntotal = 0

    def add_with_ids(self, vecs: np.ndarray, ids: np.ndarray) -> None:
        vecs = np.asarray(vecs, dtype=np.float32).reshape(-1, self.dim)
        need = self.ntotal + len(vecs)
        if need > len(self._mat):
            cap = max(need, 2 * len(self._mat), 64)
            mat, idv = np.zeros((cap, self.dim), np.float32), np.zeros(cap, np.int64)
            mat[: self.ntotal], idv[: self.ntotal] = self._mat[: self.ntotal], self._ids[: self.ntotal]
            self._mat, self._ids = mat, idv
        self._mat[self.ntotal:need] = vecs
        self._ids[self.ntotal:need] = ids
        for r, i in enumerate(np.asarray(ids).tolist(), start=self.ntotal):
            self._row[int(i)] = r
        self.ntotal = need

    def remove_ids(self, ids: np.ndarray) -> None:
        for i in np.asarray(ids).tolist():
            r = self._row.pop(int(i), None)
            if r is None:
                continue
            last = self.ntotal - 1
            if r != last:
                self._mat[r] = self._mat[last]
                self._ids[r] = self._ids[last]
                self._row[int(self._ids[r])] = r
            self.ntotal = last

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The k best by similarity to SCORE_DECIMALS places, over every row, so a tie at the k-th place keeps its
        newest entries (VectorIndex.search orders them). One top-k of k + 1: a row whose (k+1)-th score rounds as its
        k-th does (entries keyed by the same text) is redone as a top-k on round(score * 10^d) * 2^32 + id."""
        import torch

        n = self.ntotal
        k = min(k, n)
        scores = torch.from_numpy(queries) @ torch.from_numpy(self._mat[:n]).T  # (B, n)
        s, j = torch.topk(scores, min(k + 1, n), dim=1)  # (B, k+1), best first
        if 0 < k < n:
            r = torch.round(s[:, k - 1:] * _SCALE)
            tied = (r[:, 0] == r[:, 1]).nonzero().flatten().tolist()
            if tied:
                ids = torch.from_numpy(self._ids[:n])
                key = torch.round(scores[tied] * _SCALE).to(torch.int64) * _ID_SPAN + ids  # ids are < 2^32
                j[tied, :k] = torch.topk(key, k, dim=1).indices
                s[tied, :k] = torch.gather(scores[tied], 1, j[tied, :k])
        s, j = s[:, :k], j[:, :k]
        return s.numpy(), self._ids[:n][j.numpy()]


@dataclass
class _Group:
    index: "faiss.Index | _DenseFlat"
    vectors: dict[int, np.ndarray] = field(default_factory=dict)  # id -> vector, to rebuild and to train IVF
    tombstones: set[int] = field(default_factory=set)


class VectorIndex:
    """Not thread-safe for writes; the ExperienceManager serialises writes under its writer lock.
    Concurrent `search` calls are safe (faiss searches are const)."""

    def __init__(self, dim: int, cfg: IndexConfig | None = None):
        self.dim = dim
        self.cfg = cfg or IndexConfig()
        self._groups: dict[str, _Group] = {}
        self._group_of: dict[int, str] = {}
        self._gpu_res = None
        if self.cfg.omp_threads:
            # Process-wide. Nested parallelism (W search workers × OpenMP threads) and OpenMP's spinning
            # barriers on a busy small CPU cost more than they give: measured 53 ms vs 0.4 ms for a BLAS
            # product of the same shape at 1k entries under load.
            faiss.omp_set_num_threads(self.cfg.omp_threads)
        want_gpu = self.cfg.use_gpu == "always" or (self.cfg.use_gpu == "auto" and gpu_available())
        if self.cfg.use_gpu == "always" and not gpu_available():
            raise ConfigError("index.use_gpu is 'always' but faiss-gpu or a GPU is missing; pip install -e '.[gpu]' or set it to 'auto'")
        if want_gpu and self.cfg.kind == "flat":
            self._gpu_res = faiss.StandardGpuResources()
        self.backend = f"faiss-{'gpu' if self._gpu_res is not None else 'cpu'} {faiss.__version__} ({self.cfg.kind})"
        if self.cfg.kind == "flat" and self._gpu_res is None:
            self.backend = "exact: one matrix product and top-k in torch (flat)"
        log.info("vector index: %s", self.backend)

    # -- building ----------------------------------------------------------------------------

    def _new_index(self, vecs: np.ndarray) -> faiss.Index:
        kind = self.cfg.kind
        if kind == "flat":
            if self._gpu_res is None:
                return _DenseFlat(self.dim)
            return faiss.index_cpu_to_gpu(self._gpu_res, 0, faiss.IndexIDMap2(faiss.IndexFlatIP(self.dim)))
        if kind == "hnsw":
            h = faiss.IndexHNSWFlat(self.dim, self.cfg.hnsw_m, faiss.METRIC_INNER_PRODUCT)
            h.hnsw.efConstruction = self.cfg.hnsw_ef_construction
            h.hnsw.efSearch = self.cfg.hnsw_ef_search
            return faiss.IndexIDMap2(h)
        # ivf: too few vectors to train cells -> exact search until the group grows (rebuild below).
        n = len(vecs)
        nlist = self.cfg.ivf_nlist or max(1, int(4 * math.sqrt(max(n, 1))))
        if n < 39 * nlist or n < 256:
            return faiss.IndexIDMap2(faiss.IndexFlatIP(self.dim))
        quant = faiss.IndexFlatIP(self.dim)
        ivf = faiss.IndexIVFFlat(quant, self.dim, nlist, faiss.METRIC_INNER_PRODUCT)
        ivf.train(vecs)
        ivf.nprobe = self.cfg.ivf_nprobe
        return ivf

    def _build_group(self, name: str, vectors: dict[int, np.ndarray]) -> None:
        ids = np.fromiter(vectors, dtype=np.int64, count=len(vectors))
        vecs = np.stack(list(vectors.values())).astype(np.float32) if vectors else np.zeros((0, self.dim), np.float32)
        g = _Group(self._new_index(vecs), dict(vectors))
        if len(ids):
            g.index.add_with_ids(vecs, ids)
        self._groups[name] = g

    def rebuild(self, ids: np.ndarray, vectors: np.ndarray, groups: list[str]) -> None:
        """Replace everything (start-up, or after the store says the library was rewritten)."""
        self._check(vectors)
        by_group: dict[str, dict[int, np.ndarray]] = {}
        for i, v, g in zip(ids.tolist(), vectors, groups):
            by_group.setdefault(g, {})[i] = v
        self._groups.clear()
        self._group_of = {i: g for i, g in zip(ids.tolist(), groups)}
        for g, vecs in by_group.items():
            self._build_group(g, vecs)

    def _check(self, vectors: np.ndarray) -> None:
        if vectors.size and (vectors.ndim != 2 or vectors.shape[1] != self.dim):
            raise ValueError(f"vectors must have shape (n, {self.dim}), got {vectors.shape}")

    # -- incremental changes ---------------------------------------------------------------------

    def upsert(self, ids: np.ndarray, vectors: np.ndarray, groups: list[str]) -> None:
        self._check(vectors)
        self.remove(ids)
        for i, v, gname in zip(ids.tolist(), np.asarray(vectors, dtype=np.float32), groups):
            g = self._groups.get(gname)
            if g is None:
                self._build_group(gname, {i: v})
            else:
                g.vectors[i] = v
                g.tombstones.discard(i)
                g.index.add_with_ids(v[None, :], np.array([i], dtype=np.int64))
                # An IVF group that started exact gets its cells once it is big enough.
                if self.cfg.kind == "ivf" and isinstance(g.index, faiss.IndexIDMap2) and len(g.vectors) in (256, 1024, 4096, 16384, 65536):
                    self._build_group(gname, g.vectors)
            self._group_of[i] = gname

    def remove(self, ids: np.ndarray | list[int]) -> None:
        for i in [int(x) for x in np.asarray(ids).tolist()]:
            gname = self._group_of.pop(i, None)
            if gname is None:
                continue
            g = self._groups[gname]
            g.vectors.pop(i, None)
            if self.cfg.kind == "hnsw":
                g.tombstones.add(i)
                if len(g.tombstones) > max(16, g.index.ntotal // 4):
                    self._build_group(gname, g.vectors)
            else:
                g.index.remove_ids(np.array([i], dtype=np.int64))

    # -- queries -------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._group_of)

    def __contains__(self, entry_id: int) -> bool:
        return entry_id in self._group_of

    @property
    def split_batches(self) -> bool:
        """Whether splitting a batch of queries over threads pays: not for the dense flat search, where one matrix
        product over the whole batch reads the matrix once (W products over its parts read it W times)."""
        return not (self.cfg.kind == "flat" and self._gpu_res is None)

    def groups(self) -> list[str]:
        return sorted(self._groups)

    def search(self, queries: np.ndarray, k: int, group: str | Sequence[str] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(scores (n, k), ids (n, k)), best first; missing results are id -1 with score -inf.

        Scores equal to SCORE_DECIMALS places count as equal and come newest entry first. The exact CPU search
        considers every entry of a tie; faiss's own indexes (GPU flat, IVF, HNSW) return their own subset of a tie at
        the k-th place (faiss's flat search: the oldest), ordered newest first.

        `group=None` searches every group and keeps the best k across them; a list of group names
        searches those groups and keeps the best k across them.
        """
        queries = np.ascontiguousarray(queries, dtype=np.float32)
        n = len(queries)
        if group is None:
            names = list(self._groups)
        elif isinstance(group, str):
            names = [group] if group in self._groups else []
        else:
            names = [g for g in group if g in self._groups]
        all_s, all_i = [], []
        for name in names:
            g = self._groups[name]
            if g.index.ntotal == 0:
                continue
            extra = len(g.tombstones)
            kk = min(k + extra, g.index.ntotal)
            s, i = g.index.search(queries, kk)
            if extra:
                dead = np.isin(i, np.fromiter(g.tombstones, dtype=np.int64, count=extra))
                s = np.where(dead, -np.inf, s)
                i = np.where(dead, -1, i)
            all_s.append(s)
            all_i.append(i)
        if not all_s:
            return np.full((n, k), -np.inf, np.float32), np.full((n, k), -1, np.int64)
        s = np.concatenate(all_s, axis=1)
        i = np.concatenate(all_i, axis=1)
        s = np.where(i < 0, -np.inf, s)
        order = _tie_order(s, i)[:, :k]
        s, i = np.take_along_axis(s, order, 1), np.take_along_axis(i, order, 1)
        if s.shape[1] < k:
            pad = k - s.shape[1]
            s = np.pad(s, ((0, 0), (0, pad)), constant_values=-np.inf)
            i = np.pad(i, ((0, 0), (0, pad)), constant_values=-1)
        return s.astype(np.float32), i.astype(np.int64)
