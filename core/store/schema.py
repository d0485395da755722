"""The store's schema: its errors, the tables (SQLAlchemy ORM rows) and the one validation layer every
value passes before a statement binds it, so SQLite and Postgres accept exactly the same inputs."""
from __future__ import annotations

import math
import os
import time
from typing import Any, Iterable

import numpy as np
from sqlalchemy import (
    BindParameter,
    Boolean,
    Float,
    ForeignKey,
    Index,
    Insert,
    Integer,
    LargeBinary,
    String,
    Text,
    event,
    Update,
)
from sqlalchemy.engine import Engine
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from core.types import Source, Status


class StoreError(RuntimeError):
    """A store operation that cannot be done as asked; the message says why."""


class StaleWriteError(StoreError):
    """An update based on an old version of an entry: someone else changed it first."""

    def __init__(self, entry_id: int, expected: int, current: int):
        super().__init__(
            f"entry {entry_id} was changed by someone else (you edited version {expected}, it is now at "
            f"version {current}); reload it and apply your edit again"
        )
        self.entry_id, self.expected, self.current = entry_id, expected, current


class NotFoundError(StoreError):
    pass


LIVE_STATUSES = ("starting", "running", "paused")
HEARTBEAT_S = 5.0  # how often a trainer says it is alive
HEARTBEAT_STALE_S = 120.0  # silence after which a run on another host counts as dead (GIL stalls, busy SQLite)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return True  # exists, owned by someone else (or not a pid we can ask about: do not call it dead)
    return True


