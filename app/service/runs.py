"""Runs: the table, the model build, configs, and launching, resuming, forking, commanding and reading the logs
of `comprl train` processes."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from app import views
from app.service.common import (
    _alive, BUILD_SHOWN_S, CONFIG_DIR, _err, log, _max_steps, _ok, ROOT, _tail, trainer_available, UserInputError,
    whole_number,
)
from core import build_progress
from core.config import ConfigError
from core.store import StoreError


def _nice(name: str, default: int) -> int:
    """A nice value from the environment variable `name`, 0-19 (0: the priority the workbench was started with)."""
    raw = os.environ.get(name, str(default))
    if not raw.strip().isdigit() or int(raw) > 19:
        raise SystemExit(f"{name} must be a whole number from 0 to 19, not {raw!r}")
    return int(raw)


AB_NICE = _nice("COMPRL_AB_NICE", 10)  # an A/B test the workbench starts
APP_NICE = _nice("COMPRL_APP_NICE", 10)  # the threads that serve the workbench's requests


class _Launcher:
    """The one thread that forks every run and A/B test the workbench starts. On Linux a priority belongs to a
    thread and a child inherits its forking thread's: the workbench lowers the priority of the threads that serve
    requests (serve_below_runs), so a run forked from one of them would start lowered too. This thread is started
    before that, in the thread that starts the workbench, and keeps the priority the workbench was started with."""

    def __init__(self) -> None:
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="comprl-launcher")
                self._pool.submit(lambda: None).result()  # its thread exists now, forked at this thread's priority

    def popen(self, cmd: list[str], **kw: Any) -> subprocess.Popen:
        self.start()
        assert self._pool is not None
        return self._pool.submit(subprocess.Popen, cmd, **kw).result()


LAUNCHER = _Launcher()


def serve_below_runs(nice: int = APP_NICE) -> int:
    """Start the launcher, then lower this thread's priority by `nice` (the threads it starts later, the web server's
    and the request workers among them, inherit it): on a busy machine a training run gets the cores before the
    workbench's pages and searches do (benchmarks/bench_load.py). Returns the nice value now in force."""
    LAUNCHER.start()
    if nice:
        try:
            return os.nice(nice)  # Linux: this thread only, like setpriority(PRIO_PROCESS, 0)
        except OSError:
            pass
    return os.getpriority(os.PRIO_PROCESS, 0) if hasattr(os, "getpriority") else 0


@dataclass
class _Launched:
    kind: str  # "run" | "ab"
    proc: subprocess.Popen
    log_path: Path
    ab_id: int | None = None
    run_id: int | None = None
    reaped: bool = False


