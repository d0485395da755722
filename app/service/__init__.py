"""What the workbench does, behind the UI: every Gradio callback is one line into a `Workbench` method.

The service reads and writes through `core.store.ExperienceStore` (the only code that touches the
database), searches through an `ExperienceManager` (the same embedder and index as the actor's
retrieval, with usage counting off), starts runs and A/B evaluations as separate `comprl`
processes, and formats with `app.views`. It never imports Gradio, so every callback is tested
without a browser.

Methods return what the UI shows: strings (Markdown/HTML), DataFrames, figure JSON. Errors a
person can act on come back as a message, never as a traceback; `None` in a figure list means
"unchanged since the last refresh" (the UI skips that output).

Split by job: `runs`, `curves` (the live curve cache), `library`, `abtests`, `demo`, and `common` helpers; the
`Workbench` below is the one class the UI and the CLI use, built from those parts.
"""
from __future__ import annotations

import os
import threading
import uuid
from collections import OrderedDict
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from app.service.common import (
    BUILD_SHOWN_S, CONFIG_DIR, DEFAULT_UPLOAD_CAP_MB, ENV_LOCK, log, LOG_TAIL_BYTES, MAX_SEEDS, parse_ids,
    parse_seeds, _redact, ROOT, trainer_available, UserInputError, whole_number,
)
from app.service.curves import CurveSession, CurvesPart, MetricCache, PULL_INTERVAL_S, ROWS_PER_KEY_PER_PULL
from app.service.runs import _Launched, RunsPart
from app.service.library import LibraryPart
from app.service.abtests import ab_pairs, AbTestsPart
from app.service.demo import demo_actor_kwargs, DemoPart, _Play
from core.config import ARM_KINDS, LibraryConfig, default_db_url
from core.embedding import Embedder
from core.manager import ExperienceManager
from core.store import ExperienceStore


class Workbench(RunsPart, CurvesPart, LibraryPart, AbTestsPart, DemoPart):
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
        self._checker = None  # envs/entry_check.py, built on the first recurring-task entry shown, under ENV_LOCK
        self._manager_lock = threading.Lock()  # the manager is built once (loading the embedder takes seconds)
        # One search through the manager at a time (`searching`): its sync embeds the entries written without an
        # embedder and changes the index, and the query is embedded by that same embedder. The manager already
        # serialises its own syncs and the embedder its model; this lock makes the workbench, not those internals,
        # the owner of the order, for every request path that syncs (search, near-duplicates, the demo's retrieval).
        self._search_lock = threading.Lock()
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
                    with ENV_LOCK:
                        p.player.close()
                except Exception:
                    log.exception("closing a player failed")
            self._plays.clear()
        if self._manager is not None:
            self._manager.close()
        if self._checker is not None:
            with ENV_LOCK:
                self._checker.close()
        self.store.close()

    def overview_md(self) -> str:
        runs = self.store.list_runs()
        running = sum(r["status"] == "running" for r in runs)
        ok, _ = trainer_available()
        return (f"**Complementary RL workbench** · data `{self.data_dir}` · store `{_redact(self.db_url)}` · "
                f"library version {self.store.library_version()} · {self.store.count(status='active'):,} active entries · "
                f"{len(runs)} runs ({running} running){'' if ok else ' · trainer not installed'}")

    def manager(self):
        """The workbench's ExperienceManager, started on first use (loading the embedder takes seconds)."""
        with self._manager_lock:
            if self._manager is None:
                cfg = LibraryConfig()
                cfg.manager.record_usage = False  # a person's search is not an actor's retrieval
                cfg.manager.diversify = False  # and should rank by similarity alone
                cfg.manager.random_demote = False
                embedder = self._embedder or Embedder(cfg.embedding)
                self._manager = ExperienceManager(self.store, embedder, cfg.manager, cfg.index)
            return self._manager

    @contextmanager
    def searching(self) -> Iterator[ExperienceManager]:
        """The manager, in step with the store, held for one search (semantic search, near-duplicates, the demo's
        retrieval): every request thread that embeds or reads the index comes through here, one at a time."""
        m = self.manager()
        with self._search_lock:
            m.sync()  # embeds entries written without an embedder (an import, the UI)
            yield m

    def warm_up(self) -> None:
        """Load the embedder and index in the background so the first search is quick."""
        threading.Thread(target=self.manager, name="workbench-warmup", daemon=True).start()

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
                    with ENV_LOCK:
                        old.player.close()
            return token, table[token]


__all__ = [
    "ab_pairs", "ARM_KINDS", "BUILD_SHOWN_S", "CONFIG_DIR", "CurveSession", "DEFAULT_UPLOAD_CAP_MB", "ENV_LOCK",
    "demo_actor_kwargs", "log", "LOG_TAIL_BYTES", "MAX_SEEDS", "MetricCache", "parse_ids",
    "parse_seeds", "PULL_INTERVAL_S", "ROOT", "ROWS_PER_KEY_PER_PULL", "trainer_available", "UserInputError",
    "whole_number", "Workbench",
]
