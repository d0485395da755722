"""One model build at a time, and where it stands: the first ten minutes of a new user's first run.

The tiny default models are built on first use (trainers/warmstart/build.py `ensure_models`), by whoever
needs them first: a run, an A/B test's evaluation, the workbench's live policy demo, `comprl models
init`. Two builders into one `models/` folder would delete each other's work, so the build runs behind
an exclusive lock, and while it runs it writes where it stands to a small JSON file that the workbench
(Runs tab, Live curves, the terminal of `comprl app`) reads:

    <data_dir>/.models-build.lock    flock'ed by the builder; anyone else who needs the models waits on it
                                     (interruptibly: SIGTERM/SIGINT end the wait)
    <data_dir>/.models-build.json    {"state": "building"|"done"|"failed"|"stopped", "pid", "stage", "done",
                                     "total", "stage_done", "stage_total", "beside" (the extractor process's
                                     {"stage", "done", "total"} or null), "started_at", "updated_at", "eta_s", "error"}

(Beside `models/`, not in it: the models folder holds models and the build's temporary folder only.)

The hooks inside the build are two lines of warmstart.py: `@one_build_at_a_time` on `ensure_models`,
and `BuildProgress` in place of the tqdm bar (it has the three methods the build calls: `update`,
`set_postfix_str`, `close`). A log gets a few lines (a stage change, every tenth of the way), never a
line per step; a terminal gets one line redrawn in place.

`request_stop()` (called by the run's SIGTERM/SIGINT handler) makes the next `update` raise
`BuildStopped`, and ends a wait for the lock: a build or a wait is never a phase that ignores signals.
Nothing here imports torch: the workbench reads progress without loading the trainer.
"""
from __future__ import annotations

import fcntl
import functools
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO

LOCK_NAME = ".models-build.lock"
PROGRESS_NAME = ".models-build.json"
WRITE_EVERY_S = 1.0  # the progress file is rewritten at most this often (and at every stage change)
LOG_FRACTION = 0.1  # a log line every tenth of the way
WAIT_POLL_S = 0.5

_STOP = threading.Event()


class BuildStopped(Exception):
    """The build (or the wait for another's) was stopped by a signal or a stop request; nothing is kept."""


def request_stop() -> None:
    """Stop a build in flight at its next step, or a wait for another process's build, in this process."""
    _STOP.set()


def stop_requested() -> bool:
    return _STOP.is_set()


def models_root(data_dir: str | os.PathLike[str]) -> Path:
    return Path(data_dir).expanduser() / "models"


def _alive(pid: Any) -> bool:
    try:
        os.kill(int(pid), 0)
    except (ProcessLookupError, ValueError, TypeError):
        return False
    except PermissionError:
        return True
    return True


