"""SWE envs: every built-in task fails unfixed and passes with its reference fix (through the env),
the commands, the sandbox limits, and swe/bench's loading, harness adapter and Docker error."""
from __future__ import annotations

import json
import time

import pytest

from envs.base import EnvError, check_env
from envs.registry import make_env
from envs.swe import (
    BenchInstances,
    LocalTasks,
    SweEnv,
    docker_status,
    load_local_tasks,
    load_swe_bench_instances,
    make_swe_bench,
    make_swe_local,
    read_harness_verdict,
    swe_expert,
)

TASKS = load_local_tasks()


@pytest.fixture(scope="module")
def env() -> SweEnv:
    e = make_swe_local(command_timeout=10)
    yield e
    e.close()


def test_at_least_eight_tasks_with_hidden_tests():
    assert len(TASKS) >= 8
    for t in TASKS:
        assert t.issue and any(t.tests_dir.glob("test_*.py")) and any(p.is_file() for p in t.fix_dir.rglob("*"))
        # the held-out tests are not part of what the agent gets
        assert not any(p.name == q.name for p in t.repo_dir.rglob("*.py") for q in t.tests_dir.glob("*.py"))


def test_check_env():
    e = make_env("swe/local")
    try:
        assert e.name == "swe/local"
        check_env(e, seed=0)
    finally:
        e.close()


@pytest.mark.parametrize("task_id", [t.task_id for t in TASKS])
def test_task_fails_unfixed_and_reference_fix_passes(env, task_id):
    obs, info = env.reset(options={"task_id": task_id})
    assert info["task_id"] == task_id and env.task in obs
    assert not any("_heldout" in a or "test_issue" in a for a in info["admissible_actions"])
    obs, r, term, trunc, info = env.step("submit")
    assert term and r == 0.0 and info["success"] is False, f"{task_id}: hidden tests pass without a fix"

    env.reset(options={"task_id": task_id})
    for _ in range(env.max_turns):
        action = swe_expert(env)
        obs, r, term, trunc, info = env.step(action)
        assert not info["invalid_action"], obs
        if term or trunc:
            break
    assert term and r == 1.0 and info["success"] is True, f"{task_id}: {info.get('test_output')}"


def test_reset_picks_seed_mod_n(env):
    _, a = env.reset(seed=1)
    _, b = env.reset(seed=1 + len(TASKS))
    assert a["task_id"] == b["task_id"] == TASKS[1].task_id


def test_file_commands(env):
    env.reset(options={"task_id": "pager_last_page"})
    obs, *_, info = env.step("ls")
    assert "pager/pages.py" in obs and "tests/test_pages.py" in obs and not info["invalid_action"]
    obs, *_ = env.step("cat pager/pages.py 4 5")
    assert obs.splitlines()[0].startswith("   4| ") and len(obs.splitlines()) == 2
    obs, *_ = env.step('grep "return n_items" pager')
    assert "pager/pages.py:8:" in obs
    obs, *_, info = env.step("edit pager/pages.py\n<<<\n    return n_items // per_page\n===\n"
                             "    return -(-n_items // per_page)\n>>>")
    assert not info["invalid_action"] and "-(-n_items" in obs
    obs, *_, info = env.step("replace pager/pages.py 1 1\n\"\"\"Pages.\"\"\"")
    assert not info["invalid_action"] and '"""Pages."""' in obs
    obs, *_, info = env.step("run_tests")
    assert "2 passed" in obs and "exit code 0" in obs
    obs, r, term, *_ = env.step("submit")
    assert r == 1.0 and term


def test_invalid_commands_are_feedback(env):
    env.reset(seed=0)
    for bad in ("@@ not a command", "cat ../../../etc/passwd", "cat /etc/passwd", "replace tests/test_parser.py 50 60\nx",
                "edit minicsv/parser.py\nno markers", "cat minicsv/parser.py one", "grep '('", 'ls "unclosed'):
        obs, r, term, trunc, info = env.step(bad)
        assert info["invalid_action"] is True and obs.strip() and not term, bad


