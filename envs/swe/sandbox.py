"""The SWE envs' sandbox: how agent code (scripts, tests, the judge) is run.

Sandbox (what running a command guarantees): each test or script run is a subprocess in its own
process group with a wall-clock timeout, a scrubbed environment (no proxies, HOME in the episode's temp
dir) and, where `unshare -rn` works, an empty network namespace (no interface but a down loopback) and its
own PID namespace: the run is PID 1 of it, so when it ends or is killed the kernel kills everything it
started, `setsid` grandchildren included, and no process of the host can be seen or signalled. Where
unshare does not work, a `sitecustomize` socket guard refuses internet connections from Python and the
process group is all that is killed. The run dies with the env process that started it (PR_SET_PDEATHSIG):
a pool worker killed under a run leaves no tree behind.

Caps on the whole tree (envs/tree_caps.py): where this process may write a cgroup (v2 with the memory
and pids controllers, else the v1 memory and pids hierarchies), each run gets its own group with
`memory_mb` for the tree (an OOM kills within the tree, never the host), SANDBOX_MAX_PROCS processes, and
a kill that reaches every member. Where no cgroup is writable, only the per-process caps remain
(RLIMIT_AS `memory_mb`, and RLIMIT_NPROC for the sandbox uid): `Sandbox.tree_caps` says which. Disk: every
file is capped by RLIMIT_FSIZE, and the episode's folder by `disk_mb`: a watchdog measures it while the
tree runs and kills the tree past the cap, and what that run wrote is removed.

Unprivileged: when the env runs as root, agent code runs as `nobody` (uid 65534), which owns only the
episode's copy. In a private mount namespace (envs/sandbox_fs.py) /tmp, /var/tmp and /dev/shm are small
private tmpfs mounts (the episode's folders bound back at their paths), so nothing is written outside the
copy; and where `nobody` cannot reach the interpreter (a Python under /root, mode 700) the folder in the
way is covered by an empty tmpfs and only the interpreter's trees are bound back, read-only. If neither
the uid nor the namespace can be had as root, the env refuses to start (SandboxUnavailable): agent code
never runs as root. Every timeout stays inside the env pool's per-step limit (STEP_BUDGET_S), so a worker
is never killed under a running pytest. File commands cannot leave the working copy and never follow a
symlink (a link the agent plants is listed but not read through; the judge's copy keeps links as links).
A *script* could still read world-readable files of this machine (there is no filesystem jail beyond the
above), so the held-out tests are hidden, not secret. The judge ignores conftest.py files, pytest config
files and a `pytest.py` the agent leaves in its tree, and runs in the same sandbox as the agent's code.
"""
from __future__ import annotations

import functools
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import weakref
from dataclasses import dataclass
from pathlib import Path

from envs.base import EnvError
from envs.sandbox_fs import MountPlan, interpreter_trees, set_parent_death_signal
from envs.tree_caps import RunGroup, TreeCaps, sweep_stale_groups

SANDBOX_UID = 65534  # nobody: who runs agent code when the env itself runs as root
SANDBOX_MAX_PROCS = 64  # processes of one run's tree (cgroup pids.max; without a cgroup, RLIMIT_NPROC of the uid)


# ---------------------------------------------------------------------------------------------
# Sandboxed subprocesses
# ---------------------------------------------------------------------------------------------

_SOCKET_GUARD = '''
# Written by envs/swe/sandbox.py: refuse network connections from sandboxed Python (loopback and Unix sockets still work).
import socket as _socket

_orig_connect = _socket.socket.connect
_orig_connect_ex = _socket.socket.connect_ex


def _allowed(sock, address):
    if sock.family == getattr(_socket, "AF_UNIX", None):
        return True
    host = address[0] if isinstance(address, tuple) else address
    return host in ("127.0.0.1", "::1", "localhost")


def _connect(self, address):
    if not _allowed(self, address):
        raise OSError("network access is disabled in this sandbox")
    return _orig_connect(self, address)


def _connect_ex(self, address):
    if not _allowed(self, address):
        raise OSError("network access is disabled in this sandbox")
    return _orig_connect_ex(self, address)


_socket.socket.connect = _connect
_socket.socket.connect_ex = _connect_ex
'''


