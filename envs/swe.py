"""Software-engineering tasks as text envs: fix a bug in a small repository by tool calls.

- `swe/local` (`make_swe_local`): built-in tasks under `assets/swe_tasks/<task_id>/`: `repo/` (the
  snapshot the agent works on), `issue.md` (the task text), `tests/` (held-out tests the agent never
  sees; they fail until the bug is fixed) and `fix/` (the reference fix as whole fixed files at their
  repo paths). Every episode works in a fresh temporary copy of `repo/`; at `submit` the held-out
  tests are copied into a second copy of the agent's tree and run there: reward 1 when they pass.
- `swe/bench` (`make_swe_bench`): SWE-bench instances from a local JSON/JSONL file, edited in a local
  git checkout and judged by the official `swebench` harness, which needs a Docker engine.

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

import difflib
import functools
import json
import os
import random
import re
import resource
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envs.base import EnvError
from envs.sandbox_fs import MountPlan, interpreter_trees, set_parent_death_signal
from envs.tree_caps import RunGroup, TreeCaps, sweep_stale_groups

TASKS_DIR = Path(__file__).resolve().parent.parent / "assets" / "swe_tasks"
MAX_OUTPUT_CHARS = 4000  # an observation longer than this is cut, keeping both ends
STEP_BUDGET_S = 30.0  # envs/pool.py's default step_timeout_s: a command must end (and be killed) inside it
SANDBOX_UID = 65534  # nobody: who runs agent code when the env itself runs as root
SANDBOX_MAX_PROCS = 64  # processes of one run's tree (cgroup pids.max; without a cgroup, RLIMIT_NPROC of the uid)
HIDDEN_NAMES = {"__pycache__", ".pytest_cache", ".git"}

ACTION_FORMAT = (
    "One command per action; the first line is the command, later lines are its text. "
    "`ls [path]` lists files; `cat <path> [start] [end]` shows numbered lines; "
    "`grep <pattern> [path]` searches with a Python regex (quote patterns with spaces); "
    "`replace <path> <start> <end>` followed by new lines replaces lines start..end "
    "(no new lines deletes them; end = start-1 inserts before start); "
    "`edit <path>` followed by `<<<`, the exact old text, `===`, the new text, `>>>` replaces that "
    "text once; `write <path>` followed by the whole file creates or overwrites it; "
    "`python <path> [args]` runs a script; `run_tests` runs the repository's own tests; "
    "`submit` ends the episode and scores your change with hidden tests."
)


# ---------------------------------------------------------------------------------------------
# Sandboxed subprocesses
# ---------------------------------------------------------------------------------------------

_SOCKET_GUARD = '''
# Written by envs/swe.py: refuse network connections from sandboxed Python (loopback and Unix sockets still work).
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


def _clip(text: str, limit: int = MAX_OUTPUT_CHARS) -> str:
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n... [{len(text) - limit} characters cut] ...\n{text[-half:]}"


# ---------------------------------------------------------------------------------------------
# Tool commands over a working copy
# ---------------------------------------------------------------------------------------------

class CommandError(ValueError):
    """A command the env cannot carry out; its message is the agent's feedback."""