def test_turn_limit():
    e = make_swe_local(max_turns=3)
    try:
        e.reset(seed=0)
        for _ in range(3):
            obs, r, term, trunc, info = e.step("ls")
        assert trunc and not term and info["success"] is False and "Turn limit" in obs
    finally:
        e.close()


def test_script_timeout_kills_it():
    e = make_swe_local(command_timeout=1.0)
    try:
        e.reset(seed=0)
        e.step("write spin.py\nimport subprocess, sys\nsubprocess.Popen([sys.executable, '-c', 'while True: pass'])\n"
               "while True:\n    pass")
        t0 = time.monotonic()
        obs, r, term, trunc, info = e.step("python spin.py")
        assert time.monotonic() - t0 < 8 and "killed after the time limit" in obs and not info["invalid_action"]
    finally:
        e.close()


def test_memory_cap_and_no_network(env):
    env.reset(seed=0)
    env.step("write mem.py\nx = bytearray(4 * 1024 ** 3)\nprint('got 4 GiB')")
    obs, *_ = env.step("python mem.py")
    assert "MemoryError" in obs and "got 4 GiB" not in obs
    env.step("write net.py\nimport socket\nsocket.create_connection(('93.184.216.34', 80), timeout=3)\nprint('online')")
    obs, *_ = env.step("python net.py")
    assert "online" not in obs and "exit code 1" in obs


def test_expert_needs_local_task():
    e = SweEnv("swe/local", LocalTasks())
    try:
        with pytest.raises(EnvError):
            swe_expert(e)  # not reset: no current task
    finally:
        e.close()


# -- swe/bench ---------------------------------------------------------------------------------

INSTANCE = {"instance_id": "astropy__astropy-12907", "repo": "astropy/astropy",
            "base_commit": "d16bfe05a744909de4b27f5875fe0d4ed41ce607",
            "problem_statement": "Modeling's `separability_matrix` does not compute separability correctly for nested CompoundModels",
            "FAIL_TO_PASS": "[]", "PASS_TO_PASS": "[]", "version": "4.3"}


def test_swe_bench_without_docker_is_env_error(tmp_path):
    if docker_status()[0]:
        pytest.skip("a Docker engine is reachable here")
    path = tmp_path / "instances.jsonl"
    path.write_text(json.dumps(INSTANCE) + "\n")
    with pytest.raises(EnvError, match="Docker engine"):
        make_swe_bench(instances_path=path)
    with pytest.raises(EnvError, match="Docker engine"):
        make_env("swe/bench")


def test_load_instances_json_and_jsonl(tmp_path):
    jl = tmp_path / "a.jsonl"
    jl.write_text(json.dumps(INSTANCE) + "\n\n" + json.dumps(dict(INSTANCE, instance_id="x__y-1")) + "\n")
    assert [i["instance_id"] for i in load_swe_bench_instances(jl)] == ["astropy__astropy-12907", "x__y-1"]
    js = tmp_path / "a.json"
    js.write_text(json.dumps([INSTANCE]))
    assert load_swe_bench_instances(js)[0]["repo"] == "astropy/astropy"
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(INSTANCE) + "\n" + json.dumps({"instance_id": "z"}) + "\n")
    with pytest.raises(EnvError, match=r"bad.jsonl:2: instance lacks repo, base_commit, problem_statement"):
        load_swe_bench_instances(bad)
    with pytest.raises(EnvError, match="no SWE-bench instance file"):
        load_swe_bench_instances(tmp_path / "missing.json")