def read_progress(data_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The last build's progress under `data_dir`, or None when none was ever written. A "building" state whose
    process is gone is reported as "died" (a SIGKILL leaves no chance to say so)."""
    try:
        p = json.loads((Path(data_dir).expanduser() / PROGRESS_NAME).read_text())
    except (OSError, json.JSONDecodeError):
        return None
    if not isinstance(p, dict):
        return None
    if p.get("state") == "building" and not _alive(p.get("pid")):
        p["state"] = "died"
    return p


def building(data_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The progress of a build in flight under `data_dir`, else None."""
    p = read_progress(data_dir)
    return p if p is not None and p.get("state") == "building" else None


def fmt_duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    s = max(0, int(round(seconds)))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def _where(p: dict[str, Any]) -> str:
    """'policy SFT 120/300; extractor SFT (short prompts) 310/500': the stage with its steps done of those planned
    (when it has more than one), and the stage of the process beside it. No commas (the line's first part is cut
    at one)."""
    def one(stage: Any, done: Any, total: Any) -> str:
        return f"{stage or 'starting'} {min(int(done or 0), int(total))}/{int(total)}" if (total or 0) > 1 else str(stage or "starting")

    where = one(p.get("stage"), p.get("stage_done"), p.get("stage_total"))
    side = p.get("beside")
    if isinstance(side, dict) and side.get("stage"):
        where += "; " + one(side["stage"], side.get("done"), side.get("total"))
    return where


def describe(p: dict[str, Any]) -> str:
    """One line: 'model build 34% (policy SFT 120/300; extractor SFT 40/300), 2 min 10 s in, about 5 min 02 s left'."""
    total = max(1, int(p.get("total") or 1))
    pct = 100.0 * min(int(p.get("done") or 0), total) / total
    state = p.get("state")
    elapsed = (p.get("updated_at") or time.time()) - (p.get("started_at") or time.time())
    if state == "building":
        eta = p.get("eta_s")
        left = f", about {fmt_duration(eta)} left" if eta is not None else ", estimating the time left"
        return f"model build {pct:.0f}% ({_where(p)}), {fmt_duration(elapsed)} in{left}"
    if state == "done":
        return f"model build done in {fmt_duration(elapsed)}"
    if state == "stopped":
        return f"model build stopped at {pct:.0f}% ({_where(p) if p.get('stage') else '?'})"
    if state == "died":
        return f"model build ended without finishing at {pct:.0f}% (process {p.get('pid')} is gone); the next run builds again"
    return f"model build failed at {pct:.0f}% ({p.get('stage') or '?'}): {p.get('error') or 'see the log'}"


def _write(root: Path, data: dict[str, Any]) -> None:
    """`root`: the models folder; the file goes beside it."""
    tmp = root.parent / f"{PROGRESS_NAME}.{os.getpid()}.{threading.get_ident()}.tmp"
    try:
        tmp.write_text(json.dumps(data))
        os.replace(tmp, root.parent / PROGRESS_NAME)  # readers never see half a file
    except OSError:
        pass  # progress is for people; a full disk must not fail the build over it


Stage = tuple[str, int, "float | None"]  # (name, steps planned, seconds a step takes on an idle 2-core machine)


class _Lane:
    """One process's stages in order (the build's own, or the extractor's beside it): where it stands in its plan,
    and the seconds it has left. A stage's steps cost what the stage's recent steps cost (measured: the last three
    minutes); a stage not measured yet costs its planned seconds scaled by how much slower than planned this lane has
    run so far (`speed`), so there is an estimate from the first second, and it is not reset at a stage change."""

    def __init__(self, plan: Sequence[Stage], now: float) -> None:
        self.plan = list(plan)
        self.i, self.done, self.name, self.entered = 0, 0, "", False
        self.started = self.t_stage = now
        self.ref_done = 0.0  # planned seconds of the stages behind
        self.waited = 0.0  # seconds spent in stages planned at 0 s (a wait for the process beside): not this lane's pace
        self.samples: list[tuple[float, int]] = []  # (time, done) of the current stage

    def enter(self, name: str, now: float) -> bool:
        """The stage `name` begins: the next plan entry of that name (the ones skipped count as done). False when the
        plan has none (then the name is only shown)."""
        self.name = name
        for j in range(self.i + 1 if self.entered else self.i, len(self.plan)):
            if self.plan[j][0] == name:
                self.ref_done += sum(st * (ref or 0.0) for _, st, ref in self.plan[self.i:j])
                self.waited += (now - self.t_stage) if self.entered and self.plan[self.i][2] == 0.0 else 0.0
                self.i, self.done, self.t_stage, self.samples, self.entered = j, 0, now, [], True
                return True
        return False

    def step(self, n: int, now: float) -> None:
        self.done += n
        self.samples.append((now, self.done))
        if len(self.samples) > 400:
            self.samples = self.samples[-200:]

    @property
    def steps(self) -> int:
        return self.plan[self.i][1] if self.i < len(self.plan) else 0

    def speed(self, now: float) -> float:
        per_step = (self.plan[self.i][2] or 0.0) if self.i < len(self.plan) else 0.0
        ref = self.ref_done + min(self.done, self.steps) * per_step
        waited = self.waited + ((now - self.t_stage) if self.entered and self.i < len(self.plan) and per_step == 0.0 else 0.0)
        return (now - self.started - waited) / ref if ref >= 5.0 else 1.0

    def left(self, now: float, stop: str | None = None, after: str | None = None) -> float | None:
        """Seconds left in the stages from the current one up to (not including) the stage named `stop`, or only in
        those after the stage named `after`; None when a stage has neither a plan nor a measured rate."""
        speed, total = self.speed(now), 0.0
        names = [n for n, _, _ in self.plan]
        lo = self.i if after is None or after not in names[self.i:] else names.index(after, self.i) + 1
        hi = len(self.plan) if stop is None or stop not in names[self.i:] else names.index(stop, self.i)
        for j in range(lo, hi):
            _, steps, ref = self.plan[j]
            if j != self.i:
                if ref is None:
                    return None
                total += steps * ref * speed
                continue
            window = [r for r in self.samples if self.samples[-1][0] - r[0] <= 180.0]
            (t0, d0), (t1, d1) = (window[0], window[-1]) if window else ((0.0, 0), (0.0, 0))
            if len(window) >= 3 and d1 > d0 and t1 > t0:
                total += max(0, steps - self.done) * (t1 - t0) / (d1 - d0)
            elif ref is not None:
                total += max(0.0, steps * ref * speed - (now - self.t_stage))
            else:
                return None
        return total


class BuildProgress:
    """tqdm's three methods as the build uses them, writing the progress file and a few lines.

    `plan`: the build's stages in order, (name, steps, seconds a step takes on an idle 2-core machine); `beside`: those
    of a second process that runs beside it (the extractor's), reported with `beside_at`, and `wait`: the stage of this
    plan that waits for it. With a plan the time left is estimated from the start and the percentage is of the time
    (elapsed / (elapsed + left)), so it moves evenly; without one, `total` units at their recent rate.
    `update` counts steps of the current stage (`set_postfix_str` names it).

    `stream` (default stderr): a terminal gets one line redrawn in place; anything else (a run's log file)
    gets a line when a stage changes and every tenth of the way. `disable` silences the stream only; the
    file is always written (the workbench shows it)."""

    def __init__(self, root: str | os.PathLike[str], total: int = 0, desc: str = "model build", disable: bool = False,
                 stream: TextIO | None = None, clock: Callable[[], float] = time.time, *,
                 plan: Sequence[Stage] | None = None, beside: Sequence[Stage] | None = None, wait: str | None = None,
                 **_: Any) -> None:
        self.root = Path(root)  # the models folder
        self.root.parent.mkdir(parents=True, exist_ok=True)
        self.desc, self.clock = desc, clock
        self.planned = plan is not None
        self.total = 1000 if self.planned else max(1, int(total))
        self.stream = None if disable else (stream or sys.stderr)
        self.tty = bool(self.stream is not None and getattr(self.stream, "isatty", lambda: False)())
        self.started = clock()
        self.main = _Lane(plan if plan is not None else [("", self.total, None)], self.started)
        self.side = _Lane(beside, self.started) if beside else None
        self.side_on = False  # the second process has reported a stage
        self.wait = wait
        self.units = 0  # steps counted by update (without a plan: the progress itself)
        self._frac = 0.0  # with a plan: the share of the time done, never going back
        self._written = 0.0
        self._logged_tenth = -1
        self.closed = False
        self._flush(force=True)
        self._say(f"{self.desc}: started" + ("" if self.planned else f" ({self.total} units of work)"))

    @property
    def stage(self) -> str:
        return self.main.name

    @property
    def done(self) -> int:
        if not self.planned:
            return min(self.total, self.units)
        eta, now = self.eta_s(), self.clock()
        if eta is not None and now > self.started:
            self._frac = max(self._frac, min(0.99, (now - self.started) / (now - self.started + eta)))
        return int(1000 * self._frac)

    # -- tqdm's interface ------------------------------------------------------------------------------------

    def update(self, n: int = 1) -> None:
        if _STOP.is_set():
            self._flush(force=True)  # where it stopped
            raise BuildStopped("the model build was stopped (a signal or a stop request); nothing was kept")
        self.units += int(n)
        self.main.step(int(n), self.clock())
        self._moved()

    def set_postfix_str(self, s: str, refresh: bool = True) -> None:  # noqa: ARG002 - tqdm's signature
        if s == self.stage:
            return
        self.main.enter(s, self.clock())
        self._stage_changed()

    def beside_at(self, stage: str, done: int) -> None:
        """Where the process beside stands: its stage (a name of `beside`) and the steps it has done in it."""
        if self.side is None:
            return
        now = self.clock()
        if stage != self.side.name:
            if not self.side_on:
                self.side_on, self.side.started = True, now
            self.side.enter(stage, now)
            self.side.step(done, now)
            self._stage_changed()
        elif done != self.side.done:
            self.side.step(done - self.side.done, now)
            self._moved()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.tty and self.stream is not None:
            self.stream.write("\n")
            self.stream.flush()

    # -- what it writes --------------------------------------------------------------------------------------

    def eta_s(self) -> float | None:
        """Seconds left: without a process beside, what this plan has left; with one, the longer of what each has
        left up to the wait for it, then what follows the wait. None until a rate or a plan allows an estimate."""
        now = self.clock()
        if self.side is None or self.wait is None:
            return self.main.left(now)
        before, tail = self.main.left(now, stop=self.wait), self.main.left(now, after=self.wait)
        side = self.side.left(now) if self.side_on else sum(st * (ref or 0.0) for _, st, ref in self.side.plan) * self.main.speed(now)
        if before is None or tail is None or side is None:
            return None
        return max(before, side) + tail

    def state(self, state: str = "building", error: str = "") -> dict[str, Any]:
        main = self.main
        beside = ({"stage": self.side.name, "done": self.side.done, "total": self.side.steps}
                  if self.side is not None and self.side_on else None)
        return {"state": state, "pid": os.getpid(), "stage": self.stage, "done": self.done, "total": self.total,
                "stage_done": main.done if self.planned else None, "stage_total": main.steps if self.planned else None,
                "beside": beside, "started_at": self.started, "updated_at": self.clock(), "eta_s": self.eta_s(),
                "error": error[-500:]}

    def line(self) -> str:
        return describe(self.state())

    def _moved(self) -> None:
        self._flush()
        total = self.total
        tenth = int(round(100 * self.done / total)) // 10  # as the line rounds it: one line per shown tenth
        if tenth > self._logged_tenth:
            self._logged_tenth = tenth
            if tenth > 0:
                self._say(self.line())
        elif self.tty:
            self._say(self.line())

    def _stage_changed(self) -> None:
        self._flush(force=True)
        self._say(self.line())
        self._logged_tenth = max(self._logged_tenth, int(round(100 * self.done / self.total)) // 10)

    def _flush(self, force: bool = False) -> None:
        now = self.clock()
        if force or now - self._written >= WRITE_EVERY_S or self.done >= self.total:
            self._written = now
            _write(self.root, self.state())

    def _say(self, text: str) -> None:
        if self.stream is None:
            return
        try:
            if self.tty:
                self.stream.write("\r\x1b[2K" + text[:200])
            else:
                self.stream.write(text + "\n")
            self.stream.flush()
        except (OSError, ValueError):
            pass


def finish(root: str | os.PathLike[str], state: str, error: str = "") -> None:
    """Record how this process's build ended (the lock's holder calls it; a file of another pid is left alone)."""
    root = Path(root)
    try:
        p = json.loads((root.parent / PROGRESS_NAME).read_text())
    except (OSError, json.JSONDecodeError):
        return
    if p.get("pid") != os.getpid() or p.get("state") != "building":
        return
    p.update(state=state, updated_at=time.time(), error=error[-500:], eta_s=None)
    if state == "done":
        p["done"] = p.get("total", p.get("done"))
    _write(root, p)


@contextmanager
def build_lock(root: str | os.PathLike[str], *, say: Callable[[str], None] | None = None) -> Iterator[None]:
    """Hold the models folder's build lock; wait for it (saying so once, then every minute) while another
    process or thread builds. The wait ends with BuildStopped on `request_stop()`."""
    root = Path(root)
    root.parent.mkdir(parents=True, exist_ok=True)
    say = say or (lambda s: print(s, file=sys.stderr, flush=True))
    fd = os.open(root.parent / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        last_said = 0.0
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if _STOP.is_set():
                    raise BuildStopped("stopped while waiting for another process's model build") from None
                if time.monotonic() - last_said >= 60.0:
                    last_said = time.monotonic()
                    p = building(root.parent)
                    who = f"process {p['pid']}: {describe(p)}" if p else "another process"
                    say(f"waiting for the model build by {who}")
                time.sleep(WAIT_POLL_S)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def one_build_at_a_time(ensure: Callable[..., Any]) -> Callable[..., Any]:
    """Decorator for `ensure_models(data_dir, ...)`: the whole call holds the models folder's lock (so a second
    builder waits, then finds the first one's models and returns them), and the end of a build is recorded."""

    @functools.wraps(ensure)
    def wrapper(data_dir: str | os.PathLike[str], *args: Any, **kwargs: Any) -> Any:
        root = models_root(data_dir)
        with build_lock(root):
            try:
                out = ensure(data_dir, *args, **kwargs)
            except BuildStopped:
                finish(root, "stopped")
                raise
            except BaseException as e:
                finish(root, "stopped" if isinstance(e, KeyboardInterrupt) else "failed", f"{type(e).__name__}: {e}")
                raise
            finish(root, "done")
            return out

    return wrapper
