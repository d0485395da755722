"""Last round's sandbox leftovers (issue 40 item 6): agent code never runs as root wherever the venv lies, and the
cgroup v2 path of the tree caps where the kernel offers it (else a skip that prints why)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from envs.tree_caps import TreeCaps, _mounts


@pytest.fixture()
def venv_under_root():
    """A real venv in a fresh folder of /root (root's home, mode 700 on Debian): its interpreter, its site-packages
    and its pyvenv.cfg are somewhere `nobody` cannot look, unless the sandbox makes them reachable."""
    if os.geteuid() != 0:
        print("skipped: the drop to `nobody` is what root does; run as root to test it")
        pytest.skip("the drop to `nobody` is what root does; run as root to test it")
    home = Path("/root")
    folder = home / f".comprl-test-venv-{uuid.uuid4().hex[:8]}"
    r = subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], capture_output=True, text=True,
                       timeout=120)
    if r.returncode:
        pytest.skip(f"could not make a venv under /root: {r.stderr.strip()[-300:]}")
    try:
        yield folder / "bin" / "python"
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.slow
def test_agent_code_from_a_venv_under_root_runs_as_nobody_never_root(venv_under_root, tmp_path):
    from envs.swe.sandbox import SANDBOX_UID, Sandbox, SandboxUnavailable

    mode = oct(Path("/root").stat().st_mode & 0o777)
    try:
        sb = Sandbox(timeout_s=15, python=str(venv_under_root))
    except SandboxUnavailable as e:  # the other allowed answer: it refuses to run agent code as root
        print(f"\nvenv under /root ({mode}): the sandbox refuses to start: {e}")
        return
    work = Path(tempfile.mkdtemp(prefix="swe_ep_"))
    try:
        (work / "repo").mkdir()
        # Inside its user namespace (unshare -r) the script may see uid 0; what counts is who it is on the host: the
        # uid_map's outside id, and the owner of a file it writes
        script = ("import os, sys\nprint('uid', os.getuid(), 'map', open('/proc/self/uid_map').read().split())\n"
                  "print('prefix', sys.prefix)\nprint('venv', sys.prefix != sys.base_prefix)\n"
                  "open('made.txt', 'w').write('x')\n")
        (work / "repo" / "who.py").write_text(script)
        res = sb.run([str(venv_under_root), "who.py"], cwd=work / "repo")
        out = res.output
        owner = (work / "repo" / "made.txt").stat().st_uid
        print(f"\nvenv under /root ({mode}), sandbox uid {sb.uid}, fs isolation {sb.fs_isolation}, the script's file "
              f"owned by uid {owner} on the host:\n{out.strip()}")
        assert sb.uid == SANDBOX_UID and owner == SANDBOX_UID, out  # nobody, on the host
        inside, outside = out.split("map ['")[1].split("'")[0], out.split("map ['")[1].split("', '")[1]
        assert outside == str(SANDBOX_UID) or (inside == outside == str(SANDBOX_UID)), out  # never host uid 0
        assert f"prefix {venv_under_root.parent.parent}" in out and "venv True" in out, out  # the venv itself ran
    finally:
        sb.close()
        shutil.rmtree(work, ignore_errors=True)


def _why_no_v2() -> str | None:
    """None where a cgroup v2 hierarchy with the memory and pids controllers can be written here, else why not."""
    if os.environ.get("COMPRL_CGROUP"):
        return None if TreeCaps._v2() is not None else f"$COMPRL_CGROUP={os.environ['COMPRL_CGROUP']} is not a writable " \
                                                       "cgroup v2 folder with memory and pids"
    v2 = [m for m, fs, _ in _mounts() if fs == "cgroup2"]
    if not v2:
        return "this kernel mounts no cgroup2 hierarchy"
    for m in v2:
        try:
            have = set((Path(m) / "cgroup.controllers").read_text().split())
        except OSError as e:
            return f"cannot read {m}/cgroup.controllers: {e}"
        if {"memory", "pids"} <= have:
            return None if TreeCaps._v2() is not None else f"{m} has memory and pids, but this process may not make " \
                                                           "groups there"
    v1 = sorted({c for _, fs, opts in _mounts() if fs == "cgroup" for c in opts & {"memory", "pids"}})
    return (f"the cgroup2 hierarchy ({', '.join(v2)}) offers only {sorted(have) or 'no controllers'}: memory and pids "
            f"are bound to cgroup v1 hierarchies ({', '.join(v1) or 'none'}), and a controller lives in one hierarchy "
            "at a time, so no cgroup2 mount or namespace on this kernel can have them")


def test_cgroup_v2_tree_caps_cap_and_kill_the_whole_tree():
    why = _why_no_v2()
    if why is not None:
        print(f"skipped: cgroup v2 path not testable here: {why}")
        pytest.skip(f"cgroup v2 path not testable here: {why}")
    caps = TreeCaps._v2()
    assert caps is not None and caps.kind == "cgroup2"
    g = caps.group(memory_mb=64, max_procs=8)
    try:
        assert (g.dirs[0] / "memory.max").read_text().strip() == str(64 * 1024 * 1024)
        assert (g.dirs[0] / "pids.max").read_text().strip() == "8"
        # a tree that forks 20 sleepers (setsid each, so no process group reaches them): pids.max refuses past 8
        code = ("import os, time\nn = 0\nfor _ in range(20):\n    try:\n        if os.fork() == 0:\n"
                "            os.setsid(); time.sleep(60); os._exit(0)\n        n += 1\n    except OSError:\n        pass\n"
                "print('forked', n, flush=True)\ntime.sleep(60)\n")
        p = subprocess.Popen([sys.executable, "-c", code], preexec_fn=g.join, stdout=subprocess.PIPE, text=True)
        line = p.stdout.readline()
        forked = int(line.split()[1])
        members = g.pids()
        assert forked < 20 and len(members) <= 8, (line, members)
        # a memory hog is OOM-killed inside the tree
        hog = subprocess.run([sys.executable, "-c", "b = bytearray(256 * 1024 * 1024); print('survived')"],
                             preexec_fn=g.join, capture_output=True, text=True, timeout=60)
        assert "survived" not in hog.stdout
        g.kill()  # cgroup.kill: every member at once, the setsid ones too
        t0 = time.monotonic()
        while g.pids() and time.monotonic() - t0 < 5:
            time.sleep(0.05)
        assert not g.pids()
        p.wait(timeout=10)
        print(f"\ncgroup v2 at {caps.bases['unified']}: forks allowed {forked} of 20 (pids.max 8), a 256 MB hog killed "
              f"at memory.max 64 MB, cgroup.kill emptied the tree; events {g.stat()}")
    finally:
        g.close()