def log_tail(path: str, lines: int = 20, max_bytes: int = 16_000) -> str:
    """The last lines of a run's log (what a dead run shows instead of its last words)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - max_bytes))
            text = f.read().decode("utf-8", errors="replace")
    except OSError as e:
        return f"(cannot read {path}: {e.strerror})"
    return "\n".join(text.splitlines()[-lines:])


# ---------------------------------------------------------------------------------------------
# Tables


class Base(DeclarativeBase):
    pass


class LibraryState(Base):
    __tablename__ = "library_state"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    version: Mapped[int] = mapped_column(Integer, default=0)


class EntryRow(Base):
    __tablename__ = "entries"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    text: Mapped[str] = mapped_column(Text)
    env: Mapped[str] = mapped_column(String(128), default="", index=True)
    task: Mapped[str] = mapped_column(Text, default="")
    query: Mapped[str] = mapped_column(Text, default="")
    source: Mapped[str] = mapped_column(String(16), default=Source.EXTRACTED.value, index=True)
    status: Mapped[str] = mapped_column(String(16), default=Status.ACTIVE.value, index=True)
    version: Mapped[int] = mapped_column(Integer, default=1)
    parent_ids: Mapped[str] = mapped_column(Text, default="[]")  # JSON list of entry ids (lineage)
    created_step: Mapped[int] = mapped_column(Integer, default=0)
    run_id: Mapped[int | None] = mapped_column(Integer, nullable=True, index=True)
    source_episode_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    retrieved_count: Mapped[int] = mapped_column(Integer, default=0)
    trained_count: Mapped[int] = mapped_column(Integer, default=0)
    last_retrieved_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    last_trained_step: Mapped[int | None] = mapped_column(Integer, nullable=True)
    successes: Mapped[int] = mapped_column(Integer, default=0)
    failures: Mapped[int] = mapped_column(Integer, default=0)
    gen_prompt: Mapped[str | None] = mapped_column(Text, nullable=True)
    gen_response: Mapped[str | None] = mapped_column(Text, nullable=True)
    gen_tokens: Mapped[str | None] = mapped_column(Text, nullable=True)  # JSON: prompt_ids, response_ids, logprobs, model_version
    query_embedding: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)  # float32, unit norm
    text_embedding: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)  # float32, unit norm, of `text`
    embedder: Mapped[str] = mapped_column(String(256), default="")
    changed_version: Mapped[int] = mapped_column(Integer, default=0, index=True)
    created_at: Mapped[float] = mapped_column(Float, default=time.time)
    updated_at: Mapped[float] = mapped_column(Float, default=time.time)


class EntryVersionRow(Base):
    __tablename__ = "entry_versions"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    entry_id: Mapped[int] = mapped_column(ForeignKey("entries.id", ondelete="CASCADE"), index=True)
    version: Mapped[int] = mapped_column(Integer)
    text: Mapped[str] = mapped_column(Text)
    status: Mapped[str] = mapped_column(String(16))
    action: Mapped[str] = mapped_column(String(32))  # create, edit, archive, restore, revert, merge, op_update, import
    actor: Mapped[str] = mapped_column(String(64), default="")  # extractor, human, merge, import, ...
    note: Mapped[str] = mapped_column(Text, default="")
    library_version: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[float] = mapped_column(Float, default=time.time)
    # The run and step whose extractor or merge wrote this version (None: a person, an import): what a resume from an
    # earlier checkpoint takes back (RunTables.drop_after_step). Added after the first release: _add_missing_columns.
    run_id: Mapped[int | None] = mapped_column(Integer, nullable=True, index=True)
    step: Mapped[int | None] = mapped_column(Integer, nullable=True)


class EntryCountRow(Base):
    """What one run step added to an entry's retrieval or training counters (`kind` "retrieved" or "trained": n more,
    and the entry's last_retrieved_at / last_trained_step before and after): a resume from an earlier checkpoint
    subtracts the steps it redoes and puts the last-values back (RunTables.drop_after_step), so Eq. 6 and Eq. 7 read
    the counters as of the checkpoint."""

    __tablename__ = "entry_counts"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    entry_id: Mapped[int] = mapped_column(ForeignKey("entries.id", ondelete="CASCADE"), index=True)
    run_id: Mapped[int] = mapped_column(Integer, index=True)
    step: Mapped[int] = mapped_column(Integer)
    kind: Mapped[str] = mapped_column(String(16))
    n: Mapped[int] = mapped_column(Integer)
    before: Mapped[float | None] = mapped_column(Float, nullable=True)  # last_retrieved_at or last_trained_step before
    after: Mapped[float | None] = mapped_column(Float, nullable=True)  # and the value this write set


class EntryUsageRow(Base):
    """One retrieval of an entry by one episode, with its outcome once known (reward history)."""

    __tablename__ = "entry_usage"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    entry_id: Mapped[int] = mapped_column(ForeignKey("entries.id", ondelete="CASCADE"), index=True)
    run_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    episode_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    step: Mapped[int] = mapped_column(Integer, default=0)
    success: Mapped[bool] = mapped_column(Boolean)
    reward: Mapped[float] = mapped_column(Float, default=0.0)
    created_at: Mapped[float] = mapped_column(Float, default=time.time)


class RunRow(Base):
    __tablename__ = "runs"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(256))
    variant: Mapped[str] = mapped_column(String(32), default="")
    env: Mapped[str] = mapped_column(String(256), default="")
    config: Mapped[str] = mapped_column(Text, default="")  # the YAML/JSON the run was started with
    status: Mapped[str] = mapped_column(String(16), default="created", index=True)  # created running paused stopped finished failed
    step: Mapped[int] = mapped_column(Integer, default=0)
    pid: Mapped[int | None] = mapped_column(Integer, nullable=True)
    backend: Mapped[str] = mapped_column(String(256), default="")
    device: Mapped[str] = mapped_column(String(64), default="")
    log_path: Mapped[str] = mapped_column(Text, default="")
    checkpoint_dir: Mapped[str] = mapped_column(Text, default="")
    parent_run_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    error: Mapped[str] = mapped_column(Text, default="")
    started_at: Mapped[float] = mapped_column(Float, default=time.time)
    updated_at: Mapped[float] = mapped_column(Float, default=time.time)
    ended_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    # Liveness: the trainer writes heartbeat_at every few seconds; with host and pid the workbench tells a
    # killed run from a slow one (reap_dead_runs). Added after the first release: _add_missing_columns.
    host: Mapped[str] = mapped_column(String(256), default="")
    heartbeat_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    # When metric rows of this run were last deleted (a resume dropping redone steps, a value superseded):
    # readers that cache a run's series by id cursor (app/service/curves.py MetricCache) reload it when this moves.
    metrics_reset_at: Mapped[float | None] = mapped_column(Float, nullable=True)


class MetricRow(Base):
    __tablename__ = "metrics"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    step: Mapped[int] = mapped_column(Integer)
    key: Mapped[str] = mapped_column(String(128))
    value: Mapped[float] = mapped_column(Float)
    time: Mapped[float] = mapped_column(Float, default=time.time)
    # Live plots ask "points of (run, key) newer than cursor id": this covering index answers it
    # without touching the table rows.
    __table_args__ = (Index("ix_metrics_run_key_id", "run_id", "key", "id", "step", "value", "time"),)


class RunCommandRow(Base):
    __tablename__ = "run_commands"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    command: Mapped[str] = mapped_column(String(16))  # pause, resume, stop
    created_at: Mapped[float] = mapped_column(Float, default=time.time)
    consumed_at: Mapped[float | None] = mapped_column(Float, nullable=True)


class TrajectoryRow(Base):
    __tablename__ = "trajectories"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[int | None] = mapped_column(Integer, nullable=True, index=True)
    ab_test_id: Mapped[int | None] = mapped_column(Integer, nullable=True, index=True)
    step: Mapped[int] = mapped_column(Integer, default=0)
    env: Mapped[str] = mapped_column(String(128))
    task: Mapped[str] = mapped_column(Text)
    seed: Mapped[int] = mapped_column(Integer)
    with_experience: Mapped[bool] = mapped_column(Boolean, default=False)
    success: Mapped[bool] = mapped_column(Boolean, default=False)
    reward: Mapped[float] = mapped_column(Float, default=0.0)
    num_actions: Mapped[int] = mapped_column(Integer, default=0)
    experience_ids: Mapped[str] = mapped_column(Text, default="[]")
    experience_text: Mapped[str] = mapped_column(Text, default="")
    steps: Mapped[str] = mapped_column(Text, default="[]")  # JSON list of Step dicts
    created_at: Mapped[float] = mapped_column(Float, default=time.time)


class ABTestRow(Base):
    __tablename__ = "ab_tests"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(256))
    config: Mapped[str] = mapped_column(Text, default="{}")
    status: Mapped[str] = mapped_column(String(16), default="created")
    progress: Mapped[float] = mapped_column(Float, default=0.0)
    results: Mapped[str] = mapped_column(Text, default="{}")
    error: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[float] = mapped_column(Float, default=time.time)
    updated_at: Mapped[float] = mapped_column(Float, default=time.time)


# ---------------------------------------------------------------------------------------------
# One validation layer at the boundary: SQLite and Postgres accept exactly the same inputs
#
# SQLite stores almost anything (NUL characters, a 300-character VARCHAR(256), 2**40 in an INTEGER),
# Postgres refuses each with a driver error halfway through a transaction, and both fail on integers
# beyond 64 bits (OverflowError from sqlite3, "out of range" from Postgres). Every value that reaches a
# statement passes here first, so a bad value is one StoreError naming the field on either back end,
# raised before anything is written. The rules are Postgres's column types: the stricter of the two.

# Every integer column is Postgres INTEGER (4 bytes), and Postgres refuses a larger integer even in a
# WHERE clause ("integer out of range") where SQLite would answer "not found": so no statement may
# bind an integer outside this range, on either back end.
INT32 = (-(2**31), 2**31 - 1)
_NOUN = {"entries": "entry", "entry_versions": "entry version", "entry_usage": "entry usage row",
         "entry_counts": "entry counter row", "runs": "run",
         "metrics": "metric", "run_commands": "run command", "trajectories": "stored episode", "ab_tests": "A/B test",
         "library_state": "library state"}


def _bad_value(noun: str, field: str, v: Any, col_type: Any) -> str | None:
    """Why value `v` cannot be stored in a column of `col_type` (None: it can)."""
    if v is None or isinstance(v, (bytes, bytearray, memoryview)):
        return None
    if isinstance(v, str):
        if "\x00" in v:
            return f"{noun} {field} contains a NUL character (\\x00); remove it"
        limit = getattr(col_type, "length", None)
        if limit is not None and len(v) > limit:
            return f"{noun} {field} is {len(v):,} characters long; the store keeps at most {limit}: shorten it"
        return None
    if isinstance(v, bool):
        return None
    if isinstance(v, (int, np.integer)):
        lo, hi = INT32
        if isinstance(col_type, Integer) and not lo <= int(v) <= hi:
            return f"{noun} {field} {int(v)} is out of range; the store keeps integers from {lo} to {hi}"
        return None
    if isinstance(v, (float, np.floating)) and math.isnan(float(v)):
        # SQLite would store NaN as NULL and Postgres as NaN: neither is the value that was meant.
        return f"{noun} {field} is NaN; store a number"
    return None


def check_values(table: Any, values: dict[str, Any]) -> None:
    """Raise StoreError if any of `values` (column key -> value) cannot be stored in `table` as it is."""
    noun = _NOUN.get(table.name, table.name)
    for key, v in values.items():
        col = table.columns.get(key)
        if col is None:
            continue  # a bind parameter of a WHERE clause (checked by _check_params) or an ORM pk alias
        why = _bad_value(noun, key.replace("_", " "), v, col.type)
        if why:
            raise StoreError(why)


def _check_params(params: Any) -> None:
    """Every bound value of every statement, reads included: no driver can take these on either back end."""
    if isinstance(params, dict):
        items: Iterable[Any] = params.values()
    elif isinstance(params, (list, tuple)):
        items = params
    else:
        return
    for v in items:
        if isinstance(v, (dict, list, tuple)):
            _check_params(v)
        elif isinstance(v, str) and "\x00" in v:
            raise StoreError("a value contains a NUL character (\\x00), which the store cannot keep; remove it")
        elif isinstance(v, (int, np.integer)) and not isinstance(v, bool) and not INT32[0] <= int(v) <= INT32[1]:
            raise StoreError(f"{int(v)} is out of range: ids, versions, steps, seeds and counters are at most {INT32[1]}")


def _install_checks(engine: Engine) -> None:
    @event.listens_for(engine, "before_execute")
    def _before_execute(conn, clause, multiparams, params, execution_options):  # noqa: ANN001
        # Writes, by column: the rows an insert or update carries (ORM flushes come this way too) and
        # the literal values of `.values(...)`. Expressions such as `version + 1` are the database's
        # to compute and are not checked.
        if isinstance(clause, (Insert, Update)):
            for rows in (multiparams, params):
                for row in (rows if isinstance(rows, (list, tuple)) else [rows]):
                    if isinstance(row, dict):
                        check_values(clause.table, row)
            # `_values` is SQLAlchemy's own record of `.values(...)` (stable through 2.x, no public accessor).
            literal = {getattr(k, "key", k): v.value for k, v in (getattr(clause, "_values", None) or {}).items()
                       if isinstance(v, BindParameter)}
            check_values(clause.table, literal)

    @event.listens_for(engine, "before_cursor_execute")
    def _before_cursor(conn, cursor, statement, parameters, context, executemany):  # noqa: ANN001
        _check_params(parameters)
