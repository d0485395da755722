"""What the filesystem looks like to sandboxed agent code when the env runs as root: a private mount namespace.

Two things are arranged there, between fork and exec, before the child drops to the sandbox user:

- The interpreter becomes reachable by that user without changing the host: a folder on the way to it that
  others may not enter (`/root`, mode 700, holding a pyenv Python) is covered by an empty tmpfs, and only the
  interpreter's own trees (its prefix, base prefix and sys.path folders) are bind-mounted back, read-only.
  Everything else in that folder (keys, other projects) is not there for the sandbox.
- The world-writable scratch folders (/tmp, /var/tmp, /dev/shm) are small private tmpfs mounts, so a script
  cannot leave files outside its copy or fill the host's disk through them; the episode's own folders (which
  live under the temp dir) are bind-mounted back at their paths, so every absolute path stays valid.

Mounts made in the namespace vanish with its last process: nothing is left on the host. Making a mount
namespace needs CAP_SYS_ADMIN (root outside most containers); `MountPlan.apply` raises OSError where it is
refused, and the sandbox then says so (Sandbox.fs_isolation).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import stat
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

CLONE_NEWNS = 0x00020000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 4, 32, 4096, 16384, 1 << 18
SCRATCH = ("/tmp", "/var/tmp", "/dev/shm")
SCRATCH_MB = 64  # each private scratch tmpfs (it is memory: the tree's memory cgroup is charged for it)

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]


def _check(rc: int, what: str) -> None:
    if rc != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"{what}: {os.strerror(e)}")


def _mount(src: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    enc = lambda x: None if x is None else x.encode()  # noqa: E731
    _check(_libc.mount(enc(src), enc(target), enc(fstype), flags, enc(data)), f"mount {target}")


def set_parent_death_signal(sig: int = 9) -> None:
    """The calling process gets `sig` when its parent (the env worker) dies: a killed worker leaves no tree behind."""
    PR_SET_PDEATHSIG = 1
    _libc.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)


def others_can_enter(path: Path) -> bool:
    try:
        return bool(os.stat(path).st_mode & stat.S_IXOTH)
    except OSError:
        return False


def interpreter_trees(python: str) -> list[Path]:
    """The folders `python` reads at start and import time: its prefixes and sys.path (asked of it, as this user)."""
    code = ("import sys, json, os; print(json.dumps([os.path.dirname(os.path.realpath(sys.executable)), sys.prefix, "
            "sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix] + sys.path))")
    res = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60, cwd="/")
    if res.returncode != 0:
        return []
    dirs = {Path(os.path.realpath(p)) for p in json.loads(res.stdout) if p}
    dirs = {d for d in dirs if d.is_dir()}
    return sorted(d for d in dirs if not any(o != d and o in d.parents for o in dirs))  # outermost only


@dataclass
class MountPlan:
    """Covers (folder -> tmpfs options) and bind-backs (path, read-only) for one run's namespace."""

    covers: dict[str, str] = field(default_factory=dict)
    binds: list[tuple[str, bool]] = field(default_factory=list)
    trees: list[str] = field(default_factory=list)  # the interpreter's trees (bound back if a scratch cover hides one)

    @staticmethod
    def for_interpreter(python: str) -> MountPlan:
        """Cover the first folder others may not enter on the way to each of the interpreter's trees; bind the
        trees back read-only. Empty when the interpreter is already reachable."""
        plan = MountPlan(trees=[str(t) for t in interpreter_trees(python)])
        for tree in map(Path, plan.trees):
            for up in [*reversed(tree.parents), tree][1:]:  # from the top down, / excluded
                if not others_can_enter(up):
                    if up == tree:  # the tree itself is closed: there is nothing to expose but it, as it is
                        break
                    plan.covers.setdefault(str(up), "mode=0755,size=1m")
                    plan.binds.append((str(tree), True))
                    break
        return plan

    def with_scratch(self, keep: list[Path]) -> MountPlan:
        """This plan plus private scratch folders, with `keep` (the episode's folders under them) bound back."""
        plan = MountPlan(dict(self.covers), list(self.binds), list(self.trees))
        for d in SCRATCH:
            if os.path.isdir(d) and not os.path.islink(d):
                plan.covers[d] = f"mode=1777,size={SCRATCH_MB}m"
                # an interpreter installed under a scratch folder (a venv in a checkout under /tmp) stays reachable
                plan.binds += [(t, True) for t in self.trees if t.startswith(d.rstrip("/") + "/")
                               and (t, True) not in plan.binds]
        for k in keep:
            plan.binds.append((str(k), False))
        return plan

    def apply(self) -> None:
        """In the calling process (a child between fork and exec, still root): a new mount namespace laid out by
        the plan. Raises OSError if any step is refused."""
        _check(_libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
        _mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing done here propagates to the host
        covers = [c for c in sorted(self.covers) if not any(o != c and c.startswith(o.rstrip("/") + "/")
                                                           for o in self.covers)]
        # Hold every folder to bind back by a descriptor before anything covers its path.
        fds = [(os.open(path, os.O_PATH | os.O_DIRECTORY), path, ro) for path, ro in self.binds
               if any(path == c or path.startswith(c.rstrip("/") + "/") for c in covers)]
        try:
            for c in covers:
                _mount("tmpfs", c, "tmpfs", MS_NOSUID | MS_NODEV, self.covers[c])
            for fd, path, ro in fds:
                os.makedirs(path, mode=0o755, exist_ok=True)
                _mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)
                if ro:
                    _mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
        finally:
            for fd, _, _ in fds:
                os.close(fd)