class Workspace:
    """A working copy and the file/grep/edit commands on it. Paths are relative and cannot escape it."""

    def __init__(self, root: Path):
        self.root = root.resolve()

    def path(self, rel: str) -> Path:
        if not rel:
            raise CommandError("a path is needed")
        p = (self.root / rel).resolve()
        if p != self.root and not p.is_relative_to(self.root):
            raise CommandError(f"{rel!r} is outside the repository")
        return p

    def rel(self, p: Path) -> str:
        return p.relative_to(self.root).as_posix()

    def files(self, under: Path | None = None) -> list[Path]:
        """Regular files under `under`; symlinks are skipped (a planted link to /etc/passwd is not a file of
        the repository), and so are links to folders (os.walk does not descend into them)."""
        base = under or self.root
        out = []
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames[:] = sorted(d for d in dirnames if d not in HIDDEN_NAMES)
            out += [Path(dirpath) / f for f in sorted(filenames)
                    if not f.endswith(".pyc") and not (Path(dirpath) / f).is_symlink()]
        return out

    def ls(self, rel: str = ".") -> str:
        p = self.path(rel or ".")
        if p.is_file():
            return self.rel(p)
        if not p.is_dir():
            raise CommandError(f"no such file or directory: {rel}")
        return "\n".join(self.rel(f) for f in self.files(p)) or "(empty)"

    def read_lines(self, rel: str) -> list[str]:
        p = self.path(rel)
        if not p.is_file():
            raise CommandError(f"no such file: {rel}")
        try:
            return p.read_text(encoding="utf-8").splitlines(keepends=True)
        except UnicodeDecodeError as e:
            raise CommandError(f"{rel} is not a UTF-8 text file") from e

    def cat(self, rel: str, start: int | None = None, end: int | None = None) -> str:
        lines = self.read_lines(rel)
        lo = max(1, start or 1)
        hi = min(len(lines), end or len(lines))
        if not lines:
            return f"{rel} is empty"
        if lo > hi:
            raise CommandError(f"{rel} has {len(lines)} lines; {start}..{end} is empty")
        return "\n".join(f"{i:4d}| {lines[i - 1].rstrip(chr(10))}" for i in range(lo, hi + 1))

    def grep(self, pattern: str, rel: str = ".") -> str:
        try:
            rx = re.compile(pattern)
        except re.error as e:
            raise CommandError(f"bad regex {pattern!r}: {e}") from e
        base = self.path(rel or ".")
        hits = []
        for f in ([base] if base.is_file() else self.files(base)):
            try:
                text = f.read_text(encoding="utf-8")
            except (UnicodeDecodeError, OSError):
                continue
            for n, line in enumerate(text.splitlines(), 1):
                if rx.search(line):
                    hits.append(f"{self.rel(f)}:{n}: {line}")
        if not hits:
            return f"no match for {pattern!r}"
        more = f"\n... {len(hits) - 50} more matches" if len(hits) > 50 else ""
        return "\n".join(hits[:50]) + more

    def write(self, rel: str, text: str) -> str:
        p = self.path(rel)
        if p.is_dir():
            raise CommandError(f"{rel} is a directory")
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text, encoding="utf-8")
        return f"wrote {rel} ({len(text.splitlines())} lines)"

    def replace_lines(self, rel: str, start: int, end: int, new_text: str) -> str:
        lines = self.read_lines(rel)
        if start < 1 or start > len(lines) + 1 or end < start - 1 or end > len(lines):
            raise CommandError(f"{rel} has {len(lines)} lines; cannot replace {start}..{end}")
        new = new_text.splitlines(keepends=True)
        if new and not new[-1].endswith("\n"):
            new[-1] += "\n"
        lines[start - 1:end] = new
        self.path(rel).write_text("".join(lines), encoding="utf-8")
        shown_end = max(start, start + len(new) - 1)
        return f"replaced lines {start}..{end} of {rel}; now:\n" + self._around(rel, start, shown_end)

    def str_replace(self, rel: str, old: str, new: str) -> str:
        text = "".join(self.read_lines(rel))
        count = text.count(old) if old else 0
        if count != 1:
            raise CommandError(f"the old text occurs {count} times in {rel}; it must occur exactly once")
        at = text[:text.index(old)].count("\n") + 1
        self.path(rel).write_text(text.replace(old, new, 1), encoding="utf-8")
        return f"edited {rel}; now:\n" + self._around(rel, at, at + max(0, new.count("\n")))

    def _around(self, rel: str, lo: int, hi: int) -> str:
        n = len(self.read_lines(rel))
        if n == 0:
            return f"{rel} is empty"
        return self.cat(rel, max(1, min(lo, n) - 2), min(n, hi + 2))


def _parse_edit_body(body: str) -> tuple[str, str]:
    """`<<<` old `===` new `>>>` -> (old, new); each part keeps its own line breaks."""
    m = re.fullmatch(r"\s*<<<\n(.*?)\n?===\n(.*?)\n?>>>\s*", body, re.DOTALL)
    if not m:
        raise CommandError("edit needs the lines `<<<`, the old text, `===`, the new text, `>>>`")
    old, new = m.group(1), m.group(2)
    # Whole lines are replaced, so both sides end in a newline unless one side is empty.
    return (old + "\n" if old else old), (new + "\n" if new else new)


