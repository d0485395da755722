"""One model build at a time, and where it stands: the first ten minutes of a new user's first run.

The tiny default models are built on first use (trainers/warmstart/build.py `ensure_models`), by whoever
needs them first: a run, an A/B test's evaluation, the workbench's live policy demo, `comprl models
init`. Two builders into one `models/` folder would delete each other's work, so the build runs behind
an exclusive lock, and while it runs it writes where it stands to a small JSON file that the workbench
(Runs tab, Live curves, the terminal of `comprl app`) reads:

    <data_dir>/.models-build.lock    flock'ed by the builder; anyone else who needs the models waits on it
                                     (interruptibly: SIGTERM/SIGINT end the wait)
    <data_dir>/.models-build.json    {"state": "building"|"done"|"failed"|"stopped", "pid", "stage", "done",
                                     "total", "started_at", "updated_at", "eta_s", "error"}

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
from collections.abc import Callable, Iterator
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


def describe(p: dict[str, Any]) -> str:
    """One line: 'model build 34% (policy SFT), 2 min 10 s in, about 5 min 02 s left'."""
    total = max(1, int(p.get("total") or 1))
    pct = 100.0 * min(int(p.get("done") or 0), total) / total
    state = p.get("state")
    elapsed = (p.get("updated_at") or time.time()) - (p.get("started_at") or time.time())
    if state == "building":
        eta = p.get("eta_s")
        left = f", about {fmt_duration(eta)} left" if eta is not None else ", estimating the time left"
        return f"model build {pct:.0f}% ({p.get('stage') or 'starting'}), {fmt_duration(elapsed)} in{left}"
    if state == "done":
        return f"model build done in {fmt_duration(elapsed)}"
    if state == "stopped":
        return f"model build stopped at {pct:.0f}% ({p.get('stage') or '?'})"
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


class BuildProgress:
    """tqdm's three methods as the build uses them, writing the progress file and a few lines.

    `stream` (default stderr): a terminal gets one line redrawn in place; anything else (a run's log file)
    gets a line when the stage changes and every tenth of the way. `disable` silences the stream only; the
    file is always written (the workbench shows it)."""

    def __init__(self, root: str | os.PathLike[str], total: int, desc: str = "model build", disable: bool = False,
                 stream: TextIO | None = None, clock: Callable[[], float] = time.time, **_: Any) -> None:
        self.root = Path(root)  # the models folder
        self.root.parent.mkdir(parents=True, exist_ok=True)
        self.total, self.desc, self.clock = max(1, int(total)), desc, clock
        self.stream = None if disable else (stream or sys.stderr)
        self.tty = bool(self.stream is not None and getattr(self.stream, "isatty", lambda: False)())
        self.done = 0
        self.stage = ""
        self.started = clock()
        self._written = 0.0
        self._logged_tenth = -1
        self._stage_started = (self.started, 0)  # (time, done) where the current stage began
        self._rates: list[tuple[float, int]] = []  # (time, done) samples of the current stage, for the rate
        self._stages = 0
        self._said: tuple[str, int] | None = None  # (stage, tenth) of the last line written
        self.closed = False
        self._flush(force=True)
        self._say(f"{self.desc}: started ({self.total} units of work)")

    # -- tqdm's interface ------------------------------------------------------------------------------------

    def update(self, n: int = 1) -> None:
        if _STOP.is_set():
            self._flush(force=True)  # where it stopped
            raise BuildStopped("the model build was stopped (a signal or a stop request); nothing was kept")
        self.done = min(self.total, self.done + int(n))
        now = self.clock()
        self._rates.append((now, self.done))
        if len(self._rates) > 400:
            self._rates = self._rates[-200:]
        self._flush()
        tenth = int(round(100 * self.done / self.total)) // 10  # as the line rounds it: one line per shown tenth
        if tenth > self._logged_tenth:
            self._logged_tenth = tenth
            if tenth > 0 and (self.stage, tenth) != self._said:
                self._say(self.line())
                self._said = (self.stage, tenth)
        elif self.tty:
            self._say(self.line())

    def set_postfix_str(self, s: str, refresh: bool = True) -> None:  # noqa: ARG002 - tqdm's signature
        if s == self.stage:
            return
        self._stages += 1
        self._rates = []  # a stage's units cost what they cost: the rate is measured afresh in each
        self.stage = s
        self._flush(force=True)
        self._say(self.line())
        self._said = (s, int(round(100 * self.done / self.total)) // 10)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.tty and self.stream is not None:
            self.stream.write("\n")
            self.stream.flush()

    # -- what it writes --------------------------------------------------------------------------------------

    def eta_s(self) -> float | None:
        """Seconds left at the rate of the current stage over its last few minutes. None during the first stage
        (the warm start's first units are demo episodes, far cheaper than the training steps after them: a rate
        from them would promise a fraction of the time) and until a stage has a few samples."""
        if self._stages < 2 or len(self._rates) < 3:
            return None
        now, done = self._rates[-1]
        window = [r for r in self._rates if now - r[0] <= 180.0]
        t0, d0 = window[0]
        if done <= d0 or now <= t0:
            return None
        return (self.total - done) * (now - t0) / (done - d0)

    def state(self, state: str = "building", error: str = "") -> dict[str, Any]:
        return {"state": state, "pid": os.getpid(), "stage": self.stage, "done": self.done, "total": self.total,
                "started_at": self.started, "updated_at": self.clock(), "eta_s": self.eta_s(), "error": error[-500:]}

    def line(self) -> str:
        return describe(self.state())

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
