"""Helpers every part of the workbench service uses: the error a person can correct, the parsers of numbers
and id lists typed in the page, and small formatting and process helpers."""
from __future__ import annotations

import math
import importlib
import logging
import os
import re
import threading
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from core.store import INT32
from envs.base import instance_task


log = logging.getLogger("app.service")  # one logger for the whole service
ROOT = Path(__file__).resolve().parents[2]
CONFIG_DIR = ROOT / "configs"
DEFAULT_UPLOAD_CAP_MB = 20.0
MAX_SEEDS = 10_000
LOG_TAIL_BYTES = 64_000
BUILD_SHOWN_S = 600.0  # a finished model build stays on the Runs tab this long ("models ready")

# The one owner of the native envs this process plays (the entry checker's and the demo's, envs/minihack.py). NLE
# loads a private copy of libnethack per env and reloads it on reset; two threads doing that at once race in
# `nledl_init` ("library /proc/self/fd/N is already loaded") and the app dies of a double free (two first library page
# loads did). NLE's state is per process, not per Workbench, so the lock is too: every build, reset, step and close of
# an env in the workbench process holds it. Reentrant: closing a player inside a locked section is fine.
ENV_LOCK = threading.RLock()


def task_noun(env_name: str) -> str:
    """What a recurring task of `env_name` is called in its task text ("Dungeon" on MiniHack, "Household" on ALFWorld,
    "Task" where the env has no word of its own): the word envs/base.py `instance_task` writes, read off it."""
    return instance_task(env_name or "", 0, "").split(" ", 1)[0]


def task_id_label(env_name: str | None, *, plural: bool = False) -> str:
    """The label of a "the seed is a recurring task id" checkbox (as runs with env.task_set name their tasks), in the
    env's own words ("Household N" on ALFWorld, "Dungeon N" on MiniHack); with no env chosen, a few of them."""
    what = f"{task_noun(env_name)} N" if env_name else "Dungeon N, Household N, …"
    return f"recurring task ids ({what}); off: env seeds" if plural else f"recurring task id ({what}); off: an env seed"


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
    (32-bit integer columns: core/store/schema.py INT32)."""
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
