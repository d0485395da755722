"""Caps on a whole process tree (memory, processes) and a kill that reaches every member: Linux cgroups.

A per-process rlimit caps each process alone (three children of 700 MB each pass a 1 GB RLIMIT_AS); a cgroup
caps the tree, however it forks. `TreeCaps.detect()` picks, once per process, the first that works here:

- "cgroup2": a cgroup v2 hierarchy in which this process may create groups with the memory and pids
  controllers: `memory.max` (and `memory.swap.max` 0, `memory.oom.group` 1: an OOM ends the whole tree),
  `pids.max`; `cgroup.kill` ends every member at once. The groups live under $COMPRL_CGROUP (a folder
  delegated to this user, e.g. by systemd's Delegate=yes) or else `comprl-sandbox` at the top of the
  mounted v2 hierarchy (root).
- "cgroup1": the v1 `memory` and `pids` hierarchies (hybrid or legacy mounts, common in containers and VMs):
  `memory.limit_in_bytes` (and `memory.memsw.limit_in_bytes`, no swap), `pids.max`; the kill sends SIGKILL to
  every pid listed in the groups until they are empty.
- None: no cgroup this process may write (an unprivileged user without delegation, most Docker containers).
  The sandbox then has only per-process rlimits and its PID namespace; `Sandbox.tree_caps` says so.

A group is made per run (`RunGroup`), the child joins it between fork and exec (`join`, before it drops its
privileges), and it is removed when the run ends (`close`: kill, then rmdir).
"""
from __future__ import annotations

import functools
import os
import signal
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

GROUP_PREFIX = "comprl-sandbox"
ENV_ROOT = "COMPRL_CGROUP"


def _mounts() -> list[tuple[str, str, set[str]]]:
    """(mount point, fs type, options) of every cgroup mount, from /proc/self/mounts."""
    out = []
    try:
        lines = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        parts = line.split()
        if len(parts) >= 4 and parts[2] in ("cgroup", "cgroup2"):
            out.append((parts[1].replace("\\040", " "), parts[2], set(parts[3].split(","))))
    return out


