"""Software-engineering tasks as text envs: fix a bug in a small repository by tool calls.

- `swe/local` (`make_swe_local`): built-in tasks under `assets/swe_tasks/<task_id>/`: `repo/` (the
  snapshot the agent works on), `issue.md` (the task text), `tests/` (held-out tests the agent never
  sees; they fail until the bug is fixed) and `fix/` (the reference fix as whole fixed files at their
  repo paths). Every episode works in a fresh temporary copy of `repo/`; at `submit` the held-out
  tests are copied into a second copy of the agent's tree and run there: reward 1 when they pass.
- `swe/bench` (`make_swe_bench`): SWE-bench instances from a local JSON/JSONL file, edited in a local
  git checkout and judged by the official `swebench` harness, which needs a Docker engine.

Split by job: `sandbox` (how agent code is run: process isolation, caps on the tree, the unprivileged user, private
scratch folders; its module doc states what a run guarantees), `workspace` (the working copy and its file commands),
`tasks` (the built-in tasks and LocalTasks), `env` (SweEnv, make_swe_local), `expert` (swe_expert), `bench`
(swe/bench through the SWE-bench harness); this module re-exports their public names (and the private ones the tests
read), so `envs.swe.X` keeps working.
"""
from __future__ import annotations

from envs.swe.sandbox import (
    _unshare_works, DISK_POLL_S, file_states, folder_bytes, remove_written_since, RunResult, Sandbox, SANDBOX_MAX_PROCS,
    SANDBOX_UID, SandboxUnavailable, sweep_stale_temp_dirs,
)
from envs.swe.workspace import CommandError, HIDDEN_NAMES, MAX_OUTPUT_CHARS, Workspace
from envs.swe.tasks import load_local_tasks, LocalTasks, SweTask, TASKS_DIR
from envs.swe.env import ACTION_FORMAT, make_swe_local, STEP_BUDGET_S, SweEnv
from envs.swe.expert import swe_expert
from envs.swe.bench import (
    BenchInstances, CLONE_TIMEOUT_S, docker_status, HARNESS_CLEANUP_S, load_swe_bench_instances, make_swe_bench,
    read_harness_verdict, remove_harness_containers, REQUIRED_INSTANCE_FIELDS,
)

__all__ = [
    "ACTION_FORMAT", "BenchInstances", "CLONE_TIMEOUT_S", "CommandError", "DISK_POLL_S", "docker_status", "file_states",
    "folder_bytes", "HARNESS_CLEANUP_S", "HIDDEN_NAMES", "load_local_tasks", "load_swe_bench_instances", "LocalTasks",
    "make_swe_bench", "make_swe_local", "MAX_OUTPUT_CHARS", "read_harness_verdict", "remove_harness_containers",
    "remove_written_since", "REQUIRED_INSTANCE_FIELDS", "RunResult", "Sandbox", "SANDBOX_MAX_PROCS", "SANDBOX_UID",
    "SandboxUnavailable", "STEP_BUDGET_S", "swe_expert", "SweEnv", "SweTask", "sweep_stale_temp_dirs", "TASKS_DIR",
    "Workspace",
]
