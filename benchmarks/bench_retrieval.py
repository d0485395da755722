"""Retrieval benchmark: exact vs approximate faiss, embedding cost, the BLAS floor, micro-batching.

Library texts are realistic task descriptions (the index key, docs/method.md step 3) generated from
the envs' vocabularies and embedded with the real MiniLM model — random vectors make approximate
indexes look far worse than they are. Embeddings are cached under benchmarks/results/cache/ so a
rerun does not spend minutes re-embedding.

    python benchmarks/bench_retrieval.py            # 1k, 10k, 100k
    python benchmarks/bench_retrieval.py --quick    # 1k, 10k, fewer repeats

Writes benchmarks/results/bench_retrieval.json and .md.
"""
from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from benchmarks.common import environment, median, percentile, write_results  # noqa: E402
from core.config import EmbeddingConfig, IndexConfig, ManagerConfig  # noqa: E402
from core.embedding import Embedder  # noqa: E402
from core.index import VectorIndex  # noqa: E402

OBJECTS = ["apple", "mug", "soapbar", "keychain", "book", "pen", "tomato", "egg", "potato", "knife", "spatula", "cd",
           "pillow", "creditcard", "watch", "vase", "candle", "spraybottle", "towel", "lettuce", "bread", "cup", "plate",
           "pan", "kettle", "remotecontrol", "laptop", "cellphone", "alarmclock", "statue"]
PLACES = ["countertop", "fridge", "microwave", "sinkbasin", "drawer", "cabinet", "shelf", "desk", "sidetable",
          "diningtable", "garbagecan", "sofa", "bed", "dresser", "coffeetable", "stoveburner", "toilet", "bathtubbasin"]
VERBS = [("put a {adj}{o} in {p}", ""), ("put a clean {o} in {p}", ""), ("put a hot {o} in {p}", ""),
         ("put a cool {o} in {p}", ""), ("put two {o}s in {p}", ""), ("look at {o} under the desklamp", ""),
         ("find the {o} and place it on the {p}", "")]
ADJ = ["", "", "small ", "red ", "clean ", "old "]
MH = ["Reach the staircase down in a {n}x{n} room{x}.", "Find the key, open the door and reach the stairs in room {n}{x}.",
      "Walk through the maze of size {n} to the goal{x}.", "Push the boulders in Sokoban level {n} onto the holes{x}."]
MHX = ["", " while avoiding the monsters", " past the lava", " in the dark", " with a trap on the way"]
SHOP = ["i need a {a} {o} for my {p}, price lower than {d}.00 dollars", "looking for {a} {o} in size {n}, under {d} dollars"]
SHOPA = ["long lasting", "waterproof", "organic", "lightweight", "blue", "gluten free", "wireless", "wooden", "large"]


def task_texts(n: int, seed: int = 0) -> list[str]:
    """n distinct, realistic task descriptions from the four env families."""
    rng = random.Random(seed)
    out: set[str] = set()
    while len(out) < n:
        fam = rng.random()
        if fam < 0.5:
            t = rng.choice(VERBS)[0].format(adj=rng.choice(ADJ), o=rng.choice(OBJECTS), p=f"{rng.choice(PLACES)} {rng.randint(1, 9)}")
            t = f"Your task is to: {t}. The room has {rng.randint(3, 30)} receptacles{rng.choice(['', ' and a closed fridge', ' and two cabinets open'])}."
        elif fam < 0.75:
            t = rng.choice(MH).format(n=rng.randint(3, 25), x=rng.choice(MHX)) + f" Seed layout {rng.randint(0, 10**6)}."
        else:
            t = rng.choice(SHOP).format(a=rng.choice(SHOPA), o=rng.choice(OBJECTS), p=rng.choice(PLACES), n=rng.randint(4, 14),
                                        d=rng.randint(10, 300)) + f" ({rng.choice(SHOPA)}, {rng.randint(1, 99)} pack)"
        out.add(t)
    return sorted(out)


def embedded_library(embedder: Embedder, n: int) -> tuple[list[str], np.ndarray]:
    cache = ROOT / "benchmarks" / "results" / "cache" / f"library_{n}.npy"
    texts = task_texts(n, seed=0)
    if cache.exists():
        vecs = np.load(cache)
        if vecs.shape == (n, embedder.dim):
            return texts, vecs
    cache.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    vecs = embedder.embed(texts)
    print(f"  embedded {n} library texts in {time.perf_counter() - t0:.1f} s", flush=True)
    np.save(cache, vecs)
    return texts, vecs


