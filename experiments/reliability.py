"""The reliability figures of issue 26, from the tests that assert them: run them, read what they print, one table.

    python experiments/reliability.py            # all of it (~20-40 min on a loaded 2-core machine)
    python experiments/reliability.py --quick    # without the SIGKILL runs and the engine tests on Postgres

- kills survived / tried, entries lost / seen, duplicated metric points and entry outcomes: the random-SIGKILL test
  (tests/test_engine.py), on SQLite and on Postgres;
- sandbox probes contained / tried: each probe test of the SWE sandbox and the env pool (a passed test is a
  contained probe; a skipped one was not tried here, with the reason);
- input mutations handled / tried, by class: tests/test_mutations.py (library import, configs, the store's boundary
  on both back ends, env actions, model answers), the workbench's malformed numbers (tests/test_service.py) and the
  unauthenticated probes of `comprl app --auth` (tests/test_auth.py);
- the Postgres tests: how many ran against the real server and passed.

Writes benchmarks/results/reliability.{json,md}. A Postgres server is needed for its rows (COMPRL_TEST_PG_URL, else
127.0.0.1:5432/test); without one they say skipped.
"""
from __future__ import annotations

import argparse
import ast
import os
import re
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import ROOT, environment, write_results  # noqa: E402

# Each sandbox/pool probe test, and the probe class it stands for (the list).
PROBES = {
    "test_envs_swe.py::test_scripts_run_unprivileged_and_cannot_write_outside_their_copy":
        "root writes outside the copy; fork bomb (as nobody)",
    "test_envs_swe.py::test_agent_code_is_never_root_and_sees_only_the_interpreter_of_roots_home":
        "agent code as root where nobody cannot reach the interpreter",
    "test_envs_swe.py::test_refuses_to_start_where_agent_code_would_run_as_root": "no unprivileged uid: refuse, never root",
    "test_envs_swe.py::test_scratch_folders_are_private_to_the_run": "writes to /tmp, /var/tmp, /dev/shm",
    "test_envs_swe.py::test_no_host_process_can_be_seen_or_signalled": "SIGTERM to a host process",
    "test_envs_swe.py::test_setsid_grandchild_dies_with_its_script_and_does_not_hold_the_step":
        "setsid grandchild outlives its episode / holds the step",
    "test_envs_swe.py::test_timeout_kills_a_setsid_tree_within_the_limit": "endless setsid tree past the timeout",
    "test_envs_swe.py::test_script_timeout_kills_it": "endless loop",
    "test_envs_swe.py::test_memory_cap_and_no_network": "4 GiB allocation; network",
    "test_envs_swe.py::test_memory_is_capped_for_the_tree_not_per_process": "three 700 MB children (tree memory cap)",
    "test_envs_swe.py::test_processes_are_capped_for_the_tree": "300 forks (tree process cap)",
    "test_envs_swe.py::test_disk_is_capped_for_the_episode_folder": "100 MB written into the copy (disk cap)",
    "test_envs_swe.py::test_a_killed_worker_takes_its_running_tree_with_it": "worker killed mid-run orphans its tree",
    "test_envs_swe.py::test_every_timeout_fits_inside_the_pool_step": "judge timeout beyond the pool's step",
    "test_envs_swe.py::test_swe_bench_harness_timeout_kills_its_whole_tree": "swe/bench harness past its timeout",
    "test_envs_swe.py::test_symlinks_are_never_followed": "planted symlinks (grep, cat, submit's copy loop)",
    "test_envs_swe.py::test_temp_folders_of_killed_workers_are_swept": "/tmp/swe_ep_* left by killed workers",
    "test_envs_swe.py::test_agent_tree_cannot_judge_itself": "conftest.py / pytest.ini / pytest.py hacks of the judge",
    "test_envs_swe.py::test_one_worker_pool_a_hung_swe_episode_fails_alone":
        "run.threads: 1, one hung SWE episode (the others replayed)",
    "test_pool.py::test_one_worker_a_hung_episode_fails_alone_and_the_others_are_replayed": "one worker, one hung env",
    "test_pool.py::test_pool_survives_crashing_dying_and_hanging_envs": "env raises / dies / hangs",
    "test_pool.py::test_a_worker_killed_between_calls_loses_no_episode": "worker killed from outside between steps",
}


