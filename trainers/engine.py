"""The run harness: a run's row in the store, its commands, metrics, checkpoints and signals.

What `comprl train` (app/cli.py) and the training loop (trainers/cotrain.py `train`) call:

    ctx = RunContext.open(cfg, data_dir=..., db_url=..., run_id=None, resume=None, fork=None)
    ckpt = ctx.latest_checkpoint()          # the folder the models load from: None, or the newest step_N
    state = ctx.load_state()                # None, or the `state` save_checkpoint stored (sets ctx.start_step)
    while ...:
        if ctx.poll() == "stop": break        # honours pause / resume / stop from the workbench
        ctx.log(step, metrics)                # metrics into the store, a line on the terminal
        ctx.save_checkpoint(step, models={"policy": backend, ...}, state={...})  # atomic: a SIGKILL mid-save
                                              # leaves the previous one
    ctx.finish("finished")

Checkpoint folder: <data_dir>/runs/<id>/checkpoints/step_<N>/ with policy/ (and extractor/) model
folders and state.pt (optimisers, RNG states, step, library version, buffers); `latest` names the
newest complete one. The two newest are kept.
"""
from __future__ import annotations

import json
import multiprocessing
import os
import random
import shutil
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from core.build_progress import request_stop
from core.store import HEARTBEAT_S, LIVE_STATUSES, ExperienceStore
from trainers.config import RunConfig, dump_run_config

KEEP_CHECKPOINTS = 2


class StopRequested(Exception):
    pass


