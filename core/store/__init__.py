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

Split by job: `schema` (errors, tables, value checks), `library` (entries, versions, counters, snapshots),
`runs` (runs, metrics, commands, episodes, A/B tests); `ExperienceStore` below holds the engine and its
transactions and is the one class callers use.
"""
from __future__ import annotations

import functools
import os
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

from sqlalchemy import create_engine, event, inspect, select, update
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import StaticPool

from core.store.library import LibraryTables, NewEntry, Page, SORTABLE, text_diff, VersionInfo
from core.store.runs import RunTables
from core.store.schema import (
    _install_checks, ABTestRow, Base, check_values, EntryCountRow, EntryRow, EntryUsageRow, EntryVersionRow, HEARTBEAT_S,
    HEARTBEAT_STALE_S, INT32, LibraryState, LIVE_STATUSES, log_tail, MetricRow, NotFoundError, pid_alive,
    RunCommandRow, RunRow, StaleWriteError, StoreError, TrajectoryRow,
)


# -- the database going away: wait and retry ------------------------------------------------------------
#
# Every public store method is one transaction (or reads only), so a call that fails because the server went away
# (Postgres stopped or restarted, a connection terminated mid-transaction: the transaction was rolled back there) or
# because SQLite could not write (a full disk, a lock held past busy_timeout) is run again whole, after a pause, until
# DB_RETRY_S have passed; then the error is raised and the run stops (failed, resumable from its checkpoint). Each wait
# is one line on stderr. A nested call (a method calling another) retries only at the outermost level.

DB_RETRY_S = float(os.environ.get("COMPRL_DB_RETRY_S", "300"))
_DEPTH = threading.local()


def _transient(e: BaseException) -> bool:
    if isinstance(e, DBAPIError) and e.connection_invalidated:
        return True
    if isinstance(e, OperationalError):
        return True
    return False


def _retrying(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def call(self: "ExperienceStore", *args: Any, **kw: Any) -> Any:
        depth = getattr(_DEPTH, "n", 0)
        _DEPTH.n = depth + 1
        try:
            if depth:
                return fn(self, *args, **kw)
            t0, pause, tries = time.monotonic(), 0.25, 0
            while True:
                try:
                    return fn(self, *args, **kw)
                except Exception as e:  # noqa: BLE001 - only transient database errors are retried
                    waited = time.monotonic() - t0
                    if not _transient(e) or waited + pause > self.retry_s:
                        raise
                    tries += 1
                    first = str(getattr(e, "orig", e) or e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
                    print(f"store: database unavailable in {fn.__name__} ({first}); retrying in {pause:.1f} s "
                          f"(try {tries}, waited {waited:.0f} of {self.retry_s:.0f} s)", file=sys.stderr, flush=True)
                    self.retries += 1
                    time.sleep(pause)
                    pause = min(5.0, pause * 2)
        finally:
            _DEPTH.n = depth

    return call


class ExperienceStore(LibraryTables, RunTables):
    """All reads and writes of the workbench's data. Thread-safe; many processes may share one URL."""

    def __init__(self, url: str, *, echo: bool = False, retry_s: float | None = None):
        self.url = url
        self.retry_s = DB_RETRY_S if retry_s is None else retry_s  # how long a call waits for the database to return
        self.retries = 0  # calls run again after a transient database error (each also a line on stderr)
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


for _cls in (LibraryTables, RunTables):
    for _name, _fn in list(vars(_cls).items()):
        if not _name.startswith("_") and callable(_fn) and not isinstance(_fn, (staticmethod, classmethod, type)):
            setattr(ExperienceStore, _name, _retrying(_fn))


__all__ = [
    "ABTestRow", "Base", "check_values", "EntryCountRow", "EntryRow", "EntryUsageRow", "EntryVersionRow", "ExperienceStore",
    "HEARTBEAT_S", "HEARTBEAT_STALE_S", "INT32", "LibraryState", "LIVE_STATUSES", "log_tail", "MetricRow",
    "NewEntry", "NotFoundError", "Page", "pid_alive", "RunCommandRow", "RunRow", "SORTABLE", "StaleWriteError",
    "StoreError", "text_diff", "TrajectoryRow", "VersionInfo"
]
