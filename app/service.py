"""What the workbench does, behind the UI: every Gradio callback is one line into a `Workbench` method.

The service reads and writes through `core.store.ExperienceStore` (the only code that touches the
database), searches through an `ExperienceManager` (the same embedder and index as the actor's
retrieval, with usage counting off), starts runs and A/B evaluations as separate `comprl`
processes, and formats with `app.views`. It never imports Gradio, so every callback is tested
without a browser.

Methods return what the UI shows: strings (Markdown/HTML), DataFrames, figure JSON. Errors a
person can act on come back as a message, never as a traceback; `None` in a figure list means
"unchanged since the last refresh" (the UI skips that output).
"""
from __future__ import annotations

import html
import math
import importlib
import logging
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd
import yaml

from app import views
from core import build_progress, library_io, merge
from core.config import ConfigError, LibraryConfig, default_db_url
from core.library_io import MAX_ENTRY_CHARS
from core.metrics import mcnemar_test, paired_outcomes
from core.store import INT32, ExperienceStore, NewEntry, NotFoundError, StaleWriteError, StoreError
from core.types import Experience, Source, Status, format_entry_text

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[1]
CONFIG_DIR = ROOT / "configs"
DEFAULT_UPLOAD_CAP_MB = 20.0
ARM_KINDS = ("current", "version", "file", "none", "minus", "plus")
MAX_SEEDS = 10_000
LOG_TAIL_BYTES = 64_000
BUILD_SHOWN_S = 600.0  # a finished model build stays on the Runs tab this long ("models ready")
ROWS_PER_KEY_PER_PULL = 10_000  # metric rows read per (run, key) per refresh: a long history loads over a few ticks
PULL_INTERVAL_S = 0.5  # sessions refreshing within this of each other share one read of the store


class UserInputError(ValueError):
    """Input a person can correct; the message says what and how."""


def _ok(msg: str) -> str:
    return f"**OK** — {msg}"


def _err(msg: str) -> str:
    return f"**Error** — {msg}"


def trainer_available() -> tuple[bool, str]:
    """Whether the training engine can be imported here (runs, A/B evaluations and policy play need it)."""
    try:
        importlib.import_module("trainers.engine")
    except Exception as e:  # any import failure means the same to a person: no trainer here
        return False, f"the trainer is not available (importing trainers.engine failed: {type(e).__name__}: {e})"
    return True, "trainer available"


def whole_number(value: Any, what: str, *, lo: int = 1, hi: int = INT32[1]) -> int:
    """A number typed or picked in the page, as an int within [lo, hi], else UserInputError naming `what`.

    Every id, version, seed and count from the browser goes through here: a float box (inf, NaN, 1e400), a
    30-digit string or 2**63 is a message, never "the app raised an exception". The ceiling is the store's
    (32-bit integer columns: core/store.py INT32)."""
    if isinstance(value, bool) or value is None:
        raise UserInputError(f"give {what} as a whole number")
    if isinstance(value, float):
        if not math.isfinite(value) or value != int(value):
            raise UserInputError(f"{what} must be a whole number, not {value}")
        n = int(value)
    elif isinstance(value, (int, np.integer)):
        n = int(value)
    else:
        text = str(value).strip().lstrip("#").strip()
        if not re.fullmatch(r"[+-]?\d{1,40}", text):
            raise UserInputError(f"{what} must be a whole number, not {str(value)[:40]!r}")
        n = int(text)
    if not lo <= n <= hi:
        raise UserInputError(f"{what} {n} is out of range: it must be from {lo} to {hi}")
    return n


def parse_ids(text: str | Sequence[int] | None) -> list[int]:
    """'3, 7 12' or [3, 7, 12] -> [3, 7, 12] (order kept, repeats dropped)."""
    if text is None:
        return []
    parts = text if isinstance(text, (list, tuple)) else re.split(r"[\s,;]+", str(text).strip())
    out: list[int] = []
    for p in parts:
        if p in ("", None):
            continue
        if not re.fullmatch(r"#?\d+", str(p).strip()):
            raise UserInputError(f"{p!r} is not an entry id; give ids as numbers separated by commas")
        i = whole_number(p, "entry id")
        if i not in out:
            out.append(i)
    return out


def parse_seeds(text: str) -> list[int]:
    """'0-19' or '1, 2, 5-7' -> the seeds; at most MAX_SEEDS."""
    seeds: list[int] = []
    for part in re.split(r"[\s,;]+", (text or "").strip()):
        if not part:
            continue
        m = re.fullmatch(r"(-?\d+)\s*(?:-|\.\.)\s*(-?\d+)", part)
        if m:
            a, b = (whole_number(g, "seed", lo=INT32[0]) for g in m.groups())
            if b < a:
                raise UserInputError(f"seed range {part!r} runs backwards; write it low-high")
            if b - a + 1 > MAX_SEEDS:
                raise UserInputError(f"seed range {part!r} has more than {MAX_SEEDS} seeds")
            seeds.extend(range(a, b + 1))
        elif re.fullmatch(r"-?\d+", part):
            seeds.append(whole_number(part, "seed", lo=INT32[0]))
        else:
            raise UserInputError(f"{part!r} is not a seed; write seeds like '0-19' or '1, 2, 5'")
    if not seeds:
        raise UserInputError("give at least one task seed, e.g. '0-19'")
    if len(seeds) > MAX_SEEDS:
        raise UserInputError(f"{len(seeds)} seeds is more than the cap of {MAX_SEEDS}")
    return list(dict.fromkeys(seeds))


# -- live curves: per-session series kept in memory, fed by cursors ------------------------------------


class _Grow:
    """A float64 array that grows by doubling (appending 100 points to 100k does not copy 100k)."""

    def __init__(self) -> None:
        self.buf = np.empty(256, dtype=np.float64)
        self.n = 0

    def extend(self, xs: np.ndarray) -> None:
        need = self.n + len(xs)
        if need > len(self.buf):
            new = np.empty(max(need, 2 * len(self.buf)), dtype=np.float64)
            new[: self.n] = self.buf[: self.n]
            self.buf = new
        self.buf[self.n:need] = xs
        self.n = need

    @property
    def view(self) -> np.ndarray:
        return self.buf[: self.n]


@dataclass
class _History:
    """One (run, key) series as read so far, shared by every browser session (metrics are append-only)."""

    steps: _Grow = field(default_factory=_Grow)
    values: _Grow = field(default_factory=_Grow)
    times: _Grow = field(default_factory=_Grow)
    cursor: int = 0  # id of the last metric row read: the next read starts after it
    complete: bool = False  # the last read reached the end of what the store had