def _write(path: Path, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


@dataclass
class TreeCaps:
    """Where run groups are made: kind "cgroup2" (one folder) or "cgroup1" (a memory and a pids folder)."""

    kind: str
    bases: dict[str, Path]  # "unified" for v2; "memory" and "pids" for v1

    @staticmethod
    @functools.lru_cache(maxsize=1)
    def detect() -> TreeCaps | None:
        for probe in (TreeCaps._v2, TreeCaps._v1):
            caps = probe()
            if caps is not None:
                try:  # prove it: a group with limits, made and removed
                    g = caps.group(memory_mb=64, max_procs=8)
                    g.close()
                    return caps
                except OSError:
                    continue
        return None

    @staticmethod
    def _v2() -> TreeCaps | None:
        roots = [Path(os.environ[ENV_ROOT])] if os.environ.get(ENV_ROOT) else \
            [Path(m) / GROUP_PREFIX for m, fs, _ in _mounts() if fs == "cgroup2"]
        for base in roots:
            try:
                base.mkdir(exist_ok=True)
                parent_ctl = base.parent / "cgroup.subtree_control"
                have = set((base.parent / "cgroup.controllers").read_text().split())
                if not {"memory", "pids"} <= have:
                    continue
                if not {"memory", "pids"} <= set(parent_ctl.read_text().split()):
                    _write(parent_ctl, "+memory +pids")
                if not {"memory", "pids"} <= set((base / "cgroup.subtree_control").read_text().split()):
                    _write(base / "cgroup.subtree_control", "+memory +pids")
                return TreeCaps("cgroup2", {"unified": base})
            except OSError:
                continue
        return None

    @staticmethod
    def _v1() -> TreeCaps | None:
        bases: dict[str, Path] = {}
        for point, fs, opts in _mounts():
            for ctl in ("memory", "pids"):
                if fs == "cgroup" and ctl in opts and ctl not in bases:
                    bases[ctl] = Path(point) / GROUP_PREFIX
        if set(bases) != {"memory", "pids"}:
            return None
        try:
            for b in bases.values():
                b.mkdir(exist_ok=True)
        except OSError:
            return None
        return TreeCaps("cgroup1", bases)

    def group(self, memory_mb: int, max_procs: int) -> RunGroup:
        """A new group for one run, with its caps set."""
        name = f"run-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        dirs = [b / name for b in self.bases.values()]
        made: list[Path] = []
        try:
            for d in dirs:
                d.mkdir()
                made.append(d)
            mem = str(memory_mb * 1024 * 1024)
            if self.kind == "cgroup2":
                d = dirs[0]
                _write(d / "memory.max", mem)
                for f, v in (("memory.swap.max", "0"), ("memory.oom.group", "1")):
                    if (d / f).exists():
                        _write(d / f, v)
                _write(d / "pids.max", str(max_procs))
            else:
                m, p = self.bases["memory"] / name, self.bases["pids"] / name
                _write(m / "memory.limit_in_bytes", mem)
                if (m / "memory.memsw.limit_in_bytes").exists():
                    try:
                        _write(m / "memory.memsw.limit_in_bytes", mem)  # memory + swap: no swapping past the cap
                    except OSError:
                        pass  # swap accounting off in this kernel
                _write(p / "pids.max", str(max_procs))
        except OSError:
            for d in made:
                try:
                    d.rmdir()
                except OSError:
                    pass
            raise
        return RunGroup(self.kind, dirs)


@dataclass
class RunGroup:
    kind: str
    dirs: list[Path]

    def join(self) -> None:
        """Move the calling process into the group (from the child, between fork and exec)."""
        for d in self.dirs:
            _write(d / "cgroup.procs", "0")

    def pids(self) -> set[int]:
        out: set[int] = set()
        for d in self.dirs:
            try:
                out |= {int(x) for x in (d / "cgroup.procs").read_text().split()}
            except OSError:
                pass
        return out

    def stat(self) -> dict[str, int]:
        """What the caps did: OOM kills and refused forks, peak memory (what this kernel reports)."""
        out: dict[str, int] = {}
        for d in self.dirs:
            for f in ("memory.events", "pids.events", "memory.oom_control"):
                try:
                    for line in (d / f).read_text().splitlines():
                        k, v = line.split()
                        out[f"{f}:{k}"] = int(v)
                except (OSError, ValueError):
                    pass
            for f in ("memory.failcnt", "memory.max_usage_in_bytes", "memory.peak", "pids.peak"):
                try:
                    out[f] = int((d / f).read_text().split()[0])
                except (OSError, ValueError, IndexError):
                    pass
        return out

    def kill(self) -> None:
        """SIGKILL every member, until none is left (v2: cgroup.kill, which also catches forks in flight)."""
        if self.kind == "cgroup2" and (self.dirs[0] / "cgroup.kill").exists():
            try:
                _write(self.dirs[0] / "cgroup.kill", "1")
            except OSError:
                pass
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:
            left = self.pids()
            if not left:
                return
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            time.sleep(0.01)

    def close(self) -> None:
        self.kill()
        for d in self.dirs:
            for _ in range(100):  # rmdir fails while the last killed member is being reaped
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.01)


def sweep_stale_groups() -> int:
    """Remove run groups of processes that are gone (a worker killed under a run never closed its group)."""
    caps = TreeCaps.detect()
    if caps is None:
        return 0
    n = 0
    for base in caps.bases.values():
        for d in base.glob("run-*-*"):
            try:
                os.kill(int(d.name.split("-")[1]), 0)
                continue
            except ProcessLookupError:
                pass
            except (PermissionError, ValueError):
                continue
            RunGroup(caps.kind, [d]).close()
            n += not d.exists()
    return n