def pytest(args: list[str], tag: str, workdir: Path) -> tuple[str, dict[str, str], dict[str, str]]:
    """Run pytest; (its output, test id -> passed/failed/skipped, test id -> skip or failure message)."""
    xml = workdir / f"{tag}.xml"
    cmd = [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", f"--junitxml={xml}", *args]
    print("$", " ".join(cmd[1:]), flush=True)
    t0 = time.time()
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    print(f"  {time.time() - t0:.0f} s, exit {res.returncode}", flush=True)
    outcome, why = {}, {}
    if xml.exists():
        for case in ET.parse(xml).getroot().iter("testcase"):
            tid = f"{case.get('classname', '').split('.')[-1]}.py::{case.get('name')}"  # test_x.py::test_y[param]
            kids = {c.tag: c for c in case}
            state = "failed" if ("failure" in kids or "error" in kids) else "skipped" if "skipped" in kids else "passed"
            outcome[tid] = state
            if state != "passed":
                k = kids.get("failure") or kids.get("error") or kids.get("skipped")
                why[tid] = (k.get("message") or "")[:300]
    return res.stdout + res.stderr, outcome, why


KILL = re.compile(r"kills survived/tried (\d+)/(\d+); duplicated metric points (\d+); .*?entries lost (\d+) of (\d+); "
                  r"temp folders (\[.*?\]); entry outcomes (\d+) \(of dropped episodes (\d+), doubled (\d+)\)")
MUT = re.compile(r"^(.+?) mutations handled (\d+)/(\d+) \((.*)\)$", re.M)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="skip the SIGKILL runs and the engine tests on Postgres")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="reliability_"))
    result: dict = {"environment": environment()}

    # 1. sandbox and pool probes
    out, outcome, why = pytest(["tests/test_envs_swe.py", "tests/test_pool.py"], "probes", work)
    probes = []
    for tid, what in PROBES.items():
        cases = [t for t in outcome if t.split("[")[0] == tid]
        states = [outcome[t] for t in cases]
        if not states:
            probes.append({"probe": what, "test": tid, "state": "missing"})
            continue
        state = "failed" if "failed" in states else "skipped" if "skipped" in states else "passed"
        reason = next((why[t] for t in cases if t in why), "")
        probes.append({"probe": what, "test": tid, "state": state, "cases": len(states), "why": reason})
    result["probes"] = probes

    # 2. input mutations (SQLite and Postgres), the workbench's malformed numbers, the unauthenticated probes
    out, outcome, _ = pytest(["tests/test_mutations.py", "tests/test_service.py", "tests/test_auth.py", "-k",
                              "mutations or malformed_ids or nothing_about_the_app"], "mutations", work)
    muts = [{"class": m.group(1), "handled": int(m.group(2)), "tried": int(m.group(3)), "by_kind": m.group(4)}
            for m in MUT.finditer(out)]
    for m in re.finditer(r"workbench \((\w+)\): malformed numbers handled (\d+)/(\d+)", out):
        muts.append({"class": f"workbench ids/versions/counts ({m.group(1)})", "handled": int(m.group(2)),
                     "tried": int(m.group(3)), "by_kind": ""})
    for m in re.finditer(r"unauthenticated probes (\d+), leaks (\[.*?\])$", out, re.M):
        leaked = {p for p, *_ in ast.literal_eval(m.group(2))}  # (path, status, what leaked) per leak
        muts.append({"class": "workbench requests before login (--auth)", "handled": int(m.group(1)) - len(leaked),
                     "tried": int(m.group(1)), "by_kind": "paths that served nothing about the app"})
    result["mutations"] = muts
    result["mutation_tests"] = {k: v for k, v in outcome.items()}

    # 3. SIGKILLs on SQLite, and every Postgres variant (the SIGKILL run included)
    kills = []
    if not args.quick:
        out, outcome, _ = pytest(["tests/test_engine.py", "-k", "random_sigkills and sqlite"], "kills_sqlite", work)
        for m in KILL.finditer(out):
            kills.append({"backend": "sqlite", **dict(zip(["survived", "tried", "dup_points", "lost", "seen", "temp",
                                                            "outcomes", "orphan_outcomes", "doubled_outcomes"],
                                                           m.groups()))})
    pg_files = ["tests/test_store.py", "tests/test_library_io.py", "tests/test_manager.py", "tests/test_service.py",
                "tests/test_mutations.py"] + ([] if args.quick else ["tests/test_engine.py"])
    out, outcome, why = pytest([*pg_files, "-k", "postgres"], "postgres", work)
    for m in KILL.finditer(out):
        kills.append({"backend": "postgres", **dict(zip(["survived", "tried", "dup_points", "lost", "seen", "temp",
                                                          "outcomes", "orphan_outcomes", "doubled_outcomes"], m.groups()))})
    result["kills"] = kills
    counts = {s: sum(v == s for v in outcome.values()) for s in ("passed", "failed", "skipped")}
    per_file: dict[str, dict[str, int]] = {}
    for t, s in outcome.items():
        f = t.split("::")[0]
        per_file.setdefault(f, {"passed": 0, "failed": 0, "skipped": 0})[s] += 1
    result["postgres"] = {"counts": counts, "per_file": per_file,
                          "skipped": {t: why.get(t, "") for t, s in outcome.items() if s == "skipped"}}

    # the table
    md = ["| figure | value |", "|---|---|"]
    for k in kills:
        md.append(f"| kills survived / tried ({k['backend']}) | {k['survived']} / {k['tried']} |")
        md.append(f"| entries lost / seen before a kill ({k['backend']}) | {k['lost']} / {k['seen']} |")
        md.append(f"| duplicated metric points; entry outcomes of dropped episodes; doubled outcomes ({k['backend']}) | "
                  f"{k['dup_points']}; {k['orphan_outcomes']} of {k['outcomes']}; {k['doubled_outcomes']} |")
        md.append(f"| temp checkpoint folders left ({k['backend']}) | {k['temp']} |")
    contained = sum(p["state"] == "passed" for p in probes)
    tried = sum(p["state"] in ("passed", "failed") for p in probes)
    md.append(f"| sandbox and pool probes contained / tried | {contained} / {tried} "
              f"({sum(p['state'] == 'skipped' for p in probes)} not tried here) |")
    for m in muts:
        md.append(f"| input mutations handled / tried: {m['class']} | {m['handled']} / {m['tried']} |")
    c = result["postgres"]["counts"]
    md.append(f"| tests run against Postgres: passed / failed / skipped | {c['passed']} / {c['failed']} / {c['skipped']} |")
    md += ["", "Probes:", "", "| probe | test | result |", "|---|---|---|"]
    for p in probes:
        md.append(f"| {p['probe']} | `{p['test'].split('::')[1]}` | {p['state']}"
                  f"{(': ' + p['why'][:120]) if p.get('why') and p['state'] != 'passed' else ''} |")
    md += ["", "Mutations by kind:", ""]
    md += [f"- {m['class']}: {m['by_kind']}" for m in muts if m["by_kind"]]
    md += ["", "Postgres tests passed per file: " + ", ".join(f"{f} {v['passed']}" for f, v in sorted(per_file.items()))]
    md += [f"- skipped on Postgres: `{t}`: {w[:150]}" for t, w in result["postgres"]["skipped"].items()]
    write_results("reliability", result, "\n".join(md))


if __name__ == "__main__":
    main()