def timed(fn, repeats: int) -> list[float]:
    fn()  # warm-up
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1000.0)
    return out


def recall_at_k(approx: np.ndarray, exact: np.ndarray) -> float:
    k = exact.shape[1]
    return float(np.mean([len(set(a.tolist()) & set(e.tolist())) / k for a, e in zip(approx, exact)]))


def bench_size(embedder: Embedder, n: int, queries: list[str], k: int, repeats: int) -> list[dict]:
    _, vecs = embedded_library(embedder, n)
    ids = np.arange(1, n + 1, dtype=np.int64)
    q = embedder.embed(queries)
    rows = []

    floor = timed(lambda: q @ vecs.T, repeats)  # the BLAS matrix product: a lower bound for exact search
    flat = VectorIndex(embedder.dim, IndexConfig(kind="flat", use_gpu="never"))
    flat.rebuild(ids, vecs, [""] * n)
    exact_ids = flat.search(q, k, "")[1]
    # fresh query texts each round so the embedding cache cannot help
    rounds = itertools.count()

    def embed_and_search(index: VectorIndex) -> None:
        r = next(rounds)
        qs = [f"{t} (variant {r})" for t in queries]
        index.search(embedder.embed(qs), k, "")

    lat = timed(lambda: flat.search(q, k, ""), repeats)
    lat_e2e = timed(lambda: embed_and_search(flat), max(3, repeats // 4))
    lat_emb = timed(lambda: embedder.embed([f"{t} (e{next(rounds)})" for t in queries]), max(3, repeats // 4))
    rows.append({"size": n, "index": "flat (exact)", "build_s": 0.0, "p50_ms": median(lat), "p99_ms": percentile(lat, 99),
                 "p50_with_embedding_ms": median(lat_e2e), "embedding_p50_ms": median(lat_emb), "recall_at_k": 1.0,
                 "matmul_floor_p50_ms": median(floor), "ratio_to_floor": median(lat) / median(floor)})
    # what the flat index was before (issue 28): faiss's IndexFlatIP, one OpenMP thread (the config's default) and two
    import faiss

    raw = faiss.IndexFlatIP(embedder.dim)
    raw.add(vecs)
    for threads in (1, 2):
        faiss.omp_set_num_threads(threads)
        lat = timed(lambda: raw.search(q, k), repeats)
        rows.append({"size": n, "index": f"faiss IndexFlatIP, {threads} thread{'s' if threads > 1 else ''}", "build_s": 0.0,
                     "p50_ms": median(lat), "p99_ms": percentile(lat, 99), "p50_with_embedding_ms": None, "recall_at_k": 1.0,
                     "matmul_floor_p50_ms": median(floor), "ratio_to_floor": median(lat) / median(floor)})
    faiss.omp_set_num_threads(1)
    for kind, cfg in (("hnsw", IndexConfig(kind="hnsw", use_gpu="never", hnsw_ef_search=64)),
                      ("ivf", IndexConfig(kind="ivf", use_gpu="never", ivf_nprobe=16))):
        if n < 5000:
            continue
        idx = VectorIndex(embedder.dim, cfg)
        t0 = time.perf_counter()
        idx.rebuild(ids, vecs, [""] * n)
        build = time.perf_counter() - t0
        got = idx.search(q, k, "")[1]
        lat = timed(lambda: idx.search(q, k, ""), repeats)
        rows.append({"size": n, "index": kind, "build_s": build, "p50_ms": median(lat), "p99_ms": percentile(lat, 99),
                     "p50_with_embedding_ms": None, "recall_at_k": recall_at_k(got, exact_ids),
                     "matmul_floor_p50_ms": median(floor), "ratio_to_floor": median(lat) / median(floor)})
    return rows


def bench_manager(embedder_cfg: EmbeddingConfig, n: int, queries: list[str], rounds: int) -> dict:
    """End-to-end (embedding included, cache off) throughput: 64 concurrent callers vs one at a time."""
    from core.manager import ExperienceManager
    from core.store import ExperienceStore, NewEntry

    embedder = Embedder(embedder_cfg)
    texts, vecs = embedded_library(embedder, n)
    with tempfile.TemporaryDirectory() as d:
        store = ExperienceStore(f"sqlite:///{d}/bench.db")
        for s in range(0, n, 5000):
            store.add_entries([NewEntry(text=f"## Title: tip {i}\n## Content: advice for {t}", env="bench", task=t, query=t,
                                        query_embedding=v, text_embedding=v, embedder=embedder.name)
                               for i, (t, v) in enumerate(zip(texts[s:s + 5000], vecs[s:s + 5000]), start=s)])
        mgr = ExperienceManager(store, embedder, ManagerConfig(random_demote=False), IndexConfig(use_gpu="never"))
        counter = itertools.count()

        def fresh() -> list[str]:
            r = next(counter)
            return [f"{t} (round {r})" for t in queries]

        async def batched(qs: list[str]) -> None:
            await asyncio.gather(*[mgr.search([x]) for x in qs])

        def run_batched() -> float:
            qs = fresh()
            t0 = time.perf_counter()
            asyncio.run(batched(qs))
            return time.perf_counter() - t0

        def run_serial() -> float:
            qs = fresh()
            t0 = time.perf_counter()
            for x in qs:
                mgr.search_sync([x])
            return time.perf_counter() - t0

        run_batched(), run_serial()  # warm-up
        b, s = [], []
        for _ in range(rounds):  # interleaved, so both see the same machine state
            b.append(run_batched())
            s.append(run_serial())
        mgr.close()
        store.close()
    qps_b, qps_s = len(queries) / median(b), len(queries) / median(s)
    return {"size": n, "queries": len(queries), "batched_qps": qps_b, "one_at_a_time_qps": qps_s, "speedup": qps_b / qps_s}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--sizes", default=None, help="comma-separated library sizes")
    ap.add_argument("-k", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1, help="torch threads for the embedder (1 is fastest on a busy 2-core box)")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    sizes = [int(s) for s in args.sizes.split(",")] if args.sizes else ([1000, 10_000] if args.quick else [1000, 10_000, 100_000])
    repeats = 10 if args.quick else 30
    cfg = EmbeddingConfig(cache_size=0)
    embedder = Embedder(cfg)
    queries = task_texts(64, seed=12345)
    rows = []
    for n in sizes:
        print(f"size {n}", flush=True)
        rows += bench_size(embedder, n, queries, args.k, repeats)
    mgr = bench_manager(cfg, 10_000 if 10_000 in sizes else sizes[-1], queries, rounds=3 if args.quick else 5)
    result = {"benchmark": "retrieval", "environment": environment(), "k": args.k, "batch": len(queries), "rows": rows,
              "manager": mgr}
    table = ["| size | index | build s | p50 ms (64 q) | p99 ms | p50 ms incl. embedding | recall@k | matmul floor p50 ms | × floor |",
             "|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        e2e = f"{r['p50_with_embedding_ms']:.1f}" if r["p50_with_embedding_ms"] is not None else "–"
        table.append(f"| {r['size']:,} | {r['index']} | {r['build_s']:.1f} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | {e2e} | "
                     f"{r['recall_at_k']:.3f} | {r['matmul_floor_p50_ms']:.2f} | {r['ratio_to_floor']:.2f} |")
    emb = [r for r in rows if r.get("embedding_p50_ms") is not None]
    table += ["", "Embedding the 64 queries alone (MiniLM, torch threads "
              f"{args.threads}): " + ", ".join(f"{r['embedding_p50_ms']:.0f} ms at {r['size']:,}" for r in emb) + " (p50; the "
              "same work in every row: the spread is the machine's load). flat (exact) is the project's index (one "
              f"matrix product and top-k in torch, {args.threads} thread); the floor is numpy's product alone "
              "(BLAS threads: its default)."]
    table += ["", f"ExperienceManager end to end at {mgr['size']:,} entries (embedding included, cache off, {mgr['queries']} queries): "
              f"micro-batched {mgr['batched_qps']:.0f} q/s vs one at a time {mgr['one_at_a_time_qps']:.0f} q/s "
              f"= **{mgr['speedup']:.1f}×**."]
    write_results("bench_retrieval", result, "\n".join(table))


if __name__ == "__main__":
    main()