# ---------------------------------------------------------------------------------------------
# Built-in tasks
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class SweTask:
    task_id: str
    root: Path

    @property
    def issue(self) -> str:
        return (self.root / "issue.md").read_text(encoding="utf-8").strip()

    @property
    def repo_dir(self) -> Path:
        return self.root / "repo"

    @property
    def tests_dir(self) -> Path:
        return self.root / "tests"

    @property
    def fix_dir(self) -> Path:
        return self.root / "fix"


def load_local_tasks(tasks_dir: str | Path | None = None) -> list[SweTask]:
    """Tasks sorted by id; a folder missing one of repo/, tests/, fix/, issue.md is an error."""
    base = Path(tasks_dir) if tasks_dir else TASKS_DIR
    if not base.is_dir():
        raise EnvError(f"no SWE task folder at {base}")
    tasks = []
    for d in sorted(p for p in base.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))):
        missing = [n for n in ("repo", "tests", "fix", "issue.md") if not (d / n).exists()]
        if missing:
            raise EnvError(f"SWE task {d.name} lacks {', '.join(missing)} (expected repo/, tests/, fix/, issue.md)")
        tasks.append(SweTask(d.name, d))
    if not tasks:
        raise EnvError(f"no SWE tasks in {base}")
    return tasks


def _copy_tree(src: Path, dst: Path) -> None:
    # symlinks=True: links are copied as links, never followed (a link to / or a loop would copy the
    # machine or recurse until RecursionError)
    shutil.copytree(src, dst, symlinks=True, dirs_exist_ok=True, ignore=shutil.ignore_patterns(*HIDDEN_NAMES, "*.pyc"))


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


# ---------------------------------------------------------------------------------------------
# Task sources: where an episode's code comes from and how a submission is judged. One env class
# drives both (composition; DESIGN.md habit 8).
# ---------------------------------------------------------------------------------------------

