"""Env speed: build time, reset time and steps/s of every registered env that builds here, stepped
directly and through EnvPool with 1, 2 and 4 workers (4 slots each).

    python benchmarks/bench_envs.py [--quick] [--envs minihack/Room-5x5 ...]

Writes benchmarks/results/bench_envs.json and benchmarks/results/bench_envs.md. Actions cycle
through the env's admissible actions (so episodes end by the turn limit or by chance, and resets
are part of the throughput, as in a rollout). Every figure is a median: per-call latencies over
all calls, throughputs over `--repeats` timed windows.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from envs.base import EnvError, TextEnv  # noqa: E402
from envs.pool import EnvPool  # noqa: E402
from envs.registry import list_envs, make_env  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
POOL_SLOTS = 4
POOL_WORKERS = (1, 2, 4)
MIN_STEPS = 10  # per window, so an env whose reset outlasts the window is still measured


def _next_action(info: dict[str, Any], i: int) -> str:
    adm = info.get("admissible_actions") or ["look"]
    return adm[i % len(adm)]


def bench_single(env: TextEnv, window_s: float, repeats: int) -> dict[str, float]:
    reset_ms: list[float] = []
    step_ms: list[float] = []
    rates: list[float] = []
    seed = 0
    for _ in range(repeats):
        steps, t_start = 0, time.perf_counter()
        t0 = time.perf_counter()
        _, info = env.reset(seed=seed)
        reset_ms.append((time.perf_counter() - t0) * 1e3)
        while time.perf_counter() - t_start < window_s or steps < MIN_STEPS:
            t0 = time.perf_counter()
            _, _, terminated, truncated, info = env.step(_next_action(info, steps))
            step_ms.append((time.perf_counter() - t0) * 1e3)
            steps += 1
            if terminated or truncated:
                seed += 1
                t0 = time.perf_counter()
                _, info = env.reset(seed=seed)
                reset_ms.append((time.perf_counter() - t0) * 1e3)
        rates.append(steps / (time.perf_counter() - t_start))
    return {
        "reset_ms": statistics.median(reset_ms),
        "step_ms": statistics.median(step_ms),
        "steps_per_s": statistics.median(rates),
        "resets": len(reset_ms),
        "steps": len(step_ms),
    }


def bench_pool(name: str, workers: int, window_s: float, repeats: int) -> dict[str, float]:
    """Aggregate steps/s of POOL_SLOTS copies of `name` stepped together, resets included."""
    t0 = time.perf_counter()
    with EnvPool([name] * POOL_SLOTS, num_workers=workers, step_timeout_s=120) as pool:
        infos = {r.slot: r.info for r in pool.reset_many([(s, s, None) for s in range(POOL_SLOTS)])}
        startup_s = time.perf_counter() - t0
        seed, rates, errors = POOL_SLOTS, [], 0
        for _ in range(repeats):
            steps, t_start, i = 0, time.perf_counter(), 0
            while time.perf_counter() - t_start < window_s or steps < MIN_STEPS:
                out = pool.step_many([(s, _next_action(infos[s], i)) for s in range(POOL_SLOTS)])
                i += 1
                steps += len(out)
                done = []
                for r in out:
                    infos[r.slot] = r.info
                    errors += r.error is not None
                    if r.done:
                        done.append(r.slot)
                if done:
                    for r in pool.reset_many([(s, seed + k, None) for k, s in enumerate(done)]):
                        infos[r.slot] = r.info
                    seed += len(done)
            rates.append(steps / (time.perf_counter() - t_start))
    return {"steps_per_s": statistics.median(rates), "startup_s": startup_s, "errors": errors}


def run(names: list[str], quick: bool, repeats: int) -> dict[str, Any]:
    window = 1.0 if quick else 4.0
    report: dict[str, Any] = {
        # The load average says how much other work shared the CPUs: figures from a busy machine are low.
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform(),
                    "load_avg_1m_at_start": os.getloadavg()[0]},
        "quick": quick,
        "window_s": window,
        "repeats": repeats,
        "pool_slots": POOL_SLOTS,
        "envs": {},
    }
    for name in names:
        row: dict[str, Any] = {}
        t0 = time.perf_counter()
        try:
            env = make_env(name)
        except (EnvError, ModuleNotFoundError) as exc:
            row = {"status": "skipped", "reason": str(exc).splitlines()[0][:200]}
            report["envs"][name] = row
            print(f"{name}: skipped ({row['reason']})", flush=True)
            continue
        row["status"] = "ok"
        row["build_s"] = time.perf_counter() - t0
        try:
            row["single"] = bench_single(env, window, repeats)
            row["pool"] = {str(w): bench_pool(name, w, window, repeats) for w in POOL_WORKERS}
        except Exception as exc:  # one broken env must not lose the other envs' figures
            report["envs"][name] = {"status": "error", "reason": f"{type(exc).__name__}: {exc}"[:200]}
            print(f"{name}: error ({report['envs'][name]['reason']})", flush=True)
            continue
        finally:
            env.close()
        report["envs"][name] = row
        pooled = ", ".join(f"{w}w {row['pool'][str(w)]['steps_per_s']:.0f}" for w in POOL_WORKERS)
        print(f"{name}: build {row['build_s']:.2f} s, reset {row['single']['reset_ms']:.1f} ms, "
              f"step {row['single']['step_ms']:.2f} ms, {row['single']['steps_per_s']:.0f} steps/s; pool {pooled}",
              flush=True)
    return report


def to_markdown(report: dict[str, Any]) -> str:
    m = report["machine"]
    lines = [
        f"Env speed on {m['cpus']} CPUs (1-min load average {m['load_avg_1m_at_start']:.1f} at start), "
        f"Python {m['python']} ({'quick' if report['quick'] else 'full'} run: "
        f"{report['repeats']} windows of {report['window_s']:g} s; medians). Pool columns: aggregate steps/s of "
        f"{report['pool_slots']} slots, resets included.",
        "",
        "| env | build s | reset ms | step ms | steps/s single | pool 1w | pool 2w | pool 4w |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, row in report["envs"].items():
        if row["status"] != "ok":
            lines.append(f"| {name} | {row['status']}: {row['reason']} | | | | | | |")
            continue
        s, p = row["single"], row["pool"]
        pooled = " | ".join(f"{p[str(w)]['steps_per_s']:.0f}" for w in POOL_WORKERS)
        lines.append(f"| {name} | {row['build_s']:.2f} | {s['reset_ms']:.1f} | {s['step_ms']:.2f} | "
                     f"{s['steps_per_s']:.0f} | {pooled} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 s timing windows instead of 4 s")
    parser.add_argument("--repeats", type=int, default=3, help="timed windows per measurement (median taken)")
    parser.add_argument("--envs", nargs="*", default=None, help="env names (default: every registered env)")
    args = parser.parse_args(argv)
    report = run(args.envs or list_envs(), args.quick, args.repeats)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "bench_envs.json").write_text(json.dumps(report, indent=2))
    (RESULTS / "bench_envs.md").write_text(to_markdown(report))
    print(to_markdown(report))


if __name__ == "__main__":
    main()