class MetricCache:
    """Process-wide series cache fed by per-(run, key) cursors: the store is asked only for rows past each
    cursor, once per run per PULL_INTERVAL_S however many sessions watch, at most ROWS_PER_KEY_PER_PULL per key
    per pull (a 100k-point history loads over a few ticks instead of stalling one)."""

    def __init__(self, store: ExperienceStore, max_runs: int = 32) -> None:
        self.store = store
        self.max_runs = max_runs
        self._series: dict[tuple[int, str], _History] = {}
        self._runs: OrderedDict[int, float] = OrderedDict()  # run -> time of its last pull (LRU order)
        self._locks: dict[int, threading.Lock] = {}
        self._lock = threading.Lock()
        self._reset_seen: dict[int, float | None] = {}  # run -> its metrics_reset_at when its series were read

    def pull(self, run_id: int, keys: Sequence[str]) -> int:
        with self._lock:
            lock = self._locks.setdefault(run_id, threading.Lock())
        with lock:
            last = self._runs.get(run_id, 0.0)
            if time.monotonic() - last < PULL_INTERVAL_S and all(
                    self._series.get((run_id, k), _History(complete=True)).complete for k in keys):
                return 0
            # Metric rows are append-only except when a resume drops the steps it redoes or a value is logged
            # again: then the run's series are read afresh (ids may even be reused by SQLite).
            reset = self.store.metrics_reset_at(run_id)
            if self._reset_seen.get(run_id) != reset:
                with self._lock:
                    for key in [key for key in self._series if key[0] == run_id]:
                        del self._series[key]
                self._reset_seen[run_id] = reset
            n = 0
            for k in keys:
                h = self._series.get((run_id, k))
                cols = self.store.metric_series_since(run_id, k, after_id=h.cursor if h else 0, limit=ROWS_PER_KEY_PER_PULL)
                got = len(cols["id"])
                if h is None:
                    if not got:
                        continue
                    h = self._series[(run_id, k)] = _History()
                if got:
                    h.steps.extend(cols["step"])
                    h.values.extend(cols["value"])
                    h.times.extend(cols["time"])
                    h.cursor = int(cols["id"][-1])
                h.complete = got < ROWS_PER_KEY_PER_PULL
                n += got
            with self._lock:
                self._runs[run_id] = time.monotonic()
                self._runs.move_to_end(run_id)
                while len(self._runs) > self.max_runs:
                    old, _ = self._runs.popitem(last=False)
                    self._reset_seen.pop(old, None)
                    for key in [key for key in self._series if key[0] == old]:
                        del self._series[key]
            return n

    def get(self, run_id: int, key: str) -> _History | None:
        return self._series.get((run_id, key))


@dataclass
class _Smoothed:
    """A session's smoothing of one shared series: how many points it has taken in, and their EMA."""

    n: int = 0
    smooth: _Grow = field(default_factory=_Grow)
    state: tuple[float, int] = (0.0, 0)
    weight: float = -1.0
    source: Any = None  # the _History it smooths: a new one (the run's series re-read) starts it over

    def catch_up(self, values: np.ndarray, weight: float) -> int:
        """Smooth the points past `n` (all of them again when the weight changed); returns how many were new."""
        if weight != self.weight:
            self.smooth, self.state, self.weight, done = _Grow(), (0.0, 0), weight, 0
        else:
            done = self.n
        new = len(values) - self.n
        if len(values) > done:
            sm, self.state = views.ema(values[done:], weight, self.state)
            self.smooth.extend(sm)
        self.n = len(values)
        return new


@dataclass
class CurveSession:
    """One browser session's view of the curves: its position in each shared series, smoothing, edit marks."""

    smoothed: dict[tuple[int, str], _Smoothed] = field(default_factory=dict)
    edit_times: list[float] = field(default_factory=list)
    edit_cursor: int = 0
    last_view: tuple | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)


# -- live episodes: the trainer's policy player, or the scripted expert --------------------------------


class ExpertPlayer:
    """Plays an episode with the env's scripted expert (`envs.experts.expert_action`): "watch the expert".

    Same turn dicts as the trainer's EpisodePlayer. The experience block is what retrieval would
    show the actor for this task; the expert does not read it.
    """

    def __init__(self, env_name: str, seed: int, experience: str = "") -> None:
        from envs.experts import expert_action
        from envs.registry import make_env

        self._expert = expert_action
        self.env = make_env(env_name)
        self.seed = seed
        self.experience = experience
        self.turn = 0
        self.done = False

    def reset(self) -> dict[str, Any]:
        obs, _ = self.env.reset(seed=self.seed)
        self.turn, self.done = 0, False
        return {"turn": 0, "observation": obs, "experience": self.experience, "action": "", "reward": 0.0, "done": False,
                "success": None, "tool_query": "", "tool_answer": ""}

    def step(self) -> dict[str, Any]:
        action = self._expert(self.env)
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.turn += 1
        self.done = bool(terminated or truncated)
        return {"turn": self.turn, "observation": obs, "experience": self.experience, "action": action,
                "reward": float(reward), "done": self.done, "success": bool(info.get("success")) if self.done else None,
                "tool_query": "", "tool_answer": ""}

    def close(self) -> None:
        self.env.close()


@dataclass
class _Play:
    player: Any
    mode: str
    turns: list[dict[str, Any]] = field(default_factory=list)
    experience: str = ""
    note: str = ""
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def done(self) -> bool:
        return bool(self.turns and self.turns[-1].get("done"))


@dataclass
class _Launched:
    kind: str  # "run" | "ab"
    proc: subprocess.Popen
    log_path: Path
    ab_id: int | None = None
    run_id: int | None = None
    reaped: bool = False


# -- the service ---------------------------------------------------------------------------------------


