"""Live curves: a process-wide cache of metric series fed by cursors (`MetricCache`), per-session smoothed views
(`CurveSession`), and the workbench methods that refresh the plots and export them."""
from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from app import views
from app.service.common import _err, _maybe_id, _ok
from core import build_progress
from core.store import ExperienceStore

ROWS_PER_KEY_PER_PULL = 10_000  # metric rows read per (run, key) per refresh: a long history loads over a few ticks
PULL_INTERVAL_S = 0.5  # sessions refreshing within this of each other share one read of the store


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


class CurvesPart:
    """The Workbench's curves methods (app/service/__init__.py composes the Workbench from these parts; its state
    is set up in Workbench.__init__)."""

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