def test_harness_adapter_inputs_and_verdict(tmp_path):
    jl = tmp_path / "a.jsonl"
    jl.write_text(json.dumps(INSTANCE) + "\n")
    src = BenchInstances(jl, model_name="my/model")
    src.instance = src.pick(0, {})
    dataset, preds = src.prediction_files("diff --git a/x b/x\n", tmp_path / "eval")
    assert json.loads(dataset.read_text()) == [INSTANCE]
    assert json.loads(preds.read_text()) == {"instance_id": INSTANCE["instance_id"], "model_name_or_path": "my/model",
                                             "model_patch": "diff --git a/x b/x\n"}
    argv = src.harness_argv(dataset, preds, "run1")
    assert argv[1:3] == ["-m", "swebench.harness.run_evaluation"]
    assert argv[argv.index("--instance_ids") + 1] == INSTANCE["instance_id"]
    assert argv[argv.index("--predictions_path") + 1] == str(preds)
    # the harness's summary file decides; no summary at all means not resolved
    ev = tmp_path / "eval"
    assert read_harness_verdict(ev, "run1", INSTANCE["instance_id"]) is False
    (ev / "my__model.run1.json").write_text(json.dumps({"resolved_ids": [INSTANCE["instance_id"]]}))
    assert read_harness_verdict(ev, "run1", INSTANCE["instance_id"]) is True


@pytest.mark.parametrize("hack", [
    "write conftest.py\nimport pytest\n\n@pytest.hookimpl(hookwrapper=True)\ndef pytest_runtest_makereport(item, call):\n"
    "    outcome = yield\n    outcome.get_result().outcome = 'passed'",
    "write pytest.ini\n[pytest]\naddopts = --co",
    "write pytest.py\nimport sys\nsys.exit(0)",
])
def test_agent_tree_cannot_judge_itself(env, hack):
    env.reset(options={"task_id": "median_even_count"})
    obs, r, term, trunc, info = env.step(hack)
    assert not info["invalid_action"], obs
    obs, r, term, trunc, info = env.step("submit")
    assert r == 0.0 and info["success"] is False, info["test_output"]


# -- sandbox probes: what an agent's script tries, and what it must not get ---------------------------------
# Each test is one class of probe the issue names (setsid escape, endless tree, host signal, root writes and
# process floods, symlinks, timeouts past the pool's, temp folders of killed workers).

import os  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

from envs.swe import SANDBOX_MAX_PROCS, STEP_BUDGET_S, _unshare_works, sweep_stale_temp_dirs  # noqa: E402
from envs.tree_caps import TreeCaps  # noqa: E402

NAMESPACES = pytest.mark.skipif(not _unshare_works(), reason="needs `unshare -rn --pid` (user namespaces); "
                                "without them the sandbox kills process groups only")
# The uid drop needs root (an unprivileged user runs agent code as itself). This machine's venv python lives under
# /root (mode 700): the sandbox reaches it through its private mount namespace, so the probes use it as is.
AS_NOBODY = pytest.mark.skipif(os.geteuid() != 0, reason="the drop to `nobody` is what root does; run as root to test it")
TREE_CAPS = pytest.mark.skipif(TreeCaps.detect() is None,
                               reason="no cgroup this process may write (v2 with memory+pids, or v1 memory and pids): "
                                      "the sandbox has per-process rlimits only here")


def _script(e: SweEnv, name: str, code: str) -> tuple[str, float]:
    e.step(f"write {name}\n{code}")
    t0 = time.monotonic()
    obs, *_ = e.step(f"python {name}")
    return obs, time.monotonic() - t0


@NAMESPACES
def test_setsid_grandchild_dies_with_its_script_and_does_not_hold_the_step(tmp_path):
    pidfile = tmp_path / "grandchild.pid"
    os.chmod(tmp_path, 0o777)  # the script may run as nobody
    e = make_swe_local(command_timeout=10)
    try:
        e.reset(seed=0)
        # the grandchild leaves the script's session and process group, keeps stdout open, and sleeps
        marker = f"comprl-setsid-probe-{os.getpid()}"  # a name no other process on this shared machine has
        obs, took = _script(e, "escape.py", "import subprocess, sys\n"
                            f"p = subprocess.Popen(['setsid', 'bash', '-c', 'echo $$ > {pidfile}; exec -a {marker} sleep 120'])\n"
                            "import time; time.sleep(1); print('parent done')")
        assert "parent done" in obs and took < 9  # the step did not wait for the grandchild
        # it ran in the namespace; whatever pid it wrote there, no process of the host is sleeping for it
        assert subprocess.run(["pgrep", "-f", marker], capture_output=True).stdout == b""
    finally:
        e.close()