class RunsPart:
    """The Workbench's runs methods (app/service/__init__.py composes the Workbench from these parts; its state
    is set up in Workbench.__init__)."""

    def runs_table(self) -> pd.DataFrame:
        self.reap_processes()
        self.store.reap_dead_runs()  # a trainer killed anywhere (not only one we started) shows as died
        runs = self.store.list_runs()
        latest = {r["id"]: self.store.latest_metrics(r["id"]) for r in runs[:200]}
        return views.runs_table(runs, latest, build=build_progress.building(self.data_dir))

    def build_state(self) -> dict[str, Any] | None:
        """The model build in flight under this data dir (with the run whose process builds it), or one that ended
        in the last BUILD_SHOWN_S; else None."""
        p = build_progress.read_progress(self.data_dir)
        if p is None:
            return None
        if p["state"] != "building" and time.time() - float(p.get("updated_at") or 0) > BUILD_SHOWN_S:
            return None
        p = dict(p)
        p["run_id"] = next((r["id"] for r in self.store.list_runs() if r.get("pid") == p.get("pid")
                            and r["status"] in ("created", "starting", "running", "paused")), None)
        p["is_app"] = p.get("pid") == os.getpid()
        return p

    def build_html(self) -> str:
        """The build's progress bar with its ETA (Runs tab, Live curves); empty when no build is worth showing."""
        return views.build_progress_html(self.build_state())

    def run_choices(self) -> list[tuple[str, int]]:
        return [(f"#{r['id']} {r['name']} ({r['status']})", r["id"]) for r in self.store.list_runs()]

    def shipped_configs(self) -> list[str]:
        return sorted(p.name for p in CONFIG_DIR.glob("*.yaml")) if CONFIG_DIR.is_dir() else []

    def config_text(self, name: str | None) -> str:
        if not name:
            return ""
        path = (CONFIG_DIR / name).resolve()
        if path.parent != CONFIG_DIR.resolve() or not path.is_file():
            return f"# no shipped config named {name!r}\n"
        return path.read_text()

    def check_config(self, text: str) -> Any:
        """Parse and validate a run config (the trainer's RunConfig); raise UserInputError naming the line or field."""
        if not (text or "").strip():
            raise UserInputError("the config is empty; pick a shipped config or write one")
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
            raise UserInputError(f"not valid YAML — {where}{getattr(e, 'problem', None) or e}") from None
        if not isinstance(data, dict):
            raise UserInputError("a run config must be a mapping of sections (e.g. 'env:', 'algorithm:') at its top level")
        ok, why = trainer_available()
        if not ok:
            raise UserInputError(f"cannot check the fields: {why}")
        from trainers.config import check_model_paths, load_run_config  # the trainer is optional here

        try:
            cfg = load_run_config(data)
            check_model_paths(cfg, self.data_dir)  # a model folder that is not there: refused before any row exists
        except ConfigError as e:
            raise UserInputError(str(e)) from None
        return cfg

    def validate_config(self, text: str) -> str:
        try:
            self.check_config(text)
        except UserInputError as e:
            return _err(str(e))
        return _ok("the config is valid")

    def _spawn(self, kind: str, args: list[str], log_name: str, *, ab_id: int | None = None,
               run_id: int | None = None) -> _Launched:
        log_path = self.data_dir / "logs" / log_name
        cmd = [sys.executable, "-m", "app.cli", *args, "--data-dir", str(self.data_dir), "--db", self.db_url]
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"}
        with log_path.open("ab") as logf:
            # A new session: the run outlives a restart of the workbench, and a Ctrl-C here does not reach it.
            proc = LAUNCHER.popen(cmd, cwd=ROOT, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                  env=env, start_new_session=True)
        if kind == "ab" and AB_NICE:
            # An A/B test yields the CPU to training runs: on 2 cores one beside a live run slowed its steps 1.34x
            # (benchmarks/bench_load.py); it gets its turn whenever the run waits. Its threads start later and inherit it.
            try:
                os.setpriority(os.PRIO_PROCESS, proc.pid, AB_NICE)
            except OSError:
                pass  # it already ended (its log says why), or the platform has no priorities
        launched = _Launched(kind, proc, log_path, ab_id, run_id)
        with self._launch_lock:
            self._launched.append(launched)
        return launched

    def launch_run(self, text: str, max_steps: float | int | None = None) -> str:
        """Create the run's row (so it is listed at once), then start `comprl train CONFIG --run-id ID`."""
        try:
            steps = _max_steps(max_steps)
            cfg = self.check_config(text)
        except UserInputError as e:
            return _err(str(e))
        stamp = time.strftime("%Y%m%d-%H%M%S") + f"-{uuid.uuid4().hex[:6]}"
        cfg_path = self.data_dir / "configs" / f"ui-{stamp}.yaml"
        cfg_path.write_text(text)
        log_path = self.data_dir / "logs" / f"train-{stamp}.log"
        run_id = self.store.create_run(cfg.run.name, variant=cfg.run.variant, env=",".join(cfg.env.names), config=text,
                                       status="created", log_path=str(log_path))
        args = ["train", str(cfg_path), "--run-id", str(run_id)]
        if steps:
            args += ["--max-steps", str(steps)]
        launched = self._spawn("run", args, log_path.name, run_id=run_id)
        return _ok(f"launched run {run_id} (process {launched.proc.pid}); log: {log_path}")

    def _launchable_run(self, run_id: Any, max_steps: Any = None) -> tuple[int | None, str]:
        """(run id, "") when `run_id` names a stored run, `max_steps` is empty or a step count, and a trainer
        can be started, else (None, why)."""
        try:
            _max_steps(max_steps)
            rid = self._run_id(run_id)
        except (UserInputError, StoreError) as e:
            return None, str(e)
        ok, why = trainer_available()
        return (rid, "") if ok else (None, why)

    def resume_run(self, run_id: Any, max_steps: float | int | None = None) -> str:
        """Continue a run from its latest checkpoint (`comprl train --resume ID`, with its stored config)."""
        rid, why = self._launchable_run(run_id, max_steps)
        if rid is None:
            return _err(why)
        run = self.store.get_run(rid)
        if run["status"] in ("created", "starting", "running", "paused") and _alive(run.get("pid")):
            return _err(f"run {rid} is still {run['status']} (process {run['pid']}); stop it first")
        why = self._steps_left(run, max_steps, "resume")
        if why:
            return _err(why)
        args = ["train", "--resume", str(rid)]
        if max_steps:
            args += ["--max-steps", str(_max_steps(max_steps))]
        stamp = time.strftime("%Y%m%d-%H%M%S")
        launched = self._spawn("run", args, f"train-{rid}-resume-{stamp}.log", run_id=rid)
        self.store.update_run(rid, log_path=str(launched.log_path))
        return _ok(f"resuming run {rid} from its latest checkpoint (process {launched.proc.pid})")

    def fork_run(self, run_id: Any, max_steps: float | int | None = None) -> str:
        """A new run that starts from another run's latest checkpoint (`comprl train --fork ID`)."""
        rid, why = self._launchable_run(run_id, max_steps)
        if rid is None:
            return _err(why)
        parent = self.store.get_run(rid)
        ck = Path(parent["checkpoint_dir"]) / "latest" if parent.get("checkpoint_dir") else None
        if ck is None or not ck.exists():
            return _err(f"run {rid} has no checkpoint yet; forks start from a checkpoint")
        why = self._steps_left(parent, max_steps, "fork")
        if why:
            return _err(why)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        log_path = self.data_dir / "logs" / f"train-fork-{rid}-{stamp}.log"
        name = f"{parent['name']} (fork of {rid})"[:200]
        new_id = self.store.create_run(name, variant=parent["variant"], env=parent["env"],
                                       config=parent["config"], status="created", log_path=str(log_path), parent_run_id=rid)
        # The fork starts where its parent's checkpoint is: the table says so from the first refresh.
        self.store.update_run(new_id, step=int(parent.get("step") or 0))
        args = ["train", "--fork", str(rid), "--run-id", str(new_id), "--name", name]
        if max_steps:
            args += ["--max-steps", str(_max_steps(max_steps))]
        launched = self._spawn("run", args, log_path.name, run_id=new_id)
        return _ok(f"forked run {rid} into run {new_id} (process {launched.proc.pid}); log: {log_path}")

    def _steps_left(self, run: dict[str, Any], max_steps: Any, verb: str) -> str:
        """Why a resume or fork of `run` would end at once (its step is already at the step cap), else ""."""
        from trainers.config import load_run_config

        try:
            cap = _max_steps(max_steps) or load_run_config(run["config"]).run.max_steps
        except (UserInputError, ConfigError, TypeError, ValueError):
            return ""  # the trainer says what is wrong with a stored config
        step = int(run.get("step") or 0)
        if step >= cap:
            return (f"run {run['id']} is at step {step}, and the {verb} would stop at max steps {cap}: nothing to train. "
                    f"Give a larger max steps (e.g. {step + max(10, step // 2)}).")
        return ""

    def run_details(self, run_id: Any) -> str:
        """What one line of the runs table leaves out: the back end, the parent, the log, the error."""
        try:
            rid = self._run_id(run_id)
        except (UserInputError, StoreError) as e:
            return _err(str(e))
        r = self.store.get_run(rid)
        children = [x["id"] for x in self.store.list_runs() if x.get("parent_run_id") == rid]
        return views.run_details_md(r, children, self.build_state(), self.store.latest_metrics(rid))

    def start_demo_run(self, config_name: str = "minihack_room_cpu.yaml") -> str:
        """`comprl app --demo`: start the CPU default run unless one is already running."""
        if any(r["status"] == "running" for r in self.store.list_runs()):
            return "a run is already running; no demo run started"
        path = CONFIG_DIR / config_name
        if not path.is_file():
            return _err(f"demo run not started: {path} does not exist")
        return self.launch_run(path.read_text())

    def _run_id(self, run_id: Any) -> int:
        if run_id in (None, ""):
            raise UserInputError("choose a run first (its id from the table)")
        rid = whole_number(run_id, "run id")
        self.store.get_run(rid)  # NotFoundError names it
        return rid

    def run_command(self, run_id: Any, command: str) -> str:
        try:
            rid = self._run_id(run_id)
            run = self.store.get_run(rid)
            if run["status"] in ("finished", "failed", "stopped"):
                return _err(f"run {rid} has already {run['status']}; nothing to {command}")
            self.store.send_command(rid, command)
        except (UserInputError, StoreError) as e:
            return _err(str(e))
        return _ok(f"sent '{command}' to run {rid}; the run acts on it at its next step")

    def _log_path_for(self, run: dict[str, Any]) -> Path | None:
        if run.get("log_path"):
            return Path(run["log_path"])
        with self._launch_lock:
            for launched in self._launched:
                if launched.kind == "run" and launched.proc.pid == run.get("pid"):
                    return launched.log_path
        return None

    def log_tail(self, run_id: Any, lines: int = 200) -> str:
        try:
            rid = self._run_id(run_id)
        except (UserInputError, StoreError) as e:
            return str(e)
        run = self.store.get_run(rid)
        path = self._log_path_for(run)
        if path is None or not path.is_file():
            where = ("its log file is not written yet" if path is not None else
                     "it was not started from this workbench, so its output went to the terminal that started it")
            return f"run {rid}: {where}" + (f" (error: {run['error']})" if run.get("error") else "")
        return _tail(path, lines)

    def launch_log_tail(self, lines: int = 60) -> str:
        """The newest process this workbench started (a run that failed before creating its row shows why here)."""
        with self._launch_lock:
            if not self._launched:
                return ""
            last = self._launched[-1]
        state = "running" if last.proc.poll() is None else f"exited with code {last.proc.returncode}"
        return f"[{last.kind} process {last.proc.pid}: {state}] {last.log_path}\n" + _tail(last.log_path, lines)

    def reap_processes(self) -> None:
        """Notice processes we started that died without saying so in the store, and say it for them."""
        with self._launch_lock:
            todo = [p for p in self._launched if not p.reaped and p.proc.poll() is not None]
        for p in todo:
            p.reaped = True
            code = p.proc.returncode
            try:
                if p.kind == "ab" and p.ab_id is not None:
                    t = self.store.get_ab_test(p.ab_id)
                    if t["status"] not in ("done", "failed"):
                        self.store.update_ab_test(p.ab_id, status="failed",
                                                  error=f"evaluation process exited with code {code}: " + _tail(p.log_path, 20))
                elif p.kind == "run" and code != 0 and p.run_id is not None:
                    r = self.store.get_run(p.run_id)
                    if r["status"] in ("created", "starting", "running", "paused"):
                        self.store.update_run(p.run_id, status="failed", ended_at=time.time(),
                                              error=f"process exited with code {code}: " + _tail(p.log_path, 5))
            except StoreError:
                log.exception("could not record the end of process %s", p.proc.pid)