class Workbench:
    def __init__(self, data_dir: str | os.PathLike[str], db_url: str | None = None, *, embedder: Any = None,
                 upload_cap_mb: float = DEFAULT_UPLOAD_CAP_MB, max_sessions: int = 64,
                 demo_actor: dict[str, Any] | None = None) -> None:
        # demo_actor: the policy the demo plays with when no checkpoint is named, as a config's actor section plus
        # prompt_style, e.g. {backend: openai, base_url: ..., path: FOLDER, prompt_style: chat} (`comprl app --demo-actor`)
        self.demo_actor = dict(demo_actor) if demo_actor else None
        self.data_dir = Path(data_dir).resolve()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.db_url = db_url or default_db_url(self.data_dir)
        self.store = ExperienceStore(self.db_url)
        self.upload_cap_bytes = int(upload_cap_mb * 1024 * 1024)
        self._embedder = embedder
        self._manager = None
        self._checker = None  # envs/entry_check.py, built on the first recurring-task entry shown
        self._manager_lock = threading.Lock()
        self._max_sessions = max_sessions
        self.metrics = MetricCache(self.store)
        self._curves: OrderedDict[str, CurveSession] = OrderedDict()
        self._plays: OrderedDict[str, _Play] = OrderedDict()
        self._sessions_lock = threading.Lock()
        self._launched: list[_Launched] = []
        self._launch_lock = threading.Lock()
        for sub in ("configs", "logs", "exports", "ab"):
            (self.data_dir / sub).mkdir(exist_ok=True)

    def close(self) -> None:
        with self._sessions_lock:
            for p in self._plays.values():
                try:
                    p.player.close()
                except Exception:
                    log.exception("closing a player failed")
            self._plays.clear()
        if self._manager is not None:
            self._manager.close()
        if self._checker is not None:
            self._checker.close()
        self.store.close()

    # -- the header ------------------------------------------------------------------------------

    def overview_md(self) -> str:
        runs = self.store.list_runs()
        running = sum(r["status"] == "running" for r in runs)
        ok, _ = trainer_available()
        return (f"**Complementary RL workbench** · data `{self.data_dir}` · store `{_redact(self.db_url)}` · "
                f"library version {self.store.library_version()} · {self.store.count(status='active'):,} active entries · "
                f"{len(runs)} runs ({running} running){'' if ok else ' · trainer not installed'}")

    # -- search (the actor's retrieval, without counting usage) ----------------------------------

    def manager(self):
        """The workbench's ExperienceManager, started on first use (loading the embedder takes seconds)."""
        with self._manager_lock:
            if self._manager is None:
                from core.embedding import Embedder
                from core.manager import ExperienceManager

                cfg = LibraryConfig()
                cfg.manager.record_usage = False  # a person's search is not an actor's retrieval
                cfg.manager.diversify = False  # and should rank by similarity alone
                cfg.manager.random_demote = False
                embedder = self._embedder or Embedder(cfg.embedding)
                self._manager = ExperienceManager(self.store, embedder, cfg.manager, cfg.index)
            return self._manager

    def warm_up(self) -> None:
        """Load the embedder and index in the background so the first search is quick."""
        threading.Thread(target=self.manager, name="workbench-warmup", daemon=True).start()

    # -- runs ------------------------------------------------------------------------------------

    def runs_table(self) -> pd.DataFrame:
        self.reap_processes()
        self.store.reap_dead_runs()  # a trainer killed anywhere (not only one we started) shows as died
        runs = self.store.list_runs()
        latest = {r["id"]: self.store.latest_metrics(r["id"]) for r in runs[:200]}
        return views.runs_table(runs, latest, build=build_progress.building(self.data_dir))

    # -- the model build (core/build_progress.py): one at a time, shown while it runs ---------------------

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
        from trainers.config import check_model_paths, load_run_config

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
            proc = subprocess.Popen(cmd, cwd=ROOT, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=env, start_new_session=True)
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
        return views.run_details_md(r, children, self.build_state())

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

    # -- live curves -------------------------------------------------------------------------------

    def _session(self, table: OrderedDict, token: str | None, factory) -> tuple[str, Any]:  # noqa: ANN001
        with self._sessions_lock:
            if token and token in table:
                table.move_to_end(token)
                return token, table[token]
            token = uuid.uuid4().hex
            table[token] = factory()
            while len(table) > self._max_sessions:
                _, old = table.popitem(last=False)
                if isinstance(old, _Play):
                    old.player.close()
            return token, table[token]

    def refresh_curves(self, token: str | None, run_ids: Sequence[Any] | None, smoothing: float = 0.6,
                       x_axis: str = "step") -> tuple[str, list[str | None], str]:
        """(session token, one figure JSON per panel or None when unchanged, status line).

        The store is read only past the cursors of the shared series; the session takes in only the
        points past its own position in each, smooths them incrementally, and redraws only the panels
        whose series grew (or all of them when the view changed). Long series are downsampled here.
        """
        token, sess = self._session(self._curves, token, CurveSession)
        smoothing = float(min(max(smoothing or 0.0, 0.0), 0.99))
        x_axis = "time" if x_axis == "time" else "step"
        # a run id that cannot exist is left out (the picker offers only stored runs; this is a hand-made call)
        runs = sorted({r for r in (_maybe_id(x) for x in (run_ids or [])) if r is not None})
        t0 = time.perf_counter()
        with sess.lock:
            dirty: set[str] = set()
            for rid in runs:
                self.metrics.pull(rid, views.CURVE_KEYS)
            view = (tuple(runs), smoothing, x_axis)
            if view != sess.last_view:
                dirty |= {p.id for p in views.PANELS}
                sess.last_view = view
            new_points, loading = 0, False
            for rid in runs:
                for panel in views.PANELS:
                    for ck in panel.keys:
                        h = self.metrics.get(rid, ck.key)
                        if h is None:
                            continue
                        loading |= not h.complete
                        sm = sess.smoothed.get((rid, ck.key))
                        if sm is None or sm.source is not h:  # new, or the series was read afresh (a resume)
                            sm = sess.smoothed[(rid, ck.key)] = _Smoothed(source=h)
                            dirty.add(panel.id)
                        grew = sm.catch_up(h.values.view, smoothing)
                        if grew:
                            new_points += grew
                            dirty.add(panel.id)
            edits = self.store.human_edits_since(sess.edit_cursor)
            if edits:
                sess.edit_cursor = edits[-1]["id"]
                sess.edit_times.extend(e["created_at"] for e in edits)
                dirty |= {p.id for p in views.PANELS}
            if dirty:
                dirty.add("gap")  # derived from the other panels' series
            figs: list[str | None] = []
            names = {r["id"]: f"#{r['id']} {r['name']}"[:32] for r in self.store.list_runs()} if dirty else {}
            b = build_progress.building(self.data_dir) if dirty else None
            empty = (f"{build_progress.describe(b).split(',')[0]}: the curves start with the first training step after it"
                     if b is not None else "")
            marks = self._edit_marks(sess.edit_times, runs, x_axis) if dirty and sess.edit_times else []
            for panel in views.PANELS:
                if panel.id not in dirty:
                    figs.append(None)
                    continue
                series = []
                for rid in runs:
                    for ck in panel.keys:
                        if ck.gap is not None:
                            sv = self._gap_view(rid, ck, x_axis, smoothing)
                            if sv is not None:
                                series.append(sv)
                            continue
                        h = self.metrics.get(rid, ck.key)
                        sm = sess.smoothed.get((rid, ck.key))
                        if h is not None and sm is not None and sm.n:
                            x = (h.times if x_axis == "time" else h.steps).view[: sm.n]
                            sv = views.SeriesView(rid, ck.key, x, h.values.view[: sm.n], sm.smooth.view)
                            if ck.ci is not None:
                                steps = h.steps.view[: sm.n]
                                sv.lo, sv.hi = (views.at_steps(steps, self._series(rid, k)) for k in ck.ci)
                            series.append(sv)
                fig = views.curve_figure(panel, series, run_names=names, x_axis=x_axis, smoothing=smoothing,
                                         edit_marks=marks, empty_text=empty)
                figs.append(views.figure_json(fig))
            points = sum(sm.n for (rid, _), sm in sess.smoothed.items() if rid in runs)
        ms = (time.perf_counter() - t0) * 1000
        status = (f"{len(runs)} run(s) · {points:,} points held · {new_points:,} new points this refresh · "
                  f"{len(sess.edit_times)} human edits · refreshed in {ms:.0f} ms"
                  f"{' · loading history…' if loading else ''}" if runs else "choose one or more runs to plot")
        return token, figs, status

    def _series(self, run_id: int, key: str) -> tuple[np.ndarray, np.ndarray] | None:
        h = self.metrics.get(run_id, key)
        return None if h is None or not h.values.n else (h.steps.view, h.values.view)

    def _gap_view(self, run_id: int, ck: views.CurveKey, x_axis: str, smoothing: float) -> views.SeriesView | None:
        a, b = (self._series(run_id, k) for k in ck.gap)
        if a is None or b is None:
            return None
        steps, y = views.gap_series(a, b)
        if not len(steps):
            return None
        x = steps
        if x_axis == "time":
            h = self.metrics.get(run_id, ck.gap[0])
            x = views.at_steps(steps, (h.steps.view, h.times.view))
        smooth, _ = views.ema(y, smoothing)
        return views.SeriesView(run_id, ck.key, x, y, smooth)

    def curves_csv(self, run_ids: Sequence[Any] | None, panel_id: str | None) -> tuple[str | None, str]:
        """(path, message): the raw points of one panel (or of every panel) for the chosen runs, as CSV under
        <data-dir>/exports: run, key, step, time, value. Gaps are left to the reader (both sources are in it)."""
        runs = sorted({r for r in (_maybe_id(x) for x in (run_ids or [])) if r is not None})
        if not runs:
            return None, _err("choose one or more runs first")
        panels = [p for p in views.PANELS if panel_id in (None, "", "all", p.id)]
        if not panels:
            return None, _err(f"no panel named {panel_id!r}")
        keys = list(dict.fromkeys(k for p in panels for c in p.keys
                                  for k in ((c.key,) if c.gap is None else c.gap) + (c.ci or ())))
        names = {r["id"]: r["name"] for r in self.store.list_runs()}
        rows = []
        for rid in runs:
            for k in keys:
                after = 0
                while True:  # every point, a page at a time
                    cols = self.store.metric_series_since(rid, k, after_id=after, limit=ROWS_PER_KEY_PER_PULL)
                    if not len(cols["id"]):
                        break
                    rows += [(rid, names.get(rid, ""), k, float(st), float(t), float(v))
                             for st, t, v in zip(cols["step"], cols["time"], cols["value"])]
                    after = int(cols["id"][-1])
        which = panel_id if panel_id not in (None, "", "all") else "all-panels"
        path = self.data_dir / "exports" / f"curves-{which}-runs-{'-'.join(map(str, runs))}-{time.strftime('%Y%m%d-%H%M%S')}.csv"
        path.write_text(views.curves_csv(rows))
        return str(path), _ok(f"exported {len(rows):,} points of {len(keys)} series to {path.name}")

    def live_run_id(self) -> int | None:
        """The newest run that is not over (what the Runs tab shows while no run is chosen), else None."""
        return next((r["id"] for r in self.store.list_runs() if r["status"] in ("created", "starting", "running", "paused")),
                    None)

    def default_curve_runs(self) -> list[int]:
        """What Live curves shows on a fresh page: the runs that are running (a new user's first run), else the
        newest run."""
        runs = self.store.list_runs()
        live = [r["id"] for r in runs if r["status"] in ("running", "starting", "created", "paused")]
        return live[:4] or [r["id"] for r in runs[:1]]

    def _edit_marks(self, edit_times: list[float], runs: list[int], x_axis: str) -> list[float]:
        """Edit positions on the x axis: their times, or on a step axis the step the first chosen run had
        reached when the edit was made (from its longest series)."""
        if x_axis == "time":
            return list(edit_times)
        longest = max((h for k in views.CURVE_KEYS if (h := self.metrics.get(runs[0], k)) is not None),
                      key=lambda h: h.values.n, default=None) if runs else None
        if longest is None or longest.values.n < 2:
            return []
        t, st = longest.times.view, longest.steps.view
        order = np.argsort(t, kind="stable")
        return views.edit_positions(edit_times, "step", t[order], st[order])

    # -- library: table and search -----------------------------------------------------------------

    def library_facets(self) -> dict[str, list[str]]:
        return self.store.entry_facets()

    def library_page(self, env: str | None = None, source: str | None = None, status: str | None = "active",
                     text: str | None = None, sort: str = "id", descending: bool = False, page: Any = 1,
                     page_size: Any = 50) -> tuple[pd.DataFrame, str]:
        try:
            page = max(1, int(page or 1))
            page_size = min(500, max(1, int(page_size or 50)))
        except (TypeError, ValueError):
            return views.entries_table([]), _err("page and page size must be whole numbers")
        status_arg = None if status in (None, "", "all") else status
        try:
            p = self.store.list_entries(env=env or None, source=source or None, status=status_arg, text=(text or "").strip() or None,
                                        sort=sort or "id", descending=bool(descending), offset=(page - 1) * page_size,
                                        limit=page_size)
        except (StoreError, ValueError) as e:
            return views.entries_table([]), _err(str(e))
        return (views.entries_table(p.entries, verdicts=self.verdicts(p.entries)),
                views.page_info(p.offset, len(p.entries), p.total, page, page_size))

    def verdicts(self, entries: Sequence[Experience]) -> list[str]:
        """Per entry, whether its claim about its task's level is right (envs/entry_check.py); "unknown" where the
        task is not a recurring one of an env with a checker. Each level is learned once per workbench."""
        from envs.base import task_id_of
        from envs.entry_check import EntryChecker

        out = []
        for e in entries:
            if task_id_of(e.task) is None or not EntryChecker.supports(e.env):
                out.append("unknown")
                continue
            if self._checker is None:
                self._checker = EntryChecker()
            try:
                out.append(self._checker.verdict(e.env, e.task, e.text))
            except Exception:  # an env that cannot be built here: nothing to say, never a broken table
                out.append("unknown")
        return out

    def semantic_search(self, query: str, env: str | None = None, k: Any = 20) -> tuple[pd.DataFrame, str]:
        if not (query or "").strip():
            return views.entries_table([], scores=[]), "type a query to search by meaning"
        try:
            k = min(200, whole_number(k or 20, "the number of results", lo=1, hi=INT32[1]))
        except UserInputError as e:
            return views.entries_table([], scores=[]), _err(str(e))
        m = self.manager()
        m.sync()  # embeds entries written without an embedder
        # By the entry's own text (its title, description and content), not its task key: every entry of one task
        # has the same key, so a search by key ties them all. The key's score is shown beside it.
        ids, vecs, entries = self.store.active_vectors("text")
        if env:
            keep = np.array([e.env == env for e in entries], dtype=bool)
            ids, vecs, entries = ids[keep], vecs[keep], [e for e, k in zip(entries, keep) if k]
        if not len(ids):
            return views.entries_table([], scores=[]), "no active entry to search" + (f" in env {env}" if env else "")
        qv = np.asarray(m.embedder.embed_queries([query])[0], dtype=np.float32)
        scores = _cosine(vecs, qv)
        order = np.argsort(-scores, kind="stable")[:k]
        keyvecs = self.store.embeddings([int(ids[i]) for i in order], key="query")
        found = [entries[i] for i in order]
        task_scores = [float(_cosine(keyvecs[e.id][None, :], qv)[0]) if e.id in keyvecs else float("nan") for e in found]
        return (views.entries_table(found, scores=[float(scores[i]) for i in order], verdicts=self.verdicts(found),
                                    task_scores=task_scores),
                f"{len(found)} entries whose text is closest in meaning to {query!r}" + (f" in env {env}" if env else "") +
                " (score: the entry's text; task score: its task key, which every entry of a task shares)")

    # -- library: one entry ------------------------------------------------------------------------

    def _entry_id(self, entry_id: Any) -> int:
        if entry_id in (None, ""):
            raise UserInputError("give an entry id (a number from the table)")
        return whole_number(entry_id, "entry id")

    def open_entry(self, entry_id: Any) -> dict[str, Any]:
        """Everything the entry panel shows; 'error' is set instead when the id is bad."""
        try:
            eid = self._entry_id(entry_id)
            e = self.store.get(eid)
        except (UserInputError, StoreError) as err:
            return {"error": _err(str(err))}
        versions = self.store.history(eid)
        parents = self.store.get_many(e.parent_ids)
        children = self.store.get_many(self.store.children(eid))
        return {
            "error": "", "id": e.id, "version": e.version, "text": e.text, "meta": views.entry_meta_md(e),
            "lineage": views.lineage_md(e, parents, children), "usage": views.usage_table(usage := self.store.usage(eid)),
            "usage_note": views.usage_note(e, len(usage)), "source_episode": e.source_episode_id,
            "history": views.history_table(versions), "versions": [v.version for v in versions], "status": e.status.value,
        }

    def save_entry(self, entry_id: Any, text: str, loaded_version: Any) -> tuple[str, int | None]:
        """(message, the version now loaded). A stale edit is refused and the person's text is kept in the
        editor (the UI does not touch it), with a diff against the current text to reapply it."""
        try:
            eid = self._entry_id(entry_id)
            expected = whole_number(loaded_version, "the loaded version")
        except UserInputError as e:
            return _err(f"open an entry before editing it ({e})"), None
        if not (text or "").strip():
            return _err("the text is empty; an entry needs a text (archive it to remove it)"), expected
        if len(text) > MAX_ENTRY_CHARS:
            # the import cap: an entry longer than this could be exported but never imported again
            return _err(f"the text is {len(text):,} characters; an entry holds at most {MAX_ENTRY_CHARS:,} "
                        "(shorten it, or split it into two entries). Not saved."), expected
        try:
            e = self.store.update_text(eid, text, expected_version=expected, actor="human")
        except StaleWriteError as err:
            current = self.store.get(eid)
            d = self.store.diff(eid, expected, current.version) if expected in [v.version for v in self.store.history(eid)] else ""
            return (_err(f"{err}. Your text is still in the editor, not saved. What changed meanwhile:") +
                    f"\n\n```diff\n{d or '(status change only)'}\n```"), expected
        except StoreError as err:
            return _err(str(err)), expected
        return _ok(f"saved entry {eid} as version {e.version}; a running trainer picks it up within seconds"), e.version

    def set_entry_status(self, entry_id: Any, loaded_version: Any, status: str) -> tuple[str, int | None]:
        try:
            eid = self._entry_id(entry_id)
            expected = whole_number(loaded_version, "the loaded version")
        except UserInputError as e:
            return _err(f"open an entry first ({e})"), None
        try:
            changed = self.store.set_status([eid], Status(status), actor="human", expected_versions={eid: expected})
        except StoreError as err:
            return _err(str(err)), expected
        now = self.store.get(eid).version
        verb = "archived" if status == "archived" else "restored"
        return (_ok(f"{verb} entry {eid} (version {now})") if changed else f"entry {eid} was already {status}"), now

    def diff_versions(self, entry_id: Any, v_from: Any, v_to: Any) -> str:
        try:
            eid = self._entry_id(entry_id)
            return views.diff_html(self.store.diff(eid, whole_number(v_from, "version"), whole_number(v_to, "version")))
        except UserInputError as e:
            return views.diff_html("", f"choose an entry and two versions ({e})")
        except StoreError as err:
            return views.diff_html("", str(err))

    def revert_entry(self, entry_id: Any, to_version: Any, loaded_version: Any) -> tuple[str, int | None]:
        try:
            eid = self._entry_id(entry_id)
            expected, to_v = whole_number(loaded_version, "the loaded version"), whole_number(to_version, "version")
        except UserInputError as e:
            return _err(f"open an entry and choose the version to revert to ({e})"), None
        try:
            e = self.store.revert(eid, to_v, expected_version=expected, actor="human")
        except StoreError as err:
            return _err(str(err)), expected
        return _ok(f"entry {eid} has the text of v{to_v} again, as version {e.version}"), e.version

    def create_entry(self, title: str, description: str, content: str, env: str = "", task: str = "") -> tuple[str, int | None]:
        if not (title or "").strip() or not (content or "").strip():
            return _err("a new entry needs at least a title and a content"), None
        text = format_entry_text(title, description or "", content)
        if len(text) > MAX_ENTRY_CHARS:
            return _err(f"the entry is {len(text):,} characters; an entry holds at most {MAX_ENTRY_CHARS:,}. Not saved."), None
        try:
            eid = self.store.add_entries([NewEntry(text=text, env=(env or "").strip(), task=(task or "").strip(),
                                                   query=(task or "").strip(), source=Source.MANUAL)],
                                         actor="human", note="written in the workbench")[0]
        except StoreError as e:
            return _err(str(e)), None
        return _ok(f"created entry {eid} (source manual); it is embedded and searchable within seconds"), eid

    # -- library: merge ----------------------------------------------------------------------------

    def _merge_parents(self, ids_text: Any) -> list[Experience]:
        ids = parse_ids(ids_text)
        if len(ids) < 2:
            raise UserInputError("a merge needs at least two entry ids")
        found = self.store.get_many(ids)
        missing = [i for i in ids if i not in found]
        if missing:
            raise UserInputError(f"no entry with id {missing[0]}")
        archived = [i for i in ids if found[i].status is not Status.ACTIVE]
        if archived:
            raise UserInputError(f"entry {archived[0]} is archived; restore it before merging it")
        return [found[i] for i in ids]

    def propose_merge(self, ids_text: Any) -> tuple[str, str]:
        """(proposed merged text, note). The extractor proposes through the trainer's
        `trainers.extractor.propose_merge(store, ids, data_dir=...) -> str`; when that is missing or
        fails, the parents' texts come back joined, for the person to edit, and the note says so."""
        try:
            parents = self._merge_parents(ids_text)
        except UserInputError as e:
            return "", _err(str(e))
        try:
            extractor = importlib.import_module("trainers.extractor")
            propose = getattr(extractor, "propose_merge")
        except Exception as e:
            joined = "\n\n".join(p.text for p in parents)
            return joined, (f"No extractor proposal here ({type(e).__name__}: {e}): these are the {len(parents)} parents' "
                            "texts joined — edit them into one entry, then preview and accept.")
        try:
            text = propose(self.store, [p.id for p in parents], data_dir=str(self.data_dir))
        except Exception as e:  # the extractor's failure must not lose the person's work
            return "\n\n".join(p.text for p in parents), (f"The extractor gave no proposal ({type(e).__name__}: {e}): "
                                                           "the parents' texts are joined below — edit them into one entry.")
        return str(text), "Proposed by the extractor; edit as you like, then preview and accept."

    def merge_preview(self, ids_text: Any, text: str) -> str:
        try:
            parents = self._merge_parents(ids_text)
        except UserInputError as e:
            return views.diff_html("", str(e))
        from core.store import text_diff

        out = []
        for p in parents:
            d = text_diff(p.text, text or "", f"#{p.id} v{p.version}", "merged")
            out.append(f"<div class='turn-head'>#{p.id} → merged</div>" + views.diff_html(d))
        return "".join(out)

    def accept_merge(self, ids_text: Any, text: str) -> tuple[str, int | None]:
        try:
            parents = self._merge_parents(ids_text)
        except UserInputError as e:
            return _err(str(e)), None
        if not (text or "").strip():
            return _err("write the merged text first (or get a proposal)"), None
        if len(text) > MAX_ENTRY_CHARS:
            return _err(f"the merged text is {len(text):,} characters; an entry holds at most {MAX_ENTRY_CHARS:,}"), None
        try:
            nid = merge.merge_entries(self.store, [p.id for p in parents], text, actor="human",
                                      expected_versions={p.id: p.version for p in parents})
        except StoreError as e:
            return _err(str(e)), None
        return _ok(f"merged {', '.join(f'#{p.id}' for p in parents)} into entry {nid}; the parents are archived "
                   f"(undo restores them)"), nid

    def undo_merge(self, merged_id: Any) -> str:
        try:
            mid = self._entry_id(merged_id)
            parents = merge.undo_merge(self.store, mid, actor="human")
        except (UserInputError, StoreError) as e:
            return _err(str(e))
        return _ok(f"undid merge {mid}: it is archived and {', '.join(f'#{p}' for p in parents)} are active again")

    def duplicate_clusters(self, threshold: Any = 0.9, across_tasks: bool = False) -> tuple[pd.DataFrame, str]:
        try:
            th = float(threshold)
        except (TypeError, ValueError):
            return views.clusters_table([], {}), _err("the threshold is a cosine similarity, e.g. 0.9")
        if not -1.0 <= th <= 1.0:
            return views.clusters_table([], {}), _err("the threshold is a cosine similarity within [-1, 1]")
        self.manager().sync()  # embeds entries that have no text embedding yet
        clusters = merge.find_near_duplicates(self.store, threshold=th, across_tasks=bool(across_tasks))
        entries = self.store.get_many([i for c in clusters[:200] for i in c])
        return (views.clusters_table(clusters[:200], entries),
                f"{len(clusters)} near-duplicate clusters at cosine ≥ {th}" + (" (first 200 shown)" if len(clusters) > 200 else ""))

    def cluster_ids(self, table: pd.DataFrame | None, row: Any) -> str:
        """The ids of one row of the near-duplicate table, for the merge box."""
        try:
            return str(table.iloc[int(row)]["ids"])
        except (AttributeError, IndexError, KeyError, TypeError, ValueError):
            return ""

    # -- library: import / export -----------------------------------------------------------------

    def import_file(self, path: str | None, fresh_ids: bool = True) -> str:
        if not path:
            return _err("choose a JSONL file to import")
        p = Path(path)
        if not p.is_file():
            return _err(f"the uploaded file {p.name} is gone; upload it again")
        size = p.stat().st_size
        if size > self.upload_cap_bytes:
            return _err(f"{p.name} is {views.fmt_bytes(size)}, over the upload cap of {views.fmt_bytes(self.upload_cap_bytes)}; "
                        "split it or import it with `comprl library import`")
        try:
            rep = library_io.import_library(self.store, p, keep_ids=not fresh_ids)
        except library_io.LibraryFileError as e:
            msg = str(e).replace(str(p), p.name)
            return _err(msg)
        return _ok(f"imported {rep.imported} entries (library version {self.store.library_version()})")

    def export_library(self, status: str | None = None) -> tuple[str | None, str]:
        status = None if status in (None, "", "all") else status
        path = self.data_dir / "exports" / f"library-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:4]}.jsonl"
        n = library_io.export_library(self.store, path, status=status)
        return str(path), _ok(f"exported {n} entries")

    # -- A/B tests ---------------------------------------------------------------------------------

    def _arm(self, kind: str, arg: str, file_path: str | None, label: str) -> dict[str, Any]:
        if kind not in ARM_KINDS:
            raise UserInputError(f"arm {label}: kind must be one of {', '.join(ARM_KINDS)}")
        arm: dict[str, Any] = {"kind": kind}
        if kind == "version":
            try:
                v = whole_number(arg, f"arm {label}: the library version", lo=0)
            except UserInputError:
                raise UserInputError(f"arm {label}: give the library version as a number") from None
            current = self.store.library_version()
            if not 0 <= v <= current:
                raise UserInputError(f"arm {label}: library version {v} does not exist (the library is at {current})")
            arm["version"] = v
        elif kind == "file":
            if not file_path or not Path(file_path).is_file():
                raise UserInputError(f"arm {label}: upload an exported library file (JSONL)")
            src = Path(file_path)
            if src.stat().st_size > self.upload_cap_bytes:
                raise UserInputError(f"arm {label}: {src.name} is over the upload cap of {views.fmt_bytes(self.upload_cap_bytes)}")
            try:
                library_io.parse_library_lines(library_io.read_library_file(src))
            except library_io.LibraryFileError as e:
                raise UserInputError(f"arm {label}: {src.name}: {e}") from None
            dest = self.data_dir / "ab" / f"arm-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}-{label}.jsonl"
            shutil.copyfile(src, dest)
            arm["path"] = str(dest)
        elif kind in ("minus", "plus"):
            ids = parse_ids(arg)
            if not ids:
                raise UserInputError(f"arm {label}: name the entries to {'leave out' if kind == 'minus' else 'add'} by id")
            found = self.store.get_many(ids)
            missing = [i for i in ids if i not in found]
            if missing:
                raise UserInputError(f"arm {label}: no entry with id {missing[0]}")
            arm["ids"] = ids
        return arm

    def create_ab_test(self, name: str, env: str, seeds: str, checkpoint: str, max_turns: Any,
                       a_kind: str, a_arg: str, a_file: str | None, b_kind: str, b_arg: str, b_file: str | None,
                       task_ids: bool = False) -> tuple[str, int | None]:
        """`task_ids`: the seeds are recurring task ids ("Dungeon 3: ..."), as runs with env.task_set name them,
        so a library written by such a run is retrieved for its own tasks."""
        from envs.registry import list_envs

        try:
            if not (name or "").strip():
                raise UserInputError("give the test a name")
            if env not in list_envs():
                raise UserInputError(f"unknown env {env!r}; choose one of {', '.join(list_envs())}")
            seed_list = parse_seeds(seeds)
            ckpt = (checkpoint or "").strip()
            if ckpt and not Path(ckpt).is_dir():
                raise UserInputError(f"checkpoint {ckpt!r} is not a model folder; leave it empty for the default policy")
            mt: int | None = None
            if max_turns not in (None, "", 0):
                mt = whole_number(max_turns, "max turns", lo=1)
            arms = {"A": self._arm(a_kind, a_arg, a_file, "A"), "B": self._arm(b_kind, b_arg, b_file, "B")}
            if arms["A"] == arms["B"]:
                raise UserInputError("the two arms are the same library; change one of them")
        except UserInputError as e:
            return _err(str(e)), None
        ok, why = trainer_available()
        if not ok:
            return _err(f"cannot run the evaluation: {why}"), None
        config = {"env": env, "seeds": seed_list, "checkpoint": ckpt, "max_turns": mt, "arms": arms, "task_ids": bool(task_ids)}
        ab_id = self.store.create_ab_test(name.strip(), config)
        launched = self._spawn("ab", ["eval", "--ab-test", str(ab_id)], f"ab-{ab_id}.log", ab_id=ab_id)
        # The brief's place for the log: <data-dir>/ab/<id>.log (a link to the file being written).
        link = self.data_dir / "ab" / f"{ab_id}.log"
        if not link.exists():
            try:
                link.symlink_to(launched.log_path)
            except OSError:
                pass
        return _ok(f"A/B test {ab_id} started: {len(seed_list)} episodes per arm (process {launched.proc.pid})"), ab_id

    def ab_tests_table(self) -> pd.DataFrame:
        self.reap_processes()
        tests = self.store.list_ab_tests()
        paired = {t["id"]: ab_pairs(self.store, t)[1] for t in tests[:50] if t["status"] == "done"}
        return views.ab_tests_table(tests, {i: p["p_value"] for i, p in paired.items() if p is not None})

    def ab_choices(self) -> list[tuple[str, int]]:
        return [(f"#{t['id']} {t['name']} ({t['status']})", t["id"]) for t in self.store.list_ab_tests()]

    def ab_details(self, ab_id: Any) -> tuple[str, str, pd.DataFrame, pd.DataFrame, pd.DataFrame]:
        """(summary, progress bar, results per arm, per task, episodes)."""
        empty = (views.ab_results_table({}), views.ab_per_task_table({}), views.episodes_table([]))
        try:
            aid = whole_number(ab_id, "A/B test id")
            t = self.store.get_ab_test(aid)
        except UserInputError:
            return "choose an A/B test", "", *empty
        except StoreError as e:
            return _err(str(e)), "", *empty
        self.reap_processes()
        t = self.store.get_ab_test(aid)
        eps, paired = self.ab_paired(t)
        summary = views.ab_summary_md(t, paired)
        b = build_progress.building(self.data_dir)
        if t["status"] in ("created", "running") and b is not None:
            summary += "  \nwaiting for the " + build_progress.describe(b) + " (one build at a time)"
        return (summary, views.progress_bar_html(t["progress"], t["status"]),
                views.ab_results_table(t["results"]), views.ab_per_task_table(t["results"]), views.episodes_table(eps[:500]))

    def ab_paired(self, test: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
        return ab_pairs(self.store, test)

    def ab_log_tail(self, ab_id: Any, lines: int = 40) -> str:
        try:
            aid = whole_number(ab_id, "A/B test id")
        except UserInputError:
            return ""
        path = self.data_dir / "ab" / f"{aid}.log"
        return _tail(path, lines) if path.exists() else ""

    # -- episodes: replay and live play ----------------------------------------------------------------

    def episodes(self, run_id: Any = None, ab_id: Any = None, limit: int = 200) -> pd.DataFrame:
        run_id, ab_id = (None if isinstance(x, str) and not x.strip() else x for x in (run_id, ab_id))
        ids = [_maybe_id(x) for x in (run_id, ab_id)]
        if any(i is None and x not in (None, "") for i, x in zip(ids, (run_id, ab_id))):
            return views.episodes_table([])  # an id no run or test can have: nothing to show (not every episode)
        return views.episodes_table(self.store.list_trajectories(run_id=ids[0], ab_test_id=ids[1], limit=limit))

    def replay(self, traj_id: Any) -> str:
        try:
            t = self.store.get_trajectory(whole_number(traj_id, "episode id"))
        except UserInputError as e:
            return f"<em>give an episode id from the table ({html.escape(str(e))})</em>"
        except StoreError as e:
            return f"<div class='comprl-error'>{html.escape(str(e))}</div>"
        return views.trajectory_html(t)

    def source_episode_html(self, entry_id: Any) -> str:
        """The episode an extracted entry was written from, as a replay."""
        try:
            e = self.store.get(self._entry_id(entry_id))
        except (UserInputError, StoreError) as err:
            return f"<div class='comprl-error'>{html.escape(str(err))}</div>"
        if e.source_episode_id is None:
            return f"<em>entry #{e.id} was not written from a stored episode</em>"
        return self.replay(e.source_episode_id)

    def envs(self) -> list[str]:
        from envs.registry import list_envs

        return list_envs()

    def policy_status(self) -> str:
        try:
            importlib.import_module("trainers.rollout").EpisodePlayer  # noqa: B018
        except Exception as e:
            return (f"Live policy play needs the trainer (`trainers.rollout.EpisodePlayer` is not importable here: "
                    f"{type(e).__name__}: {e}). Watch the scripted expert instead, or replay stored episodes.")
        return "Live policy play is available."

    def _retrieved_for(self, env_name: str, task: str) -> tuple[str, str]:
        m = self.manager()
        m.sync()
        hits = m.search_sync([task], k=1, task=env_name)[0]
        if not hits:
            return "", "the library has no entry for this env"
        return hits[0].text, f"entry #{hits[0].entry_id}, similarity {hits[0].score:.2f} (the expert does not read it)"

    def demo_start(self, token: str | None, mode: str, env_name: str, seed: Any, checkpoint: str = "",
                   library: str = "current") -> tuple[str, str, str]:
        """(session token, episode HTML, status). mode: 'expert' or 'policy'."""
        with self._sessions_lock:
            old = self._plays.pop(token, None) if token else None
        if old is not None:
            old.player.close()
        try:
            seed_i = whole_number(seed, "the task seed", lo=0)
        except UserInputError as e:
            return token or "", views.live_episode_html([]), _err(str(e))
        if env_name not in self.envs():
            return token or "", views.live_episode_html([]), _err(f"unknown env {env_name!r}")
        use_library = library != "none"
        try:
            if mode == "policy":
                try:
                    rollout = importlib.import_module("trainers.rollout")
                    player_cls = rollout.EpisodePlayer
                except Exception:
                    return token or "", views.live_episode_html([]), _err(self.policy_status())
                ckpt = (checkpoint or "").strip()
                if ckpt and not Path(ckpt).is_dir():
                    return token or "", views.live_episode_html([]), _err(f"checkpoint {ckpt!r} is not a model folder")
                b = build_progress.building(self.data_dir)
                if not ckpt and b is not None:
                    # The default models are being built (one build at a time): say so now, rather than hold this
                    # request for the rest of the build.
                    return token or "", views.live_episode_html([]), _err(
                        f"the default models are being built ({build_progress.describe(b)}); the policy can play once "
                        "they are ready. Watch the scripted expert meanwhile, or name a model folder.")
                extra: dict[str, Any] = {}
                if self.demo_actor and not ckpt:
                    extra = demo_actor_kwargs(self.demo_actor)
                    ckpt = extra.pop("checkpoint")
                player = player_cls(env_name, seed_i, data_dir=str(self.data_dir), db_url=self.db_url, checkpoint=ckpt,
                                    use_library=use_library, **extra)
                play = _Play(player, "policy")
            else:
                player = ExpertPlayer(env_name, seed_i)
                play = _Play(player, "expert")
            first = play.player.reset()
            if mode != "policy" and use_library:
                task = getattr(player.env, "task", "")
                play.experience, play.note = self._retrieved_for(env_name, task) if task else ("", "")
                player.experience = play.experience
                first["experience"] = play.experience
            elif mode == "policy":
                play.experience = first.get("experience", "")
            play.turns.append(first)
        except Exception as e:  # an env that cannot start here (missing data, Docker) says why
            return token or "", views.live_episode_html([]), _err(f"could not start {env_name}: {type(e).__name__}: {e}")
        token, _ = self._session(self._plays, None, lambda: play)
        who = "the scripted expert" if mode != "policy" else "the policy"
        return token, views.live_episode_html(play.turns, play.experience, play.note), f"{who} on {env_name}, seed {seed_i}: ready"

    def demo_step(self, token: str | None) -> tuple[str, str, bool]:
        """(episode HTML, status, done): one more turn of the session's episode."""
        with self._sessions_lock:
            play = self._plays.get(token or "")
        if play is None:
            return views.live_episode_html([]), "start an episode first", True
        with play.lock:
            if play.done:
                return views.live_episode_html(play.turns, play.experience, play.note), _episode_status(play), True
            try:
                turn = play.player.step()
            except Exception as e:
                return (views.live_episode_html(play.turns, play.experience, play.note),
                        _err(f"the episode stopped: {type(e).__name__}: {e}"), True)
            play.turns.append(turn)
            if play.mode == "policy" and turn.get("experience") and not play.experience:
                play.experience = turn["experience"]
            return views.live_episode_html(play.turns, play.experience, play.note), _episode_status(play), play.done


def ab_pairs(store: ExperienceStore, test: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """(an A/B test's episodes, oldest first, each with its "arm"; McNemar's paired test, or None before both arms
    have played). The evaluator plays arm A's episodes, then arm B's, one per seed each, and stores each arm's at
    once: the first len(seeds) episodes of the test are A's. Pairs are matched by seed. (The workbench and
    `comprl eval --ab-test` both report it.)"""
    n = len(test["config"].get("seeds", []))
    eps = sorted(store.list_trajectories(ab_test_id=test["id"], limit=2 * n + 10), key=lambda t: t["id"])
    for i, t in enumerate(eps):
        t["arm"] = "A" if i < n else "B"
    if not n or len(eps) < 2 * n:
        return eps, None
    by_arm = {arm: {t["seed"]: t["success"] for t in eps if t["arm"] == arm} for arm in ("A", "B")}
    counts = paired_outcomes(by_arm["A"], by_arm["B"])
    p, method = mcnemar_test(counts["a_only"], counts["b_only"])
    return eps, {**counts, "p_value": p, "method": method}


def _episode_status(play: _Play) -> str:
    last = play.turns[-1]
    if last.get("done"):
        return f"episode over after {last['turn']} turns: {'success' if last.get('success') else 'failure'}"
    return f"turn {last['turn']}"


def _alive(pid: Any) -> bool:
    if not pid:
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _tail(path: Path, lines: int) -> str:
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - LOG_TAIL_BYTES))
            data = f.read().decode("utf-8", errors="replace")
    except OSError as e:
        return f"cannot read {path}: {e}"
    return "\n".join(data.splitlines()[-lines:])


