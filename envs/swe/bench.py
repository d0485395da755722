"""`swe/bench`: SWE-bench instances edited in a local git checkout and judged by the official `swebench` harness
(which needs a Docker engine)."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

from envs.base import EnvError
from envs.sandbox_fs import set_parent_death_signal
from envs.swe.env import SweEnv
from envs.swe.sandbox import Sandbox
from envs.swe.workspace import Workspace
from envs.tree_caps import TreeCaps


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
