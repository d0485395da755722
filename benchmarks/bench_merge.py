"""The periodic merge (docs/method.md step 4) on one library, three ways, each on its own copy of it:

  id          creation order, one walk per task, one chunk per extractor call (the merge before 2026-12-03)
  similarity  entries in a nearest-neighbour chain over their text embeddings, one walk per task
  walks8      the same chain cut into 8 walks, their chunks decided 8 per batched extractor call

The same extractor (greedy, the run config's max_new_tokens) decides every chunk. Reported per arm:
wall time, chunks, merges, discards, unparsed chunks, library before/after, and how alike the entries
each merge joined are: the mean pairwise cosine of its parents' text embeddings, next to two
references from the library before merging (random pairs, and each entry with its nearest neighbour).

    python benchmarks/bench_merge.py [--quick] [--library RUN_DATA_DIR | DB_FILE] [--data-dir ./comprl_data]

Without --library the library is the warm start's teacher lessons for episodes of the env the embedded
extractor was warm-started on (what it was trained to write; 600 entries, 60 with --quick). With --library, a run's
workbench.db (its active entries), e.g. a study run's data dir. Writes benchmarks/results/bench_merge.json and .md.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import random
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402

from benchmarks.common import environment, write_results  # noqa: E402

ARMS = {"id": {"order": "id", "walks": 1, "batch": 1},
        "similarity": {"order": "similarity", "walks": 1, "batch": 1},
        "walks8": {"order": "similarity", "walks": 8, "batch": 8}}
STEP = 1_000_000  # the merge's step: marks the entries this bench wrote


def teacher_library(db: Path, env: str, n: int, lib) -> None:
    """n lessons the warm start's teacher writes for scripted episodes of `env` (noisy and expert)."""
    from core.embedding import Embedder
    from core.manager import ExperienceManager, OpContext
    from core.store import ExperienceStore
    from core.types import Operation
    from trainers.warmstart import WarmStartConfig, _lesson, collect_demos

    demos = collect_demos(WarmStartConfig(envs=[env], demo_episodes=n, seed=7))
    store = ExperienceStore(f"sqlite:///{db}")
    mgr = ExperienceManager(store, Embedder(lib.embedding), lib.manager, lib.index)
    try:
        by_task: dict[str, list[str]] = {}
        for d in demos:
            by_task.setdefault(d.task, []).append(_lesson(d)[0])
        for task, texts in by_task.items():
            mgr.apply_operations([Operation("add", text=t) for t in texts], OpContext(env=env, task=task))
    finally:
        mgr.close()
        store.close()


def pair_cosines(store, ids_sets) -> list[float]:
    """Mean pairwise cosine of each id set's text embeddings."""
    out = []
    for ids in ids_sets:
        vecs = store.embeddings(ids, "text")
        v = np.stack([vecs[i] for i in ids if i in vecs])
        if len(v) < 2:
            continue
        v = v / np.linalg.norm(v, axis=1, keepdims=True)
        s = v @ v.T
        out.append(float(s[np.triu_indices(len(v), 1)].mean()))
    return out


def references(store) -> dict[str, float]:
    ids, vecs, entries = store.active_vectors("text")
    v = vecs / np.linalg.norm(vecs, axis=1, keepdims=True)
    rng = random.Random(0)
    tasks = np.array([e.task for e in entries], dtype=object)
    pairs = [(a, b) for a, b in (rng.sample(range(len(ids)), 2) for _ in range(4000)) if tasks[a] == tasks[b]]
    s = v @ v.T
    np.fill_diagonal(s, -np.inf)
    s[tasks[:, None] != tasks[None, :]] = -np.inf
    return {"random_pair_cos": float(np.mean([v[a] @ v[b] for a, b in pairs])) if pairs else float("nan"),
            "nearest_neighbour_cos": float(np.mean(s.max(axis=1)))}


