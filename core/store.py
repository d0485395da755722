"""The store: the only code that touches the database (DESIGN.md habit 6).

SQLite in WAL mode by default (one file under the data directory); any SQLAlchemy URL works
(Postgres for several machines or users). Every process — the trainer, the workbench, the CLI —
meets here.

Library version: one counter, bumped inside every transaction that changes the library's
contents (an entry added, its text or status changed, a merge, a revert, an import). Usage
counters (retrieved, trained, successes) are statistics and do not bump it, so a trainer's
retrieval traffic does not make every other process re-sync its index. Each entry remembers the
library version of its last change (`changed_version`), which makes "what changed since version
v" one indexed query: the change feed the ExperienceManager polls.

Every content change is also a row in `entry_versions`, so any entry can be diffed and reverted
and nothing is lost; delete is soft (status archived) and restorable.
"""
from __future__ import annotations

import difflib
import json
import math
import os
import socket
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

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
    create_engine,
    event,
    delete,
    func,
    inspect,
    or_,
    Update,
    select,
    update,
)
from sqlalchemy import text as text_sql
from sqlalchemy.engine import Engine
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker
from sqlalchemy.pool import StaticPool

from core.types import Experience, Generation, Source, Status


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
    # readers that cache a run's series by id cursor (app/service.py MetricCache) reload it when this moves.
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
_NOUN = {"entries": "entry", "entry_versions": "entry version", "entry_usage": "entry usage row", "runs": "run",
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


# ---------------------------------------------------------------------------------------------
# Plain results handed to callers


@dataclass
class VersionInfo:
    entry_id: int
    version: int
    text: str
    status: str
    action: str
    actor: str
    note: str
    library_version: int
    created_at: float


@dataclass
class Page:
    entries: list[Experience]
    total: int
    offset: int
    limit: int


SORTABLE = {
    "id", "created_at", "updated_at", "retrieved_count", "trained_count", "last_retrieved_at",
    "last_trained_step", "successes", "failures", "version", "created_step",
}


def _vec_to_bytes(v: np.ndarray | None) -> bytes | None:
    return None if v is None else np.ascontiguousarray(v, dtype=np.float32).tobytes()


def _bytes_to_vec(b: bytes | None) -> np.ndarray | None:
    return None if b is None else np.frombuffer(b, dtype=np.float32).copy()


def _to_experience(r: EntryRow) -> Experience:
    gen = None
    if r.gen_prompt is not None or r.gen_response is not None:
        tok = json.loads(r.gen_tokens) if r.gen_tokens else {}
        gen = Generation(
            prompt=r.gen_prompt or "",
            response=r.gen_response or "",
            prompt_ids=tok.get("prompt_ids", []),
            response_ids=tok.get("response_ids", []),
            response_logprobs=tok.get("response_logprobs", []),
            model_version=tok.get("model_version", 0),
        )
    return Experience(
        id=r.id, text=r.text, env=r.env, task=r.task, query=r.query, source=Source(r.source),
        status=Status(r.status), version=r.version, parent_ids=json.loads(r.parent_ids or "[]"),
        created_step=r.created_step, run_id=r.run_id, source_episode_id=r.source_episode_id,
        retrieved_count=r.retrieved_count, trained_count=r.trained_count,
        last_retrieved_at=r.last_retrieved_at, last_trained_step=r.last_trained_step,
        successes=r.successes, failures=r.failures, generation=gen,
        created_at=r.created_at, updated_at=r.updated_at,
    )


def _gen_columns(gen: Generation | None) -> dict[str, Any]:
    if gen is None:
        return {"gen_prompt": None, "gen_response": None, "gen_tokens": None}
    return {
        "gen_prompt": gen.prompt,
        "gen_response": gen.response,
        "gen_tokens": json.dumps({
            "prompt_ids": list(gen.prompt_ids), "response_ids": list(gen.response_ids),
            "response_logprobs": [float(x) for x in gen.response_logprobs], "model_version": gen.model_version,
        }),
    }


@dataclass
class NewEntry:
    """What a writer supplies for one new entry (embeddings optional: the manager fills them in)."""

    text: str
    env: str = ""
    task: str = ""
    query: str = ""
    source: Source = Source.EXTRACTED
    status: Status = Status.ACTIVE
    parent_ids: Sequence[int] = ()
    created_step: int = 0
    run_id: int | None = None
    source_episode_id: int | None = None
    generation: Generation | None = None
    query_embedding: np.ndarray | None = None
    text_embedding: np.ndarray | None = None
    embedder: str = ""
    id: int | None = None  # only imports keep a given id
    counters: dict[str, Any] | None = None  # only imports restore counters


def text_diff(old: str, new: str, from_label: str, to_label: str) -> str:
    """Unified diff of two texts, one line per line. (difflib on `splitlines(True)` joins a last line without a newline
    to the next one: "-old last+new last" on one line, the added line never shown as added.)"""
    return "\n".join(difflib.unified_diff(old.splitlines(), new.splitlines(), from_label, to_label, lineterm=""))


class ExperienceStore:
    """All reads and writes of the workbench's data. Thread-safe; many processes may share one URL."""

    def __init__(self, url: str, *, echo: bool = False):
        self.url = url
        self.engine: Engine = self._make_engine(url, echo)
        _install_checks(self.engine)
        Base.metadata.create_all(self.engine)
        self._add_missing_columns()
        self._session = sessionmaker(self.engine, expire_on_commit=False)
        with self._tx() as s:
            if s.get(LibraryState, 1) is None:
                s.add(LibraryState(id=1, version=0))

    # -- engine and transactions -------------------------------------------------------------

    @staticmethod
    def _make_engine(url: str, echo: bool) -> Engine:
        if url.startswith("sqlite"):
            path = url.split("///", 1)[1] if "///" in url else ""
            memory = path in ("", ":memory:")
            if not memory:
                Path(path).parent.mkdir(parents=True, exist_ok=True)
            # An in-memory database lives in one connection: every session must share it.
            extra = {"poolclass": StaticPool} if memory else {}
            engine = create_engine(url, echo=echo, connect_args={"timeout": 60, "check_same_thread": False}, **extra)

            @event.listens_for(engine, "connect")
            def _on_connect(dbapi_conn, _record):  # noqa: ANN001
                # Let SQLAlchemy own transactions (pysqlite's implicit BEGIN would defer the write
                # lock and let two writers deadlock on upgrade); see the "begin" hook below.
                dbapi_conn.isolation_level = None
                cur = dbapi_conn.cursor()
                cur.execute("PRAGMA journal_mode=WAL")
                cur.execute("PRAGMA foreign_keys=ON")
                cur.execute("PRAGMA synchronous=NORMAL")
                cur.execute("PRAGMA busy_timeout=60000")
                cur.close()

            @event.listens_for(engine, "begin")
            def _on_begin(conn):  # noqa: ANN001
                # Take the write lock up front: a read-then-write transaction can then never fail
                # half-way because another process wrote in between.
                conn.exec_driver_sql("BEGIN IMMEDIATE")

            return engine
        return create_engine(url, echo=echo, pool_pre_ping=True)

    def _add_missing_columns(self) -> None:
        """Columns added to a table after a database was created (create_all adds tables, never columns).

        Only nullable or defaulted columns are ever added, so old rows stay valid. Two processes may
        race here: the loser's ALTER fails and the column is there all the same."""
        insp = inspect(self.engine)
        for table in Base.metadata.sorted_tables:
            have = {c["name"] for c in insp.get_columns(table.name)}
            for col in table.columns:
                if col.name in have:
                    continue
                ddl = col.type.compile(dialect=self.engine.dialect)
                default = col.default.arg if col.default is not None and col.default.is_scalar else None
                sql = f'ALTER TABLE {table.name} ADD COLUMN {col.name} {ddl}'
                if isinstance(default, str):
                    sql += f" DEFAULT '{default}'"
                try:
                    with self.engine.begin() as conn:
                        conn.exec_driver_sql(sql)
                except Exception:  # noqa: BLE001 - another process added it first
                    if col.name not in {c["name"] for c in inspect(self.engine).get_columns(table.name)}:
                        raise

    @contextmanager
    def _tx(self) -> Iterator[Session]:
        with self._session() as s, s.begin():
            yield s

    def _bump(self, s: Session) -> int:
        """Increment and return the library version inside the caller's transaction."""
        s.execute(update(LibraryState).where(LibraryState.id == 1).values(version=LibraryState.version + 1))
        return s.execute(select(LibraryState.version).where(LibraryState.id == 1)).scalar_one()

    def close(self) -> None:
        self.engine.dispose()

    # -- library version and change feed -----------------------------------------------------

    def library_version(self) -> int:
        with self._session() as s:
            return s.execute(select(LibraryState.version).where(LibraryState.id == 1)).scalar_one()

    def changes_since(self, version: int) -> tuple[int, list[Experience]]:
        """(current library version, entries whose last change is newer than `version`)."""
        with self._tx() as s:
            current = s.execute(select(LibraryState.version).where(LibraryState.id == 1)).scalar_one()
            rows = s.scalars(select(EntryRow).where(EntryRow.changed_version > version).order_by(EntryRow.id)).all()
            return current, [_to_experience(r) for r in rows]

    # -- entries: create -----------------------------------------------------------------------

    def add_entries(self, new: Sequence[NewEntry], *, actor: str = "extractor", action: str = "create", note: str = "") -> list[int]:
        """Insert entries in one transaction (all or none); returns their ids."""
        if not new:
            return []
        for n in new:
            if not n.text or not n.text.strip():
                raise StoreError("an entry's text must not be empty")
        with self._tx() as s:
            lv = self._bump(s)
            ids = []
            now = time.time()
            for n in new:
                row = EntryRow(
                    text=n.text, env=n.env, task=n.task, query=n.query or n.task, source=Source(n.source).value,
                    status=Status(n.status).value, version=1, parent_ids=json.dumps([int(p) for p in n.parent_ids]),
                    created_step=n.created_step, run_id=n.run_id, source_episode_id=n.source_episode_id,
                    query_embedding=_vec_to_bytes(n.query_embedding), text_embedding=_vec_to_bytes(n.text_embedding),
                    embedder=n.embedder, changed_version=lv, created_at=now, updated_at=now, **_gen_columns(n.generation),
                )
                if n.id is not None:
                    row.id = int(n.id)
                for k, v in (n.counters or {}).items():
                    setattr(row, k, v)
                s.add(row)
                s.flush()
                s.add(EntryVersionRow(entry_id=row.id, version=1, text=row.text, status=row.status, action=action,
                                      actor=actor, note=note, library_version=lv, created_at=now))
                ids.append(row.id)
            if any(n.id is not None for n in new) and self.engine.dialect.name == "postgresql":
                # Explicit ids bypass the sequence; move it past them so later inserts do not collide.
                s.execute(text_sql("SELECT setval(pg_get_serial_sequence('entries', 'id'), (SELECT MAX(id) FROM entries))"))
            return ids

    def remap_parents(self, parents: dict[int, list[int]]) -> None:
        """Set lineage after an import that gave entries fresh ids (no content change, no version bump)."""
        with self._tx() as s:
            for i, p in parents.items():
                s.execute(update(EntryRow).where(EntryRow.id == i).values(parent_ids=json.dumps([int(x) for x in p])))

    def add_entry(self, text: str, **kw: Any) -> int:
        actor = kw.pop("actor", "extractor")
        return self.add_entries([NewEntry(text=text, **kw)], actor=actor)[0]

    # -- entries: read ---------------------------------------------------------------------------

    def get(self, entry_id: int) -> Experience:
        with self._session() as s:
            r = s.get(EntryRow, entry_id)
            if r is None:
                raise NotFoundError(f"no entry with id {entry_id}")
            return _to_experience(r)

    def get_many(self, ids: Iterable[int]) -> dict[int, Experience]:
        ids = list({int(i) for i in ids})
        if not ids:
            return {}
        with self._session() as s:
            return {r.id: _to_experience(r) for r in s.scalars(select(EntryRow).where(EntryRow.id.in_(ids)))}

    def list_entries(
        self,
        *,
        env: str | None = None,
        task: str | None = None,
        source: str | None = None,
        status: str | None = "active",
        text: str | None = None,
        ids: Sequence[int] | None = None,
        sort: str = "id",
        descending: bool = False,
        offset: int = 0,
        limit: int = 50,
    ) -> Page:
        """Filter, sort by any counter, and page. `status=None` lists every status."""
        if sort not in SORTABLE:
            raise StoreError(f"cannot sort by {sort!r}; sortable columns: {', '.join(sorted(SORTABLE))}")
        conds = []
        if env:
            conds.append(EntryRow.env == env)
        if task:
            conds.append(EntryRow.task == task)
        if source:
            conds.append(EntryRow.source == Source(source).value)
        if status:
            conds.append(EntryRow.status == Status(status).value)
        if text:
            like = f"%{text}%"
            conds.append(or_(EntryRow.text.ilike(like), EntryRow.task.ilike(like)))
        if ids is not None:
            conds.append(EntryRow.id.in_([int(i) for i in ids]))
        col = getattr(EntryRow, sort)
        order = [col.desc() if descending else col.asc(), EntryRow.id.asc()]
        with self._session() as s:
            total = s.execute(select(func.count()).select_from(EntryRow).where(*conds)).scalar_one()
            rows = s.scalars(select(EntryRow).where(*conds).order_by(*order).offset(offset).limit(limit)).all()
            return Page([_to_experience(r) for r in rows], total, offset, limit)

    def count(self, *, status: str | None = "active") -> int:
        return self.list_entries(status=status, limit=0).total

    def active_vectors(self, key: str = "query") -> tuple[np.ndarray, np.ndarray, list[Experience]]:
        """(ids (n,), vectors (n, d), entries) of every active entry that has an embedding for `key`."""
        col = EntryRow.query_embedding if key == "query" else EntryRow.text_embedding
        with self._session() as s:
            rows = s.scalars(select(EntryRow).where(EntryRow.status == Status.ACTIVE.value, col.is_not(None)).order_by(EntryRow.id)).all()
            if not rows:
                return np.zeros(0, dtype=np.int64), np.zeros((0, 0), dtype=np.float32), []
            vecs = np.stack([_bytes_to_vec(getattr(r, col.key)) for r in rows])
            return np.array([r.id for r in rows], dtype=np.int64), vecs, [_to_experience(r) for r in rows]

    def embeddings(self, ids: Sequence[int], key: str = "query") -> dict[int, np.ndarray]:
        col = EntryRow.query_embedding if key == "query" else EntryRow.text_embedding
        ids = [int(i) for i in ids]
        out: dict[int, np.ndarray] = {}
        with self._session() as s:
            for a in range(0, len(ids), 10_000):  # SQLite caps the parameters of one statement
                rows = s.execute(select(EntryRow.id, col).where(EntryRow.id.in_(ids[a:a + 10_000]))).all()
                out.update((i, _bytes_to_vec(b)) for i, b in rows if b is not None)
        return out

    def missing_embeddings(self, limit: int = 10_000) -> list[Experience]:
        """Active entries lacking a query or text embedding (written by a process without an embedder)."""
        with self._session() as s:
            rows = s.scalars(select(EntryRow).where(
                EntryRow.status == Status.ACTIVE.value,
                or_(EntryRow.query_embedding.is_(None), EntryRow.text_embedding.is_(None)),
            ).limit(limit)).all()
            return [_to_experience(r) for r in rows]

    def set_embeddings(self, items: Sequence[tuple[int, np.ndarray | None, np.ndarray | None]], embedder: str) -> None:
        """Fill in (id, query_vec, text_vec) without bumping the library version: same content, new cache."""
        with self._tx() as s:
            for entry_id, qv, tv in items:
                vals: dict[str, Any] = {"embedder": embedder}
                if qv is not None:
                    vals["query_embedding"] = _vec_to_bytes(qv)
                if tv is not None:
                    vals["text_embedding"] = _vec_to_bytes(tv)
                s.execute(update(EntryRow).where(EntryRow.id == entry_id).values(**vals))

    # -- entries: change -----------------------------------------------------------------------

    def update_text(
        self,
        entry_id: int,
        text: str,
        *,
        expected_version: int,
        actor: str = "human",
        note: str = "",
        text_embedding: np.ndarray | None = None,
        embedder: str = "",
    ) -> Experience:
        """Replace an entry's text if it is still at `expected_version`; a stale write raises StaleWriteError."""
        if not text or not text.strip():
            raise StoreError("an entry's text must not be empty")
        with self._tx() as s:
            row = s.get(EntryRow, entry_id)
            if row is None:
                raise NotFoundError(f"no entry with id {entry_id}")
            lv = self._bump(s)
            # Compare-and-set in SQL: correct even on databases without BEGIN IMMEDIATE (Postgres).
            res = s.execute(
                update(EntryRow)
                .where(EntryRow.id == entry_id, EntryRow.version == expected_version)
                .values(text=text, version=EntryRow.version + 1, changed_version=lv, updated_at=time.time(),
                        text_embedding=_vec_to_bytes(text_embedding), embedder=embedder or row.embedder)
                .execution_options(synchronize_session=False)
            )
            if res.rowcount != 1:
                raise StaleWriteError(entry_id, expected_version, row.version)  # the transaction rolls back
            s.refresh(row)
            s.add(EntryVersionRow(entry_id=entry_id, version=row.version, text=text, status=row.status, action="edit",
                                  actor=actor, note=note, library_version=lv))
            return _to_experience(row)

    def _set_status(self, s: Session, row: EntryRow, status: Status, lv: int, *, action: str, actor: str, note: str) -> None:
        row.status = status.value
        row.version += 1
        row.changed_version = lv
        row.updated_at = time.time()
        s.add(EntryVersionRow(entry_id=row.id, version=row.version, text=row.text, status=row.status, action=action,
                              actor=actor, note=note, library_version=lv))

    def set_status(self, ids: Sequence[int], status: Status | str, *, actor: str = "human", note: str = "",
                   expected_versions: dict[int, int] | None = None) -> list[int]:
        """Archive (soft delete) or restore entries in one transaction; returns the ids that changed."""
        status = Status(status)
        action = "archive" if status is Status.ARCHIVED else "restore"
        with self._tx() as s:
            rows = [s.get(EntryRow, int(i)) for i in ids]
            missing = [i for i, r in zip(ids, rows) if r is None]
            if missing:
                raise NotFoundError(f"no entry with id {missing[0]}")
            for r in rows:
                if expected_versions and r.id in expected_versions and r.version != expected_versions[r.id]:
                    raise StaleWriteError(r.id, expected_versions[r.id], r.version)
            todo = [r for r in rows if r.status != status.value]
            if not todo:
                return []
            lv = self._bump(s)
            for r in todo:
                self._set_status(s, r, status, lv, action=action, actor=actor, note=note)
            return [r.id for r in todo]

    def archive(self, ids: Sequence[int], **kw: Any) -> list[int]:
        return self.set_status(ids, Status.ARCHIVED, **kw)

    def restore(self, ids: Sequence[int], **kw: Any) -> list[int]:
        return self.set_status(ids, Status.ACTIVE, **kw)

    def replace_entries(self, old_ids: Sequence[int], new: NewEntry, *, actor: str, action: str, note: str = "",
                        expected_versions: dict[int, int] | None = None) -> int:
        """Write one new entry whose parents are `old_ids` and archive those, atomically (update op, merge)."""
        old_ids = [int(i) for i in old_ids]
        if len(set(old_ids)) != len(old_ids):
            raise StoreError(f"entry ids repeat in {old_ids}")
        if not new.text or not new.text.strip():
            raise StoreError("the replacing entry's text must not be empty")
        with self._tx() as s:
            rows = [s.get(EntryRow, i) for i in old_ids]
            for i, r in zip(old_ids, rows):
                if r is None:
                    raise NotFoundError(f"no entry with id {i}")
                if r.status != Status.ACTIVE.value:
                    raise StoreError(f"entry {i} is archived; restore it before merging or updating it")
                if expected_versions and i in expected_versions and r.version != expected_versions[i]:
                    raise StaleWriteError(i, expected_versions[i], r.version)
            lv = self._bump(s)
            now = time.time()
            row = EntryRow(
                text=new.text, env=new.env or rows[0].env, task=new.task or rows[0].task,
                query=new.query or new.task or rows[0].query, source=Source(new.source).value,
                status=Status.ACTIVE.value, version=1, parent_ids=json.dumps(old_ids), created_step=new.created_step,
                run_id=new.run_id, source_episode_id=new.source_episode_id,
                query_embedding=_vec_to_bytes(new.query_embedding) if new.query_embedding is not None else rows[0].query_embedding,
                text_embedding=_vec_to_bytes(new.text_embedding), embedder=new.embedder or rows[0].embedder,
                changed_version=lv, created_at=now, updated_at=now, **_gen_columns(new.generation),
            )
            s.add(row)
            s.flush()
            s.add(EntryVersionRow(entry_id=row.id, version=1, text=row.text, status=row.status, action=action,
                                  actor=actor, note=note or f"replaces {old_ids}", library_version=lv, created_at=now))
            for r in rows:
                self._set_status(s, r, Status.ARCHIVED, lv, action=action, actor=actor, note=f"replaced by {row.id}")
            return row.id

    def undo_replace(self, new_id: int, *, actor: str = "human") -> list[int]:
        """Undo a merge/update: archive the replacing entry and restore its parents. Returns the parents."""
        with self._tx() as s:
            row = s.get(EntryRow, new_id)
            if row is None:
                raise NotFoundError(f"no entry with id {new_id}")
            parents = json.loads(row.parent_ids or "[]")
            if not parents:
                raise StoreError(f"entry {new_id} has no parents: it is not the result of a merge or update")
            lv = self._bump(s)
            if row.status == Status.ACTIVE.value:
                self._set_status(s, row, Status.ARCHIVED, lv, action="unmerge", actor=actor, note="merge undone")
            for pid in parents:
                p = s.get(EntryRow, pid)
                if p is not None and p.status != Status.ACTIVE.value:
                    self._set_status(s, p, Status.ACTIVE, lv, action="unmerge", actor=actor, note=f"merge {new_id} undone")
            return parents

    # -- history, diff, revert -----------------------------------------------------------------

    def history(self, entry_id: int) -> list[VersionInfo]:
        with self._session() as s:
            rows = s.scalars(select(EntryVersionRow).where(EntryVersionRow.entry_id == entry_id).order_by(EntryVersionRow.version)).all()
            if not rows and s.get(EntryRow, entry_id) is None:
                raise NotFoundError(f"no entry with id {entry_id}")
            return [VersionInfo(r.entry_id, r.version, r.text, r.status, r.action, r.actor, r.note, r.library_version,
                                r.created_at) for r in rows]

    def version_text(self, entry_id: int, version: int) -> str:
        for v in self.history(entry_id):
            if v.version == version:
                return v.text
        raise NotFoundError(f"entry {entry_id} has no version {version}")

    def diff(self, entry_id: int, v_from: int, v_to: int) -> str:
        """Unified diff of the entry's text between two versions."""
        a, b = self.version_text(entry_id, v_from), self.version_text(entry_id, v_to)
        return text_diff(a, b, f"v{v_from}", f"v{v_to}")

    def revert(self, entry_id: int, to_version: int, *, expected_version: int, actor: str = "human") -> Experience:
        """Make an old version's text current again, as a new version (history is never rewritten)."""
        text = self.version_text(entry_id, to_version)
        return self.update_text(entry_id, text, expected_version=expected_version, actor=actor, note=f"revert to v{to_version}")

    # -- counters (statistics: no library version bump) ----------------------------------------

    def record_retrievals(self, entry_ids: Sequence[int], at: float | None = None) -> None:
        if not entry_ids:
            return
        at = time.time() if at is None else at
        counts: dict[int, int] = {}
        for i in entry_ids:
            counts[int(i)] = counts.get(int(i), 0) + 1
        with self._tx() as s:
            for i, n in counts.items():
                s.execute(update(EntryRow).where(EntryRow.id == i).values(
                    retrieved_count=EntryRow.retrieved_count + n, last_retrieved_at=at))

    def record_outcomes(self, usages: Sequence[tuple[int, bool, float]], *, run_id: int | None = None,
                        episode_ids: Sequence[int | None] | None = None, step: int = 0) -> None:
        """(entry_id, success, reward) per use: successes/failures counters and the reward history."""
        if not usages:
            return
        with self._tx() as s:
            for n, (i, ok, reward) in enumerate(usages):
                col = EntryRow.successes if ok else EntryRow.failures
                s.execute(update(EntryRow).where(EntryRow.id == int(i)).values({col: col + 1}))
                s.add(EntryUsageRow(entry_id=int(i), run_id=run_id, episode_id=episode_ids[n] if episode_ids else None,
                                    step=step, success=bool(ok), reward=float(reward)))

    def record_trained(self, entry_ids: Sequence[int], step: int) -> None:
        """Eq. 7 bookkeeping: how often each entry's generation was trained on, and when last."""
        counts: dict[int, int] = {}
        for i in entry_ids:
            counts[int(i)] = counts.get(int(i), 0) + 1
        with self._tx() as s:
            for i, n in counts.items():
                s.execute(update(EntryRow).where(EntryRow.id == i).values(
                    trained_count=EntryRow.trained_count + n, last_trained_step=step))

    def training_stats(self, entry_ids: Sequence[int]) -> dict[int, tuple[int, int | None]]:
        """entry id -> (trained_count, last_trained_step): what Eq. 7 needs, keyed by entry id."""
        with self._session() as s:
            rows = s.execute(select(EntryRow.id, EntryRow.trained_count, EntryRow.last_trained_step)
                             .where(EntryRow.id.in_([int(i) for i in entry_ids]))).all()
            return {i: (c, last) for i, c, last in rows}

    def usage(self, entry_id: int, limit: int = 200) -> list[dict[str, Any]]:
        with self._session() as s:
            rows = s.scalars(select(EntryUsageRow).where(EntryUsageRow.entry_id == entry_id)
                             .order_by(EntryUsageRow.id.desc()).limit(limit)).all()
            return [{"run_id": r.run_id, "episode_id": r.episode_id, "step": r.step, "success": r.success,
                     "reward": r.reward, "time": r.created_at} for r in rows]

    def children(self, entry_id: int) -> list[int]:
        """Entries that list `entry_id` among their parents (forward lineage)."""
        with self._session() as s:
            like = f"%{entry_id}%"
            rows = s.execute(select(EntryRow.id, EntryRow.parent_ids).where(EntryRow.parent_ids.like(like))).all()
            return [i for i, p in rows if entry_id in json.loads(p or "[]")]

    # -- runs, metrics, commands ---------------------------------------------------------------

    def create_run(self, name: str, *, variant: str = "", env: str = "", config: str = "", status: str = "created",
                   parent_run_id: int | None = None, log_path: str = "", checkpoint_dir: str = "") -> int:
        with self._tx() as s:
            r = RunRow(name=name, variant=variant, env=env, config=config, status=status, parent_run_id=parent_run_id,
                       log_path=log_path, checkpoint_dir=checkpoint_dir)
            s.add(r)
            s.flush()
            return r.id

    def update_run(self, run_id: int, **values: Any) -> None:
        allowed = {c.key for c in RunRow.__table__.columns} - {"id"}
        bad = set(values) - allowed
        if bad:
            raise StoreError(f"unknown run field(s) {sorted(bad)}")
        values["updated_at"] = time.time()
        with self._tx() as s:
            if s.execute(update(RunRow).where(RunRow.id == run_id).values(**values)).rowcount != 1:
                raise NotFoundError(f"no run with id {run_id}")

    def get_run(self, run_id: int) -> dict[str, Any]:
        with self._session() as s:
            r = s.get(RunRow, run_id)
            if r is None:
                raise NotFoundError(f"no run with id {run_id}")
            return {c.key: getattr(r, c.key) for c in RunRow.__table__.columns}

    def list_runs(self, status: str | None = None) -> list[dict[str, Any]]:
        with self._session() as s:
            q = select(RunRow).order_by(RunRow.id.desc())
            if status:
                q = q.where(RunRow.status == status)
            return [{c.key: getattr(r, c.key) for c in RunRow.__table__.columns} for r in s.scalars(q)]

    def log_metrics(self, run_id: int, step: int, metrics: dict[str, float], at: float | None = None) -> None:
        at = time.time() if at is None else at
        rows = [{"run_id": run_id, "step": step, "key": k, "value": float(v), "time": at}
                for k, v in metrics.items() if v is not None and np.isfinite(float(v))]
        if not rows:
            return
        for r in rows:  # before the DELETE below binds them, so the message names the field
            check_values(MetricRow.__table__, r)
        with self._tx() as s:
            # One value per (run, step, key): a step logged again (after a resume, or an evaluation of the same
            # checkpoint run twice) supersedes the earlier value instead of adding a second point.
            gone = s.execute(delete(MetricRow).where(MetricRow.run_id == run_id, MetricRow.step == step,
                                                     MetricRow.key.in_([r["key"] for r in rows]))).rowcount
            if gone:
                s.execute(update(RunRow).where(RunRow.id == run_id).values(metrics_reset_at=at))
            s.execute(MetricRow.__table__.insert(), rows)

    def metrics_reset_at(self, run_id: int) -> float | None:
        """When metric rows of the run were last deleted (None: never): a cached series older than this is stale."""
        with self._session() as s:
            return s.execute(select(RunRow.metrics_reset_at).where(RunRow.id == run_id)).scalar_one_or_none()

    def drop_after_step(self, run_id: int, step: int) -> dict[str, int]:
        """A resume from the checkpoint at `step` will redo every later step: drop what those steps logged
        (metrics, stored episodes and the entry outcomes credited from those episodes past `step`: their
        entry_usage rows and the successes/failures counters they added), so the store holds each step's
        values, episodes and outcomes once. Library entries are kept: nothing the extractor wrote is lost, and
        retrieval counts stay (those retrievals happened). Returns the counts dropped."""
        with self._tx() as s:
            m = s.execute(delete(MetricRow).where(MetricRow.run_id == run_id, MetricRow.step > step)).rowcount
            t = s.execute(delete(TrajectoryRow).where(TrajectoryRow.run_id == run_id, TrajectoryRow.step > step)).rowcount
            past = (EntryUsageRow.run_id == run_id, EntryUsageRow.step > step)
            undo = s.execute(select(EntryUsageRow.entry_id, EntryUsageRow.success, func.count())
                             .where(*past).group_by(EntryUsageRow.entry_id, EntryUsageRow.success)).all()
            for entry_id, ok, n in undo:
                col = EntryRow.successes if ok else EntryRow.failures
                s.execute(update(EntryRow).where(EntryRow.id == entry_id).values({col: col - n}))
            u = s.execute(delete(EntryUsageRow).where(*past)).rowcount
            if m:
                s.execute(update(RunRow).where(RunRow.id == run_id).values(metrics_reset_at=time.time()))
            return {"metrics": m, "episodes": t, "outcomes": u}

    def heartbeat(self, run_id: int) -> None:
        with self._tx() as s:
            s.execute(update(RunRow).where(RunRow.id == run_id).values(heartbeat_at=time.time()))

    def reap_dead_runs(self, *, stale_after_s: float = HEARTBEAT_STALE_S) -> list[int]:
        """Mark runs whose trainer is gone as failed ("died: ..." and the end of its log); returns their ids.

        Gone: its pid is dead on this host, or its heartbeat is older than `stale_after_s` (a trainer on
        another machine, or a pid reused since). Rows without a pid or heartbeat yet (a run being launched)
        are left to whoever launched them."""
        host, now = socket.gethostname(), time.time()
        dead: list[tuple[int, str, float | None, str]] = []
        for r in self.list_runs():
            if r["status"] not in LIVE_STATUSES or (not r["pid"] and r["heartbeat_at"] is None):
                continue
            if r["pid"] and r["host"] == host and not pid_alive(r["pid"]):
                why = f"process {r['pid']} on {host} is gone"
            elif r["heartbeat_at"] is not None and now - r["heartbeat_at"] > stale_after_s:
                why = f"no heartbeat from process {r['pid']} on {r['host'] or '?'} for {now - r['heartbeat_at']:.0f} s"
            else:
                continue
            dead.append((r["id"], why, r["heartbeat_at"], r["log_path"]))
        reaped = []
        for run_id, why, beat, log_path in dead:
            tail = log_tail(log_path) if log_path else "(started from a terminal: its output went there)"
            with self._tx() as s:
                # Only if nothing took the run over since we looked (a resume rewrites pid and heartbeat).
                res = s.execute(update(RunRow).where(RunRow.id == run_id, RunRow.status.in_(LIVE_STATUSES),
                                                     RunRow.heartbeat_at.is_(None) if beat is None else RunRow.heartbeat_at == beat)
                                .values(status="failed", pid=None, ended_at=now, updated_at=now,
                                        error=f"died: {why}; the last lines of its log:\n{tail}"[-4000:]))
                if res.rowcount == 1:
                    reaped.append(run_id)
        return reaped

    def metrics_since(self, run_id: int, keys: Sequence[str] | None = None, after_id: int = 0,
                      limit: int = 200_000) -> list[tuple[int, str, int, float, float]]:
        """(id, key, step, value, time) rows newer than cursor `after_id`: live plots fetch only these."""
        with self._session() as s:
            q = select(MetricRow.id, MetricRow.key, MetricRow.step, MetricRow.value, MetricRow.time).where(
                MetricRow.run_id == run_id, MetricRow.id > after_id)
            if keys:
                q = q.where(MetricRow.key.in_(list(keys)))
            return [tuple(r) for r in s.execute(q.order_by(MetricRow.id).limit(limit)).all()]

    def metric_keys(self, run_id: int) -> list[str]:
        with self._session() as s:
            return sorted(s.scalars(select(MetricRow.key).where(MetricRow.run_id == run_id).distinct()).all())

    def latest_metrics(self, run_id: int) -> dict[str, float]:
        with self._session() as s:
            sub = select(MetricRow.key, func.max(MetricRow.id).label("mid")).where(MetricRow.run_id == run_id).group_by(MetricRow.key).subquery()
            rows = s.execute(select(MetricRow.key, MetricRow.value).join(sub, MetricRow.id == sub.c.mid)).all()
            return {k: v for k, v in rows}

    def send_command(self, run_id: int, command: str) -> int:
        if command not in ("pause", "resume", "stop"):
            raise StoreError(f"unknown run command {command!r}; use pause, resume or stop")
        self.get_run(run_id)
        with self._tx() as s:
            c = RunCommandRow(run_id=run_id, command=command)
            s.add(c)
            s.flush()
            return c.id

    def take_commands(self, run_id: int) -> list[str]:
        """Pending commands for a run, oldest first, marked consumed."""
        with self._tx() as s:
            rows = s.scalars(select(RunCommandRow).where(RunCommandRow.run_id == run_id, RunCommandRow.consumed_at.is_(None))
                             .order_by(RunCommandRow.id)).all()
            now = time.time()
            for r in rows:
                r.consumed_at = now
            return [r.command for r in rows]

    # -- trajectories ----------------------------------------------------------------------------

    def add_trajectories(self, items: Sequence[dict[str, Any]]) -> list[int]:
        """Store episodes for replay: dicts with TrajectoryRow's columns (steps as a list of dicts)."""
        with self._tx() as s:
            ids = []
            for it in items:
                it = dict(it)
                it["steps"] = json.dumps(it.get("steps", []))
                it["experience_ids"] = json.dumps(list(it.get("experience_ids", [])))
                r = TrajectoryRow(**it)
                s.add(r)
                s.flush()
                ids.append(r.id)
            return ids

    def get_trajectory(self, traj_id: int) -> dict[str, Any]:
        with self._session() as s:
            r = s.get(TrajectoryRow, traj_id)
            if r is None:
                raise NotFoundError(f"no stored episode with id {traj_id}")
            d = {c.key: getattr(r, c.key) for c in TrajectoryRow.__table__.columns}
            d["steps"] = json.loads(d["steps"])
            d["experience_ids"] = json.loads(d["experience_ids"])
            return d

    def list_trajectories(self, *, run_id: int | None = None, ab_test_id: int | None = None, limit: int = 100,
                          offset: int = 0) -> list[dict[str, Any]]:
        with self._session() as s:
            q = select(TrajectoryRow.id, TrajectoryRow.run_id, TrajectoryRow.ab_test_id, TrajectoryRow.step, TrajectoryRow.env,
                       TrajectoryRow.task, TrajectoryRow.seed, TrajectoryRow.with_experience, TrajectoryRow.success,
                       TrajectoryRow.reward, TrajectoryRow.num_actions)
            if run_id is not None:
                q = q.where(TrajectoryRow.run_id == run_id)
            if ab_test_id is not None:
                q = q.where(TrajectoryRow.ab_test_id == ab_test_id)
            rows = s.execute(q.order_by(TrajectoryRow.id.desc()).offset(offset).limit(limit)).all()
            return [r._asdict() for r in rows]

    # -- A/B tests -------------------------------------------------------------------------------

    def create_ab_test(self, name: str, config: dict[str, Any]) -> int:
        with self._tx() as s:
            r = ABTestRow(name=name, config=json.dumps(config))
            s.add(r)
            s.flush()
            return r.id

    def update_ab_test(self, ab_id: int, **values: Any) -> None:
        if "results" in values and not isinstance(values["results"], str):
            values["results"] = json.dumps(values["results"])
        values["updated_at"] = time.time()
        with self._tx() as s:
            if s.execute(update(ABTestRow).where(ABTestRow.id == ab_id).values(**values)).rowcount != 1:
                raise NotFoundError(f"no A/B test with id {ab_id}")

    def get_ab_test(self, ab_id: int) -> dict[str, Any]:
        with self._session() as s:
            r = s.get(ABTestRow, ab_id)
            if r is None:
                raise NotFoundError(f"no A/B test with id {ab_id}")
            d = {c.key: getattr(r, c.key) for c in ABTestRow.__table__.columns}
            d["config"], d["results"] = json.loads(d["config"]), json.loads(d["results"] or "{}")
            return d

    def list_ab_tests(self) -> list[dict[str, Any]]:
        with self._session() as s:
            ids = s.scalars(select(ABTestRow.id).order_by(ABTestRow.id.desc())).all()
        return [self.get_ab_test(i) for i in ids]

    # -- whole-library snapshots (A/B arms, exports) -------------------------------------------

    def snapshot_at(self, library_version: int) -> list[VersionInfo]:
        """The active entries as they were at a past library version (from the version history)."""
        with self._session() as s:
            sub = (select(EntryVersionRow.entry_id, func.max(EntryVersionRow.id).label("vid"))
                   .where(EntryVersionRow.library_version <= library_version).group_by(EntryVersionRow.entry_id).subquery())
            rows = s.scalars(select(EntryVersionRow).join(sub, EntryVersionRow.id == sub.c.vid)
                             .order_by(EntryVersionRow.entry_id)).all()
            return [VersionInfo(r.entry_id, r.version, r.text, r.status, r.action, r.actor, r.note, r.library_version,
                                r.created_at) for r in rows if r.status == Status.ACTIVE.value]

    # -- read-only queries for the workbench ------------------------------------------------------
    # Added for app/ (the live curves' series and edit markers, the library table's filters); nothing above
    # depends on them.

    def human_edits_since(self, after_id: int = 0, actors: Sequence[str] = ("human", "cli"),
                          limit: int = 10_000) -> list[dict[str, Any]]:
        """Version rows written by people (not the extractor), newer than cursor `after_id`, oldest first."""
        with self._session() as s:
            rows = s.execute(
                select(EntryVersionRow.id, EntryVersionRow.entry_id, EntryVersionRow.version, EntryVersionRow.action,
                       EntryVersionRow.actor, EntryVersionRow.created_at)
                .where(EntryVersionRow.id > after_id, EntryVersionRow.actor.in_(list(actors)))
                .order_by(EntryVersionRow.id).limit(limit)).all()
            return [r._asdict() for r in rows]

    def entry_facets(self) -> dict[str, list[str]]:
        """Distinct envs and sources present in the library (for filter menus)."""
        with self._session() as s:
            envs = s.scalars(select(EntryRow.env).distinct().order_by(EntryRow.env)).all()
            sources = s.scalars(select(EntryRow.source).distinct().order_by(EntryRow.source)).all()
            return {"env": [e for e in envs if e], "source": list(sources)}

    def metric_series_since(self, run_id: int, key: str, after_id: int = 0, limit: int = 200_000) -> dict[str, np.ndarray]:
        """One (run, key) series past cursor `after_id` as columns (id, step, value, time arrays), oldest first.

        Answered from the (run_id, key, id) index without a sort, and read straight off the DBAPI
        cursor: what the live curves use to follow a series, and to load a long one in slices."""
        q = (select(MetricRow.id, MetricRow.step, MetricRow.value, MetricRow.time)
             .where(MetricRow.run_id == run_id, MetricRow.key == key, MetricRow.id > after_id)
             .order_by(MetricRow.id).limit(limit))
        with self.engine.connect() as conn:
            rows = conn.execute(q).cursor.fetchall()
        n = len(rows)
        if not n:
            return {"id": np.zeros(0, np.int64), "step": np.zeros(0), "value": np.zeros(0), "time": np.zeros(0)}
        ids, steps, values, times = zip(*rows)
        return {"id": np.fromiter(ids, np.int64, n), "step": np.fromiter(steps, np.float64, n),
                "value": np.fromiter(values, np.float64, n), "time": np.fromiter(times, np.float64, n)}