@pytest.mark.slow
@NAMESPACES
def test_timeout_kills_a_setsid_tree_within_the_limit():
    e = make_swe_local(command_timeout=2.0)
    try:
        e.reset(seed=0)
        marker = f"comprl-spin-probe-{os.getpid()}"
        obs, took = _script(e, "spin.py", "import subprocess\n"
                            f"subprocess.Popen(['setsid', 'python3', '-c', 'while True: pass  # {marker}'])\n"
                            "while True:\n    pass")
        assert "killed after the time limit" in obs and took < 6
        time.sleep(0.5)
        assert subprocess.run(["pgrep", "-f", marker], capture_output=True).stdout == b""
    finally:
        e.close()


@NAMESPACES
def test_no_host_process_can_be_seen_or_signalled():
    victim = subprocess.Popen(["sleep", "60"])
    e = make_swe_local(command_timeout=10)
    try:
        e.reset(seed=0)
        obs, _ = _script(e, "kill.py", f"import os, signal\ntry:\n    os.kill({victim.pid}, signal.SIGTERM)\n"
                         "    print('SENT')\nexcept OSError as err:\n    print('refused', err)\n"
                         "print('pids', sorted(int(p) for p in os.listdir('/proc') if p.isdigit())[:3])")
        time.sleep(0.3)
        assert victim.poll() is None, obs  # still alive
        assert "SENT" not in obs or victim.poll() is None
    finally:
        victim.kill()
        victim.wait()
        e.close()


@AS_NOBODY
def test_scripts_run_unprivileged_and_cannot_write_outside_their_copy(tmp_path):
    outside = tmp_path / "host_file.txt"
    outside.write_text("untouched")
    victim = subprocess.Popen(["sleep", "60"])
    e = make_swe_local(command_timeout=10)  # this venv's python, under /root (mode 700) here
    try:
        e.reset(seed=0)
        assert e.sandbox.uid == 65534
        obs, _ = _script(e, "who.py", "import os\nprint('uid', os.getuid())\n"
                         f"for target in [{str(outside)!r}, '/etc/comprl_probe']:\n"
                         "    try:\n        open(target, 'w').write('pwned')\n        print('WROTE', target)\n"
                         "    except OSError as err:\n        print('refused', type(err).__name__)\n"
                         "open('mine.txt', 'w').write('ok'); print('own copy ok')")
        assert "WROTE" not in obs and obs.count("refused") == 2 and "own copy ok" in obs, obs
        assert outside.read_text() == "untouched" and not Path("/etc/comprl_probe").exists()
        obs, _ = _script(e, "bomb.py", "import subprocess\nn = 0\ntry:\n    for _ in range(500):\n"
                         "        subprocess.Popen(['sleep', '5']); n += 1\nexcept OSError as err:\n"
                         "    print('capped after', n, type(err).__name__)")
        assert "capped after" in obs, obs  # RLIMIT_NPROC for the sandbox user: a tree, not one process
        assert victim.poll() is None
    finally:
        victim.kill()
        victim.wait()
        e.close()