def run_arm(src: Path, work: Path, name: str, cfg, data_dir: str) -> dict:
    from core.store import ExperienceStore
    from trainers.evaluate import eval_manager
    from trainers.extractor import ExperienceLoop

    db = work / f"{name}.db"
    shutil.copy(src, db)
    store = ExperienceStore(f"sqlite:///{db}")
    cfg = dataclasses.replace(cfg, library=dataclasses.replace(
        cfg.library, merge=dataclasses.replace(cfg.library.merge, **ARMS[name])))
    mgr = eval_manager(store, cfg)
    mgr.sync(full=True)
    runs = store.list_runs()
    loop = ExperienceLoop(cfg.extractor, cfg.library, store, mgr, seed=cfg.run.seed, threads=cfg.run.threads,
                          trains=cfg.trains_extractor, deterministic=cfg.run.deterministic, data_dir=Path(data_dir),
                          run_id=min(r["id"] for r in runs) if runs else None)
    try:
        t0 = time.perf_counter()
        m = loop.merge(STEP)
        wall = time.perf_counter() - t0
        # every entry this merge wrote, still active or merged again later in the same walk
        written = store.list_entries(source="merged", status=None, limit=1_000_000).entries
        groups = [e.parent_ids for e in written if e.created_step == STEP and len(e.parent_ids) >= 2]
        cos = pair_cosines(store, groups)
        why: dict[str, int] = {}
        for err in loop.last_merge.errors if loop.last_merge else []:
            key = re.sub(r"\[[^\]]*\]|\(.*\)|\d+", "…", err)[:80]  # the reason without ids
            why[key] = why.get(key, 0) + 1
        return {"arm": name, **ARMS[name], "wall_s": wall, "chunks": m["library/merge_chunks"], "walks": m["library/merge_walks"],
                "merges": m["library/merges"], "discards": m["library/merge_discards"], "unparsed": m["library/merge_unparsed"],
                "before": m["library/merge_before"], "after": m["library/merge_after"],
                "merged_parent_cos": float(np.mean(cos)) if cos else float("nan"), "merged_groups": len(groups),
                "unparsed_reasons": dict(sorted(why.items(), key=lambda kv: -kv[1]))}
    finally:
        loop.close()
        mgr.close()
        store.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--library", default="", help="a run's data dir or workbench.db (default: teacher lessons)")
    ap.add_argument("--entries", type=int, default=0, help="teacher lessons to build (default 600, --quick 60)")
    ap.add_argument("--data-dir", default=str(ROOT / "comprl_data"))
    ap.add_argument("--env", default="", help="env of the teacher lessons (default: the embedded warm start's first env)")
    ap.add_argument("--arms", default=",".join(ARMS))
    ap.add_argument("--out", default="bench_merge")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(1)

    from core.store import ExperienceStore
    from trainers.config import load_run_config
    from trainers.warmstart import WarmStartConfig, ensure_models

    arms = [a for a in args.arms.split(",") if a]
    if bad := [a for a in arms if a not in ARMS]:
        raise SystemExit(f"unknown arm(s) {bad}; choose from {list(ARMS)}")
    cfg = load_run_config(ROOT / "configs" / "minihack_room_cpu.yaml")
    cfg = dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, threads=1))
    if cfg.extractor.model.path.startswith("embedded:"):
        ensure_models(args.data_dir)
    env = args.env or WarmStartConfig().envs[0]
    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        src = work / "library.db"
        if args.library:
            p = Path(args.library)
            p = p / "workbench.db" if p.is_dir() else p
            if not p.is_file():
                raise SystemExit(f"--library: no workbench.db at {args.library}")
            shutil.copy(p, src)
            source = f"active entries of {args.library}"
        else:
            n = args.entries or (60 if args.quick else 600)
            teacher_library(src, env, n, cfg.library)
            source = f"{n} teacher lessons for {env} episodes (trainers/warmstart/ _lesson)"
        store = ExperienceStore(f"sqlite:///{src}")
        refs, size = references(store), store.count()
        store.close()
        rows = []
        for name in arms:
            print(f"== {name}", flush=True)
            rows.append(run_arm(src, work, name, cfg, args.data_dir))
            print(rows[-1], flush=True)
    base = next((r for r in rows if r["arm"] == "id"), rows[0])
    res = {"benchmark": args.out, "environment": environment(), "argv": sys.argv, "library": source, "entries": size,
           "extractor": cfg.extractor.model.path, "max_new_tokens": cfg.extractor.model.max_new_tokens,
           "chunk_size": cfg.library.merge.chunk_size, **refs, "arms": rows}
    table = [f"Library: {source}; {size} active entries. Extractor `{cfg.extractor.model.path}` (greedy, up to "
             f"{cfg.extractor.model.max_new_tokens} new tokens), chunks of {cfg.library.merge.chunk_size}. Each arm merges "
             f"its own copy, one after the other. Similarity of two entries of the library before merging: random pair "
             f"{refs['random_pair_cos']:.3f}, an entry and its nearest neighbour {refs['nearest_neighbour_cos']:.3f}.", "",
             "| arm | order | walks | chunks per call | wall s | vs id | chunks | merges | discards | unparsed chunks | "
             "library before → after | parents' mean cosine |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|"]
    for r in rows:
        table.append(f"| {r['arm']} | {r['order']} | {r['walks']:.0f} | {r['batch']} | {r['wall_s']:.1f} | "
                     f"{r['wall_s'] / base['wall_s']:.2f}x | {r['chunks']:.0f} | {r['merges']:.0f} | {r['discards']:.0f} | "
                     f"{r['unparsed']:.0f} | {r['before']:.0f} → {r['after']:.0f} | {r['merged_parent_cos']:.3f} |")
    write_results(args.out, res, "\n".join(table))


if __name__ == "__main__":
    main()