@dataclass
class RunContext:
    cfg: RunConfig
    store: ExperienceStore
    run_id: int
    data_dir: Path
    run_dir: Path
    start_step: int = 0
    fork_from: Path | None = None  # a parent run's checkpoint this run starts from (fork)
    dropped: dict[str, int] = field(default_factory=dict)  # what load_state took back (store.drop_after_step)
    stop_flag: threading.Event = field(default_factory=threading.Event)
    _last_print: float = 0.0

    @classmethod
    def open(cls, cfg: RunConfig, *, data_dir: str | os.PathLike[str], db_url: str, run_id: int | None = None,
             resume: int | None = None, fork: int | None = None) -> "RunContext":
        """Create the run's row (or adopt `run_id`, made by the workbench; or reopen `resume`; or start
        a new run from `fork`'s latest checkpoint, recorded as its parent)."""
        store = ExperienceStore(db_url)
        data_dir = Path(data_dir).resolve()
        env_label = ",".join(cfg.env.names)
        fork_from = None
        if fork is not None:
            parent = store.get_run(fork)
            fork_from = latest_checkpoint(Path(parent["checkpoint_dir"])) if parent["checkpoint_dir"] else None
            if fork_from is None:
                store.close()
                raise ValueError(f"run {fork} has no checkpoint to fork from yet")
        if resume is not None:
            # A run whose trainer died still says "running": notice that first, and refuse to start a second
            # trainer on a run whose first one is alive (two writers of one checkpoint folder).
            store.reap_dead_runs()
            prev = store.get_run(resume)
            if prev["status"] in LIVE_STATUSES:
                store.close()
                raise ValueError(f"run {resume} is still {prev['status']} (process {prev['pid']} on {prev['host'] or '?'}); "
                                 f"stop it first (comprl's workbench, or kill {prev['pid']})")
            run_id = resume
        elif run_id is None:
            run_id = store.create_run(cfg.run.name, variant=cfg.run.variant, env=env_label, config=dump_run_config(cfg),
                                      status="starting", parent_run_id=fork)
        else:
            store.get_run(run_id)
            store.update_run(run_id, name=cfg.run.name, variant=cfg.run.variant, env=env_label, config=dump_run_config(cfg),
                             **({"parent_run_id": fork} if fork is not None else {}))
        run_dir = data_dir / "runs" / str(run_id)
        run_dir.mkdir(parents=True, exist_ok=True)
        clean_partial_checkpoints(run_dir / "checkpoints")
        store.update_run(run_id, status="running", pid=os.getpid(), host=socket.gethostname()[:256],
                         heartbeat_at=time.time(), checkpoint_dir=str(run_dir / "checkpoints"), error="", ended_at=None)
        ctx = cls(cfg, store, run_id, data_dir, run_dir, fork_from=fork_from)
        ctx._install_signals()
        ctx._start_heartbeat()
        return ctx

    def _start_heartbeat(self) -> None:
        """A daemon thread that stamps the run's row every HEARTBEAT_S: how a killed trainer is told from a
        slow one (a CPU step takes minutes, so the step's own writes are too far apart)."""
        self._beat_stop = threading.Event()

        def beat() -> None:
            while not self._beat_stop.wait(HEARTBEAT_S):
                try:
                    self.store.heartbeat(self.run_id)
                except Exception:  # noqa: BLE001 - a busy database skips a beat; the next one comes in 5 s
                    pass

        threading.Thread(target=beat, name="heartbeat", daemon=True).start()

    # -- signals and commands ----------------------------------------------------------------------

    def _install_signals(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return

        def on_signal(signum, _frame):  # noqa: ANN001
            # A graceful stop: finish the phase in flight, write a checkpoint, exit. A model build or a wait for
            # another process's build (core/build_progress.py) ends at its next step. A CPU step can take minutes,
            # so a second signal stops at once: the row says stopped, the last complete checkpoint is kept.
            if self.stop_flag.is_set():
                try:
                    self.finish("stopped", "stopped at once by a second signal; resumes from the last checkpoint")
                finally:
                    for child in multiprocessing.active_children():  # the env pool's workers go with us
                        child.kill()
                    os._exit(128 + signum)
            self.stop_flag.set()
            request_stop()
            print(f"run {self.run_id}: stopping after the step in flight (a checkpoint is written); send the signal "
                  "again (Ctrl-C) to stop at once", file=sys.stderr, flush=True)

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)

    def poll(self) -> str | None:
        """Apply pending run commands; blocks while paused. Returns "stop" when the run must end."""
        if self.stop_flag.is_set():
            return "stop"
        paused = False
        while True:
            for cmd in self.store.take_commands(self.run_id):
                if cmd == "stop":
                    self.stop_flag.set()
                    return "stop"
                paused = cmd == "pause"
            if not paused:
                self.store.update_run(self.run_id, status="running")
                return None
            self.store.update_run(self.run_id, status="paused")
            if self.stop_flag.wait(0.5):
                return "stop"

    # -- metrics ---------------------------------------------------------------------------------

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.store.log_metrics(self.run_id, step, metrics)
        self.store.update_run(self.run_id, step=step)
        now = time.time()
        if now - self._last_print > 0.5 or step == self.cfg.run.max_steps:
            self._last_print = now
            done = step / max(1, self.cfg.run.max_steps)
            bar = "#" * int(30 * done) + "-" * (30 - int(30 * done))
            keys = ("policy/success_with_exp", "policy/success_without_exp", "policy/loss", "extractor/reward_mean", "library/size")
            shown = "  ".join(f"{k.split('/')[-1]} {metrics[k]:.3f}" for k in keys if k in metrics)
            print(f"[{bar}] step {step}/{self.cfg.run.max_steps}  {shown}", flush=True)

    def describe_backend(self, backend: str, device: str) -> None:
        print(f"run {self.run_id}: actor back end {backend}", flush=True)
        self.store.update_run(self.run_id, backend=backend[:250], device=device)

    # -- checkpoints -------------------------------------------------------------------------------

    @property
    def ckpt_root(self) -> Path:
        return self.run_dir / "checkpoints"

    def save_checkpoint(self, step: int, *, models: dict[str, Any], state: dict[str, Any]) -> Path:
        """models: name -> backend with .save(path); state: picklable (optimisers' state_dicts, buffers …)."""
        root = self.ckpt_root
        root.mkdir(parents=True, exist_ok=True)
        clean_partial_checkpoints(root)
        final = root / f"step_{step:06d}"
        tmp = root / f".tmp_step_{step:06d}_{os.getpid()}"
        tmp.mkdir()
        for name, backend in models.items():
            backend.save(tmp / name)
        full = {**state, "step": step, "rng": rng_state(), "library_version": self.store.library_version(),
                "saved_at": time.time()}
        torch.save(full, tmp / "state.pt")
        if final.exists():
            # The end-of-run re-save of a step already saved: move the old copy aside before the new one takes
            # its name, so a kill between the two renames leaves a complete step_N (.old_ is restored on open).
            old = root / f".old_step_{step:06d}_{os.getpid()}"
            final.rename(old)
            tmp.rename(final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(final)
        latest_tmp = root / ".latest.tmp"
        latest_tmp.write_text(final.name)
        latest_tmp.replace(root / "latest")
        for old in sorted(p for p in root.glob("step_*") if p.is_dir())[:-KEEP_CHECKPOINTS]:
            shutil.rmtree(old, ignore_errors=True)
        return final

    def latest_checkpoint(self) -> Path | None:
        """This run's newest checkpoint, or (a fork that has none of its own yet) the parent's."""
        return latest_checkpoint(self.ckpt_root) or self.fork_from

    def load_state(self) -> dict[str, Any] | None:
        ck = self.latest_checkpoint()
        state = None
        if ck is not None:
            state = torch.load(ck / "state.pt", weights_only=False)
            set_rng_state(state["rng"])
            self.start_step = int(state["step"])
        # Steps past the checkpoint are about to be redone: what a killed earlier attempt logged for them
        # goes, so each (step, key) and each episode is stored once (a fresh run has nothing to drop).
        # Counters the algorithm reads (retrievals for Eq. 6, training marks for Eq. 7, outcomes) go back to the
        # checkpoint's values, and the library writes of those steps are undone (archived, or restored).
        self.dropped = dropped = self.store.drop_after_step(self.run_id, self.start_step)
        if any(dropped.values()):
            print(f"run {self.run_id}: took back what the interrupted attempt wrote past step {self.start_step}: "
                  f"{dropped['metrics']} metric points, {dropped['episodes']} episodes, {dropped['outcomes']} entry outcomes, "
                  f"{dropped['retrievals']} retrievals, {dropped['trainings']} training marks, {dropped['entries']} "
                  "entry changes", flush=True)
        return state

    # -- the end ------------------------------------------------------------------------------------

    def finish(self, status: str, error: str = "") -> None:
        if getattr(self, "_beat_stop", None) is not None:
            self._beat_stop.set()
        self.store.update_run(self.run_id, status=status, error=error[-4000:], ended_at=time.time(), pid=None)
        print(f"run {self.run_id} {status}{': ' + error.splitlines()[-1] if error else ''}", file=sys.stderr if error else sys.stdout,
              flush=True)


def clean_partial_checkpoints(root: Path) -> None:
    """Undo what a kill during save_checkpoint left: half-written `.tmp_step_*` folders (each a full model
    copy) are deleted; a `.old_step_N` moved aside for a re-save is put back if step_N never arrived."""
    if not root.is_dir():
        return
    for old in root.glob(".old_step_*"):
        final = root / ("step_" + old.name[len(".old_step_"):].split("_")[0])
        if (final / "state.pt").exists():
            shutil.rmtree(old, ignore_errors=True)
        else:
            shutil.rmtree(final, ignore_errors=True)
            old.rename(final)
    for tmp in root.glob(".tmp_step_*"):
        shutil.rmtree(tmp, ignore_errors=True)
    (root / ".latest.tmp").unlink(missing_ok=True)


def latest_checkpoint(root: Path) -> Path | None:
    marker = root / "latest"
    if marker.exists():
        p = root / marker.read_text().strip()
        if (p / "state.pt").exists():
            return p
    done = sorted(p for p in root.glob("step_*") if (p / "state.pt").exists())
    return done[-1] if done else None


def rng_state() -> dict[str, Any]:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def set_rng_state(s: dict[str, Any]) -> None:
    random.setstate(s["python"])
    np.random.set_state(s["numpy"])
    torch.set_rng_state(s["torch"])


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def write_json(path: Path, obj: Any) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(obj, indent=2))
    tmp.replace(path)
