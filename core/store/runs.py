"""The run tables: runs, metrics, run commands, stored trajectories (episodes) and A/B tests."""
from __future__ import annotations

import json
import socket
import time
from typing import Any, Sequence

import numpy as np
from sqlalchemy import delete, func, select, update

from core.store.schema import (
    ABTestRow, check_values, EntryCountRow, EntryRow, EntryUsageRow, EntryVersionRow, HEARTBEAT_STALE_S, LIVE_STATUSES,
    log_tail, MetricRow, NotFoundError, pid_alive, RunCommandRow, RunRow, StoreError, TrajectoryRow,
)
from core.types import Status


class RunTables:
    """ExperienceStore's reads and writes of runs, metrics, commands, episodes and A/B tests (core/store/__init__.py
    builds the store from these parts)."""

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
        """A resume from the checkpoint at `step` will redo every later step: take back what those steps wrote, so the
        store holds each step's values, episodes and outcomes once and the algorithm reads every counter as it was at
        the checkpoint. Dropped: metrics, stored episodes and the entry outcomes credited from them (entry_usage rows
        and the successes/failures they added). Subtracted: the retrieval and training counts those steps added (Eq. 6
        and Eq. 7 inputs, EntryCountRow), last_retrieved_at / last_trained_step put back. Undone: the run's library
        writes past `step` (entries its extractor or merges wrote are archived, entries they archived restored), as new
        versions, so the history keeps both and nothing is lost. Returns the counts."""
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
            counts = self._undo_counts(s, run_id, step)
            entries = self._undo_library(s, run_id, step)
            if m:
                s.execute(update(RunRow).where(RunRow.id == run_id).values(metrics_reset_at=time.time()))
            return {"metrics": m, "episodes": t, "outcomes": u, **counts, "entries": entries}

    @staticmethod
    def _undo_counts(s: Any, run_id: int, step: int) -> dict[str, int]:
        """Subtract the retrieval and training counts the run added past `step`; each entry's last-value goes back to
        what it was before the first of them, unless someone else (another run, a person) wrote a later one since."""
        past = (EntryCountRow.run_id == run_id, EntryCountRow.step > step)
        rows = s.execute(select(EntryCountRow.entry_id, EntryCountRow.kind, EntryCountRow.n, EntryCountRow.before,
                                EntryCountRow.after).where(*past).order_by(EntryCountRow.id)).all()
        undo: dict[tuple[int, str], list[Any]] = {}  # (entry, kind) -> [n, last-value before the first, after the last]
        for entry_id, kind, n, before, after in rows:
            u = undo.setdefault((entry_id, kind), [0, before, after])
            u[0], u[2] = u[0] + n, after
        cols = {"retrieved": (EntryRow.retrieved_count, EntryRow.last_retrieved_at),
                "trained": (EntryRow.trained_count, EntryRow.last_trained_step)}
        for (entry_id, kind), (n, before, after) in sorted(undo.items()):  # rows in id order (core/store/library.py)
            count, last = cols[kind]
            if kind == "trained" and before is not None:
                before = int(before)
            ours = last.is_(None) if after is None else last == after  # still the value the run's last write set
            s.execute(update(EntryRow).where(EntryRow.id == entry_id).values({count: count - n}))
            s.execute(update(EntryRow).where(EntryRow.id == entry_id, ours).values({last: before}))
        s.execute(delete(EntryCountRow).where(*past))
        return {"retrievals": sum(u[0] for (_, k), u in undo.items() if k == "retrieved"),
                "trainings": sum(u[0] for (_, k), u in undo.items() if k == "trained")}

    def _undo_library(self, s: Any, run_id: int, step: int) -> int:
        """Put each entry the run changed past `step` back to the status it had before the first such change
        (archived: it did not exist then), as a new version; returns how many changed."""
        first = dict(s.execute(select(EntryVersionRow.entry_id, func.min(EntryVersionRow.id))
                               .where(EntryVersionRow.run_id == run_id, EntryVersionRow.step > step)
                               .group_by(EntryVersionRow.entry_id)).all())
        changed, lv = 0, None
        for entry_id, first_id in sorted(first.items()):
            prior = s.scalars(select(EntryVersionRow.status).where(EntryVersionRow.entry_id == entry_id,
                                                                   EntryVersionRow.id < first_id)
                              .order_by(EntryVersionRow.id.desc()).limit(1)).first()
            row = s.get(EntryRow, entry_id)
            target = Status(prior) if prior is not None else Status.ARCHIVED
            if row is None or row.status == target.value:
                continue
            lv = lv if lv is not None else self._bump(s)
            self._set_status(s, row, target, lv, action="rollback", actor="resume",
                             note=f"run {run_id} resumed from step {step}: this change of a later step is redone")
            changed += 1
        return changed

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

    # -- read-only queries for the workbench (live curves)

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
