"""One ExperienceManager as a Ray actor under 4 and 8 concurrent Ray rollout workers, against the local manager under
as many threads: the same library, the same queries, measured side by side in one run (rounds interleaved).

Each caller plays a rollout worker at episode start: one call with `--per-call` fresh task texts (a task group's
with-experience rollouts; fresh each round, so the embedding cache cannot help), `--rounds` times. The local callers
are threads of this process sharing the in-process manager (run.executor local); the Ray callers are actors of a
local cluster (2 CPUs, loopback) calling the manager actor (run.executor ray). Both managers micro-batch whatever
arrives together. A single caller sending one query per call is the one-at-a-time baseline.

    python benchmarks/bench_ray_manager.py [--size 10000] [--callers 4,8] [--per-call 8] [--rounds 4] [--repeats 3]

Writes benchmarks/results/bench_ray_manager.json and .md.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

from benchmarks.bench_retrieval import embedded_library, task_texts  # noqa: E402
from benchmarks.common import environment, median, write_results  # noqa: E402
from core.config import EmbeddingConfig, IndexConfig, LibraryConfig, ManagerConfig  # noqa: E402

ENV = "bench"


class Caller:
    """A Ray rollout worker as far as retrieval goes: sends its calls one after the other, returns its seconds."""

    def __init__(self, manager) -> None:  # noqa: ANN001 - the ManagerActor's handle
        self.manager = manager

    def run(self, batches: list[list[str]]) -> float:
        import ray

        t0 = time.perf_counter()
        for qs in batches:
            ray.get(self.manager.search.remote(qs, None, ENV, None))
        return time.perf_counter() - t0


def batches_for(base: list[str], tag: str, rounds: int, per_call: int, offset: int) -> list[list[str]]:
    """`rounds` calls of `per_call` task texts no call has sent before (the tag makes them fresh)."""
    out = []
    for r in range(rounds):
        qs = [base[(offset + r * per_call + i) % len(base)] for i in range(per_call)]
        out.append([f"{q} ({tag} round {r})" for q in qs])
    return out


def local_round(mgr, callers: int, rounds: int, per_call: int, base: list[str], tag: str) -> float:  # noqa: ANN001
    work = [batches_for(base, f"{tag} c{c}", rounds, per_call, c * 97) for c in range(callers)]

    def one(batches: list[list[str]]) -> None:
        for qs in batches:
            mgr.search_sync(qs, task=ENV)

    threads = [threading.Thread(target=one, args=(w,)) for w in work]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - t0


def ray_round(actors: list, callers: int, rounds: int, per_call: int, base: list[str], tag: str) -> float:  # noqa: ANN001
    import ray

    work = [batches_for(base, f"{tag} c{c}", rounds, per_call, c * 97) for c in range(callers)]
    t0 = time.perf_counter()
    ray.get([a.run.remote(w) for a, w in zip(actors[:callers], work)])
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", type=int, default=10_000, help="library entries")
    ap.add_argument("--callers", default="4,8", help="concurrent rollout workers, comma-separated")
    ap.add_argument("--per-call", type=int, default=8, help="task texts per call (a group's with-experience rollouts)")
    ap.add_argument("--rounds", type=int, default=4, help="calls per caller in one measurement")
    ap.add_argument("--repeats", type=int, default=3, help="measurements per setting (local and ray interleaved)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads of the local manager's embedder (the actor's: Ray's 1)")
    ap.add_argument("--quick", action="store_true", help="1,000 entries, 2 rounds, 1 repeat (make bench --quick)")
    args = ap.parse_args()
    if args.quick:
        args.size, args.rounds, args.repeats = 1000, 2, 1
    import ray
    import torch

    from core.embedding import Embedder
    from core.manager import ExperienceManager
    from core.store import ExperienceStore, NewEntry
    from trainers.ray_exec import loopback_only
    from trainers.ray_remote import RemoteManager

    torch.set_num_threads(args.threads)
    callers = [int(c) for c in args.callers.split(",")]
    emb_cfg = EmbeddingConfig(cache_size=0)
    embedder = Embedder(emb_cfg)
    texts, vecs = embedded_library(embedder, args.size)
    base = task_texts(512, seed=777)
    lib = LibraryConfig(embedding=emb_cfg, manager=ManagerConfig(random_demote=False), index=IndexConfig(use_gpu="never"))
    with tempfile.TemporaryDirectory() as d:
        url = f"sqlite:///{d}/bench.db"
        store = ExperienceStore(url)
        for s in range(0, args.size, 5000):
            store.add_entries([NewEntry(text=f"## Title: tip {i}\n## Content: advice for {t}", env=ENV, task=t, query=t,
                                        query_embedding=v, text_embedding=v, embedder=embedder.name)
                               for i, (t, v) in enumerate(zip(texts[s:s + 5000], vecs[s:s + 5000]), start=s)])
        local = ExperienceManager(store, embedder, lib.manager, lib.index)
        loopback_only()
        ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1", object_store_memory=128 * 1024**2,
                 log_to_driver=False)
        t0 = time.perf_counter()
        remote = RemoteManager.start(url, lib, seed=0, cpus=0.5)
        actor_start_s = time.perf_counter() - t0
        actors = [ray.remote(Caller).options(num_cpus=0).remote(remote.actor) for _ in range(max(callers))]
        ray.get([a.run.remote([]) for a in actors])  # started
        # warm-up both paths once
        local_round(local, 1, 1, args.per_call, base, "warm")
        ray_round(actors, 1, 1, args.per_call, base, "warm")
        rows = []
        settings = [("one at a time", 1, 1)] + [(f"{c} callers", c, args.per_call) for c in callers]
        for name, c, per_call in settings:
            rounds = args.rounds * (args.per_call if per_call == 1 else 1)  # the same number of queries per caller
            lt, rt = [], []
            for rep in range(args.repeats):  # interleaved: both see the same machine state
                lt.append(local_round(local, c, rounds, per_call, base, f"L{name}{rep}"))
                rt.append(ray_round(actors, c, rounds, per_call, base, f"R{name}{rep}"))
            q = c * rounds * per_call
            rows.append({"setting": name, "callers": c, "per_call": per_call, "queries": q,
                         "local_qps": q / median(lt), "ray_qps": q / median(rt), "local_s": lt, "ray_s": rt})
            print(rows[-1], flush=True)
        stats = remote.info()["stats"]
        remote.close()
        local.close()
        ray.shutdown()
        store.close()
    base_l, base_r = rows[0]["local_qps"], rows[0]["ray_qps"]
    for r in rows:
        r["ray_over_local"] = r["ray_qps"] / r["local_qps"]
        r["local_over_one_at_a_time"] = r["local_qps"] / base_l
        r["ray_over_one_at_a_time"] = r["ray_qps"] / base_r
    result = {"benchmark": "ray_manager", "environment": environment(), "size": args.size, "per_call": args.per_call,
              "rounds": args.rounds, "repeats": args.repeats, "actor_start_s": actor_start_s, "actor_stats": stats, "rows": rows,
              "ray": ray.__version__}
    table = [f"ExperienceManager at {args.size:,} entries (MiniLM embedding included, cache off, flat index): queries per second, "
             f"median of {args.repeats} interleaved measurements; local = the in-process manager under as many threads, "
             f"ray = one manager actor (ray {ray.__version__}, local cluster, 2 CPUs) under as many Ray caller actors.", "",
             "| callers | queries per call | local q/s | ray q/s | ray / local | local / one at a time | ray / one at a time |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        table.append(f"| {r['setting']} | {r['per_call']} | {r['local_qps']:.1f} | {r['ray_qps']:.1f} | {r['ray_over_local']:.2f} | "
                     f"{r['local_over_one_at_a_time']:.2f} | {r['ray_over_one_at_a_time']:.2f} |")
    table += ["", f"The manager actor started (embedder loaded, index rebuilt from the store) in {actor_start_s:.1f} s; it served "
              f"{stats['queries']} queries in {stats['batches']} micro-batches."]
    write_results("bench_ray_manager", result, "\n".join(table))


if __name__ == "__main__":
    main()
