"""The run harness: a run's row in the store, its commands, metrics, checkpoints and signals.

What the training loop (trainers/cotrain.py) calls, phase by phase:

    run = RunContext.open(cfg, data_dir=..., db_url=..., run_id=None, resume=None)
    state = run.load_checkpoint()           # None, or what save_checkpoint stored
    while ...:
        if run.poll() == "stop": break        # honours pause / resume / stop from the workbench
        run.log(step, metrics)                # metrics into the store, a line on the terminal
        run.save_checkpoint(step, state)      # atomic: a SIGKILL mid-save leaves the previous one
    run.finish("finished")

Checkpoint folder: <data_dir>/runs/<id>/checkpoints/step_<N>/ with policy/ (and extractor/) model
folders and state.pt (optimisers, RNG states, step, library version, buffers); `latest` names the
newest complete one. The two newest are kept.
"""
from __future__ import annotations

import json
import os
import random
import shutil
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from core.store import ExperienceStore
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
            store.get_run(resume)
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
        store.update_run(run_id, status="running", pid=os.getpid(), checkpoint_dir=str(run_dir / "checkpoints"), error="",
                         ended_at=None)
        ctx = cls(cfg, store, run_id, data_dir, run_dir, fork_from=fork_from)
        ctx._install_signals()
        return ctx

    # -- signals and commands ----------------------------------------------------------------------

    def _install_signals(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return

        def on_signal(signum, _frame):  # noqa: ANN001
            # A graceful stop: finish the phase in flight, write a checkpoint, exit.
            self.stop_flag.set()

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
        final = root / f"step_{step:06d}"
        tmp = root / f".tmp_step_{step:06d}_{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        for name, backend in models.items():
            backend.save(tmp / name)
        full = {**state, "step": step, "rng": rng_state(), "library_version": self.store.library_version(),
                "saved_at": time.time()}
        torch.save(full, tmp / "state.pt")
        shutil.rmtree(final, ignore_errors=True)
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
        if ck is None:
            return None
        state = torch.load(ck / "state.pt", weights_only=False)
        set_rng_state(state["rng"])
        self.start_step = int(state["step"])
        return state

    # -- the end ------------------------------------------------------------------------------------

    def finish(self, status: str, error: str = "") -> None:
        self.store.update_run(self.run_id, status=status, error=error[-4000:], ended_at=time.time(), pid=None)
        print(f"run {self.run_id} {status}{': ' + error.splitlines()[-1] if error else ''}", file=sys.stderr if error else sys.stdout,
              flush=True)


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
