"""Time to the first curve: from `make run` to the first point on the workbench's live curves (the first
`policy/*` metric of the demo run in the store), on a fresh data dir, with the model build and without it
(models already built, linked in from --models).

    python benchmarks/bench_first_curve.py                         # both cases; the build one takes ~8 min idle
    python benchmarks/bench_first_curve.py --cases built --models /work/data/models

Each case runs `make run DATA=<fresh dir> PORT=<port>` as a user would (setup is already done: its stamp makes it a
no-op), waits for the workbench to answer and for the first curve point, then stops the process group (SIGTERM,
as Ctrl-C would). Measure on an idle machine: the JSON says the load.
"""
from __future__ import annotations

import argparse
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import environment, write_results  # noqa: E402


def first_point(db: Path) -> float | None:
    """The time of the first policy/* metric any run logged, or None."""
    if not db.exists():
        return None
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1) as con:
            row = con.execute("SELECT min(time) FROM metrics WHERE key LIKE 'policy/%'").fetchone()
    except sqlite3.Error:
        return None
    return row[0] if row and row[0] is not None else None


def answers(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def stop_runs(data: Path, timeout: float = 180.0) -> None:
    """Stop the demo run: a run outlives the workbench that started it (its own session, by design), so ending
    `make run` leaves it training; SIGTERM stops it after the step in flight, as the Runs tab's Stop does."""
    db = data / "workbench.db"
    if not db.is_file():
        return
    with sqlite3.connect(db) as con:
        pids = [p for (p,) in con.execute("select pid from runs where status = 'running' and pid is not null")]
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            continue
        t0 = time.time()
        while time.time() - t0 < timeout:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(1)
        else:
            os.kill(pid, signal.SIGKILL)


def one(case: str, models: Path | None, port: int, timeout: float) -> dict:
    data = Path(tempfile.mkdtemp(prefix=f"first_curve_{case}_"))
    if case == "built":
        if models is None or not (models / "policy").is_dir():
            raise SystemExit("--models must name a folder with built models (policy/, extractor/) for the 'built' case")
        (data / "models").symlink_to(models.resolve())
    log = data / "make_run.log"
    t0 = time.time()
    proc = subprocess.Popen(["make", "-s", "run", f"DATA={data}", f"PORT={port}"], cwd=ROOT, stdout=log.open("w"),
                            stderr=subprocess.STDOUT, start_new_session=True)
    t_app = t_curve = None
    try:
        while time.time() - t0 < timeout and proc.poll() is None:
            if t_app is None and answers(port):
                t_app = time.time() - t0
            at = first_point(data / "workbench.db")
            if at is not None:
                t_curve = at - t0
                break
            time.sleep(0.5)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        stop_runs(data)
    out = {"case": case, "data_dir": str(data), "app_answers_s": round(t_app, 1) if t_app else None,
           "first_curve_point_s": round(t_curve, 1) if t_curve else None, "exit_code": proc.returncode,
           "load_avg_after": round(os.getloadavg()[0], 2)}
    if t_curve is None:
        out["log_tail"] = log.read_text()[-2000:]
    print(out, flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default="built,build", help="built (models linked in) and/or build (a fresh data dir)")
    ap.add_argument("--models", type=Path, default=None, help="built models for the 'built' case")
    ap.add_argument("--port", type=int, default=7871)
    ap.add_argument("--timeout", type=float, default=1800.0)
    ap.add_argument("--out", default="bench_first_curve")
    args = ap.parse_args(argv)
    env = environment()
    load_before = round(os.getloadavg()[0], 2)
    rows = [one(c, args.models, args.port, args.timeout) for c in args.cases.split(",")]
    names = {"built": "models already built", "build": "fresh data dir (builds the models first)"}
    md = [f"1-min load average {load_before} at the start", "",
          "| case | workbench answers (s) | first curve point (s) |", "|---|---:|---:|"]
    md += [f"| {names.get(r['case'], r['case'])} | {r['app_answers_s']} | {r['first_curve_point_s']} |" for r in rows]
    md += ["", "From `make run` (setup already done) to the workbench answering on loopback and to the demo run's first "
           "`policy/*` metric in the store, which Live curves draws on its next refresh."]
    write_results(args.out, {"benchmark": args.out, "environment": env, "argv": sys.argv, "load_avg_before": load_before,
                             "cases": rows}, "\n".join(md))
    return 0 if all(r["first_curve_point_s"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
