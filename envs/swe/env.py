"""SweEnv: the TextEnv over a code repository (commands in ACTION_FORMAT), driving a task source (LocalTasks or
BenchInstances) and the sandbox (envs/swe/sandbox.py); `make_swe_local`, the `swe/local` factory."""
from __future__ import annotations

import os
import random
import shlex
import shutil
import tempfile
import weakref
from pathlib import Path
from typing import Any

from envs.base import EnvError
from envs.swe.sandbox import SANDBOX_MAX_PROCS, RunResult, Sandbox
from envs.swe.tasks import _PYTEST, _PYTEST_TIME, LocalTasks
from envs.swe.workspace import CommandError, Workspace, _clip, _parse_edit_body

STEP_BUDGET_S = 30.0  # envs/pool.py's default step_timeout_s: a command must end (and be killed) inside it

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
