"""The SWE demonstrator: replays a swe/local task's reference fix through the env's own commands."""
from __future__ import annotations

import difflib

from envs.base import EnvError
from envs.swe.env import SweEnv
from envs.swe.tasks import LocalTasks


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