@functools.lru_cache(maxsize=1)
def _unshare_works() -> bool:
    """Whether an unprivileged user+network namespace can be made here (many containers forbid it)."""
    exe = shutil.which("unshare")
    if not exe:
        return False
    try:
        return subprocess.run([exe, "-rn", "true"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def _uid_can_run(uid: int, exe: str, plan: MountPlan | None = None) -> bool:
    """Whether `uid` can start `exe` and import its site packages (every folder on the way must be searchable),
    in a mount namespace laid out by `plan` if given."""
    def drop() -> None:
        if plan is not None:
            plan.apply()
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)

    try:
        return subprocess.run([exe, "-c", "import site, encodings"], preexec_fn=drop, capture_output=True,
                              timeout=60, cwd="/").returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


@functools.lru_cache(maxsize=4)
def _interpreter_plan(exe: str) -> tuple[bool, MountPlan | None]:
    """As root: (whether the sandbox user can run `exe` at all, the mount plan of its runs or None for no private
    namespace). Runs get a namespace with private scratch folders wherever one can be made (and, if the user cannot
    reach `exe` as things are, the interpreter exposed in it); (False, None): agent code is refused, never root."""
    plain = _uid_can_run(SANDBOX_UID, exe)
    plan = MountPlan(trees=[str(t) for t in interpreter_trees(exe)]) if plain else MountPlan.for_interpreter(exe)
    if (plain or plan.covers) and _uid_can_run(SANDBOX_UID, exe, plan.with_scratch([])):
        return True, plan
    return plain, None  # reachable, but no mount namespace here (no CAP_SYS_ADMIN): the shared /tmp stays


class SandboxUnavailable(EnvError):
    """Agent code cannot be run unprivileged here; the message names the fix."""


@dataclass
class RunResult:
    returncode: int
    output: str
    timed_out: bool
    killed_for: str = ""  # "" (it ended), "time", "disk": why the sandbox killed the tree
    caps: dict[str, int] | None = None  # what the tree's cgroup counted (OOM kills, refused forks, peak memory)


class Sandbox:
    """Runs argv in a directory under a timeout, caps on memory, processes and disk for the whole tree, without
    network, as an unprivileged user (see the module doc)."""

    def __init__(self, timeout_s: float = 20.0, memory_mb: int = 1024, file_mb: int = 64, python: str | None = None,
                 disk_mb: int = 256):
        self.python = python or sys.executable  # the interpreter agent scripts and tests run with
        self.timeout_s = timeout_s
        self.memory_mb = memory_mb
        self.file_mb = file_mb
        self.disk_mb = disk_mb
        self.network_isolation = "unshare" if _unshare_works() else "socket-guard"
        # Caps on the whole tree (cgroup v2, else v1, else none: per-process rlimits only; tree_caps.py).
        self.caps = TreeCaps.detect()
        self.tree_caps = self.caps.kind if self.caps else "rlimits only (no writable cgroup here)"
        # Root hands agent code to the unprivileged uid `nobody`; where it cannot reach the interpreter (a Python
        # under /root, mode 700) a private mount namespace makes just the interpreter's trees reachable, read-only
        # (sandbox_fs.py). Agent code is never run as root: if neither works, the env refuses to start.
        self.uid: int | None = None
        self.mounts: MountPlan | None = None
        if os.geteuid() == 0:
            usable, self.mounts = _interpreter_plan(self.python)
            if not usable:
                raise SandboxUnavailable(
                    f"SWE sandbox: agent code would run as root: uid {SANDBOX_UID} (nobody) cannot run {self.python}, "
                    "and no private mount namespace can be made here to expose it (needs CAP_SYS_ADMIN). Install "
                    "the interpreter where others may read it (e.g. /usr/local or /opt) or make the folders on its "
                    "way searchable (chmod o+x), or run the env as an unprivileged user.")
            self.uid = SANDBOX_UID
        self.fs_isolation = ("none: no mount namespace here (the shared /tmp is writable)" if self.mounts is None else
                             "private /tmp, /var/tmp, /dev/shm" + (", interpreter exposed read-only"
                                                                    if self.mounts.covers else ""))
        sweep_stale_temp_dirs()
        sweep_stale_groups()
        self._guard_dir = Path(tempfile.mkdtemp(prefix=f"swe_guard_{os.getpid()}_"))
        self._guard_dir.chmod(0o755)  # readable by the sandbox user, or its Python would skip the guard silently
        (self._guard_dir / "sitecustomize.py").write_text(_SOCKET_GUARD)
        # Removed when the sandbox is closed or garbage-collected, whichever comes first.
        self._finalizer = weakref.finalize(self, shutil.rmtree, str(self._guard_dir), True)

    def _child_setup(self, group: RunGroup | None, plan: MountPlan | None) -> None:
        # Runs in the child between fork and exec, in this order: caps first (they apply to it and everything it
        # starts), then the mount namespace (needs root), then the drop to the sandbox user (nothing after it may
        # raise a limit again).
        set_parent_death_signal()  # a worker killed under a run takes the run with it
        if group is not None:
            group.join()
        mem = self.memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
        fsize = self.file_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if self.uid is not None:
            if plan is not None:
                plan.apply()
            # RLIMIT_NPROC counts every process of the uid, in every episode at once: with a cgroup (pids.max per
            # tree) it is only a backstop for the machine, without one it is the cap.
            nproc = SANDBOX_MAX_PROCS * (16 if group is not None else 1)
            resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
            os.setgroups([])
            os.setgid(self.uid)
            os.setuid(self.uid)

    def env(self, home: Path) -> dict[str, str]:
        return {
            "PATH": os.path.dirname(self.python) + os.pathsep + "/usr/bin:/bin",
            "HOME": str(home),
            "LANG": "C.UTF-8",
            "PYTHONPATH": str(self._guard_dir),
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONHASHSEED": "0",
            # Plugins installed in the venv (browsers, timeouts, ...) are not the task's and cost start-up time.
            "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
            "NO_PROXY": "*",
        }

    def hand_over(self, top: Path, keep: Path | None = None) -> None:
        """Make `top` (the episode's folder: HOME and the copies) the sandbox user's, except `keep`."""
        if self.uid is None:
            return
        for dirpath, dirnames, filenames in os.walk(top):
            d = Path(dirpath)
            if keep is not None and (d == keep or keep in d.parents):
                dirnames[:] = []
                continue
            os.lchown(d, self.uid, self.uid)
            for name in filenames + [n for n in dirnames if (d / n).is_symlink()]:
                os.lchown(d / name, self.uid, self.uid)

    def run(self, argv: list[str], cwd: Path, timeout_s: float | None = None, keep: Path | None = None) -> RunResult:
        """Run argv in `cwd` (its parent is HOME and is handed to the sandbox user, but for `keep`)."""
        if self.network_isolation == "unshare":
            # -r: a user namespace; -n: no network; --pid --fork: the command is PID 1 of its own namespace;
            # --kill-child: if unshare dies (our SIGKILL on timeout), so does that PID 1, and with it the kernel
            # kills every process of the namespace, wherever it moved its session or group.
            argv = ["unshare", "-rn", "--pid", "--fork", "--kill-child", *argv]
        top = cwd.parent
        self.hand_over(top, keep)
        timeout = timeout_s or self.timeout_s
        group = self.caps.group(self.memory_mb, SANDBOX_MAX_PROCS) if self.caps else None
        plan = self.mounts.with_scratch([top, self._guard_dir]) if self.mounts is not None else None
        killed_for = ""
        try:
            proc = subprocess.Popen(argv, cwd=cwd, env=self.env(top), stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    preexec_fn=lambda: self._child_setup(group, plan), start_new_session=True)
            deadline = time.monotonic() + timeout
            before = file_states(top)  # to take back what a run over its disk cap wrote
            chunks: list[bytes] = []
            while True:
                # Output is read as it comes (a full pipe would stall the tree); between reads the watchdog looks at
                # the clock and at the episode folder's size (disk is capped per tree, not only per file).
                try:
                    out, _ = proc.communicate(timeout=min(DISK_POLL_S, max(0.01, deadline - time.monotonic())))
                    chunks.append(out)
                    break
                except subprocess.TimeoutExpired:
                    pass
                if time.monotonic() >= deadline:
                    killed_for = "time"
                elif folder_bytes(top, self.disk_mb * 1024 * 1024) > self.disk_mb * 1024 * 1024:
                    killed_for = "disk"
                if killed_for:
                    if group is not None:
                        group.kill()
                    os.killpg(proc.pid, signal.SIGKILL)  # the whole group: a script's children die too
                    out, _ = proc.communicate()
                    chunks.append(out)
                    break
            if killed_for != "time" and folder_bytes(top, self.disk_mb * 1024 * 1024) > self.disk_mb * 1024 * 1024:
                # Written faster than the watchdog looks (it polls): over the cap when it ended all the same.
                killed_for = "disk"
            if killed_for == "disk":
                removed = remove_written_since(top, before)
                chunks.append(f"\n[{removed} file(s) written by this run removed: the folder passed its "
                              f"{self.disk_mb} MB disk cap]".encode())
            text = b"".join(chunks).decode("utf-8", "replace")
            code = -9 if killed_for else proc.returncode
            return RunResult(code, text, killed_for == "time", killed_for, group.stat() if group else None)
        finally:
            if group is not None:
                group.close()

    def close(self) -> None:
        self._finalizer()


DISK_POLL_S = 0.2  # how often a running tree's disk use is measured


def file_states(top: Path) -> dict[str, tuple[int, int]]:
    """path -> (mtime_ns, size) of every file under `top` (links not followed)."""
    out = {}
    for dirpath, _, filenames in os.walk(top):
        for name in filenames:
            p = os.path.join(dirpath, name)
            try:
                st = os.lstat(p)
            except OSError:
                continue
            out[p] = (st.st_mtime_ns, st.st_size)
    return out


def remove_written_since(top: Path, before: dict[str, tuple[int, int]]) -> int:
    """Delete the files under `top` that are new or changed since `before` (what a run over its disk cap wrote);
    links are removed as links. Returns how many."""
    n = 0
    for p, state in file_states(top).items():
        if before.get(p) != state:
            try:
                os.unlink(p)
                n += 1
            except OSError:
                pass
    return n


def folder_bytes(top: Path, stop_after: int | None = None) -> int:
    """Bytes allocated under `top` (links not followed), counting each file at least one block; stops counting
    once past `stop_after`. A million empty files cost a block each, so they are capped too."""
    total = 0
    for dirpath, dirnames, filenames in os.walk(top):
        for name in dirnames + filenames:
            try:
                st = os.lstat(os.path.join(dirpath, name))
            except OSError:
                continue
            total += max(st.st_blocks * 512, 4096)
        if stop_after is not None and total > stop_after:
            break
    return total



def sweep_stale_temp_dirs() -> int:
    """Remove episode and guard folders (`swe_ep_<pid>_*`, `swe_guard_<pid>_*`) of processes that are gone: a
    pool worker killed on a timeout never runs its finalizers. Returns how many were removed."""
    n = 0
    for d in Path(tempfile.gettempdir()).glob("swe_[eg][pu]*_*_*"):
        parts = d.name.split("_")
        if len(parts) < 4 or parts[1] not in ("ep", "guard") or not parts[2].isdigit():
            continue
        try:
            os.kill(int(parts[2]), 0)
            continue  # its owner is alive
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        shutil.rmtree(d, ignore_errors=True)
        n += 1
    return n