def _cosine(vecs: np.ndarray, q: np.ndarray) -> np.ndarray:
    vecs = np.asarray(vecs, dtype=np.float32)
    norms = np.linalg.norm(vecs, axis=1) * (float(np.linalg.norm(q)) or 1.0)
    return (vecs @ q) / np.where(norms > 0, norms, 1.0)


def _redact(url: str) -> str:
    """Hide a password in a database URL shown on screen."""
    return re.sub(r"://([^:/@]+):[^@]+@", r"://\1:***@", url)


def _maybe_id(x: Any) -> int | None:
    """An id from a picker or a hand-made call, or None when it is empty or no stored row could have it."""
    try:
        return whole_number(x, "id")
    except UserInputError:
        return None


def _max_steps(value: Any) -> int | None:
    """The launch form's optional step cap: empty or 0 means the config's own; anything else a count >= 1."""
    if value in (None, "", 0):
        return None
    return whole_number(value, "max steps", lo=1)


def demo_actor_kwargs(spec: dict[str, Any]) -> dict[str, Any]:
    """EpisodePlayer arguments for the demo's configured actor: its back end (an openai endpoint, say), its
    folder (tokenizer and chat template) and prompt style."""
    from core.config import from_dict
    from trainers.config import ModelSection
    from trainers.models import inference_backend

    spec = dict(spec)
    style = spec.pop("prompt_style", "compact")
    section = from_dict(ModelSection, spec)
    return {"checkpoint": section.path, "prompt_style": style, "actor": inference_backend(section, section.path, num_threads=1)}
