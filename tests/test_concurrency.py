"""The workbench under concurrent requests: the first library page loads and semantic searches at once.

Measured before the locks (app/service/common.py ENV_LOCK, Workbench.searching): 20 library pages and 20 searches at
once on a library of entries not yet embedded killed the process (SIGSEGV, NLE's "library /proc/self/fd/N is already
loaded": two threads building the entry checker's MiniHack envs). The burst runs in a child process on the real
Workbench the UI calls (real embedder, real MiniHack, SQLite on disk), so a crash is this test's failure, not the end of
the test session.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENV = "minihack/Room-Ultimate-5x5"
N_ENTRIES, N_THREADS, K = 60, 20, 10

# The child: a Workbench on DATA, the library imported through the UI's import path (no embeddings), then N_THREADS
# library pages and N_THREADS searches released together by one barrier. Prints one JSON line of what each returned.
CHILD = r"""
import json, sys, threading
from app.service import Workbench
data, lib, n, k = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
wb = Workbench(data)
msg = wb.import_file(lib, True)
missing_before = len(wb.store.missing_embeddings())
go = threading.Barrier(2 * n)
out = {"import": msg, "missing_before": missing_before, "pages": [], "searches": [], "errors": []}

def page(i):
    go.wait()
    try:
        df, info = wb.library_page(sort="id", descending=bool(i % 2))
        out["pages"].append({"rows": len(df), "info": info, "claims": sorted(set(df["claim"]))})
    except Exception as e:
        out["errors"].append(f"page: {type(e).__name__}: {e}")

def search(i):
    go.wait()
    try:
        df, info = wb.semantic_search(f"where is the staircase down, try {i}", None, k)
        out["searches"].append({"rows": len(df), "info": info, "scored": bool(df["score"].between(-1, 1).all())})
    except Exception as e:
        out["errors"].append(f"search: {type(e).__name__}: {e}")

threads = [threading.Thread(target=page, args=(i,)) for i in range(n)] + [
    threading.Thread(target=search, args=(i,)) for i in range(n)]
for t in threads:
    t.start()
for t in threads:
    t.join()
out["missing_after"] = len(wb.store.missing_embeddings())
wb.close()
print("RESULT " + json.dumps(out))
"""


def _library_file(path: Path) -> Path:
    """N_ENTRIES entries of 12 recurring dark rooms, each claiming where the staircase is (so the entry checker plays
    the levels), plus a few with no claim; no embeddings: the first search and sync embed them."""
    lines = []
    for i in range(N_ENTRIES):
        task = f"Dungeon {i % 12}: Find the staircase down (>) and go down it."
        claim = (f"The staircase down (>) is {i % 3 + 1} south and {i % 2 + 1} east of your starting square."
                 if i % 5 else "Walk along the walls until the staircase shows up.")
        lines.append(json.dumps({"text": f"Lesson {i}: {claim}", "env": ENV, "task": task, "query": task}))
    path.write_text("\n".join(lines) + "\n")
    return path


def test_first_pages_and_searches_at_once_on_an_unembedded_library(tmp_path):
    lib = _library_file(tmp_path / "library.jsonl")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-X", "faulthandler", "-c", CHILD, str(tmp_path / "data"), str(lib),
                           str(N_THREADS), str(K)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"the workbench process died (exit {proc.returncode}):\n{proc.stderr[-4000:]}"
    out = json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("RESULT "))[len("RESULT "):])
    assert out["import"].startswith("**OK**") and f"imported {N_ENTRIES} entries" in out["import"]
    assert out["missing_before"] == N_ENTRIES  # the burst met a library none of whose entries was embedded
    assert out["errors"] == []
    assert len(out["pages"]) == N_THREADS and len(out["searches"]) == N_THREADS
    for p in out["pages"]:
        assert p["rows"] == 50 and p["info"].startswith(f"entries 1–50 of {N_ENTRIES}")
        assert {"right", "WRONG", "no claim"} & set(p["claims"])  # the checker played the levels
    for s in out["searches"]:
        assert s["rows"] == K and s["scored"] and "closest in meaning" in s["info"]
    assert out["missing_after"] == 0


def test_the_workbench_serves_below_the_runs_it_starts():
    """serve_below_runs lowers the serving thread's priority (and its later threads'), while runs fork from the
    launcher thread at the priority the workbench started with (Linux: a priority is per thread, inherited on fork)."""
    import os
    import subprocess
    import sys
    import threading

    from app.service.runs import LAUNCHER, serve_below_runs

    base = os.getpriority(os.PRIO_PROCESS, 0)
    seen: dict[str, int] = {}

    def serving_thread() -> None:
        seen["serving"] = serve_below_runs(5)
        t = threading.Thread(target=lambda: seen.__setitem__("later", os.nice(0)))
        t.start()
        t.join()
        p = LAUNCHER.popen([sys.executable, "-c", "import os; print(os.nice(0))"], stdout=subprocess.PIPE, text=True)
        seen["run"] = int(p.communicate(timeout=60)[0])

    t = threading.Thread(target=serving_thread)
    t.start()
    t.join(timeout=120)
    assert seen["serving"] == min(19, base + 5) and seen["later"] == seen["serving"]  # requests' threads yield
    assert seen["run"] == base  # a run keeps the workbench's starting priority
    assert os.getpriority(os.PRIO_PROCESS, 0) == base  # this (the test's) thread is untouched
