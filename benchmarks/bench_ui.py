"""Live-curve refresh at 100k points per series: what one tick of the workbench's curves costs.

Measures `Workbench.refresh_curves` (the Live curves tab's 1 s timer callback) against a real
SQLite store holding run 1 with all 14 charted keys at 100k steps (1.4M metric rows) and run 2
with the two reward keys at 100k steps, overlaid:

- first load: the first browser session after start-up reads the whole history, in bounded slices per tick;
- new session: another browser session opens the same runs (served from the shared series cache);
- incremental: one new step written, the session reads only rows past its cursors and redraws the changed panels;
- idle: nothing new (no panel redrawn);
- resmooth: the smoothing slider moved (every series re-smoothed, every panel redrawn);
and the bytes of figure JSON sent to the browser per refresh (downsampled on the server). Also the
Library tab's server-side paging (`Workbench.library_page`) over a 100k-entry library.

The store is built once and cached under benchmarks/results/cache/ (ignored by git): writing
2.9M rows one step at a time, as a trainer does, takes a few minutes.

    python benchmarks/bench_ui.py [--points 100000] [--repeats 20] [--entries 100000] [--quick]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from app import service, views  # noqa: E402
from app.service import Workbench  # noqa: E402
from benchmarks.common import RESULTS, environment, median, percentile, write_results  # noqa: E402
from core.store import ExperienceStore  # noqa: E402

REWARD_KEYS = ("policy/reward_with_exp", "policy/reward_without_exp")


def _fresh_store(path: Path) -> tuple[Path, ExperienceStore]:
    """An empty store at `path`.building (left-overs of an interrupted build removed); renamed when done."""
    tmp = path.with_suffix(".building")
    for p in (tmp, Path(str(tmp) + "-wal"), Path(str(tmp) + "-shm")):
        p.unlink(missing_ok=True)
    return tmp, ExperienceStore(f"sqlite:///{tmp}")


def build_store(path: Path, points: int) -> None:
    """Run 1: every charted key; run 2: the reward keys; `points` steps each, written step by step."""
    tmp, store = _fresh_store(path)
    rng = np.random.default_rng(0)
    t0 = time.time() - points
    r1 = store.create_run("bench-all-keys", variant="complementary", env="minihack/Room-5x5", status="finished")
    r2 = store.create_run("bench-rewards", variant="grpo", env="minihack/Room-5x5", status="finished")
    noise = rng.normal(0, 0.3, size=(points, len(views.CURVE_KEYS)))
    for s in range(points):
        base = s / points
        store.log_metrics(r1, s, {k: base + noise[s, j] for j, k in enumerate(views.CURVE_KEYS)}, at=t0 + s)
        store.log_metrics(r2, s, {k: 0.8 * base + noise[s, j] for j, k in enumerate(REWARD_KEYS)}, at=t0 + s)
        if s and s % 20_000 == 0:
            print(f"  built {s:,} / {points:,} steps", flush=True)
    store.close()
    tmp.rename(path)


def build_library(path: Path, n: int) -> None:
    """n entries over 5 envs and 50 tasks, with varied counters, written in batches as an import would."""
    from core.store import NewEntry
    from core.types import Source

    tmp, store = _fresh_store(path)
    rng = np.random.default_rng(1)
    envs = ["minihack/Room-5x5", "minihack/KeyRoom-S5", "minihack/MazeWalk-9x9", "alfworld/pick_and_place", "webshop"]
    for start in range(0, n, 5000):
        batch = []
        for i in range(start, min(n, start + 5000)):
            batch.append(NewEntry(
                text=f"## Title: lesson {i}\n## Description: when task {i % 50} starts\n## Content: step {i % 7} first, then {i % 11}",
                env=envs[i % 5], task=f"task {i % 50}", source=Source.EXTRACTED if i % 3 else Source.MERGED,
                counters={"retrieved_count": int(rng.integers(0, 500)), "successes": int(rng.integers(0, 50)),
                          "failures": int(rng.integers(0, 50))}))
        store.add_entries(batch, actor="import", action="import")
    store.close()
    tmp.rename(path)


def library_paging(db_url: str, repeats: int) -> dict[str, float]:
    """Milliseconds per `Workbench.library_page` call (the Library tab's table) on a large library."""
    with tempfile.TemporaryDirectory() as tmp:
        wb = Workbench(Path(tmp) / "data", db_url)
        cases = {
            "first page (50, by id)": dict(),
            "page 1,000 (by id)": dict(page=1000),
            "most retrieved first": dict(sort="retrieved_count", descending=True),
            "env filter, page 100": dict(env="webshop", page=100),
            "text filter": dict(text="lesson 9999"),
        }
        out = {}
        for label, kw in cases.items():
            times = []
            for _ in range(repeats):
                ms, _ = timed(lambda: wb.library_page(**kw))
                times.append(ms)
            out[label] = median(times)
        wb.close()
    return out


def timed(fn, *args):  # noqa: ANN001, ANN002
    t = time.perf_counter()
    out = fn(*args)
    return (time.perf_counter() - t) * 1000.0, out


def payload(figs: list[str | None]) -> int:
    return sum(len(f) for f in figs if f is not None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--points", type=int, default=100_000, help="steps (points per series)")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--entries", type=int, default=100_000, help="library size for the paging measurement")
    ap.add_argument("--quick", action="store_true", help="10k points and entries, 5 repeats (a smoke run for `make bench`)")
    args = ap.parse_args()
    if args.quick:
        args.points, args.entries, args.repeats = 10_000, 10_000, 5

    cache = RESULTS / "cache" / f"bench_ui_{args.points}.db"
    cache.parent.mkdir(parents=True, exist_ok=True)
    t_build = 0.0
    if not cache.exists():
        print(f"building the store ({args.points:,} steps × 2 runs) at {cache} …", flush=True)
        t = time.time()
        build_store(cache, args.points)
        t_build = time.time() - t
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "workbench.db"
        db.write_bytes(cache.read_bytes())  # a copy: the benchmark appends steps
        wb = Workbench(Path(tmp) / "data", f"sqlite:///{db}")
        service.PULL_INTERVAL_S = 0.0
        runs = wb.store.list_runs()
        r1 = next(r["id"] for r in runs if r["name"] == "bench-all-keys")
        r2 = next(r["id"] for r in runs if r["name"] == "bench-rewards")
        rows = {}
        for label, chosen in (("1 run, 14 keys", [r1]), ("2 runs overlaid", [r1, r2])):
            # Server cold: the first session after start-up reads the whole history, one bounded slice per tick.
            wb.metrics = service.MetricCache(wb.store)
            token, cold, ticks, worst, size = None, 0.0, 0, 0.0, 0
            while True:
                ms, (token, figs, status) = timed(wb.refresh_curves, token, chosen, 0.6, "step")
                cold, ticks, worst, size = cold + ms, ticks + 1, max(worst, ms), max(size, payload(figs))
                if "loading history" not in status:
                    break
            # Server warm: another browser session opens the same runs (the store is not read again).
            warm = []
            for _ in range(3):
                ms, (_, figs, _) = timed(wb.refresh_curves, None, chosen, 0.6, "step")
                warm.append(ms)
            traces = [len(t["x"]) for f in figs if f for t in json.loads(f)["data"]]
            step = args.points
            inc, inc_bytes, idle = [], [], []
            for _ in range(args.repeats):
                wb.store.log_metrics(r1, step, {k: 1.0 for k in views.CURVE_KEYS})
                step += 1
                ms, (_, figs, _) = timed(wb.refresh_curves, token, chosen, 0.6, "step")
                inc.append(ms)
                inc_bytes.append(payload(figs))
                ms, (_, figs, _) = timed(wb.refresh_curves, token, chosen, 0.6, "step")
                idle.append(ms)
                assert all(f is None for f in figs)
            resmooth = []
            for i in range(5):
                ms, _ = timed(wb.refresh_curves, token, chosen, 0.5 + 0.05 * i, "step")
                resmooth.append(ms)
            sess = wb._curves[token]
            held = sum(sm.n for (rid, _), sm in sess.smoothed.items() if rid in chosen)
            rows[label] = {
                "series": len([k for k in sess.smoothed if k[0] in chosen]),
                "points_held": held,
                "first_load_total_ms": cold,
                "first_load_ticks": ticks,
                "first_load_slowest_tick_ms": worst,
                "new_session_ms_median": median(warm),
                "incremental_ms_median": median(inc),
                "incremental_ms_p95": percentile(inc, 95),
                "idle_ms_median": median(idle),
                "resmooth_ms_median": median(resmooth),
                "full_payload_kb": size / 1024,
                "incremental_payload_kb_median": median(inc_bytes) / 1024,
                "max_points_per_trace": max(traces),
            }
            for k in list(wb._curves):
                del wb._curves[k]
        wb.close()

    load = [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else []
    lib_cache = RESULTS / "cache" / f"bench_ui_library_{args.entries}.db"
    if not lib_cache.exists():
        print(f"building a library of {args.entries:,} entries at {lib_cache} …", flush=True)
        build_library(lib_cache, args.entries)
    paging = library_paging(f"sqlite:///{lib_cache}", 5)
    result = {"load_avg": load, "name": "bench_ui", "library_entries": args.entries, "library_page_ms": paging, "points_per_series": args.points, "repeats": args.repeats, "store_build_s": t_build,
              "results": rows, "environment": environment()}
    lines = [f"Live-curve refresh (`Workbench.refresh_curves`, one 1 s tick) with {args.points:,} points per series, "
             "SQLite store, server-side min/max downsampling.", "",
             "| view | series | points held | first load after start-up: total ms (ticks, slowest tick ms) | "
             "new session ms | incremental ms (median / p95) | idle ms | resmooth ms | payload all / incremental KB | "
             "points per trace |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for label, r in rows.items():
        lines.append(f"| {label} | {r['series']} | {r['points_held']:,} | {r['first_load_total_ms']:.0f} "
                     f"({r['first_load_ticks']}, {r['first_load_slowest_tick_ms']:.0f}) | {r['new_session_ms_median']:.0f} | "
                     f"{r['incremental_ms_median']:.1f} / {r['incremental_ms_p95']:.1f} | {r['idle_ms_median']:.1f} | "
                     f"{r['resmooth_ms_median']:.0f} | {r['full_payload_kb']:.0f} / {r['incremental_payload_kb_median']:.0f} | "
                     f"≤ {r['max_points_per_trace']:,} |")
    lines += ["", "first load = the first browser session after the server starts reads each series past its cursor "
              f"in slices of {service.ROWS_PER_KEY_PER_PULL:,} rows per key per tick, drawing as it goes; new session = "
              "another session opening the same runs (served from the shared cache, the store is not re-read); "
              "incremental = one new step written to the store, read past the cursors, changed panels redrawn; "
              "idle = nothing new, nothing sent; resmooth = smoothing slider moved, every series re-smoothed and redrawn. "
              "Measured back to back with PULL_INTERVAL_S = 0 (in the app, sessions within 0.5 s share one read).",
              "", f"Library tab (`Workbench.library_page`, server-side paging) with {args.entries:,} entries, median ms:", "",
              "| query | ms |", "|---|---|", *[f"| {k} | {v:.1f} |" for k, v in paging.items()], "",
              f"Load average during the run: {result['load_avg']}."]
    write_results("bench_ui", result, "\n".join(lines))


if __name__ == "__main__":
    main()
