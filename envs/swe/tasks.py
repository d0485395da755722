"""Built-in SWE tasks (`swe/local`): the task folders under assets/swe_tasks/ and LocalTasks, the task source that
copies a task's repo/ for an episode and judges a submission with its held-out tests/ in the sandbox."""
from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envs.base import EnvError
from envs.swe.sandbox import Sandbox
from envs.swe.workspace import HIDDEN_NAMES, Workspace

TASKS_DIR = Path(__file__).resolve().parent.parent.parent / "assets" / "swe_tasks"


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