_PYTEST = ["-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "--color=no"]
_PYTEST_TIME = re.compile(r" in \d+(?:\.\d+)?s(?: \(\d+:\d+:\d+\))?")


class LocalTasks:
    """Built-in tasks: copy `repo/`, judge with the held-out `tests/`."""

    offers_run_tests = True

    def __init__(self, tasks_dir: str | Path | None = None, task_ids: list[str] | None = None):
        tasks = load_local_tasks(tasks_dir)
        if task_ids:
            known = {t.task_id: t for t in tasks}
            unknown = [t for t in task_ids if t not in known]
            if unknown:
                raise EnvError(f"unknown SWE task ids {unknown}; known: {', '.join(known)}")
            tasks = [known[t] for t in task_ids]
        self.tasks = tasks
        self.current: SweTask | None = None

    def prepare(self, seed: int, options: dict[str, Any], work: Path) -> tuple[str, dict[str, Any]]:
        if "task_id" in options:
            matches = [t for t in self.tasks if t.task_id == options["task_id"]]
            if not matches:
                raise EnvError(f"unknown SWE task id {options['task_id']!r}; known: {', '.join(t.task_id for t in self.tasks)}")
            self.current = matches[0]
        else:
            self.current = self.tasks[seed % len(self.tasks)]
        _copy_tree(self.current.repo_dir, work)
        return self.current.issue, {"task_id": self.current.task_id}

    def judge(self, ws: Workspace, sandbox: Sandbox, scratch: Path, timeout: float) -> tuple[bool, str]:
        """Held-out tests run in a copy of the agent's tree, so nothing the agent left there can alter them."""
        judge = scratch / "judge"
        shutil.rmtree(judge, ignore_errors=True)
        _copy_tree(ws.root, judge)
        held = judge / "_heldout_tests"
        shutil.rmtree(held, ignore_errors=True)
        _copy_tree(self.current.tests_dir, held)
        # The agent's tree must not be able to judge itself (it is an RL policy: it will find such holes):
        # -P keeps the tree off sys.path until pytest has started (no shadowing `pytest.py`),
        # --noconftest ignores any conftest.py it wrote, and an empty ini outside the tree overrides any
        # pytest.ini / pyproject.toml / setup.cfg it left. The tree is then put on the path for the imports.
        ini = scratch / "judge.ini"
        ini.write_text("[pytest]\n")
        argv = [sandbox.python, "-P", *_PYTEST, "--noconftest", "-c", str(ini), "--rootdir", str(judge),
                "-o", f"pythonpath={judge}", "_heldout_tests"]
        res = sandbox.run(argv, judge, timeout, keep=held)  # the held-out tests stay root's: read, not rewritten
        shutil.rmtree(judge, ignore_errors=True)
        passed = res.returncode == 0 and not res.timed_out
        return passed, res.output


class SweEnv:
    """TextEnv over a code repository; see the module doc for the commands and the sandbox."""

    action_format = ACTION_FORMAT

    def __init__(self, name: str, source: Any, max_turns: int = 30, command_timeout: float = 20.0,
                 test_timeout: float = 25.0, memory_mb: int = 1024, disk_mb: int = 256, python: str | None = None):
        for what, t in (("command_timeout", command_timeout), ("test_timeout", test_timeout)):
            # A command longer than the pool's step limit gets its worker killed under it, orphaning its tree.
            if not 0 < t <= STEP_BUDGET_S - 5:
                raise EnvError(f"{name}: {what} {t:g} s must be within (0, {STEP_BUDGET_S - 5:g}] s, inside the env "
                               f"pool's {STEP_BUDGET_S:g} s step limit")
        self.name = name
        self.source = source
        self.max_turns = int(max_turns)
        self.test_timeout = test_timeout
        self.sandbox = Sandbox(timeout_s=command_timeout, memory_mb=memory_mb, disk_mb=disk_mb, python=python)
        self.task = ""
        self.turns = 0
        self.done = False
        self._tmp: Path | None = None
        self.ws: Workspace | None = None
        self._rng = random.Random()

    # -- protocol ----------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """reset(seed) picks task `seed % n`; options may name one (task_id / instance_id)."""
        if seed is None:
            seed = self._rng.randrange(2**31)
        self._cleanup()
        self._tmp = Path(tempfile.mkdtemp(prefix=f"swe_ep_{os.getpid()}_"))
        self._tmp_finalizer = weakref.finalize(self, shutil.rmtree, str(self._tmp), True)
        work = self._tmp / "repo"
        self.task, meta = self.source.prepare(seed, options or {}, work)
        self.ws = Workspace(work)
        self.turns, self.done = 0, False
        obs = f"Issue:\n{self.task}\n\nRepository files:\n{_clip(self.ws.ls('.'))}\n\n{ACTION_FORMAT}"
        # An env whose submit outlasts the pool's step limit (the SWE-bench harness) says how long a step may take.
        budget = getattr(self.source, "step_budget_s", None)
        return obs, self._info(False) | meta | ({"step_budget_s": budget} if budget else {})

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self.ws is None:
            raise RuntimeError("call reset() before step()")
        if self.done:
            raise RuntimeError("the episode has ended; call reset()")
        self.turns += 1
        head, _, body = (action or "").partition("\n")
        try:
            argv = shlex.split(head.strip())
        except ValueError as e:
            return self._turn(f"Invalid command: {e}. {ACTION_FORMAT}", invalid=True)
        if not argv:
            return self._turn(f"Invalid command: empty action. {ACTION_FORMAT}", invalid=True)
        cmd, args = argv[0], argv[1:]
        if cmd == "submit":
            return self._submit()
        handler = self._commands().get(cmd)
        if handler is None:
            return self._turn(f"Invalid command {cmd[:40]!r}. {ACTION_FORMAT}", invalid=True)
        try:
            out = handler(args, body)
        except CommandError as e:
            return self._turn(f"Error: {e}", invalid=True)
        return self._turn(_clip(out), invalid=False)

    def close(self) -> None:
        self._cleanup()
        self.sandbox.close()

    # -- commands ----------------------------------------------------------------------------
    def _commands(self) -> dict[str, Any]:
        return {"ls": self._cmd_ls, "cat": self._cmd_cat, "grep": self._cmd_grep, "replace": self._cmd_replace,
                "edit": self._cmd_edit, "write": self._cmd_write, "python": self._cmd_python,
                "run_tests": self._cmd_run_tests}

    def _cmd_ls(self, args: list[str], body: str) -> str:
        return self.ws.ls(args[0] if args else ".")

    def _cmd_cat(self, args: list[str], body: str) -> str:
        if not args or len(args) > 3:
            raise CommandError("usage: cat <path> [start] [end]")
        nums = [_int(a, "line number") for a in args[1:]]
        return self.ws.cat(args[0], *nums)

    def _cmd_grep(self, args: list[str], body: str) -> str:
        if not args or len(args) > 2:
            raise CommandError("usage: grep <pattern> [path]  (quote a pattern with spaces)")
        return self.ws.grep(args[0], args[1] if len(args) > 1 else ".")

    def _cmd_replace(self, args: list[str], body: str) -> str:
        if len(args) != 3:
            raise CommandError("usage: replace <path> <start> <end>, then the new lines")
        return self.ws.replace_lines(args[0], _int(args[1], "start"), _int(args[2], "end"), body)

    def _cmd_edit(self, args: list[str], body: str) -> str:
        if len(args) != 1:
            raise CommandError("usage: edit <path>, then <<< old === new >>> lines")
        old, new = _parse_edit_body(body)
        return self.ws.str_replace(args[0], old, new)

    def _cmd_write(self, args: list[str], body: str) -> str:
        if len(args) != 1:
            raise CommandError("usage: write <path>, then the file's content")
        return self.ws.write(args[0], body if body.endswith("\n") or not body else body + "\n")

    def _cmd_python(self, args: list[str], body: str) -> str:
        if not args:
            raise CommandError("usage: python <path> [args]")
        if not self.ws.path(args[0]).is_file():
            raise CommandError(f"no such file: {args[0]}")
        return self._report(self.sandbox.run([self.sandbox.python, *args], self.ws.root), "script", self.sandbox.timeout_s)

    def _cmd_run_tests(self, args: list[str], body: str) -> str:
        if not self.source.offers_run_tests:
            raise CommandError("this env runs the tests in its evaluation harness at submit; "
                               "use `python <script>` for local checks")
        if not (self.ws.root / "tests").is_dir():
            raise CommandError("this repository has no tests/ folder")
        res = self.sandbox.run([self.sandbox.python, *_PYTEST, "tests"], self.ws.root, self.test_timeout)
        # pytest's "in 0.12s": the same tree gives the same observation (the env pool replays episodes by it)
        res.output = _PYTEST_TIME.sub("", res.output)
        return self._report(res, "tests", self.test_timeout)

    def _report(self, res: RunResult, what: str, limit: float) -> str:
        caps = res.caps or {}
        notes = []
        oom = caps.get("memory.events:oom_kill", caps.get("memory.oom_control:oom_kill", 0))
        if oom:
            notes.append(f"[memory cap: {oom} process(es) killed, the tree passed {self.sandbox.memory_mb} MB]")
        if caps.get("pids.events:max"):
            notes.append(f"[process cap: {caps['pids.events:max']} fork(s) refused past {SANDBOX_MAX_PROCS} processes]")
        tail = "".join("\n" + n for n in notes)
        if res.killed_for == "time":
            return f"{what} killed after the time limit ({limit:g}s)\n{res.output}{tail}"
        if res.killed_for == "disk":
            return f"{what} killed: its files passed the {self.sandbox.disk_mb} MB disk cap\n{res.output}{tail}"
        return f"{res.output}\n[{what} exit code {res.returncode}]{tail}"

    # -- episode plumbing --------------------------------------------------------------------
    def _submit(self) -> tuple[str, float, bool, bool, dict[str, Any]]:
        passed, output = self.source.judge(self.ws, self.sandbox, self._tmp, self.test_timeout)
        self.done = True
        verdict = "The hidden tests pass: the issue is fixed." if passed else "The hidden tests fail: the issue is not fixed."
        info = self._info(False) | {"success": passed, "test_output": _clip(output)}
        return f"Submitted. {verdict}", 1.0 if passed else 0.0, True, False, info

    def _cleanup(self) -> None:
        if self._tmp is not None:
            self._tmp_finalizer()
            self._tmp = None

    def _turn(self, obs: str, invalid: bool) -> tuple[str, float, bool, bool, dict[str, Any]]:
        info = self._info(invalid)
        truncated = self.turns >= self.max_turns
        if truncated:
            self.done = True
            info["success"] = False
            obs += f"\n\nTurn limit ({self.max_turns}) reached without submitting."
        return obs, 0.0, False, truncated, info

    def _info(self, invalid: bool) -> dict[str, Any]:
        return {"invalid_action": invalid, "admissible_actions": self.admissible_actions()}

    def admissible_actions(self) -> list[str]:
        if self.ws is None:
            return []
        files = [self.ws.rel(f) for f in self.ws.files()] if self.source.offers_run_tests else []
        tests = ["run_tests"] if self.source.offers_run_tests else []
        # A real (swe/bench) repository has thousands of files: list commands, not every file.
        return ["ls", *[f"cat {f}" for f in files if f.endswith(".py")], *tests, "submit"]


def _int(text: str, what: str) -> int:
    try:
        return int(text)
    except ValueError as e:
        raise CommandError(f"{what} must be an integer, not {text!r}") from e


def make_swe_local(tasks_dir: str | Path | None = None, task_ids: list[str] | None = None, **options: Any) -> SweEnv:
    """Registry factory for `swe/local`; options: max_turns, command_timeout, test_timeout, memory_mb."""
    return SweEnv("swe/local", LocalTasks(tasks_dir, task_ids), **options)


def swe_expert(env: SweEnv) -> str:
    """The next action of a demonstrator that replays the reference fix through the env's own commands.

    Stateless: it diffs the working copy against the fixed files and emits one `replace` for the
    first differing hunk, so it can also take over from any state a policy left (DAgger).
    """
    if not isinstance(env.source, LocalTasks) or env.source.current is None:
        raise EnvError("swe_expert needs a reset swe/local env (its tasks carry a reference fix)")
    fix_dir = env.source.current.fix_dir
    for fixed in sorted(p for p in fix_dir.rglob("*") if p.is_file()):
        rel = fixed.relative_to(fix_dir).as_posix()
        want = fixed.read_text(encoding="utf-8").splitlines(keepends=True)
        target = env.ws.path(rel)
        if not target.exists():
            return f"write {rel}\n" + "".join(want)
        have = target.read_text(encoding="utf-8").splitlines(keepends=True)
        if have == want:
            continue
        for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(a=have, b=want, autojunk=False).get_opcodes():
            if tag != "equal":
                # lines i1+1..i2 (1-based, inclusive); i2 == i1 is a pure insertion before line i1+1
                return f"replace {rel} {i1 + 1} {i2}\n" + "".join(want[j1:j2])
    return "submit"


# ---------------------------------------------------------------------------------------------
# swe/bench: SWE-bench instances through the official harness
# ---------------------------------------------------------------------------------------------

REQUIRED_INSTANCE_FIELDS = ("instance_id", "repo", "base_commit", "problem_statement")


def load_swe_bench_instances(path: str | Path) -> list[dict]:
    """SWE-bench instances from a JSON list or a JSONL file; each needs the fields the harness keys on."""
    p = Path(path)
    if not p.is_file():
        raise EnvError(f"no SWE-bench instance file at {p}")
    text = p.read_text(encoding="utf-8")
    if text.lstrip().startswith("["):
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as e:
            raise EnvError(f"{p}: not valid JSON ({e})") from e
        numbered = list(enumerate(rows, 1))
    else:
        numbered = []
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                numbered.append((n, json.loads(line)))
            except json.JSONDecodeError as e:
                raise EnvError(f"{p}:{n}: not valid JSON ({e.msg})") from e
    out = []
    for n, row in numbered:
        if not isinstance(row, dict):
            raise EnvError(f"{p}:{n}: an instance must be a JSON object")
        missing = [f for f in REQUIRED_INSTANCE_FIELDS if not row.get(f)]
        if missing:
            raise EnvError(f"{p}:{n}: instance lacks {', '.join(missing)}")
        out.append(row)
    if not out:
        raise EnvError(f"{p} holds no instances")
    return out


def docker_status() -> tuple[bool, str]:
    """(reachable, why not): asks the Docker engine itself, since an installed CLI proves nothing."""
    docker = shutil.which("docker")
    if docker is None:
        return False, "the docker CLI is not installed"
    try:
        res = subprocess.run([docker, "info", "--format", "{{.ServerVersion}}"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError) as e:
        return False, f"`docker info` failed ({e})"
    if res.returncode != 0 or not res.stdout.strip():
        return False, (res.stderr.strip().splitlines() or ["no engine answered"])[-1]
    return True, ""


class BenchInstances:
    """SWE-bench instances: a git checkout at the base commit; `git diff` is judged by the harness.

    The checkout comes from `repos_dir/<owner>__<name>` (a local clone) when given, else from GitHub.
    The repository's own environment lives in the harness's Docker image, so `run_tests` is not
    offered locally; the harness runs the instance's FAIL_TO_PASS / PASS_TO_PASS tests at submit.
    """

    offers_run_tests = False

    def __init__(self, instances_path: str | Path, repos_dir: str | Path | None = None, model_name: str = "comprl",
                 dataset_split: str = "test", harness_timeout: float = 3600.0):
        self.instances = load_swe_bench_instances(instances_path)
        self.instances_path = Path(instances_path).resolve()
        self.repos_dir = Path(repos_dir) if repos_dir else None
        self.model_name = model_name
        self.dataset_split = dataset_split
        if not 0 < harness_timeout <= 24 * 3600:
            raise EnvError(f"swe/bench: harness_timeout {harness_timeout:g} s must be within (0, 86400]")
        self.harness_timeout = harness_timeout
        # submit's limit for the env pool (reset info): the harness's own, plus the patch diff and the clean-up
        self.step_budget_s = harness_timeout + 120 + HARNESS_CLEANUP_S + 60  # + git diff, container removal, margin
        self.instance: dict | None = None

    def pick(self, seed: int, options: dict[str, Any]) -> dict:
        if "instance_id" in options:
            found = [i for i in self.instances if i["instance_id"] == options["instance_id"]]
            if not found:
                raise EnvError(f"instance {options['instance_id']!r} is not in {self.instances_path}")
            return found[0]
        return self.instances[seed % len(self.instances)]

    def prepare(self, seed: int, options: dict[str, Any], work: Path) -> tuple[str, dict[str, Any]]:
        self.instance = inst = self.pick(seed, options)
        local = self.repos_dir / inst["repo"].replace("/", "__") if self.repos_dir else None
        source = str(local) if local and local.is_dir() else f"https://github.com/{inst['repo']}.git"
        for argv in (["git", "clone", "--quiet", source, str(work)],
                     ["git", "-C", str(work), "checkout", "--quiet", inst["base_commit"]]):
            try:
                # inside the pool's reset limit (60 s): a local clone (repos_dir) takes seconds, a network one may not
                res = subprocess.run(argv, capture_output=True, text=True, timeout=CLONE_TIMEOUT_S)
            except subprocess.TimeoutExpired as e:
                raise EnvError(f"`{' '.join(argv)}` took over {CLONE_TIMEOUT_S:g} s (the env pool's reset limit); "
                               f"give repos_dir with a local clone of {inst['repo']}") from e
            if res.returncode != 0:
                raise EnvError(f"`{' '.join(argv)}` failed: {res.stderr.strip()[-300:]}; "
                               f"give repos_dir with a clone of {inst['repo']} or allow access to GitHub")
        return inst["problem_statement"].strip(), {"instance_id": inst["instance_id"]}

    def judge(self, ws: Workspace, sandbox: Sandbox, scratch: Path, timeout: float) -> tuple[bool, str]:
        patch = subprocess.run(["git", "-C", str(ws.root), "diff", "--no-color"], capture_output=True, text=True,
                               timeout=120).stdout
        if not patch.strip():
            return False, "empty change: nothing to evaluate"
        return self.evaluate_patch(patch, scratch)

    def prediction_files(self, patch: str, eval_dir: Path) -> tuple[Path, Path]:
        """The harness's inputs: a one-instance dataset file and a predictions JSONL."""
        eval_dir.mkdir(parents=True, exist_ok=True)
        dataset = eval_dir / "instances.json"
        dataset.write_text(json.dumps([self.instance]))
        preds = eval_dir / "predictions.jsonl"
        row = {"instance_id": self.instance["instance_id"], "model_name_or_path": self.model_name, "model_patch": patch}
        preds.write_text(json.dumps(row) + "\n")
        return dataset, preds

    def harness_argv(self, dataset: Path, preds: Path, run_id: str) -> list[str]:
        return [sys.executable, "-m", "swebench.harness.run_evaluation", "--dataset_name", str(dataset),
                "--split", self.dataset_split, "--predictions_path", str(preds),
                "--instance_ids", self.instance["instance_id"], "--max_workers", "1", "--run_id", run_id]

    def evaluate_patch(self, patch: str, scratch: Path) -> tuple[bool, str]:
        """One prediction through `python -m swebench.harness.run_evaluation`; (resolved, log tail)."""
        run_id = f"comprl_{uuid.uuid4().hex[:8]}"
        eval_dir = scratch / "eval"
        dataset, preds = self.prediction_files(patch, eval_dir)
        # Its own session and, where one can be made, its own cgroup (the whole tree is killed on timeout, setsid
        # or not; no caps: it is the harness, not agent code); dead with the env worker if that is killed first
        # (PR_SET_PDEATHSIG). The Docker containers it started for this run id are removed on timeout.
        caps = TreeCaps.detect()
        group = caps.group(memory_mb=1 << 20, max_procs=1 << 16) if caps else None

        def setup() -> None:
            set_parent_death_signal()
            if group is not None:
                group.join()

        try:
            proc = subprocess.Popen(self.harness_argv(dataset, preds, run_id), cwd=eval_dir, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                                    preexec_fn=setup)
            try:
                out, _ = proc.communicate(timeout=self.harness_timeout)
            except subprocess.TimeoutExpired:
                if group is not None:
                    group.kill()
                os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()
                remove_harness_containers(run_id)
                return False, f"the SWE-bench harness did not finish within {self.harness_timeout:g}s (killed)"
        finally:
            if group is not None:
                group.close()
        text = out.decode("utf-8", "replace")
        return read_harness_verdict(eval_dir, run_id, self.instance["instance_id"]), text[-3000:]


CLONE_TIMEOUT_S = 50.0  # a swe/bench reset's git clone + checkout, inside the env pool's 60 s reset limit
HARNESS_CLEANUP_S = 60.0


def remove_harness_containers(run_id: str) -> int:
    """`docker rm -f` the containers the harness started for `run_id` (it names them sweb.eval.<instance>.<run_id>);
    how many. Nothing to do without a docker CLI."""
    docker = shutil.which("docker")
    if docker is None:
        return 0
    try:
        ids = subprocess.run([docker, "ps", "-aq", "--filter", f"name={run_id}"], capture_output=True, text=True,
                             timeout=HARNESS_CLEANUP_S / 2).stdout.split()
        if ids:
            subprocess.run([docker, "rm", "-f", *ids], capture_output=True, timeout=HARNESS_CLEANUP_S / 2)
        return len(ids)
    except (OSError, subprocess.SubprocessError):
        return 0


def read_harness_verdict(eval_dir: Path, run_id: str, instance_id: str) -> bool:
    """Whether the harness resolved the instance: its summary `<model>.<run_id>.json` ("resolved_ids")
    or, failing that, the per-instance logs/run_evaluation/<run_id>/<model>/<id>/report.json."""
    for summary in eval_dir.glob(f"*.{run_id}.json"):
        return instance_id in json.loads(summary.read_text()).get("resolved_ids", [])
    for report in eval_dir.glob(f"logs/run_evaluation/{run_id}/*/{instance_id}/report.json"):
        return bool(json.loads(report.read_text()).get(instance_id, {}).get("resolved", False))
    return False


def make_swe_bench(instances_path: str | Path | None = None, repos_dir: str | Path | None = None,
                   model_name: str = "comprl", dataset_split: str = "test", harness_timeout: float = 3600.0,
                   **options: Any) -> SweEnv:
    """Registry factory for `swe/bench`; raises EnvError unless Docker and swebench are usable here."""
    ok, why = docker_status()
    if not ok:
        raise EnvError(f"swe/bench needs a running Docker engine for the SWE-bench harness ({why}); start one "
                       f"(or set DOCKER_HOST) and `pip install swebench`, or use swe/local.")
    try:
        import swebench  # noqa: F401  (the harness runs as a module; importing checks it is installed)
    except ImportError as e:
        raise EnvError("swe/bench needs the SWE-bench harness: `pip install swebench`.") from e
    if instances_path is None:
        raise EnvError("swe/bench needs instances_path: a JSON or JSONL file of SWE-bench instances.")
    source = BenchInstances(instances_path, repos_dir, model_name, dataset_split, harness_timeout)
    options.setdefault("memory_mb", 2048)
    return SweEnv("swe/bench", source, **options)