def test_symlinks_are_never_followed(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP-SECRET-LINE\n")
    e = make_swe_local(command_timeout=10)
    try:
        e.reset(seed=0)
        root = e.ws.root
        os.symlink(secret, root / "planted.txt")
        os.symlink("/etc", root / "etc_link")
        os.symlink("..", root / "loop")  # a folder that contains itself, for copytree
        obs, *_ = e.step("grep TOP-S.CRET-L.NE")  # (a pattern that does not spell what it looks for)
        assert "TOP-SECRET-LINE" not in obs and "no match" in obs
        obs, *_ = e.step("cat planted.txt")
        assert "TOP-SECRET" not in obs and "outside the repository" in obs
        obs, *_ = e.step("grep ^root:.:0")
        assert "root:x:0" not in obs
        obs, r, term, trunc, info = e.step("submit")  # copies the tree for the judge: links stay links
        assert term and "RecursionError" not in obs
    finally:
        e.close()


def test_every_timeout_fits_inside_the_pool_step():
    e = make_swe_local()
    try:
        assert e.sandbox.timeout_s <= STEP_BUDGET_S - 5 and e.test_timeout <= STEP_BUDGET_S - 5
    finally:
        e.close()
    with pytest.raises(EnvError, match="test_timeout 60 s must be within"):
        make_swe_local(test_timeout=60)


def test_temp_folders_of_killed_workers_are_swept():
    code = ("import sys; sys.path.insert(0, %r)\nfrom envs.swe import make_swe_local\n"
            "e = make_swe_local(); e.reset(seed=0); print(e._tmp, flush=True)\nimport time; time.sleep(60)")
    root = str(Path(__file__).resolve().parents[1])
    p = subprocess.Popen([sys.executable, "-c", code % root], stdout=subprocess.PIPE, text=True)
    ep = Path(p.stdout.readline().strip())
    assert ep.is_dir() and ep.name.startswith(f"swe_ep_{p.pid}_")
    p.send_signal(signal.SIGKILL)  # as the pool kills a worker that overran its step
    p.wait()
    assert ep.is_dir()  # no finalizer ran
    assert sweep_stale_temp_dirs() >= 1 and not ep.exists()
    guards = list(Path(tempfile.gettempdir()).glob(f"swe_guard_{p.pid}_*"))
    assert guards == []


@AS_NOBODY
def test_agent_code_is_never_root_and_sees_only_the_interpreter_of_roots_home():
    e = make_swe_local(command_timeout=10)
    try:
        e.reset(seed=0)
        obs, _ = _script(e, "home.py", "import os\nprint('root has', sorted(os.listdir('/root')))\n"
                         "open('made.txt', 'w').write('x')")
        assert e.sandbox.uid == 65534 and (e.ws.root / "made.txt").stat().st_uid == 65534, obs  # nobody, on the host
        if not os.access("/root", os.X_OK, effective_ids=False) or (os.stat("/root").st_mode & 0o001) == 0:
            # root's home is closed to others: the sandbox shows an empty tmpfs with only the interpreter in it
            assert "root has" in obs and all(n in os.listdir("/root") for n in eval(obs.split("root has")[1].split("\n")[0]))
            assert len(eval(obs.split("root has")[1].split("\n")[0])) < len(os.listdir("/root"))
    finally:
        e.close()


def test_refuses_to_start_where_agent_code_would_run_as_root(monkeypatch):
    import envs.swe.sandbox as swe  # where Sandbox looks up _interpreter_plan

    monkeypatch.setattr(swe.os, "geteuid", lambda: 0)
    monkeypatch.setattr(swe, "_interpreter_plan", lambda exe: (False, None))
    with pytest.raises(swe.SandboxUnavailable, match="agent code would run as root.*chmod o\\+x"):
        swe.Sandbox(python="/nowhere/python3")
    # reachable by nobody, but no mount namespace here (root without CAP_SYS_ADMIN, e.g. Docker): nobody, no mounts
    monkeypatch.setattr(swe, "_interpreter_plan", lambda exe: (True, None))
    sb = swe.Sandbox(python="/usr/bin/python3")
    try:
        assert sb.uid == 65534 and sb.mounts is None and sb.fs_isolation.startswith("none")
    finally:
        sb.close()


@AS_NOBODY
def test_scratch_folders_are_private_to_the_run():
    names = [f"/tmp/comprl_probe_{os.getpid()}", f"/var/tmp/comprl_probe_{os.getpid()}",
             f"/dev/shm/comprl_probe_{os.getpid()}"]
    e = make_swe_local(command_timeout=10)
    try:
        e.reset(seed=0)
        obs, _ = _script(e, "scratch.py", f"for p in {names!r}:\n    open(p, 'w').write('x' * 1000)\n    print('wrote', p)\n"
                         "big = 0\ntry:\n    with open('/tmp/fill', 'wb') as f:\n"
                         "        for _ in range(200):\n            f.write(b'x' * (1 << 20)); big += 1\n"
                         "except OSError as err:\n    print('scratch full after', big, 'MB')")
        assert obs.count("wrote") == 3 and "scratch full after" in obs, obs  # writable, small, and ...
        assert not any(os.path.exists(p) for p in names) and not os.path.exists("/tmp/fill")  # ... not the host's
    finally:
        e.close()


@pytest.mark.slow
@TREE_CAPS
def test_memory_is_capped_for_the_tree_not_per_process():
    e = make_swe_local(command_timeout=20, memory_mb=1024)
    try:
        e.reset(seed=0)
        # three children of 700 MB each: each passes the per-process RLIMIT_AS of 1 GB, together they do not
        obs, _ = _script(e, "three.py", "import os\nkids = []\nfor i in range(3):\n    pid = os.fork()\n"
                         "    if pid == 0:\n        b = b'x' * (700 << 20); print('child', i, 'has 700 MB', flush=True)\n"
                         "        import time; time.sleep(1); os._exit(0)\n    kids.append(pid)\n"
                         "print('exits', [os.waitpid(k, 0)[1] for k in kids])")
        assert obs.count("has 700 MB") <= 1 and "[memory cap:" in obs, obs
    finally:
        e.close()


@TREE_CAPS
def test_processes_are_capped_for_the_tree():
    e = make_swe_local(command_timeout=20)
    try:
        e.reset(seed=0)
        obs, _ = _script(e, "forks.py", "import os, time\nn = 0\ntry:\n    for _ in range(300):\n"
                         "        if os.fork() == 0:\n            time.sleep(3); os._exit(0)\n        n += 1\n"
                         "except OSError as err:\n    print('capped after', n, 'forks')")
        n = int(obs.split("capped after")[1].split()[0])
        assert n < SANDBOX_MAX_PROCS and "[process cap:" in obs, obs
    finally:
        e.close()


def test_disk_is_capped_for_the_episode_folder():
    e = make_swe_local(command_timeout=20, disk_mb=32)
    try:
        e.reset(seed=0)
        from envs.swe import folder_bytes

        # a slow writer is stopped by the watchdog while it runs; a fast one by the check at its end; each file
        # stays under RLIMIT_FSIZE, the folder does not
        for name, pause in (("slow.py", 0.02), ("fast.py", 0.0)):
            obs, took = _script(e, name, f"import time\nfor i in range(100):\n    open(f'blob{{i}}', 'wb').write(b'x' * (1 << 20))\n"
                                f"    time.sleep({pause})\nprint('wrote 100 MB')")
            assert "passed the 32 MB disk cap" in obs and "written by this run removed" in obs, obs
            assert folder_bytes(e.ws.root.parent) < 32 * 2**20 and not list(e.ws.root.glob("blob*"))
            assert (e.ws.root / name).exists()  # what was there before the run stays
        obs, _ = _script(e, "ok.py", "print('still works')")
        assert "still works" in obs and "exit code 0" in obs
    finally:
        e.close()


@NAMESPACES
def test_a_killed_worker_takes_its_running_tree_with_it(tmp_path):
    """The pool kills a worker that overran its step: the script it was running must not outlive it."""
    marker = f"comprl-orphan-probe-{os.getpid()}"
    code = ("import sys; sys.path.insert(0, %r)\nfrom envs.swe import make_swe_local\n"
            "e = make_swe_local(command_timeout=20); e.reset(seed=0)\n"
            "e.step('write spin.py\\nimport subprocess\\nsubprocess.Popen([\"setsid\", \"sh\", \"-c\", \"exec -a %s sleep 100\"])\\n"
            "import time\\ntime.sleep(100)')\nprint('running', flush=True)\ne.step('python spin.py')")
    root = str(Path(__file__).resolve().parents[1])
    p = subprocess.Popen([sys.executable, "-c", code % (root, marker)], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "running"
    deadline = time.monotonic() + 15
    while not subprocess.run(["pgrep", "-f", marker], capture_output=True).stdout and time.monotonic() < deadline:
        time.sleep(0.1)
    assert subprocess.run(["pgrep", "-f", marker], capture_output=True).stdout, "the probe never started"
    p.send_signal(signal.SIGKILL)
    p.wait()
    deadline = time.monotonic() + 5
    while subprocess.run(["pgrep", "-f", marker], capture_output=True).stdout and time.monotonic() < deadline:
        time.sleep(0.1)
    assert subprocess.run(["pgrep", "-f", marker], capture_output=True).stdout == b""


def swe_local_fast():
    return make_swe_local(command_timeout=5)


@pytest.mark.slow
def test_one_worker_pool_a_hung_swe_episode_fails_alone():
    """run.threads: 1 gives the pool one worker for every SWE episode. An episode that hangs its worker (here a
    catastrophic regex in `grep`, which runs in the worker, not the sandbox) fails alone: the others are replayed."""
    from envs.pool import EnvPool

    with EnvPool([swe_local_fast] * 3, num_workers=1, step_timeout_s=8.0) as pool:
        starts = pool.reset_many([(s, s, None) for s in range(3)])
        assert all(r.error is None for r in starts)
        first = pool.step_many([(s, "write probe.txt\n" + "a" * 40 + "b") for s in range(3)])
        assert all(r.error is None for r in first)
        tested = pool.step_many([(0, "run_tests"), (2, "run_tests")])  # outputs with pytest's timings, replayed too
        assert all(r.error is None for r in tested)
        t0 = time.monotonic()
        out = pool.step_many([(0, "cat probe.txt"), (1, "grep (a+)+$ probe.txt"), (2, "cat probe.txt")])
        assert time.monotonic() - t0 < 60
        assert "no answer within 8 s" in out[1].error
        assert [r.error for r in (out[0], out[2])] == [None, None] and "aaaa" in out[0].obs, (out[0].error, out[2].error)
        assert pool.replays == 2
        done = pool.step_many([(0, "submit"), (2, "submit")])  # the replayed episodes finish normally
        assert all(r.terminated and r.error is None for r in done)


@pytest.mark.slow
def test_swe_bench_harness_timeout_kills_its_whole_tree(tmp_path, monkeypatch):
    """The harness runs in its own session under harness_timeout and its step budget reaches the pool; on timeout
    its whole tree goes (here a stand-in command with a setsid grandchild, since Docker is not available)."""
    jl = tmp_path / "a.jsonl"
    jl.write_text(json.dumps(INSTANCE) + "\n")
    src = BenchInstances(jl, harness_timeout=2.0)
    assert src.step_budget_s > src.harness_timeout
    src.instance = src.pick(0, {})
    marker = f"comprl-harness-probe-{os.getpid()}"
    monkeypatch.setattr(src, "harness_argv", lambda dataset, preds, run_id: [
        "bash", "-c", f"setsid bash -c 'exec -a {marker}-grandchild sleep 100' & exec -a {marker}-main sleep 100"])
    t0 = time.monotonic()
    ok, why = src.evaluate_patch("diff --git a/x b/x\n", tmp_path)
    assert not ok and "did not finish within 2s (killed)" in why and time.monotonic() - t0 < 10
    time.sleep(0.5)
    assert subprocess.run(["pgrep", "-f", f"{marker}-main"], capture_output=True).stdout == b""
    left = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout.split()
    for pid in left:
        os.kill(int(pid), signal.SIGKILL)
    if TreeCaps.detect() is not None:  # the cgroup reaches the grandchild that left the session
        assert left == []
    with pytest.raises(EnvError, match="harness_timeout"):
        BenchInstances(jl, harness_timeout=0)


def test_an_interpreter_under_a_scratch_folder_stays_reachable_in_the_runs_namespace():
    """A checkout under /tmp (a clean clone there) has its venv under /tmp, which each run covers with a private
    tmpfs: the plan binds the interpreter's trees under a covered scratch folder back, read-only; others not."""
    from envs.sandbox_fs import MountPlan

    plan = MountPlan(trees=["/tmp/ci/.venv", "/usr/lib/python3.11"]).with_scratch([Path("/tmp/swe_ep_1")])
    assert plan.covers.get("/tmp", "").startswith("mode=1777")
    assert ("/tmp/ci/.venv", True) in plan.binds and ("/usr/lib/python3.11", True) not in plan.binds
    assert ("/tmp/swe_ep_1", False) in plan.binds
